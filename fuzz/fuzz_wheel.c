/* SPDX-License-Identifier: MIT */
/*
 * fuzz/fuzz_wheel.c - differential fuzzing of the core wheel.
 *
 * The input picks a configuration and a start time, then a sequence of
 * actions on a small set of timers: add (and move), cancel, advance to a
 * chosen tick, advance to tw_wheel_next_expiry() as an event loop would,
 * program what a timer's callback does when it runs (re-arm itself, add,
 * move or cancel another timer), re-initialise, and misuse (a timer without
 * a callback). Ticks are drawn from the corners: 0, 1, now, now +- small,
 * slot and level boundaries, powers of two, UINT64_MAX and near it.
 *
 * A reference model (an array of timers, each with its expiry and pending
 * flag) predicts everything, and every callback is checked as it runs:
 * nothing early, nothing twice, nothing cancelled, non-decreasing expiry
 * order, no pending timer skipped; after each advance nothing due is left,
 * the return value is the number of callbacks, and count, now and
 * next_expiry agree with the model. The wheel's own invariant checker
 * (tw__wheel_check) runs after every action.
 *
 * Rules taken from include/twheel/wheel.h:
 * - advance(now) below the wheel's time changes nothing;
 * - one advance runs timers in non-decreasing expiry order, those that were
 *   already due when it started (expires <= the wheel's time) included;
 * - the tick being processed is the running timer's expiry, or for a timer
 *   that was already due, the wheel's time when the advance started; a
 *   timer armed from a callback for a tick at or before it waits for the
 *   next advance; one armed for a later tick <= now runs in this advance.
 */
#include <stdbool.h>
#include <string.h>

#include <twheel/wheel.h>

#include "fuzz.h"
#include "wheel_internal.h"

#define NT 16

enum {
    ACT_NONE,
    ACT_REARM,
    ACT_CANCEL,
    ACT_ADD,
    ACT_CANCEL_SELF,
    ACT_REARM_CANCEL,
    ACT_COUNT
};

/* A tick described relative to a base that is only known later. */
typedef struct fz_when {
    uint8_t sel, small;
    uint64_t raw;
} fz_when;

typedef struct ftimer {
    tw_timer t;
    unsigned idx;
    /* The model. */
    bool pending;
    bool deferred; /* armed by a callback for a tick already processed */
    uint64_t expires;
    /* What the callback does, for the next @reps runs. */
    uint8_t act, reps, target;
    fz_when when;
} ftimer;

static struct {
    tw_wheel *w;
    uint64_t slots;  /* after rounding */
    unsigned levels; /* levels in use */
    bool rounds;     /* the top level keeps timers of later rounds */
    uint64_t now;    /* model time */
    ftimer tm[NT];
    tw_timer nofn;
    /* During an advance. */
    bool in_adv;
    uint64_t adv_to, start, cur;
    uint64_t last; /* expiry of the last timer run in this advance */
    size_t fired;
    /* An inline cancel may have left a slot marked and empty since the
     * last count of such slots found none (the count scans every slot). */
    bool maybe_stale;
} S;

/* FZ_TRACE=1 in the environment prints every step (for a crash input). */
static int trace = -1;
#define TRACE(...)                                                             \
    do {                                                                       \
        if (trace)                                                             \
            fprintf(stderr, __VA_ARGS__);                                      \
    } while (0)

