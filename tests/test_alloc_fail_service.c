/* SPDX-License-Identifier: MIT */
/*
 * tests/test_alloc_fail_service.c - allocation failures in the service.
 *
 * tw_service_create() and a script of service calls (one-shot, fixed-rate
 * and fixed-delay schedules, enough one-shot tasks to grow the record pool
 * by a second chunk, cancels) run once per allocation k the script makes,
 * with allocation k failing (once, or from k on). Every call that meets a
 * failure must return TW_ENOMEM with nothing changed: the pending count, the
 * caller's id, the counters of tasks; and once memory is back the same call
 * must work. At the end every task must have run or be handed back exactly
 * as in a run without failures, and nothing may leak.
 *
 * tw_repeated_create() and a RepeatedTimer start that meets no memory are
 * swept the same way.
 *
 * The services run on a virtual clock (tw_service_config.clock) so that the
 * script is deterministic: tasks run only when the test moves the clock.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdatomic.h>
#include <stdbool.h>

#include "fixture.h"
#include "service_internal.h"
#include "test.h"
#include "test_alloc_fail.h"
#include "twheel/repeated.h"
#include "twheel/service.h"

#define BULK 4200 /* one-shot tasks: more than one chunk of records */

static long points; /* failure points swept */

/* A service on the virtual clock at 1000 s, started if @start. */
static tw_service *vservice(uint32_t executors, bool start)
{
    tw_service_config cfg = {0};
    cfg.clock = vclock;
    cfg.executor_threads = executors;
    atomic_store(&vnow, 1000 * SEC);
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    if (start)
        ASSERT_EQ(tw_service_start(s), 0);
    return s;
}

struct counts {
    _Atomic long runs, handed;
};

static void count_task(tw_id id, void *arg)
{
    (void)id;
    atomic_fetch_add(&((struct counts *)arg)->runs, 1);
}

static void count_unprocessed(tw_id id, tw_task_fn fn, void *arg, void *ctx)
{
    (void)id;
    (void)ctx;
    ASSERT(fn == count_task);
    atomic_fetch_add(&((struct counts *)arg)->handed, 1);
}

static void other_task(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
}

/* ------------------------------------------------------------------------ */
/* tw_service_create */

static int make_service(void **obj, void *cfg)
{
    return tw_service_create((tw_service **)obj, cfg);
}

static void destroy_service(void *s)
{
    tw_service_destroy(s);
}

static void sweep_create(const tw_service_config *cfg, bool sticky)
{
    points +=
        tw_af_sweep(make_service, NULL, destroy_service, (void *)cfg, sticky);
}

static void test_create(void)
{
    tw_service_config cfgs[4] = {{0}};
    cfgs[1].executor_threads = 3;
    cfgs[2].ticks_per_wheel = 64;
    cfgs[2].levels = 1;
    cfgs[2].max_callbacks = 1u << 20;
    cfgs[3].tick_ns = 1000;
    cfgs[3].ticks_per_wheel = 1u << 16;
    for (int i = 0; i < 4; i++) {
        sweep_create(&cfgs[i], false);
        sweep_create(&cfgs[i], true);
    }
    sweep_create(NULL, false);
}

/* ------------------------------------------------------------------------ */
/* The schedule script. */

enum { ONE_SHOT, FIXED_RATE, FIXED_DELAY };

struct script {
    tw_service *s;
    struct counts c;
    tw_id ids[8];
    long enomem; /* calls that failed */
};

/*
 * Make one schedule call as the script says; on TW_ENOMEM check that nothing
 * changed, then repeat it with memory back. Returns the id.
 */
static tw_id call(struct script *sc, int kind, uint64_t delay, uint64_t period)
{
    tw_service_stats before, after;
    tw_service_get_stats(sc->s, &before);
    long failures0 = tw_af_failures();
    tw_id id = 42;
    int rc;
    for (int attempt = 0;; attempt++) {
        switch (kind) {
        case ONE_SHOT:
            rc = tw_schedule(sc->s, count_task, &sc->c, delay, &id);
            break;
        case FIXED_RATE:
            rc = tw_schedule_fixed_rate(sc->s, count_task, &sc->c, delay,
                                        period, &id);
            break;
        default:
            rc = tw_schedule_fixed_delay(sc->s, count_task, &sc->c, delay,
                                         period, &id);
            break;
        }
        if (rc == 0)
            break;
        /* Only an injected failure may make the call fail. */
        ASSERT_EQ(rc, TW_ENOMEM);
        ASSERT_GT(tw_af_failures(), failures0);
        ASSERT_EQ(attempt, 0);
        ASSERT_EQ(id, 42);
        tw_service_get_stats(sc->s, &after);
        ASSERT_EQ(after.pending, before.pending);
        ASSERT_EQ(after.ran, before.ran);
        ASSERT_EQ(after.cancelled, before.cancelled);
        ASSERT_EQ(tw_service_pending(sc->s), before.pending);
        sc->enomem++;
        tw_af_disarm(); /* memory is back: the same call must work */
    }
    ASSERT_NE(id, 42);
    ASSERT_NE(id, 0);
    ASSERT_EQ(tw_service_pending(sc->s), before.pending + 1);
    return id;
}

