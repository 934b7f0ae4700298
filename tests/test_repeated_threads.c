/* SPDX-License-Identifier: MIT */
/*
 * tests/test_repeated_threads.c - RepeatedTimer on a real tw_service, with
 * real threads and CLOCK_MONOTONIC (the exact semantics are checked in
 * virtual time by test_repeated.c). Runs under ThreadSanitizer. At
 * max_pending: a timer whose free slots another user takes during its run
 * re-arms all the same (it keeps its own slot), on a virtual clock; and
 * the reported case on the real clock (8 timers at max_pending = 8,
 * resets of four in a loop): every reset succeeds, every timer keeps
 * running.
 *
 * Timing rules: "never early" bounds are exact (a run never starts before
 * its timeout has passed since the previous one returned). Lower bounds on
 * how many runs happen are generous (half the ideal count) and a miss is
 * retried twice with the window doubled, so a loaded 2-core machine does
 * not make the test flaky.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"
#include "service_internal.h"
#include "test.h"
#include "twheel/repeated.h"

/* Poll @v until it reaches @want; false after 10 s (a generous bound). */
static bool wait_for(atomic_int *v, int want)
{
    for (int i = 0; i < 10000; i++) {
        if (atomic_load(v) >= want)
            return true;
        sleep_ms(1);
    }
    return false;
}

static tw_service *service(uint32_t executors)
{
    tw_service_config cfg = {.tick_ns = MS, .executor_threads = executors};
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    ASSERT_EQ(tw_service_start(s), 0);
    return s;
}

/* ---- rate: 20 runs a second at 50 ms; 10 with a 100 ms adjust hook ---- */

#define MAX_RUNS 256

struct rate {
    atomic_int runs;
    uint64_t at[MAX_RUNS]; /* start of each run */
    uint64_t end[MAX_RUNS];
    uint64_t adjust_to;
    atomic_int inside; /* overlap detector */
    atomic_int destroyed;
};

static void rate_trigger(tw_repeated *rt, void *arg)
{
    struct rate *r = arg;
    int n = atomic_load(&r->runs);
    (void)rt;
    ASSERT_EQ(atomic_fetch_add(&r->inside, 1), 0);
    if (n < MAX_RUNS)
        r->at[n] = mono_now();
    if (n < MAX_RUNS)
        r->end[n] = mono_now();
    atomic_fetch_sub(&r->inside, 1);
    atomic_store(&r->runs, n + 1);
}

static void rate_destroy(tw_repeated *rt, void *arg)
{
    struct rate *r = arg;
    (void)rt;
    atomic_store(&r->destroyed, 1);
}

static uint64_t rate_adjust(tw_repeated *rt, uint64_t timeout, void *arg)
{
    struct rate *r = arg;
    (void)rt;
    return r->adjust_to ? r->adjust_to : timeout;
}

/*
 * Runs a @timeout_ms timer (adjusted to @adjust_ms if not 0) for @window_ms
 * and returns how many runs started in the window. Checks that no run
 * started before the delay since the previous one's end (or the start).
 */
static int measure_rate(tw_service *s, uint64_t timeout_ms, uint64_t adjust_ms,
                        unsigned window_ms)
{
    static struct rate r;
    tw_repeated_config cfg = {"rate",      timeout_ms * MS, rate_trigger,
                              rate_adjust, rate_destroy,    &r};
    uint64_t delay = (adjust_ms ? adjust_ms : timeout_ms) * MS, t0;
    tw_repeated *rt;
    int n;

    memset(&r, 0, sizeof r);
    r.adjust_to = adjust_ms * MS;
    ASSERT_EQ(tw_repeated_create(&rt, s, &cfg), 0);
    t0 = mono_now();
    ASSERT_EQ(tw_repeated_start(rt), 0);
    sleep_ms(window_ms);
    tw_repeated_stop(rt);
    n = atomic_load(&r.runs);
    tw_repeated_destroy(rt);
    ASSERT(wait_for(&r.destroyed, 1)); /* no run left: r can be reused */
    ASSERT_LE(n, MAX_RUNS);
    for (int i = 0; i < n; i++)
        ASSERT_GE(r.at[i], (i == 0 ? t0 : r.end[i - 1]) + delay);
    /* Never early: at most one run per delay. */
    ASSERT_LE((uint64_t)n, window_ms * MS / delay + 1);
    return n;
}