static uint64_t eval_when(const fz_when *wh, uint64_t base)
{
    uint64_t s = wh->small;
    switch (wh->sel % 12) {
    case 0:
        return 0;
    case 1:
        return 1;
    case 2:
        return UINT64_MAX;
    case 3:
        return UINT64_MAX - s;
    case 4:
        return fz_sat_add(base, s);
    case 5:
        return fz_sat_sub(base, s);
    case 6:
    case 7: {
        /* A level boundary: slots^k ticks away, or the next multiple of
         * slots^k, then -1, 0 or +1. */
        uint64_t m = fz_sat_pow(S.slots, 1 + (unsigned)(s % S.levels));
        uint64_t e;
        if (wh->sel % 12 == 6 || m == UINT64_MAX)
            e = fz_sat_add(base, m);
        else
            e = fz_sat_add(base - base % m, m);
        switch (s / 16 % 3) {
        case 0:
            return fz_sat_sub(e, 1);
        case 1:
            return e;
        default:
            return fz_sat_add(e, 1);
        }
    }
    case 8:
        return wh->raw;
    case 9:
        return fz_sat_add(base, UINT64_C(1) << (s % 64));
    case 10:
        return base;
    default:
        return fz_sat_add(base, 1);
    }
}

static fz_when read_when(fz_reader *r)
{
    fz_when wh;
    wh.sel = fz_u8(r);
    wh.small = fz_u8(r);
    wh.raw = wh.sel % 12 == 8 ? fz_u64(r) : 0;
    return wh;
}

static size_t model_count(void)
{
    size_t n = 0;
    for (int i = 0; i < NT; i++)
        n += S.tm[i].pending;
    return n;
}

static uint64_t model_key(const ftimer *f)
{
    return f->expires > S.start ? f->expires : S.start;
}

static void model_add(ftimer *f, uint64_t e)
{
    /* An idle timer takes the add that does not read it half the time. */
    bool unchecked = !f->pending && ((e ^ f->idx) & 1);
    int rc = unchecked ? tw_wheel_add_unchecked(S.w, &f->t, e)
                       : tw_wheel_add(S.w, &f->t, e);
    TRACE("  add%s %u at %" PRIu64 "%s\n", unchecked ? " (unchecked)" : "",
          f->idx, e, S.in_adv ? " (cb)" : "");
    FZ_CHECK(rc == 0, "add(%u, %" PRIu64 ") = %d", f->idx, e, rc);
    f->pending = true;
    f->expires = e;
    f->deferred = S.in_adv && e <= S.cur;
    FZ_CHECK(tw_timer_pending(&f->t), "timer %u not pending after add", f->idx);
    FZ_CHECK(tw_timer_expires(&f->t) == e, "expires %" PRIu64 " != %" PRIu64,
             tw_timer_expires(&f->t), e);
}

/* A window [e, e + 2^shift - 1]: any tick inside it (or e itself when the
 * window is already open); then the model treats the timer as exact. */
static void model_add_window(ftimer *f, uint64_t e, unsigned shift)
{
    uint64_t width = shift >= 64 ? UINT64_MAX : (UINT64_C(1) << shift) - 1;
    uint64_t latest = fz_sat_add(e, width);
    uint64_t wnow = tw_wheel_now(S.w);
    int rc = tw_wheel_add_window(S.w, &f->t, e, latest);
    uint64_t c = tw_timer_expires(&f->t);
    TRACE("  window %u [%" PRIu64 ", %" PRIu64 "] -> %" PRIu64 "%s\n", f->idx,
          e, latest, c, S.in_adv ? " (cb)" : "");
    FZ_CHECK(rc == 0, "add_window(%u, %" PRIu64 ") = %d", f->idx, e, rc);
    FZ_CHECK(e <= wnow ? c == e : c >= e && c <= latest,
             "window [%" PRIu64 ", %" PRIu64 "] chose %" PRIu64, e, latest, c);
    f->pending = true;
    f->expires = c;
    f->deferred = S.in_adv && c <= S.cur;
    FZ_CHECK(tw_timer_pending(&f->t), "timer %u not pending after add", f->idx);
}

