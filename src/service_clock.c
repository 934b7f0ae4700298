/* SPDX-License-Identifier: MIT */
/*
 * src/service_clock.c - the timer service's clock choice and deadline
 * windows (declared in src/service_clock.h).
 *
 * Clocks: the service measures time on CLOCK_MONOTONIC (the default) or
 * CLOCK_BOOTTIME. A condition variable can only wait on CLOCK_MONOTONIC
 * (or CLOCK_REALTIME), and CLOCK_MONOTONIC stops during a suspend while
 * CLOCK_BOOTTIME does not: a wait computed from a BOOTTIME deadline would
 * oversleep by the time the machine was suspended. So on BOOTTIME the
 * timer thread waits at most TW__SVC_WAIT_CAP_NS and then re-reads its
 * clock.
 */
#define _POSIX_C_SOURCE 200809L

#include "service_clock.h"

#include <pthread.h>
#include <string.h>

int tw__svc_clock_id(int32_t cfg_id, clockid_t *out)
{
    /* 0 is the default: CLOCK_REALTIME, 0 on Linux, cannot be asked for
     * (a wall clock that is set would move every deadline). */
    if (cfg_id == 0 || cfg_id == (int32_t)CLOCK_MONOTONIC) {
        *out = CLOCK_MONOTONIC;
        return 0;
    }
#ifdef CLOCK_BOOTTIME
    if (cfg_id == (int32_t)CLOCK_BOOTTIME) {
        *out = CLOCK_BOOTTIME;
        return 0;
    }
#endif
    return TW_EINVAL;
}

uint64_t tw__svc_wait_ns(clockid_t id, uint64_t left_ns)
{
    if (id != CLOCK_MONOTONIC && left_ns > TW__SVC_WAIT_CAP_NS)
        return TW__SVC_WAIT_CAP_NS;
    return left_ns;
}

void tw__svc_window(uint64_t tick_ns, uint64_t due_ns, uint64_t width_ns,
                    uint64_t *first, uint64_t *last)
{
    uint64_t f = due_ns / tick_ns + (due_ns % tick_ns != 0);
    uint64_t end =
        width_ns >= UINT64_MAX - due_ns ? UINT64_MAX : due_ns + width_ns;
    uint64_t l = end / tick_ns;
    *first = f;
    *last = l > f ? l : f;
}

uint64_t tw__recip(uint64_t d)
{
#ifdef __SIZEOF_INT128__
    return (uint64_t)(((unsigned __int128)1 << 64) / d);
#else
    return d; /* unused: tw__ceil_div() divides */
#endif
}

/*
 * The TSC estimate (src/service_clock.h).
 *
 * Why it never lags CLOCK_MONOTONIC. Write M(t) for the clock's value at
 * the moment the counter reads t; M is non-decreasing. An anchor is read
 * as t1 = counter, m = clock, t2 = counter, each counter read ordered by
 * lfence: the kernel's own counter read inside the clock call lies in
 * [t1, t2], so M(t1) <= m (and M(t2) >= m). A reader at counter t,
 * t - t1 = d <= limit, returns m + ceil(d * mult / 2^32), so it never lags
 * as long as the clock gains at most mult / 2^32 ns per cycle between t1
 * and t. The rate is measured between two anchors (t1a, ma) and (t1b, mb)
 * as (mb - ma) / (t1b - t2a), which bounds the clock's mean rate from
 * above (at most mb - ma ns passed in at least t1b - t2a cycles), and is
 * then raised by 1/256 (3,906 ppm): the kernel's NTP discipline moves its
 * rate by at most 500 ppm of frequency plus 500 ppm of phase slew from
 * its nominal rate, so the rate now differs from any past mean by under
 * 2,000 ppm. Over one anchor's 250 us that is a few us later than the
 * clock at worst. A clock that does not follow the counter at all (an
 * unstable TSC, a clocksource change) breaks the premise: every refresh
 * checks that the previous anchor's estimate did not lag the reading
 * (est(t2) >= m, as M(t2) >= m) and switches the estimate off for good
 * if it did. The reader's counter read is not ordered by lfence; it
 * comes after the call began in program order and has no inputs, so it
 * cannot be taken before a clock reading its caller made before the call
 * (whose counter read is itself behind an lfence).
 */

#define TSC_TIGHT 2048u                       /* cycles: a tight reading */
#define TSC_CAL_CYCLES (UINT64_C(1) << 22)    /* first rate: ~1-4 ms */
#define TSC_REFINE_CYCLES (UINT64_C(1) << 32) /* a better rate: ~1-4 s */
#define TSC_ANCHOR_NS UINT64_C(250000)

#if TW__HAVE_TSC
#include <cpuid.h>

static bool tsc_invariant(void)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(0x80000000u, &a, &b, &c, &d) || a < 0x80000007u)
        return false;
    __get_cpuid(0x80000007u, &a, &b, &c, &d);
    return (d >> 8) & 1u; /* invariant TSC */
}

