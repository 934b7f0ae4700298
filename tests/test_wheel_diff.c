/* SPDX-License-Identifier: MIT */
/*
 * Randomized differential test of the core wheel against a reference model.
 *
 * The model keeps, per timer, whether it is pending and its expiry, and a
 * binary heap (by expiry) of the pending timers that may run in the current
 * advance. Every callback checks that the wheel runs a timer the model
 * agrees is due: pending, not armed during this advance for a tick it has
 * already passed, expiry <= now, and no model timer that could run has a
 * smaller expiry (so the order is non-decreasing and nothing is skipped).
 * After each advance nothing runnable may remain, and the return value,
 * tw_wheel_count(), tw_timer_pending() and tw_wheel_next_expiry() must
 * agree with the model. The invariant checker runs after every step.
 *
 * Usage: test_wheel_diff [ops-per-config] [seed]
 */
#include "wheel_internal.h"
#include "test.h"

#include <twheel/wheel.h>

#define NT 96 /* timers per epoch */

unsigned tw__wheel_widen_at(tw_wheel *w, size_t n); /* src/wheel.c */

struct mtimer {
    tw_timer t;
    int idx;
};

struct heap_ent {
    uint64_t e;
    uint32_t idx, ver;
};

struct model {
    tw_wheel *w;
    struct mtimer tm[NT];
    int pending[NT];
    uint64_t exp[NT];
    uint32_t ver[NT];
    int deferred[NT]; /* armed during this advance for a passed tick */
    struct heap_ent heap[1 << 16];
    size_t hn;
    size_t npending;
    uint64_t rng;
    uint64_t now;       /* the advance target */
    uint64_t proc;      /* tick being processed, as the model sees it */
    uint64_t prev_now;  /* wheel time before the advance */
    uint64_t last_fire; /* expiry of the previous callback in this advance */
    int in_advance;
    size_t fired;
    unsigned levels; /* for the wake-up bound */
    int quiet;       /* callbacks take no actions */
    int crowd;       /* most expiries in a few level-1 slots */
    uint64_t stats_fired, stats_cb_ops;
};

static struct model M;

static void heap_push(uint64_t e, uint32_t idx, uint32_t ver)
{
    size_t i = M.hn++;
    ASSERT(M.hn <= sizeof(M.heap) / sizeof(M.heap[0]));
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (M.heap[p].e <= e)
            break;
        M.heap[i] = M.heap[p];
        i = p;
    }
    M.heap[i] = (struct heap_ent){e, idx, ver};
}

static void heap_pop(void)
{
    struct heap_ent last = M.heap[--M.hn];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= M.hn)
            break;
        if (c + 1 < M.hn && M.heap[c + 1].e < M.heap[c].e)
            c++;
        if (last.e <= M.heap[c].e)
            break;
        M.heap[i] = M.heap[c];
        i = c;
    }
    if (M.hn > 0)
        M.heap[i] = last;
}

/* Smallest live heap entry (stale ones are dropped), or NULL. */
static const struct heap_ent *heap_top(void)
{
    while (M.hn > 0) {
        const struct heap_ent *h = &M.heap[0];
        if (M.pending[h->idx] && !M.deferred[h->idx] && M.ver[h->idx] == h->ver)
            return h;
        heap_pop();
    }
    return NULL;
}

/* Rebuild the heap when stale entries pile up. */
static void heap_compact(void)
{
    if (M.hn < 8 * NT)
        return;
    M.hn = 0;
    for (int i = 0; i < NT; i++)
        if (M.pending[i] && !M.deferred[i])
            heap_push(M.exp[i], (uint32_t)i, M.ver[i]);
}

static uint64_t rnd(void)
{
    return tw_test_rand(&M.rng);
}