static void model_cancel(ftimer *f)
{
    /* Odd timers through the inline cancel: the same results. */
    bool r = f->idx % 2 ? tw_wheel_cancel_inline(S.w, &f->t)
                        : tw_wheel_cancel(S.w, &f->t);
    TRACE("  cancel %u -> %d\n", f->idx, r);
    if (r && f->idx % 2)
        S.maybe_stale = true;
    FZ_CHECK(r == f->pending, "cancel(%u) = %d, model pending %d", f->idx, r,
             f->pending);
    f->pending = false;
    f->deferred = false;
    FZ_CHECK(!tw_timer_pending(&f->t), "timer %u pending after cancel", f->idx);
}

static void on_fire(tw_timer *t, void *arg)
{
    ftimer *f = TW_CONTAINER_OF(t, ftimer, t);
    FZ_CHECK(arg == &S.tm[f->idx], "wrong arg");
    FZ_CHECK(S.in_adv, "callback outside advance");
    FZ_CHECK(f->pending,
             "timer %u ran but was not pending (ran twice, or "
             "after a cancel)",
             f->idx);
    FZ_CHECK(!f->deferred,
             "timer %u armed by a callback for tick %" PRIu64
             " <= current %" PRIu64 " ran in the same advance",
             f->idx, f->expires, S.cur);
    FZ_CHECK(f->expires <= S.adv_to,
             "timer %u ran early: expires %" PRIu64 ", advance to %" PRIu64,
             f->idx, f->expires, S.adv_to);
    FZ_CHECK(!tw_timer_pending(t), "timer %u pending in its callback", f->idx);
    FZ_CHECK(tw_timer_expires(t) == f->expires, "expires changed");
    FZ_CHECK(f->expires >= S.last,
             "order: timer %u (expires %" PRIu64
             ") after one that expires at %" PRIu64,
             f->idx, f->expires, S.last);
    for (int i = 0; i < NT; i++) {
        const ftimer *o = &S.tm[i];
        FZ_CHECK(!(o->pending && !o->deferred && o->expires < f->expires),
                 "timer %d (expires %" PRIu64 ") skipped: %u (expires %" PRIu64
                 ") ran first",
                 i, o->expires, f->idx, f->expires);
    }
    uint64_t key = model_key(f);
    S.last = f->expires;
    TRACE("  ran %u (expires %" PRIu64 ")\n", f->idx, f->expires);
    S.cur = key;
    f->pending = false;
    S.fired++;

    if (f->reps == 0)
        return;
    f->reps--;
    ftimer *o = &S.tm[f->target % NT];
    switch (f->act) {
    case ACT_REARM:
        model_add(f, eval_when(&f->when, f->expires));
        break;
    case ACT_CANCEL:
        model_cancel(o);
        break;
    case ACT_ADD:
        model_add(o, eval_when(&f->when, f->expires));
        break;
    case ACT_CANCEL_SELF:
        model_cancel(f);
        break;
    case ACT_REARM_CANCEL:
        model_add(f, eval_when(&f->when, f->expires));
        if (o != f)
            model_cancel(o);
        break;
    default:
        break;
    }
}

static void check_state(void)
{
    int line = tw__wheel_check(S.w);
    FZ_CHECK(line == 0, "wheel invariant broken (wheel.c line %d)", line);
    size_t n = model_count();
    FZ_CHECK(tw_wheel_count(S.w) == n, "count %zu, model %zu",
             tw_wheel_count(S.w), n);
    FZ_CHECK(tw_wheel_now(S.w) == S.now, "now %" PRIu64 ", model %" PRIu64,
             tw_wheel_now(S.w), S.now);
    uint64_t min = UINT64_MAX;
    for (int i = 0; i < NT; i++) {
        const ftimer *f = &S.tm[i];
        FZ_CHECK(tw_timer_pending(&f->t) == f->pending,
                 "timer %d pending %d, model %d", i, tw_timer_pending(&f->t),
                 f->pending);
        if (f->pending && f->expires < min)
            min = f->expires;
    }
    uint64_t ne = tw_wheel_next_expiry(S.w);
    if (n == 0)
        FZ_CHECK(ne == UINT64_MAX, "next_expiry %" PRIu64 " on empty wheel",
                 ne);
    else
        FZ_CHECK(ne <= min, "next_expiry %" PRIu64 " after earliest %" PRIu64,
                 ne, min);
    uint64_t to = tw_wheel_timeout(S.w, S.now);
    if (n == 0)
        FZ_CHECK(to == TW_WHEEL_NO_TIMEOUT, "timeout %" PRIu64 " when empty",
                 to);
    else if (min <= S.now)
        FZ_CHECK(to == 0, "timeout %" PRIu64 " with a timer due", to);
    else
        FZ_CHECK(to <= min - S.now,
                 "timeout %" PRIu64 " past earliest %" PRIu64, to, min);
}

