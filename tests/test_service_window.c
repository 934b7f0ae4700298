/* SPDX-License-Identifier: MIT */
/*
 * tests/test_service_window.c - the service's deadline windows, lateness
 * histogram, backlog and clock choice.
 *
 * On a virtual clock (exact):
 * - every run is counted once in late_hist, in the bucket of its lateness
 *   (the clock at the run's start minus the start of its due tick), on the
 *   timer thread and on executors, one-shot and periodic; the buckets add
 *   up to ran; a task that waits for another of its round counts that
 *   wait (not with TW_SERVICE_LAZY_CLOCK, which takes the round's clock);
 * - backlog counts due tasks handed to an executor until they start (a
 *   held built-in executor, a caller-supplied executor that holds its jobs,
 *   a cancel of a queued task);
 * - windows: stepping the clock tick by tick, no task runs before its
 *   earliest or after its latest time, tasks with overlapping windows share
 *   runs, a window narrower than a tick is the exact deadline, slack_ns
 *   makes tw_schedule() a window, latest < earliest is TW_EINVAL;
 * - the pure helpers: the window's ticks and the capped wait on BOOTTIME.
 * On CLOCK_MONOTONIC / CLOCK_BOOTTIME (real time, generous bounds):
 * - clock_id values: the accepted ones run tasks, never early; others are
 *   TW_EINVAL; a task 2.2 s away on CLOCK_BOOTTIME takes at least 3
 *   wake-ups (the wait is capped at 1 s);
 * - windows wake the timer thread fewer times than exact deadlines.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define VCLOCK_START (UINT64_C(7000) * SEC)
#include "fixture.h"
#include "common.h"
#include "service_internal.h"
#include "service_clock.h"
#include "test.h"
#include "twheel/service.h"

#define VBASE VCLOCK_START

/* Wait (polling, real time) until @cond holds; fail after @sec seconds. */
#define POLL_UNTIL(cond, sec)                                                  \
    do {                                                                       \
        uint64_t pu_end_ = mono_now() + (uint64_t)(sec)*SEC;                   \
        while (!(cond) && mono_now() < pu_end_)                                \
            sleep_ns(MS / 4);                                                  \
        ASSERT(cond);                                                          \
    } while (0)

static tw_service *vservice(uint32_t executors, uint64_t slack_ns)
{
    tw_service_config cfg = {0};
    cfg.clock = vclock;
    cfg.executor_threads = executors;
    cfg.slack_ns = slack_ns;
    atomic_store(&vnow, VBASE);
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    ASSERT_EQ(tw_service_start(s), 0);
    return s;
}

static void set_clock(tw_service *s, uint64_t rel)
{
    atomic_store(&vnow, VBASE + rel);
    tw__service_sync(s);
}

/* Move the clock to @rel through every tick boundary on the way, syncing
 * at each: the timer thread sees every tick (an unloaded machine). */
static void walk_to(tw_service *s, uint64_t from, uint64_t rel)
{
    for (uint64_t k = from / MS + 1; k * MS < rel; k++)
        set_clock(s, k * MS);
    set_clock(s, rel);
}

static tw_service_stats stats(tw_service *s)
{
    tw_service_stats st;
    memset(&st, 0xa5, sizeof st);
    ASSERT_EQ(tw_service_get_stats(s, &st), 0);
    return st;
}

static uint64_t hist_sum(const tw_service_stats *st)
{
    uint64_t n = 0;
    for (unsigned i = 0; i < TW_LATE_BUCKETS; i++)
        n += st->late_hist[i];
    return n;
}

/* ------------------------------------------------------------------------ */
/* Lateness histogram. */

struct rec {
    _Atomic int runs;
    _Atomic uint64_t at; /* virtual clock (relative) at the last run */
};

static void rec_fn(tw_id id, void *arg)
{
    (void)id;
    struct rec *r = arg;
    atomic_store(&r->at, atomic_load(&vnow) - VBASE);
    atomic_fetch_add(&r->runs, 1);
}

/* One task per lateness: scheduled @delay from a clock off the tick grid,
 * then the clock is set @late past the start of its due tick. */