static void check_rate(uint64_t timeout_ms, uint64_t adjust_ms)
{
    tw_service *s = service(0);
    uint64_t delay_ms = adjust_ms ? adjust_ms : timeout_ms;
    unsigned window = 1000;
    int n = 0;

    for (int attempt = 0; attempt < 3; attempt++, window *= 2) {
        n = measure_rate(s, timeout_ms, adjust_ms, window);
        fprintf(stderr, "   %u ms at %" PRIu64 " ms: %d runs\n", window,
                delay_ms, n);
        if ((uint64_t)n >= window / delay_ms / 2)
            break;
    }
    ASSERT_GE((uint64_t)n, window / delay_ms / 2);
    tw_service_destroy(s);
}

static void test_rate_50ms(void)
{
    check_rate(50, 0);
}

static void test_adjust_100ms_halves_rate(void)
{
    check_rate(50, 100);
}

/* ---- stop freezes the count; run_once_now runs on the caller ---------- */

struct counter {
    atomic_int runs;     /* runs started */
    atomic_int returned; /* runs finished */
    atomic_int destroyed;
    pthread_t last_thread;
};

static void count_trigger(tw_repeated *rt, void *arg)
{
    struct counter *c = arg;
    (void)rt;
    atomic_fetch_add(&c->runs, 1);
    c->last_thread = pthread_self();
    atomic_fetch_add(&c->returned, 1);
}

static void count_destroy(tw_repeated *rt, void *arg)
{
    struct counter *c = arg;
    (void)rt;
    atomic_fetch_add(&c->destroyed, 1);
}

static void test_stop_freezes_and_run_once_now(void)
{
    tw_service *s = service(0);
    struct counter c = {0};
    tw_repeated_config cfg = {"count", 5 * MS,        count_trigger,
                              NULL,    count_destroy, &c};
    tw_repeated *rt;
    int frozen;

    ASSERT_EQ(tw_repeated_create(&rt, s, &cfg), 0);
    ASSERT_EQ(tw_repeated_start(rt), 0);
    ASSERT(wait_for(&c.runs, 3));
    tw_repeated_stop(rt);
    /*
     * stop does not wait for a run in progress; once that one returned, no
     * run starts again (a task the service had already taken is stale).
     */
    frozen = atomic_load(&c.runs);
    ASSERT(wait_for(&c.returned, frozen));
    ASSERT_EQ(atomic_load(&c.runs), frozen);
    sleep_ms(100);
    ASSERT_EQ(atomic_load(&c.runs), frozen);

    /* A long timeout: only run_once_now runs it, here, at once. */
    ASSERT_EQ(tw_repeated_reset(rt, 3600 * 1000 * MS), 0);
    ASSERT_EQ(tw_repeated_start(rt), 0);
    ASSERT_EQ(tw_repeated_run_once_now(rt), 0);
    ASSERT_EQ(atomic_load(&c.runs), frozen + 1);
    ASSERT(pthread_equal(c.last_thread, pthread_self()));
    ASSERT_EQ(tw_service_pending(s), 1); /* rescheduled: an hour away */
    tw_repeated_destroy(rt);
    ASSERT_EQ(atomic_load(&c.destroyed), 1);
    ASSERT_EQ(tw_service_pending(s), 0);
    tw_service_destroy(s);
}

/* ---- destroy while a run is in flight --------------------------------- */

struct flight {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool release;
    atomic_int entered, returned, destroyed;
    atomic_int destroyed_after_return;
};

static void flight_trigger(tw_repeated *rt, void *arg)
{
    struct flight *f = arg;
    (void)rt;
    atomic_fetch_add(&f->entered, 1);
    pthread_mutex_lock(&f->mu);
    while (!f->release)
        pthread_cond_wait(&f->cv, &f->mu);
    pthread_mutex_unlock(&f->mu);
    atomic_fetch_add(&f->returned, 1);
}

