/* SPDX-License-Identifier: MIT */
/*
 * twheel/wheel.h - the single-threaded, embeddable timing wheel.
 *
 * Thread safety: none. One thread owns a wheel and every timer added to it;
 * callbacks run on that thread, inside tw_wheel_advance(). Different wheels
 * may be used from different threads at the same time: there is no global
 * state.
 *
 * Time is the caller's: a uint64_t tick count that the caller passes in. The
 * wheel never reads a clock. After tw_wheel_create() it allocates once at
 * most: when its pending count first reaches a quarter of its wide slot
 * table's list heads (4,096 timers for the default shape; never for a
 * shape whose wide table is 4 KiB or less), tw_wheel_add() widens the
 * table from 1 list a slot to 8. If that allocation fails nothing changes:
 * the add succeeds, the wheel works as before, and the widening is tried
 * again at twice the count.
 *
 * Timers are caller-owned and usually embedded in the caller's own object;
 * recover the owner in the callback with TW_CONTAINER_OF. A timer must stay
 * in memory, and must not be re-initialised, while it is pending.
 *
 * wheel.h, twheel/base.h, src/wheel.c and src/common.[ch] (the
 * allocator, version and error strings) depend on nothing else in twheel
 * and can be copied into another project as they are.
 */
#ifndef TWHEEL_WHEEL_H
#define TWHEEL_WHEEL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "twheel/base.h" /* TW_EXTERN, TW_VERSION_*, TW_E*, the allocator */