static void hist_once(uint32_t executors)
{
    static const uint64_t lates[] = {
        0,         999,        US,      3 * US,
        1000 * US, 1024 * US,  50 * MS, UINT64_C(2147483648) * US, /* 2^31 us */
        SEC,       3600 * SEC, 0};
    tw_service *s = vservice(executors, 0);
    uint64_t expect[TW_LATE_BUCKETS] = {0};
    uint64_t rel = 0;
    size_t n = sizeof lates / sizeof lates[0];
    for (size_t i = 0; i < n; i++) {
        struct rec r = {0};
        rel += 377 * US; /* off the 1 ms grid */
        set_clock(s, rel);
        uint64_t delay = (i + 1) * MS;
        tw_id id;
        ASSERT_EQ(tw_schedule(s, rec_fn, &r, delay, &id), 0);
        uint64_t due = (rel + delay + MS - 1) / MS * MS; /* its tick */
        set_clock(s, due - 1);                           /* not due yet */
        ASSERT_EQ(atomic_load(&r.runs), 0);
        rel = due + lates[i];
        set_clock(s, rel);
        ASSERT_EQ(atomic_load(&r.runs), 1);
        expect[tw__late_bucket(lates[i] / 1000)]++;
        tw_service_stats st = stats(s);
        for (unsigned b = 0; b < TW_LATE_BUCKETS; b++)
            ASSERT_EQ(st.late_hist[b], expect[b]);
        ASSERT_EQ(st.ran, i + 1);
        ASSERT_EQ(st.backlog, 0);
    }
    ASSERT_EQ(expect[0], 3);
    ASSERT_EQ(expect[TW_LATE_BUCKETS - 1], 2);
    tw_service_destroy(s);
}

static void test_hist_timer_thread(void)
{
    hist_once(0);
}

static void test_hist_executors(void)
{
    hist_once(2);
}

/* Two tasks due in the same tick, on the timer thread; whichever runs
 * first moves the clock on by 5 ms. The second one's lateness counts that
 * wait, unless TW_SERVICE_LAZY_CLOCK takes the round's reading for both. */
static _Atomic int bump_first;

static void bump_fn(tw_id id, void *arg)
{
    if (atomic_exchange(&bump_first, 0))
        atomic_fetch_add(&vnow, 5 * MS);
    rec_fn(id, arg);
}

static void test_hist_queueing(void)
{
    for (int lazy = 0; lazy < 2; lazy++) {
        tw_service_config cfg = {0};
        cfg.clock = vclock;
        cfg.flags = lazy ? TW_SERVICE_LAZY_CLOCK : 0;
        atomic_store(&vnow, VBASE);
        tw_service *s = NULL;
        ASSERT_EQ(tw_service_create(&s, &cfg), 0);
        struct rec a = {0}, b = {0};
        atomic_store(&bump_first, 1);
        /* Due at tick 1 either way (the lazy clock reads 1 ns at 0). */
        ASSERT_EQ(tw_schedule(s, bump_fn, &a, MS - 1, NULL), 0);
        ASSERT_EQ(tw_schedule(s, bump_fn, &b, MS - 1, NULL), 0);
        tw__service_sync(s); /* lazy: deadlines from the clock at 0 */
        set_clock(s, MS);
        ASSERT_EQ(atomic_load(&a.runs) + atomic_load(&b.runs), 2);
        tw_service_stats st = stats(s);
        if (lazy) {
            ASSERT_EQ(st.late_hist[0], 2);
        } else {
            ASSERT_EQ(st.late_hist[0], 1);
            ASSERT_EQ(st.late_hist[tw__late_bucket(5000)], 1);
        }
        tw_service_destroy(s);
    }
}

/* Many one-shot and periodic tasks, the clock moved in uneven steps: the
 * histogram holds each run once (it adds up to the runs the tasks saw). */
