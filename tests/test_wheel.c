/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the core wheel: one test per rule of twheel/wheel.h, each
 * run on every wheel shape (hierarchical default, Netty's single wheel with
 * rounds, a few levels with rounds on top, one slot). Time is virtual.
 */
#include "wheel_internal.h"
#include "test.h"

#include <twheel/wheel.h>

#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

static const tw_wheel_config shapes[] = {
    {0, 0}, {512, 1}, {64, 3}, {8, 2}, {1, 1}, {4096, 0}, {100, 0},
};
#define NSHAPES (sizeof(shapes) / sizeof(shapes[0]))

struct rec {
    tw_timer t;
    int id;
    int runs;
};

static uint64_t log_exp[1024];
static int log_id[1024];
static size_t nlog;
static tw_wheel *cur_w;

static void record(tw_timer *t, void *arg)
{
    struct rec *r = TW_CONTAINER_OF(t, struct rec, t);
    (void)arg;
    ASSERT(!tw_timer_pending(t));
    ASSERT_LT(nlog, 1024);
    log_exp[nlog] = tw_timer_expires(t);
    log_id[nlog] = r->id;
    nlog++;
    r->runs++;
}

static tw_wheel *make(size_t shape, uint64_t now)
{
    tw_wheel *w = NULL;
    ASSERT_EQ(tw_wheel_create(&w, &shapes[shape], now), 0);
    ASSERT_NOT_NULL(w);
    ASSERT_EQ(tw_wheel_now(w), now);
    ASSERT_EQ(tw_wheel_count(w), 0);
    ASSERT_EQ(tw_wheel_next_expiry(w), UINT64_MAX);
    cur_w = w;
    nlog = 0;
    return w;
}

/* The number of levels a configuration gets (see wheel.h). */
static unsigned shape_levels(const tw_wheel_config *c)
{
    unsigned slots = c->slots ? c->slots : 256, bits = 0;
    while ((1u << bits) < slots)
        bits++;
    unsigned need = bits ? (64 + bits - 1) / bits : 1;
    return c->levels && c->levels < need ? c->levels : need;
}

static void check(const tw_wheel *w)
{
    ASSERT_EQ(tw__wheel_check_full(w), 0);
}

static void test_sizes_and_version(void)
{
#if UINTPTR_MAX == UINT64_MAX
    ASSERT_EQ(sizeof(tw_timer), 40);
#endif
    ASSERT_LE(sizeof(tw_timer), 48);
    ASSERT_EQ(tw_version(), TW_VERSION_HEX);
    {
        /* The string form names the same version: "MAJOR.MINOR.PATCH". */
        char want[32];
        unsigned v = tw_version();
        snprintf(want, sizeof want, "%u.%u.%u", v >> 16, (v >> 8) & 255u,
                 v & 255u);
        ASSERT_STR_EQ(tw_version_string(), want);
    }
    ASSERT_STR_EQ(tw_strerror(0), "success");
    ASSERT_STR_EQ(tw_strerror(TW_EINVAL), "invalid argument");
    ASSERT_STR_EQ(tw_strerror(TW_ENOMEM), "out of memory");
    ASSERT_STR_EQ(tw_strerror(12345), "unknown error");
    ASSERT_EQ(TW_EINVAL, -EINVAL);
    ASSERT_EQ(TW_ENOMEM, -ENOMEM);
    struct rec r;
    ASSERT(TW_CONTAINER_OF(&r.t, struct rec, t) == &r);
}

static void test_create_bad_input(void)
{
    tw_wheel *w = (tw_wheel *)(uintptr_t)0x1234;
    tw_wheel_config bad1 = {(UINT32_C(1) << 30) + 1, 0};
    tw_wheel_config bad2 = {64, 65};
    ASSERT_EQ(tw_wheel_create(NULL, NULL, 0), TW_EINVAL);
    ASSERT_EQ(tw_wheel_create(&w, &bad1, 0), TW_EINVAL);
    ASSERT_EQ(tw_wheel_create(&w, &bad2, 0), TW_EINVAL);
    ASSERT(w == (tw_wheel *)(uintptr_t)0x1234); /* untouched on failure */
    /* Levels beyond what 64 bits need, and odd slot counts, are fine. */
    tw_wheel_config many = {64, 64}, odd = {3, 0}, two = {2, 0};
    ASSERT_EQ(tw_wheel_create(&w, &many, 5), 0);
    tw_wheel_destroy(w);
    ASSERT_EQ(tw_wheel_create(&w, &odd, 5), 0);
    tw_wheel_destroy(w);
    ASSERT_EQ(tw_wheel_create(&w, &two, 5), 0);
    check(w);
    tw_wheel_destroy(w);
    tw_wheel_destroy(NULL);
}

static void test_add_bad_input(void)
{
    for (size_t s = 0; s < NSHAPES; s++) {
        tw_wheel *w = make(s, 10);
        struct rec r = {.id = 1};
        tw_timer_init(&r.t, NULL, NULL);
        ASSERT_EQ(tw_wheel_add(w, &r.t, 20), TW_EINVAL);
        ASSERT(!tw_timer_pending(&r.t));
        ASSERT_EQ(tw_wheel_count(w), 0);
        tw_timer_init(&r.t, record, NULL);
        ASSERT_EQ(tw_wheel_add(NULL, &r.t, 20), TW_EINVAL);
        ASSERT_EQ(tw_wheel_add(w, NULL, 20), TW_EINVAL);
        ASSERT(!tw_timer_pending(&r.t));
        ASSERT(!tw_wheel_cancel(w, &r.t)); /* idle: a no-op */
        ASSERT(!tw_wheel_cancel(w, NULL));
        check(w);
        tw_wheel_destroy(w);
    }
}

