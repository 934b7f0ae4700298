/* SPDX-License-Identifier: MIT */
/*
 * tests/test_service_cancel.c - cancels at the edges of a task's life.
 *
 * - tw_cancel_wait() racing the end of a run never misses its wake-up.
 * - A one-shot task cancelled while it waits in the executor pool's queue
 *   behind a long task releases its record at once (stats.cancelled), not
 *   when an executor gets to it.
 * - Cancels that set their bits after the timer thread took a round's
 *   bits (forced with tw__service_drained_hook) are released without a
 *   wake-up and without the clock moving.
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
        sleep_us(200);
}

static void test_cancel_queued_for_executor(void)
{
    tw_service_config cfg = {0};
    cfg.executor_threads = 1;
    tw_service *s = vclock_service(&cfg);
    tw_id a = 0, b = 0;
    ASSERT_EQ(tw_schedule(s, blocker, NULL, MS, &a), 0);
    ASSERT_EQ(tw_schedule(s, blocker, NULL, MS, &b), 0);
    tw__service_sync(s); /* both in the wheel, due at the same tick */
    atomic_fetch_add(&vnow, MS);
    tw__service_kick(s);
    /* Both are dispatched in one round; the only executor blocks in one,
     * the other waits in the queue. */
    while (atomic_load(&bl.running) == 0)
        sleep_us(100);
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
        sleep_us(200);
    }
    ASSERT_EQ(st.cancelled, 1);
    /* The record is reused while the executor is still blocked (by a
     * window: tw_schedule() would take a node of its thread's magazine,
     * the shared path takes the freed record from the free list). */
    tw_id c = 0;
    ASSERT_EQ(tw_schedule_window(s, blocker, NULL, 10 * SEC, 10 * SEC, &c), 0);
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
/* Cancels between the round's drain and its end: the thread is awake, so
 * no cancel wakes it; it must see the bits before it sleeps long (an hour
 * here). AFTER_DRAIN tasks, over several words of the bitmap. */
#define AFTER_DRAIN 300

static tw_id drain_ids[AFTER_DRAIN];
static _Atomic bool drain_armed;
static _Atomic int drain_won;

static void cancel_after_drain(tw_service *s)
{
    if (!atomic_exchange(&drain_armed, false))
        return;
    for (int i = 0; i < AFTER_DRAIN; i++)
        atomic_fetch_add(&drain_won, tw_cancel(s, drain_ids[i]) ? 1 : 0);
}

static void test_cancel_after_drain(void)
{
    /* Installed before the thread starts and removed after it is joined
     * (the hook is a plain pointer); it acts once drain_armed is set. */
    atomic_store(&drain_armed, false);
    tw__service_drained_hook = cancel_after_drain;
    tw_service *s = vclock_service(NULL); /* 1 ms ticks */
    for (int i = 0; i < AFTER_DRAIN; i++)
        ASSERT_EQ(tw_schedule(s, blocker, NULL, 3600 * SEC, &drain_ids[i]), 0);
    tw__service_sync(s);
    tw__service_sync(s); /* all armed, the thread asleep until far ahead */
    atomic_store(&drain_armed, true);
    tw__service_kick(s);
    tw_service_stats st = {0};
    /* The clock stays put: only the timer thread's look at the bits after
     * its round can release them; allow 30 s. */
    for (int i = 0; i < 150000; i++) {
        tw_service_get_stats(s, &st);
        if (st.cancelled == AFTER_DRAIN)
            break;
        sleep_us(200);
    }
    ASSERT_EQ(atomic_load(&drain_won), AFTER_DRAIN);
    ASSERT_EQ(st.cancelled, AFTER_DRAIN);
    ASSERT_EQ(tw_service_pending(s), 0);
    for (int i = 0; i < AFTER_DRAIN; i++)
        ASSERT(!tw_cancel(s, drain_ids[i]));
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw__service_drained_hook = NULL;
    tw_service_get_stats(s, &st);
    ASSERT_EQ(st.ran, 0);
    tw_service_destroy(s);
}

int main(int argc, char **argv)
{
    RUN_SELECTED(test_cancel_wait_end_of_run);
    RUN_SELECTED(test_cancel_queued_for_executor);
    RUN_SELECTED(test_cancel_after_drain);
    return tw_test_done();
}
