/* SPDX-License-Identifier: MIT */
/*
 * tests/test_journal_group.c - group commit of SYNC_GROUP, at the moments
 * where calls meet: a call that another thread's combiner applied, and a
 * gather that ends at its deadline because fewer callers came than it
 * expected.
 *
 * The fault hook of the journal (src/journal.h) sees each pwrite ('w')
 * and fdatasync ('s') before it runs: a hook that holds the first write
 * until a second call is queued behind the combiner forces that call into
 * the first caller's rounds, and a hook that sleeps in each fdatasync
 * makes a slow device whose syncs the gather sizes itself by.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <time.h>

#include "durable_fixture.h"
#include "durable_journal.h"
#include "journal.h"

static tw_durable *store;
static char dir_buf[256];

/* Nothing here comes due: every timer is far in the future. */
static int no_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)t;
    (void)arg;
    return 0;
}

static tw_durable_config group_cfg(void)
{
    tw_durable_config c =
        df_cfg(df_new_dir(dir_buf, sizeof dir_buf, NULL), no_fire);
    c.sync = TW_DURABLE_SYNC_GROUP;
    c.wall_ms = NULL;
    c.mono_ns = NULL;
    return c;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int sched(const char *key)
{
    return tw_durable_schedule(store, key, strlen(key), INT64_MAX / 2, "p", 1);
}

/* ------------------------------------------------------------------------ */
/* A call applied by another thread's combiner. */

static atomic_int cb_writes, cb_syncs;
static int cb_sync_err; /* what the first fdatasync returns */
static _Atomic int cb_late_rc = 1;
static pthread_t cb_thread;

static void *cb_late(void *arg)
{
    (void)arg;
    atomic_store(&cb_late_rc, sched("late"));
    return NULL;
}

/* The first write (the first caller's record, in its combiner's first
 * round) starts the late caller and waits until its call is queued behind
 * the combiner, so the same combiner applies it in its next round; the
 * first fdatasync fails with cb_sync_err. Bounded: 10 s. */
static int cb_hook(int op)
{
    if (op == 's')
        return atomic_fetch_add(&cb_syncs, 1) == 0 ? cb_sync_err : 0;
    if (atomic_fetch_add(&cb_writes, 1) != 0)
        return 0;
    ASSERT_EQ(pthread_create(&cb_thread, NULL, cb_late, NULL), 0);
    jstore *s = (jstore *)store;
    uint64_t until = mono_ms() + 10000;
    while (atomic_load(&s->combiner.pend) == NULL)
        ASSERT_LT(mono_ms(), until);
    ASSERT_EQ(atomic_load(&cb_late_rc), 1); /* queued, not returned */
    return 0;
}

/*
 * The combiner waits until the records of every call it applied are
 * durable before it wakes their callers. The late caller, whose call the
 * first caller's combiner applied, gets what the one fdatasync that
 * covered both calls gave: its failure, or success (and then both keys
 * survive a reopen). Either way the two calls shared one fdatasync.
 */
static void combined_call(int sync_err)
{
    tw_durable_config c = group_cfg();
    store = df_open(&c);
    atomic_store(&cb_writes, 0);
    atomic_store(&cb_syncs, 0);
    atomic_store(&cb_late_rc, 1);
    cb_sync_err = sync_err;
    tw__journal_fault = cb_hook;
    int first_rc = sched("first");
    pthread_join(cb_thread, NULL);
    tw__journal_fault = NULL;
    int want = sync_err ? -sync_err : 0;
    ASSERT_EQ(first_rc, want);
    ASSERT_EQ(atomic_load(&cb_late_rc), want);
    ASSERT_EQ(atomic_load(&cb_syncs), 1);
    ASSERT_EQ(sched("after"), 0);
    ASSERT_EQ(tw_durable_close(store), 0);
    if (!sync_err) {
        store = df_open(&c);
        ASSERT_EQ(tw_durable_cancel(store, "first", 5), 0);
        ASSERT_EQ(tw_durable_cancel(store, "late", 4), 0);
        ASSERT_EQ(tw_durable_close(store), 0);
    }
    df_rm_dir(c.dir);
}

static void test_combined_call(void)
{
    combined_call(EIO);
    combined_call(0);
}

/* ------------------------------------------------------------------------ */
/* A gather that falls short. */

static int slow_sync(int op)
{
    if (op == 's')
        usleep(8000);
    return 0;
}

static void *gs_thread(void *arg)
{
    const char *prefix = arg;
    for (int i = 0; i < 20; i++) {
        char k[32];
        snprintf(k, sizeof k, "%s%d", prefix, i);
        ASSERT_EQ(sched(k), 0);
    }
    return NULL;
}

/*
 * Four threads that schedule one timer per call share each 8 ms sync, so
 * the next sync's gather expects four calls; then one thread goes on
 * alone. Its gather must end at the deadline (a quarter of the last
 * sync's time, 2 ms here) with the one call it has, led by that caller
 * itself: no other caller comes to end it. 20 such calls take about
 * 20 x (2 + 8) ms, first gather included; the bound is 5 s, for a loaded
 * machine. A gather that waited for callers that never come would hang
 * here until the test's timeout.
 */
static void test_gather_falls_short(void)
{
    tw_durable_config c = group_cfg();
    store = df_open(&c);
    tw__journal_fault = slow_sync;
    pthread_t th[4];
    static char prefix[4][2] = {"a", "b", "c", "d"};
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(pthread_create(&th[i], NULL, gs_thread, prefix[i]), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    uint64_t t0 = mono_ms();
    static char alone[] = "alone";
    gs_thread(alone);
    uint64_t ms = mono_ms() - t0;
    tw__journal_fault = NULL;
    fprintf(stderr, "   20 lone calls after a gather of 4: %" PRIu64 " ms\n",
            ms);
    ASSERT_LT(ms, 5000);
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(store, &st), 0);
    ASSERT_EQ(st.pending, 100);
    ASSERT_EQ(tw_durable_close(store), 0);
    df_rm_dir(c.dir);
}

int main(void)
{
    test_combined_call();
    fprintf(stderr, "   a combined call: passed\n");
    test_gather_falls_short();
    fprintf(stderr, "test_journal_group: all passed\n");
    return 0;
}