static void test_exact_once_never_early(void)
{
    static const uint64_t delays[] = {
        1,      2,    63,   64,   65,     511,    512,
        513,    4095, 4096, 4097, 262143, 262144, UINT64_C(1) << 33,
        1000003};
    const size_t nd = sizeof(delays) / sizeof(delays[0]);
    for (size_t s = 0; s < NSHAPES; s++) {
        for (size_t d = 0; d < nd; d++) {
            uint64_t start = 1000 + d * 7;
            tw_wheel *w = make(s, start);
            struct rec r = {.id = 1};
            tw_timer_init(&r.t, record, NULL);
            uint64_t e = start + delays[d];
            ASSERT_EQ(tw_wheel_add(w, &r.t, e), 0);
            ASSERT(tw_timer_pending(&r.t));
            ASSERT_EQ(tw_timer_expires(&r.t), e);
            ASSERT_EQ(tw_wheel_count(w), 1);
            ASSERT_LE(tw_wheel_next_expiry(w), e);
            check(w);
            /* One tick before: nothing. */
            ASSERT_EQ(tw_wheel_advance(w, e - 1), 0);
            ASSERT_EQ(r.runs, 0);
            ASSERT(tw_timer_pending(&r.t));
            check(w);
            ASSERT_EQ(tw_wheel_advance(w, e), 1);
            ASSERT_EQ(r.runs, 1);
            ASSERT(!tw_timer_pending(&r.t));
            ASSERT_EQ(tw_wheel_count(w), 0);
            ASSERT_EQ(tw_wheel_advance(w, e + 1000), 0);
            ASSERT_EQ(r.runs, 1);
            ASSERT_EQ(tw_wheel_next_expiry(w), UINT64_MAX);
            check(w);
            tw_wheel_destroy(w);
        }
    }
}

static void test_due_runs_next_advance_not_in_add(void)
{
    for (size_t s = 0; s < NSHAPES; s++) {
        tw_wheel *w = make(s, 500);
        struct rec a = {.id = 1}, b = {.id = 2}, c = {.id = 3};
        tw_timer_init(&a.t, record, NULL);
        tw_timer_init(&b.t, record, NULL);
        tw_timer_init(&c.t, record, NULL);
        ASSERT_EQ(tw_wheel_add(w, &a.t, 500), 0); /* == now */
        ASSERT_EQ(tw_wheel_add(w, &b.t, 7), 0);   /* long past */
        ASSERT_EQ(tw_wheel_add(w, &c.t, 499), 0);
        ASSERT_EQ(nlog, 0); /* not inside add */
        ASSERT_LE(tw_wheel_next_expiry(w), 7);
        check(w);
        ASSERT_EQ(tw_wheel_advance(w, 500), 3); /* advance to the same now */
        ASSERT_EQ(nlog, 3);
        /* Sorted by expiry even though they were added out of order. */
        ASSERT_EQ(log_exp[0], 7);
        ASSERT_EQ(log_exp[1], 499);
        ASSERT_EQ(log_exp[2], 500);
        check(w);
        tw_wheel_destroy(w);
    }
}

static void test_backwards_changes_nothing(void)
{
    for (size_t s = 0; s < NSHAPES; s++) {
        tw_wheel *w = make(s, 1000);
        struct rec a = {.id = 1};
        tw_timer_init(&a.t, record, NULL);
        ASSERT_EQ(tw_wheel_add(w, &a.t, 900), 0); /* due */
        ASSERT_EQ(tw_wheel_advance(w, 999), 0);
        ASSERT_EQ(tw_wheel_now(w), 1000);
        ASSERT_EQ(a.runs, 0);
        ASSERT(tw_timer_pending(&a.t));
        ASSERT_EQ(tw_wheel_advance(w, 1000), 1);
        check(w);
        tw_wheel_destroy(w);
    }
}

static void test_order_in_one_jump(void)
{
    for (size_t s = 0; s < NSHAPES; s++) {
        uint64_t rng = 99 + s;
        tw_wheel *w = make(s, 77);
        static struct rec r[500];
        for (int i = 0; i < 500; i++) {
            r[i] = (struct rec){.id = i};
            tw_timer_init(&r[i].t, record, NULL);
            uint64_t e = 78 + tw_test_rand(&rng) % 100000;
            if (i % 50 == 0)
                e = 78 + 4096; /* a crowd on one tick */
            ASSERT_EQ(tw_wheel_add(w, &r[i].t, e), 0);
        }
        check(w);
        ASSERT_EQ(tw_wheel_advance(w, 78 + 100000), 500);
        ASSERT_EQ(nlog, 500);
        for (size_t i = 1; i < nlog; i++)
            ASSERT_LE(log_exp[i - 1], log_exp[i]);
        for (int i = 0; i < 500; i++)
            ASSERT_EQ(r[i].runs, 1);
        check(w);
        tw_wheel_destroy(w);
    }
}

static void test_move_and_cancel(void)
{
    for (size_t s = 0; s < NSHAPES; s++) {
        tw_wheel *w = make(s, 0);
        struct rec a = {.id = 1}, b = {.id = 2};
        tw_timer_init(&a.t, record, NULL);
        tw_timer_init(&b.t, record, NULL);
        ASSERT_EQ(tw_wheel_add(w, &a.t, 100), 0);
        ASSERT_EQ(tw_wheel_add(w, &a.t, 5000), 0); /* a move */
        ASSERT_EQ(tw_wheel_count(w), 1);
        ASSERT_EQ(tw_wheel_add(w, &b.t, 200), 0);
        ASSERT(tw_wheel_cancel(w, &b.t));
        ASSERT(!tw_wheel_cancel(w, &b.t)); /* second cancel: no-op */
        ASSERT_EQ(tw_wheel_count(w), 1);
        check(w);
        ASSERT_EQ(tw_wheel_advance(w, 4999), 0);
        ASSERT_EQ(tw_wheel_advance(w, 5000), 1);
        ASSERT_EQ(a.runs, 1);
        ASSERT_EQ(b.runs, 0);
        /* Move earlier, then into the past (becomes due). */
        ASSERT_EQ(tw_wheel_add(w, &a.t, 90000), 0);
        ASSERT_EQ(tw_wheel_add(w, &a.t, 6000), 0);
        ASSERT_EQ(tw_wheel_add(w, &a.t, 10), 0);
        ASSERT_EQ(tw_wheel_advance(w, 5000), 1);
        ASSERT_EQ(a.runs, 2);
        check(w);
        tw_wheel_destroy(w);
    }
}

