/* SPDX-License-Identifier: MIT */
/*
 * tests/test_service_run.c - running tasks, and the calls a running task
 * makes.
 *
 * - tw_service_run() accepts a job once. Two threads race
 *   tw_service_run() on the same job (a spin barrier releases them
 *   together, many jobs in a row): the task must run exactly once per job.
 *   Forged, stale and repeated job ids are ignored. Jobs are matched to
 *   their tasks by id: the executor receives them in no promised order.
 * - tw_service_start() from a task never waits for a concurrent stop.
 * - A replacing call between a job's acceptance and its run takes the
 *   pending slot over exactly once.
 * - tw_service_run() on a service with the built-in executor pool ignores
 *   every id, even that of a task waiting in the pool's queue.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>

#include "fixture.h"
#include "service_internal.h"
#include "test.h"
#include "twheel/service.h"

/* ------------------------------------------------------------------------ */
/* tw_service_run() accepts a job once. */

#define JOBS 2000

static struct {
    tw_id ids[JOBS];          /* tw_schedule()'s ids, in schedule order */
    _Atomic tw_id jobs[JOBS]; /* the jobs record_job received, in order */
    _Atomic int njobs;
    _Atomic int runs[JOBS]; /* runs of the task scheduled i-th */
    int task[JOBS];         /* jobs[i] is the task scheduled task[i]-th */
    _Atomic int go;         /* job index both racers may run now, + 1 */
    _Atomic int done;       /* racers finished with the current job */
    int first;              /* the first job the racers take */
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
    tw_service *s = vclock_service(&cfg);
    /*
     * The executor receives the jobs in no promised order, and the racers
     * take them in the order received, so each job is matched to its task
     * by id. Before that, the i-th job received was taken for the task
     * scheduled i-th: with every task due at once, a timer thread that
     * fell behind (a loaded machine, TSan) took some tasks from this
     * thread's submission stack (its ring full) a round after later ones
     * from its ring, and the check of runs[i] read the count of a task not
     * run yet: 0. Here the order differs every time: task i is due
     * JOBS - i ticks from now, so the last one scheduled is due first.
     */
    for (int i = 0; i < JOBS; i++)
        ASSERT_EQ(tw_schedule(s, count_run, &rj.runs[i],
                              (uint64_t)(JOBS - i) * MS, &rj.ids[i]),
                  0);
    atomic_fetch_add(&vnow, (uint64_t)(JOBS + 1) * MS);
    tw__service_kick(s);
    for (int i = 0; i < 20000 && atomic_load(&rj.njobs) < JOBS; i++)
        sleep_us(100);
    ASSERT_EQ(atomic_load(&rj.njobs), JOBS);
    /* Each job is the id of exactly one task, and some job is not the
     * task scheduled in its place. */
    static bool seen[JOBS];
    int moved = 0;
    for (int i = 0; i < JOBS; i++) {
        tw_id job = atomic_load(&rj.jobs[i]);
        int k = 0;
        while (k < JOBS && rj.ids[k] != job)
            k++;
        ASSERT_LT(k, JOBS);
        ASSERT(!seen[k]);
        seen[k] = true;
        rj.task[i] = k;
        moved += k != i;
    }
    ASSERT_GT(moved, 0);

    /* Forged ids: nothing runs. */
    tw_id j0 = atomic_load(&rj.jobs[0]);
    _Atomic int *runs0 = &rj.runs[rj.task[0]];
    tw_service_run(s, 0);
    tw_service_run(s, j0 ^ (UINT64_C(1) << 40)); /* wrong generation */
    tw_service_run(s, (j0 & ~UINT64_C(0xffffffff)) | 0xfffffff); /* index */
    tw_service_run(NULL, j0);
    ASSERT_EQ(atomic_load(runs0), 0);

    /* Deterministic: a second call for job 0 lands between the first
     * call's look-up and its acceptance of the job. */
    tw__service_run_hook = nested_run;
    tw_service_run(s, j0);
    tw__service_run_hook = NULL;
    ASSERT_EQ(atomic_load(runs0), 1);
    ASSERT_EQ(atomic_load(&nested_calls), 1);

