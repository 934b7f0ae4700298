/* SPDX-License-Identifier: MIT */
/*
 * tests/test_service_guarantees.c - promises of service.h that a demanding
 * user broke, each forced deterministically:
 *
 *   test_run_ignored_on_pool: tw_service_run() on a service with the
 *     built-in executor pool ignores every id (the pool hands out no jobs),
 *     even the id of a task waiting in the pool's queue.
 *   test_failed_call_holds_no_slot: a call that fails never moves the
 *     pending count (a stress complement to the forced case in
 *     test_service_held_alloc).
 *   test_replace_running_at_max: a replacing schedule at max_pending whose
 *     old task has just started (RUNNING, its slot not yet released)
 *     succeeds.
 *   test_repeated_rearm_at_max: a RepeatedTimer whose free slots are
 *     taken by another user during its run re-arms all the same (it keeps
 *     its own slot) and never stops by itself.
 *   test_repeated_resets_at_max_realtime: the reported case on the real
 *     clock (8 timers at max_pending = 8, resets of four in a loop): all
 *     resets succeed and every timer keeps running.
 *   test_lazy_clock_busy_timer_thread: with TW_SERVICE_LAZY_CLOCK and
 *     tasks on the timer thread, a call made while a long task runs there
 *     is due its delay after the call, not after the long task.
 *   test_clock_step_back: an injected clock that steps back neither makes
 *     the timer thread spin nor strands a due task.
 *
 * Virtual clock throughout; real time only for generous upper bounds.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "internal.h"
#include "fixture.h"
#include "test.h"
#include "twheel/repeated.h"
#include "twheel/service.h"

#define VBASE VCLOCK_START

static tw_service *vservice(tw_service_config *cfg)
{
    atomic_store(&vnow, VBASE);
    cfg->clock = vclock;
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, cfg), 0);
    ASSERT_EQ(tw_service_start(s), 0);
    return s;
}

/* Poll @cond every 100 us for at most @sec seconds; then assert it. */
#define WAIT_FOR(cond, sec)                                                    \
    do {                                                                       \
        uint64_t wf_end_ = mono_now() + (uint64_t)(sec)*SEC;                   \
        while (!(cond) && mono_now() < wf_end_)                                \
            sleep_ns(100000);                                                  \
        ASSERT(cond);                                                          \
    } while (0)

/* A task that blocks until released. */
static struct {
    _Atomic int running;
    _Atomic bool release;
} blk;

static void blocker(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
    atomic_fetch_add(&blk.running, 1);
    while (!atomic_load(&blk.release))
        sleep_ns(100000);
}

static void blk_reset(void)
{
    atomic_store(&blk.running, 0);
    atomic_store(&blk.release, false);
}

struct runs {
    _Atomic int n;
    _Atomic uint64_t at; /* virtual time of the last run */
    pthread_t thread;    /* of the last run */
};

static void count(tw_id id, void *arg)
{
    (void)id;
    struct runs *r = arg;
    r->thread = pthread_self();
    atomic_store(&r->at, atomic_load(&vnow) - VBASE);
    atomic_fetch_add(&r->n, 1);
}

/* ------------------------------------------------------------------------ */