static void hist_many(uint32_t executors)
{
    enum { N = 500, P = 20 };
    tw_service *s = vservice(executors, 0);
    static struct rec r[N + P];
    memset(r, 0, sizeof r);
    uint64_t seed = 42 + executors;
    for (int i = 0; i < N; i++) {
        seed = seed * 6364136223846793005u + 1442695040888963407u;
        ASSERT_EQ(
            tw_schedule(s, rec_fn, &r[i], (seed >> 33) % (200 * MS), NULL), 0);
    }
    tw_id pid[P];
    for (int i = 0; i < P; i++) {
        int rc = i % 2
                     ? tw_schedule_fixed_rate(s, rec_fn, &r[N + i], MS,
                                              (uint64_t)(i + 3) * MS, &pid[i])
                     : tw_schedule_fixed_delay(s, rec_fn, &r[N + i], MS,
                                               (uint64_t)(i + 3) * MS, &pid[i]);
        ASSERT_EQ(rc, 0);
    }
    for (uint64_t t = 0; t <= 250 * MS; t += 7 * MS + 131 * US)
        set_clock(s, t);
    for (int i = 0; i < P; i++)
        ASSERT(tw_cancel(s, pid[i]));
    tw__service_sync(s);
    uint64_t runs = 0;
    for (int i = 0; i < N + P; i++)
        runs += (uint64_t)atomic_load(&r[i].runs);
    for (int i = 0; i < N; i++)
        ASSERT_EQ(atomic_load(&r[i].runs), 1);
    tw_service_stats st = stats(s);
    ASSERT_EQ(st.ran, runs);
    ASSERT_EQ(hist_sum(&st), runs);
    ASSERT_EQ(st.backlog, 0);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    st = stats(s);
    ASSERT_EQ(hist_sum(&st), runs);
    tw_service_destroy(s);
}

static void test_hist_many(void)
{
    hist_many(0);
    hist_many(3);
}

/* ------------------------------------------------------------------------ */
/* Backlog. */

static _Atomic int gate_open;
static _Atomic int gate_in;

static void gate_fn(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
    atomic_fetch_add(&gate_in, 1);
    while (!atomic_load(&gate_open))
        sleep_ns(MS / 4);
}

static void test_backlog_pool(void)
{
    enum { N = 10 };
    tw_service *s = vservice(1, 0);
    atomic_store(&gate_open, 0);
    atomic_store(&gate_in, 0);
    struct rec r[N];
    memset(r, 0, sizeof r);
    tw_id ids[N];
    ASSERT_EQ(tw_schedule(s, gate_fn, NULL, MS, NULL), 0);
    for (int i = 0; i < N; i++)
        ASSERT_EQ(tw_schedule(s, rec_fn, &r[i], 2 * MS, &ids[i]), 0);
    /* The one executor is held by gate_fn (5 ms late); the N others (4 ms
     * late) wait for it. */
    atomic_store(&vnow, VBASE + 6 * MS);
    tw__service_kick(s);
    POLL_UNTIL(atomic_load(&gate_in) == 1, 30);
    POLL_UNTIL(stats(s).backlog == N, 30);
    /* A cancel takes a queued task out at once. */
    ASSERT(tw_cancel(s, ids[3]));
    ASSERT_EQ(stats(s).backlog, N - 1);
    atomic_store(&gate_open, 1);
    tw__service_sync(s);
    tw_service_stats st = stats(s);
    ASSERT_EQ(st.backlog, 0);
    ASSERT_EQ(st.ran, N); /* gate_fn and N - 1 others */
    ASSERT_EQ(st.late_hist[tw__late_bucket(4000)], N - 1);
    ASSERT_EQ(st.late_hist[tw__late_bucket(5000)], 1);
    tw_service_destroy(s);
}

/* A caller-supplied executor that keeps its jobs until the test runs them. */
static tw_id held[64];
static _Atomic int nheld;

static void hold_exec(tw_service *s, tw_id job, void *ctx)
{
    (void)s;
    (void)ctx;
    /* One writer, the timer thread: publish the job, then the count. */
    int k = atomic_load(&nheld);
    held[k] = job;
    atomic_store(&nheld, k + 1);
}