    /* Racing: two threads call tw_service_run() on each job together. */
    rj.first = 1;
    pthread_t t[2];
    for (int k = 0; k < 2; k++)
        ASSERT_EQ(pthread_create(&t[k], NULL, racer, s), 0);
    for (int i = rj.first; i < JOBS; i++) {
        _Atomic int *runs = &rj.runs[rj.task[i]];
        atomic_store(&rj.go, i + 1);
        while (atomic_load(&rj.done) < 2 * i)
            sleep_us(1);
        ASSERT_EQ(atomic_load(runs), 1);
        tw_service_run(s, atomic_load(&rj.jobs[i])); /* stale: ignored */
        ASSERT_EQ(atomic_load(runs), 1);
    }
    for (int k = 0; k < 2; k++)
        pthread_join(t[k], NULL);
    for (int i = 0; i < JOBS; i++)
        ASSERT_EQ(atomic_load(&rj.runs[i]), 1);
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

/* ------------------------------------------------------------------------ */
/* A replacing call between a job's acceptance and its run. A task of
 * tw__schedule_replace() keeps its pending slot while it runs; a replacing
 * call that finds it RUNNING takes the slot over by setting ST_DROPPED, and
 * the run's end must then not release the slot as well. The accepted hook
 * makes that call in the window between the executor's acceptance of the
 * job and the start of the run: the pending count must stay 1 (the new
 * task), and stop hands that task back. Before the fix the run's end
 * released the slot a second time: the count went to 0 and stop took it
 * below zero (every later call failed with TW_ESHUTDOWN). Both executors:
 * a caller-supplied one and the built-in pool. */

static struct {
    tw_service *s;
    _Atomic tw_id first, second;
    _Atomic int runs, hooked;
    bool cancelled;
} rp;

static void replace_task(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
    atomic_fetch_add(&rp.runs, 1);
}

static void replace_on_accept(tw_service *s, tw_id id)
{
    if (id != atomic_load(&rp.first) || atomic_exchange(&rp.hooked, 1))
        return;
    tw_id b = 0;
    ASSERT_EQ(tw__schedule_replace(s, replace_task, NULL, 1000 * SEC, id,
                                   &rp.cancelled, &b),
              0);
    ASSERT(!rp.cancelled); /* running: taken over, not cancelled */
    atomic_store(&rp.second, b);
}

static _Atomic tw_id rp_job;

static void keep_job(tw_service *s, tw_id job, void *ctx)
{
    (void)s;
    (void)ctx;
    atomic_store(&rp_job, job);
}

static void replace_in_accept_window(uint32_t executors)
{
    tw_service_config cfg = {.max_pending = 1};
    if (executors == 0)
        cfg.execute = keep_job;
    cfg.executor_threads = executors;
    rp.s = vclock_service(&cfg);
    atomic_store(&rp.runs, 0);
    atomic_store(&rp.hooked, 0);
    atomic_store(&rp.second, 0);
    atomic_store(&rp_job, 0);
    tw_id a = 0;
    ASSERT_EQ(tw__schedule_replace(rp.s, replace_task, NULL, MS, 0, NULL, &a),
              0);
    atomic_store(&rp.first, a);
    tw__service_accepted_hook = replace_on_accept;
    atomic_fetch_add(&vnow, MS);
    if (executors == 0) {
        /* The job is ours until we run it: no sync before (it waits for
         * every dispatched job). */
        tw__service_kick(rp.s);
        for (int i = 0; i < 100000 && atomic_load(&rp_job) == 0; i++)
            sleep_us(100);
        ASSERT_EQ(atomic_load(&rp_job), a);
        tw_service_run(rp.s, a);
    }
    tw__service_sync(rp.s); /* due, dispatched and run */
    tw__service_accepted_hook = NULL;
    ASSERT_EQ(atomic_load(&rp.hooked), 1);
    ASSERT_EQ(atomic_load(&rp.runs), 1);
    ASSERT(atomic_load(&rp.second) != 0);
    ASSERT_EQ(tw_service_pending(rp.s), 1); /* the new task's slot */
    ASSERT_EQ(tw_service_stop(rp.s, NULL, NULL), 1);
    ASSERT_EQ(tw_service_pending(rp.s), 0);
    tw_service_destroy(rp.s);
}

static void test_replace_between_accept_and_run(void)
{
    replace_in_accept_window(0);
    replace_in_accept_window(1);
}

/* ------------------------------------------------------------------------ */
/*
 * tw_service_run() on a service with the built-in executor pool ignores
 * every id (the pool hands out no jobs), even the id of a task waiting in
 * the pool's queue.
 */
static void test_run_ignored_on_pool(void)
{
    tw_service_config cfg = {0};
    cfg.executor_threads = 1;
    tw_service *s = vclock_service(&cfg);
    blocked_reset();
    ASSERT_EQ(tw_schedule(s, blocking_task, NULL, 0, NULL), 0);
    WAIT_FOR(atomic_load(&blocked.running) == 1, 10);
    /* X is due at once and waits in the pool's queue behind the blocker;
     * calls for it must not run it here. Before the fix the first call
     * after the dispatch ran X on this thread, leaving its record linked
     * in the queue. */
    struct runs x = {0};
    tw_id xid = 0;
    ASSERT_EQ(tw_schedule(s, runs_task, &x, 0, &xid), 0);
    for (int i = 0; i < 300; i++) {
        tw_service_run(s, xid);
        sleep_ns(MS);
    }
    ASSERT_EQ(atomic_load(&x.n), 0);
    atomic_store(&blocked.release, true);
    WAIT_FOR(atomic_load(&x.n) == 1, 10);
    ASSERT(!pthread_equal(x.thread, pthread_self()));
    tw__service_sync(s);
    ASSERT_EQ(tw_service_pending(s), 0);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

int main(int argc, char **argv)
{
    RUN_SELECTED(test_run_job_once);
    RUN_SELECTED(test_start_from_task_during_stop);
    RUN_SELECTED(test_replace_between_accept_and_run);
    RUN_SELECTED(test_run_ignored_on_pool);
    return tw_test_done();
}
