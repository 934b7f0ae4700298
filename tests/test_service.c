/* SPDX-License-Identifier: MIT */
/*
 * tests/test_service.c - the contract of twheel/service.h.
 *
 * Most tests use a virtual clock (tw_service_config.clock) and
 * tw__service_sync(), which waits until the timer thread has run a whole
 * round after the clock moved: exact, and independent of machine load.
 * The few tests that need real time (Netty's HashedWheelTimerTest timing
 * cases, a blocking task on the executor pool, wake-up counting) assert
 * only bounds that hold on a loaded machine, and retry once with doubled
 * durations before they fail; each states its bound.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "fixture.h"
#include "service_internal.h"
#include "test.h"
#include "twheel/service.h"

/* ------------------------------------------------------------------------ */
/* Virtual clock. */

#define VBASE VCLOCK_START

/* Move the virtual clock to VBASE + @rel and let the timer thread see it. */
static void vset(tw_service *s, uint64_t rel)
{
    ASSERT_GE(VBASE + rel, atomic_load(&vnow));
    atomic_store(&vnow, VBASE + rel);
    tw__service_sync(s);
}

static uint64_t vrel(void)
{
    return atomic_load(&vnow) - VBASE;
}

/* ------------------------------------------------------------------------ */
/* Task helpers. */

struct rec {
    _Atomic int runs;
    _Atomic uint64_t last_at; /* virtual (or real) time of the last run */
    _Atomic tw_id last_id;
};

static void rec_task(tw_id id, void *arg)
{
    struct rec *r = arg;
    atomic_store(&r->last_at, vrel());
    atomic_store(&r->last_id, id);
    atomic_fetch_add(&r->runs, 1);
}

static void nop_task(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
}

static void nop_task2(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
}

static void nop_task3(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
}

struct handed {
    int calls;
    tw_id ids[64];
    void *args[64];
    tw_task_fn fns[64];
};

static tw_service *unprocessed_svc; /* calls into it from the callback */

static void on_unprocessed(tw_id id, tw_task_fn fn, void *arg, void *ctx)
{
    struct handed *h = ctx;
    if (unprocessed_svc != NULL) {
        ASSERT_EQ(tw_service_start(unprocessed_svc), TW_ESHUTDOWN);
        ASSERT_EQ(tw_schedule(unprocessed_svc, fn, arg, 0, NULL), TW_ESHUTDOWN);
        ASSERT(!tw_cancel(unprocessed_svc, id));
        ASSERT_EQ(tw_service_stop(unprocessed_svc, NULL, NULL), TW_EDEADLK);
    }
    if (h->calls < 64) {
        h->ids[h->calls] = id;
        h->args[h->calls] = arg;
        h->fns[h->calls] = fn;
    }
    h->calls++;
}

/* ------------------------------------------------------------------------ */
/* Bad input. */

static void fake_execute(tw_service *s, tw_id job, void *ctx)
{
    (void)s;
    (void)job;
    (void)ctx;
}

static void test_create_bad_input(void)
{
    tw_service *s = (tw_service *)&s; /* a sentinel that must survive */
    tw_service *const sentinel = s;
    ASSERT_EQ(tw_service_create(NULL, NULL), TW_EINVAL);
    struct {
        tw_service_config c;
    } bad[] = {
        {{.tick_ns = 999}},
        {{.tick_ns = UINT64_C(86400) * SEC + 1}},
        {{.ticks_per_wheel = (UINT32_C(1) << 30) + 1}},
        {{.levels = 65}},
        {{.executor_threads = 1025}},
        {{.max_callbacks = (UINT32_C(1) << 24) + 1}},
        /* tick_ns * slots overflows 64 bits. */
        {{.tick_ns = UINT64_C(86400) * SEC, .ticks_per_wheel = 1u << 30}},
        {{.tick_ns = UINT64_C(86400) * SEC,
          .ticks_per_wheel = 1u << 30,
          .levels = 1}},
        {{.flags = 2}},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ASSERT_EQ(tw_service_create(&s, &bad[i].c), TW_EINVAL);
        ASSERT(s == sentinel);
    }
    tw_service_config ex = {.executor_threads = 1};
    ex.execute = fake_execute;
    ASSERT_EQ(tw_service_create(&s, &ex), TW_EINVAL);
    ASSERT(s == sentinel);
    /* The extremes that are valid. */
    tw_service_config ok = {.tick_ns = 1000,
                            .ticks_per_wheel = 4,
                            .levels = 64,
                            .executor_threads = 2,
                            .max_callbacks = 1};
    ASSERT_EQ(tw_service_create(&s, &ok), 0);
    tw_service_destroy(s);
    ASSERT_EQ(tw_service_create(&s, NULL), 0);
    ASSERT_EQ(tw_service_pending(s), 0);
    tw_service_destroy(s);
    tw_service_destroy(NULL);
}

static void test_schedule_bad_input(void)
{
    tw_service *s = vclock_service(NULL);
    tw_id id = 77;
    ASSERT_EQ(tw_schedule(NULL, nop_task, NULL, 0, &id), TW_EINVAL);
    ASSERT_EQ(tw_schedule(s, NULL, NULL, 0, &id), TW_EINVAL);
    ASSERT_EQ(tw_schedule_fixed_rate(s, nop_task, NULL, 0, 0, &id), TW_EINVAL);
    ASSERT_EQ(tw_schedule_fixed_delay(s, nop_task, NULL, 0, 0, &id), TW_EINVAL);
    ASSERT_EQ(tw_schedule_fixed_rate(s, NULL, NULL, 0, MS, &id), TW_EINVAL);
    ASSERT_EQ(id, 77);
    ASSERT_EQ(tw_service_pending(s), 0);
    ASSERT(!tw_cancel(NULL, 1));
    ASSERT(!tw_cancel(s, 0));
    ASSERT(!tw_cancel(s, UINT64_MAX));
    ASSERT_EQ(tw_cancel_wait(NULL, 1), TW_EINVAL);
    ASSERT_EQ(tw_cancel_wait(s, 12345), 0);
    ASSERT_EQ(tw_service_pending(NULL), 0);
    ASSERT_EQ(tw_service_stop(NULL, NULL, NULL), TW_EINVAL);
    ASSERT_EQ(tw_service_start(NULL), TW_EINVAL);
    tw_service_destroy(s);
}

