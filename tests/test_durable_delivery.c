/* SPDX-License-Identifier: MIT */
/*
 * tests/test_durable_delivery.c - a cancel or a replace that returned 0
 * stops every delivery of the old version whose callback has not started.
 *
 * The interleaving is forced: timers A and B are due in the same round, A
 * first; A's callback blocks until the test lets it go, so B's delivery is
 * begun (its FIRE record written, queued behind A) but its callback has not
 * started. The test cancels or replaces B meanwhile, then releases A: B's
 * old version must never reach the callback, with executor_threads 0 (the
 * store's thread runs the callbacks) and 1 (an executor does). After a
 * crash with the cancel returned, the next open must not deliver B either.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <time.h>

#include "durable_fixture.h"

void tw__durable_sync(tw_durable *d);

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static bool hold, held, released;
static int n_old, n_new, n_a; /* deliveries of B's versions, and of A */

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    pthread_mutex_lock(&mu);
    if (t->key_len == 1 && memcmp(t->key, "A", 1) == 0) {
        n_a++;
        held = true;
        pthread_cond_broadcast(&cv);
        while (hold && !released)
            pthread_cond_wait(&cv, &mu);
    } else if (t->payload_len == 3 && memcmp(t->payload, "old", 3) == 0) {
        n_old++;
    } else {
        n_new++;
    }
    pthread_mutex_unlock(&mu);
    return 0;
}

static void reset(bool block)
{
    pthread_mutex_lock(&mu);
    hold = block;
    held = released = false;
    n_old = n_new = n_a = 0;
    pthread_mutex_unlock(&mu);
}

/* Wait (at most 30 s of real time: only a hang takes that long) until A's
 * callback is running. */
static void wait_held(void)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    pthread_mutex_lock(&mu);
    while (!held)
        ASSERT_EQ(pthread_cond_timedwait(&cv, &mu, &until), 0);
    pthread_mutex_unlock(&mu);
}

static void release(void)
{
    pthread_mutex_lock(&mu);
    released = true;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
}

static const int64_t t0 = 1700000000000;

/* A store on @dir where A's callback runs and blocks with B's delivery
 * begun behind it. */
static tw_durable *a_blocks_b_waits(const char *dir, uint32_t nexec)
{
    reset(true);
    atomic_store(&df_wall, t0 + 10);
    tw_durable_config c = df_cfg(dir, on_fire);
    c.executor_threads = nexec;
    tw_durable *d = df_open(&c);
    /* One call: both are in the wheel before the store's thread looks. */
    tw_durable_item it[2] = {
        {.key = "A",
         .key_len = 1,
         .due_ms = t0 + 1,
         .payload = "a",
         .payload_len = 1},
        {.key = "B",
         .key_len = 1,
         .due_ms = t0 + 2,
         .payload = "old",
         .payload_len = 3},
    };
    ASSERT_EQ(tw_durable_schedule_many(d, it, 2), 0);
    wait_held();
    /* B is due and its delivery has begun, its callback not. */
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(st.backlog, 1);
    return d;
}

static void test_cancel_stops(uint32_t nexec)
{
    char buf[256];
    const char *dir = df_new_dir(buf, sizeof buf, NULL);
    tw_durable *d = a_blocks_b_waits(dir, nexec);
    ASSERT_EQ(tw_durable_cancel(d, "B", 1), 0);
    release();
    tw__durable_sync(d);
    tw__durable_sync(d);
    ASSERT_EQ(n_a, 1);
    ASSERT_EQ(n_old, 0);
    ASSERT_EQ(df_pending(d), 0);
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(st.backlog, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    /* Nor after a reopen. */
    reset(false);
    tw_durable_config c = df_cfg(dir, on_fire);
    d = df_open(&c);
    tw__durable_sync(d);
    ASSERT_EQ(n_old + n_new + n_a, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

static void test_replace_stops(uint32_t nexec)
{
    char buf[256];
    const char *dir = df_new_dir(buf, sizeof buf, NULL);
    tw_durable *d = a_blocks_b_waits(dir, nexec);
    ASSERT_EQ(tw_durable_schedule(d, "B", 1, t0 + 1000, "new", 3), 0);
    release();
    tw__durable_sync(d);
    tw__durable_sync(d);
    ASSERT_EQ(n_old, 0);
    ASSERT_EQ(n_new, 0);
    ASSERT_EQ(df_pending(d), 1);
    atomic_store(&df_wall, t0 + 1000);
    tw__durable_sync(d);
    ASSERT_EQ(n_old, 0);
    ASSERT_EQ(n_new, 1);
    ASSERT_EQ(df_pending(d), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/* In a child: A blocks, the cancel of B returns 0, then the process is
 * killed with A's callback still running. */
static int crash_after_cancel(void *arg)
{
    const char *dir = arg;
    tw_durable *d = a_blocks_b_waits(dir, 0);
    return tw_durable_cancel(d, "B", 1) == 0 ? 'y' : 'n';
}

static void test_crash_after_cancel(void)
{
    char buf[256];
    char *dir = (char *)df_new_dir(buf, sizeof buf, NULL);
    ASSERT_EQ(df_in_child(crash_after_cancel, dir), 'y');
    reset(false);
    atomic_store(&df_wall, t0 + 10);
    tw_durable_config c = df_cfg(dir, on_fire);
    tw_durable *d = df_open(&c);
    tw__durable_sync(d);
    ASSERT_EQ(n_a, 1); /* begun, never completed: delivered again */
    ASSERT_EQ(n_old + n_new, 0);
    ASSERT_EQ(df_pending(d), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

static void cancel_inline(void)
{
    test_cancel_stops(0);
}
static void cancel_executor(void)
{
    test_cancel_stops(1);
}
static void replace_inline(void)
{
    test_replace_stops(0);
}
static void replace_executor(void)
{
    test_replace_stops(1);
}

/* One case by name (argv[1]), or all. */
#define CASE(fn)                                                               \
    if (argc < 2 || strcmp(argv[1], #fn) == 0)                                 \
    RUN_TEST(fn)

int main(int argc, char **argv)
{
    CASE(cancel_inline);
    CASE(cancel_executor);
    CASE(replace_inline);
    CASE(replace_executor);
    CASE(test_crash_after_cancel);
    return tw_test_done();
}