static void test_run_ignored_on_pool(void)
{
    tw_service_config cfg = {0};
    cfg.executor_threads = 1;
    tw_service *s = vservice(&cfg);
    blk_reset();
    ASSERT_EQ(tw_schedule(s, blocker, NULL, 0, NULL), 0);
    WAIT_FOR(atomic_load(&blk.running) == 1, 10);
    /* X is due at once and waits in the pool's queue behind the blocker;
     * calls for it must not run it here. Before the fix the first call
     * after the dispatch ran X on this thread, leaving its record linked
     * in the queue. */
    struct runs x = {0};
    tw_id xid = 0;
    ASSERT_EQ(tw_schedule(s, count, &x, 0, &xid), 0);
    for (int i = 0; i < 300; i++) {
        tw_service_run(s, xid);
        sleep_ns(MS);
    }
    ASSERT_EQ(atomic_load(&x.n), 0);
    atomic_store(&blk.release, true);
    WAIT_FOR(atomic_load(&x.n) == 1, 10);
    ASSERT(!pthread_equal(x.thread, pthread_self()));
    tw__service_sync(s);
    ASSERT_EQ(tw_service_pending(s), 0);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* A call that fails holds no pending slot, not even for a moment. */

static void noop(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
}

static void other_fn(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
}

static _Atomic bool stop_flood;
static _Atomic long flood_calls;

static void *flood_other_fn(void *p)
{
    tw_service *s = p;
    while (!atomic_load(&stop_flood)) {
        ASSERT_EQ(tw_schedule(s, other_fn, NULL, SEC, NULL), TW_EAGAIN);
        atomic_fetch_add(&flood_calls, 1);
    }
    return NULL;
}

/*
 * max_callbacks = 1 is taken by noop; another thread schedules other_fn in
 * a loop (always TW_EAGAIN). Nothing is pending, so every read of the
 * pending count must say 0 and every schedule of noop must succeed. Before
 * the fix the failing calls reserved a slot first: the count read 1 about
 * a third of the time and valid calls failed with TW_EAGAIN.
 */
static void test_failed_call_holds_no_slot(void)
{
    tw_service_config cfg = {0};
    cfg.max_pending = 1;
    cfg.max_callbacks = 1;
    tw_service *s = vservice(&cfg);
    tw_id a = 0;
    ASSERT_EQ(tw_schedule(s, noop, NULL, SEC, &a), 0); /* takes the entry */
    ASSERT(tw_cancel(s, a));
    ASSERT_EQ(tw_service_pending(s), 0);
    atomic_store(&stop_flood, false);
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, flood_other_fn, s), 0);
    while (atomic_load(&flood_calls) < 1000)
        sleep_ns(100000);
    long nonzero = 0, failed = 0;
    for (int i = 0; i < 200000; i++) {
        if (tw_service_pending(s) != 0)
            nonzero++;
        if ((i & 15) == 0) {
            int rc = tw_schedule(s, noop, NULL, SEC, &a);
            if (rc != 0)
                failed++;
            else
                ASSERT(tw_cancel(s, a));
        }
    }
    atomic_store(&stop_flood, true);
    pthread_join(t, NULL);
    fprintf(stderr, "   %ld failing calls meanwhile\n",
            atomic_load(&flood_calls));
    ASSERT_EQ(nonzero, 0);
    ASSERT_EQ(failed, 0);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* A replacing call at max_pending while the old task has just started. */

static struct {
    tw_service *s;
    tw_id old;
    int rc;
    bool cancelled;
    tw_id nid;
    struct runs *r;
    _Atomic int calls;
} rp;

static void replace_from_hook(tw_service *s, tw_id id)
{
    if (id != rp.old)
        return;
    atomic_fetch_add(&rp.calls, 1);
    /* The old task is RUNNING and has not released its slot yet. */
    rp.rc = tw__schedule_replace(s, count, rp.r, 10 * MS, rp.old, &rp.cancelled,
                                 &rp.nid);
}

static void test_replace_running_at_max(void)
{
    tw_service_config cfg = {0};
    cfg.max_pending = 1;
    tw_service *s = vservice(&cfg);
    struct runs a = {0}, b = {0};
    rp.r = &b;
    rp.rc = -1;
    ASSERT_EQ(tw__schedule_replace(s, count, &a, MS, 0, NULL, &rp.old), 0);
    ASSERT_EQ(tw_service_pending(s), 1);
    tw__service_started_hook = replace_from_hook;
    atomic_store(&vnow, VBASE + MS);
    tw__service_sync(s);
    tw__service_started_hook = NULL;
    ASSERT_EQ(atomic_load(&rp.calls), 1);
    ASSERT_EQ(atomic_load(&a.n), 1);
    ASSERT_EQ(rp.rc, 0); /* before the fix: TW_EAGAIN */
    ASSERT(!rp.cancelled);
    ASSERT_EQ(tw_service_pending(s), 1); /* the new task's slot */
    atomic_store(&vnow, VBASE + 11 * MS);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&b.n), 1);
    ASSERT_EQ(tw_service_pending(s), 0);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/*
 * A RepeatedTimer's re-arm after a run at max_pending: while on_trigger
 * runs, another user takes every free slot. Before the fix the run had
 * released its slot at its start, the re-arm failed with TW_EAGAIN and the
 * timer stopped for good, silently. Now the re-arm takes over the running
 * task's own slot.
 */