static void test_max_callbacks(void)
{
    tw_service_config cfg = {.max_callbacks = 2};
    tw_service *s = vclock_service(&cfg);
    tw_id id = 5;
    ASSERT_EQ(tw_schedule(s, nop_task, NULL, SEC, NULL), 0);
    ASSERT_EQ(tw_schedule(s, nop_task2, NULL, SEC, NULL), 0);
    ASSERT_EQ(tw_schedule(s, nop_task, NULL, SEC, NULL), 0);
    ASSERT_EQ(tw_schedule(s, nop_task3, NULL, SEC, &id), TW_EAGAIN);
    ASSERT_EQ(id, 5);
    ASSERT_EQ(tw_service_pending(s), 3);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 3);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* Time. */

/* @late: how late a task may be seen to run (a tick plus the 0.25 ms
 * observation step; with the lazy clock, also the time until the timer
 * thread took the request: up to the next clock step of <= 1/3 ms). */
static void not_early_round(uint32_t flags, uint64_t late)
{
    tw_service_config cfg = {.flags = flags};
    tw_service *s = vclock_service(&cfg);
    uint64_t rng = 42;
    enum { N = 300 };
    static struct rec r[N];
    static uint64_t due[N];
    memset(r, 0, sizeof(r));
    for (int i = 0; i < N; i++) {
        /* Schedule at random sub-tick moments, random delays. */
        vset(s, vrel() + tw_test_rand(&rng) % (MS / 3));
        uint64_t d = tw_test_rand(&rng) % (40 * MS);
        if (i % 10 == 0)
            d = 0;
        due[i] = vrel() + d;
        ASSERT_EQ(tw_schedule(s, rec_task, &r[i], d, NULL), 0);
    }
    /* Step through time in 0.25 ms steps and check every run. */
    uint64_t end = vrel() + 50 * MS;
    while (vrel() < end) {
        vset(s, vrel() + MS / 4);
        for (int i = 0; i < N; i++) {
            if (atomic_load(&r[i].runs) == 0) {
                /* Not run: it must not be more than a tick late. */
                ASSERT_LT(vrel(), due[i] + late);
            } else {
                ASSERT_EQ(atomic_load(&r[i].runs), 1);
                ASSERT_GE(atomic_load(&r[i].last_at), due[i]);
                ASSERT_LT(atomic_load(&r[i].last_at), due[i] + late);
            }
        }
    }
    for (int i = 0; i < N; i++)
        ASSERT_EQ(atomic_load(&r[i].runs), 1);
    ASSERT_EQ(tw_service_pending(s), 0);
    tw_service_stats st;
    tw_service_get_stats(s, &st);
    ASSERT_EQ(st.ran, N);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

static void test_not_early_within_a_tick(void)
{
    not_early_round(0, MS + MS / 4);
    not_early_round(TW_SERVICE_LAZY_CLOCK, MS + MS / 4 + MS / 3);
}

/* Exactly at the boundary: a 10 ms delay scheduled at 0.3 ms is due at
 * 10.3 ms: the 11th tick. */
static void test_deadline_boundary(void)
{
    tw_service *s = vclock_service(NULL);
    struct rec r = {0};
    vset(s, 3 * MS / 10);
    ASSERT_EQ(tw_schedule(s, rec_task, &r, 10 * MS, NULL), 0);
    vset(s, 10 * MS + 3 * MS / 10 - 1);
    ASSERT_EQ(atomic_load(&r.runs), 0);
    vset(s, 11 * MS - 1);
    ASSERT_EQ(atomic_load(&r.runs), 0);
    vset(s, 11 * MS);
    ASSERT_EQ(atomic_load(&r.runs), 1);
    tw_service_destroy(s);
}

/* A delay whose deadline overflows never runs, counts as pending and is
 * handed back. */
static void test_never(void)
{
    tw_service *s = vclock_service(NULL);
    struct rec r = {0};
    tw_id a, b, c;
    ASSERT_EQ(tw_schedule(s, rec_task, &r, UINT64_MAX, &a), 0);
    ASSERT_EQ(tw_schedule_fixed_rate(s, rec_task, &r, UINT64_MAX, MS, &b), 0);
    ASSERT_EQ(tw_schedule(s, rec_task, &r, UINT64_MAX - VBASE, &c), 0);
    ASSERT_EQ(tw_service_pending(s), 3);
    vset(s, UINT64_C(1) << 62);
    vset(s, (UINT64_C(1) << 63) + (UINT64_C(1) << 62));
    ASSERT_EQ(atomic_load(&r.runs), 0);
    ASSERT_EQ(tw_service_pending(s), 3);
    ASSERT(tw_cancel(s, c));
    struct handed h = {0};
    ASSERT_EQ(tw_service_stop(s, on_unprocessed, &h), 2);
    ASSERT_EQ(h.calls, 2);
    ASSERT(h.args[0] == &r && h.args[1] == &r);
    ASSERT(h.fns[0] == rec_task);
    ASSERT((h.ids[0] == a && h.ids[1] == b) ||
           (h.ids[0] == b && h.ids[1] == a));
    ASSERT_EQ(tw_service_pending(s), 0);
    tw_service_destroy(s);
}

/* Fixed rate: start + initial + k * period, no drift even when each run
 * takes 3 ms; after a stall one run, not a burst. Fixed delay: delay
 * after the previous run ended. */
struct slow {
    struct rec r;
    uint64_t at[64];
    uint64_t cost; /* virtual ns each run takes */
};

static void slow_task(tw_id id, void *arg)
{
    struct slow *w = arg;
    int k = atomic_load(&w->r.runs);
    if (k < 64)
        w->at[k] = vrel();
    atomic_fetch_add(&vnow, w->cost);
    rec_task(id, &w->r);
}

/* Moves the virtual clock to at least VBASE + @rel: a slow task on an
 * executor may move it further (slow_task()) between this thread's read
 * and its store, and the clock never goes back. */
static void vset_at_least(tw_service *s, uint64_t rel)
{
    uint64_t cur = atomic_load(&vnow);
    while (cur < VBASE + rel &&
           !atomic_compare_exchange_weak(&vnow, &cur, VBASE + rel))
        ;
    tw__service_sync(s);
}

static void step_until(tw_service *s, uint64_t rel)
{
    while (vrel() < rel)
        vset_at_least(s, vrel() + MS / 2 > rel ? rel : vrel() + MS / 2);
}

static void test_fixed_rate_and_delay(void)
{
    for (int exec = 0; exec < 2; exec++) {
        tw_service_config cfg = {.executor_threads = exec ? 2u : 0u};
        tw_service *s = vclock_service(&cfg);
        static struct slow fr, fd;
        memset(&fr, 0, sizeof(fr));
        memset(&fd, 0, sizeof(fd));
        fr.cost = fd.cost = 3 * MS;
        tw_id a, b;
        ASSERT_EQ(
            tw_schedule_fixed_rate(s, slow_task, &fr, 5 * MS, 10 * MS, &a), 0);
        ASSERT_EQ(
            tw_schedule_fixed_delay(s, slow_task, &fd, 5 * MS, 10 * MS, &b), 0);
        ASSERT_EQ(tw_service_pending(s), 2);
        step_until(s, 100 * MS);
        /* Fixed rate: 5, 15, ..., 95 (at most the clock shift of the other
         * task's 3 ms run when both ran in the same round). */
        int nr = atomic_load(&fr.r.runs);
        ASSERT_GE(nr, 9);
        ASSERT_LE(nr, 10);
        for (int k = 0; k < nr; k++) {
            ASSERT_GE(fr.at[k], 5 * MS + (uint64_t)k * 10 * MS);
            ASSERT_LE(fr.at[k], 5 * MS + (uint64_t)k * 10 * MS + 4 * MS);
        }
        /* Fixed delay: each run starts >= 10 ms after the previous ended. */
        int nd = atomic_load(&fd.r.runs);
        ASSERT_GE(nd, 6);
        ASSERT_LE(nd, 8);
        for (int k = 1; k < nd; k++) {
            ASSERT_GE(fd.at[k], fd.at[k - 1] + 3 * MS + 10 * MS);
            ASSERT_LE(fd.at[k], fd.at[k - 1] + 3 * MS + 10 * MS + 5 * MS);
        }
        /* A stall of 55 ms: the fixed-rate task runs once, then resumes on
         * its original grid. */
        ASSERT(tw_cancel(s, b));
        fr.cost = 0;
        nr = atomic_load(&fr.r.runs);
        uint64_t g = 5 * MS + (uint64_t)(nr - 1) * 10 * MS; /* last slot */
        vset(s, g + 65 * MS);
        ASSERT_EQ(atomic_load(&fr.r.runs), nr + 1);
        step_until(s, g + 70 * MS - MS / 2);
        ASSERT_EQ(atomic_load(&fr.r.runs), nr + 1);
        step_until(s, g + 70 * MS);
        ASSERT_EQ(atomic_load(&fr.r.runs), nr + 2);
        ASSERT_EQ(fr.at[nr + 1], g + 70 * MS);
        ASSERT_EQ(tw_service_pending(s), 1);
        struct handed h = {0};
        ASSERT_EQ(tw_service_stop(s, on_unprocessed, &h), 1);
        ASSERT(h.ids[0] == a && h.args[0] == &fr);
        tw_service_destroy(s);
    }
}

/* ------------------------------------------------------------------------ */
/* Accounting, ids, limits. */

static void test_max_pending(void)
{
    tw_service_config cfg = {.max_pending = 2};
    tw_service *s = vclock_service(&cfg);
    struct rec r = {0};
    tw_id a, b, c = 9;
    ASSERT_EQ(tw_schedule(s, rec_task, &r, 10 * MS, &a), 0);
    ASSERT_EQ(tw_schedule(s, rec_task, &r, SEC, &b), 0);
    ASSERT_EQ(tw_schedule(s, rec_task, &r, SEC, &c), TW_EAGAIN);
    ASSERT_EQ(tw_schedule_fixed_rate(s, rec_task, &r, SEC, SEC, &c), TW_EAGAIN);
    ASSERT_EQ(c, 9);
    ASSERT_EQ(tw_service_pending(s), 2);
    /* Recovers after a run. */
    vset(s, 11 * MS);
    ASSERT_EQ(atomic_load(&r.runs), 1);
    ASSERT_EQ(tw_service_pending(s), 1);
    ASSERT_EQ(tw_schedule(s, rec_task, &r, SEC, &c), 0);
    ASSERT_EQ(tw_schedule(s, rec_task, &r, SEC, NULL), TW_EAGAIN);
    /* Recovers after a cancel. */
    ASSERT(tw_cancel(s, b));
    ASSERT_EQ(tw_service_pending(s), 1);
    ASSERT_EQ(tw_schedule(s, rec_task, &r, SEC, NULL), 0);
    ASSERT_EQ(tw_service_pending(s), 2);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 2);
    tw_service_destroy(s);
}