/* An expiry drawn from many shapes: past, now, near, edges, far, max. */
static uint64_t pick_expiry(uint64_t base)
{
    uint64_t r = rnd();
    uint64_t e;
    if (M.crowd && r % 4 != 0) {
        /* A few level-1 slots of a 256-slot wheel: long lists there, and
         * cascades of crowded slots. */
        e = base + 300 + rnd() % 600;
        return e < base ? UINT64_MAX : e;
    }
    switch (r % 12) {
    case 0: /* in the past */
        e = base - (base < 100 ? base : rnd() % 100);
        break;
    case 1:
        e = base;
        break;
    case 2:
    case 3:
        e = base + 1 + rnd() % 16;
        break;
    case 4:
    case 5:
        e = base + 1 + rnd() % 4096;
        break;
    case 6: { /* just around a power-of-two edge (slot and level edges) */
        unsigned sh = (unsigned)(rnd() % 63);
        uint64_t edge = UINT64_C(1) << sh;
        uint64_t off = rnd() % 3;
        uint64_t d = edge - 1 + off;
        e = base > UINT64_MAX - d ? UINT64_MAX : base + d;
        break;
    }
    case 7: { /* aligned to a level boundary after base */
        unsigned sh = (unsigned)(rnd() % 63);
        uint64_t a = ((base >> sh) + 1 + rnd() % 3);
        e = a > (UINT64_MAX >> sh) ? UINT64_MAX : a << sh;
        break;
    }
    case 8:
        e = base + (rnd() % (UINT64_C(1) << 30));
        if (e < base)
            e = UINT64_MAX;
        break;
    case 9:
        e = rnd(); /* anywhere, often far future or far past */
        break;
    case 10:
        e = UINT64_MAX - rnd() % 3;
        break;
    default:
        e = base + 1 + rnd() % 300;
        if (e < base)
            e = UINT64_MAX;
        break;
    }
    return e;
}

/* The model's side of an add made at processing tick @proc. */
static void model_add(int i, uint64_t e, int inside_callback)
{
    M.pending[i] = 1;
    M.exp[i] = e;
    M.ver[i]++;
    M.deferred[i] = 0;
    if (inside_callback && e <= M.proc) {
        M.deferred[i] = 1; /* runs in the next advance, not this one */
    } else {
        heap_push(e, (uint32_t)i, M.ver[i]);
    }
}

static void do_add(int i, uint64_t e, int inside_callback)
{
    if (!M.pending[i]) {
        M.npending++;
        /* An idle timer may take the add that does not read it: it must
         * behave exactly as tw_wheel_add(). */
        if (rnd() % 2 == 0) {
            ASSERT_EQ(tw_wheel_add_unchecked(M.w, &M.tm[i].t, e), 0);
            model_add(i, e, inside_callback);
            return;
        }
    }
    ASSERT_EQ(tw_wheel_add(M.w, &M.tm[i].t, e), 0);
    model_add(i, e, inside_callback);
}

/*
 * A window [e, e + width]: the wheel picks the tick, the model checks it is
 * inside (or is @e when the window is already open) and then treats the
 * timer as an exact one at that tick.
 */
static void do_add_window(int i, uint64_t e, int inside_callback)
{
    uint64_t width = rnd() % 4 == 0 ? 0 : rnd() % (UINT64_C(1) << (rnd() % 40));
    uint64_t latest = e > UINT64_MAX - width ? UINT64_MAX : e + width;
    uint64_t wnow = tw_wheel_now(M.w);
    if (!M.pending[i])
        M.npending++;
    ASSERT_EQ(tw_wheel_add_window(M.w, &M.tm[i].t, e, latest), 0);
    uint64_t chosen = tw_timer_expires(&M.tm[i].t);
    if (e <= wnow) {
        ASSERT_EQ(chosen, e);
    } else {
        ASSERT_GE(chosen, e);
        ASSERT_LE(chosen, latest);
    }
    model_add(i, chosen, inside_callback);
}

static void do_cancel(int i)
{
    static unsigned n;
    /* Every other cancel through the inline one: the same results. */
    bool was = n++ % 2 ? tw_wheel_cancel_inline(M.w, &M.tm[i].t)
                       : tw_wheel_cancel(M.w, &M.tm[i].t);
    ASSERT_EQ(was, M.pending[i]);
    if (M.pending[i]) {
        M.npending--;
        M.pending[i] = 0;
        M.deferred[i] = 0;
        M.ver[i]++;
    }
}