static void flight_destroy(tw_repeated *rt, void *arg)
{
    struct flight *f = arg;
    (void)rt;
    atomic_store(&f->destroyed_after_return, atomic_load(&f->returned));
    atomic_fetch_add(&f->destroyed, 1);
}

static void destroy_in_flight(uint32_t executors)
{
    tw_service *s = service(executors);
    struct flight f = {.release = false};
    tw_repeated_config cfg = {"flight", 2 * MS,         flight_trigger,
                              NULL,     flight_destroy, &f};
    tw_repeated *rt;

    pthread_mutex_init(&f.mu, NULL);
    pthread_cond_init(&f.cv, NULL);
    ASSERT_EQ(tw_repeated_create(&rt, s, &cfg), 0);
    ASSERT_EQ(tw_repeated_start(rt), 0);
    ASSERT(wait_for(&f.entered, 1));
    ASSERT_EQ(tw_repeated_run_once_now(rt), TW_EBUSY); /* no overlap */
    tw_repeated_destroy(rt);
    ASSERT_EQ(atomic_load(&f.destroyed), 0); /* deferred: a run is on */
    pthread_mutex_lock(&f.mu);
    f.release = true;
    pthread_cond_broadcast(&f.cv);
    pthread_mutex_unlock(&f.mu);
    ASSERT(wait_for(&f.destroyed, 1));
    ASSERT_EQ(atomic_load(&f.destroyed_after_return), 1);
    sleep_ms(20);
    ASSERT_EQ(atomic_load(&f.destroyed), 1); /* exactly once */
    ASSERT_EQ(atomic_load(&f.entered), 1);   /* and no run after it */
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
    pthread_cond_destroy(&f.cv);
    pthread_mutex_destroy(&f.mu);
}

static void test_destroy_in_flight(void)
{
    destroy_in_flight(0);
    destroy_in_flight(2);
}

/* ---- many threads at once --------------------------------------------- */

#define N_TIMERS 4
#define N_THREADS 4

struct stress {
    tw_repeated *rt[N_TIMERS];
    struct counter c[N_TIMERS];
    atomic_int inside[N_TIMERS];
    atomic_bool stop;
};

static struct stress st;

static void stress_trigger(tw_repeated *rt, void *arg)
{
    struct counter *c = arg;
    int i = (int)(c - st.c);
    ASSERT(st.rt[i] == rt);
    ASSERT_EQ(atomic_fetch_add(&st.inside[i], 1), 0); /* never overlap */
    atomic_fetch_add(&c->runs, 1);
    if (atomic_load(&c->runs) % 7 == 0) /* calls from inside, too */
        tw_repeated_reset(rt, (uint64_t)(1 + c->runs % 3) * MS);
    atomic_fetch_sub(&st.inside[i], 1);
}

static void *stress_thread(void *arg)
{
    uint64_t seed = (uint64_t)(uintptr_t)arg;
    while (!atomic_load(&st.stop)) {
        uint64_t r = tw_test_rand(&seed);
        tw_repeated *rt = st.rt[r % N_TIMERS];
        int rc = 0;
        switch ((r >> 8) % 6) {
        case 0:
            rc = tw_repeated_start(rt);
            break;
        case 1:
            tw_repeated_stop(rt);
            break;
        case 2:
            rc = tw_repeated_restart(rt);
            break;
        case 3:
            rc = tw_repeated_reset(rt, 0);
            break;
        case 4:
            rc = tw_repeated_reset(rt, (1 + (r >> 16) % 4) * MS);
            break;
        default:
            rc = tw_repeated_run_once_now(rt);
            ASSERT(rc == 0 || rc == TW_EBUSY);
            rc = 0;
        }
        ASSERT_EQ(rc, 0);
    }
    return NULL;
}