static void test_backlog_caller_executor(void)
{
    enum { N = 8 };
    tw_service_config cfg = {0};
    cfg.clock = vclock;
    cfg.execute = hold_exec;
    atomic_store(&vnow, VBASE);
    atomic_store(&nheld, 0);
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    struct rec r[N];
    memset(r, 0, sizeof r);
    tw_id ids[N];
    for (int i = 0; i < N; i++)
        ASSERT_EQ(tw_schedule(s, rec_fn, &r[i], MS, &ids[i]), 0);
    atomic_store(&vnow, VBASE + 10 * MS);
    tw__service_kick(s);
    POLL_UNTIL(atomic_load(&nheld) == N, 30);
    POLL_UNTIL(stats(s).backlog == N, 30);
    ASSERT(tw_cancel(s, ids[0])); /* dispatched: released by its run call */
    ASSERT_EQ(stats(s).backlog, N);
    for (int i = 0; i < N; i++) {
        atomic_store(&vnow, VBASE + (10 + (uint64_t)i) * MS);
        tw_service_run(s, held[i]);
        tw_service_run(s, held[i]); /* ignored: counted once */
        ASSERT_EQ(stats(s).backlog, (uint64_t)(N - 1 - i));
    }
    tw_service_stats st = stats(s);
    ASSERT_EQ(st.ran, N - 1);
    ASSERT_EQ(st.cancelled, 1);
    ASSERT_EQ(hist_sum(&st), N - 1);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* Windows. */

struct wtask {
    uint64_t earliest, latest; /* relative virtual ns */
    _Atomic int runs;
    _Atomic uint64_t at;
};

static void wtask_fn(tw_id id, void *arg)
{
    (void)id;
    struct wtask *t = arg;
    atomic_store(&t->at, atomic_load(&vnow) - VBASE);
    atomic_fetch_add(&t->runs, 1);
}

/* Distinct values among the @n run times. */
static size_t distinct_runs(struct wtask *t, size_t n)
{
    size_t d = 0;
    for (size_t i = 0; i < n; i++) {
        size_t j = 0;
        while (j < i && atomic_load(&t[j].at) != atomic_load(&t[i].at))
            j++;
        d += j == i;
    }
    return d;
}

static void window_steps(uint32_t executors, bool slack)
{
    enum { N = 400 };
    const uint64_t slack_ns = 10 * MS + 300 * US;
    tw_service *s = vservice(executors, slack ? slack_ns : 0);
    static struct wtask t[N];
    memset(t, 0, sizeof t);
    uint64_t seed = 7 + executors, rel = 0;
    for (int i = 0; i < N; i++) {
        seed = seed * 6364136223846793005u + 1442695040888963407u;
        uint64_t e = (seed >> 33) % (300 * MS);
        uint64_t w = slack ? slack_ns : (seed >> 13) % (40 * MS);
        if (i % 10 == 0) { /* now and then, the clock moves off the grid */
            uint64_t to = rel + (seed >> 40) % (3 * MS);
            walk_to(s, rel, to);
            rel = to;
        }
        t[i].earliest = rel + e;
        t[i].latest = rel + e + w;
        int rc = slack ? tw_schedule(s, wtask_fn, &t[i], e, NULL)
                       : tw_schedule_window(s, wtask_fn, &t[i], e, e + w, NULL);
        ASSERT_EQ(rc, 0);
    }
    walk_to(s, rel, (rel + 400 * MS) / MS * MS);
    uint64_t exact = 0; /* distinct ticks the earliest times round up to */
    for (int i = 0; i < N; i++) {
        int j = 0;
        while (j < i &&
               (t[j].earliest + MS - 1) / MS != (t[i].earliest + MS - 1) / MS)
            j++;
        exact += j == i;
    }
    for (int i = 0; i < N; i++) {
        ASSERT_EQ(atomic_load(&t[i].runs), 1);
        /* Never early; never after latest, except for a window that
         * holds no tick boundary: it runs at its first tick. */
        uint64_t first = (t[i].earliest + MS - 1) / MS * MS;
        ASSERT_GE(atomic_load(&t[i].at), t[i].earliest);
        ASSERT_LE(atomic_load(&t[i].at),
                  t[i].latest > first ? t[i].latest : first);
    }
    /* 400 windows over 300 ms share runs: fewer than half the ticks
     * exact deadlines take (about 220); with slack (10 ticks: mostly
     * multiples of 8) about 40. */
    size_t d = distinct_runs(t, N);
    ASSERT_LT(d * 2, exact);
    if (slack)
        ASSERT_LT(d, 60);
    tw_service_destroy(s);
}

static void test_window_bounds(void)
{
    window_steps(0, false);
    window_steps(2, false);
}

static void test_slack_bounds(void)
{
    window_steps(0, true);
    window_steps(2, true);
}

static void test_window_edges(void)
{
    tw_service *s = vservice(0, 0);
    struct wtask a = {0}, b = {0}, c = {0};
    /* latest < earliest: nothing happens. */
    tw_id id = 77;
    ASSERT_EQ(tw_schedule_window(s, wtask_fn, &a, 5 * MS, 5 * MS - 1, &id),
              TW_EINVAL);
    ASSERT_EQ(id, 77);
    ASSERT_EQ(tw_service_pending(s), 0);
    ASSERT_EQ(tw_schedule_window(NULL, wtask_fn, &a, 0, 1, NULL), TW_EINVAL);
    ASSERT_EQ(tw_schedule_window(s, NULL, &a, 0, 1, NULL), TW_EINVAL);
    /* A window without a tick boundary past its first tick: exact. */
    set_clock(s, 200 * US);
    ASSERT_EQ(
        tw_schedule_window(s, wtask_fn, &a, 3 * MS, 3 * MS + 500 * US, NULL),
        0);
    /* An empty window at the current time: due now. */
    ASSERT_EQ(tw_schedule_window(s, wtask_fn, &b, 0, 0, NULL), 0);
    /* A window that ends beyond 64 bits of ns: runs at its coarse tick. */
    ASSERT_EQ(tw_schedule_window(s, wtask_fn, &c, 2 * MS, UINT64_MAX, NULL), 0);
    set_clock(s, MS);
    ASSERT_EQ(atomic_load(&b.runs), 1);
    ASSERT_EQ(atomic_load(&a.runs), 0);
    set_clock(s, 3 * MS + 199 * US);
    ASSERT_EQ(atomic_load(&a.runs), 0);
    set_clock(s, 4 * MS);
    ASSERT_EQ(atomic_load(&a.runs), 1);
    ASSERT_EQ(atomic_load(&c.runs), 0);
    ASSERT_EQ(tw_service_pending(s), 1);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 1);
    tw_service_destroy(s);
}

