/* SPDX-License-Identifier: MIT */
/*
 * test_service_xq_reuse.c - a cancel of a task that an executor of the
 * built-in pool is taking from its queue must not act on the task's record
 * once that record is freed and reused by another task.
 *
 * The interleaving, forced with the test library's hooks:
 *   1. the single executor unlinks task X from its queue (xpop hook: wait
 *      until the cancel below is inside the queue's lock, or 1 s);
 *   2. the main thread cancels X (still DISPATCHED: the cancel wins); the
 *      cancel takes the queue's lock and reads X's state (xdrop hook: wait
 *      until task Y is armed, or 1 s);
 *   3. the executor finds X cancelled and frees its record; a producer
 *      thread schedules Y, which reuses that record, and waits until the
 *      timer thread has armed Y in its wheel;
 *   4. the cancel goes on and reads the record's links.
 * When the executor left the queue's lock before it looked at X's state,
 * step 3 ran while the cancel held the lock, so step 4 read Y's wheel links
 * as queue links, and unlinked and freed Y: Y was lost (tw_cancel(Y)
 * false). Now the executor moves X out of DISPATCHED (here: frees it)
 * before it lets go of the lock: step 1 times out, the cancel then sees
 * X's record with a new generation and leaves it alone, and Y is intact.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "fixture.h"
#include "service_internal.h"
#include "test.h"
#include "twheel/service.h"

static tw_service *svc;
static _Atomic tw_id x_id, y_id;
static atomic_int gate_b, b_running, x_popped, in_drop, y_armed;

/* Waits until *@flag is set; false after @ms. */
static bool wait_flag(atomic_int *flag, long ms)
{
    for (long i = 0; i < ms; i++) {
        if (atomic_load(flag))
            return true;
        sleep_ms(1);
    }
    return atomic_load(flag) != 0;
}

static void task_b(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
    atomic_store(&b_running, 1);
    wait_flag(&gate_b, 30000);
}

static void task_never(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
    ASSERT(!"a cancelled or far-away task ran");
}

static void xpop_hook(tw_service *s, uint64_t id)
{
    (void)s;
    if (id != atomic_load(&x_id))
        return;
    atomic_store(&x_popped, 1);
    /* Fixed: we hold the queue's lock, so the cancel cannot get in. */
    wait_flag(&in_drop, 1000);
}

static void xdrop_hook(tw_service *s, uint64_t id)
{
    (void)s;
    if (id != atomic_load(&x_id))
        return;
    atomic_store(&in_drop, 1);
    /* Fixed: the executor cannot free X while we hold the lock, so Y never
     * comes: give up after 1 s. Broken: Y is armed within that time. */
    wait_flag(&y_armed, 1000);
}

static void *producer(void *p)
{
    (void)p;
    /* Wait until X's record is freed (counted as cancelled). */
    tw_service_stats st;
    for (int i = 0; i < 30000; i++) {
        tw_service_get_stats(svc, &st);
        if (st.cancelled == 1)
            break;
        sleep_ms(1);
    }
    ASSERT_EQ(st.cancelled, 1);
    tw_id y;
    ASSERT_EQ(
        tw_schedule(svc, task_never, NULL, UINT64_C(3600) * 1000000000, &y), 0);
    atomic_store(&y_id, y);
    tw__service_sync(svc); /* the timer thread has armed Y */
    atomic_store(&y_armed, 1);
    return NULL;
}

static void test_cancel_after_pop_spares_reused_record(void)
{
    tw_service_config cfg = {.executor_threads = 1};
    ASSERT_EQ(tw_service_create(&svc, &cfg), 0);
    tw__service_xpop_hook = xpop_hook;
    tw__service_xdrop_hook = xdrop_hook;

    tw_id b, x;
    ASSERT_EQ(tw_schedule(svc, task_b, NULL, 0, &b), 0);
    ASSERT(wait_flag(&b_running, 30000));
    /* X is due at once and waits in the queue behind B. */
    ASSERT_EQ(tw_schedule(svc, task_never, NULL, 0, &x), 0);
    atomic_store(&x_id, x);
    pthread_t p;
    ASSERT_EQ(pthread_create(&p, NULL, producer, NULL), 0);
    atomic_store(&gate_b, 1);
    ASSERT(wait_flag(&x_popped, 30000));
    ASSERT(tw_cancel(svc, x)); /* runs the xdrop hook */
    ASSERT_EQ(pthread_join(p, NULL), 0);
    tw_id y = atomic_load(&y_id);
    /* The forced interleaving: Y reused X's record. */
    ASSERT_EQ((uint32_t)y, (uint32_t)x);
    ASSERT_EQ(tw_service_pending(svc), 1);
    ASSERT(tw_cancel(svc, y)); /* Y is intact and still pending */
    ASSERT_EQ(tw_service_pending(svc), 0);
    tw__service_xpop_hook = NULL;
    tw__service_xdrop_hook = NULL;
    tw_service_destroy(svc);
}

int main(void)
{
    RUN_TEST(test_cancel_after_pop_spares_reused_record);
    return 0;
}
