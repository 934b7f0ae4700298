/* SPDX-License-Identifier: MIT */
/*
 * tests/test_service_run.c - running tasks, and the calls a running task
 * makes.
 *
 * - tw_service_run() accepts a job once. Two threads race
 *   tw_service_run() on the same job (a spin barrier releases them
 *   together, many jobs in a row): the task must run exactly once per job.
 *   Forged, stale and repeated job ids are ignored.
 * - tw_service_start() from a task never waits for a concurrent stop.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>

#include "fixture.h"
#include "internal.h"
#include "test.h"
#include "twheel/service.h"

/* A started service on the virtual clock at 1000 s. */
static tw_service *vservice(tw_service_config *cfg)
{
    cfg->clock = vclock;
    atomic_store(&vnow, 1000 * SEC);
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, cfg), 0);
    ASSERT_EQ(tw_service_start(s), 0);
    return s;
}

/* ------------------------------------------------------------------------ */
/* tw_service_run() accepts a job once. */

#define JOBS 2000

static struct {
    _Atomic tw_id jobs[JOBS];
    _Atomic int njobs;
    _Atomic int runs[JOBS];
    _Atomic int go;   /* job index both racers may run now, + 1 */
    _Atomic int done; /* racers finished with the current job */
    int first;        /* the first job the racers take */
} rj;

static _Atomic int nested_calls;

/* tw__service_run_hook: run the same job again from inside the call. */
static void nested_run(tw_service *s, tw_id job)
{
    void (*hook)(tw_service *, tw_id) = tw__service_run_hook;
    tw__service_run_hook = NULL;
    atomic_fetch_add(&nested_calls, 1);
    tw_service_run(s, job);
    tw__service_run_hook = hook;
}

static void record_job(tw_service *s, tw_id job, void *ctx)
{
    (void)s;
    (void)ctx;
    int i = atomic_load(&rj.njobs);
    ASSERT_LT(i, JOBS);
    atomic_store(&rj.jobs[i], job);
    atomic_store(&rj.njobs, i + 1);
}

static void count_run(tw_id id, void *arg)
{
    (void)id;
    atomic_fetch_add((_Atomic int *)arg, 1);
}

static void *racer(void *p)
{
    tw_service *s = p;
    for (int i = rj.first; i < JOBS; i++) {
        /* Spin, so that both racers leave together; yield after a while
         * (valgrind runs one thread at a time). */
        for (int k = 0; atomic_load(&rj.go) <= i; k++)
            if (k > 1000)
                sched_yield();
        tw_service_run(s, atomic_load(&rj.jobs[i]));
        atomic_fetch_add(&rj.done, 1);
    }
    return NULL;
}

static void test_run_job_once(void)
{
    tw_service_config cfg = {0};
    cfg.execute = record_job;
    tw_service *s = vservice(&cfg);
    for (int i = 0; i < JOBS; i++)
        ASSERT_EQ(tw_schedule(s, count_run, &rj.runs[i], 0, NULL), 0);
    /* Due at once: the timer thread hands every job to record_job. */
    for (int i = 0; i < 20000 && atomic_load(&rj.njobs) < JOBS; i++)
        sleep_us(100);
    ASSERT_EQ(atomic_load(&rj.njobs), JOBS);

    /* Forged ids: nothing runs. */
    tw_id j0 = atomic_load(&rj.jobs[0]);
    tw_service_run(s, 0);
    tw_service_run(s, j0 ^ (UINT64_C(1) << 40)); /* wrong generation */
    tw_service_run(s, (j0 & ~UINT64_C(0xffffffff)) | 0xfffffff); /* index */
    tw_service_run(NULL, j0);
    ASSERT_EQ(atomic_load(&rj.runs[0]), 0);

    /* Deterministic: a second call for job 0 lands between the first
     * call's look-up and its acceptance of the job. */
    tw__service_run_hook = nested_run;
    tw_service_run(s, j0);
    tw__service_run_hook = NULL;
    ASSERT_EQ(atomic_load(&rj.runs[0]), 1);
    ASSERT_EQ(atomic_load(&nested_calls), 1);

    /* Racing: two threads call tw_service_run() on each job together. */
    rj.first = 1;
    pthread_t t[2];
    for (int k = 0; k < 2; k++)
        ASSERT_EQ(pthread_create(&t[k], NULL, racer, s), 0);
    for (int i = rj.first; i < JOBS; i++) {
        atomic_store(&rj.go, i + 1);
        while (atomic_load(&rj.done) < 2 * i)
            sleep_us(1);
        ASSERT_EQ(atomic_load(&rj.runs[i]), 1);
        tw_service_run(s, atomic_load(&rj.jobs[i])); /* stale: ignored */
        ASSERT_EQ(atomic_load(&rj.runs[i]), 1);
    }
    for (int k = 0; k < 2; k++)
        pthread_join(t[k], NULL);
    tw_service_stats st;
    tw_service_get_stats(s, &st);
    ASSERT_EQ(st.ran, JOBS);
    ASSERT_EQ(st.pending, 0);
    tw__service_sync(s); /* the busy count is back at 0, not below */
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* tw_service_start() from a task while another thread stops the service:
 * the task must get 0 or TW_ESHUTDOWN, never block on stop, which waits for
 * the task to finish. The task calls start in a loop until it is refused,
 * so some call lands while stop holds its lock; the watchdog fails the
 * test if stop does not return within STOP_LIMIT_S. Inline tasks (timer
 * thread) and an executor pool. */
#define STOP_LIMIT_S 10

static _Atomic int start_loop_in, start_loop_out;
static tw_service *start_loop_svc;

static void start_loop_task(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
    atomic_store(&start_loop_in, 1);
    int rc;
    while ((rc = tw_service_start(start_loop_svc)) == 0) {
    }
    ASSERT_EQ(rc, TW_ESHUTDOWN);
    atomic_store(&start_loop_out, 1);
}

static _Atomic bool stop_returned;

static void *stop_watchdog(void *arg)
{
    (void)arg;
    uint64_t end = mono_now() + (uint64_t)STOP_LIMIT_S * SEC;
    while (!atomic_load(&stop_returned)) {
        if (mono_now() > end) {
            fprintf(stderr, "tw_service_stop blocked by a task in "
                            "tw_service_start\n");
            abort();
        }
        sleep_ns(MS);
    }
    return NULL;
}

static void start_from_task_during_stop(uint32_t executors)
{
    tw_service_config cfg = {.executor_threads = executors};
    ASSERT_EQ(tw_service_create(&start_loop_svc, &cfg), 0);
    atomic_store(&start_loop_in, 0);
    atomic_store(&start_loop_out, 0);
    atomic_store(&stop_returned, false);
    ASSERT_EQ(tw_schedule(start_loop_svc, start_loop_task, NULL, 0, NULL), 0);
    while (!atomic_load(&start_loop_in))
        sched_yield();
    pthread_t wd;
    ASSERT_EQ(pthread_create(&wd, NULL, stop_watchdog, NULL), 0);
    ASSERT_EQ(tw_service_stop(start_loop_svc, NULL, NULL), 0);
    atomic_store(&stop_returned, true);
    pthread_join(wd, NULL);
    ASSERT_EQ(atomic_load(&start_loop_out), 1);
    tw_service_destroy(start_loop_svc);
}

static void test_start_from_task_during_stop(void)
{
    for (int i = 0; i < 20; i++) {
        start_from_task_during_stop(0);
        start_from_task_during_stop(1);
    }
}

int main(int argc, char **argv)
{
    RUN_SELECTED(test_run_job_once);
    RUN_SELECTED(test_start_from_task_during_stop);
    return tw_test_done();
}