/* Callback behaviours: cancel others, re-arm self at or before the current
 * tick (next advance) or later (same advance, in order). */
static struct rec cb[4];
static int cb_mode;

static void on_cb(tw_timer *t, void *arg)
{
    struct rec *r = TW_CONTAINER_OF(t, struct rec, t);
    (void)arg;
    record(t, NULL);
    uint64_t now = tw_wheel_now(cur_w);
    ASSERT_GE(now, tw_timer_expires(t)); /* the tick being processed */
    if (cb_mode == 0 && r->id == 0) {
        /* Same tick: pending unless it ran first (no set order). */
        ASSERT(tw_wheel_cancel(cur_w, &cb[1].t) == (cb[1].runs == 0));
        ASSERT(tw_wheel_cancel(cur_w, &cb[2].t)); /* later tick */
    } else if (cb_mode == 1 && r->runs < 1000) {
        ASSERT_EQ(tw_wheel_add(cur_w, t, now), 0); /* at the current tick */
    } else if (cb_mode == 2 && r->runs < 5) {
        ASSERT_EQ(tw_wheel_add(cur_w, t, now + 3), 0);
    }
}

static void test_callbacks(void)
{
    for (size_t s = 0; s < NSHAPES; s++) {
        for (cb_mode = 0; cb_mode < 3; cb_mode++) {
            tw_wheel *w = make(s, 0);
            for (int i = 0; i < 4; i++) {
                cb[i] = (struct rec){.id = i};
                tw_timer_init(&cb[i].t, on_cb, NULL);
            }
            if (cb_mode == 0) {
                ASSERT_EQ(tw_wheel_add(w, &cb[0].t, 50), 0);
                ASSERT_EQ(tw_wheel_add(w, &cb[1].t, 50), 0);
                ASSERT_EQ(tw_wheel_add(w, &cb[2].t, 60), 0);
                ASSERT_EQ(tw_wheel_add(w, &cb[3].t, 70), 0);
                /* cb[0] and cb[1] share a tick and run in no set order:
                 * cb[1] runs only if it came first. */
                size_t ran = tw_wheel_advance(w, 100);
                ASSERT_EQ(cb[2].runs, 0);
                ASSERT_EQ(cb[3].runs, 1);
                ASSERT_EQ(cb[0].runs, 1);
                ASSERT_EQ(ran, 2 + (size_t)cb[1].runs);
            } else if (cb_mode == 1) {
                /* Re-armed at the current tick: runs once per advance,
                 * never loops inside one. */
                ASSERT_EQ(tw_wheel_add(w, &cb[0].t, 10), 0);
                ASSERT_EQ(tw_wheel_advance(w, 20), 1);
                ASSERT_EQ(cb[0].runs, 1);
                ASSERT(tw_timer_pending(&cb[0].t));
                ASSERT_EQ(tw_wheel_advance(w, 20), 1);
                ASSERT_EQ(cb[0].runs, 2);
                ASSERT_EQ(tw_wheel_advance(w, 25), 1);
                ASSERT_EQ(cb[0].runs, 3);
                ASSERT(tw_wheel_cancel(w, &cb[0].t));
            } else {
                /* Re-armed 3 ticks later, within the same advance. */
                ASSERT_EQ(tw_wheel_add(w, &cb[0].t, 10), 0);
                ASSERT_EQ(tw_wheel_add(w, &cb[1].t, 15), 0);
                ASSERT_EQ(tw_wheel_advance(w, 1000), 5 + 5);
                ASSERT_EQ(cb[0].runs, 5);
                ASSERT_EQ(cb[1].runs, 5);
                for (size_t i = 1; i < nlog; i++)
                    ASSERT_LE(log_exp[i - 1], log_exp[i]);
                ASSERT_EQ(log_exp[nlog - 1], 15 + 4 * 3);
            }
            check(w);
            tw_wheel_destroy(w);
        }
    }
}

/* A jump across 2^62 ticks visits only occupied slots: with per-tick cost
 * this would not finish before the test's timeout. */
static void test_huge_jumps_are_cheap(void)
{
    for (size_t s = 0; s < NSHAPES; s++) {
        tw_wheel *w = make(s, 3);
        ASSERT_EQ(tw_wheel_advance(w, UINT64_C(1) << 62), 0); /* empty */
        struct rec a = {.id = 1}, b = {.id = 2};
        tw_timer_init(&a.t, record, NULL);
        tw_timer_init(&b.t, record, NULL);
        uint64_t now = tw_wheel_now(w);
        ASSERT_EQ(tw_wheel_add(w, &a.t, now + (UINT64_C(1) << 39) + 12345), 0);
        ASSERT_EQ(tw_wheel_add(w, &b.t, now + (UINT64_C(1) << 61)), 0);
        ASSERT_EQ(tw_wheel_advance(w, now + (UINT64_C(1) << 40)), 1);
        ASSERT_EQ(a.runs, 1);
        ASSERT_EQ(tw_wheel_advance(w, now + (UINT64_C(1) << 61) - 1), 0);
        ASSERT_EQ(tw_wheel_advance(w, UINT64_MAX), 1);
        ASSERT_EQ(b.runs, 1);
        check(w);
        tw_wheel_destroy(w);
    }
}

