/* SPDX-License-Identifier: MIT */
/*
 * tests/test_alloc_fail_durable.c - allocation failures in the durable
 * store: every allocation of tw_durable_open (replaying a journal of
 * several segments) and of its threads is made to fail in turn, and every
 * allocation a schedule or cancel may make; each failure is TW_ENOMEM with
 * nothing changed, nothing written and nothing leaked, and the same call
 * works once memory is back.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <unistd.h>

#include <twheel/durable.h>

#include "durable_hooks.h"
#include "test_alloc_fail.h"

static char dir[] = "/tmp/tw_durable_af_XXXXXX";

static int fired;

static int no_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)t;
    (void)arg;
    __atomic_add_fetch(&fired, 1, __ATOMIC_SEQ_CST);
    return 0;
}

static tw_durable_config cfg(void)
{
    tw_durable_config c;
    memset(&c, 0, sizeof c);
    c.dir = dir;
    c.fire = no_fire;
    c.sync = TW_DURABLE_SYNC_NONE;
    c.segment_bytes = 4096;
    return c;
}

static int make_store(void **obj, void *ctx)
{
    (void)ctx;
    tw_durable_config c = cfg();
    return tw_durable_open((tw_durable **)obj, &c);
}

static void use_store(void *obj)
{
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(obj, &st), 0);
    ASSERT_EQ(st.recovered, 300);
}

static void close_store(void *obj)
{
    ASSERT_EQ(tw_durable_close(obj), 0);
}

static int schedule_n(tw_durable *d, int i)
{
    char k[32], p[64];
    int kl = snprintf(k, sizeof k, "key-%d", i);
    int pl = snprintf(p, sizeof p, "payload of %d", i);
    return tw_durable_schedule(d, k, (size_t)kl, INT64_MAX / 2, p, (size_t)pl);
}

/* Conditional rewrites of keys 400 .. 599, the next allocation failing
 * (the record read back to compare, the call's own): TW_ENOMEM with
 * nothing changed, then the same call works. Returns how many failed. */
static long schedule_if_nomem(tw_durable *d)
{
    long nomem = 0;
    for (int i = 400; i < 600; i++) {
        char k[32], p[64];
        int kl = snprintf(k, sizeof k, "key-%d", i);
        int pl = snprintf(p, sizeof p, "payload of %d, again", i);
        tw_durable_stats before, after;
        ASSERT_EQ(tw_durable_stats_get(d, &before), 0);
        tw_af_arm(i % 3, false);
        int rc = tw_durable_schedule_if(d, k, (size_t)kl, "payload of", 10,
                                        INT64_MAX / 2, p, (size_t)pl);
        tw_af_disarm();
        if (rc == TW_ENOMEM) {
            nomem++;
            ASSERT_EQ(tw_durable_stats_get(d, &after), 0);
            ASSERT_EQ(after.journal_bytes, before.journal_bytes);
            rc = tw_durable_schedule_if(d, k, (size_t)kl, "payload of", 10,
                                        INT64_MAX / 2, p, (size_t)pl);
        }
        ASSERT_EQ(rc, 0);
    }
    /* A batch of more items than are converted on the stack. */
    tw_durable_item_if it[20];
    for (int i = 0; i < 20; i++)
        it[i] = (tw_durable_item_if){
            "key-401", 7, INT64_MAX / 2, "p", 1, "payload of", 10, 0};
    tw_af_arm(0, false);
    ASSERT_EQ(tw_durable_schedule_many_if(d, it, 20), TW_ENOMEM);
    tw_af_disarm();
    for (int i = 0; i < 20; i++)
        ASSERT_EQ(it[i].result, TW_ENOMEM);
    printf("schedule_if: %ld calls met a failed allocation\n", nomem);
    return nomem;
}

