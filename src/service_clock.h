/* SPDX-License-Identifier: MIT */
/*
 * src/service_clock.h - the timer service's clock choice and deadline
 * windows (src/service_clock.c): pure helpers that need no
 * service state.
 */
#ifndef TWHEEL_SERVICE_CLOCK_H
#define TWHEEL_SERVICE_CLOCK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <x86intrin.h>
#define TW__HAVE_TSC 1
#else
#define TW__HAVE_TSC 0
#endif

#include "clock.h"
#include "twheel/service.h"

/* The clock tw_service_config.clock_id selects: 0 on success (*@out is
 * CLOCK_MONOTONIC or CLOCK_BOOTTIME), TW_EINVAL for any other value. */
int tw__svc_clock_id(int32_t cfg_id, clockid_t *out);

/* How long the timer thread may wait on CLOCK_MONOTONIC (its condition
 * variable's clock) for a deadline @left_ns away on clock @id: all of it
 * on CLOCK_MONOTONIC itself, at most TW__SVC_WAIT_CAP_NS on a clock that
 * runs on during a suspend, so that a deadline passed while the machine
 * slept is seen soon after it wakes. */
#define TW__SVC_WAIT_CAP_NS UINT64_C(1000000000)
uint64_t tw__svc_wait_ns(clockid_t id, uint64_t left_ns);

/* The ticks of a window: the task is due @due_ns (relative, never
 * UINT64_MAX) and may run until @width_ns later. *@first is the first tick
 * at or after @due_ns, *@last the last tick at or before @due_ns +
 * @width_ns (saturating), or *@first when the window holds no tick
 * boundary after *@first. */
void tw__svc_window(uint64_t tick_ns, uint64_t due_ns, uint64_t width_ns,
                    uint64_t *first, uint64_t *last);

/* ------------------------------------------------------------------------ */
/* Division by the tick without a divide instruction. */

/* floor(2^64 / @d) for tw__ceil_div(); @d > 1. */
uint64_t tw__recip(uint64_t d);

/* ceil(@x / @d), exactly, with @m = tw__recip(@d): @m lies in
 * (2^64 / @d - 1, 2^64 / @d], so the high half of @x * @m lies in
 * (@x / @d - 1, @x / @d] (as @x < 2^64): it is floor(@x / @d) or one less,
 * and one comparison of the remainder settles which. */
static inline uint64_t tw__ceil_div(uint64_t x, uint64_t d, uint64_t m)
{
#ifndef __SIZEOF_INT128__
    (void)m;
    return x / d + (x % d != 0);
#else
    uint64_t q = (uint64_t)(((unsigned __int128)x * m) >> 64);
    uint64_t r = x - q * d;
    if (r >= d) {
        q++;
        r -= d;
    }
    return q + (r != 0);
#endif
}

/* ------------------------------------------------------------------------ */
/*
 * An upper estimate of CLOCK_MONOTONIC from the CPU's time-stamp counter,
 * for the producers' exact deadlines (src/service_clock.c argues why it
 * never lags the clock). The estimate is an anchor, a pair (tsc0, mono0)
 * where mono0 was read after tsc0, plus the cycles since tsc0 at a rate
 * (ns per cycle, 32.32 fixed point) rounded up by 1/256, well over what
 * the kernel's NTP adjustment can change its own rate by; an anchor
 * serves for at most `limit` cycles (about 250 us), then the next reader
 * reads the clock and publishes a new one. Readers take the anchor under
 * a sequence count; a writer that finds it odd, or loses the race to make
 * it odd, just returns its own reading.
 */
struct tw__tsc {
    _Atomic uint32_t seq;  /* odd while a writer updates the anchor */
    _Atomic uint64_t tsc0; /* the anchor */
    _Atomic uint64_t mono0;
    _Atomic uint64_t mult;  /* ns per cycle << 32, rounded up; 0: off */
    _Atomic uint64_t limit; /* cycles an anchor serves */
    /* The first tight reading (for the rate); set before any reader. */
    uint64_t cal_tsc, cal_mono;
    bool usable;         /* x86-64 with an invariant TSC, and enabled */
    _Atomic bool broken; /* an estimate was seen to lag: off for good */
};

/* Set @c up for CLOCK_MONOTONIC when @enable and the CPU has an invariant
 * TSC; else tw__tsc_now() just reads the clock. */
void tw__tsc_init(struct tw__tsc *c, bool enable);
/* tw__tsc_now()'s slow path: read CLOCK_MONOTONIC and, when the reading
 * was tight, publish it as the new anchor (and the rate, once enough
 * time has passed since the first reading to measure it). */
uint64_t tw__tsc_refresh(struct tw__tsc *c);

/* The process's estimate of CLOCK_MONOTONIC, set up (about 1-4 ms of
 * calibration) on first use. */
struct tw__tsc *tw__tsc_mono(void);

/* tw__tsc_now()'s fast path: true and *@now the estimate, or false when
 * the anchor is stale, being updated, or the estimate is off. */
static inline bool tw__tsc_fast(struct tw__tsc *c, uint64_t *now)
{
#if TW__HAVE_TSC
    /* The counter first, then the anchor: each value is used as soon as
     * it is read, so that few are live at once (a caller's fast path
     * then keeps everything in caller-saved registers). A counter read
     * before an anchor that is newer than it gives d "negative", far
     * above the limit: the slow path. */
    uint64_t t = __rdtsc();
    uint32_t q = atomic_load_explicit(&c->seq, memory_order_acquire);
    uint64_t d = t - atomic_load_explicit(&c->tsc0, memory_order_relaxed);
    uint64_t mult = atomic_load_explicit(&c->mult, memory_order_relaxed);
    uint64_t m0 = atomic_load_explicit(&c->mono0, memory_order_relaxed);
    bool ok = d <= atomic_load_explicit(&c->limit, memory_order_relaxed);
    atomic_thread_fence(memory_order_acquire);
    if (ok && !(q & 1) &&
        atomic_load_explicit(&c->seq, memory_order_relaxed) == q) {
        /* m0 + ceil(d * mult / 2^32), or 1 ns later: never earlier. */
        *now = m0 + 1 + (uint64_t)(((unsigned __int128)d * mult) >> 32);
        return true;
    }
#else
    (void)c;
    (void)now;
#endif
    return false;
}

/* CLOCK_MONOTONIC in ns, or later by at most a few us; never earlier. */
static inline uint64_t tw__tsc_now(struct tw__tsc *c)
{
    uint64_t now;
    return tw__tsc_fast(c, &now) ? now : tw__tsc_refresh(c);
}

#endif