static void test_pending_counts(void)
{
    tw_service *s = vclock_service(NULL);
    struct rec r = {0};
    tw_id ids[10];
    for (int i = 0; i < 10; i++)
        ASSERT_EQ(tw_schedule(s, rec_task, &r, (uint64_t)(i + 1) * MS, &ids[i]),
                  0);
    ASSERT_EQ(tw_service_pending(s), 10);
    for (int i = 7; i < 10; i++)
        ASSERT(tw_cancel(s, ids[i]));
    ASSERT_EQ(tw_service_pending(s), 7);
    vset(s, 4 * MS);
    ASSERT_EQ(atomic_load(&r.runs), 4);
    ASSERT_EQ(tw_service_pending(s), 3);
    tw_id p;
    ASSERT_EQ(tw_schedule_fixed_delay(s, rec_task, &r, MS, MS, &p), 0);
    ASSERT_EQ(tw_service_pending(s), 4);
    vset(s, 5 * MS);
    vset(s, 5 * MS + MS / 2);
    ASSERT_EQ(tw_service_pending(s), 3); /* periodic still counts 1 */
    tw_service_stats st;
    tw_service_get_stats(s, &st);
    ASSERT_EQ(st.pending, 3);
    ASSERT_EQ(st.ran, (uint64_t)atomic_load(&r.runs));
    ASSERT_EQ(st.cancelled, 3);
    ASSERT_GE(st.nodes, 11);
    ASSERT_GT(st.memory_bytes, st.nodes * tw__service_node_size());
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 3);
    tw_service_get_stats(s, &st);
    ASSERT_EQ(st.handed_back, 3);
    ASSERT_EQ(st.pending, 0);
    tw_service_destroy(s);
}