static void test_window_helpers(void)
{
    uint64_t f, l;
    tw__svc_window(MS, 0, 0, &f, &l);
    ASSERT_EQ(f, 0);
    ASSERT_EQ(l, 0);
    tw__svc_window(MS, MS + 1, 2 * MS, &f, &l);
    ASSERT_EQ(f, 2);
    ASSERT_EQ(l, 3);
    tw__svc_window(MS, MS + 1, MS - 2, &f, &l); /* no boundary after 2 */
    ASSERT_EQ(f, 2);
    ASSERT_EQ(l, 2);
    tw__svc_window(1000, UINT64_MAX - 5, 100, &f, &l); /* saturates */
    ASSERT_EQ(f, UINT64_MAX / 1000 + 1);
    ASSERT_EQ(l, f);
    tw__svc_window(7, 70, UINT64_MAX, &f, &l);
    ASSERT_EQ(f, 10);
    ASSERT_EQ(l, UINT64_MAX / 7);
    ASSERT_EQ(tw__svc_wait_ns(CLOCK_MONOTONIC, 5 * SEC), 5 * SEC);
    ASSERT_EQ(tw__svc_wait_ns(CLOCK_BOOTTIME, 5 * SEC), TW__SVC_WAIT_CAP_NS);
    ASSERT_EQ(tw__svc_wait_ns(CLOCK_BOOTTIME, MS), MS);
}

/* ------------------------------------------------------------------------ */
/* Clocks, real time. */

struct rt {
    clockid_t clock;
    uint64_t due; /* on @clock */
    _Atomic int runs;
    _Atomic uint64_t late;
};

static uint64_t clock_now(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

static void rt_fn(tw_id id, void *arg)
{
    (void)id;
    struct rt *t = arg;
    uint64_t now = clock_now(t->clock);
    ASSERT_GE(now, t->due); /* never early, on the service's clock */
    atomic_store(&t->late, now - t->due);
    atomic_fetch_add(&t->runs, 1);
}

static tw_service *clock_service(int32_t id)
{
    tw_service_config cfg = {0};
    cfg.clock_id = id;
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    return s;
}

static void test_clock_ids(void)
{
    static const int32_t bad[] = {CLOCK_PROCESS_CPUTIME_ID,
                                  CLOCK_THREAD_CPUTIME_ID,
                                  CLOCK_MONOTONIC_RAW,
                                  CLOCK_REALTIME_COARSE,
                                  CLOCK_MONOTONIC_COARSE,
                                  -1,
                                  12345};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tw_service_config cfg = {0};
        cfg.clock_id = bad[i];
        tw_service *s = NULL;
        ASSERT_EQ(tw_service_create(&s, &cfg), TW_EINVAL);
        ASSERT_NULL(s);
    }
    /* A caller-supplied clock takes no clock_id. */
    tw_service_config cfg = {0};
    cfg.clock = vclock;
    cfg.clock_id = CLOCK_MONOTONIC;
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, &cfg), TW_EINVAL);
    ASSERT_NULL(s);

    static const struct {
        int32_t id;
        clockid_t reads;
    } good[] = {{0, CLOCK_MONOTONIC},
                {CLOCK_MONOTONIC, CLOCK_MONOTONIC},
                {CLOCK_BOOTTIME, CLOCK_BOOTTIME}};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        s = clock_service(good[i].id);
        struct rt t = {.clock = good[i].reads};
        t.due = clock_now(t.clock) + 30 * MS;
        ASSERT_EQ(tw_schedule(s, rt_fn, &t, 30 * MS, NULL), 0);
        POLL_UNTIL(atomic_load(&t.runs) == 1, 30);
        tw_service_destroy(s);
    }
}