static void test_threads_stress(void)
{
    tw_service *s = service(2);
    pthread_t th[N_THREADS];
    int runs = 0;

    memset(&st, 0, sizeof st);
    for (int i = 0; i < N_TIMERS; i++) {
        tw_repeated_config cfg = {"stress",      MS,      stress_trigger, NULL,
                                  count_destroy, &st.c[i]};
        ASSERT_EQ(tw_repeated_create(&st.rt[i], s, &cfg), 0);
        ASSERT_EQ(tw_repeated_start(st.rt[i]), 0);
    }
    for (int i = 0; i < N_THREADS; i++)
        ASSERT_EQ(pthread_create(&th[i], NULL, stress_thread,
                                 (void *)(uintptr_t)(i + 1)),
                  0);
    sleep_ms(300);
    atomic_store(&st.stop, true);
    for (int i = 0; i < N_THREADS; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N_TIMERS; i++) {
        runs += atomic_load(&st.c[i].runs);
        tw_repeated_destroy(st.rt[i]);
    }
    for (int i = 0; i < N_TIMERS; i++) {
        ASSERT(wait_for(&st.c[i].destroyed, 1));
    }
    fprintf(stderr, "   %d runs\n", runs);
    ASSERT_GT(runs, 0);
    /* Every task of every timer is gone once the last on_destroy ran. */
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
    for (int i = 0; i < N_TIMERS; i++)
        ASSERT_EQ(atomic_load(&st.c[i].destroyed), 1);
}

/* ---- a service stopped under its timers ------------------------------- */

static void test_service_stop_hands_back(void)
{
    tw_service *s = service(0);
    struct counter c[2] = {{0}, {0}};
    tw_repeated *rt[2];

    for (int i = 0; i < 2; i++) {
        tw_repeated_config cfg = {"long", 3600 * 1000 * MS, count_trigger,
                                  NULL,   count_destroy,    &c[i]};
        ASSERT_EQ(tw_repeated_create(&rt[i], s, &cfg), 0);
        ASSERT_EQ(tw_repeated_start(rt[i]), 0);
    }
    ASSERT_EQ(tw_service_stop(s, tw_repeated_unprocessed, NULL), 2);
    ASSERT_EQ(tw_repeated_start(rt[0]), TW_ESHUTDOWN);
    ASSERT_EQ(tw_repeated_run_once_now(rt[1]), 0); /* stopped: just runs */
    ASSERT_EQ(atomic_load(&c[1].runs), 1);
    for (int i = 0; i < 2; i++) {
        tw_repeated_destroy(rt[i]);
        ASSERT_EQ(atomic_load(&c[i].destroyed), 1);
    }
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
static void noop(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
}

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
    tw_service *s = vclock_service(&cfg);
    rt_at_max.s = s;
    tw_repeated_config rc = {0};
    rc.timeout_ns = 10 * MS;
    rc.on_trigger = fill_on_trigger;
    tw_repeated *rt = NULL;
    ASSERT_EQ(tw_repeated_create(&rt, s, &rc), 0);
    ASSERT_EQ(tw_repeated_start(rt), 0);
    ASSERT_EQ(tw_service_pending(s), 1);
    atomic_store(&vnow, VCLOCK_START + 10 * MS);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&rt_at_max.runs), 1);
    ASSERT_EQ(rt_at_max.fillers, 1); /* the timer kept its slot meanwhile */
    ASSERT_EQ(tw_service_pending(s), 2);
    atomic_store(&vnow, VCLOCK_START + 20 * MS);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&rt_at_max.runs), 2); /* before the fix: 1 */
    atomic_store(&vnow, VCLOCK_START + 30 * MS);
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
    RUN_TEST(test_rate_50ms);
    RUN_TEST(test_adjust_100ms_halves_rate);
    RUN_TEST(test_stop_freezes_and_run_once_now);
    RUN_TEST(test_destroy_in_flight);
    RUN_TEST(test_threads_stress);
    RUN_TEST(test_service_stop_hands_back);
    RUN_TEST(test_repeated_rearm_at_max);
    RUN_TEST(test_repeated_resets_at_max_realtime);
    return tw_test_done();
}