static void test_stop(void)
{
    /* Nothing left after everything ran. */
    tw_service *s = vclock_service(NULL);
    struct rec r = {0};
    for (int i = 0; i < 5; i++)
        ASSERT_EQ(tw_schedule(s, rec_task, &r, MS, NULL), 0);
    vset(s, 2 * MS);
    ASSERT_EQ(atomic_load(&r.runs), 5);
    struct handed h = {0};
    ASSERT_EQ(tw_service_stop(s, on_unprocessed, &h), 0);
    ASSERT_EQ(h.calls, 0);
    /* After stop: rejected, pending stays 0, a second stop returns 0. */
    tw_id id = 3;
    ASSERT_EQ(tw_schedule(s, rec_task, &r, MS, &id), TW_ESHUTDOWN);
    ASSERT_EQ(tw_schedule_fixed_rate(s, rec_task, &r, MS, MS, &id),
              TW_ESHUTDOWN);
    ASSERT_EQ(tw_service_start(s), TW_ESHUTDOWN);
    ASSERT_EQ(id, 3);
    ASSERT_EQ(tw_service_pending(s), 0);
    ASSERT_EQ(tw_service_stop(s, on_unprocessed, &h), 0);
    tw_service_destroy(s);

    /* The pending tasks otherwise, each exactly once, with its arg. */
    s = vclock_service(NULL);
    int args[20];
    tw_id ids[20];
    for (int i = 0; i < 20; i++)
        ASSERT_EQ(tw_schedule(s, rec_task, &args[i], (uint64_t)(i + 1) * SEC,
                              &ids[i]),
                  0);
    ASSERT(tw_cancel(s, ids[3]));
    memset(&h, 0, sizeof(h));
    unprocessed_svc = s;
    ASSERT_EQ(tw_service_stop(s, on_unprocessed, &h), 19);
    unprocessed_svc = NULL;
    ASSERT_EQ(h.calls, 19);
    for (int i = 0; i < 20; i++) {
        int seen = 0;
        for (int k = 0; k < h.calls; k++)
            if (h.ids[k] == ids[i]) {
                seen++;
                ASSERT(h.args[k] == &args[i]);
                ASSERT(h.fns[k] == rec_task);
            }
        ASSERT_EQ(seen, i == 3 ? 0 : 1);
        ASSERT(!tw_cancel(s, ids[i])); /* handed back: gone */
    }
    ASSERT_EQ(tw_service_pending(s), 0);
    tw_service_destroy(s);

    /* A service that never started. */
    ASSERT_EQ(tw_service_create(&s, NULL), 0);
    ASSERT_EQ(tw_service_stop(s, on_unprocessed, &h), 0);
    ASSERT_EQ(tw_schedule(s, rec_task, &r, MS, NULL), TW_ESHUTDOWN);
    tw_service_destroy(s);

    /* Destroy without stop drops pending tasks without leaks (ASan). */
    s = vclock_service(NULL);
    ASSERT_EQ(tw_schedule_fixed_rate(s, rec_task, &r, SEC, SEC, NULL), 0);
    ASSERT_EQ(tw_schedule(s, rec_task, &r, SEC, NULL), 0);
    tw_service_destroy(s);
}