static void test_end_of_time(void)
{
    for (size_t s = 0; s < NSHAPES; s++) {
        tw_wheel *w = make(s, UINT64_MAX - 100);
        struct rec a = {.id = 1}, b = {.id = 2}, c = {.id = 3};
        tw_timer_init(&a.t, record, NULL);
        tw_timer_init(&b.t, record, NULL);
        tw_timer_init(&c.t, record, NULL);
        ASSERT_EQ(tw_wheel_add(w, &a.t, UINT64_MAX), 0);
        ASSERT_EQ(tw_wheel_add(w, &b.t, UINT64_MAX - 1), 0);
        ASSERT_EQ(tw_wheel_add(w, &c.t, UINT64_MAX - 64), 0);
        check(w);
        ASSERT_EQ(tw_wheel_advance(w, UINT64_MAX - 2), 1);
        ASSERT_EQ(tw_wheel_advance(w, UINT64_MAX - 1), 1);
        ASSERT_EQ(a.runs, 0);
        ASSERT_EQ(tw_wheel_advance(w, UINT64_MAX), 1);
        ASSERT_EQ(a.runs, 1);
        /* Adding at the end of time: due at once. */
        ASSERT_EQ(tw_wheel_add(w, &a.t, UINT64_MAX), 0);
        ASSERT_EQ(tw_wheel_advance(w, UINT64_MAX), 1);
        check(w);
        tw_wheel_destroy(w);
        /* A wheel starting at 0 holding a UINT64_MAX deadline. */
        w = make(s, 0);
        ASSERT_EQ(tw_wheel_add(w, &a.t, UINT64_MAX), 0);
        ASSERT_EQ(tw_wheel_advance(w, UINT64_MAX - 1), 0);
        ASSERT_EQ(tw_wheel_advance(w, UINT64_MAX), 1);
        tw_wheel_destroy(w);
    }
}

/* Sleep until next_expiry, advance, repeat: a timer is reached after at
 * most one extra wake-up per level. */
static void test_next_expiry_wakeups(void)
{
    for (size_t s = 0; s < NSHAPES; s++) {
        static const uint64_t delays[] = {1, 100, 5000, UINT64_C(1) << 30,
                                          (UINT64_C(1) << 50) + 7};
        for (size_t d = 0; d < 5; d++) {
            tw_wheel *w = make(s, 12345);
            struct rec a = {.id = 1};
            tw_timer_init(&a.t, record, NULL);
            uint64_t e = 12345 + delays[d];
            ASSERT_EQ(tw_wheel_add(w, &a.t, e), 0);
            unsigned wakes = 0;
            while (a.runs == 0) {
                uint64_t nx = tw_wheel_next_expiry(w);
                ASSERT_LE(nx, e);
                ASSERT_GT(nx, tw_wheel_now(w));
                tw_wheel_advance(w, nx);
                wakes++;
            }
            unsigned levels = shape_levels(&shapes[s]);
            ASSERT_LE(wakes, levels + 1);
            ASSERT_EQ(tw_wheel_next_expiry(w), UINT64_MAX);
            tw_wheel_destroy(w);
        }
    }
}

/* Rounds mode after cancels: the remembered slot minimum goes stale, which
 * costs at most one extra wake-up per such slot, and nothing is missed. */
static void test_next_expiry_after_cancel_in_rounds(void)
{
    tw_wheel_config cfg = {8, 2};
    tw_wheel *w;
    ASSERT_EQ(tw_wheel_create(&w, &cfg, 0), 0);
    cur_w = w;
    nlog = 0;
    struct rec r[4];
    static const uint64_t at[4] = {100, 612, 120, 632};
    for (int i = 0; i < 4; i++) {
        r[i] = (struct rec){.id = i};
        tw_timer_init(&r[i].t, record, NULL);
        ASSERT_EQ(tw_wheel_add(w, &r[i].t, at[i]), 0);
    }
    ASSERT(tw_wheel_cancel(w, &r[0].t));
    ASSERT(tw_wheel_cancel(w, &r[2].t));
    unsigned wakes = 0;
    while (r[1].runs == 0) {
        uint64_t nx = tw_wheel_next_expiry(w);
        ASSERT_LE(nx, 612);
        tw_wheel_advance(w, nx);
        wakes++;
    }
    ASSERT_EQ(nlog, 1);
    ASSERT_LE(wakes, 2 + 1 + 2); /* levels + 1, plus two stale slots */
    ASSERT_LE(tw_wheel_next_expiry(w), 632);
    ASSERT_EQ(tw_wheel_advance(w, 632), 1);
    check(w);
    tw_wheel_destroy(w);
}

static void test_destroy_drops_pending(void)
{
    for (size_t s = 0; s < NSHAPES; s++) {
        tw_wheel *w = make(s, 0);
        struct rec a = {.id = 1}, b = {.id = 2};
        tw_timer_init(&a.t, record, NULL);
        tw_timer_init(&b.t, record, NULL);
        ASSERT_EQ(tw_wheel_add(w, &a.t, 10), 0);
        ASSERT_EQ(tw_wheel_add(w, &b.t, 0), 0);
        tw_wheel_destroy(w);
        ASSERT_EQ(a.runs + b.runs, 0);
        /* Re-initialised, the timers work in a new wheel. */
        tw_timer_init(&a.t, record, NULL);
        w = make(s, 0);
        ASSERT_EQ(tw_wheel_add(w, &a.t, 10), 0);
        ASSERT_EQ(tw_wheel_advance(w, 10), 1);
        tw_wheel_destroy(w);
    }
}

/* Many timers in 1-tick steps: each runs exactly at its tick. */
static void test_tick_by_tick(void)
{
    for (size_t s = 0; s < NSHAPES; s++) {
        uint64_t rng = 7 + s;
        tw_wheel *w = make(s, 1);
        static struct rec r[300];
        for (int i = 0; i < 300; i++) {
            r[i] = (struct rec){.id = i};
            tw_timer_init(&r[i].t, record, NULL);
            ASSERT_EQ(tw_wheel_add(w, &r[i].t, 2 + tw_test_rand(&rng) % 3000),
                      0);
        }
        for (uint64_t t = 2; t <= 3002; t++) {
            size_t before = nlog;
            tw_wheel_advance(w, t);
            for (size_t i = before; i < nlog; i++)
                ASSERT_EQ(log_exp[i], t);
            if ((t & 255) == 0)
                check(w);
        }
        ASSERT_EQ(nlog, 300);
        tw_wheel_destroy(w);
    }
}

/* The value in [a, b] with the most trailing zero bits, by brute force. */
static uint64_t brute_coarsest(uint64_t a, uint64_t b)
{
    uint64_t best = a;
    int best_tz = a ? __builtin_ctzll(a) : 64;
    for (uint64_t x = a + 1; x <= b; x++) {
        int tz = x ? __builtin_ctzll(x) : 64;
        if (tz > best_tz) {
            best = x;
            best_tz = tz;
        }
    }
    return best;
}

