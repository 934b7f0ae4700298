/* SPDX-License-Identifier: MIT */
/*
 * tests/test_service_submit.c - schedule calls: what a failing call leaves
 * behind, a flood of submissions, the deadline arithmetic at the end of
 * the range, and a RepeatedTimer's re-arm at max_pending.
 *
 * - A failed schedule call changes nothing: neither the function table
 *   nor the record pool.
 * - The timer thread drains a flood of submissions from several producers
 *   without starving ticks: a task armed before the flood and a short task
 *   scheduled in the middle of it still run within a generous bound
 *   (FLOOD_BOUND_MS, doubled on each of two retries).
 * - With TW_SERVICE_LAZY_CLOCK, a task pushed onto a submission stack
 *   after the timer thread read the clock for an earlier submission of the
 *   same pass (but before it took that stack) gets its deadline from a
 *   reading taken after its call, not from the earlier one (forced with
 *   tw__service_lazy_hook).
 * - Periodic arithmetic near UINT64_MAX clamps to "never".
 * - tw_repeated_reset() on a service exactly at max_pending succeeds and
 *   moves the run; a reset that fails changes nothing.
 * - A call that fails (max_callbacks) never moves the pending count, while
 *   another thread floods such calls (a stress complement to the forced
 *   case in test_service_held_alloc).
 * - A replacing schedule at max_pending whose old task has just started
 *   (RUNNING, its slot not yet released) succeeds.
 *
 * The services run on a virtual clock (tw_service_config.clock) except in
 * the flood, which measures real lateness.
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
#include "twheel/repeated.h"
#include "twheel/service.h"

/* Move the virtual clock by @ns and wait for a timer round. */
static void vadvance(tw_service *s, uint64_t ns)
{
    atomic_fetch_add(&vnow, ns);
    tw__service_sync(s);
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
/* Lazy clock: the reading a lazy task's deadline comes from is never older
 * than the task's schedule call. The timer thread takes each submission
 * stack once per pass and reads the clock for the first lazy task it finds;
 * a call that pushes onto a stack the pass has not taken yet, after that
 * reading, must not get its deadline from it (it would run early by up to
 * the pass's duration: CI saw 6 ms under TSan during a flood).
 *
 * Forced on the virtual clock. While the timer thread is held in
 * tw__service_drained_hook (awake, so calls are lazy), task A is pushed:
 * either on the shared stack (tw__schedule_replace() takes the shared
 * path), which every pass takes first, or on both helper threads' own
 * stacks. When the next pass takes the first A, tw__service_lazy_hook
 * moves the clock on by LZ_STEP and has a helper whose stack the pass has
 * not taken yet push task B (delay LZ_DELAY); then the pass goes on and
 * takes B. B must not run before its call + LZ_DELAY. */
#define LZ_DELAY (10 * MS)
#define LZ_STEP (50 * MS)

/* A helper thread with a producer (a stack) of its own. */
struct lz_helper {
    pthread_t th;
    _Atomic int cmd;    /* 1 push an A, 2 push B, 3 exit; 0 when done */
    _Atomic tw_id a_id; /* its A */
};

static struct {
    tw_service *s;
    struct lz_helper h[2];
    _Atomic int hold;       /* drained hook: 1 hold the next round, 2 held */
    _Atomic tw_id a_shared; /* A on the shared stack */
    _Atomic bool started;   /* the lazy hook has pushed B */
    _Atomic bool in_a_pass; /* from then until the round's drained hook */
    _Atomic tw_id b_id;
    _Atomic uint64_t b_call;    /* vnow at B's call */
    _Atomic uint64_t b_reading; /* its deadline's reading (0: not taken) */
    _Atomic bool b_same_pass;   /* B taken in the first A's pass */
    _Atomic uint64_t b_ran;     /* vnow at B's run (0: not run) */
} lz;

static void vstamp_task(tw_id id, void *arg)
{
    (void)id;
    atomic_store((_Atomic uint64_t *)arg, atomic_load(&vnow));
}

/* Have helper @k do @cmd and wait until it has. */
static void lz_command(int k, int cmd)
{
    atomic_store(&lz.h[k].cmd, cmd);
    while (atomic_load(&lz.h[k].cmd) == cmd)
        sleep_us(20);
}

static void *lz_helper_main(void *arg)
{
    struct lz_helper *h = arg;
    tw_id w;
    ASSERT_EQ(tw_schedule(lz.s, nop_a, NULL, 3600 * SEC, &w), 0);
    ASSERT(tw_cancel(lz.s, w)); /* its producer is taken */
    atomic_store(&h->cmd, 0);
    for (;;) {
        int c = atomic_load(&h->cmd);
        tw_id id;
        if (c == 1) {
            ASSERT_EQ(tw_schedule(lz.s, nop_b, NULL, LZ_DELAY, &id), 0);
            atomic_store(&h->a_id, id);
        } else if (c == 2) {
            atomic_store(&lz.b_call, atomic_load(&vnow));
            ASSERT_EQ(tw_schedule(lz.s, vstamp_task, &lz.b_ran, LZ_DELAY, &id),
                      0);
            atomic_store(&lz.b_id, id);
        } else if (c == 3) {
            return NULL;
        } else {
            sleep_us(20);
            continue;
        }
        atomic_store(&h->cmd, 0);
    }
}

static void lz_drained_hook(tw_service *s)
{
    if (s != lz.s)
        return;
    atomic_store(&lz.in_a_pass, false);
    int one = 1;
    if (atomic_compare_exchange_strong(&lz.hold, &one, 2))
        while (atomic_load(&lz.hold) == 2)
            sleep_us(20);
}

/* On the timer thread, for each lazy task it takes. */
static void lz_lazy_hook(tw_service *s, uint64_t id, uint64_t now)
{
    if (s != lz.s || id == 0)
        return;
    if (id == atomic_load(&lz.b_id)) {
        atomic_store(&lz.b_same_pass, atomic_load(&lz.in_a_pass));
        atomic_store(&lz.b_reading, now);
        return;
    }
    /* The first A of the pass: B goes on a stack not taken yet (not the
     * stack of this A; the other A's, if any, is taken after this one). */
    int k = id == atomic_load(&lz.h[0].a_id) ? 1 : 0;
    if ((id != atomic_load(&lz.a_shared) && id != atomic_load(&lz.h[0].a_id) &&
         id != atomic_load(&lz.h[1].a_id)) ||
        atomic_load(&lz.started))
        return;
    atomic_store(&lz.started, true);
    atomic_fetch_add(&vnow, LZ_STEP);
    atomic_store(&lz.in_a_pass, true);
    lz_command(k, 2);
}

/* One attempt: A on the shared stack (@shared) or on both helpers'. */
static void lz_attempt(bool shared)
{
    tw_service *s = lz.s;
    atomic_store(&lz.a_shared, 0);
    atomic_store(&lz.h[0].a_id, 0);
    atomic_store(&lz.h[1].a_id, 0);
    atomic_store(&lz.started, false);
    atomic_store(&lz.b_id, 0);
    atomic_store(&lz.b_reading, 0);
    atomic_store(&lz.b_same_pass, false);
    atomic_store(&lz.b_ran, 0);
    atomic_store(&lz.hold, 1);
    tw__service_kick(s);
    uint64_t limit = mono_now() + 10 * SEC;
    while (atomic_load(&lz.hold) != 2 && mono_now() < limit)
        sleep_us(20);
    ASSERT_EQ(atomic_load(&lz.hold), 2);
    /* The timer thread is awake and runs no task: the As are lazy. */
    if (shared) {
        tw_id a;
        ASSERT_EQ(tw__schedule_replace(s, nop_b, NULL, LZ_DELAY, 0, NULL, &a),
                  0);
        atomic_store(&lz.a_shared, a);
    } else {
        lz_command(0, 1);
        lz_command(1, 1);
    }
    atomic_store(&lz.hold, 0);
    while (atomic_load(&lz.b_reading) == 0 && mono_now() < limit)
        sleep_us(20);
    ASSERT_NE(atomic_load(&lz.b_reading), 0); /* the As and B were lazy */
    ASSERT(atomic_load(&lz.b_same_pass));     /* the race was exercised */
    uint64_t call = atomic_load(&lz.b_call);
    uint64_t reading = atomic_load(&lz.b_reading) + VCLOCK_START;
    /* The round of the As' pass is over, at the time of B's call, and a
     * round just before B's due time: B has not run. */
    tw__service_sync(s);
    atomic_store(&vnow, call + LZ_DELAY - 1);
    tw__service_sync(s);
    uint64_t ran = atomic_load(&lz.b_ran);
    ASSERT_EQ(ran, 0);
    /* Past its due time (its tick), it has. */
    atomic_store(&vnow, call + LZ_DELAY + MS);
    tw__service_sync(s);
    ran = atomic_load(&lz.b_ran);
    ASSERT_GE(ran, call + LZ_DELAY);
    /* B's deadline came from a reading taken after its call. */
    ASSERT_GE(reading, call);
}

static void test_lazy_reading_not_older_than_call(void)
{
    tw_service_config cfg = {.flags = TW_SERVICE_LAZY_CLOCK, .clock = vclock};
    atomic_store(&vnow, VCLOCK_START);
    ASSERT_EQ(tw_service_create(&lz.s, &cfg), 0);
    /* The hooks are in place before the timer thread starts, and stay
     * until it is joined. */
    tw__service_drained_hook = lz_drained_hook;
    tw__service_lazy_hook = lz_lazy_hook;
    ASSERT_EQ(tw_service_start(lz.s), 0);
    for (int k = 0; k < 2; k++) {
        atomic_store(&lz.h[k].cmd, -1);
        ASSERT_EQ(pthread_create(&lz.h[k].th, NULL, lz_helper_main, &lz.h[k]),
                  0);
        while (atomic_load(&lz.h[k].cmd) != 0)
            sleep_us(20);
    }
    lz_attempt(true);
    lz_attempt(false);
    for (int k = 0; k < 2; k++) {
        atomic_store(&lz.h[k].cmd, 3);
        pthread_join(lz.h[k].th, NULL);
    }
    ASSERT_EQ(tw_service_stop(lz.s, NULL, NULL), 0);
    tw__service_drained_hook = NULL;
    tw__service_lazy_hook = NULL;
    tw_service_destroy(lz.s);
    lz.s = NULL;
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
/* RepeatedTimer reset at max_pending. */

static void count_run(tw_id id, void *arg)
{
    (void)id;
    atomic_fetch_add((_Atomic int *)arg, 1);
}

static void on_trigger(tw_repeated *rt, void *arg)
{
    (void)rt;
    atomic_fetch_add((_Atomic int *)arg, 1);
}

static void test_repeated_reset_at_max(void)
{
    tw_service_config cfg = {0};
    cfg.max_pending = 1;
    tw_service *s = vclock_service(&cfg);
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
    _Atomic int other_runs = 0;
    ASSERT_EQ(tw_schedule(s, count_run, &other_runs, 1000 * SEC, &other), 0);
    ASSERT_EQ(tw_repeated_reset(rt, 30 * MS), 0);
    ASSERT_EQ(tw_repeated_restart(rt), TW_EAGAIN);
    ASSERT_EQ(tw_service_pending(s), 1);
    vadvance(s, 100 * MS);
    ASSERT_EQ(atomic_load(&runs), 1);
    tw_repeated_destroy(rt);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 1);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* A call that fails holds no pending slot, not even for a moment. */

NOP_TASK(noop)
NOP_TASK(other_fn)

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
    tw_service *s = vclock_service(&cfg);
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
    rp.rc = tw__schedule_replace(s, runs_task, rp.r, 10 * MS, rp.old,
                                 &rp.cancelled, &rp.nid);
}

static void test_replace_running_at_max(void)
{
    tw_service_config cfg = {0};
    cfg.max_pending = 1;
    tw_service *s = vclock_service(&cfg);
    struct runs a = {0}, b = {0};
    rp.r = &b;
    rp.rc = -1;
    ASSERT_EQ(tw__schedule_replace(s, runs_task, &a, MS, 0, NULL, &rp.old), 0);
    ASSERT_EQ(tw_service_pending(s), 1);
    tw__service_started_hook = replace_from_hook;
    atomic_store(&vnow, VCLOCK_START + MS);
    tw__service_sync(s);
    tw__service_started_hook = NULL;
    ASSERT_EQ(atomic_load(&rp.calls), 1);
    ASSERT_EQ(atomic_load(&a.n), 1);
    ASSERT_EQ(rp.rc, 0); /* before the fix: TW_EAGAIN */
    ASSERT(!rp.cancelled);
    ASSERT_EQ(tw_service_pending(s), 1); /* the new task's slot */
    atomic_store(&vnow, VCLOCK_START + 11 * MS);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&b.n), 1);
    ASSERT_EQ(tw_service_pending(s), 0);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

int main(int argc, char **argv)
{
    RUN_SELECTED(test_failed_schedule_keeps_fn_table);
    RUN_SELECTED(test_failed_schedule_keeps_pool);
    RUN_SELECTED(test_periodic_near_uint64_max);
    RUN_SELECTED(test_flood_does_not_starve_ticks);
    RUN_SELECTED(test_lazy_reading_not_older_than_call);
    RUN_SELECTED(test_repeated_reset_at_max);
    RUN_SELECTED(test_failed_call_holds_no_slot);
    RUN_SELECTED(test_replace_running_at_max);
    return tw_test_done();
}
