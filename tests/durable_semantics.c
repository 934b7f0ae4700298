/* SPDX-License-Identifier: MIT */
/*
 * tests/durable_semantics.c - the rules of twheel/durable.h that every
 * backend must meet (tests/durable_semantics.h), run on an injected clock.
 *
 * Both backends honour cfg.wall_ms and cfg.mono_ns, so "never before its
 * due time" is checked exactly: the callback compares t->due_ms with the
 * injected wall clock, which only this file moves. What cannot be injected
 * is how soon a backend's threads notice: a delivery is awaited in real
 * time for up to WAIT_MS (generous: a loaded 2-core machine, a Redis round
 * trip, the Redis claimer's period). "Never fires" is checked after
 * settle(): two sentinel timers, due at the injected "now", scheduled and
 * delivered one after the other, so every timer due by then has had a
 * claim round and a firing round in which to (wrongly) fire.
 */
#define _GNU_SOURCE

#include "durable_semantics.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "test.h"

#define WAIT_MS 30000 /* real time allowed for one expected delivery */

static const tw_sem_backend *be;
static char store_name[64];
static int store_seq;

/* ------------------------------------------------------------------------ */
/* Injected clock: wall (ms) and monotonic (ns) move together. */

static _Atomic int64_t fake_wall;
static _Atomic uint64_t fake_mono = 1000000000u;

static int64_t clk_wall(void *arg)
{
    (void)arg;
    return atomic_load(&fake_wall);
}

static uint64_t clk_mono(void *arg)
{
    (void)arg;
    return atomic_load(&fake_mono);
}

/* The wall clock first: a store that sees the monotonic clock move reads
 * the wall clock next, and must find it moved too, or it would sleep for
 * another stretch of a monotonic clock that no longer moves. */
static void advance(int64_t ms)
{
    atomic_fetch_add(&fake_wall, ms);
    atomic_fetch_add(&fake_mono, (uint64_t)ms * 1000000u);
}

static int64_t now_ms(void)
{
    return atomic_load(&fake_wall);
}

static void sleep_real_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

/* ------------------------------------------------------------------------ */
/* Deliveries, per key. The payload tells the callback what to return:
 * "R<n>x<m>..." returns n on attempts 1..m, "F..." returns -1, else 0. */

#define KEYS 64
#define ATT 8
struct rec {
    char key[32];
    char payload[32];
    uint32_t count;
    int64_t due_ms[ATT], at_ms[ATT];
    uint32_t attempt[ATT];
};
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct rec recs[KEYS];
static int nrecs;
static _Atomic int early; /* deliveries before their due time */
static int sentinels;     /* settle()'s timers delivered in this test */

static struct rec *rec_of_locked(const char *key)
{
    for (int i = 0; i < nrecs; i++)
        if (!strcmp(recs[i].key, key))
            return &recs[i];
    ASSERT_LT(nrecs, KEYS);
    struct rec *r = &recs[nrecs++];
    memset(r, 0, sizeof *r);
    snprintf(r->key, sizeof r->key, "%s", key);
    return r;
}

static void race_close(tw_durable *d);
static atomic_int self_close_rc = 1; /* a payload "X" closes its own store */
static atomic_int race_armed;        /* a payload "C" runs race_close() once */

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)arg;
    if (t->payload_len == 1 && *(const char *)t->payload == 'C' &&
        atomic_exchange(&race_armed, 0))
        race_close(d);
    if (t->payload_len == 1 && *(const char *)t->payload == 'X')
        atomic_store(&self_close_rc, tw_durable_close(d));
    int64_t at = now_ms();
    if (at < t->due_ms)
        early++;
    char key[32], pl[32];
    ASSERT_LT(t->key_len, sizeof key);
    memcpy(key, t->key, t->key_len);
    key[t->key_len] = 0;
    ASSERT_LT(t->payload_len, sizeof pl);
    if (t->payload_len)
        memcpy(pl, t->payload, t->payload_len);
    pl[t->payload_len] = 0;
    pthread_mutex_lock(&mu);
    struct rec *r = rec_of_locked(key);
    if (r->count < ATT) {
        r->due_ms[r->count] = t->due_ms;
        r->at_ms[r->count] = at;
        r->attempt[r->count] = t->attempt;
    }
    snprintf(r->payload, sizeof r->payload, "%s", pl);
    r->count++;
    pthread_mutex_unlock(&mu);
    int n, m;
    if (sscanf(pl, "R%dx%d", &n, &m) == 2 && (int)t->attempt <= m)
        return n;
    if (pl[0] == 'F')
        return -1;
    return 0;
}