/* Move the virtual clock forward by @ns and wait for a timer round. */
static void vadvance(tw_service *s, uint64_t ns)
{
    atomic_fetch_add(&vnow, ns);
    tw__service_sync(s);
}

/*
 * Run the script with allocation @k failing (k < 0: none). Returns how many
 * allocation calls it made while armed.
 */
static long run_script(long k, bool sticky, uint32_t executors)
{
    long live0 = tw_af_live();
    struct script sc = {0};
    sc.s = vservice(executors, true);

    tw_af_arm(k, sticky);
    sc.ids[0] = call(&sc, ONE_SHOT, 5 * MS, 0);
    sc.ids[1] = call(&sc, FIXED_RATE, 1 * MS, 10 * MS);
    sc.ids[2] = call(&sc, FIXED_DELAY, 2 * MS, 10 * MS);
    sc.ids[3] = call(&sc, ONE_SHOT, UINT64_MAX, 0); /* never */
    for (int i = 0; i < BULK; i++)
        call(&sc, ONE_SHOT, 1 * MS + (uint64_t)i % 7 * MS, 0);
    sc.ids[4] = call(&sc, FIXED_RATE, 3 * MS, 20 * MS);
    ASSERT(tw_cancel(sc.s, sc.ids[4]));
    sc.ids[5] = call(&sc, ONE_SHOT, 50 * MS, 0);
    long calls = tw_af_calls();
    tw_af_disarm();

    /* Everything accepted behaves as in a run without failures. */
    ASSERT_EQ(tw_service_pending(sc.s), 4 + BULK + 1);
    ASSERT(tw_cancel(sc.s, sc.ids[5]));
    vadvance(sc.s, 9 * MS);
    ASSERT_EQ(atomic_load(&sc.c.runs), BULK + 1 + 2); /* + 2 periodic */
    ASSERT_EQ(tw_service_pending(sc.s), 3);
    /* Still works after the failures. */
    tw_id extra = call(&sc, ONE_SHOT, 1 * MS, 0);
    ASSERT_NE(extra, 0);
    vadvance(sc.s, 1 * MS); /* 10 ms: before the periodic tasks' next run */
    ASSERT_EQ(atomic_load(&sc.c.runs), BULK + 1 + 2 + 1);
    ASSERT_EQ(tw_schedule(sc.s, other_task, NULL, 1 * MS, NULL), 0);
    vadvance(sc.s, 2 * MS);
    /* Stop hands back the two periodic tasks and the "never" one. */
    ASSERT_EQ(tw_service_stop(sc.s, count_unprocessed, NULL), 3);
    ASSERT_EQ(tw_service_pending(sc.s), 0);
    tw_service_stats st;
    tw_service_get_stats(sc.s, &st);
    ASSERT_EQ(st.cancelled, 2);
    ASSERT_EQ(st.handed_back, 3);
    tw_service_destroy(sc.s);
    ASSERT_EQ(tw_af_live(), live0);
    points += sc.enomem;
    return calls;
}

static void sweep_script(bool sticky, uint32_t executors)
{
    long total = run_script(-1, false, executors);
    ASSERT_GT(total, 0);
    for (long k = 0; k < total; k++)
        run_script(k, sticky, executors);
    printf("script (%s, %u executors): %ld allocations, each failed in "
           "turn\n",
           sticky ? "sticky" : "once", executors, total);
}

static void test_schedule_script(void)
{
    sweep_script(false, 0);
    sweep_script(true, 0);
    sweep_script(false, 2);
}

/* ------------------------------------------------------------------------ */
/* RepeatedTimer: its create, and a start whose schedule meets no memory. */

static void on_trigger(tw_repeated *rt, void *arg)
{
    (void)rt;
    atomic_fetch_add(&((struct counts *)arg)->runs, 1);
}

struct rt_make {
    tw_service *s;
    const tw_repeated_config *cfg;
};

static int make_repeated(void **obj, void *ctx)
{
    struct rt_make *m = ctx;
    return tw_repeated_create((tw_repeated **)obj, m->s, m->cfg);
}

static void destroy_repeated(void *rt)
{
    tw_repeated_destroy(rt);
}

