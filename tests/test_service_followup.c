/* SPDX-License-Identifier: MIT */
/*
 * tests/test_service_followup.c - regressions for service defects found in
 * review:
 *
 *   test_run_job_once: tw_service_run() accepts a job once. Two threads
 *     race tw_service_run() on the same job (a spin barrier releases them
 *     together, many jobs in a row): the task must run exactly once per
 *     job. Forged, stale and repeated job ids are ignored.
 *   test_cancel_queued_for_executor: a one-shot task cancelled while it
 *     waits in the executor pool's queue behind a long task releases its
 *     record at once (stats.cancelled), not when an executor gets to it.
 *   test_repeated_reset_at_max: tw_repeated_reset() on a service exactly at
 *     max_pending succeeds and moves the run; a reset that fails changes
 *     nothing.
 *
 * The services run on a virtual clock (tw_service_config.clock).
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "internal.h"
#include "test.h"
#include "twheel/repeated.h"
#include "twheel/service.h"

#define MS UINT64_C(1000000)
#define SEC UINT64_C(1000000000)

static _Atomic uint64_t vnow;

static uint64_t vclock(void *ctx)
{
    (void)ctx;
    return atomic_load(&vnow);
}

static void nap_us(long us)
{
    struct timespec ts = {0, us * 1000};
    nanosleep(&ts, NULL);
}

/* Move the virtual clock by @ns and wait for a timer round. */
static void vadvance(tw_service *s, uint64_t ns)
{
    atomic_fetch_add(&vnow, ns);
    tw__service_sync(s);
}

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
        nap_us(100);
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
            nap_us(1);
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
/* A cancelled task queued for a busy executor pool. */

static struct {
    _Atomic tw_id running;
    _Atomic bool release;
    _Atomic int runs;
} bl;

static void blocker(tw_id id, void *arg)
{
    (void)arg;
    atomic_fetch_add(&bl.runs, 1);
    atomic_store(&bl.running, id);
    while (!atomic_load(&bl.release))
        nap_us(200);
}

static void test_cancel_queued_for_executor(void)
{
    tw_service_config cfg = {0};
    cfg.executor_threads = 1;
    tw_service *s = vservice(&cfg);
    tw_id a = 0, b = 0;
    ASSERT_EQ(tw_schedule(s, blocker, NULL, MS, &a), 0);
    ASSERT_EQ(tw_schedule(s, blocker, NULL, MS, &b), 0);
    tw__service_sync(s); /* both in the wheel, due at the same tick */
    atomic_fetch_add(&vnow, MS);
    tw__service_kick(s);
    /* Both are dispatched in one round; the only executor blocks in one,
     * the other waits in the queue. */
    while (atomic_load(&bl.running) == 0)
        nap_us(100);
    tw_id queued = atomic_load(&bl.running) == a ? b : a;
    ASSERT(tw_cancel(s, queued));
    ASSERT_EQ(tw_service_pending(s), 0);
    ASSERT(!tw_cancel(s, queued));
    /* Released by the cancel itself (allow a second of real time). */
    tw_service_stats st;
    for (int i = 0; i < 5000; i++) {
        tw_service_get_stats(s, &st);
        if (st.cancelled == 1)
            break;
        nap_us(200);
    }
    ASSERT_EQ(st.cancelled, 1);
    /* The record is reused while the executor is still blocked. */
    tw_id c = 0;
    ASSERT_EQ(tw_schedule(s, blocker, NULL, 10 * SEC, &c), 0);
    ASSERT_EQ((uint32_t)c, (uint32_t)queued);
    ASSERT_NE(c, queued);
    atomic_store(&bl.release, true);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&bl.runs), 1);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 1); /* c */
    tw_service_get_stats(s, &st);
    ASSERT_EQ(st.ran, 1);
    ASSERT_EQ(st.cancelled, 1);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* RepeatedTimer reset at max_pending. */

static void on_trigger(tw_repeated *rt, void *arg)
{
    (void)rt;
    atomic_fetch_add((_Atomic int *)arg, 1);
}

static void test_repeated_reset_at_max(void)
{
    tw_service_config cfg = {0};
    cfg.max_pending = 1;
    tw_service *s = vservice(&cfg);
    _Atomic int runs = 0;
    tw_repeated_config rc = {0};
    rc.timeout_ns = 10 * MS;
    rc.on_trigger = on_trigger;
    rc.arg = &runs;
    tw_repeated *rt = NULL;
    ASSERT_EQ(tw_repeated_create(&rt, s, &rc), 0);
    ASSERT_EQ(tw_repeated_start(rt), 0);
    ASSERT_EQ(tw_service_pending(s), 1);
    vadvance(s, 5 * MS);
    /* At max_pending: the reset moves the run to 5 + 20 ms. */
    ASSERT_EQ(tw_repeated_reset(rt, 20 * MS), 0);
    ASSERT_EQ(tw_service_pending(s), 1);
    vadvance(s, 10 * MS); /* 15 ms: the old run would have been at 10 */
    ASSERT_EQ(atomic_load(&runs), 0);
    vadvance(s, 10 * MS); /* 25 ms */
    ASSERT_EQ(atomic_load(&runs), 1);
    ASSERT_EQ(tw_service_pending(s), 1);
    ASSERT_EQ(tw_repeated_restart(rt), 0); /* also at max_pending */
    ASSERT_EQ(tw_service_pending(s), 1);

    /* Another task takes the only slot: a reset of a stopped timer
     * schedules nothing, a restart fails and changes nothing. */
    tw_repeated_stop(rt);
    ASSERT_EQ(tw_service_pending(s), 0);
    tw_id other = 0;
    ASSERT_EQ(tw_schedule(s, count_run, &bl.runs, 1000 * SEC, &other), 0);
    ASSERT_EQ(tw_repeated_reset(rt, 30 * MS), 0);
    ASSERT_EQ(tw_repeated_restart(rt), TW_EAGAIN);
    ASSERT_EQ(tw_service_pending(s), 1);
    vadvance(s, 100 * MS);
    ASSERT_EQ(atomic_load(&runs), 1);
    tw_repeated_destroy(rt);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 1);
    tw_service_destroy(s);
}

int main(void)
{
    RUN_TEST(test_run_job_once);
    RUN_TEST(test_cancel_queued_for_executor);
    RUN_TEST(test_repeated_reset_at_max);
    return tw_test_done();
}