/* On CLOCK_BOOTTIME the timer thread waits at most 1 s at a time: a task
 * 2.2 s away takes a wake-up at or before 1 s, one at or before 2 s and
 * its own, whatever the machine's load (a late wake-up only adds). */
static void test_boottime_capped_wait(void)
{
    tw_service *s = clock_service(CLOCK_BOOTTIME);
    struct rt t = {.clock = CLOCK_BOOTTIME};
    t.due = clock_now(CLOCK_BOOTTIME) + 2200 * MS;
    ASSERT_EQ(tw_schedule(s, rt_fn, &t, 2200 * MS, NULL), 0);
    POLL_UNTIL(atomic_load(&t.runs) == 1, 60);
    tw_service_stats st = stats(s);
    ASSERT_GE(st.wakeups, 3);
    ASSERT_EQ(st.ran, 1);
    tw_service_destroy(s);
}

/* Real time: 100 tasks 3 ms apart, exact and with a 100 ms window. Exact
 * deadlines take a wake-up for nearly every task (a timer thread that is
 * late by 3 ms or more merges some); windows gather them at a few coarse
 * ticks (multiples of 64 ms within each window: about 6). The bound, a
 * third, leaves room for a thread that is late again and again on this
 * shared machine. Never early is checked by each task on the clock. */
static void test_window_fewer_wakeups(void)
{
    enum { N = 100 };
    uint64_t wake[2];
    for (int mode = 0; mode < 2; mode++) {
        tw_service *s = clock_service(0);
        ASSERT_EQ(tw_service_start(s), 0);
        sleep_ns(20 * MS); /* let the start-up wake-ups pass */
        tw_service_stats before = stats(s);
        static struct rt t[N];
        memset(t, 0, sizeof t);
        for (int i = 0; i < N; i++) {
            uint64_t d = 20 * MS + (uint64_t)i * 3 * MS;
            t[i].clock = CLOCK_MONOTONIC;
            t[i].due = clock_now(CLOCK_MONOTONIC) + d;
            int rc = mode == 0 ? tw_schedule(s, rt_fn, &t[i], d, NULL)
                               : tw_schedule_window(s, rt_fn, &t[i], d,
                                                    d + 100 * MS, NULL);
            ASSERT_EQ(rc, 0);
        }
        for (int i = 0; i < N; i++)
            POLL_UNTIL(atomic_load(&t[i].runs) == 1, 60);
        tw_service_stats after = stats(s);
        wake[mode] = after.wakeups - before.wakeups;
        tw_service_destroy(s);
    }
    ASSERT_LE(wake[1] * 3, wake[0]);
}

int main(void)
{
    RUN_TEST(test_hist_timer_thread);
    RUN_TEST(test_hist_executors);
    RUN_TEST(test_hist_many);
    RUN_TEST(test_hist_queueing);
    RUN_TEST(test_backlog_pool);
    RUN_TEST(test_backlog_caller_executor);
    RUN_TEST(test_window_bounds);
    RUN_TEST(test_slack_bounds);
    RUN_TEST(test_window_edges);
    RUN_TEST(test_window_helpers);
    RUN_TEST(test_clock_ids);
    RUN_TEST(test_boottime_capped_wait);
    RUN_TEST(test_window_fewer_wakeups);
    return 0;
}