#ifdef __cplusplus
extern "C" {
#endif

/* Recover the address of the struct that embeds @ptr as its @member. */
#define TW_CONTAINER_OF(ptr, type, member)                                     \
    ((type *)(void *)((char *)(ptr)-offsetof(type, member)))

typedef struct tw_wheel tw_wheel;
typedef struct tw_timer tw_timer;
/* A timer's callback: called with the timer and the arg given at init. */
typedef void (*tw_timer_fn)(tw_timer *t, void *arg);

/*
 * A timer. The type is complete so that it can be embedded, but every field
 * is private: use the functions below. sizeof(tw_timer) is 40 bytes on LP64.
 */
struct tw_timer {
    struct tw_timer *tw__next;   /* next timer in the same list */
    struct tw_timer **tw__pprev; /* the pointer that points at us; NULL when
                                    the timer is not pending */
    uint64_t tw__expires;        /* absolute expiry tick */
    tw_timer_fn tw__fn;
    void *tw__arg;
};

/* How a wheel is laid out; all zero gives the defaults. */
typedef struct tw_wheel_config {
    uint32_t slots;  /* slots per level; 0 = default (256); rounded up to a
                        power of two; more than 2^30 is TW_EINVAL */
    uint32_t levels; /* 0 = default: hierarchical, enough levels to cover all
                        of uint64_t; 1 = Netty's single wheel where each slot
                        keeps timers of later rounds; n > 1 = n levels, the
                        top one with rounds. More levels than are needed to
                        cover 64 bits are reduced to that number; more than
                        64 is TW_EINVAL. */
} tw_wheel_config;

/**
 * tw_wheel_create - make a wheel.
 * @out: receives the wheel; left as it was on failure.
 * @cfg: the shape, or NULL for the defaults.
 * @now: the wheel's current tick.
 *
 * Two allocations: one block for the wheel and its bitmaps, and its slot
 * table with 1 list a slot (16 KiB for the default shape). See the top of
 * this file for the one later allocation, which cannot fail an add.
 *
 * Return: 0, TW_EINVAL (NULL @out, bad @cfg) or TW_ENOMEM.
 */
TW_EXTERN int tw_wheel_create(tw_wheel **out, const tw_wheel_config *cfg,
                              uint64_t now);

/**
 * tw_wheel_destroy - free the wheel.
 * @w: the wheel, or NULL (a no-op).
 *
 * Pending timers are dropped without running; they are left marked pending
 * and must be re-initialised with tw_timer_init() before reuse.
 *
 * Context: the owner thread, never from a callback of @w.
 */
TW_EXTERN void tw_wheel_destroy(tw_wheel *w);

/*
 * tw_timer_init - prepare @t, not pending, to call @fn(@t, @arg) when it
 * expires. Must not be called on a pending timer.
 */
TW_EXTERN void tw_timer_init(tw_timer *t, tw_timer_fn fn, void *arg);

/**
 * tw_wheel_add - arm a timer to expire at an absolute tick.
 * @w: the wheel.
 * @t: the timer, initialised; a pending timer is moved (O(1)).
 * @expires: the tick. At or before tw_wheel_now() means due: the timer runs
 *           in the next tw_wheel_advance() call, never inside this one.
 *
 * Context: the owner thread, callbacks included.
 * Return: 0, or TW_EINVAL (NULL argument, timer without a callback) with
 * nothing changed.
 */
TW_EXTERN int tw_wheel_add(tw_wheel *w, tw_timer *t, uint64_t expires);

/**
 * tw_wheel_add_unchecked - tw_wheel_add() for a timer known to be idle,
 * without reading it first.
 * @w: the wheel, not NULL.
 * @t: the timer: initialised with a callback and not pending (never
 *     added, or fired, cancelled or re-initialised since its last add).
 * @expires: as for tw_wheel_add().
 *
 * Same effect as tw_wheel_add(@w, @t, @expires) under these preconditions,
 * but the common case writes the timer without reading it. For timers that
 * are not in the cache (a large population armed in any order), a write
 * does not hold up the following instructions the way a read does: at
 * 1,000,000 timers in random order this add takes about 20 ns instead of
 * 34 (BENCHMARKS.md). The preconditions are checked with assert()
 * when the library is built without NDEBUG; in a release build, a pending
 * timer or a NULL argument corrupts the wheel or crashes. When in doubt,
 * use tw_wheel_add().
 *
 * Context: the owner thread, callbacks included.
 * Return: 0.
 */
TW_EXTERN int tw_wheel_add_unchecked(tw_wheel *w, tw_timer *t,
                                     uint64_t expires);

/**
 * tw_wheel_add_window - arm a timer to expire at some tick of a window,
 * chosen so that timers with overlapping windows share wake-ups.
 * @w: the wheel.
 * @t: the timer, initialised; a pending timer is moved (O(1)).
 * @earliest: the timer never runs before this tick.
 * @latest: the last tick it may be given; >= @earliest.
 *
 * The tick is the one in [@earliest, @latest] with the most trailing zero
 * bits: the coarsest slot boundary inside the window, which the wheel
 * visits anyway and where the timer runs without being moved down a level.
 * Two windows that contain the same coarse boundary get the same tick. The
 * choice is O(1) and depends only on the window; tw_timer_expires()
 * reports it. From then on the timer is an exact one at that tick.
 *
 * A window that is already open (@earliest <= tw_wheel_now()) arms @t as
 * tw_wheel_add(@w, @t, @earliest) does: due, it runs in the next
 * tw_wheel_advance(). tw_wheel_add() is the case @earliest == @latest.
 *
 * Context: the owner thread, callbacks included.
 * Return: 0, or TW_EINVAL (NULL argument, timer without a callback,
 * @latest < @earliest) with nothing changed.
 */
TW_EXTERN int tw_wheel_add_window(tw_wheel *w, tw_timer *t, uint64_t earliest,
                                  uint64_t latest);

/**
 * tw_wheel_cancel - disarm a timer.
 * @w: the wheel.
 * @t: the timer; it must not be pending in another wheel.
 *
 * Context: the owner thread, callbacks included.
 * Return: true if @t was pending (it will not run), false if it was not (a
 * no-op).
 */
TW_EXTERN bool tw_wheel_cancel(tw_wheel *w, tw_timer *t);

/* Private: the first fields of every wheel, the part of it that
 * tw_wheel_cancel_inline() reads and writes. Not for use. */
struct tw__wheel_head {
    uint64_t tw__removes; /* timers cancelled, moved or run, ever */
};

/**
 * tw_wheel_cancel_inline - tw_wheel_cancel() compiled into the caller.
 * @w: the wheel, not NULL.
 * @t: the timer, not NULL; it must not be pending in another wheel.
 *
 * The same effect and result as tw_wheel_cancel(@w, @t) for arguments
 * that are not NULL (NULL ones are not checked: the call crashes), without
 * a call into the library: a cancel in the caller's own loop costs what a
 * linked-list unlink costs (BENCHMARKS.md, "Core wheel: the inline cancel
 * without a call"). It does not look whether the list it leaves empty was
 * the last of its slot: the slot stays marked occupied until
 * tw_wheel_advance() reaches it and finds it empty, so
 * tw_wheel_next_expiry() may name that slot's tick, at most one early
 * wake-up per slot emptied this way (it still returns UINT64_MAX when no
 * timer is pending). It compiles against the layout of this header's
 * version of the library: a program built with it must run with a library
 * of the same TW_VERSION_MAJOR and TW_VERSION_MINOR.
 *
 * Context: the owner thread, callbacks included.
 * Return: true if @t was pending (it will not run), false if it was not (a
 * no-op).
 */
static inline bool tw_wheel_cancel_inline(tw_wheel *w, tw_timer *t)
{
    tw_timer **pprev = t->tw__pprev;
    if (pprev == NULL)
        return false;
    struct tw__wheel_head *h = (struct tw__wheel_head *)(void *)w;
    tw_timer *next = t->tw__next;
    *pprev = next;
    t->tw__pprev = NULL;
    h->tw__removes++;
    if (next != NULL)
        next->tw__pprev = pprev;
    return true;
}

/* tw_timer_pending - true while @t is armed and has not run yet. */
TW_EXTERN bool tw_timer_pending(const tw_timer *t);

/* tw_timer_expires - the expiry tick @t was last armed with (for a window,
 * the tick chosen in it). */
TW_EXTERN uint64_t tw_timer_expires(const tw_timer *t);

/**
 * tw_wheel_advance - move the wheel's time forward and run what is due.
 * @w: the wheel.
 * @now: the new time. Below tw_wheel_now() it changes nothing.
 *
 * Runs every pending timer with expires <= @now, each exactly once, in
 * non-decreasing expiry order (timers with equal expiry run in no
 * particular order). The cost is proportional to the non-empty slots
 * visited plus the timers run or moved down a level, not to the ticks
 * crossed.
 *
 * Callbacks may add, move and cancel any timer of this wheel, themselves
 * included; a timer cancelled by an earlier callback does not run. A timer
 * armed from a callback for a tick at or before the one being processed
 * runs in the next call, not this one; one armed for a later tick <= @now
 * runs in this call, in order.
 *
 * Context: the owner thread; callbacks must not call tw_wheel_advance() or
 * tw_wheel_destroy() on the same wheel.
 * Return: how many callbacks ran.
 */
TW_EXTERN size_t tw_wheel_advance(tw_wheel *w, uint64_t now);

/**
 * tw_wheel_next_expiry - a tick at which tw_wheel_advance() has work to do.
 * @w: the wheel.
 *
 * Never later than the earliest pending expiry. A loop that sleeps until
 * this tick and advances reaches any timer after at most one extra wake-up
 * per level. In a wheel whose top level keeps later rounds (levels = 1, or
 * too few levels to cover 64 bits), add one more for each top-level slot
 * whose earliest timer was cancelled or moved since that slot was last
 * visited: cancel stays O(1), so the slot's remembered minimum is a lower
 * bound until the next visit refreshes it. With tw_wheel_cancel_inline(),
 * add one for each slot it emptied since that slot was last visited.
 *
 * Return: that tick, or UINT64_MAX when nothing is pending.
 */
TW_EXTERN uint64_t tw_wheel_next_expiry(const tw_wheel *w);

/* What tw_wheel_timeout() returns when nothing is pending. */
#define TW_WHEEL_NO_TIMEOUT UINT64_MAX

/**
 * tw_wheel_timeout - how many ticks an event loop may sleep before it must
 * call tw_wheel_advance(), in the manner of uv_backend_timeout().
 * @w: the wheel.
 * @now: the caller's current tick, usually read from its clock just before
 *       it sleeps; it may be ahead of tw_wheel_now().
 *
 * The wait is tw_wheel_next_expiry() - @now: never more than the wait for
 * the earliest pending timer, and sometimes less (see
 * tw_wheel_next_expiry()). Converting it to a poll(2) timeout is the
 * caller's: TW_WHEEL_NO_TIMEOUT becomes -1, large values are clamped.
 *
 * Context: the owner thread.
 * Return: 0 when something is due at or before @now (timers added with a
 * past expiry included), TW_WHEEL_NO_TIMEOUT (UINT64_MAX) when nothing is
 * pending, else the ticks to wait.
 */
TW_EXTERN uint64_t tw_wheel_timeout(const tw_wheel *w, uint64_t now);

/**
 * tw_wheel_now - the wheel's current tick.
 * @w: the wheel.
 *
 * Inside a callback it is the tick being processed: the timer's own
 * expiry, or the time of the previous advance for a timer that was already
 * due then. Re-arming a periodic timer at tw_timer_expires(t) + period
 * therefore never drifts.
 */
TW_EXTERN uint64_t tw_wheel_now(const tw_wheel *w);

/* tw_wheel_count - how many timers are pending. */
TW_EXTERN size_t tw_wheel_count(const tw_wheel *w);

#ifdef __cplusplus
}
#endif
#endif /* TWHEEL_WHEEL_H */