static size_t do_advance(uint64_t to)
{
    S.in_adv = true;
    S.adv_to = to;
    S.start = S.cur = S.now;
    S.last = 0;
    S.fired = 0;
    TRACE("advance %" PRIu64 " -> %" PRIu64 "\n", S.now, to);
    size_t ran = tw_wheel_advance(S.w, to);
    S.in_adv = false;
    FZ_CHECK(ran == S.fired, "advance returned %zu, %zu callbacks ran", ran,
             S.fired);
    if (to < S.now) {
        FZ_CHECK(ran == 0, "advance into the past ran %zu", ran);
        return ran;
    }
    S.now = to;
    for (int i = 0; i < NT; i++) {
        ftimer *f = &S.tm[i];
        FZ_CHECK(!(f->pending && !f->deferred && f->expires <= to),
                 "timer %d (expires %" PRIu64 ") lost by advance to %" PRIu64,
                 i, f->expires, to);
        f->deferred = false;
    }
    return ran;
}

static void setup(fz_reader *r)
{
    static const tw_wheel_config fixed[] = {
        {512, 1}, {64, 3}, {8, 2}, {1, 1}, {0, 0}};
    tw_wheel_config cfg;
    const tw_wheel_config *cp = &cfg;
    uint8_t c = fz_u8(r);
    switch (c % 8) {
    case 0:
        cp = NULL;
        break;
    case 6:
    case 7:
        cfg.slots = 1 + fz_u8(r) % 64 * (c & 8 ? 64 : 1);
        cfg.levels = fz_u8(r) % 8;
        break;
    default:
        cfg = fixed[c % 8 - 1];
        break;
    }
    /* The default slot count is the library's choice: pick edges for 256
     * and allow the most levels any slot count can have. */
    uint32_t slots = cp && cp->slots ? cp->slots : 256;
    S.slots = 1;
    S.maybe_stale = false;
    while (S.slots < slots)
        S.slots <<= 1;
    unsigned bits = 0;
    while ((UINT64_C(1) << bits) < S.slots)
        bits++;
    unsigned need = bits ? (64 + bits - 1) / bits : 1;
    unsigned lv = cp ? cp->levels : 0;
    S.levels = lv == 0 || lv > need ? need : lv;
    S.rounds = (uint64_t)S.levels * bits < 64;
    if (!(cp && cp->slots))
        S.levels = 64;

    switch (fz_u8(r) % 4) {
    case 0:
        S.now = 0;
        break;
    case 1:
        S.now = fz_u64(r);
        break;
    case 2:
        S.now = UINT64_MAX - fz_u8(r);
        break;
    default:
        S.now = fz_u8(r);
        break;
    }
    TRACE("create slots %" PRIu64 " levels %u now %" PRIu64 "\n", S.slots,
          S.levels, S.now);
    int rc = tw_wheel_create(&S.w, cp, S.now);
    FZ_CHECK(rc == 0, "create(%u, %u) = %d", cp ? cp->slots : 0,
             cp ? cp->levels : 0, rc);
    for (unsigned i = 0; i < NT; i++) {
        S.tm[i].idx = i;
        tw_timer_init(&S.tm[i].t, on_fire, &S.tm[i]);
    }
    tw_timer_init(&S.nofn, NULL, NULL);
}

