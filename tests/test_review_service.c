/* SPDX-License-Identifier: MIT */
/*
 * tests/test_review_service.c - regression tests for defects found by an
 * adversarial review of src/service.c, and the submission-flood contract.
 *
 * - A failed schedule call changes nothing: neither the function table
 *   nor the record pool.
 * - tw_cancel_wait() racing the end of a run never misses its wake-up.
 * - tw_service_start() from a task never waits for a concurrent stop.
 * - The timer thread drains a flood of submissions from several producers
 *   without starving ticks: a task armed before the flood and a short task
 *   scheduled in the middle of it still run within a generous bound
 *   (FLOOD_BOUND_MS, doubled on each of two retries).
 * - Periodic arithmetic near UINT64_MAX clamps to "never".
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "internal.h"
#include "test.h"
#include "twheel/service.h"
#include "realtime.h"

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TW_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define TW_SANITIZED 1
#endif
#endif
#ifndef TW_SANITIZED
#define TW_SANITIZED 0
#endif

/* Under valgrind (scripts/test.d/valgrind.sh: one core, ~30-50x slower)
 * the timed cases shrink: fewer flood tasks, shorter races. */
static bool under_valgrind(void)
{
    const char *p = getenv("LD_PRELOAD");
    return p != NULL && strstr(p, "vgpreload") != NULL;
}

static _Atomic uint64_t vnow = 1000 * SEC;

static uint64_t vclock(void *ctx)
{
    (void)ctx;
    return atomic_load(&vnow);
}

/* Distinct task functions that do nothing (each takes its own entry in a
 * service's function table). */
#define NOP_TASK(name)                                                         \
    static void name(tw_id id, void *arg)                                      \
    {                                                                          \
        (void)id;                                                              \
        (void)arg;                                                             \
    }
NOP_TASK(nop_a)
NOP_TASK(nop_b)
NOP_TASK(nop_c)

/* ------------------------------------------------------------------------ */
/* A schedule call that fails (max_pending, stopped) must not take an entry
 * of the function table: with max_callbacks = 2, a rejected nop_b would
 * otherwise leave no room for nop_c once nop_a's task is gone. */
static void test_failed_schedule_keeps_fn_table(void)
{
    tw_service_config cfg = {
        .max_callbacks = 2, .max_pending = 1, .clock = vclock};
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    tw_id a, id = 7;
    ASSERT_EQ(tw_schedule(s, nop_a, NULL, SEC, &a), 0);
    ASSERT_EQ(tw_schedule(s, nop_b, NULL, SEC, &id), TW_EAGAIN);
    ASSERT_EQ(tw_schedule_fixed_rate(s, nop_b, NULL, SEC, SEC, &id), TW_EAGAIN);
    ASSERT_EQ(id, 7);
    ASSERT_EQ(tw_service_pending(s), 1);
    ASSERT(tw_cancel(s, a));
    ASSERT_EQ(tw_service_pending(s), 0);
    /* The table holds nop_a only: nop_c fits, and then nop_b does not. */
    ASSERT_EQ(tw_schedule(s, nop_c, NULL, SEC, &id), 0);
    ASSERT(tw_cancel(s, id));
    ASSERT_EQ(tw_schedule(s, nop_b, NULL, SEC, &id), TW_EAGAIN);
    ASSERT_EQ(tw_service_pending(s), 0);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

/* A call rejected at max_pending must not grow the record pool either: with
 * the first chunk (4096 records) full and max_pending = 4096, the rejected
 * call leaves the counters of allocated records and bytes as they were. */
static void test_failed_schedule_keeps_pool(void)
{
    enum { CHUNK = 4096 };
    tw_service_config cfg = {.max_pending = CHUNK, .clock = vclock};
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    for (int i = 0; i < CHUNK; i++)
        ASSERT_EQ(tw_schedule(s, nop_a, NULL, SEC, NULL), 0);
    tw_service_stats before, after;
    tw_service_get_stats(s, &before);
    ASSERT_EQ(before.nodes, CHUNK);
    ASSERT_EQ(tw_schedule(s, nop_a, NULL, SEC, NULL), TW_EAGAIN);
    ASSERT_EQ(tw_schedule_fixed_delay(s, nop_a, NULL, SEC, SEC, NULL),
              TW_EAGAIN);
    tw_service_get_stats(s, &after);
    ASSERT_EQ(after.nodes, before.nodes);
    ASSERT_EQ(after.memory_bytes, before.memory_bytes);
    ASSERT_EQ(after.pending, CHUNK);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), CHUNK);
    ASSERT_EQ(tw_schedule(s, nop_a, NULL, SEC, NULL), TW_ESHUTDOWN);
    tw_service_get_stats(s, &after);
    ASSERT_EQ(after.nodes, before.nodes);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* tw_cancel_wait() on a task that is just finishing: the waiter registers
 * while the runner frees the record and looks for waiters. Each round
 * releases the task and calls tw_cancel_wait() at the same moment; a lost
 * wake-up leaves the waiter blocked, which the watchdog turns into a
 * failure after WAIT_LIMIT_S. Both the timer thread (batched free) and an
 * executor thread run the task. A race: without the fix in
 * notify_waiters() this failed in about one run in six on a loaded 2-core
 * x86 machine (after 42 to 9203 rounds), so a pass proves little alone;
 * it runs for a bounded time (RACE_MS) so it stays cheap in every CI
 * run. */
