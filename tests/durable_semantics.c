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
#include "durable_semantics_impl.h"

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
 * "R<n>x<m>..." returns n on attempts 1..m, "F..." returns -1, "D"
 * TW_DURABLE_FIRE_DEAD, "Y" TW_DURABLE_FIRE_RETRY, else 0. */

#define KEYS 64
#define ATT 8
struct rec {
    char key[32];
    char payload[32];
    uint32_t count;
    int64_t due_ms[ATT], at_ms[ATT];
    uint32_t attempt[ATT];
    uint64_t token[ATT];
    int64_t real_ms[ATT]; /* CLOCK_REALTIME at the callback */
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

/* A payload "B" holds its callback until unblock(). */
static atomic_int blocked, unblocked;
/* A payload "K" (touch) or "N" (no touch) holds its callback until
 * unblocked, counting its deliveries as they begin; "K" calls
 * tw_durable_touch() on its key every millisecond of real time. */
static atomic_int entered_k, entered_n, touches, touch_rc;
static void sleep_real_ms(int ms);
/* A payload "P" waits for a second "P" to be inside its callback at the
 * same time, at most PAIR_WAIT_MS of real time; pair_alone counts those
 * that waited in vain. */
#define PAIR_WAIT_MS 10000
static atomic_int pair_in, pair_alone;

static void pair_here(void)
{
    atomic_fetch_add(&pair_in, 1);
    int i = 0;
    while (atomic_load(&pair_in) < 2 && i++ < PAIR_WAIT_MS)
        sleep_real_ms(1);
    if (atomic_load(&pair_in) < 2)
        atomic_fetch_add(&pair_alone, 1);
}

static void block_here(void)
{
    atomic_store(&blocked, 1);
    while (!atomic_load(&unblocked))
        sleep_real_ms(1);
}

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)arg;
    if (t->payload_len == 1 && *(const char *)t->payload == 'C' &&
        atomic_exchange(&race_armed, 0))
        race_close(d);
    if (t->payload_len == 1 && *(const char *)t->payload == 'X')
        atomic_store(&self_close_rc, tw_durable_close(d));
    if (t->payload_len == 1 && *(const char *)t->payload == 'B')
        block_here();
    if (t->payload_len == 1 && *(const char *)t->payload == 'P')
        pair_here();
    if (t->payload_len == 1 && *(const char *)t->payload == 'K') {
        atomic_fetch_add(&entered_k, 1);
        while (!atomic_load(&unblocked)) {
            atomic_store(&touch_rc, tw_durable_touch(d, t->key, t->key_len));
            atomic_fetch_add(&touches, 1);
            sleep_real_ms(1);
        }
    }
    if (t->payload_len == 1 && *(const char *)t->payload == 'N') {
        atomic_fetch_add(&entered_n, 1);
        while (!atomic_load(&unblocked))
            sleep_real_ms(1);
    }
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
        r->token[r->count] = t->token;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r->real_ms[r->count] = ts.tv_sec * 1000LL + ts.tv_nsec / 1000000;
    }
    snprintf(r->payload, sizeof r->payload, "%s", pl);
    r->count++;
    pthread_mutex_unlock(&mu);
    int n, m;
    /* TW_SEM_SLOW_RETURN_MS=N: every callback returns N ms of real time
     * after its delivery was counted, so that a test that reads the store
     * or moves the clock before the callback returned fails (the
     * test_durable_semantics_slow CTest entry). */
    static atomic_int slow = -1;
    if (atomic_load(&slow) < 0) {
        const char *e = getenv("TW_SEM_SLOW_RETURN_MS");
        atomic_store(&slow, e ? atoi(e) : 0);
    }
    if (atomic_load(&slow) > 0)
        sleep_real_ms(atomic_load(&slow));
    if (sscanf(pl, "R%dx%d", &n, &m) == 2 && (int)t->attempt <= m)
        return n;
    if (pl[0] == 'F')
        return -1;
    if (!strcmp(pl, "D"))
        return TW_DURABLE_FIRE_DEAD;
    if (!strcmp(pl, "Y"))
        return TW_DURABLE_FIRE_RETRY;
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

/* The retry policy and lease of the stores a test opens (reset()). */
static tw_durable_config pol;