static struct rec snap(const char *key)
{
    pthread_mutex_lock(&mu);
    struct rec r = *rec_of_locked(key);
    pthread_mutex_unlock(&mu);
    return r;
}

static uint32_t count_of(const char *key)
{
    return snap(key).count;
}

/* Wait in real time until @key has been delivered @n times. */
static void wait_count(const char *key, uint32_t n)
{
    for (int i = 0; i < WAIT_MS; i++) {
        if (count_of(key) >= n)
            return;
        sleep_real_ms(1);
    }
    fprintf(stderr, "%s: %s delivered %u times, want %u, after %d ms\n",
            be->name, key, count_of(key), n, WAIT_MS);
    ASSERT(0);
}

static void reset(void)
{
    pthread_mutex_lock(&mu);
    nrecs = 0;
    pthread_mutex_unlock(&mu);
    early = 0;
    sentinels = 0;
}

/* ------------------------------------------------------------------------ */
/* Stores. */

static tw_durable_config cfg_for(const char *store)
{
    tw_durable_config c;
    memset(&c, 0, sizeof c);
    c.fire = on_fire;
    c.wall_ms = clk_wall;
    c.mono_ns = clk_mono;
    be->setup(&c, store, be->arg);
    return c;
}

/* A fresh store for one test. */
static tw_durable *open_new(void)
{
    snprintf(store_name, sizeof store_name, "sem%d", ++store_seq);
    tw_durable_config c = cfg_for(store_name);
    tw_durable *d = NULL;
    ASSERT_EQ(tw_durable_open(&d, &c), 0);
    ASSERT_NOT_NULL(d);
    return d;
}

/* The same store again. */
static tw_durable *reopen(void)
{
    tw_durable_config c = cfg_for(store_name);
    tw_durable *d = NULL;
    ASSERT_EQ(tw_durable_open(&d, &c), 0);
    return d;
}

static int sched(tw_durable *d, const char *key, int64_t due, const char *pl)
{
    return tw_durable_schedule(d, key, strlen(key), due, pl, strlen(pl));
}

static int cancel(tw_durable *d, const char *key)
{
    return tw_durable_cancel(d, key, strlen(key));
}

static tw_durable_stats stats(tw_durable *d)
{
    tw_durable_stats s;
    ASSERT_EQ(tw_durable_stats_get(d, &s), 0);
    return s;
}

/* Two sentinels due now, one after the other (see the top of the file). */
static void settle(tw_durable *d)
{
    static int seq;
    for (int i = 0; i < 2; i++) {
        char k[32];
        snprintf(k, sizeof k, "sentinel%d", ++seq);
        ASSERT_EQ(sched(d, k, now_ms(), ""), 0);
        wait_count(k, 1);
        sentinels++;
    }
}

/* Wait in real time until stats.fired reaches @n: a completion may be
 * counted just after its callback returns. */
static void wait_fired(tw_durable *d, uint64_t n)
{
    tw_durable_stats s;
    for (int i = 0; i < WAIT_MS; i++) {
        ASSERT_EQ(tw_durable_stats_get(d, &s), 0);
        if (s.fired >= n)
            return;
        sleep_real_ms(1);
    }
}