static struct {
    tw_service *s;
    _Atomic int runs;
    int fillers;
    tw_id filler[4];
} rt_at_max;

static void fill_on_trigger(tw_repeated *rt, void *arg)
{
    (void)rt;
    (void)arg;
    if (atomic_fetch_add(&rt_at_max.runs, 1) != 0)
        return;
    /* The first run: take every slot left (another user at max_pending). */
    while (rt_at_max.fillers < 4 &&
           tw_schedule(rt_at_max.s, noop, NULL, 100 * SEC,
                       &rt_at_max.filler[rt_at_max.fillers]) == 0)
        rt_at_max.fillers++;
}

static void test_repeated_rearm_at_max(void)
{
    tw_service_config cfg = {0};
    cfg.max_pending = 2;
    tw_service *s = vservice(&cfg);
    rt_at_max.s = s;
    tw_repeated_config rc = {0};
    rc.timeout_ns = 10 * MS;
    rc.on_trigger = fill_on_trigger;
    tw_repeated *rt = NULL;
    ASSERT_EQ(tw_repeated_create(&rt, s, &rc), 0);
    ASSERT_EQ(tw_repeated_start(rt), 0);
    ASSERT_EQ(tw_service_pending(s), 1);
    atomic_store(&vnow, VBASE + 10 * MS);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&rt_at_max.runs), 1);
    ASSERT_EQ(rt_at_max.fillers, 1); /* the timer kept its slot meanwhile */
    ASSERT_EQ(tw_service_pending(s), 2);
    atomic_store(&vnow, VBASE + 20 * MS);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&rt_at_max.runs), 2); /* before the fix: 1 */
    atomic_store(&vnow, VBASE + 30 * MS);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&rt_at_max.runs), 3);
    ASSERT_EQ(tw_repeated_rearm_failures(rt), 0);
    /* Resets at max_pending succeed too. */
    for (int i = 0; i < 100; i++)
        ASSERT_EQ(tw_repeated_reset(rt, 0), 0);
    ASSERT_EQ(tw_service_pending(s), 2);
    tw_repeated_destroy(rt);
    ASSERT_EQ(tw_service_pending(s), 1);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 1);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* A caller-supplied clock that steps back. */

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

/*
 * The clock at 10 s steps back to 9 s; a delay-0 task and a 500 ms task
 * are scheduled. Before the fix the delay-0 task was due in the wheel but
 * below the wheel's time, and the timer thread looped on it at 100% CPU
 * until the clock caught up. Now the service's time stays at 10 s: the
 * delay-0 task runs at once, the other 500 ms after 10 s, and the timer
 * thread sleeps meanwhile. Bound: under a third of 400 ms of real time in
 * CPU time for the whole process (a spinning thread takes nearly all).
 */
static void test_clock_step_back(void)
{
    tw_service_config cfg = {0};
    tw_service *s = vservice(&cfg);
    atomic_store(&vnow, VBASE + 10 * SEC);
    tw__service_sync(s);
    atomic_store(&vnow, VBASE + 9 * SEC);
    struct runs now = {0}, later = {0};
    ASSERT_EQ(tw_schedule(s, count, &now, 0, NULL), 0);
    ASSERT_EQ(tw_schedule(s, count, &later, 500 * MS, NULL), 0);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&now.n), 1); /* before the fix: 0 */
    uint64_t c0 = cpu_ns(), t0 = mono_now();
    sleep_ns(400 * MS);
    uint64_t cpu = cpu_ns() - c0, real = mono_now() - t0;
    fprintf(stderr, "   %.1f ms CPU in %.1f ms\n", (double)cpu / 1e6,
            (double)real / 1e6);
    ASSERT_LT(cpu, real / 3);
    atomic_store(&vnow, VBASE + 10 * SEC + 499 * MS);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&later.n), 0); /* never early */
    atomic_store(&vnow, VBASE + 10 * SEC + 500 * MS);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&later.n), 1);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/*
 * TW_SERVICE_LAZY_CLOCK with tasks on the timer thread: a 100 ms task is
 * scheduled while a long task runs there; the clock moves 300 ms before
 * the long task returns. Before the fix the call left its deadline to the
 * timer thread, which computed it after the long task: due at 400 ms, 300
 * ms late. Now a call made while a task runs on the timer thread reads the
 * clock itself: due at 100 ms, so it runs as soon as the long task ends.
 */