static void reset(void)
{
    memset(&pol, 0, sizeof pol);
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
    c.max_attempts = pol.max_attempts;
    c.retry_ms = pol.retry_ms;
    c.retry_max_ms = pol.retry_max_ms;
    c.retry_jitter_pct = pol.retry_jitter_pct;
    c.executor_threads = pol.executor_threads;
    if (pol.lease_ms)
        c.lease_ms = pol.lease_ms;
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
    /* A delivery is counted as its callback starts; its completion is
     * queued when the callback returns. */
    for (int i = 0; i < WAIT_MS && stats(d).running; i++)
        sleep_real_ms(1);
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

/* Timer @key (due now) calls close() from its callback: TW_EDEADLK. */
static void close_from_callback(tw_durable *d, const char *key)
{
    atomic_store(&self_close_rc, 1);
    ASSERT_EQ(sched(d, key, now_ms(), "X"), 0);
    wait_count(key, 1);
    for (int i = 0; i < WAIT_MS && atomic_load(&self_close_rc) == 1; i++)
        sleep_real_ms(1);
    ASSERT_EQ(atomic_load(&self_close_rc), TW_EDEADLK);
}

/* close() from inside the store's own callback would wait for itself:
 * TW_EDEADLK, and the store goes on as if it had not been called. */
static void test_close_from_callback(void)
{
    tw_durable *d = open_new();
    close_from_callback(d, "self-close");
    ASSERT_EQ(sched(d, "after-self-close", now_ms(), "a"), 0);
    wait_count("after-self-close", 1);
    settle(d);
    ASSERT_EQ(count_of("self-close"), 1);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* executor_threads: callbacks run on that many threads of their own, so
 * two due timers whose callbacks each wait for the other both get in (run
 * one after the other on one thread, the first waits PAIR_WAIT_MS in vain
 * and the test fails). close() from a callback on an executor is
 * TW_EDEADLK there too. */
static void test_executor_threads(void)
{
    pol.executor_threads = 2;
    tw_durable *d = open_new();
    atomic_store(&pair_in, 0);
    atomic_store(&pair_alone, 0);
    int64_t t0 = now_ms();
    ASSERT_EQ(sched(d, "pair1", t0 + 10, "P"), 0);
    ASSERT_EQ(sched(d, "pair2", t0 + 10, "P"), 0);
    advance(10);
    wait_count("pair1", 1);
    wait_count("pair2", 1);
    ASSERT_EQ(atomic_load(&pair_alone), 0);
    close_from_callback(d, "exec-self-close");
    settle(d);
    ASSERT_EQ(early, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* ------------------------------------------------------------------------ */
/* Look-up and listing. */

static int get(tw_durable *d, const char *key, tw_durable_info *info, char *buf,
               size_t len)
{
    return tw_durable_get(d, key, strlen(key), info, buf, len);
}

/* Wait in real time until get(@key) shows it WAITING with @attempt, or
 * fails with TW_ENOENT when @attempt is 0 (a completion may reach the
 * store a little after its callback returned). */
static void wait_get(tw_durable *d, const char *key, uint32_t attempt)
{
    tw_durable_info in;
    for (int i = 0; i < WAIT_MS; i++) {
        int rc = get(d, key, &in, NULL, 0);
        if (attempt ? rc == 0 && in.attempt == attempt &&
                          in.state == TW_DURABLE_WAITING
                    : rc == TW_ENOENT)
            return;
        sleep_real_ms(1);
    }
    int rc = get(d, key, &in, NULL, 0);
    fprintf(stderr,
            "%s: get(%s) never showed attempt %u: %d, attempt %u, state %u, "
            "due %lld, now %lld\n",
            be->name, key, attempt, rc, in.attempt, in.state,
            (long long)in.due_ms, (long long)now_ms());
    ASSERT(0);
}

/* tw_durable_get: due time, attempt, state and payload into the caller's
 * buffer with its full length; TW_ENOENT once cancelled or completed. */
static void test_get(void)
{
    tw_durable *d = open_new();
    int64_t t0 = now_ms();
    tw_durable_info in;
    char buf[16];
    ASSERT_EQ(get(d, "g1", &in, buf, sizeof buf), TW_ENOENT);
    ASSERT_EQ(sched(d, "g1", t0 + 100000, "hello"), 0);
    memset(buf, '#', sizeof buf);
    ASSERT_EQ(get(d, "g1", &in, buf, sizeof buf), 0);
    ASSERT_EQ(in.due_ms, t0 + 100000);
    ASSERT_EQ(in.attempt, 1);
    ASSERT_EQ(in.state, TW_DURABLE_WAITING);
    ASSERT_EQ(in.payload_len, 5);
    ASSERT(!memcmp(buf, "hello#", 6));
    /* A short buffer gets what fits and the full length. */
    memset(buf, '#', sizeof buf);
    ASSERT_EQ(get(d, "g1", &in, buf, 2), 0);
    ASSERT_EQ(in.payload_len, 5);
    ASSERT(!memcmp(buf, "he#", 3));
    ASSERT_EQ(get(d, "g1", &in, NULL, 0), 0);
    ASSERT_EQ(in.payload_len, 5);
    /* Bad arguments. */
    ASSERT_EQ(tw_durable_get(d, "g1", 2, NULL, NULL, 0), TW_EINVAL);
    ASSERT_EQ(tw_durable_get(d, "g1", 0, &in, NULL, 0), TW_EINVAL);
    ASSERT_EQ(tw_durable_get(d, NULL, 2, &in, NULL, 0), TW_EINVAL);
    ASSERT_EQ(tw_durable_get(d, "g1", 2, &in, NULL, 4), TW_EINVAL);
    ASSERT_EQ(tw_durable_get(NULL, "g1", 2, &in, NULL, 0), TW_EINVAL);
    /* A replace shows the new version; a cancel ends it. */
    ASSERT_EQ(sched(d, "g1", t0 + 200000, ""), 0);
    ASSERT_EQ(get(d, "g1", &in, buf, sizeof buf), 0);
    ASSERT_EQ(in.due_ms, t0 + 200000);
    ASSERT_EQ(in.payload_len, 0);
    ASSERT_EQ(cancel(d, "g1"), 0);
    ASSERT_EQ(get(d, "g1", &in, buf, sizeof buf), TW_ENOENT);
    /* A retry is the same key again, with a new due time and attempt. */
    ASSERT_EQ(sched(d, "g2", t0 + 50, "R1000x1"), 0);
    advance(50);
    wait_count("g2", 1);
    /* The retry: attempt 2, due 1000 ms after that delivery (a backend
     * with TW_SEM_KNOWN_DONE_LAG writes it within 100 ms of its clock). */
    for (int i = 0; i < WAIT_MS && stats(d).retried < 1; i++)
        sleep_real_ms(1); /* the callback has returned: its retry is queued */
    advance(150);
    wait_get(d, "g2", 2);
    ASSERT_EQ(get(d, "g2", &in, buf, sizeof buf), 0);
    /* 1000 ms after the callback returned: the journal counts from its
     * return, Redis from when its completion arrived (here the injected
     * clock stands still in between, except the 150 ms step). */
    ASSERT_GE(in.due_ms, snap("g2").at_ms[0] + 1000);
    ASSERT_LE(in.due_ms, now_ms() + 1000);
    ASSERT_EQ(in.state, TW_DURABLE_WAITING);
    ASSERT_EQ(in.payload_len, 7);
    ASSERT(!memcmp(buf, "R1000x1", 7));
    advance(1000);
    wait_count("g2", 2);
    /* The count grows as the callback starts: wait for its return, so
     * that the completion it queues is due by the clock advanced below
     * (queued after the advance, it would wait for a clock that no longer
     * moves, and the claim would run out by Redis's clock meanwhile). */
    for (int i = 0; i < WAIT_MS && stats(d).running; i++)
        sleep_real_ms(1);
    ASSERT_EQ(stats(d).running, 0);
    advance(500);
    wait_get(d, "g2", 0);
    ASSERT_EQ(early, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* A running callback: stats.running counts it, get and list show DUE. */
static void test_running_state(void)
{
    tw_durable *d = open_new();
    int64_t t0 = now_ms();
    atomic_store(&blocked, 0);
    atomic_store(&unblocked, 0);
    ASSERT_EQ(stats(d).running, 0);
    ASSERT_EQ(sched(d, "run", t0 + 10, "B"), 0);
    ASSERT_EQ(sched(d, "later", t0 + 100000, ""), 0);
    advance(10);
    for (int i = 0; i < WAIT_MS && !atomic_load(&blocked); i++)
        sleep_real_ms(1);
    ASSERT(atomic_load(&blocked));
    ASSERT_EQ(stats(d).running, 1);
    tw_durable_info in;
    ASSERT_EQ(get(d, "run", &in, NULL, 0), 0);
    ASSERT_EQ(in.state, TW_DURABLE_DUE);
    tw_durable_cursor c = TW_DURABLE_CURSOR_INIT;
    tw_durable_entry e[4];
    char kb[TW_DURABLE_KEY_MAX];
    ASSERT_EQ(tw_durable_list(d, 0, INT64_MAX, &c, e, 4, kb, sizeof kb), 2);
    ASSERT_EQ(e[0].key_len, 3);
    ASSERT(!memcmp(e[0].key, "run", 3));
    ASSERT_EQ(e[0].due_ms, t0 + 10);
    ASSERT_EQ(e[0].state, TW_DURABLE_DUE);
    ASSERT_EQ(e[1].state, TW_DURABLE_WAITING);
    ASSERT_EQ(c.done, 1);
    atomic_store(&unblocked, 1);
    wait_count("run", 1);
    wait_fired(d, 1);
    for (int i = 0; i < WAIT_MS && stats(d).running; i++)
        sleep_real_ms(1);
    ASSERT_EQ(stats(d).running, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* The expected listing: keys in (due, key bytes) order. */
struct want {
    const char *key;
    int64_t due;
};

static int want_cmp(const void *a, const void *b)
{
    const struct want *x = a, *y = b;
    if (x->due != y->due)
        return x->due < y->due ? -1 : 1;
    size_t lx = strlen(x->key), ly = strlen(y->key);
    int c = memcmp(x->key, y->key, lx < ly ? lx : ly);
    return c ? c : (lx > ly) - (lx < ly);
}

/* Page through [@from, @to) @page entries at a time from *@c, to the end
 * or until @stop_after entries; check the entries against @w[0 .. @n) in
 * order; returns how many were read. */
static size_t list_check(tw_durable *d, tw_durable_cursor *c, int64_t from,
                         int64_t to, size_t page, const struct want *w,
                         size_t n, size_t stop_after)
{
    tw_durable_entry e[16];
    char kb[TW_DURABLE_KEY_MAX];
    size_t got = 0;
    ASSERT_LE(page, 16);
    while (!c->done && got < stop_after) {
        int k = tw_durable_list(d, from, to, c, e, page, kb, sizeof kb);
        ASSERT_GE(k, 0);
        ASSERT_LE((size_t)k, page);
        for (int i = 0; i < k; i++, got++) {
            ASSERT_LT(got, n);
            size_t len = strlen(w[got].key);
            if (e[i].key_len != len || memcmp(e[i].key, w[got].key, len) ||
                e[i].due_ms != w[got].due)
                fprintf(
                    stderr, "%s: entry %zu: %.*s at %lld, want %s at %lld\n",
                    be->name, got, (int)e[i].key_len, (const char *)e[i].key,
                    (long long)e[i].due_ms, w[got].key, (long long)w[got].due);
            ASSERT_EQ(e[i].key_len, len);
            ASSERT(!memcmp(e[i].key, w[got].key, len));
            ASSERT_EQ(e[i].due_ms, w[got].due);
        }
        if (!c->done)
            ASSERT_EQ((size_t)k, page);
    }
    return got;
}

/* Keys in (due, key bytes) order, both near (a Redis node has claimed
 * them) and far; ties broken by bytes whatever the locale; the range's
 * ends; pages of every size; a key buffer too short. */
static void test_list_order(void)
{
    tw_durable *d = open_new();
    int64_t t0 = now_ms();
    static const char *const tie[] = {"m\x80", "m", "m\x7f", "mA", "m\x01"};
    struct want w[64];
    size_t n = 0;
    for (int i = 0; i < 5; i++) { /* near, due together */
        w[n] = (struct want){tie[i], t0 + 200};
        ASSERT_EQ(sched(d, w[n].key, w[n].due, ""), 0);
        n++;
    }
    static char names[40][16];
    for (int i = 0; i < 40; i++) { /* far, some due together */
        snprintf(names[i], sizeof names[i], "f%02d", (i * 7) % 40);
        w[n] = (struct want){names[i], t0 + 100000 + (i % 13) * 1000};
        ASSERT_EQ(sched(d, w[n].key, w[n].due, ""), 0);
        n++;
    }
    ASSERT_EQ(sched(d, "before", t0 + 199, ""), 0);   /* before from */
    ASSERT_EQ(sched(d, "at-to", t0 + 200000, ""), 0); /* at to: excluded */
    qsort(w, n, sizeof *w, want_cmp);
    for (size_t page = 1; page <= 16; page += 5) {
        tw_durable_cursor c = TW_DURABLE_CURSOR_INIT;
        ASSERT_EQ(
            list_check(d, &c, t0 + 200, t0 + 200000, page, w, n, SIZE_MAX), n);
        ASSERT_EQ(c.done, 1);
    }
    /* An empty range, a key buffer that fits no key, bad arguments. */
    tw_durable_cursor c = TW_DURABLE_CURSOR_INIT;
    tw_durable_entry e[8];
    char kb[TW_DURABLE_KEY_MAX];
    ASSERT_EQ(tw_durable_list(d, t0, t0, &c, e, 2, kb, sizeof kb), 0);
    ASSERT_EQ(c.done, 1);
    c = (tw_durable_cursor)TW_DURABLE_CURSOR_INIT;
    ASSERT_EQ(tw_durable_list(d, t0, t0 + 200000, &c, e, 2, kb, 3), TW_EINVAL);
    ASSERT_EQ(c.key_len, 0);
    /* "m" and "m\x01" fit 4 bytes, "m\x7f" no longer does. */
    ASSERT_EQ(tw_durable_list(d, t0 + 200, t0 + 200000, &c, e, 8, kb, 4), 2);
    ASSERT_EQ(c.done, 0);
    ASSERT_EQ(e[0].key_len, 1);
    ASSERT_EQ(e[1].key_len, 2);
    ASSERT(!memcmp(e[1].key, "m\x01", 2));
    ASSERT_EQ(tw_durable_list(d, t0, t0 + 1, &c, e, 0, kb, 4), TW_EINVAL);
    ASSERT_EQ(tw_durable_list(d, t0, t0 + 1, NULL, e, 2, kb, 4), TW_EINVAL);
    ASSERT_EQ(tw_durable_list(d, t0, t0 + 1, &c, NULL, 2, kb, 4), TW_EINVAL);
    ASSERT_EQ(tw_durable_list(d, t0, t0 + 1, &c, e, 2, NULL, 4), TW_EINVAL);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* What an iteration sees while timers are scheduled, moved, cancelled
 * and fired between its pages (durable.h): what stays ahead of the cursor
 * once, what moves ahead again at its new place, nothing that went
 * behind it, was cancelled or completed. */
static void test_list_concurrent(void)
{
    tw_durable *d = open_new();
    /* k00 .. k09 near (a Redis node claims them at once), k10 .. k19
     * far. */
    int64_t t0 = now_ms(), b = t0 + 100, far = t0 + 100000;
    char k[20][16];
    for (int i = 0; i < 20; i++) {
        snprintf(k[i], sizeof k[i], "k%02d", i);
        ASSERT_EQ(sched(d, k[i], (i < 10 ? b : far) + i * 10, ""), 0);
    }
    struct want first[5];
    for (int i = 0; i < 5; i++)
        first[i] = (struct want){k[i], b + i * 10};
    tw_durable_cursor c = TW_DURABLE_CURSOR_INIT;
    ASSERT_EQ(list_check(d, &c, 0, INT64_MAX, 5, first, 5, 5), 5);
    ASSERT_EQ(c.done, 0);
    ASSERT_EQ(cancel(d, "k07"), 0);
    ASSERT_EQ(sched(d, "new-behind", b + 15, ""), 0);
    ASSERT_EQ(sched(d, "new-ahead", b + 75, ""), 0);
    ASSERT_EQ(sched(d, "k02", far + 195, ""), 0); /* behind -> ahead */
    ASSERT_EQ(sched(d, "k10", b + 5, ""), 0);     /* ahead -> behind */
    /* Fire everything due by b + 90: k00 .. k09 but k07 (k02 moved),
     * new-behind, new-ahead and k10. */
    advance(b + 90 - t0);
    const char *fired[] = {"k00",        "k01",       "k03", "k04",
                           "k05",        "k06",       "k08", "k09",
                           "new-behind", "new-ahead", "k10"};
    for (size_t i = 0; i < sizeof fired / sizeof *fired; i++)
        wait_count(fired[i], 1);
    wait_fired(d, 11);
    done_flush(d, 10); /* k11 .. k19, k02 */
    struct want rest[10];
    for (int i = 0; i < 9; i++)
        rest[i] = (struct want){k[11 + i], far + (11 + i) * 10};
    rest[9] = (struct want){"k02", far + 195};
    ASSERT_EQ(list_check(d, &c, 0, INT64_MAX, 4, rest, 10, SIZE_MAX), 10);
    ASSERT_EQ(c.done, 1);
    ASSERT_EQ(count_of("k07"), 0);
    ASSERT_EQ(early, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* A cursor is plain data: it resumes after a close and reopen. */
static void test_list_reopen(void)
{
    tw_durable *d = open_new();
    int64_t t0 = now_ms();
    struct want w[12];
    static char names[12][16];
    for (int i = 0; i < 12; i++) {
        snprintf(names[i], sizeof names[i], "r%02d", i);
        w[i] = (struct want){names[i], t0 + 100000 + (i / 3) * 1000};
        ASSERT_EQ(sched(d, names[i], w[i].due, "x"), 0);
    }
    tw_durable_cursor c = TW_DURABLE_CURSOR_INIT;
    ASSERT_EQ(list_check(d, &c, t0, INT64_MAX, 4, w, 12, 4), 4);
    tw_durable_cursor saved = c;
    ASSERT_EQ(tw_durable_close(d), 0);
    d = reopen();
    ASSERT_EQ(list_check(d, &saved, t0, INT64_MAX, 3, w + 4, 8, SIZE_MAX), 8);
    ASSERT_EQ(saved.done, 1);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* Metrics: the stats as exposition text, snprintf-style into a buffer
 * (the length it needs when cut), the same text to a FILE *, labels on
 * every sample, bad labels refused. (tests/metrics_scrape.py parses it
 * with prometheus_client's parsers.) */
static void test_metrics(void)
{
    tw_durable *d = open_new();
    int64_t t0 = now_ms();
    ASSERT_EQ(sched(d, "m1", t0 + 100000, ""), 0);
    ASSERT_EQ(sched(d, "m2", t0 + 100000, ""), 0);
    ASSERT_EQ(sched(d, "m3", t0, ""), 0);
    wait_count("m3", 1);
    wait_fired(d, 1);
    done_flush(d, 2);
    static char buf[16384], cut[64];
    long n = tw_durable_metrics(d, "store=\"a\\\"b\"", 0, buf, sizeof buf);
    ASSERT_GT(n, 0);
    ASSERT_LT(n, (long)sizeof buf);
    ASSERT_EQ((long)strlen(buf), n);
    ASSERT_NOT_NULL(
        strstr(buf, "\ntwheel_durable_pending{store=\"a\\\"b\"} 2\n"));
    ASSERT_NOT_NULL(
        strstr(buf, "\ntwheel_durable_fired_total{store=\"a\\\"b\"} 1\n"));
    ASSERT_NOT_NULL(strstr(buf, "# TYPE twheel_durable_fired_total counter\n"));
    ASSERT_NOT_NULL(strstr(buf, "twheel_durable_lateness_seconds_bucket{"
                                "store=\"a\\\"b\",le=\"+Inf\"} 1\n"));
    ASSERT_NOT_NULL(strstr(buf, "twheel_durable_lateness_seconds_count{store="
                                "\"a\\\"b\"} 1\n"));
    ASSERT_NULL(strstr(buf, "# EOF"));
    /* Cut: the same length back, the start of the same text, NUL-ended. */
    ASSERT_EQ(tw_durable_metrics(d, "store=\"a\\\"b\"", 0, cut, sizeof cut), n);
    ASSERT_EQ(strlen(cut), sizeof cut - 1);
    ASSERT(!memcmp(cut, buf, sizeof cut - 1));
    /* No buffer: just the length (shorter without the labels). */
    long plain = tw_durable_metrics(d, NULL, 0, NULL, 0);
    ASSERT_GT(plain, 0);
    ASSERT_LT(plain, n);
    /* OpenMetrics: counter families named without _total, "# EOF" last. */
    long m = tw_durable_metrics(d, NULL, TW_DURABLE_METRICS_OPENMETRICS, buf,
                                sizeof buf);
    ASSERT_GT(m, 6);
    ASSERT_STR_EQ(buf + m - 6, "# EOF\n");
    ASSERT_NOT_NULL(strstr(buf, "# TYPE twheel_durable_fired counter\n"));
    ASSERT_NOT_NULL(strstr(buf, "\ntwheel_durable_fired_total 1\n"));
    ASSERT_NOT_NULL(strstr(buf, "# TYPE twheel_durable_errors counter\n"));
    ASSERT_NOT_NULL(strstr(buf, "\ntwheel_durable_errors_total 0\n"));
    /* A FILE gets the same text as the buffer. */
    FILE *f = tmpfile();
    ASSERT_NOT_NULL(f);
    ASSERT_EQ(
        tw_durable_metrics_fprint(d, NULL, TW_DURABLE_METRICS_OPENMETRICS, f),
        0);
    ASSERT_EQ(ftell(f), m);
    static char back[16384];
    rewind(f);
    ASSERT_EQ(fread(back, 1, sizeof back, f), (size_t)m);
    ASSERT(!memcmp(back, buf, (size_t)m));
    fclose(f);
    /* Bad labels and arguments. */
    static const char *const bad[] = {"",         "a",         "a=b",
                                      "a=\"b",    "1a=\"b\"",  "a=\"b\",",
                                      "a=\"b\"c", "a=\"\\x\"", "a=\"\n\""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ASSERT_EQ(tw_durable_metrics(d, bad[i], 0, buf, sizeof buf), TW_EINVAL);
    ASSERT_EQ(
        tw_durable_metrics(d, "a=\"\",b_2=\"\\n\\\\\"", 0, buf, sizeof buf) > 0,
        1);
    ASSERT_EQ(tw_durable_metrics(d, NULL, 2, buf, sizeof buf), TW_EINVAL);
    ASSERT_EQ(tw_durable_metrics(d, NULL, 0, NULL, 1), TW_EINVAL);
    ASSERT_EQ(tw_durable_metrics(NULL, NULL, 0, buf, sizeof buf), TW_EINVAL);
    ASSERT_EQ(tw_durable_metrics_fprint(d, NULL, 0, NULL), TW_EINVAL);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* TW_DURABLE_READONLY: a second handle on a store that is open (the
 * journal takes no lock for it) sees its timers, refuses every change and
 * delivers nothing, while the store runs on. */
static void test_readonly(void)
{
    tw_durable *d = open_new();
    int64_t t0 = now_ms();
    ASSERT_EQ(sched(d, "ro-far", t0 + 100000, "f"), 0);
    ASSERT_EQ(sched(d, "ro-cancelled", t0 + 100000, "c"), 0);
    ASSERT_EQ(cancel(d, "ro-cancelled"), 0);
    tw_durable_config c = cfg_for(store_name);
    c.flags = TW_DURABLE_READONLY;
    tw_durable *r = NULL;
    ASSERT_EQ(tw_durable_open(&r, &c), 0);
    tw_durable_info in;
    char buf[8];
    ASSERT_EQ(get(r, "ro-far", &in, buf, sizeof buf), 0);
    ASSERT_EQ(in.due_ms, t0 + 100000);
    ASSERT_EQ(get(r, "ro-cancelled", &in, NULL, 0), TW_ENOENT);
    ASSERT_EQ(stats(r).pending, 1);
    ASSERT_EQ(sched(r, "ro-new", t0, ""), TW_EROFS);
    ASSERT_EQ(cancel(r, "ro-far"), TW_EROFS);
    tw_durable_item it = {"ro-far", 6, t0, NULL, 0, 0};
    ASSERT_EQ(tw_durable_schedule_many(r, &it, 1), TW_EROFS);
    ASSERT_EQ(tw_durable_cancel_many(r, &it, 1), TW_EROFS);
    ASSERT_EQ(tw_durable_schedule_if(r, "ro-far", 6, "f", 1, t0, "g", 1),
              TW_EROFS);
    ASSERT_EQ(tw_durable_cancel_if(r, "ro-far", 6, "f", 1), TW_EROFS);
    tw_durable_item_if ii = {"ro-far", 6, t0, NULL, 0, "f", 1, 0};
    ASSERT_EQ(tw_durable_schedule_many_if(r, &ii, 1), TW_EROFS);
    ASSERT_EQ(tw_durable_cancel_many_if(r, &ii, 1), TW_EROFS);
    /* The read-only handle delivers nothing: "ro-now" fires once, by d. */
    ASSERT_EQ(sched(d, "ro-now", t0, ""), 0);
    wait_count("ro-now", 1);
    settle(d);
    ASSERT_EQ(count_of("ro-now"), 1);
    ASSERT_EQ(get(d, "ro-far", &in, NULL, 0), 0);
    ASSERT_EQ(tw_durable_close(r), 0);
    ASSERT_EQ(sched(d, "ro-after", t0 + 100000, ""), 0);
    done_flush(d, 2);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* Due times at the ends of int64 list in order with the rest, exactly
 * below 2^53 (Redis orders larger ones to within a double's precision);
 * INT64_MAX is in the range that ends at INT64_MAX. */
static void test_list_extremes(void)
{
    tw_durable *d = open_new();
    int64_t t0 = now_ms();
    const int64_t p53 = INT64_C(1) << 53;
    ASSERT_EQ(sched(d, "x-max", INT64_MAX, ""), 0);
    ASSERT_EQ(sched(d, "x-big", p53 + 1, ""), 0);
    ASSERT_EQ(sched(d, "x-53", p53 - 1, ""), 0);
    ASSERT_EQ(sched(d, "x-far", t0 + 100000, ""), 0);
    tw_durable_cursor c = TW_DURABLE_CURSOR_INIT;
    tw_durable_entry e[8];
    char kb[TW_DURABLE_KEY_MAX];
    ASSERT_EQ(tw_durable_list(d, t0, INT64_MAX, &c, e, 8, kb, sizeof kb), 4);
    ASSERT_EQ(c.done, 1);
    static const char *const order[] = {"x-far", "x-53", "x-big", "x-max"};
    for (int i = 0; i < 4; i++) {
        ASSERT_EQ(e[i].key_len, strlen(order[i]));
        ASSERT(!memcmp(e[i].key, order[i], e[i].key_len));
    }
    ASSERT_EQ(e[0].due_ms, t0 + 100000);
    ASSERT_EQ(e[1].due_ms, p53 - 1);
    ASSERT_GE(e[2].due_ms, p53);
    ASSERT_EQ(e[3].due_ms, INT64_MAX);
    /* A range that ends below INT64_MAX leaves it out. */
    c = (tw_durable_cursor)TW_DURABLE_CURSOR_INIT;
    ASSERT_EQ(tw_durable_list(d, t0, INT64_MAX - 1, &c, e, 8, kb, sizeof kb),
              3);
    tw_durable_info in;
    ASSERT_EQ(get(d, "x-big", &in, NULL, 0), 0);
    ASSERT_EQ(in.due_ms, p53 + 1); /* get is exact on both */
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* tw_durable_scan: every timer once with its payload, due time, attempt
 * and state; not the old version of a replaced key, nor a cancelled one;
 * the callback may call the store (no lock held) and stop the scan. */
struct scan_seen {
    tw_durable *d;
    int n, cancel_from, stop_at;
    char key[16][16];
    char pl[16][16];
    int64_t due[16];
    uint32_t attempt[16], state[16];
};

static int on_scan(void *arg, const tw_durable_scanned *t)
{
    struct scan_seen *c = arg;
    ASSERT_LT(c->n, 16);
    ASSERT_LT(t->key_len, sizeof c->key[0]);
    ASSERT_LT(t->payload_len, sizeof c->pl[0]);
    memcpy(c->key[c->n], t->key, t->key_len);
    c->key[c->n][t->key_len] = '\0';
    memcpy(c->pl[c->n], t->payload, t->payload_len);
    c->pl[c->n][t->payload_len] = '\0';
    c->due[c->n] = t->due_ms;
    c->attempt[c->n] = t->attempt;
    c->state[c->n] = t->state;
    c->n++;
    if (c->cancel_from && c->n >= c->cancel_from)
        ASSERT_EQ(t->state == TW_DURABLE_DEAD
                      ? tw_durable_dead_delete(c->d, t->key, t->key_len)
                      : tw_durable_cancel(c->d, t->key, t->key_len),
                  0);
    return c->n == c->stop_at ? c->stop_at % 2 ? -5 : 1 : 0;
}

static int scan_find(const struct scan_seen *c, const char *key)
{
    int at = -1;
    for (int i = 0; i < c->n; i++)
        if (!strcmp(c->key[i], key)) {
            ASSERT_EQ(at, -1); /* once */
            at = i;
        }
    return at;
}

static void test_scan(void)
{
    tw_durable *d = open_new();
    /* First a dead letter: the clock moves 50 ms at a time (with a pause
     * of real time) until its delivery has made it one. */
    tw_durable_info in;
    ASSERT_EQ(sched(d, "s-dead", now_ms() + 10, "D"), 0);
    for (int i = 0; i < WAIT_MS / 20; i++) {
        if (get(d, "s-dead", &in, NULL, 0) == 0 && in.state == TW_DURABLE_DEAD)
            break;
        advance(50);
        sleep_real_ms(20);
    }
    ASSERT_EQ(in.state, TW_DURABLE_DEAD);
    int64_t t0 = now_ms();
    ASSERT_EQ(sched(d, "s-a", t0 + 100000, "alpha"), 0);
    ASSERT_EQ(sched(d, "s-b", t0 + 200000, ""), 0);
    ASSERT_EQ(sched(d, "s-c", t0 + 300000, "old"), 0);
    ASSERT_EQ(sched(d, "s-c", t0 + 400000, "new"), 0); /* replaced */
    ASSERT_EQ(sched(d, "s-x", t0 + 100000, "gone"), 0);
    ASSERT_EQ(cancel(d, "s-x"), 0);
    ASSERT_EQ(sched(d, "s-r", t0 + 50, "R1000x1"), 0); /* retried once */
    advance(50);
    wait_count("s-r", 1);
    for (int i = 0; i < WAIT_MS && stats(d).retried < 1; i++)
        sleep_real_ms(1);
    advance(150);
    wait_get(d, "s-r", 2);
    ASSERT_EQ(get(d, "s-dead", &in, NULL, 0), 0);
    struct scan_seen c = {.d = d};
    ASSERT_EQ(tw_durable_scan(d, on_scan, &c), 5);
    ASSERT_EQ(c.n, 5);
    int dl = scan_find(&c, "s-dead");
    ASSERT(dl >= 0);
    ASSERT_EQ(c.state[dl], TW_DURABLE_DEAD);
    ASSERT_EQ(c.attempt[dl], in.attempt);
    ASSERT_STR_EQ(c.pl[dl], "D");
    int a = scan_find(&c, "s-a"), b = scan_find(&c, "s-b"),
        cc = scan_find(&c, "s-c"), r = scan_find(&c, "s-r");
    ASSERT(a >= 0 && b >= 0 && cc >= 0 && r >= 0);
    ASSERT_EQ(scan_find(&c, "s-x"), -1);
    ASSERT_STR_EQ(c.pl[a], "alpha");
    ASSERT_EQ(c.due[a], t0 + 100000);
    ASSERT_EQ(c.attempt[a], 1);
    ASSERT_EQ(c.state[a], TW_DURABLE_WAITING);
    ASSERT_STR_EQ(c.pl[b], "");
    ASSERT_STR_EQ(c.pl[cc], "new");
    ASSERT_EQ(c.due[cc], t0 + 400000);
    ASSERT_STR_EQ(c.pl[r], "R1000x1");
    ASSERT_EQ(c.attempt[r], 2);
    ASSERT_EQ(get(d, "s-r", &in, NULL, 0), 0);
    ASSERT_EQ(c.due[r], in.due_ms);
    /* Stopping: a positive return gives the count so far, a negative one
     * itself. */
    c = (struct scan_seen){.d = d, .stop_at = 2};
    ASSERT_EQ(tw_durable_scan(d, on_scan, &c), 2);
    c = (struct scan_seen){.d = d, .stop_at = 1};
    ASSERT_EQ(tw_durable_scan(d, on_scan, &c), -5);
    ASSERT_EQ(tw_durable_scan(d, NULL, &c), TW_EINVAL);
    ASSERT_EQ(tw_durable_scan(NULL, on_scan, &c), TW_EINVAL);
    /* The same after a reopen. */
    ASSERT_EQ(tw_durable_close(d), 0);
    d = reopen();
    c = (struct scan_seen){.d = d};
    ASSERT_EQ(tw_durable_scan(d, on_scan, &c), 5);
    ASSERT_STR_EQ(c.pl[scan_find(&c, "s-c")], "new");
    ASSERT_EQ(c.state[scan_find(&c, "s-dead")], TW_DURABLE_DEAD);
    /* The callback cancels what it is handed: the store is not locked. */
    c = (struct scan_seen){.d = d, .cancel_from = 1};
    ASSERT_EQ(tw_durable_scan(d, on_scan, &c), 5);
    c = (struct scan_seen){.d = d};
    ASSERT_EQ(tw_durable_scan(d, on_scan, &c), 0);
    ASSERT_EQ(stats(d).pending, 0);
    ASSERT_EQ(early, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* ------------------------------------------------------------------------ */
/* Retry policy, dead letters, touch. */

static int is_dead(tw_durable *d, const char *key)
{
    tw_durable_info in;
    return get(d, key, &in, NULL, 0) == 0 && in.state == TW_DURABLE_DEAD;
}

/* Move the clock 50 ms at a time (with a pause of real time for the
 * store to deliver what came due) until every key of @keys is a dead
 * letter; fails after WAIT_MS of real time. */
static void run_until_dead(tw_durable *d, const char *const *keys, int n)
{
    for (int round = 0; round < WAIT_MS / 20; round++) {
        int dead = 0;
        for (int i = 0; i < n; i++)
            dead += is_dead(d, keys[i]);
        if (dead == n)
            return;
        advance(50);
        sleep_real_ms(20);
    }
    for (int i = 0; i < n; i++)
        fprintf(stderr, "%s: %s dead %d, delivered %u times\n", be->name,
                keys[i], is_dead(d, keys[i]), count_of(keys[i]));
    ASSERT(0);
}

/* The dead letters of @d, in order, into @keys (up to 8; pages of 2). */
static int dead_keys(tw_durable *d, char keys[8][16])
{
    tw_durable_cursor c = TW_DURABLE_CURSOR_INIT;
    tw_durable_entry e[2];
    char kb[TW_DURABLE_KEY_MAX];
    int n = 0;
    while (!c.done) {
        int got = tw_durable_list_dead(d, &c, e, 2, kb, sizeof kb);
        ASSERT_GE(got, 0);
        ASSERT_LE(got, 2);
        for (int i = 0; i < got; i++) {
            ASSERT_LT(n, 8);
            ASSERT_EQ(e[i].state, TW_DURABLE_DEAD);
            ASSERT_LT(e[i].key_len, 16);
            memcpy(keys[n], e[i].key, e[i].key_len);
            keys[n++][e[i].key_len] = 0;
        }
    }
    return n;
}

/* max_attempts ends a timer that retries forever, one that asks for the
 * backoff, and one that returns TW_DURABLE_FIRE_DEAD, as dead letters:
 * durable, found by get, counted, listed in key order, not cancelled,
 * re-armed (the attempts start over), deleted, replaced by a schedule;
 * bad input changes nothing. */
/* tw_durable_restore(): a pending timer keeps its attempt and is
 * delivered when due with it; a dead letter keeps its due time, payload
 * and attempts; both survive a reopen; a key held already is TW_EEXIST,
 * nothing changed. */
static void test_restore(void)
{
    tw_durable *d = open_new();
    int64_t t0 = now_ms();
    tw_durable_scanned p = {.key = "rs-p",
                            .key_len = 4,
                            .payload = "pp",
                            .payload_len = 2,
                            .due_ms = t0 + 100,
                            .attempt = 3,
                            .state = TW_DURABLE_WAITING};
    tw_durable_scanned x = {.key = "rs-d",
                            .key_len = 4,
                            .payload = "dd",
                            .payload_len = 2,
                            .due_ms = t0 - 5,
                            .attempt = 7,
                            .state = TW_DURABLE_DEAD};
    ASSERT_EQ(tw_durable_restore(d, &p), 0);
    ASSERT_EQ(tw_durable_restore(d, &x), 0);
    ASSERT_EQ(tw_durable_restore(d, &p), TW_EEXIST);
    ASSERT_EQ(tw_durable_restore(d, &x), TW_EEXIST);
    ASSERT_EQ(sched(d, "rs-s", t0 + 1000000, "s"), 0);
    p.key = "rs-s";
    ASSERT_EQ(tw_durable_restore(d, &p), TW_EEXIST);
    ASSERT_EQ(tw_durable_restore(NULL, &p), TW_EINVAL);
    ASSERT_EQ(tw_durable_close(d), 0);
    d = reopen();
    tw_durable_info in;
    char buf[8];
    ASSERT_EQ(get(d, "rs-d", &in, buf, sizeof buf), 0);
    ASSERT_EQ(in.state, TW_DURABLE_DEAD);
    ASSERT_EQ(in.attempt, 7);
    ASSERT_EQ(in.due_ms, t0 - 5);
    ASSERT(in.payload_len == 2 && !memcmp(buf, "dd", 2));
    ASSERT_EQ(get(d, "rs-s", &in, buf, sizeof buf), 0);
    ASSERT(in.payload_len == 1 && buf[0] == 's');
    ASSERT_EQ(stats(d).dead, 1);
    advance(200);
    wait_count("rs-p", 1);
    struct rec r = snap("rs-p");
    ASSERT_EQ(r.attempt[0], 3);
    ASSERT_EQ(r.due_ms[0], t0 + 100);
    ASSERT_STR_EQ(r.payload, "pp");
    ASSERT_EQ(tw_durable_close(d), 0);
}

static void test_dead_letters(void)
{
    pol.max_attempts = 3;
    pol.retry_ms = 100;
    tw_durable *d = open_new();
    int64_t t0 = now_ms();
    ASSERT_EQ(sched(d, "dl-r", t0 + 10, "R50x9"), 0); /* retries forever */
    ASSERT_EQ(sched(d, "dl-d", t0 + 10, "D"), 0);
    ASSERT_EQ(sched(d, "dl-y", t0 + 10, "Y"), 0);
    ASSERT_EQ(sched(d, "dl-ok", t0 + 10, "R50x1"), 0); /* one retry, done */
    ASSERT_EQ(sched(d, "dl-p", t0 + 1000000, "p"), 0);
    static const char *const three[] = {"dl-r", "dl-d", "dl-y"};
    run_until_dead(d, three, 3);
    struct rec r = snap("dl-r"), y = snap("dl-y");
    ASSERT_EQ(r.count, 3);
    ASSERT_EQ(y.count, 3);
    ASSERT_EQ(count_of("dl-d"), 1);
    for (uint32_t i = 0; i < 3; i++) {
        ASSERT_EQ(r.attempt[i], i + 1);
        ASSERT_EQ(y.attempt[i], i + 1);
    }
    ASSERT_GE(y.at_ms[1], y.at_ms[0] + 100); /* the fixed backoff */
    ASSERT_GE(y.at_ms[2], y.at_ms[1] + 100);
    for (int i = 0; i < WAIT_MS && count_of("dl-ok") < 2; i++) {
        advance(50);
        sleep_real_ms(1);
    }
    ASSERT_EQ(count_of("dl-ok"), 2);
    done_flush(d, 1); /* dl-p: dead letters are not pending */
    tw_durable_info in;
    char buf[16];
    memset(buf, 0, sizeof buf);
    ASSERT_EQ(get(d, "dl-r", &in, buf, sizeof buf), 0);
    ASSERT_EQ(in.state, TW_DURABLE_DEAD);
    ASSERT_EQ(in.attempt, 3);
    ASSERT_EQ(in.due_ms, r.due_ms[2]);
    ASSERT_EQ(in.payload_len, 5);
    ASSERT(!memcmp(buf, "R50x9", 5));
    ASSERT_EQ(get(d, "dl-d", &in, NULL, 0), 0);
    ASSERT_EQ(in.state, TW_DURABLE_DEAD);
    ASSERT_EQ(in.attempt, 1);
    tw_durable_stats st = stats(d);
    ASSERT_EQ(st.dead, 3);
    ASSERT_EQ(st.pending, 1);
    /* Not pending: cancel does not reach it, listing does not show it. */
    ASSERT_EQ(cancel(d, "dl-d"), TW_ENOENT);
    ASSERT(is_dead(d, "dl-d"));
    tw_durable_cursor c = TW_DURABLE_CURSOR_INIT;
    tw_durable_entry e[8];
    char kb[TW_DURABLE_KEY_MAX];
    ASSERT_EQ(tw_durable_list(d, INT64_MIN, INT64_MAX, &c, e, 8, kb, sizeof kb),
              1);
    ASSERT_EQ(e[0].key_len, 4); /* dl-p */
    char keys[8][16];
    ASSERT_EQ(dead_keys(d, keys), 3);
    ASSERT_STR_EQ(keys[0], "dl-d");
    ASSERT_STR_EQ(keys[1], "dl-r");
    ASSERT_STR_EQ(keys[2], "dl-y");
    c = (tw_durable_cursor)TW_DURABLE_CURSOR_INIT;
    ASSERT_EQ(tw_durable_list_dead(d, &c, e, 8, kb, sizeof kb), 3);
    ASSERT_EQ(c.done, 1);
    ASSERT_EQ(e[1].due_ms, r.due_ms[2]);
    /* Bad input: TW_EINVAL, nothing changed; not dead: TW_ENOENT. */
    static char big[TW_DURABLE_KEY_MAX + 1];
    ASSERT_EQ(tw_durable_rearm(NULL, "dl-d", 4, t0), TW_EINVAL);
    ASSERT_EQ(tw_durable_rearm(d, NULL, 4, t0), TW_EINVAL);
    ASSERT_EQ(tw_durable_rearm(d, "dl-d", 0, t0), TW_EINVAL);
    ASSERT_EQ(tw_durable_dead_delete(d, big, sizeof big), TW_EINVAL);
    ASSERT_EQ(tw_durable_dead_delete(NULL, "dl-d", 4), TW_EINVAL);
    ASSERT_EQ(tw_durable_touch(d, NULL, 1), TW_EINVAL);
    c = (tw_durable_cursor)TW_DURABLE_CURSOR_INIT;
    ASSERT_EQ(tw_durable_list_dead(d, &c, e, 0, kb, sizeof kb), TW_EINVAL);
    ASSERT_EQ(tw_durable_list_dead(d, NULL, e, 8, kb, sizeof kb), TW_EINVAL);
    ASSERT_EQ(tw_durable_list_dead(d, &c, e, 8, kb, 2), TW_EINVAL);
    ASSERT_EQ(c.key_len, 0); /* unchanged */
    ASSERT_EQ(c.done, 0);
    ASSERT_EQ(tw_durable_rearm(d, "dl-ok", 5, t0), TW_ENOENT);
    ASSERT_EQ(tw_durable_rearm(d, "nope", 4, t0), TW_ENOENT);
    ASSERT_EQ(tw_durable_dead_delete(d, "nope", 4), TW_ENOENT);
    ASSERT_EQ(tw_durable_rearm(d, "dl-p", 4, t0), TW_ENOENT);
    ASSERT_EQ(tw_durable_dead_delete(d, "dl-p", 4), TW_ENOENT);
    ASSERT_EQ(tw_durable_touch(d, "dl-p", 4), TW_ENOENT); /* not running */
    ASSERT_EQ(get(d, "dl-p", &in, NULL, 0), 0);
    ASSERT_EQ(in.due_ms, t0 + 1000000);
    ASSERT_EQ(stats(d).dead, 3);
    /* Durable. */
    ASSERT_EQ(tw_durable_close(d), 0);
    d = reopen();
    st = stats(d);
    ASSERT_EQ(st.dead, 3);
    ASSERT_EQ(st.pending, 1);
    ASSERT_EQ(get(d, "dl-r", &in, NULL, 0), 0);
    ASSERT_EQ(in.state, TW_DURABLE_DEAD);
    ASSERT_EQ(in.attempt, 3);
    ASSERT_EQ(dead_keys(d, keys), 3);
    /* Re-armed: pending at its new due time with attempt 1, and the
     * policy starts over (three more deliveries, dead again). */
    int64_t t1 = now_ms();
    ASSERT_EQ(tw_durable_rearm(d, "dl-r", 4, t1 + 10), 0);
    ASSERT_EQ(get(d, "dl-r", &in, NULL, 0), 0);
    ASSERT_EQ(in.state, TW_DURABLE_WAITING);
    ASSERT_EQ(in.attempt, 1);
    ASSERT_EQ(in.due_ms, t1 + 10);
    ASSERT_EQ(stats(d).dead, 2);
    ASSERT_EQ(tw_durable_rearm(d, "dl-r", 4, t1 + 10), TW_ENOENT);
    static const char *const one[] = {"dl-r"};
    run_until_dead(d, one, 1);
    r = snap("dl-r");
    ASSERT_EQ(r.count, 6);
    ASSERT_EQ(r.attempt[3], 1);
    ASSERT_EQ(r.attempt[5], 3);
    ASSERT_GE(r.at_ms[3], t1 + 10);
    /* Deleted. */
    ASSERT_EQ(tw_durable_dead_delete(d, "dl-y", 4), 0);
    ASSERT_EQ(get(d, "dl-y", &in, NULL, 0), TW_ENOENT);
    ASSERT_EQ(tw_durable_dead_delete(d, "dl-y", 4), TW_ENOENT);
    ASSERT_EQ(stats(d).dead, 2);
    /* Replaced by a schedule of its key: pending, delivered, done. */
    ASSERT_EQ(sched(d, "dl-d", now_ms() + 10, "again"), 0);
    ASSERT_EQ(stats(d).dead, 1);
    ASSERT_EQ(get(d, "dl-d", &in, NULL, 0), 0);
    ASSERT_EQ(in.state, TW_DURABLE_WAITING);
    ASSERT_EQ(in.attempt, 1);
    advance(10);
    wait_count("dl-d", 2);
    ASSERT_EQ(dead_keys(d, keys), 1);
    ASSERT_STR_EQ(keys[0], "dl-r");
    /* A read-only handle lists them and changes nothing. */
    tw_durable_config rc = cfg_for(store_name);
    rc.flags = TW_DURABLE_READONLY;
    tw_durable *ro = NULL;
    ASSERT_EQ(tw_durable_open(&ro, &rc), 0);
    ASSERT_EQ(stats(ro).dead, 1);
    ASSERT_EQ(dead_keys(ro, keys), 1);
    ASSERT_EQ(tw_durable_rearm(ro, "dl-r", 4, t1), TW_EROFS);
    ASSERT_EQ(tw_durable_dead_delete(ro, "dl-r", 4), TW_EROFS);
    ASSERT_EQ(tw_durable_close(ro), 0);
    ASSERT(is_dead(d, "dl-r"));
    ASSERT_EQ(early, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    /* A policy that cannot be honoured is refused at open. */
    pol.retry_jitter_pct = 101;
    tw_durable_config bad = cfg_for("dl-bad");
    ASSERT_EQ(tw_durable_open(&d, &bad), TW_EINVAL);
}

/* The backoff of TW_DURABLE_FIRE_RETRY: exponential from retry_ms,
 * capped at retry_max_ms, read exactly from each retry's due time (a
 * backend with TW_SEM_KNOWN_DONE_LAG writes it up to 150 ms later here);
 * then jitter: each delay cut by up to retry_jitter_pct percent. */
static void test_backoff(void)
{
    pol.max_attempts = 5;
    pol.retry_ms = 100;
    pol.retry_max_ms = 400;
    tw_durable *d = open_new();
    ASSERT_EQ(sched(d, "bx", now_ms() + 10, "Y"), 0);
    advance(10);
    static const int64_t want[] = {100, 200, 400, 400};
    /* The clock moves past a retry's DONE delay only where there is one
     * (the journal writes the retry as the callback returns, and a step
     * could make it due at once). */
    const int64_t lag = be->known & TW_SEM_KNOWN_DONE_LAG ? 150 : 0;
    tw_durable_info in;
    for (uint32_t n = 1; n <= 4; n++) {
        wait_count("bx", n);
        for (int i = 0; i < WAIT_MS && stats(d).retried < n; i++)
            sleep_real_ms(1);
        advance(lag);
        wait_get(d, "bx", n + 1);
        ASSERT_EQ(get(d, "bx", &in, NULL, 0), 0);
        int64_t gap = in.due_ms - snap("bx").at_ms[n - 1];
        ASSERT_GE(gap, want[n - 1]);
        ASSERT_LE(gap, want[n - 1] + lag);
        advance(in.due_ms - now_ms());
    }
    wait_count("bx", 5);
    static const char *const bx[] = {"bx"};
    run_until_dead(d, bx, 1);
    ASSERT_EQ(get(d, "bx", &in, NULL, 0), 0);
    ASSERT_EQ(in.attempt, 5);
    ASSERT_EQ(tw_durable_close(d), 0);

    /* Jitter: 20 timers that failed together retry spread over
     * [500, 1000] ms (+150 as above), not all at one time. */
    reset();
    pol.max_attempts = 2;
    pol.retry_ms = 1000;
    pol.retry_jitter_pct = 50;
    d = open_new();
    char k[20][8];
    for (int i = 0; i < 20; i++) {
        snprintf(k[i], sizeof k[i], "j%d", i);
        ASSERT_EQ(sched(d, k[i], now_ms() + 10, "Y"), 0);
    }
    advance(10);
    for (int i = 0; i < 20; i++)
        wait_count(k[i], 1);
    for (int i = 0; i < WAIT_MS && stats(d).retried < 20; i++)
        sleep_real_ms(1);
    advance(lag);
    int64_t first = 0;
    bool spread = false;
    for (int i = 0; i < 20; i++) {
        wait_get(d, k[i], 2);
        ASSERT_EQ(get(d, k[i], &in, NULL, 0), 0);
        int64_t gap = in.due_ms - snap(k[i]).at_ms[0];
        ASSERT_GE(gap, 500);
        ASSERT_LE(gap, 1000 + lag);
        if (i == 0)
            first = in.due_ms;
        spread |= in.due_ms != first;
    }
    ASSERT(spread);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* tw_durable_touch. Journal (no lease): 0 while a delivery of the key is
 * under way, from its callback or any thread, TW_ENOENT otherwise.
 * Redis: a callback that runs for twice its lease_ms and touches is not
 * delivered again by another node; one that does not touch is (at
 * least once). The clock moves 250 ms at a time (a quarter lease); after
 * each step the touching callback is seen to touch, and the other node
 * gets 200 ms of real time (over two of its claim rounds, 75 ms apart)
 * to claim whatever lease ran out. */
static void test_touch(void)
{
    bool lease = !strcmp(be->name, "redis");
    pol.lease_ms = 1000;
    atomic_store(&unblocked, 0);
    atomic_store(&entered_k, 0);
    atomic_store(&entered_n, 0);
    atomic_store(&touches, 0);
    atomic_store(&touch_rc, 1);
    tw_durable *d = open_new();
    tw_durable *d2 = lease ? reopen() : NULL;
    ASSERT_EQ(sched(d, "tk", now_ms() + 10, "K"), 0);
    advance(10);
    for (int i = 0; i < WAIT_MS && atomic_load(&touches) < 2; i++)
        sleep_real_ms(1);
    ASSERT_GE(atomic_load(&touches), 2);
    ASSERT_EQ(atomic_load(&touch_rc), 0);
    /* Only the callback of the key renews its lease on Redis. */
    ASSERT_EQ(tw_durable_touch(d, "tk", 2), lease ? TW_ENOENT : 0);
    ASSERT_EQ(tw_durable_touch(d, "other", 5), TW_ENOENT);
    for (int step = 0; step < 8; step++) {
        advance(250);
        int seen = atomic_load(&touches);
        for (int i = 0; i < WAIT_MS && atomic_load(&touches) < seen + 2; i++)
            sleep_real_ms(1);
        sleep_real_ms(200);
        ASSERT_EQ(atomic_load(&entered_k), 1);
        ASSERT_EQ(atomic_load(&touch_rc), 0);
    }
    atomic_store(&unblocked, 1);
    wait_count("tk", 1);
    wait_fired(d, 1);
    done_flush(d, 0);
    ASSERT_EQ(tw_durable_touch(d, "tk", 2), TW_ENOENT); /* done */
    ASSERT_EQ(atomic_load(&entered_k), 1);
    if (lease) {
        /* Without touch: past its lease, the other node delivers it too
         * (attempt 2) while the first callback still runs. */
        atomic_store(&unblocked, 0);
        ASSERT_EQ(sched(d, "tn", now_ms() + 10, "N"), 0);
        advance(10);
        for (int i = 0; i < WAIT_MS && atomic_load(&entered_n) < 1; i++)
            sleep_real_ms(1);
        ASSERT_EQ(atomic_load(&entered_n), 1);
        for (int i = 0; i < WAIT_MS / 20 && atomic_load(&entered_n) < 2; i++) {
            advance(250);
            sleep_real_ms(20);
        }
        ASSERT_EQ(atomic_load(&entered_n), 2);
        atomic_store(&unblocked, 1);
        wait_count("tn", 2);
        struct rec n = snap("tn");
        /* Attempt 1 and a later one (2, or more when a node whose
         * callback still runs claimed it again first, and its lease ran
         * out too). */
        uint32_t lo = n.attempt[0] < n.attempt[1] ? n.attempt[0] : n.attempt[1];
        uint32_t hi = n.attempt[0] ^ n.attempt[1] ^ lo;
        ASSERT_EQ(lo, 1);
        ASSERT_GE(hi, 2);
        ASSERT_EQ(tw_durable_close(d2), 0);
    }
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* ------------------------------------------------------------------------ */
/* For the suite's other files (tests/durable_semantics_impl.h). */

const tw_sem_backend *sem_backend(void)
{
    return be;
}

int64_t sem_now(void)
{
    return now_ms();
}

void sem_advance(int64_t ms)
{
    advance(ms);
}

void sem_sleep_ms(int ms)
{
    sleep_real_ms(ms);
}

tw_durable *sem_open_new(void)
{
    return open_new();
}

tw_durable *sem_reopen(void)
{
    return reopen();
}

uint32_t sem_count(const char *key)
{
    return count_of(key);
}

void sem_dump(const char *key)
{
    struct rec r = snap(key);
    fprintf(stderr, "%s: %s delivered %u times (clock %lld)\n", be->name, key,
            r.count, (long long)now_ms());
    for (uint32_t i = 0; i < r.count && i < ATT; i++)
        fprintf(stderr,
                "  delivery %u: attempt %u, due %lld, at %lld, token %llu "
                "(lease end %llu), real time %lld\n",
                i + 1, r.attempt[i], (long long)r.due_ms[i],
                (long long)r.at_ms[i], (unsigned long long)r.token[i],
                (unsigned long long)(r.token[i] / 1024),
                (long long)r.real_ms[i]);
}

void sem_last_payload(const char *key, char *out, size_t len)
{
    snprintf(out, len, "%s", snap(key).payload);
}

void sem_wait_count(const char *key, uint32_t n)
{
    wait_count(key, n);
}

void sem_settle(tw_durable *d)
{
    settle(d);
}

void sem_done_flush(tw_durable *d, uint64_t want_pending)
{
    done_flush(d, want_pending);
}

void sem_wait_fired(tw_durable *d, uint64_t n)
{
    wait_fired(d, n);
}

tw_durable_stats sem_stats(tw_durable *d)
{
    return stats(d);
}

void sem_block_reset(void)
{
    atomic_store(&blocked, 0);
    atomic_store(&unblocked, 0);
}

void sem_wait_blocked(void)
{
    for (int i = 0; i < WAIT_MS && !atomic_load(&blocked); i++)
        sleep_real_ms(1);
    ASSERT(atomic_load(&blocked));
}

void sem_unblock(void)
{
    atomic_store(&unblocked, 1);
}

int sem_early(void)
{
    return early;
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
    RUN(test_executor_threads);
    RUN(test_get);
    RUN(test_running_state);
    RUN(test_list_order);
    RUN(test_list_concurrent);
    RUN(test_list_reopen);
    RUN(test_metrics);
    RUN(test_readonly);
    RUN(test_list_extremes);
    RUN(test_scan);
    RUN(test_dead_letters);
    RUN(test_restore);
    RUN(test_backoff);
    RUN(test_touch);
    RUN(sem_test_cas_single);
    RUN(sem_test_cas_many);
    RUN(sem_test_cas_fire_race);
    RUN(sem_test_cas_threads);
    return tw_test_done();
}
