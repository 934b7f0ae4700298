/* SPDX-License-Identifier: MIT */
/*
 * tests/durable_semantics_cas.c - the rules of conditional writes
 * (tw_durable_schedule_if() and friends), part of the shared semantic
 * suite (tests/durable_semantics.c runs them on every backend).
 *
 * Payloads begin with a write token; a conditional write names the token
 * it expects. Each rule is checked so that a store that ignored the
 * condition would fail it: a stale write must return TW_ESTALE and leave
 * the stored payload, the due time and the deliveries as they were.
 */
#define _GNU_SOURCE

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "durable_semantics_impl.h"
#include "test.h"

#define FAR 1000000 /* ms ahead: a due time no test reaches */

static int sched_if(tw_durable *d, const char *key, const char *expect,
                    int64_t due, const char *pl)
{
    return tw_durable_schedule_if(d, key, strlen(key), expect,
                                  expect ? strlen(expect) : 0, due, pl,
                                  strlen(pl));
}

static int cancel_if(tw_durable *d, const char *key, const char *expect)
{
    return tw_durable_cancel_if(d, key, strlen(key), expect,
                                expect ? strlen(expect) : 0);
}

/* @key's stored payload is @want (NULL: the store does not hold it). */
static void expect_stored(tw_durable *d, const char *key, const char *want)
{
    tw_durable_info in;
    char buf[64];
    int rc = tw_durable_get(d, key, strlen(key), &in, buf, sizeof buf - 1);
    if (!want) {
        ASSERT_EQ(rc, TW_ENOENT);
        return;
    }
    ASSERT_EQ(rc, 0);
    ASSERT_LT(in.payload_len, sizeof buf);
    buf[in.payload_len] = 0;
    ASSERT_STR_EQ(buf, want);
}

/* Bad arguments: TW_EINVAL, nothing written. */
static void cas_bad_args(tw_durable *d, int64_t due)
{
    ASSERT_EQ(tw_durable_schedule_if(NULL, "k", 1, NULL, 0, due, "p", 1),
              TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule_if(d, NULL, 1, NULL, 0, due, "p", 1),
              TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule_if(d, "k", 0, NULL, 0, due, "p", 1),
              TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule_if(d, "k", 1, NULL, 1, due, "p", 1),
              TW_EINVAL); /* NULL expect with a length */
    ASSERT_EQ(tw_durable_schedule_if(d, "k", 1, NULL, 0, due, NULL, 1),
              TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule_if(d, "k", 1, "t",
                                     TW_DURABLE_PAYLOAD_MAX + 1u, due, "p", 1),
              TW_EINVAL);
    ASSERT_EQ(tw_durable_cancel_if(NULL, "k", 1, "t", 1), TW_EINVAL);
    ASSERT_EQ(tw_durable_cancel_if(d, "k", 0, "t", 1), TW_EINVAL);
    ASSERT_EQ(tw_durable_cancel_if(d, "k", 1, NULL, 0), TW_EINVAL);
    ASSERT_EQ(tw_durable_cancel_if(d, "k", 1, NULL, 1), TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule_many_if(d, NULL, 1), TW_EINVAL);
    ASSERT_EQ(tw_durable_cancel_many_if(d, NULL, 1), TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule_many_if(d, NULL, 0), 0);
    expect_stored(d, "k", NULL);
}

/* One key through its versions: create if absent, rewrite on a match,
 * refuse a stale token, a prefix longer than the payload, a token that is
 * only a prefix of the expected one; empty expect; cancel on a match. */