static void test_window_choice(void)
{
    tw_wheel *w = make(0, 0);
    struct rec r = {.id = 1};
    tw_timer_init(&r.t, record, NULL);
    static const uint64_t cases[][3] = {
        /* earliest, latest, chosen */
        {1000, 1100, 1024},
        {1000, 1010, 1008},
        {5, 5, 5},
        {4096, 8191, 4096},
        {4097, 8191, 6144},
        {1, UINT64_MAX, UINT64_C(1) << 63},
        {UINT64_MAX - 1, UINT64_MAX, UINT64_MAX - 1},
        {3, 4, 4},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        ASSERT_EQ(tw_wheel_add_window(w, &r.t, cases[i][0], cases[i][1]), 0);
        ASSERT(tw_timer_pending(&r.t));
        ASSERT_EQ(tw_timer_expires(&r.t), cases[i][2]);
        check(w);
    }
    /* Against brute force on small windows. */
    uint64_t rng = 99;
    for (int i = 0; i < 20000; i++) {
        uint64_t a = 1 + tw_test_rand(&rng) % 5000;
        uint64_t b = a + tw_test_rand(&rng) % 700;
        ASSERT_EQ(tw_wheel_add_window(w, &r.t, a, b), 0);
        ASSERT_EQ(tw_timer_expires(&r.t), brute_coarsest(a, b));
    }
    /* Bad input changes nothing. */
    tw_wheel_cancel(w, &r.t);
    ASSERT_EQ(tw_wheel_add_window(w, &r.t, 10, 9), TW_EINVAL);
    ASSERT(!tw_timer_pending(&r.t));
    ASSERT_EQ(tw_wheel_add_window(NULL, &r.t, 1, 9), TW_EINVAL);
    ASSERT_EQ(tw_wheel_add_window(w, NULL, 1, 9), TW_EINVAL);
    struct rec nofn = {.id = 2};
    tw_timer_init(&nofn.t, NULL, NULL);
    ASSERT_EQ(tw_wheel_add_window(w, &nofn.t, 1, 9), TW_EINVAL);
    ASSERT_EQ(tw_wheel_count(w), 0);
    tw_wheel_destroy(w);
}

/* Windows run inside themselves, never early, and share wake-ups. */
static void test_window_runs_inside_and_coalesces(void)
{
    for (size_t s = 0; s < NSHAPES; s++) {
        uint64_t rng = 31 + s;
        tw_wheel *w = make(s, 1000);
        static struct rec r[1000];
        static uint64_t lo[1000], hi[1000];
        for (int i = 0; i < 1000; i++) {
            r[i] = (struct rec){.id = i};
            tw_timer_init(&r[i].t, record, NULL);
            lo[i] = 1001 + tw_test_rand(&rng) % 1000;
            hi[i] = lo[i] + 100;
            ASSERT_EQ(tw_wheel_add_window(w, &r[i].t, lo[i], hi[i]), 0);
            /* A 101-tick window holds a multiple of 64. */
            ASSERT_EQ(tw_timer_expires(&r[i].t) % 64, 0);
        }
        check(w);
        /* Sleep-until-timeout loop: count the wake-ups that ran work. */
        size_t wakeups = 0;
        uint64_t now = 1000;
        while (tw_wheel_count(w) > 0) {
            uint64_t dt = tw_wheel_timeout(w, now);
            ASSERT_NE(dt, TW_WHEEL_NO_TIMEOUT);
            now += dt;
            if (tw_wheel_advance(w, now) > 0)
                wakeups++;
        }
        ASSERT_EQ(nlog, 1000);
        for (size_t k = 0; k < nlog; k++) {
            int i = log_id[k];
            ASSERT_GE(log_exp[k], lo[i]);
            ASSERT_LE(log_exp[k], hi[i]);
        }
        /* 1000 exact deadlines would need up to 1000 wake-ups; the windows
         * share the multiples of 64 in [1024, 2048]. */
        ASSERT_LE(wakeups, 17);
        tw_wheel_destroy(w);
    }
}

/* A window already open is due at once, like tw_wheel_add(earliest). */
static void test_window_open(void)
{
    for (size_t s = 0; s < NSHAPES; s++) {
        tw_wheel *w = make(s, 500);
        struct rec a = {.id = 1};
        tw_timer_init(&a.t, record, NULL);
        ASSERT_EQ(tw_wheel_add_window(w, &a.t, 490, 600), 0);
        ASSERT_EQ(tw_timer_expires(&a.t), 490);
        ASSERT_EQ(nlog, 0); /* never inside add */
        ASSERT_EQ(tw_wheel_timeout(w, 500), 0);
        ASSERT_EQ(tw_wheel_advance(w, 500), 1);
        ASSERT_EQ(log_exp[0], 490);
        tw_wheel_destroy(w);
    }
}