#define WAIT_LIMIT_S 5
#define RACE_MS 2000

struct race {
    _Atomic int started, go;
};

static void race_task(tw_id id, void *arg)
{
    (void)id;
    struct race *r = arg;
    atomic_store(&r->started, 1);
    while (!atomic_load_explicit(&r->go, memory_order_relaxed)) {
    }
}

static _Atomic uint64_t race_progress;
static _Atomic int race_phase; /* 1 waiting for the start, 2 in cancel_wait */
static _Atomic bool race_done;

static void *race_watchdog(void *arg)
{
    (void)arg;
    uint64_t last = atomic_load(&race_progress), t = mono_now();
    while (!atomic_load(&race_done)) {
        sleep_ns(10 * MS);
        uint64_t p = atomic_load(&race_progress);
        if (p != last) {
            last = p;
            t = mono_now();
        } else if (mono_now() - t > (uint64_t)WAIT_LIMIT_S * SEC) {
            fprintf(stderr, "stuck after %llu rounds in phase %d\n",
                    (unsigned long long)p, atomic_load(&race_phase));
            abort();
        }
    }
    return NULL;
}

static void cancel_wait_race(uint32_t executors, uint64_t max_ns)
{
    /* 10 us ticks: a round does not wait for a 1 ms poll. */
    tw_service_config cfg = {.executor_threads = executors, .tick_ns = 10000};
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    atomic_store(&race_done, false);
    pthread_t wd;
    ASSERT_EQ(pthread_create(&wd, NULL, race_watchdog, NULL), 0);
    uint64_t end = mono_now() + max_ns;
    int i;
    for (i = 0; mono_now() < end; i++) {
        struct race r = {0};
        tw_id id;
        ASSERT_EQ(tw_schedule(s, race_task, &r, 0, &id), 0);
        atomic_store(&race_phase, 1);
        while (!atomic_load(&r.started))
            sched_yield();
        atomic_store(&race_phase, 2);
        atomic_store(&r.go, 1);
        /* A varying head start for the runner sweeps the waiter's arrival
         * across the runner's free-then-notify window. */
        for (volatile int k = 0; k < (i % 16) * 4; k++) {
        }
        ASSERT_EQ(tw_cancel_wait(s, id), 0); /* one-shot: ran, not cancelled */
        atomic_fetch_add(&race_progress, 1);
    }
    atomic_store(&race_done, true);
    pthread_join(wd, NULL);
    fprintf(stderr, "   %u executors: %d rounds\n", executors, i);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

static void test_cancel_wait_end_of_run(void)
{
    /* The timer thread's batched free is the path that lost wake-ups on
     * x86 (a plain store, then the load of the waiter count): most time
     * goes there. */
    uint64_t ms = under_valgrind() ? RACE_MS / 4 : RACE_MS;
    cancel_wait_race(0, ms * MS);
    cancel_wait_race(1, ms / 4 * MS);
}

/* ------------------------------------------------------------------------ */
/* Flood: FLOOD_PRODUCERS threads push far-future tasks as fast as they can.
 * A task armed just before the flood (due in FLOOD_EARLY_MS) and a short
 * task scheduled when about half the flood is in (delay FLOOD_SHORT_MS)
 * must each run at most FLOOD_BOUND_MS late: the timer thread takes at most
 * DRAIN_BATCH submissions per round and then advances the wheel. The bound
 * is generous (a draining pass over the whole flood takes a few tens of ms
 * in a Debug build) and is doubled on each of two retries. Nothing may run
 * early either; stop hands every flood task back. */
#define FLOOD_PRODUCERS 3
#define FLOOD_EARLY_MS 30
#define FLOOD_SHORT_MS 10
#define FLOOD_BOUND_MS 250

struct stamp {
    _Atomic uint64_t at; /* mono time of the run, 0 before */
};

static void stamp_task(tw_id id, void *arg)
{
    (void)id;
    struct stamp *st = arg;
    atomic_store(&st->at, mono_now());
}

struct flood {
    tw_service *s;
    uint32_t per_thread;
    _Atomic uint64_t pushed;
    _Atomic int go;
};

static void *flood_producer(void *arg)
{
    struct flood *f = arg;
    while (!atomic_load(&f->go))
        sched_yield();
    for (uint32_t i = 0; i < f->per_thread; i++) {
        ASSERT_EQ(tw_schedule(f->s, nop_a, NULL, 3600 * SEC + i, NULL), 0);
        atomic_fetch_add_explicit(&f->pushed, 1, memory_order_relaxed);
    }
    return NULL;
}

/* One attempt; returns true if both tasks ran within @bound_ns. */
static bool flood_round(uint32_t flags, uint32_t per_thread, uint64_t bound_ns)
{
    tw_service_config cfg = {.flags = flags};
    struct flood f = {.per_thread = per_thread};
    ASSERT_EQ(tw_service_create(&f.s, &cfg), 0);
    ASSERT_EQ(tw_service_start(f.s), 0);
    struct stamp early = {0}, shrt = {0};
    uint64_t t_early = mono_now();
    ASSERT_EQ(tw_schedule(f.s, stamp_task, &early, FLOOD_EARLY_MS * MS, NULL),
              0);
    pthread_t th[FLOOD_PRODUCERS];
    for (int i = 0; i < FLOOD_PRODUCERS; i++)
        ASSERT_EQ(pthread_create(&th[i], NULL, flood_producer, &f), 0);
    atomic_store(&f.go, 1);
    uint64_t total = (uint64_t)per_thread * FLOOD_PRODUCERS;
    while (atomic_load_explicit(&f.pushed, memory_order_relaxed) < total / 2)
        sched_yield();
    uint64_t t_short = mono_now();
    ASSERT_EQ(tw_schedule(f.s, stamp_task, &shrt, FLOOD_SHORT_MS * MS, NULL),
              0);
    for (int i = 0; i < FLOOD_PRODUCERS; i++)
        pthread_join(th[i], NULL);
    uint64_t limit = mono_now() + 10 * SEC;
    while ((atomic_load(&early.at) == 0 || atomic_load(&shrt.at) == 0) &&
           mono_now() < limit)
        sleep_ns(MS);
    uint64_t e = atomic_load(&early.at), sh = atomic_load(&shrt.at);
    ASSERT(e != 0 && sh != 0);
    /* Never early. */
    ASSERT_GE(e, t_early + FLOOD_EARLY_MS * MS);
    ASSERT_GE(sh, t_short + FLOOD_SHORT_MS * MS);
    uint64_t late_e = e - (t_early + FLOOD_EARLY_MS * MS);
    uint64_t late_s = sh - (t_short + FLOOD_SHORT_MS * MS);
    fprintf(stderr,
            "   flags %u, %llu tasks: early task %.1f ms late, "
            "short task %.1f ms late (bound %llu ms)\n",
            flags, (unsigned long long)total, late_e / 1e6, late_s / 1e6,
            (unsigned long long)(bound_ns / MS));
    ASSERT_EQ(tw_service_pending(f.s), total);
    ASSERT_EQ(tw_service_stop(f.s, NULL, NULL), (int)total);
    ASSERT_EQ(tw_service_pending(f.s), 0);
    tw_service_destroy(f.s);
    return late_e <= bound_ns && late_s <= bound_ns;
}

static void flood(uint32_t flags)
{
    uint32_t per_thread = TW_SANITIZED ? 40000 : 150000;
    if (under_valgrind())
        per_thread = 10000;
    uint64_t bound = FLOOD_BOUND_MS * MS;
    for (int attempt = 0;; attempt++) {
        if (flood_round(flags, per_thread, bound))
            return;
        ASSERT_LT(attempt, 2);
        bound *= 2;
    }
}

static void test_flood_does_not_starve_ticks(void)
{
    flood(0);
    flood(TW_SERVICE_LAZY_CLOCK);
}

/* ------------------------------------------------------------------------ */
/* Periodic arithmetic at the end of the range: a first run at 1 ms, then a
 * next run that does not fit in 64 bits of ns is "never": the task stays
 * pending, never runs again, and is handed back. */
static _Atomic int big_runs;

static void big_task(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
    atomic_fetch_add(&big_runs, 1);
}

static void test_periodic_near_uint64_max(void)
{
    tw_service_config cfg = {.clock = vclock};
    atomic_store(&vnow, 1000 * SEC);
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    ASSERT_EQ(tw_service_start(s), 0);
    atomic_store(&big_runs, 0);
    tw_id r, d;
    ASSERT_EQ(tw_schedule_fixed_rate(s, big_task, NULL, MS, UINT64_MAX, &r), 0);
    ASSERT_EQ(
        tw_schedule_fixed_delay(s, big_task, NULL, MS, UINT64_MAX - 1, &d), 0);
    atomic_store(&vnow, 1000 * SEC + 2 * MS);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&big_runs), 2);
    atomic_store(&vnow, UINT64_MAX - SEC);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&big_runs), 2);
    ASSERT_EQ(tw_service_pending(s), 2);
    ASSERT(tw_cancel(s, r));
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 1);
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

/* Runs every test, or only those named on the command line. */
#define RUN_SELECTED(fn)                                                       \
    do {                                                                       \
        bool any_ = argc < 2;                                                  \
        for (int i_ = 1; i_ < argc; i_++)                                      \
            any_ = any_ || strcmp(argv[i_], #fn) == 0;                         \
        if (any_)                                                              \
            RUN_TEST(fn);                                                      \
    } while (0)

int main(int argc, char **argv)
{
    RUN_SELECTED(test_failed_schedule_keeps_fn_table);
    RUN_SELECTED(test_failed_schedule_keeps_pool);
    RUN_SELECTED(test_periodic_near_uint64_max);
    RUN_SELECTED(test_cancel_wait_end_of_run);
    RUN_SELECTED(test_flood_does_not_starve_ticks);
    RUN_SELECTED(test_start_from_task_during_stop);
    return tw_test_done();
}