static uint64_t rdtsc_ordered(void)
{
    _mm_lfence();
    uint64_t t = __rdtsc();
    _mm_lfence();
    return t;
}

/* A reading whose counter bounds are at most TSC_TIGHT apart: true and
 * *@t1, *@m, *@t2, or false. */
static bool tight_read(uint64_t *t1, uint64_t *m, uint64_t *t2)
{
    *t1 = rdtsc_ordered();
    *m = tw__clock_ns(CLOCK_MONOTONIC);
    *t2 = rdtsc_ordered();
    return *t2 - *t1 <= TSC_TIGHT;
}

/* The rate from (@ta2, @ma) to (@tb1, @mb), raised by 1/256, as ns per
 * cycle << 32 rounded up; 0 if it does not fit. */
static uint64_t tsc_mult(uint64_t ta2, uint64_t ma, uint64_t tb1, uint64_t mb)
{
    if (tb1 <= ta2 || mb <= ma)
        return 0;
    unsigned __int128 num = (unsigned __int128)(mb - ma) << 32;
    unsigned __int128 q = (num + (tb1 - ta2) - 1) / (tb1 - ta2);
    q += (q + 255) / 256;
    return q >> 63 ? 0 : (uint64_t)q;
}

static void tsc_publish(struct tw__tsc *c, uint64_t t1, uint64_t m,
                        uint64_t mult)
{
    atomic_store_explicit(&c->tsc0, t1, memory_order_relaxed);
    atomic_store_explicit(&c->mono0, m, memory_order_relaxed);
    atomic_store_explicit(&c->mult, mult, memory_order_relaxed);
    uint64_t lim = mult != 0 ? (TSC_ANCHOR_NS << 32) / mult : 0;
    atomic_store_explicit(&c->limit, lim, memory_order_relaxed);
}
#endif

void tw__tsc_init(struct tw__tsc *c, bool enable)
{
    memset(c, 0, sizeof(*c));
#if TW__HAVE_TSC
    uint64_t t1 = 0, t2 = 0, m = 0, u1 = 0, u2 = 0, n = 0;
    int tries = 0;
    if (!enable || !tsc_invariant())
        return;
    while (!tight_read(&t1, &m, &t2))
        if (++tries == 64)
            return;
    while (rdtsc_ordered() - t2 < TSC_CAL_CYCLES) {
    }
    tries = 0;
    while (!tight_read(&u1, &n, &u2))
        if (++tries == 64)
            return;
    uint64_t mult = tsc_mult(t2, m, u1, n);
    if (mult == 0)
        return;
    c->cal_tsc = t2;
    c->cal_mono = m;
    c->usable = true;
    tsc_publish(c, u1, n, mult);
#else
    (void)enable;
#endif
}

uint64_t tw__tsc_refresh(struct tw__tsc *c)
{
#if TW__HAVE_TSC
    uint64_t t1, t2, m;
    if (!c->usable || atomic_load_explicit(&c->broken, memory_order_relaxed) ||
        !tight_read(&t1, &m, &t2))
        return tw__clock_ns(CLOCK_MONOTONIC);
    uint32_t q = atomic_load_explicit(&c->seq, memory_order_relaxed);
    if ((q & 1) ||
        !atomic_compare_exchange_strong_explicit(
            &c->seq, &q, q + 1, memory_order_acquire, memory_order_relaxed))
        return m;
    atomic_thread_fence(memory_order_release);
    uint64_t t0 = atomic_load_explicit(&c->tsc0, memory_order_relaxed);
    uint64_t m0 = atomic_load_explicit(&c->mono0, memory_order_relaxed);
    uint64_t mult = atomic_load_explicit(&c->mult, memory_order_relaxed);
    uint64_t d = t2 - t0;
    /* The previous anchor's estimate at t2 must not be below m. */
    if (d < (UINT64_C(1) << 40) &&
        m0 + (uint64_t)(((unsigned __int128)d * mult + UINT32_MAX) >> 32) < m)
        atomic_store_explicit(&c->broken, true, memory_order_relaxed);
    if (t1 - c->cal_tsc >= TSC_REFINE_CYCLES) {
        uint64_t better = tsc_mult(c->cal_tsc, c->cal_mono, t1, m);
        if (better != 0)
            mult = better;
    }
    if (atomic_load_explicit(&c->broken, memory_order_relaxed))
        mult = 0;
    tsc_publish(c, t1, m, mult);
    atomic_store_explicit(&c->seq, q + 2, memory_order_release);
    return m;
#else
    (void)c;
    return tw__clock_ns(CLOCK_MONOTONIC);
#endif
}

static struct tw__tsc tsc_mono;
static pthread_once_t tsc_once = PTHREAD_ONCE_INIT;

static void tsc_mono_init(void)
{
    tw__tsc_init(&tsc_mono, true);
}

struct tw__tsc *tw__tsc_mono(void)
{
    pthread_once(&tsc_once, tsc_mono_init);
    return &tsc_mono;
}
