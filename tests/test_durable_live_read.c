/* SPDX-License-Identifier: MIT */
/*
 * tests/test_durable_live_read.c - a read-only open of a journal that a
 * live store keeps writing and compacting (what `twheel journal export`
 * does for a backup) sees every timer acknowledged before it began.
 *
 * The store compacts by copying the live records of its oldest segment to
 * the end of the journal and deleting the segment. A test hook runs just
 * after the read-only open has listed the segments; there the live store
 * churns until its head has moved past the last listed segment and then
 * compacts at least once more, so that some acknowledged timers now live
 * only in a segment the listing did not name, and the segment that held
 * them is gone (or named as gone by the MANIFEST). A second case deletes a
 * listed segment between the MANIFEST and the read of that segment.
 */
#define _GNU_SOURCE
#include <dirent.h>

#include "durable_fixture.h"
#include "durable_hooks.h"

#define LIVE 400 /* acknowledged timers that never change */

static tw_durable *writer;
static const char *wdir;
static int hook_calls;
static int hook_step; /* the listing's step that changes the journal */

/* The lowest and highest segment numbers in @dir. */
static void seg_range(const char *dir, uint32_t *lo, uint32_t *hi)
{
    DIR *d = opendir(dir);
    ASSERT_NOT_NULL(d);
    *lo = UINT32_MAX;
    *hi = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        unsigned no;
        char tail[8];
        if (sscanf(e->d_name, "%10u.%4s", &no, tail) == 2 &&
            !strcmp(tail, "twj")) {
            *lo = no < *lo ? no : *lo;
            *hi = no > *hi ? no : *hi;
        }
    }
    closedir(d);
}

/* Replace one key with a 300-byte payload until @done says stop. */
static void churn_until(bool (*done)(uint32_t lo, uint32_t hi, void *a),
                        void *a)
{
    char pay[300];
    memset(pay, 'c', sizeof pay);
    for (int i = 0; i < 200000; i++) {
        ASSERT_EQ(tw_durable_schedule(writer, "churn", 5, INT64_MAX / 2, pay,
                                      sizeof pay),
                  0);
        if (i % 16)
            continue;
        tw__durable_sync(writer); /* the store's thread has compacted */
        uint32_t lo, hi;
        seg_range(wdir, &lo, &hi);
        if (done(lo, hi, a))
            return;
    }
    TW_TEST_FAIL_("%s", "the store did not compact as expected");
}

struct moved {
    uint32_t listed_hi; /* the head when the reader listed */
    uint32_t lo_then;   /* the oldest segment once the head moved past it */
};

static bool head_moved(uint32_t lo, uint32_t hi, void *a)
{
    struct moved *m = a;
    m->lo_then = lo;
    return hi > m->listed_hi;
}

static bool compacted_after(uint32_t lo, uint32_t hi, void *a)
{
    (void)hi;
    return lo > ((struct moved *)a)->lo_then;
}

/* At the read-only open's @step (see durable_hooks.h): move the head past
 * the listed segments, then compact (delete) a listed segment, so that its
 * live records are only in a segment the listing does not name. */
static void in_listing(int dirfd, int step)
{
    (void)dirfd;
    if (step != hook_step || hook_calls++)
        return; /* only the first listing */
    struct moved m;
    uint32_t lo;
    seg_range(wdir, &lo, &m.listed_hi);
    churn_until(head_moved, &m);
    churn_until(compacted_after, &m);
}

static int fire_none(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)t;
    (void)arg;
    return 0;
}

/* A store with LIVE timers spread over several segments among churn. */
static void start_writer(const char *dir)
{
    tw_durable_config c = df_cfg(dir, fire_none);
    c.segment_bytes = 4096;
    c.sync = TW_DURABLE_SYNC_NONE;
    writer = df_open(&c);
    wdir = dir;
    char pay[300];
    memset(pay, 'c', sizeof pay);
    for (int i = 0; i < LIVE; i++) {
        char k[16];
        int kl = snprintf(k, sizeof k, "live%04d", i);
        ASSERT_EQ(
            tw_durable_schedule(writer, k, (size_t)kl, INT64_MAX / 2, "v", 1),
            0);
        ASSERT_EQ(tw_durable_schedule(writer, "churn", 5, INT64_MAX / 2, pay,
                                      sizeof pay),
                  0);
    }
    tw__durable_sync(writer);
}

static void expect_all_live(tw_durable *r)
{
    int missing = 0;
    for (int i = 0; i < LIVE; i++) {
        char k[16];
        int kl = snprintf(k, sizeof k, "live%04d", i);
        tw_durable_info info;
        if (tw_durable_get(r, k, (size_t)kl, &info, NULL, 0) != 0)
            missing++;
    }
    ASSERT_EQ(missing, 0);
}

/* A read-only open on a live store with the hook at @step. */
static void read_while_compacting(int step)
{
    char dir[256];
    start_writer(df_new_dir(dir, sizeof dir, NULL));
    tw_durable_config c = df_cfg(dir, fire_none);
    c.flags = TW_DURABLE_READONLY;
    hook_calls = 0;
    hook_step = step;
    tw__journal_list_hook = in_listing;
    tw_durable *r = df_open(&c);
    tw__journal_list_hook = NULL;
    ASSERT_EQ(hook_calls >= 1, 1);
    expect_all_live(r);
    ASSERT_EQ(tw_durable_close(r), 0);
    ASSERT_EQ(tw_durable_close(writer), 0);
    df_rm_dir(dir);
}

/* Compacted between the listing and the MANIFEST: the MANIFEST says to
 * skip a listed segment whose live records moved past the listing. */
static void test_compacted_before_manifest(void)
{
    read_while_compacting(0);
}

/* Compacted after the MANIFEST: a listed segment is gone when its turn to
 * be read comes. */
static void test_compacted_before_read(void)
{
    read_while_compacting(1);
}

int main(void)
{
    RUN_TEST(test_compacted_before_manifest);
    RUN_TEST(test_compacted_before_read);
    return tw_test_done();
}