static void test_ids(void)
{
    tw_service *s = vclock_service(NULL);
    struct rec r = {0};
    tw_id x, y, z;
    ASSERT_EQ(tw_schedule(s, rec_task, &r, MS, &x), 0);
    ASSERT_NE(x, 0);
    vset(s, 2 * MS);
    ASSERT_EQ(atomic_load(&r.runs), 1);
    ASSERT_EQ(atomic_load(&r.last_id), x); /* the task sees its own id */
    ASSERT(!tw_cancel(s, x));              /* ran */
    /* The slot is reused with a new generation; the stale id misses. (An
     * exact window: tw_schedule() takes records from its thread's
     * magazine, the shared path from the free list, where x's record is.) */
    ASSERT_EQ(tw_schedule_window(s, rec_task, &r, MS, MS, &y), 0);
    ASSERT_EQ((uint32_t)y, (uint32_t)x);
    ASSERT_NE(y, x);
    ASSERT(!tw_cancel(s, x));
    ASSERT_EQ(tw_service_pending(s), 1);
    ASSERT(tw_cancel(s, y));
    ASSERT(!tw_cancel(s, y)); /* already cancelled */
    ASSERT_EQ(tw_service_pending(s), 0);
    vset(s, 4 * MS); /* released within a round */
    ASSERT_EQ(tw_schedule_window(s, rec_task, &r, MS, MS, &z), 0);
    ASSERT_EQ((uint32_t)z, (uint32_t)x);
    ASSERT(!tw_cancel(s, y));
    vset(s, 6 * MS);
    ASSERT_EQ(atomic_load(&r.runs), 2);
    ASSERT_EQ(atomic_load(&r.last_id), z);

    /* Another service's id, same slot index: false, nothing touched. */
    tw_service *t;
    ASSERT_EQ(tw_service_create(&t, NULL), 0);
    tw_id other;
    ASSERT_EQ(tw_schedule(t, rec_task, &r, SEC, &other), 0);
    ASSERT_EQ(tw_schedule_window(s, rec_task, &r, SEC, SEC, &z), 0);
    ASSERT_EQ((uint32_t)z, (uint32_t)other);
    ASSERT(!tw_cancel(s, other));
    ASSERT(!tw_cancel(t, z));
    ASSERT_EQ(tw_service_pending(s), 1);
    ASSERT_EQ(tw_service_pending(t), 1);
    ASSERT(tw_cancel(t, other));
    ASSERT(tw_cancel(s, z));
    tw_service_destroy(t);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* Calls from inside tasks. */

struct self {
    tw_service *s;
    _Atomic int runs;
    _Atomic int cancel_result; /* of tw_cancel on itself */
    _Atomic int stop_result;
    _Atomic int wait_result;
    tw_id other; /* cancelled from the task */
    _Atomic int other_result;
    int cancel_on_run; /* periodic: cancel itself on this run */
};

static void self_task(tw_id id, void *arg)
{
    struct self *x = arg;
    int k = atomic_fetch_add(&x->runs, 1) + 1;
    atomic_store(&x->stop_result, tw_service_stop(x->s, NULL, NULL));
    atomic_store(&x->wait_result, tw_cancel_wait(x->s, id));
    if (x->other != 0)
        atomic_store(&x->other_result, tw_cancel(x->s, x->other));
    if (x->cancel_on_run == 0 || k == x->cancel_on_run)
        atomic_store(&x->cancel_result, tw_cancel(x->s, id) ? 1 : 2);
}

static void test_calls_from_task(void)
{
    for (int exec = 0; exec < 2; exec++) {
        tw_service_config cfg = {.executor_threads = exec ? 2u : 0u};
        tw_service *s = vclock_service(&cfg);
        struct rec victim = {0};
        static struct self one, per;
        memset(&one, 0, sizeof(one));
        memset(&per, 0, sizeof(per));
        one.s = per.s = s;
        ASSERT_EQ(tw_schedule(s, rec_task, &victim, 10 * MS, &one.other), 0);
        ASSERT_EQ(tw_schedule(s, self_task, &one, MS, NULL), 0);
        per.cancel_on_run = 3;
        ASSERT_EQ(tw_schedule_fixed_rate(s, self_task, &per, MS, MS, NULL), 0);
        vset(s, MS);
        ASSERT_EQ(atomic_load(&one.runs), 1);
        ASSERT_EQ(atomic_load(&one.stop_result), TW_EDEADLK);
        ASSERT_EQ(atomic_load(&one.wait_result), TW_EDEADLK);
        ASSERT_EQ(atomic_load(&one.cancel_result), 2); /* one-shot: false */
        ASSERT_EQ(atomic_load(&one.other_result), 1);  /* other: true */
        for (uint64_t t = 2; t <= 8; t++)
            vset(s, t * MS);
        ASSERT_EQ(atomic_load(&per.runs), 3);
        ASSERT_EQ(atomic_load(&per.cancel_result), 1);
        ASSERT_EQ(atomic_load(&victim.runs), 0);
        vset(s, 12 * MS);
        ASSERT_EQ(atomic_load(&victim.runs), 0);
        ASSERT_EQ(tw_service_pending(s), 0);
        tw_service_stats st;
        tw_service_get_stats(s, &st);
        ASSERT_EQ(st.cancelled, 2);
        ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
        tw_service_destroy(s);
    }
}

/* tw_service_destroy() and tw_service_stop() from the service's own
 * threads: a task on the timer thread and on an executor, a caller-supplied
 * executor's callback (the timer thread) and stop's unprocessed callback.
 * Each returns TW_EDEADLK and the service goes on as if it had not been
 * called. Without the check, destroy frees the service under the thread
 * that called it (and stop would wait for itself), so this runs in a child
 * that an alarm ends after 30 s (a hang fails the test, it does not stall
 * it); the parent asserts that the child exited with 0. */
struct selfkill {
    tw_service *s;
    _Atomic int destroy_rc, stop_rc, calls;
};

static void selfkill_task(tw_id id, void *arg)
{
    (void)id;
    struct selfkill *k = arg;
    atomic_store(&k->destroy_rc, tw_service_destroy(k->s));
    atomic_store(&k->stop_rc, tw_service_stop(k->s, NULL, NULL));
    atomic_fetch_add(&k->calls, 1);
}

static void selfkill_execute(tw_service *s, tw_id job, void *ctx)
{
    struct selfkill *k = ctx;
    atomic_store(&k->destroy_rc, tw_service_destroy(s));
    atomic_store(&k->stop_rc, tw_service_stop(s, NULL, NULL));
    atomic_fetch_add(&k->calls, 1);
    tw_service_run(s, job);
}

static void selfkill_unprocessed(tw_id id, tw_task_fn fn, void *arg, void *ctx)
{
    (void)id;
    (void)fn;
    (void)arg;
    struct selfkill *k = ctx;
    atomic_store(&k->destroy_rc, tw_service_destroy(k->s));
    atomic_fetch_add(&k->calls, 1);
}

static void destroy_from_own_threads(void)
{
    /* 0: a task on the timer thread; 1: on the executor pool; 2: the
     * callback of a caller-supplied executor. */
    for (int mode = 0; mode < 3; mode++) {
        static struct selfkill k;
        memset(&k, 0, sizeof(k));
        atomic_store(&k.destroy_rc, 1);
        atomic_store(&k.stop_rc, 1);
        tw_service_config cfg = {.executor_threads = mode == 1 ? 2u : 0u};
        if (mode == 2) {
            cfg.execute = selfkill_execute;
            cfg.execute_ctx = &k;
        }
        tw_service *s = vclock_service(&cfg);
        k.s = s;
        struct rec after = {0};
        struct rec later = {0};
        ASSERT_EQ(
            tw_schedule(s, mode == 2 ? nop_task : selfkill_task, &k, MS, NULL),
            0);
        ASSERT_EQ(tw_schedule(s, rec_task, &later, 5 * MS, NULL), 0);
        vset(s, MS);
        WAIT_FOR(atomic_load(&k.calls) >= 1, 30);
        ASSERT_EQ(atomic_load(&k.destroy_rc), TW_EDEADLK);
        ASSERT_EQ(atomic_load(&k.stop_rc), TW_EDEADLK);
        /* Nothing was done: the service schedules, runs and stops. */
        ASSERT_EQ(tw_schedule(s, rec_task, &after, MS, NULL), 0);
        vset(s, 2 * MS);
        WAIT_FOR(atomic_load(&after.runs) == 1, 30);
        ASSERT_EQ(tw_service_pending(s), 1);
        ASSERT_EQ(tw_service_stop(s, NULL, NULL), 1); /* @later */
        ASSERT_EQ(atomic_load(&later.runs), 0);
        ASSERT_EQ(tw_service_destroy(s), 0);
    }
    /* From stop's unprocessed callback: every task is still handed back
     * once, and the service is freed by the destroy after stop. */
    static struct selfkill k;
    memset(&k, 0, sizeof(k));
    atomic_store(&k.destroy_rc, 1);
    tw_service *s = vclock_service(NULL);
    k.s = s;
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(tw_schedule(s, nop_task, NULL, SEC, NULL), 0);
    ASSERT_EQ(tw_service_stop(s, selfkill_unprocessed, &k), 3);
    ASSERT_EQ(atomic_load(&k.calls), 3);
    ASSERT_EQ(atomic_load(&k.destroy_rc), TW_EDEADLK);
    ASSERT_EQ(tw_service_destroy(s), 0);
}

static void test_destroy_from_own_threads(void)
{
    fflush(NULL);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        signal(SIGALRM, SIG_DFL);
        alarm(30);
        destroy_from_own_threads();
        _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT(WIFEXITED(status));
    ASSERT_EQ(WEXITSTATUS(status), 0);
}

/* tw_cancel_wait: returns only when the task is not running. */
struct blocker {
    _Atomic int started;
    _Atomic int finished;
    _Atomic int runs;
    uint64_t hold_ns;
};

static void blocker_task(tw_id id, void *arg)
{
    (void)id;
    struct blocker *b = arg;
    atomic_fetch_add(&b->runs, 1);
    atomic_store(&b->started, 1);
    sleep_ns(b->hold_ns);
    atomic_store(&b->finished, 1);
}

static void test_cancel_wait(void)
{
    tw_service_config cfg = {.executor_threads = 2};
    tw_service *s = vclock_service(&cfg);
    static struct blocker b1, b2;
    b1.hold_ns = b2.hold_ns = 50 * MS;
    tw_id a, p;
    ASSERT_EQ(tw_schedule(s, blocker_task, &b1, MS, &a), 0);
    ASSERT_EQ(tw_schedule_fixed_rate(s, blocker_task, &b2, MS, MS, &p), 0);
    atomic_store(&vnow, VBASE + 2 * MS);
    tw__service_kick(s);
    WAIT_FOR(atomic_load(&b1.started) && atomic_load(&b2.started), 30);
    /* One-shot and running: cannot be cancelled, but we wait for it. */
    ASSERT_EQ(tw_cancel_wait(s, a), 0);
    ASSERT_EQ(atomic_load(&b1.finished), 1);
    /* Periodic and running: cancelled; no run after we return. */
    ASSERT_EQ(tw_cancel_wait(s, p), 1);
    ASSERT_EQ(atomic_load(&b2.finished), 1);
    int runs = atomic_load(&b2.runs);
    for (uint64_t t = 3; t < 10; t++)
        vset(s, t * MS);
    ASSERT_EQ(atomic_load(&b2.runs), runs);
    ASSERT_EQ(tw_service_pending(s), 0);
    ASSERT_EQ(tw_cancel_wait(s, p), 0);
    tw_service_destroy(s);
}

/* Cancelling releases the record within a tick even when the timer thread
 * sleeps for an hour: the cancel wakes it. */
static void test_cancel_releases_memory(void)
{
    tw_service *s = vclock_service(NULL);
    tw_id a;
    ASSERT_EQ(tw_schedule(s, nop_task, NULL, 3600 * SEC, &a), 0);
    tw__service_sync(s);
    tw__service_sync(s); /* now asleep until far ahead */
    ASSERT(tw_cancel(s, a));
    tw_service_stats st;
    /* No clock movement: only the cancel's wake-up can release it. */
    WAIT_FOR((tw_service_get_stats(s, &st), st.cancelled == 1), 30);
    tw_id b; /* the shared path, which takes from the free list */
    ASSERT_EQ(tw_schedule_window(s, nop_task, NULL, 3600 * SEC, 3600 * SEC, &b),
              0);
    ASSERT_EQ((uint32_t)b, (uint32_t)a); /* the record was reused */
    /* Cancelled while still in the submission queue, thread asleep. */
    tw_id c;
    ASSERT_EQ(tw_schedule(s, nop_task, NULL, 7200 * SEC, &c), 0);
    ASSERT(tw_cancel(s, c));
    WAIT_FOR((tw_service_get_stats(s, &st), st.cancelled == 2), 30);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* Tickless. */

static void test_tickless(void)
{
    tw_service_config cfg = {.tick_ns = MS};
    tw_service *s;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    ASSERT_EQ(tw_service_start(s), 0);
    tw_service_stats st;
    sleep_ns(300 * MS); /* 300 ticks */
    tw_service_get_stats(s, &st);
    ASSERT_EQ(st.wakeups, 0);
    /* One task an hour away: the schedule wakes it, it polls once more a
     * tick later, then sleeps until the wheel's next level boundary. */
    ASSERT_EQ(tw_schedule(s, nop_task, NULL, 3600 * SEC, NULL), 0);
    sleep_ns(300 * MS);
    tw_service_get_stats(s, &st);
    ASSERT_GE(st.wakeups, 1);
    ASSERT_LE(st.wakeups, 4);
    uint64_t w = st.wakeups;
    /* A spurious wake-up runs nothing and is counted (once the thread
     * gets a CPU: kick again every 10 ms for up to 30 s). */
    for (int i = 0; i < 3000 && st.wakeups == w; i++) {
        tw__service_kick(s);
        sleep_ns(10 * MS);
        tw_service_get_stats(s, &st);
    }
    ASSERT_GE(st.wakeups, w + 1);
    ASSERT_EQ(st.ran, 0);
    ASSERT_EQ(tw_service_pending(s), 1);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 1);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* Executors. */

struct timed {
    uint64_t scheduled; /* real ns */
    uint64_t delay;
    _Atomic uint64_t ran_at;
};

static void timed_task(tw_id id, void *arg)
{
    (void)id;
    struct timed *t = arg;
    atomic_store(&t->ran_at, mono_now());
}

/* A task that blocks for a second delays no other task by more than a
 * tick. Bound asserted: every other task runs at most 250 ms (500 ms on
 * the retry) late; queued behind the blocked task, the first of them
 * would be ~980 ms late. */
static bool slow_task_round(uint64_t slack)
{
    tw_service_config cfg = {.executor_threads = 2, .tick_ns = MS};
    tw_service *s;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    struct blocker b = {.hold_ns = SEC};
    enum { N = 20 };
    struct timed t[N];
    ASSERT_EQ(tw_schedule(s, blocker_task, &b, MS, NULL), 0);
    for (int i = 0; i < N; i++) {
        t[i].delay = (uint64_t)(i + 1) * 20 * MS;
        atomic_store(&t[i].ran_at, 0);
        t[i].scheduled = mono_now();
        ASSERT_EQ(tw_schedule(s, timed_task, &t[i], t[i].delay, NULL), 0);
    }
    WAIT_FOR(atomic_load(&t[N - 1].ran_at) != 0, 60);
    bool ok = true;
    for (int i = 0; i < N; i++) {
        uint64_t at = atomic_load(&t[i].ran_at);
        ASSERT_GE(at, t[i].scheduled + t[i].delay); /* never early */
        if (at > t[i].scheduled + t[i].delay + slack)
            ok = false;
    }
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    ASSERT_EQ(atomic_load(&b.finished), 1); /* stop waited for it */
    tw_service_destroy(s);
    return ok;
}

static void test_executor_slow_task(void)
{
    if (!slow_task_round(250 * MS))
        ASSERT(slow_task_round(500 * MS));
}

/* A caller-supplied executor: jobs go to a thread of ours. */
struct myexec {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    tw_id jobs[256];
    int head, tail;
    bool quit;
    tw_service *s;
    _Atomic int executed;
    pthread_t thread;
};

static void my_execute(tw_service *s, tw_id job, void *ctx)
{
    struct myexec *e = ctx;
    pthread_mutex_lock(&e->mu);
    e->s = s;
    e->jobs[e->tail++ % 256] = job;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static void *my_exec_main(void *p)
{
    struct myexec *e = p;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        while (e->head == e->tail && !e->quit)
            pthread_cond_wait(&e->cv, &e->mu);
        if (e->head == e->tail)
            break;
        tw_id job = e->jobs[e->head++ % 256];
        tw_service *s = e->s; /* my_execute() stores it again, locked */
        pthread_mutex_unlock(&e->mu);
        atomic_fetch_add(&e->executed, 1);
        tw_service_run(s, job);
        pthread_mutex_lock(&e->mu);
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

struct onthread {
    pthread_t expect;
    _Atomic int runs, wrong;
};

static void thread_check_task(tw_id id, void *arg)
{
    (void)id;
    struct onthread *o = arg;
    if (!pthread_equal(pthread_self(), o->expect))
        atomic_fetch_add(&o->wrong, 1);
    atomic_fetch_add(&o->runs, 1);
}

static void test_custom_executor(void)
{
    static struct myexec e;
    memset(&e, 0, sizeof(e));
    pthread_mutex_init(&e.mu, NULL);
    pthread_cond_init(&e.cv, NULL);
    ASSERT_EQ(pthread_create(&e.thread, NULL, my_exec_main, &e), 0);
    tw_service_config cfg = {.execute = my_execute, .execute_ctx = &e};
    tw_service *s = vclock_service(&cfg);
    struct onthread o = {.expect = e.thread};
    tw_id c, p;
    for (int i = 0; i < 10; i++)
        ASSERT_EQ(tw_schedule(s, thread_check_task, &o, MS, NULL), 0);
    ASSERT_EQ(tw_schedule(s, thread_check_task, &o, MS, &c), 0);
    ASSERT(tw_cancel(s, c));
    ASSERT_EQ(tw_schedule_fixed_delay(s, thread_check_task, &o, MS, MS, &p), 0);
    vset(s, MS);
    WAIT_FOR(atomic_load(&o.runs) == 11, 30);
    vset(s, 3 * MS);
    WAIT_FOR(atomic_load(&o.runs) == 12, 30);
    ASSERT_EQ(atomic_load(&o.wrong), 0);
    ASSERT_EQ(atomic_load(&e.executed), 12);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 1);
    tw_service_destroy(s);
    pthread_mutex_lock(&e.mu);
    e.quit = true;
    pthread_cond_signal(&e.cv);
    pthread_mutex_unlock(&e.mu);
    pthread_join(e.thread, NULL);
    pthread_cond_destroy(&e.cv);
    pthread_mutex_destroy(&e.mu);
}

/* ------------------------------------------------------------------------ */
/* Netty HashedWheelTimerTest semantics (real time). */

/* A task that re-arms itself on a 32-slot wheel, 5 times, each 40 ticks
 * (more than a revolution) ahead. Bound: each run >= its delay after
 * its schedule call. */
struct rearm {
    tw_service *s;
    _Atomic int runs;
    uint64_t scheduled;
    _Atomic int early;
};

static void rearm_task(tw_id id, void *arg)
{
    (void)id;
    struct rearm *r = arg;
    if (mono_now() < r->scheduled + 40 * MS)
        atomic_store(&r->early, 1);
    if (atomic_fetch_add(&r->runs, 1) + 1 < 5) {
        r->scheduled = mono_now();
        ASSERT_EQ(tw_schedule(r->s, rearm_task, r, 40 * MS, NULL), 0);
    }
}

static void test_netty_rearm_32_slots(void)
{
    tw_service_config cfg = {.tick_ns = MS, .ticks_per_wheel = 32, .levels = 1};
    tw_service *s;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    struct rearm r = {.s = s};
    r.scheduled = mono_now();
    ASSERT_EQ(tw_schedule(s, rearm_task, &r, 40 * MS, NULL), 0);
    WAIT_FOR(atomic_load(&r.runs) == 5, 60);
    ASSERT_EQ(atomic_load(&r.early), 0);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

/* 100,000 tasks of 125 ms on a 200 ms tick all run within [125, 650) ms
 * of their schedule call; on failure once more with every duration
 * doubled. The lower bound is absolute. Under valgrind 10,000: there each
 * clock read is a system call (every run reads the clock for the
 * lateness histogram), and 100,000 runs in one round outlast the bound. */
enum { NETTY_N = 100000 };
static uint64_t netty_sched[NETTY_N];
static _Atomic uint64_t netty_ran[NETTY_N];

static void netty_task(tw_id id, void *arg)
{
    (void)id;
    atomic_store(&netty_ran[(uintptr_t)arg], mono_now());
}

static bool netty_round(uint64_t scale)
{
    tw_service_config cfg = {.tick_ns = 200 * MS * scale};
    tw_service *s;
    uintptr_t n = under_valgrind() ? NETTY_N / 10 : NETTY_N;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    for (uintptr_t i = 0; i < n; i++) {
        atomic_store(&netty_ran[i], 0);
        netty_sched[i] = mono_now();
        ASSERT_EQ(tw_schedule(s, netty_task, (void *)i, 125 * MS * scale, NULL),
                  0);
    }
    WAIT_FOR(tw_service_pending(s) == 0, 120);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    bool ok = true;
    for (uintptr_t i = 0; i < n; i++) {
        uint64_t d = atomic_load(&netty_ran[i]) - netty_sched[i];
        ASSERT_GE(d, 125 * MS * scale);
        if (d >= 650 * MS * scale)
            ok = false;
    }
    tw_service_destroy(s);
    return ok;
}

static void test_netty_100k_on_time(void)
{
    if (!netty_round(1))
        ASSERT(netty_round(2));
}

/* ------------------------------------------------------------------------ */

static void test_node_size(void)
{
    if (sizeof(void *) == 8)
        ASSERT_EQ(tw__service_node_size(), 40); /* a wheel timer, no more */
}

int main(void)
{
    RUN_TEST(test_node_size);
    RUN_TEST(test_create_bad_input);
    RUN_TEST(test_schedule_bad_input);
    RUN_TEST(test_max_callbacks);
    RUN_TEST(test_deadline_boundary);
    RUN_TEST(test_not_early_within_a_tick);
    RUN_TEST(test_never);
    RUN_TEST(test_fixed_rate_and_delay);
    RUN_TEST(test_max_pending);
    RUN_TEST(test_pending_counts);
    RUN_TEST(test_stop);
    RUN_TEST(test_ids);
    RUN_TEST(test_calls_from_task);
    RUN_TEST(test_destroy_from_own_threads);
    RUN_TEST(test_cancel_wait);
    RUN_TEST(test_cancel_releases_memory);
    RUN_TEST(test_tickless);
    RUN_TEST(test_executor_slow_task);
    RUN_TEST(test_custom_executor);
    RUN_TEST(test_netty_rearm_32_slots);
    RUN_TEST(test_netty_100k_on_time);
    return tw_test_done();
}