static void test_timeout(void)
{
    for (size_t s = 0; s < NSHAPES; s++) {
        tw_wheel *w = make(s, 100);
        struct rec a = {.id = 1}, b = {.id = 2};
        tw_timer_init(&a.t, record, NULL);
        tw_timer_init(&b.t, record, NULL);
        ASSERT_EQ(tw_wheel_timeout(w, 100), TW_WHEEL_NO_TIMEOUT);
        ASSERT_EQ(tw_wheel_add(w, &a.t, 1100), 0);
        uint64_t dt = tw_wheel_timeout(w, 100);
        ASSERT_GT(dt, 0);
        ASSERT_LE(dt, 1000);
        /* The caller's clock may be ahead of the wheel's. */
        ASSERT_LE(tw_wheel_timeout(w, 600), 500);
        ASSERT_EQ(tw_wheel_timeout(w, 1100), 0);
        ASSERT_EQ(tw_wheel_timeout(w, 5000), 0);
        /* A loop that sleeps the timeout reaches the timer, never early,
         * within one extra wake-up per level. */
        uint64_t now = 100;
        unsigned wakes = 0;
        while (nlog == 0) {
            dt = tw_wheel_timeout(w, now);
            ASSERT_NE(dt, TW_WHEEL_NO_TIMEOUT);
            now += dt;
            tw_wheel_advance(w, now);
            ASSERT(nlog == 0 || now >= 1100);
            ASSERT_LE(++wakes, shape_levels(&shapes[s]) + 1);
        }
        ASSERT_EQ(now, 1100);
        ASSERT_EQ(tw_wheel_timeout(w, now), TW_WHEEL_NO_TIMEOUT);
        /* A timer added in the past: due now. */
        ASSERT_EQ(tw_wheel_add(w, &b.t, 3), 0);
        ASSERT_EQ(tw_wheel_timeout(w, now), 0);
        tw_wheel_cancel(w, &b.t);
        tw_wheel_destroy(w);
    }
    /* A timer at the end of time never reads as "nothing pending". */
    tw_wheel *w = make(0, 0);
    struct rec c = {.id = 3};
    tw_timer_init(&c.t, record, NULL);
    ASSERT_EQ(tw_wheel_add(w, &c.t, UINT64_MAX), 0);
    ASSERT_NE(tw_wheel_timeout(w, 0), TW_WHEEL_NO_TIMEOUT);
    ASSERT_GT(tw_wheel_timeout(w, 0), 0);
    tw_wheel_destroy(w);
}

/*
 * Many timers due at one tick, whose callbacks cancel others of the crowd
 * (chain heads, middles and tails of the lists being run) and move others
 * later. Every timer runs exactly once unless cancelled or moved first.
 * Run with the crowd reaching its tick through a level-0 slot (unaligned
 * tick) and through a visit of a higher level (tick aligned to 2^16).
 */
#define CROWD 100
static struct rec crowd[CROWD];
static int crowd_pending[CROWD];
static uint64_t crowd_tick, crowd_rng;

static void on_crowd(tw_timer *t, void *arg)
{
    struct rec *r = TW_CONTAINER_OF(t, struct rec, t);
    tw_wheel *w = arg;
    ASSERT(crowd_pending[r->id]);
    ASSERT_EQ(tw_timer_expires(t), tw_wheel_now(w));
    crowd_pending[r->id] = 0;
    r->runs++;
    for (int a = 0; a < 3; a++) {
        int j = (int)(tw_test_rand(&crowd_rng) % CROWD);
        uint64_t what = tw_test_rand(&crowd_rng) % 4;
        if (what == 0) {
            ASSERT_EQ(tw_wheel_cancel(w, &crowd[j].t), crowd_pending[j]);
            crowd_pending[j] = 0;
        } else if (what == 1) {
            ASSERT_EQ(tw_wheel_add(w, &crowd[j].t, crowd_tick + 5), 0);
            crowd_pending[j] = 1;
        }
    }
}

static void test_crowd_at_one_tick(void)
{
    static const uint64_t ticks[] = {(UINT64_C(1) << 20) + 200, UINT64_C(1)
                                                                    << 32};
    for (size_t s = 0; s < NSHAPES; s++) {
        for (size_t v = 0; v < 2; v++) {
            crowd_tick = ticks[v];
            crowd_rng = 5 + s * 2 + v;
            tw_wheel *w = make(s, crowd_tick - 100);
            for (int i = 0; i < CROWD; i++) {
                crowd[i] = (struct rec){.id = i};
                tw_timer_init(&crowd[i].t, on_crowd, w);
                ASSERT_EQ(tw_wheel_add(w, &crowd[i].t, crowd_tick), 0);
                crowd_pending[i] = 1;
            }
            check(w);
            size_t ran = tw_wheel_advance(w, crowd_tick);
            size_t left = 0, runs = 0;
            for (int i = 0; i < CROWD; i++) {
                left += (size_t)crowd_pending[i];
                runs += (size_t)crowd[i].runs;
                /* Whatever is still pending was moved to tick + 5. */
                ASSERT_EQ(tw_timer_pending(&crowd[i].t), crowd_pending[i]);
                if (crowd_pending[i])
                    ASSERT_EQ(tw_timer_expires(&crowd[i].t), crowd_tick + 5);
            }
            ASSERT_EQ(ran, runs);
            ASSERT_EQ(tw_wheel_count(w), left);
            ASSERT_GT(runs, 0);
            check(w);
            /* The moved ones run at tick + 5 (and move nothing further
             * than that tick, which this advance reaches too). */
            while (tw_wheel_count(w) > 0)
                tw_wheel_advance(w, crowd_tick + 5);
            for (int i = 0; i < CROWD; i++)
                ASSERT(!crowd_pending[i]);
            check(w);
            tw_wheel_destroy(w);
        }
    }
}

unsigned tw__wheel_widen_at(tw_wheel *w, size_t n); /* src/wheel.c */

static int calloc_fails, callocs;

static void *failing_calloc(size_t n, size_t size)
{
    callocs++;
    return calloc_fails ? NULL : calloc(n, size);
}

#define WN 9000
static tw_timer wt[WN];
static uint64_t wlast;
static size_t wran;

static void on_widen(tw_timer *t, void *arg)
{
    ASSERT_GE(tw_timer_expires(t), wlast); /* in order across a widening */
    wlast = tw_timer_expires(t);
    wran++;
    size_t i = (size_t)(t - wt);
    if (arg == NULL || i + 1 >= WN)
        return;
    /* A chain of adds from callbacks; one of them widens the table. */
    if (i == 10)
        ASSERT_EQ(tw_wheel_add(cur_w, &wt[WN - 2], UINT64_MAX - 1), 0);
    if (!tw_timer_pending(&wt[i + 1]))
        ASSERT_EQ(tw_wheel_add(cur_w, &wt[i + 1], wlast + 1 + i % 3000), 0);
}

/* A small wheel's slots hold one list each; a larger population widens them
 * (the only allocation after create). If that fails, the add succeeds and
 * the wheel keeps working, and a later add tries again. */