static void test_lazy_clock_busy_timer_thread(void)
{
    tw_service_config cfg = {0};
    cfg.flags = TW_SERVICE_LAZY_CLOCK;
    tw_service *s = vservice(&cfg);
    blk_reset();
    /* Periodic: its deadline is read at the call (a lazy one may be a
     * tick later, and the virtual clock stands still). */
    tw_id bid = 0;
    ASSERT_EQ(tw_schedule_fixed_rate(s, blocker, NULL, 0, 100 * SEC, &bid), 0);
    WAIT_FOR(atomic_load(&blk.running) == 1, 10);
    struct runs b = {0};
    ASSERT_EQ(tw_schedule(s, count, &b, 100 * MS, NULL), 0);
    atomic_store(&vnow, VBASE + 300 * MS);
    atomic_store(&blk.release, true);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&b.n), 1); /* before the fix: 0 until 400 ms */
    ASSERT_EQ(atomic_load(&b.at), 300 * MS);
    ASSERT(tw_cancel(s, bid));
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/*
 * The reported case, on the real clock: 8 RepeatedTimers with a 1 ms
 * timeout on a service with max_pending = 8, one thread resetting timers
 * 0-3 in a loop for 300 ms. Every reset must succeed, no re-arm may fail,
 * and afterwards every timer must still run (bound: one more run each
 * within 10 s; they run every millisecond). Before the fix one of timers
 * 4-7 stopped for good in 4 of 4 runs.
 */
#define NRT 8

static _Atomic long rt_runs[NRT];

static void rt_count(tw_repeated *rt, void *arg)
{
    (void)rt;
    atomic_fetch_add((_Atomic long *)arg, 1);
}

static void test_repeated_resets_at_max_realtime(void)
{
    tw_service_config cfg = {0};
    cfg.max_pending = NRT;
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    tw_repeated *rt[NRT];
    for (int i = 0; i < NRT; i++) {
        tw_repeated_config rc = {0};
        rc.timeout_ns = MS;
        rc.on_trigger = rt_count;
        rc.arg = &rt_runs[i];
        ASSERT_EQ(tw_repeated_create(&rt[i], s, &rc), 0);
        ASSERT_EQ(tw_repeated_start(rt[i]), 0);
    }
    long resets = 0;
    uint64_t end = mono_now() + 300 * MS;
    while (mono_now() < end) {
        for (int i = 0; i < 4; i++) {
            ASSERT_EQ(tw_repeated_reset(rt[i], 0), 0);
            resets++;
        }
    }
    long before[NRT];
    for (int i = 0; i < NRT; i++)
        before[i] = atomic_load(&rt_runs[i]);
    for (int i = 0; i < NRT; i++) {
        WAIT_FOR(atomic_load(&rt_runs[i]) > before[i], 10);
        ASSERT_EQ(tw_repeated_rearm_failures(rt[i]), 0);
    }
    fprintf(stderr, "   %ld resets; timer 4 ran %ld times\n", resets,
            atomic_load(&rt_runs[4]));
    for (int i = 0; i < NRT; i++)
        tw_repeated_destroy(rt[i]);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

int main(void)
{
    if (getenv("ONLY") == NULL) {
        RUN_TEST(test_run_ignored_on_pool);
        RUN_TEST(test_failed_call_holds_no_slot);
        RUN_TEST(test_replace_running_at_max);
        RUN_TEST(test_repeated_rearm_at_max);
        RUN_TEST(test_repeated_resets_at_max_realtime);
        RUN_TEST(test_clock_step_back);
    }
    RUN_TEST(test_lazy_clock_busy_timer_thread);
    return tw_test_done();
}