/* Advance to next_expiry() as an event loop does; count empty wake-ups. */
static void event_loop(unsigned steps)
{
    unsigned empty = 0;
    size_t stale = 0;
    for (unsigned i = 0; i < steps; i++) {
        uint64_t ne = tw_wheel_next_expiry(S.w);
        if (ne == UINT64_MAX)
            break;
        /* The header allows one empty wake-up per level. In rounds mode
         * a top-level slot whose earliest timer was moved or cancelled
         * keeps a stale lower bound, worth one more empty wake-up; at most
         * one such slot per pending timer. A slot that
         * tw_wheel_cancel_inline() emptied stays marked until a visit: one
         * more each (counted when a run of empty wake-ups starts: an
         * empty wake-up runs no callback, so it leaves no new one). */
        if (empty == 0) {
            stale = S.maybe_stale ? tw__wheel_stale_slots(S.w) : 0;
            S.maybe_stale = stale != 0;
        }
        size_t bound = S.levels + (S.rounds ? model_count() : 0) + stale;
        if (do_advance(ne > S.now ? ne : S.now) == 0) {
            empty++;
            FZ_CHECK(empty <= bound,
                     "%u empty wake-ups in a row with %u "
                     "levels",
                     empty, S.levels);
        } else {
            empty = 0;
        }
        check_state();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_reader rd = {data, size}, *r = &rd;
    memset(&S, 0, sizeof S);
    if (trace < 0)
        trace = getenv("FZ_TRACE") != NULL;
    setup(r);
    check_state();
    while (fz_more(r)) {
        uint8_t op = fz_u8(r);
        ftimer *f = &S.tm[fz_u8(r) % NT];
        switch (op % 10) {
        case 0: {
            fz_when wh = read_when(r);
            model_add(f, eval_when(&wh, S.now));
            break;
        }
        case 1: {
            fz_when wh = read_when(r);
            unsigned shift = fz_u8(r) % 66;
            model_add_window(f, eval_when(&wh, S.now), shift);
            break;
        }
        case 2:
            model_cancel(f);
            break;
        case 3: {
            fz_when wh = read_when(r);
            do_advance(eval_when(&wh, S.now));
            break;
        }
        case 4:
            event_loop(1);
            break;
        case 5:
            event_loop(S.levels + 2);
            break;
        case 6:
            f->act = fz_u8(r) % ACT_COUNT;
            f->reps = fz_u8(r) % 4;
            f->target = fz_u8(r);
            f->when = read_when(r);
            break;
        case 7:
            do_advance(fz_sat_add(S.now, fz_u8(r)));
            break;
        case 8: {
            /* Misuse: no callback. Nothing may change. */
            fz_when wh = read_when(r);
            size_t before = tw_wheel_count(S.w);
            FZ_CHECK(tw_wheel_add(S.w, &S.nofn, eval_when(&wh, S.now)) ==
                         TW_EINVAL,
                     "add without callback accepted");
            FZ_CHECK(!tw_timer_pending(&S.nofn), "no-fn timer pending");
            FZ_CHECK(tw_wheel_count(S.w) == before, "count changed");
            FZ_CHECK(!tw_wheel_cancel(S.w, &S.nofn), "cancel of no-fn");
            /* Re-initialising a timer that is not pending is allowed. */
            if (!f->pending)
                tw_timer_init(&f->t, on_fire, f);
            break;
        }
        default:
            FZ_CHECK(tw_timer_pending(&f->t) == f->pending, "pending");
            if (f->pending)
                FZ_CHECK(tw_timer_expires(&f->t) == f->expires, "expires");
            break;
        }
        check_state();
    }
    int line = tw__wheel_check_full(S.w);
    FZ_CHECK(line == 0, "wheel invariant broken (wheel.c line %d)", line);
    tw_wheel_destroy(S.w);
    return 0;
}