static void test_widen(void)
{
    tw_wheel *w = make(0, 100);
    uint64_t rng = 7;
    ASSERT_EQ(tw__wheel_widen_at(w, 4096), 1);
    ASSERT_EQ(tw_set_allocator(malloc, failing_calloc, realloc, free), 0);
    calloc_fails = 1;
    for (size_t i = 0; i < WN; i++) {
        if (i == WN / 2) {
            ASSERT_EQ(tw__wheel_widen_at(w, 0), 1); /* tried, failed */
            check(w);
            calloc_fails = 0; /* the next try, at twice the count, works */
        }
        rng = rng * 6364136223846793005u + 1442695040888963407u;
        tw_timer_init(&wt[i], on_widen, NULL);
        uint64_t e = 90 + (rng >> 44); /* some due, up to 2^20 ahead */
        ASSERT_EQ(tw_wheel_add(w, &wt[i], e), 0);
        ASSERT_EQ(callocs, (i + 1 >= 4096) + (i + 1 >= 8192));
        ASSERT_EQ(tw__wheel_widen_at(w, 0), i + 1 >= 8192 ? 8 : 1);
    }
    ASSERT_EQ(tw_set_allocator(malloc, calloc, realloc, free), 0);
    ASSERT_EQ(tw_wheel_count(w), WN);
    check(w);
    wlast = 0;
    wran = 0;
    while (tw_wheel_count(w) > 0)
        tw_wheel_advance(w, tw_wheel_next_expiry(w));
    ASSERT_EQ(wran, WN);
    check(w);
    tw_wheel_destroy(w);

    /* Widened by an add inside a callback, in the middle of an advance. */
    w = make(0, 0);
    ASSERT_EQ(tw__wheel_widen_at(w, 3), 1);
    for (size_t i = 0; i < WN; i++)
        tw_timer_init(&wt[i], on_widen, w);
    ASSERT_EQ(tw_wheel_add(w, &wt[0], 5), 0);
    ASSERT_EQ(tw_wheel_add(w, &wt[WN - 1], UINT64_MAX), 0);
    wlast = 0;
    wran = 0;
    ASSERT_EQ(tw_wheel_advance(w, UINT64_MAX), WN);
    ASSERT_EQ(wran, WN);
    ASSERT_EQ(tw__wheel_widen_at(w, 0), 8);
    ASSERT_EQ(tw_wheel_count(w), 0);
    check(w);
    tw_wheel_destroy(w);
}

/*
 * tw_wheel_add_unchecked() of idle timers gives exactly what tw_wheel_add()
 * gives: the same expiry, the same firing order, in every shape (so every
 * path: a list's first timer, the rounds level, a narrow and a widened
 * table, a due timer, a timer re-armed from its own callback). Where the
 * library checks its preconditions (no NDEBUG), a pending timer aborts.
 */
static uint64_t unchecked_order[2][1024];
static size_t unchecked_n[2];
static int use_unchecked; /* which add the variant under test uses */
static void rearm_once(tw_timer *t, void *arg)
{
    struct rec *r = TW_CONTAINER_OF(t, struct rec, t);
    record(t, arg);
    uint64_t e = tw_wheel_now(cur_w) + 7;
    if (r->runs == 1) /* idle inside its callback: may take either add */
        ASSERT_EQ(use_unchecked ? tw_wheel_add_unchecked(cur_w, t, e)
                                : tw_wheel_add(cur_w, t, e),
                  0);
}

static void test_add_unchecked(void)
{
    enum { N = 400 };
    static struct rec r[N];
    for (size_t s = 0; s < NSHAPES; s++) {
        for (int v = 0; v < 2; v++) {
            uint64_t rng = 77 + s;
            tw_wheel *w = make(s, 1000);
            use_unchecked = v;
            for (int i = 0; i < N; i++) {
                r[i] = (struct rec){.id = i};
                tw_timer_init(&r[i].t, rearm_once, NULL);
                uint64_t e = tw_test_rand(&rng) % 4 == 0
                                 ? 990 + tw_test_rand(&rng) % 20 /* due */
                                 : 1000 + tw_test_rand(&rng) % 300000;
                if (i % 97 == 5)
                    e = UINT64_MAX - tw_test_rand(&rng) % 5;
                ASSERT_EQ(v ? tw_wheel_add_unchecked(w, &r[i].t, e)
                            : tw_wheel_add(w, &r[i].t, e),
                          0);
                ASSERT(tw_timer_pending(&r[i].t));
                ASSERT_EQ(tw_timer_expires(&r[i].t), e);
                if (i % 50 == 0)
                    check(w);
            }
            ASSERT_EQ(tw_wheel_count(w), (size_t)N);
            check(w);
            tw_wheel_advance(w, 1000 + 300000 + 10);
            check(w);
            unchecked_n[v] = nlog;
            for (size_t k = 0; k < nlog; k++)
                unchecked_order[v][k] = log_exp[k] << 10 | (uint64_t)log_id[k];
            if (v == 1) {
                ASSERT_EQ(unchecked_n[1], unchecked_n[0]);
                for (size_t k = 0; k < nlog; k++)
                    ASSERT_EQ(unchecked_order[1][k], unchecked_order[0][k]);
            }
            tw_wheel_destroy(w);
        }
    }
#ifndef NDEBUG
    /* The preconditions, checked with assert() in this build. */
    tw_wheel *w = make(0, 0);
    struct rec a = {.id = 1};
    tw_timer_init(&a.t, record, NULL);
    ASSERT_EQ(tw_wheel_add(w, &a.t, 50), 0);
    fflush(NULL);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        signal(SIGABRT, SIG_DFL);
        FILE *quiet = freopen("/dev/null", "w", stderr); /* the expected
                                                            message */
        (void)quiet;
        (void)tw_wheel_add_unchecked(w, &a.t, 60); /* pending: aborts */
        _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT);
    ASSERT_EQ(tw_timer_expires(&a.t), 50); /* the parent's wheel untouched */
    tw_wheel_destroy(w);
#endif
}