void sem_test_cas_single(void)
{
    tw_durable *d = sem_open_new();
    int64_t t0 = sem_now();
    cas_bad_args(d, t0 + FAR);
    ASSERT_EQ(sched_if(d, "k", "t0", t0 + FAR, "t1:a"), TW_ENOENT);
    ASSERT_EQ(sched_if(d, "k", "", t0 + FAR, "t1:a"), TW_ENOENT);
    ASSERT_EQ(cancel_if(d, "k", "t0"), TW_ENOENT);
    ASSERT_EQ(cancel_if(d, "k", ""), TW_ENOENT);
    expect_stored(d, "k", NULL);
    ASSERT_EQ(sched_if(d, "k", NULL, t0 + 100, "t1:a"), 0); /* created */
    ASSERT_EQ(sched_if(d, "k", NULL, t0 + FAR, "t9:x"), TW_ESTALE);
    ASSERT_EQ(sched_if(d, "k", "t2", t0 + FAR, "t9:x"), TW_ESTALE);
    ASSERT_EQ(sched_if(d, "k", "t1:ab", t0 + FAR, "t9:x"), TW_ESTALE);
    expect_stored(d, "k", "t1:a");
    ASSERT_EQ(sched_if(d, "k", "t1:a", t0 + 200, "t2:b"), 0); /* whole */
    ASSERT_EQ(sched_if(d, "k", "t1", t0 + FAR, "t9:x"), TW_ESTALE);
    ASSERT_EQ(cancel_if(d, "k", "t1"), TW_ESTALE);
    expect_stored(d, "k", "t2:b");
    ASSERT_EQ(sched_if(d, "k", "t2", t0 + 300, "t3:c"), 0);
    ASSERT_EQ(sched_if(d, "k", "", t0 + 400, "t4:d"), 0); /* any version */
    ASSERT_EQ(sem_stats(d).pending, 1);
    /* An empty stored payload: only an empty expect matches it. */
    ASSERT_EQ(sched_if(d, "e", NULL, t0 + FAR, ""), 0);
    ASSERT_EQ(sched_if(d, "e", "t", t0 + FAR, "t1"), TW_ESTALE);
    ASSERT_EQ(cancel_if(d, "e", ""), 0);
    ASSERT_EQ(sem_stats(d).cancelled, 1);
    ASSERT_EQ(tw_durable_close(d), 0);
    /* The versions survive a reopen; the last one is what fires. */
    d = sem_reopen();
    expect_stored(d, "k", "t4:d");
    ASSERT_EQ(cancel_if(d, "k", "t3"), TW_ESTALE);
    sem_advance(400);
    sem_wait_count("k", 1);
    sem_settle(d);
    char pl[32];
    sem_last_payload("k", pl, sizeof pl);
    ASSERT_STR_EQ(pl, "t4:d");
    ASSERT_EQ(sem_count("k"), 1);
    ASSERT_EQ(sem_count("e"), 0);
    ASSERT_EQ(sem_early(), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* A schedule_many_if batch with every outcome; each item sees the items
 * before it (an item may expect the token an earlier one wrote; two that
 * expect the same version: the second is stale). */
static void cas_many_mixed(tw_durable *d, int64_t t0)
{
    ASSERT_EQ(sched_if(d, "m3", NULL, t0 + FAR, "a1"), 0);
    tw_durable_item_if it[8] = {
        {"m1", 2, t0 + FAR, "b1", 2, NULL, 0, 7},    /* create */
        {"m1", 2, t0 + 100, "b2", 2, "b1", 2, 7},    /* the item before's */
        {"m1", 2, t0 + FAR, "b3", 2, "b1", 2, 7},    /* b1 again: stale */
        {"m2", 2, t0 + FAR, "c1", 2, "x", 1, 7},     /* not pending */
        {"m3", 2, t0 + 100, "a2", 2, "a1", 2, 7},    /* stored before */
        {"m3", 2, t0 + FAR, "a3", 2, NULL, 0, 7},    /* not absent */
        {"m4", 0, t0 + FAR, "d1", 2, NULL, 0, 7},    /* bad key */
        {"m4", 2, t0 + FAR, "d1", 2, "d0xx", 4, 7}}; /* not pending */
    ASSERT_EQ(tw_durable_schedule_many_if(d, it, 8), TW_ESTALE);
    int want[8] = {0, 0,         TW_ESTALE, TW_ENOENT,
                   0, TW_ESTALE, TW_EINVAL, TW_ENOENT};
    for (int i = 0; i < 8; i++)
        ASSERT_EQ(it[i].result, want[i]);
    expect_stored(d, "m1", "b2");
    expect_stored(d, "m2", NULL);
    expect_stored(d, "m3", "a2");
    expect_stored(d, "m4", NULL);
    /* cancel_many_if: match, stale, absent, the same key twice. */
    ASSERT_EQ(sched_if(d, "n1", NULL, t0 + 100, "e1"), 0);
    tw_durable_item_if c[5] = {
        {.key = "m1",
         .key_len = 2,
         .expect = "b1",
         .expect_len = 2,
         .result = 7},
        {.key = "m3",
         .key_len = 2,
         .expect = "a2",
         .expect_len = 2,
         .result = 7},
        {.key = "m3",
         .key_len = 2,
         .expect = "a2",
         .expect_len = 2,
         .result = 7},
        {.key = "zz", .key_len = 2, .expect = "", .expect_len = 0, .result = 7},
        {.key = "n1",
         .key_len = 2,
         .expect = NULL,
         .expect_len = 0,
         .result = 7}};
    ASSERT_EQ(tw_durable_cancel_many_if(d, c, 5), TW_ESTALE);
    ASSERT_EQ(c[0].result, TW_ESTALE);
    ASSERT_EQ(c[1].result, 0);
    ASSERT_EQ(c[2].result, TW_ENOENT);
    ASSERT_EQ(c[3].result, TW_ENOENT);
    ASSERT_EQ(c[4].result, TW_EINVAL);
    expect_stored(d, "m1", "b2");
    expect_stored(d, "m3", NULL);
    expect_stored(d, "n1", "e1");
}

#define MANY 40 /* more than the items converted on the stack */

/* A batch of MANY creates, then MANY rewrites of which every other one
 * expects a stale token. */
static void cas_many_large(tw_durable *d, int64_t t0)
{
    static char keys[MANY][8], pl[MANY][8], np[MANY][8];
    tw_durable_item_if it[MANY];
    for (int i = 0; i < MANY; i++) {
        snprintf(keys[i], sizeof keys[i], "L%02d", i);
        snprintf(pl[i], sizeof pl[i], "p%02d", i);
        snprintf(np[i], sizeof np[i], "q%02d", i);
        it[i] =
            (tw_durable_item_if){keys[i], 3, t0 + FAR, pl[i], 3, NULL, 0, 7};
    }
    ASSERT_EQ(tw_durable_schedule_many_if(d, it, MANY), 0);
    for (int i = 0; i < MANY; i++) {
        ASSERT_EQ(it[i].result, 0);
        it[i].payload = np[i];
        it[i].expect = i % 2 ? "px" : pl[i]; /* "px": a stale token */
        it[i].expect_len = i % 2 ? 2 : 3;
        it[i].result = 7;
    }
    ASSERT_EQ(tw_durable_schedule_many_if(d, it, MANY), TW_ESTALE);
    for (int i = 0; i < MANY; i++) {
        bool match = i % 2 == 0;
        ASSERT_EQ(it[i].result, match ? 0 : TW_ESTALE);
        expect_stored(d, keys[i], match ? np[i] : pl[i]);
    }
}

void sem_test_cas_many(void)
{
    tw_durable *d = sem_open_new();
    int64_t t0 = sem_now();
    cas_many_mixed(d, t0);
    cas_many_large(d, t0);
    ASSERT_EQ(tw_durable_close(d), 0);
    d = sem_reopen();
    expect_stored(d, "m1", "b2");
    expect_stored(d, "n1", "e1");
    sem_advance(100);
    sem_wait_count("m1", 1);
    sem_wait_count("n1", 1);
    sem_settle(d);
    ASSERT_EQ(sem_count("m3"), 0);
    char pl[32];
    sem_last_payload("m1", pl, sizeof pl);
    ASSERT_STR_EQ(pl, "b2");
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* A write that expects the version just delivered and completed: not
 * pending (TW_ENOENT); on a backend with TW_SEM_KNOWN_DONE_LAG, until the
 * completion reaches the store, it is still pending there and the write
 * applies (as a cancel returns 0 then). */
static void cas_just_done(tw_durable *d)
{
    /* Callbacks still returning (settle()'s) would count as jd's. */
    for (int i = 0; i < 30000 && sem_stats(d).running; i++)
        sem_sleep_ms(1);
    uint64_t fired = sem_stats(d).fired;
    ASSERT_EQ(sched_if(d, "jd", NULL, sem_now(), "j1"), 0);
    sem_wait_count("jd", 1);
    sem_wait_fired(d, fired + 1);
    int rc = sched_if(d, "jd", "j1", sem_now() + FAR, "j2");
    if (sem_backend()->known & TW_SEM_KNOWN_DONE_LAG) {
        fprintf(stderr, "  known difference: write just after done = %d\n", rc);
        ASSERT_EQ(rc, 0);
        ASSERT_EQ(cancel_if(d, "jd", "j2"), 0);
    } else {
        ASSERT_EQ(rc, TW_ENOENT);
    }
    sem_done_flush(d, 0);
    ASSERT_EQ(sched_if(d, "jd", "j1", sem_now() + FAR, "j3"), TW_ENOENT);
}

/* A timer whose callback is running (payload "B", held): a conditional
 * write compares with its stored payload; one that applies replaces (or
 * cancels) it, and the callback's "done" does not erase the new version.
 * A stale one changes nothing, and the callback's "done" then ends the
 * key. */
void sem_test_cas_fire_race(void)
{
    tw_durable *d = sem_open_new();
    int64_t t0 = sem_now();
    ASSERT_EQ(sched_if(d, "fr", NULL, t0 + 10, "B"), 0);
    sem_block_reset();
    sem_advance(10);
    sem_wait_blocked();
    ASSERT_EQ(sched_if(d, "fr", "X", t0 + 500, "v2"), TW_ESTALE);
    ASSERT_EQ(cancel_if(d, "fr", "v"), TW_ESTALE);
    ASSERT_EQ(sched_if(d, "fr", NULL, t0 + 500, "v2"), TW_ESTALE);
    ASSERT_EQ(sched_if(d, "fr", "B", t0 + 500, "v2"), 0);
    sem_unblock(); /* "B" returns 0: done */
    sem_wait_count("fr", 1);
    sem_done_flush(d, 1);
    expect_stored(d, "fr", "v2"); /* not erased by the old version's done */
    ASSERT_EQ(sched_if(d, "fr", "B", t0 + 500, "v3"), TW_ESTALE);
    sem_advance(490);
    sem_wait_count("fr", 2);
    char pl[32];
    sem_last_payload("fr", pl, sizeof pl);
    ASSERT_STR_EQ(pl, "v2");
    sem_done_flush(d, 0);
    /* A cancel that applies while the callback runs. */
    int64_t t1 = sem_now();
    ASSERT_EQ(sched_if(d, "fc", NULL, t1 + 10, "B"), 0);
    sem_block_reset();
    sem_advance(10);
    sem_wait_blocked();
    ASSERT_EQ(cancel_if(d, "fc", "B"), 0);
    sem_unblock();
    sem_wait_count("fc", 1);
    sem_done_flush(d, 0);
    /* Then a stale write while another runs, whose done ends the key.
     * "fs" is scheduled only now: the flush above moves the clock (Redis),
     * and a "B" timer due by then could run (unheld) before the reset
     * below, leaving nothing to hold; its completion then waited for a
     * clock that did not move until its lease brought it back. */
    int64_t t2 = sem_now();
    ASSERT_EQ(sched_if(d, "fs", NULL, t2 + 10, "B"), 0);
    sem_block_reset();
    sem_advance(10);
    sem_wait_blocked();
    ASSERT_EQ(sched_if(d, "fs", "v", t2 + 5000, "v2"), TW_ESTALE);
    sem_unblock();
    sem_wait_count("fs", 1);
    sem_done_flush(d, 0);
    expect_stored(d, "fs", NULL);
    ASSERT_EQ(sched_if(d, "fs", "B", t2 + 5000, "v2"), TW_ENOENT);
    sem_advance(6000);
    sem_settle(d);
    if (sem_count("fc") != 1 || sem_count("fs") != 1) {
        sem_dump("fc");
        sem_dump("fs");
    }
    ASSERT_EQ(sem_count("fc"), 1);
    ASSERT_EQ(sem_count("fs"), 1);
    cas_just_done(d);
    ASSERT_EQ(sem_early(), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* Concurrent conditional writers. */
#define WRITERS 4
#define ROUNDS 40

struct race {
    tw_durable *d;
    pthread_mutex_t mu;
    /* The successful rewrites: from the version each expected to the one
     * it wrote. */
    char from[WRITERS * ROUNDS][16], to[WRITERS * ROUNDS][16];
    int wins;
    atomic_int created; /* creates of "cc" that returned 0, per round */
    atomic_int go;
};

/* Read the current version of "ct", try to replace it with a token of our
 * own; record a win. */
static void *race_writer(void *arg)
{
    struct race *r = arg;
    int id = atomic_fetch_add(&r->go, 1);
    for (int i = 0; i < ROUNDS; i++) {
        char cur[16], mine[16];
        tw_durable_info in;
        ASSERT_EQ(tw_durable_get(r->d, "ct", 2, &in, cur, sizeof cur - 1), 0);
        ASSERT_LT(in.payload_len, sizeof cur);
        cur[in.payload_len] = 0;
        snprintf(mine, sizeof mine, "w%d-%03d", id, i);
        int rc = sched_if(r->d, "ct", cur, sem_now() + FAR, mine);
        ASSERT(rc == 0 || rc == TW_ESTALE);
        if (rc == 0) {
            pthread_mutex_lock(&r->mu);
            snprintf(r->from[r->wins], sizeof r->from[0], "%s", cur);
            snprintf(r->to[r->wins], sizeof r->to[0], "%s", mine);
            r->wins++;
            pthread_mutex_unlock(&r->mu);
        }
    }
    return NULL;
}

/* Each writer tries to create "cc" once per round. */
static void *race_creator(void *arg)
{
    struct race *r = arg;
    int rc = sched_if(r->d, "cc", NULL, sem_now() + FAR, "mine");
    ASSERT(rc == 0 || rc == TW_ESTALE);
    if (rc == 0)
        atomic_fetch_add(&r->created, 1);
    return NULL;
}

static void run_threads(struct race *r, void *(*fn)(void *))
{
    pthread_t th[WRITERS];
    atomic_store(&r->go, 0);
    for (int i = 0; i < WRITERS; i++)
        ASSERT_EQ(pthread_create(&th[i], NULL, fn, r), 0);
    for (int i = 0; i < WRITERS; i++)
        ASSERT_EQ(pthread_join(th[i], NULL), 0);
}

/* Exactly one writer wins per version: the wins form one chain from the
 * first version to the stored one, no version is replaced twice. And of
 * concurrent creates exactly one applies. */
void sem_test_cas_threads(void)
{
    static struct race r;
    memset(&r, 0, sizeof r);
    pthread_mutex_init(&r.mu, NULL);
    r.d = sem_open_new();
    ASSERT_EQ(sched_if(r.d, "ct", NULL, sem_now() + FAR, "v0"), 0);
    run_threads(&r, race_writer);
    ASSERT_GE(r.wins, 1);
    char at[16] = "v0";
    for (int step = 0; step < r.wins; step++) {
        int next = -1;
        for (int j = 0; j < r.wins; j++)
            if (!strcmp(r.from[j], at)) {
                ASSERT_EQ(next, -1); /* a version replaced twice */
                next = j;
            }
        ASSERT_NE(next, -1);
        snprintf(at, sizeof at, "%s", r.to[next]);
    }
    expect_stored(r.d, "ct", at);
    for (int round = 0; round < 10; round++) {
        atomic_store(&r.created, 0);
        run_threads(&r, race_creator);
        ASSERT_EQ(atomic_load(&r.created), 1);
        ASSERT_EQ(cancel_if(r.d, "cc", "mine"), 0);
    }
    ASSERT_EQ(sem_stats(r.d).pending, 1);
    ASSERT_EQ(tw_durable_close(r.d), 0);
    pthread_mutex_destroy(&r.mu);
}