static void on_fire(tw_timer *t, void *arg)
{
    struct mtimer *mt = TW_CONTAINER_OF(t, struct mtimer, t);
    int i = mt->idx;
    ASSERT(arg == &M);
    ASSERT(M.in_advance);
    ASSERT(M.pending[i]);
    ASSERT(!M.deferred[i]);
    ASSERT(!tw_timer_pending(t));
    uint64_t e = M.exp[i];
    ASSERT_EQ(tw_timer_expires(t), e);
    ASSERT_LE(e, M.now);       /* never early */
    ASSERT_GE(e, M.last_fire); /* non-decreasing */
    const struct heap_ent *top = heap_top();
    ASSERT_NOT_NULL(top);
    ASSERT_EQ(top->e, e); /* nothing runnable with a smaller expiry */
    M.last_fire = e;
    M.pending[i] = 0;
    M.ver[i]++;
    M.npending--;
    M.fired++;
    M.stats_fired++;
    /* The tick being processed: the expiry, or the old time for timers
     * that were already due when the advance began. */
    M.proc = e > M.prev_now ? e : M.prev_now;
    ASSERT_EQ(tw_wheel_now(M.w), M.proc);

    /* Callbacks that cancel others, move others, re-arm themselves. */
    uint64_t r = M.quiet ? 16 : rnd() % 16;
    if (r < 3) {
        do_cancel((int)(rnd() % NT));
        M.stats_cb_ops++;
    } else if (r < 6) {
        do_add(i, pick_expiry(M.proc), 1);
        M.stats_cb_ops++;
    } else if (r < 8) {
        int j = (int)(rnd() % NT);
        do_add(j, pick_expiry(M.proc), 1);
        M.stats_cb_ops++;
    } else if (r < 9 && (rnd() & 1)) {
        do_add_window((int)(rnd() % NT), pick_expiry(M.proc), 1);
        M.stats_cb_ops++;
    } else if (r < 9) {
        /* Cancel and re-add self in one callback. */
        do_add(i, pick_expiry(M.proc), 1);
        do_cancel(i);
        M.stats_cb_ops++;
    }
}

static void check_state(int full)
{
    int r = full ? tw__wheel_check_full(M.w) : tw__wheel_check(M.w);
    ASSERT_EQ(r, 0);
    ASSERT_EQ(tw_wheel_count(M.w), M.npending);
    uint64_t min = UINT64_MAX;
    for (int i = 0; i < NT; i++) {
        ASSERT_EQ(tw_timer_pending(&M.tm[i].t), M.pending[i]);
        if (M.pending[i] && M.exp[i] < min)
            min = M.exp[i];
    }
    uint64_t nx = tw_wheel_next_expiry(M.w);
    ASSERT_LE(nx, min);
    if (M.npending == 0)
        ASSERT_EQ(nx, UINT64_MAX);
    /* The event-loop timeout, from the wheel's time and from later. */
    for (uint64_t ahead = 0; ahead <= 2; ahead++) {
        uint64_t now = M.now > UINT64_MAX - ahead ? UINT64_MAX : M.now + ahead;
        uint64_t to = tw_wheel_timeout(M.w, now);
        if (M.npending == 0)
            ASSERT_EQ(to, TW_WHEEL_NO_TIMEOUT);
        else if (min <= now)
            ASSERT_EQ(to, 0);
        else
            ASSERT_LE(to, min - now);
    }
    ASSERT_EQ(tw_wheel_now(M.w), M.now);
}

static void do_advance(uint64_t to)
{
    if (to < M.now) {
        /* Going back changes nothing. */
        size_t before = tw_wheel_count(M.w);
        ASSERT_EQ(tw_wheel_advance(M.w, to), 0);
        ASSERT_EQ(tw_wheel_count(M.w), before);
        return;
    }
    M.prev_now = M.now;
    M.now = to;
    M.proc = M.prev_now;
    M.last_fire = 0;
    M.in_advance = 1;
    M.fired = 0;
    size_t ran = tw_wheel_advance(M.w, to);
    M.in_advance = 0;
    ASSERT_EQ(ran, M.fired);
    const struct heap_ent *top = heap_top();
    ASSERT(top == NULL || top->e > to); /* nothing runnable left behind */
    for (int i = 0; i < NT; i++)
        if (M.deferred[i]) {
            M.deferred[i] = 0;
            heap_push(M.exp[i], (uint32_t)i, M.ver[i]);
        }
    heap_compact();
}

/* Sleep-until-next-expiry loop: every timer is reached within `levels`
 * extra wake-ups (checked on a fresh state with no more adds). */
static void drain_by_next_expiry(void)
{
    size_t idle_wakes = 0;
    /* Slots that tw_wheel_cancel_inline() emptied stay marked until a
     * visit: one wake-up each at most (quiet callbacks cancel nothing). */
    size_t stale = tw__wheel_stale_slots(M.w);
    M.quiet = 1;
    while (M.npending > 0) {
        uint64_t nx = tw_wheel_next_expiry(M.w);
        if (nx < M.now)
            nx = M.now;
        size_t before = M.stats_fired;
        do_advance(nx);
        ASSERT_EQ(tw__wheel_check(M.w), 0);
        /* Wake-ups that run nothing: one per level at most, plus one per
         * slot whose remembered minimum went stale through a cancel, plus
         * one per slot left marked by the inline cancel. */
        idle_wakes = M.stats_fired == before ? idle_wakes + 1 : 0;
        ASSERT_LE(idle_wakes, M.levels + NT + 1 + stale);
    }
    M.quiet = 0;
}