/* The completions of delivered timers are in the store: at once, or for a
 * backend with TW_SEM_KNOWN_DONE_LAG once the clock has passed its delay
 * (moved by 500 ms here; stats.pending is then awaited in real time). */
static void done_flush(tw_durable *d, uint64_t want_pending)
{
    if (be->known & TW_SEM_KNOWN_DONE_LAG) {
        advance(500);
        for (int i = 0; i < WAIT_MS && stats(d).pending != want_pending; i++)
            sleep_real_ms(1);
    }
    ASSERT_EQ(stats(d).pending, want_pending);
}

/* ------------------------------------------------------------------------ */
/* The rules. */

/* Bad input: TW_EINVAL and nothing written (nothing pending, then or after
 * a reopen). */
static void test_bad_input(void)
{
    tw_durable_config c = cfg_for("bad-open");
    c.fire = NULL;
    tw_durable *d = (tw_durable *)&c; /* must stay unchanged */
    ASSERT_EQ(tw_durable_open(&d, &c), TW_EINVAL);
    ASSERT(d == (tw_durable *)&c);

    d = open_new();
    static char big[TW_DURABLE_KEY_MAX + 1];
    memset(big, 'k', sizeof big);
    int64_t due = now_ms() + 10;
    ASSERT_EQ(tw_durable_schedule(d, NULL, 1, due, "p", 1), TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule(d, "k", 0, due, "p", 1), TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule(d, big, sizeof big, due, "p", 1), TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule(d, "k", 1, due, NULL, 1), TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule(d, "k", 1, due, "p",
                                  (size_t)TW_DURABLE_PAYLOAD_MAX + 1),
              TW_EINVAL);
    ASSERT_EQ(tw_durable_cancel(d, NULL, 1), TW_EINVAL);
    ASSERT_EQ(tw_durable_cancel(d, "k", 0), TW_EINVAL);
    ASSERT_EQ(tw_durable_cancel(d, big, sizeof big), TW_EINVAL);
    ASSERT_EQ(tw_durable_stats_get(d, NULL), TW_EINVAL);
    ASSERT_EQ(tw_durable_stats_get(NULL, &(tw_durable_stats){0}), TW_EINVAL);
    /* The longest key and an empty payload are fine. */
    ASSERT_EQ(
        tw_durable_schedule(d, big, TW_DURABLE_KEY_MAX, due + 100000, NULL, 0),
        0);
    ASSERT_EQ(tw_durable_cancel(d, big, TW_DURABLE_KEY_MAX), 0);
    tw_durable_stats s = stats(d);
    ASSERT_EQ(s.pending, 0);
    advance(20);
    settle(d);
    ASSERT_EQ(count_of("k"), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    d = reopen();
    ASSERT_EQ(stats(d).pending, 0);
    settle(d);
    ASSERT_EQ(count_of("k"), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* Fires once, at or after due_ms, never before; key, payload, due, attempt
 * as scheduled. */
static void test_fires_once_not_early(void)
{
    tw_durable *d = open_new();
    int64_t t0 = now_ms();
    ASSERT_EQ(sched(d, "a", t0 + 500, "hello"), 0);
    advance(499);
    settle(d);
    ASSERT_EQ(count_of("a"), 0);
    advance(1);
    wait_count("a", 1);
    advance(1000);
    settle(d);
    struct rec r = snap("a");
    ASSERT_EQ(r.count, 1);
    ASSERT_EQ(r.attempt[0], 1);
    ASSERT_EQ(r.due_ms[0], t0 + 500);
    ASSERT_GE(r.at_ms[0], t0 + 500);
    ASSERT_STR_EQ(r.payload, "hello");
    ASSERT_EQ(early, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* Replace: new due time and payload; the old version never fires. Both
 * later and earlier. */
static void test_replace(void)
{
    tw_durable *d = open_new();
    int64_t t0 = now_ms();
    ASSERT_EQ(sched(d, "later", t0 + 300, "old"), 0);
    ASSERT_EQ(sched(d, "later", t0 + 600, "new"), 0);
    ASSERT_EQ(sched(d, "sooner", t0 + 900, "old"), 0);
    ASSERT_EQ(sched(d, "sooner", t0 + 200, "new"), 0);
    ASSERT_EQ(stats(d).pending, 2);
    advance(400);
    wait_count("sooner", 1);
    settle(d);
    ASSERT_EQ(count_of("later"), 0);
    advance(200);
    wait_count("later", 1);
    advance(1000);
    settle(d);
    struct rec a = snap("later"), b = snap("sooner");
    ASSERT_EQ(a.count, 1);
    ASSERT_EQ(a.due_ms[0], t0 + 600);
    ASSERT_STR_EQ(a.payload, "new");
    ASSERT_EQ(b.count, 1);
    ASSERT_EQ(b.due_ms[0], t0 + 200);
    ASSERT_STR_EQ(b.payload, "new");
    ASSERT_EQ(early, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* Cancel: 0 and never fires; TW_ENOENT for an unknown key, a cancelled
 * key and a key already done. */
static void test_cancel(void)
{
    tw_durable *d = open_new();
    int64_t t0 = now_ms();
    ASSERT_EQ(sched(d, "c", t0 + 100, "x"), 0);
    ASSERT_EQ(sched(d, "soon", t0 + 50, "x"), 0); /* within any horizon */
    ASSERT_EQ(cancel(d, "c"), 0);
    ASSERT_EQ(cancel(d, "soon"), 0);
    ASSERT_EQ(cancel(d, "c"), TW_ENOENT);
    ASSERT_EQ(cancel(d, "never-scheduled"), TW_ENOENT);
    ASSERT_EQ(sched(d, "done", t0 + 10, "x"), 0);
    advance(200);
    wait_count("done", 1);
    settle(d);
    ASSERT_EQ(count_of("c"), 0);
    ASSERT_EQ(count_of("soon"), 0);
    done_flush(d, 0);
    ASSERT_EQ(cancel(d, "done"), TW_ENOENT);
    tw_durable_stats s = stats(d);
    ASSERT_EQ(s.cancelled, 2);
    ASSERT_EQ(s.pending, 0);
    /* Done = its callback returned and stats.fired counts it: a cancel
     * right then finds nothing pending. */
    uint64_t fired = s.fired;
    ASSERT_EQ(sched(d, "just-done", now_ms(), "x"), 0);
    wait_count("just-done", 1);
    wait_fired(d, fired + 1);
    int rc = cancel(d, "just-done");
    if (be->known & TW_SEM_KNOWN_DONE_LAG) {
        /* KNOWN DIFFERENCE (durable_semantics.h): the completion is not in
         * the store yet (the injected monotonic clock has not moved), so
         * the cancel still finds the key: 0 and counted, not TW_ENOENT. */
        fprintf(stderr, "  known difference: cancel just after done = %d\n",
                rc);
        ASSERT_EQ(rc, 0);
        ASSERT_EQ(stats(d).cancelled, 3);
    } else {
        ASSERT_EQ(rc, TW_ENOENT);
        ASSERT_EQ(stats(d).cancelled, 2);
    }
    done_flush(d, 0);
    ASSERT_EQ(cancel(d, "just-done"), TW_ENOENT);
    advance(1000);
    settle(d);
    ASSERT_EQ(count_of("just-done"), 1); /* either way: delivered once */
    ASSERT_EQ(tw_durable_close(d), 0);
    /* Still cancelled after a reopen. */
    d = reopen();
    advance(1000);
    settle(d);
    ASSERT_EQ(count_of("c"), 0);
    ASSERT_EQ(count_of("soon"), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* tw_durable_cancel_many: each key's outcome in order (a key given twice
 * is gone the second time); the cancelled keys never fire, also after a
 * reopen; the others do. */
static void test_cancel_many(void)
{
    tw_durable *d = open_new();
    int64_t t0 = now_ms();
    ASSERT_EQ(sched(d, "ca", t0 + 100, "x"), 0);
    ASSERT_EQ(sched(d, "cb", t0 + 50, "x"), 0);
    ASSERT_EQ(sched(d, "cc", t0 + 100, "x"), 0);
    tw_durable_item it[4] = {{.key = "ca", .key_len = 2},
                             {.key = "cb", .key_len = 2},
                             {.key = "ca", .key_len = 2},
                             {.key = "cz", .key_len = 2}};
    ASSERT_EQ(tw_durable_cancel_many(d, it, 4), TW_ENOENT);
    ASSERT_EQ(it[0].result, 0);
    ASSERT_EQ(it[1].result, 0);
    ASSERT_EQ(it[2].result, TW_ENOENT);
    ASSERT_EQ(it[3].result, TW_ENOENT);
    ASSERT_EQ(stats(d).cancelled, 2);
    ASSERT_EQ(tw_durable_close(d), 0);
    d = reopen();
    advance(200);
    wait_count("cc", 1);
    settle(d);
    ASSERT_EQ(count_of("ca"), 0);
    ASSERT_EQ(count_of("cb"), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* Return n > 0: again after n ms with attempt + 1; return < 0: done. */
static void test_retry_and_fail(void)
{
    tw_durable *d = open_new();
    int64_t t0 = now_ms();
    ASSERT_EQ(sched(d, "r", t0 + 10, "R50x2"), 0); /* 50 ms, twice */
    ASSERT_EQ(sched(d, "f", t0 + 10, "F"), 0);
    advance(10);
    wait_count("r", 1);
    wait_count("f", 1);
    /* Not again before 50 ms. */
    advance(49);
    settle(d);
    ASSERT_EQ(count_of("r"), 1);
    for (uint32_t n = 2; n <= 3; n++) {
        /* Step by 10 ms: each delivery is seen at the step it became due. */
        while (count_of("r") < n) {
            advance(10);
            settle(d);
            ASSERT_LT(now_ms(), t0 + 10 + 1000);
        }
    }
    advance(1000);
    settle(d);
    done_flush(d, 0);
    struct rec r = snap("r"), f = snap("f");
    ASSERT_EQ(r.count, 3);
    for (uint32_t i = 0; i < 3; i++)
        ASSERT_EQ(r.attempt[i], i + 1);
    ASSERT_GE(r.at_ms[1], r.at_ms[0] + 50);
    ASSERT_GE(r.at_ms[2], r.at_ms[1] + 50);
    ASSERT_EQ(f.count, 1);
    ASSERT_EQ(f.attempt[0], 1);
    ASSERT_EQ(cancel(d, "r"), TW_ENOENT);
    ASSERT_EQ(cancel(d, "f"), TW_ENOENT);
    wait_fired(d, 2 + (uint64_t)sentinels);
    tw_durable_stats s = stats(d);
    ASSERT_EQ(s.retried, 2);
    ASSERT_EQ(s.fired, 2 + (uint64_t)sentinels); /* r, f and the sentinels */
    ASSERT_EQ(s.pending, 0);
    ASSERT_EQ(early, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* A timer scheduled in the past fires at once, without the clock moving. */
static void test_past_due(void)
{
    tw_durable *d = open_new();
    ASSERT_EQ(sched(d, "past", now_ms() - 10000, "p"), 0);
    wait_count("past", 1);
    struct rec r = snap("past");
    ASSERT_EQ(r.attempt[0], 1);
    ASSERT_STR_EQ(r.payload, "p");
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* The whole int64 range of due times, the same on every backend: a due
 * time at or before the clock (INT64_MIN, -1, 0, 1 included) fires at once
 * with its due_ms handed back exactly; one the clock has not reached
 * (2^53 +- 1, where a double stops being exact, INT64_MAX - 1, INT64_MAX)
 * stays pending, across a reopen, until it is cancelled. Nothing
 * overflows on the way (this suite runs under UBSan). */
static void test_int64_extremes(void)
{
    static const struct {
        const char *key;
        int64_t due;
    } past[] = {{"min", INT64_MIN},
                {"min+1", INT64_MIN + 1},
                {"-2^53", -(INT64_C(1) << 53)},
                {"-1", -1},
                {"0", 0},
                {"1", 1}},
      future[] = {{"2^53-1", (INT64_C(1) << 53) - 1},
                  {"2^53", INT64_C(1) << 53},
                  {"2^53+1", (INT64_C(1) << 53) + 1},
                  {"max-1", INT64_MAX - 1},
                  {"max", INT64_MAX}};
    size_t np = sizeof past / sizeof past[0];
    size_t nf = sizeof future / sizeof future[0];
    tw_durable *d = open_new();
    for (size_t i = 0; i < nf; i++)
        ASSERT_EQ(sched(d, future[i].key, future[i].due, "f"), 0);
    for (size_t i = 0; i < np; i++)
        ASSERT_EQ(sched(d, past[i].key, past[i].due, "p"), 0);
    for (size_t i = 0; i < np; i++)
        wait_count(past[i].key, 1);
    settle(d);
    for (size_t i = 0; i < np; i++) {
        struct rec r = snap(past[i].key);
        ASSERT_EQ(r.count, 1);
        ASSERT_EQ(r.due_ms[0], past[i].due);
        ASSERT_EQ(r.attempt[0], 1);
    }
    for (size_t i = 0; i < nf; i++)
        ASSERT_EQ(count_of(future[i].key), 0);
    done_flush(d, nf);
    ASSERT_EQ(tw_durable_close(d), 0);
    d = reopen();
    settle(d);
    done_flush(d, nf);
    for (size_t i = 0; i < np; i++)
        ASSERT_EQ(count_of(past[i].key), 1);
    for (size_t i = 0; i < nf; i++) {
        ASSERT_EQ(count_of(future[i].key), 0);
        ASSERT_EQ(cancel(d, future[i].key), 0);
    }
    ASSERT_EQ(stats(d).pending, 0);
    ASSERT_EQ(early, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* Counters: pending, fired, cancelled, retried. */
static void test_stats(void)
{
    tw_durable *d = open_new();
    int64_t t0 = now_ms();
    tw_durable_stats s = stats(d);
    ASSERT_EQ(s.pending, 0);
    ASSERT_EQ(s.fired, 0);
    ASSERT_EQ(s.cancelled, 0);
    ASSERT_EQ(s.retried, 0);
    ASSERT_EQ(sched(d, "s1", t0 + 100, ""), 0);
    ASSERT_EQ(sched(d, "s2", t0 + 100, "R10x1"), 0);
    ASSERT_EQ(sched(d, "s3", t0 + 100000, ""), 0);
    ASSERT_EQ(sched(d, "s4", t0 + 100000, ""), 0);
    ASSERT_EQ(sched(d, "s4", t0 + 200000, ""), 0); /* a replace: still 4 */
    ASSERT_EQ(stats(d).pending, 4);
    ASSERT_EQ(cancel(d, "s3"), 0);
    s = stats(d);
    ASSERT_EQ(s.pending, 3);
    ASSERT_EQ(s.cancelled, 1);
    advance(100);
    wait_count("s1", 1);
    wait_count("s2", 1);
    /* The retry is due 10 ms later; step the clock until it comes (a
     * backend with TW_SEM_KNOWN_DONE_LAG first needs its delay to pass). */
    int64_t t1 = now_ms();
    while (count_of("s2") < 2) {
        advance(10);
        settle(d);
        ASSERT_LT(now_ms(), t1 + 1000);
    }
    ASSERT_GE(snap("s2").at_ms[1], snap("s2").at_ms[0] + 10);
    wait_fired(d, 2 + (uint64_t)sentinels);
    done_flush(d, 1);
    s = stats(d);
    ASSERT_EQ(s.pending, 1);
    ASSERT_EQ(s.fired, 2 + (uint64_t)sentinels); /* s1, s2, sentinels */
    ASSERT_EQ(s.retried, 1);
    ASSERT_EQ(s.cancelled, 1);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* close leaves pending timers for the next open, which delivers them: one
 * that fell due while closed at once, one later at its time. */
static void test_close_reopen(void)
{
    tw_durable *d = open_new();
    int64_t t0 = now_ms();
    ASSERT_EQ(sched(d, "while-closed", t0 + 1000, "w"), 0);
    ASSERT_EQ(sched(d, "after", t0 + 5000, "a"), 0);
    ASSERT_EQ(sched(d, "gone", t0 + 1000, "g"), 0);
    ASSERT_EQ(cancel(d, "gone"), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    advance(2000);
    d = reopen();
    /* "after" is pending; "while-closed" too unless its overdue delivery
     * has already ended; "gone" never again. */
    uint64_t pending = stats(d).pending;
    ASSERT_GE(pending, 1);
    ASSERT_LE(pending, 2);
    wait_count("while-closed", 1);
    settle(d);
    ASSERT_EQ(count_of("after"), 0);
    advance(3000);
    wait_count("after", 1);
    advance(1000);
    settle(d);
    struct rec w = snap("while-closed"), a = snap("after");
    ASSERT_EQ(w.count, 1);
    ASSERT_STR_EQ(w.payload, "w");
    ASSERT_EQ(w.due_ms[0], t0 + 1000);
    ASSERT_EQ(a.count, 1);
    ASSERT_STR_EQ(a.payload, "a");
    ASSERT_GE(a.at_ms[0], t0 + 5000);
    ASSERT_EQ(count_of("gone"), 0);
    done_flush(d, 0);
    ASSERT_EQ(early, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* ------------------------------------------------------------------------ */
/* Calls from a callback while tw_durable_close() runs. close() waits for
 * running callbacks, so a callback may still call in after close() has
 * begun: each such call returns 0 (the change is then in the store, which
 * the next open finds) or TW_ESHUTDOWN (nothing changed), and once one has
 * returned TW_ESHUTDOWN every later call does. */

#define RACE_BATCH 4
static atomic_int race_started;
static int race_acked;        /* race0 .. race<acked-1> returned 0 */
static int race_refused = -1; /* the first that returned TW_ESHUTDOWN */
static int race_after[4];     /* cancel, schedule_many, cancel_many, sched */
static int race_items[2][RACE_BATCH];

static void race_key(char *k, size_t len, int i)
{
    snprintf(k, len, "race%d", i);
}

/* Schedules race0, race1, ... (due in an hour) until one is refused, then
 * tries each other call once. Bounded in real time, not in count. */
static void race_close(tw_durable *d)
{
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    atomic_store(&race_started, 1);
    for (int i = 0;; i++) {
        char k[32];
        race_key(k, sizeof k, i);
        int rc = sched(d, k, now_ms() + 3600 * 1000, "x");
        if (rc == TW_ESHUTDOWN) {
            race_refused = i;
            break;
        }
        ASSERT_EQ(rc, 0);
        race_acked = i + 1;
        clock_gettime(CLOCK_MONOTONIC, &t);
        ASSERT_LT((t.tv_sec - t0.tv_sec) * 1000, WAIT_MS);
    }
    race_after[0] = cancel(d, "race0");
    tw_durable_item it[RACE_BATCH];
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < RACE_BATCH; i++)
            it[i] = (tw_durable_item){"race0", 5, now_ms() + 1000, "y", 1, 1};
        race_after[1 + pass] =
            pass ? tw_durable_cancel_many(d, it, RACE_BATCH)
                 : tw_durable_schedule_many(d, it, RACE_BATCH);
        for (int i = 0; i < RACE_BATCH; i++)
            race_items[pass][i] = it[i].result;
    }
    race_after[3] = sched(d, "race-late", now_ms(), "z");
}

static void test_calls_during_close(void)
{
    tw_durable *d = open_new();
    atomic_store(&race_started, 0);
    race_acked = 0;
    race_refused = -1;
    atomic_store(&race_armed, 1);
    ASSERT_EQ(sched(d, "closer", now_ms(), "C"), 0);
    for (int i = 0; i < WAIT_MS && !atomic_load(&race_started); i++)
        sleep_real_ms(1);
    ASSERT(atomic_load(&race_started));
    ASSERT_EQ(tw_durable_close(d), 0); /* returns after the callback */
    fprintf(stderr, "(%d calls acknowledged before the refusal) ", race_acked);
    ASSERT_EQ(race_refused, race_acked);
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(race_after[i], TW_ESHUTDOWN);
    for (int p = 0; p < 2; p++)
        for (int i = 0; i < RACE_BATCH; i++)
            ASSERT_EQ(race_items[p][i], TW_ESHUTDOWN);
    /* The next open has every acknowledged key (race0 too: its cancel was
     * refused) and not the refused ones. */
    d = reopen();
    tw_durable_item it[256];
    char keys[256][32];
    for (int base = 0; base <= race_acked; base += 256) {
        int n = race_acked + 1 - base < 256 ? race_acked + 1 - base : 256;
        for (int i = 0; i < n; i++) {
            race_key(keys[i], sizeof keys[i], base + i);
            it[i] = (tw_durable_item){keys[i], strlen(keys[i]), 0, NULL, 0, 1};
        }
        tw_durable_cancel_many(d, it, (size_t)n);
        for (int i = 0; i < n; i++)
            ASSERT_EQ(it[i].result, base + i < race_acked ? 0 : TW_ENOENT);
    }
    ASSERT_EQ(cancel(d, "race-late"), TW_ENOENT);
    settle(d);
    ASSERT_EQ(early, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* close() from inside the store's own callback would wait for itself:
 * TW_EDEADLK, and the store goes on as if it had not been called. */
static void test_close_from_callback(void)
{
    tw_durable *d = open_new();
    atomic_store(&self_close_rc, 1);
    ASSERT_EQ(sched(d, "self-close", now_ms(), "X"), 0);
    wait_count("self-close", 1);
    for (int i = 0; i < WAIT_MS && atomic_load(&self_close_rc) == 1; i++)
        sleep_real_ms(1);
    ASSERT_EQ(atomic_load(&self_close_rc), TW_EDEADLK);
    ASSERT_EQ(sched(d, "after-self-close", now_ms(), "a"), 0);
    wait_count("after-self-close", 1);
    settle(d);
    ASSERT_EQ(count_of("self-close"), 1);
    ASSERT_EQ(tw_durable_close(d), 0);
}

#define RUN(fn)                                                                \
    do {                                                                       \
        reset();                                                               \
        fprintf(stderr, "[%s] ", be->name);                                    \
        RUN_TEST(fn);                                                          \
    } while (0)

int tw_sem_run(const tw_sem_backend *b)
{
    be = b;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    atomic_store(&fake_wall, (int64_t)ts.tv_sec * 1000);
    RUN(test_bad_input);
    RUN(test_fires_once_not_early);
    RUN(test_replace);
    RUN(test_cancel);
    RUN(test_cancel_many);
    RUN(test_retry_and_fail);
    RUN(test_past_due);
    RUN(test_int64_extremes);
    RUN(test_stats);
    RUN(test_close_reopen);
    RUN(test_calls_during_close);
    RUN(test_close_from_callback);
    return tw_test_done();
}