static void test_repeated(void)
{
    long live0 = tw_af_live();
    struct counts c = {0};
    tw_service *s = vservice(0, true);
    tw_repeated_config cfg = {0};
    cfg.name = "election";
    cfg.timeout_ns = 5 * MS;
    cfg.on_trigger = on_trigger;
    cfg.arg = &c;
    struct rt_make m = {s, &cfg};
    points += tw_af_sweep(make_repeated, NULL, destroy_repeated, &m, false);
    tw_repeated *rt = NULL;
    ASSERT_EQ(tw_repeated_create(&rt, s, &cfg), 0);
    /* The service's record pool is still empty: the first schedule needs
     * memory. */
    tw_af_arm(0, true);
    ASSERT_EQ(tw_repeated_start(rt), TW_ENOMEM);
    ASSERT_GT(tw_af_failures(), 0);
    tw_af_disarm();
    points++;
    ASSERT_EQ(tw_service_pending(s), 0);
    vadvance(s, 10 * MS);
    ASSERT_EQ(atomic_load(&c.runs), 0); /* the failed start did nothing */
    ASSERT_EQ(tw_repeated_start(rt), 0);
    vadvance(s, 5 * MS);
    ASSERT_EQ(atomic_load(&c.runs), 1);
    tw_repeated_destroy(rt);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
    ASSERT_EQ(tw_af_live(), live0);
}

/* ------------------------------------------------------------------------ */
/* Thread creation fails: start (explicit, or by the first schedule) returns
 * TW_EAGAIN with nothing left running, and a later start works. */

static void test_thread_create_fails(void)
{
    for (uint32_t execs = 0; execs <= 3; execs += 3) {
        for (long k = 0; k <= (long)execs; k++) {
            long live0 = tw_af_live();
            struct counts c = {0};
            tw_service *s = vservice(execs, false);
            tw_id id = 42;
            tw_af_arm_threads(k);
            if (k % 2 == 0) {
                ASSERT_EQ(tw_service_start(s), TW_EAGAIN);
            } else {
                ASSERT_EQ(tw_schedule(s, count_task, &c, MS, &id), TW_EAGAIN);
                ASSERT_EQ(id, 42);
            }
            tw_af_arm_threads(-1);
            points++;
            ASSERT_EQ(tw_service_pending(s), 0);
            /* Threads can be made again: the service works. */
            ASSERT_EQ(tw_schedule(s, count_task, &c, MS, &id), 0);
            vadvance(s, MS);
            ASSERT_EQ(atomic_load(&c.runs), 1);
            ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
            tw_service_destroy(s);
            ASSERT_EQ(tw_af_live(), live0);
        }
    }
}

/* ------------------------------------------------------------------------ */
/* The first schedule call starts the service; if it fails for want of
 * memory, no thread is left running: a start after it still creates the
 * threads (so a pthread_create() failure shows), and stop has nothing to
 * join. Each kind of call, with each of its allocations failing. */

static int first_call(tw_service *s, int kind, struct counts *c, tw_id *id)
{
    switch (kind) {
    case ONE_SHOT:
        return tw_schedule(s, count_task, c, MS, id);
    case FIXED_RATE:
        return tw_schedule_fixed_rate(s, count_task, c, MS, MS, id);
    default:
        return tw_schedule_fixed_delay(s, count_task, c, MS, MS, id);
    }
}

static void test_first_call_enomem_starts_nothing(void)
{
    for (uint32_t execs = 0; execs <= 2; execs += 2) {
        for (int kind = ONE_SHOT; kind <= FIXED_DELAY; kind++) {
            for (long k = 0;; k++) {
                long live0 = tw_af_live();
                struct counts c = {0};
                tw_service *s = vservice(execs, false);
                tw_id id = 42;
                tw_af_arm(k, true);
                int rc = first_call(s, kind, &c, &id);
                long failed = tw_af_failures();
                tw_af_disarm();
                if (failed == 0) {
                    ASSERT_EQ(rc, 0);
                    tw_service_destroy(s);
                    ASSERT_EQ(tw_af_live(), live0);
                    break;
                }
                ASSERT_EQ(rc, TW_ENOMEM);
                ASSERT_EQ(id, 42);
                ASSERT_EQ(tw_service_pending(s), 0);
                /* Not started: the start creates threads, and fails. */
                tw_af_arm_threads(0);
                ASSERT_EQ(tw_service_start(s), TW_EAGAIN);
                tw_af_arm_threads(-1);
                ASSERT_EQ(first_call(s, kind, &c, &id), 0);
                vadvance(s, MS);
                ASSERT_EQ(atomic_load(&c.runs), 1);
                tw_service_destroy(s);
                ASSERT_EQ(tw_af_live(), live0);
                points++;
            }
        }
    }
}

int main(void)
{
    RUN_TEST(test_create);
    RUN_TEST(test_schedule_script);
    RUN_TEST(test_repeated);
    RUN_TEST(test_thread_create_fails);
    RUN_TEST(test_first_call_enomem_starts_nothing);
    printf("service: %ld allocation failure points swept\n", points);
    return tw_test_done();
}