/* tw_wheel_cancel_inline: the same results as tw_wheel_cancel (a twin
 * wheel with the same timers, cancelled with it) for the first, a middle
 * and the last timer of a list, a timer alone in its slot (the slot
 * becomes empty), a due timer and an idle one; on narrow and wide tables.
 * tw_wheel_cancel unmarks a slot it empties; the inline cancel leaves it
 * marked, so its wheel's next expiry may be earlier, by one wake-up that
 * runs nothing and unmarks the slot. */
struct twin {
    tw_wheel *w[2]; /* [0]: tw_wheel_cancel_inline, [1]: tw_wheel_cancel */
    struct rec r[2][6];
};

static void twin_cancel(struct twin *tw, int i, bool expect)
{
    ASSERT_EQ(tw_wheel_cancel_inline(tw->w[0], &tw->r[0][i].t), expect);
    ASSERT_EQ(tw_wheel_cancel(tw->w[1], &tw->r[1][i].t), expect);
    ASSERT(!tw_timer_pending(&tw->r[0][i].t));
    for (int k = 0; k < 2; k++)
        check(tw->w[k]);
    ASSERT_EQ(tw_wheel_count(tw->w[0]), tw_wheel_count(tw->w[1]));
    ASSERT_EQ(tw__wheel_stale_slots(tw->w[1]), 0);
    ASSERT_LE(tw_wheel_next_expiry(tw->w[0]), tw_wheel_next_expiry(tw->w[1]));
}

static void twin_add(struct twin *tw, int i, uint64_t at)
{
    for (int k = 0; k < 2; k++)
        ASSERT_EQ(tw_wheel_add(tw->w[k], &tw->r[k][i].t, at), 0);
}

static void test_cancel_inline(void)
{
    for (size_t s = 0; s < NSHAPES; s++) {
        for (int wide = 0; wide < 2; wide++) {
            struct twin tw;
            for (int k = 0; k < 2; k++) {
                tw.w[k] = make(s, 10);
                if (wide)
                    tw__wheel_widen_at(tw.w[k], 1);
                for (int i = 0; i < 6; i++) {
                    tw.r[k][i] = (struct rec){.id = i};
                    tw_timer_init(&tw.r[k][i].t, record, NULL);
                }
            }
            /* r[0..2] share a tick, r[3] is alone and earliest, r[4] is
             * due, r[5] is never added. */
            static const uint64_t at[5] = {300, 300, 300, 200, 5};
            for (int i = 0; i < 5; i++)
                twin_add(&tw, i, at[i]);
            twin_cancel(&tw, 5, false); /* idle */
            twin_cancel(&tw, 4, true);  /* due */
            twin_cancel(&tw, 3, true);  /* alone in its slot */
            if (shapes[s].slots != 1) {
                /* (One slot: r[3] shared it with r[0..2].) r[3]'s slot
                 * stays marked in the inline cancel's wheel: its tick is
                 * named, and the advance to it runs nothing and unmarks
                 * it; then both wheels name the same tick. */
                ASSERT_EQ(tw__wheel_stale_slots(tw.w[0]), 1);
                uint64_t at0 = tw_wheel_next_expiry(tw.w[0]);
                ASSERT(at0 < tw_wheel_next_expiry(tw.w[1]));
                for (int k = 0; k < 2; k++)
                    ASSERT_EQ(tw_wheel_advance(tw.w[k], at0), 0);
                ASSERT_EQ(tw__wheel_stale_slots(tw.w[0]), 0);
                ASSERT_EQ(tw_wheel_next_expiry(tw.w[0]),
                          tw_wheel_next_expiry(tw.w[1]));
            }
            twin_cancel(&tw, 1, true);
            twin_cancel(&tw, 1, false); /* twice */
            ASSERT_EQ(tw_wheel_count(tw.w[0]), 2);
            nlog = 0;
            ASSERT_EQ(tw_wheel_advance(tw.w[0], 1000), 2);
            ASSERT_EQ(tw.r[0][0].runs + tw.r[0][2].runs, 2);
            ASSERT_EQ(tw.r[0][1].runs + tw.r[0][3].runs + tw.r[0][4].runs, 0);
            ASSERT_EQ(tw_wheel_advance(tw.w[1], 1000), 2);
            /* Every timer of a slot, first to last and last to first. */
            for (int order = 0; order < 2; order++) {
                for (int i = 0; i < 3; i++)
                    twin_add(&tw, i, 2000);
                for (int i = 0; i < 3; i++)
                    twin_cancel(&tw, order ? 2 - i : i, true);
                ASSERT_EQ(tw_wheel_count(tw.w[0]), 0);
                ASSERT_EQ(tw_wheel_next_expiry(tw.w[0]), UINT64_MAX);
            }
            for (int k = 0; k < 2; k++) {
                ASSERT_EQ(tw_wheel_advance(tw.w[k], 5000), 0);
                tw_wheel_destroy(tw.w[k]);
            }
        }
    }
}

int main(void)
{
    RUN_TEST(test_sizes_and_version);
    RUN_TEST(test_create_bad_input);
    RUN_TEST(test_add_bad_input);
    RUN_TEST(test_exact_once_never_early);
    RUN_TEST(test_due_runs_next_advance_not_in_add);
    RUN_TEST(test_backwards_changes_nothing);
    RUN_TEST(test_order_in_one_jump);
    RUN_TEST(test_move_and_cancel);
    RUN_TEST(test_callbacks);
    RUN_TEST(test_huge_jumps_are_cheap);
    RUN_TEST(test_end_of_time);
    RUN_TEST(test_next_expiry_wakeups);
    RUN_TEST(test_next_expiry_after_cancel_in_rounds);
    RUN_TEST(test_destroy_drops_pending);
    RUN_TEST(test_tick_by_tick);
    RUN_TEST(test_window_choice);
    RUN_TEST(test_window_runs_inside_and_coalesces);
    RUN_TEST(test_window_open);
    RUN_TEST(test_timeout);
    RUN_TEST(test_crowd_at_one_tick);
    RUN_TEST(test_widen);
    RUN_TEST(test_add_unchecked);
    RUN_TEST(test_cancel_inline);
    return tw_test_done();
}