int main(void)
{
    ASSERT_NOT_NULL(mkdtemp(dir));
    long live0 = tw_af_live();
    /* A journal of several segments: 300 pending keys, 100 cancelled. */
    {
        tw_durable *d;
        tw_durable_config c = cfg();
        ASSERT_EQ(tw_durable_open(&d, &c), 0);
        for (int i = 0; i < 400; i++)
            ASSERT_EQ(schedule_n(d, i), 0);
        for (int i = 0; i < 100; i++) {
            char k[32];
            int kl = snprintf(k, sizeof k, "key-%d", i * 4);
            ASSERT_EQ(tw_durable_cancel(d, k, (size_t)kl), 0);
        }
        ASSERT_EQ(tw_durable_close(d), 0);
    }
    ASSERT_EQ(tw_af_live(), live0);

    long points = tw_af_sweep(make_store, use_store, close_store, NULL, false);
    long points2 = tw_af_sweep(make_store, use_store, close_store, NULL, true);
    printf("open: %ld allocation points swept (one failing), %ld (all from "
           "one on)\n",
           points, points2);

    /* A thread that cannot be started. */
    for (long k = 0; k < 3; k++) {
        tw_durable *d = (tw_durable *)(uintptr_t)1;
        tw_durable_config c = cfg();
        c.executor_threads = 2;
        tw_af_arm_threads(k);
        ASSERT_EQ(tw_durable_open(&d, &c), TW_ENOMEM);
        tw_af_arm_threads(-1);
        ASSERT_EQ((uintptr_t)d, 1);
        ASSERT_EQ(tw_af_live(), live0);
    }

    /* Schedule and cancel: the next allocation fails, call after call. */
    tw_durable *d;
    tw_durable_config c = cfg();
    ASSERT_EQ(tw_durable_open(&d, &c), 0);
    long nomem = 0;
    for (int i = 400; i < 3000; i++) {
        tw_durable_stats before, after;
        ASSERT_EQ(tw_durable_stats_get(d, &before), 0);
        tw_af_arm(0, false);
        int rc = schedule_n(d, i);
        tw_af_disarm();
        if (rc == TW_ENOMEM) {
            nomem++;
            ASSERT_EQ(tw_durable_stats_get(d, &after), 0);
            ASSERT_EQ(after.pending, before.pending);
            ASSERT_EQ(after.journal_bytes, before.journal_bytes);
            ASSERT_EQ(schedule_n(d, i), 0);
        } else {
            ASSERT_EQ(rc, 0);
        }
    }
    ASSERT_GT(nomem, 0);
    ASSERT_GT(schedule_if_nomem(d), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    ASSERT_EQ(tw_af_live(), live0);
    ASSERT_EQ(tw_durable_open(&d, &c), 0);
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(st.recovered, 300 + 2600);
    ASSERT_EQ(tw_durable_close(d), 0);
    printf("schedule: %ld calls met a failed allocation\n", nomem);
    ASSERT_EQ(tw_af_live(), live0);

    /* Firing without memory: the store's thread cannot grow its list of
     * due timers or read a record back; it tries again (in about 1 s) and
     * delivers once memory is back. Real time: up to 20 s allowed. */
    ASSERT_EQ(tw_durable_open(&d, &c), 0);
    for (int i = 0; i < 300; i++) {
        char k[32];
        int kl = snprintf(k, sizeof k, "key-%d", i * 4 + 1);
        ASSERT_EQ(tw_durable_cancel(d, k, (size_t)kl), 0);
    }
    /* The cancels left free nodes: this schedule needs no memory. */
    tw_af_arm(0, true);
    ASSERT_EQ(tw_durable_schedule(d, "now", 3, 0, "x", 1), 0);
    tw__durable_sync(d);
    long failed = tw_af_failures();
    tw_af_disarm();
    ASSERT_GT(failed, 0);
    ASSERT_EQ(__atomic_load_n(&fired, __ATOMIC_SEQ_CST), 0);
    for (int ms = 0; ms < 20000; ms += 10) {
        tw_durable_stats_get(d, &st);
        if (st.pending == st.recovered - 300)
            break;
        usleep(10000);
    }
    ASSERT_EQ(__atomic_load_n(&fired, __ATOMIC_SEQ_CST), 1);
    ASSERT_EQ(tw_durable_close(d), 0);
    ASSERT_EQ(tw_af_live(), live0);

    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ASSERT_EQ(system(cmd), 0);
    return 0;
}