static void run_config(const char *name, const tw_wheel_config *cfg,
                       uint64_t ops, uint64_t seed)
{
    uint64_t done = 0, epochs = 0;
    M.rng = seed;
    M.stats_fired = M.stats_cb_ops = 0;
    while (done < ops) {
        uint64_t starts[4] = {0, rnd(), UINT64_MAX - (rnd() % (1u << 24)),
                              (UINT64_C(1) << 63) - 5};
        uint64_t start = starts[rnd() % 4];
        ASSERT_EQ(tw_wheel_create(&M.w, cfg, start), 0);
        /* Half the epochs widen the slot-head table at a count they soon
         * reach (maybe inside a callback), the others never do. (A count
         * drawn up to 2 * NT was reached in few epochs: about 20 of 600.)
         * A quarter crowd a few level-1 slots with short steps. */
        if (rnd() & 1)
            tw__wheel_widen_at(M.w, 1 + rnd() % 32);
        M.crowd = rnd() % 4 == 0;
        M.levels = cfg == NULL || cfg->levels == 0 ? 64 : cfg->levels;
        M.now = start;
        M.npending = 0;
        M.hn = 0;
        for (int i = 0; i < NT; i++) {
            M.tm[i].idx = i;
            tw_timer_init(&M.tm[i].t, on_fire, &M);
            M.pending[i] = 0;
            M.deferred[i] = 0;
        }
        uint64_t steps = 2000 + rnd() % 20000;
        for (uint64_t s = 0; s < steps && done < ops; s++, done++) {
            uint64_t r = rnd() % 100;
            int i = (int)(rnd() % NT);
            if (r < 32) {
                do_add(i, pick_expiry(M.now), 0);
            } else if (r < 40) {
                do_add_window(i, pick_expiry(M.now), 0);
            } else if (r < 55) {
                do_cancel(i);
            } else {
                uint64_t step;
                uint64_t q = rnd() % 20;
                if (M.crowd && q >= 15)
                    q = rnd() % 15; /* short steps: the slots fill */
                if (q < 4)
                    step = 0;
                else if (q < 10)
                    step = 1;
                else if (q < 15)
                    step = rnd() % 64;
                else if (q < 18)
                    step = rnd() % 70000;
                else if (q < 19)
                    step = rnd() % (UINT64_C(1) << 40);
                else
                    step = rnd(); /* huge: often to the end of time */
                uint64_t to =
                    M.now > UINT64_MAX - step ? UINT64_MAX : M.now + step;
                if (rnd() % 50 == 0 && M.now > 0)
                    to = M.now - 1 - rnd() % (M.now < 10 ? M.now : 10);
                do_advance(to);
            }
            check_state((s & 1023) == 0);
        }
        drain_by_next_expiry();
        check_state(1);
        tw_wheel_destroy(M.w);
        epochs++;
    }
    printf("%-12s %" PRIu64 " ops, %" PRIu64 " epochs, %" PRIu64
           " callbacks, %" PRIu64 " callback actions: 0 mismatches\n",
           name, ops, epochs, M.stats_fired, M.stats_cb_ops);
}

int main(int argc, char **argv)
{
    uint64_t ops = argc > 1 ? strtoull(argv[1], NULL, 10) : 1000000;
    uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 10) : 12345;
    static const tw_wheel_config netty = {512, 1}, l3 = {64, 3}, l2 = {8, 2},
                                 one = {1, 1}, big = {4096, 0},
                                 huge = {1u << 18, 0};
    run_config("default", NULL, ops, seed);
    run_config("{512,1}", &netty, ops, seed + 1);
    run_config("{64,3}", &l3, ops, seed + 2);
    run_config("{8,2}", &l2, ops, seed + 3);
    run_config("{1,1}", &one, ops, seed + 4);
    run_config("{4096,0}", &big, ops / 4, seed + 5);
    /* Three-layer occupancy bitmaps; few ops, as every full check scans
     * 4 levels x 2^18 slots x 8 chains. */
    run_config("{2^18,0}", &huge, ops / 50, seed + 6);
    printf("7 passed, 0 failed\n");
    return 0;
}
