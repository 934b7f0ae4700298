/* SPDX-License-Identifier: MIT */
/*
 * tests/test_service_tsc.c - the producers' clock (src/service_clock.h):
 * the division by the tick through a reciprocal, and the TSC estimate of
 * CLOCK_MONOTONIC, which must never be earlier than the clock (a deadline
 * computed from it is never early) and only a little later.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>

#include "fixture.h"
#include "service_clock.h"

static uint64_t rng_state = 12345;

static uint64_t rng(void)
{
    uint64_t z = (rng_state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static void check_div(uint64_t x, uint64_t d, uint64_t m)
{
    uint64_t want = x / d + (x % d != 0);
    uint64_t got = tw__ceil_div(x, d, m);
    if (got != want)
        fprintf(stderr, "ceil(%" PRIu64 " / %" PRIu64 ")\n", x, d);
    ASSERT_EQ(got, want);
}

/* Every tick a service accepts (1 us .. 1 day), and odd ones; numerators at
 * the edges (0, multiples and their neighbours, UINT64_MAX) and random. */
static void test_ceil_div(void)
{
    static const uint64_t ds[] = {1000,
                                  1024,
                                  999999937,
                                  MS,
                                  7 * MS + 3,
                                  SEC,
                                  86400 * SEC,
                                  3,
                                  UINT64_C(1) << 40,
                                  UINT64_MAX / 3};
    for (size_t k = 0; k < sizeof(ds) / sizeof(ds[0]); k++) {
        uint64_t d = ds[k], m = tw__recip(d);
        check_div(0, d, m);
        check_div(UINT64_MAX, d, m);
        check_div(UINT64_MAX - 1, d, m);
        for (uint64_t q = 1; q < 1000; q++) {
            uint64_t x = q * d;
            check_div(x, d, m);
            check_div(x - 1, d, m);
            check_div(x + 1, d, m);
        }
        uint64_t top = (UINT64_MAX / d) * d;
        check_div(top, d, m);
        check_div(top - 1, d, m);
        for (int i = 0; i < 100000; i++)
            check_div(rng() >> (rng() % 64), d, m);
    }
}

/* Readings bracketed by the clock: never before the reading taken just
 * before, and (the argument in src/service_clock.c bounds the lead by a
 * few us) not more than 50 us after the one taken just after. */
static void *bracket(void *arg)
{
    struct tw__tsc *c = arg;
    long n = under_valgrind() ? 20000 : TW_SANITIZED ? 200000 : 2000000;
    uint64_t lead = 0;
    for (long i = 0; i < n; i++) {
        uint64_t m1 = tw__clock_ns(CLOCK_MONOTONIC);
        uint64_t e = tw__tsc_now(c);
        uint64_t m2 = tw__clock_ns(CLOCK_MONOTONIC);
        ASSERT_GE(e, m1);
        ASSERT_LE(e, m2 + 50 * US);
        if (e > m2 && e - m2 > lead)
            lead = e - m2;
    }
    return (void *)(uintptr_t)lead;
}

static void test_never_early(void)
{
    struct tw__tsc *c = tw__tsc_mono();
    printf("  TSC estimate %s\n", c->usable ? "on" : "off (clock reads)");
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        ASSERT(pthread_create(&t[i], NULL, bracket, c) == 0);
    for (int i = 0; i < 2; i++) {
        void *lead;
        pthread_join(t[i], &lead);
        printf("  largest lead over the next clock reading: %llu ns\n",
               (unsigned long long)(uintptr_t)lead);
    }
}

/* A rate too low for the clock (the premise broken, as after a change of
 * clocksource): the next refresh sees that the old anchor's estimate lagged
 * the clock and turns the estimate off; from then on it reads the clock. */
static void test_lag_turns_off(void)
{
    struct tw__tsc c;
    tw__tsc_init(&c, true);
    if (!c.usable) {
        printf("  skipped: no invariant TSC, or no tight reading\n");
        return;
    }
    atomic_store(&c.mult, atomic_load(&c.mult) / 2);
    uint64_t until = tw__clock_ns(CLOCK_MONOTONIC) + 300 * US;
    while (tw__clock_ns(CLOCK_MONOTONIC) < until) {
    }
    /* Past the anchor's limit: a refresh that gets a tight reading must
     * find the lag (one without a tight reading changes nothing: try
     * again, for up to 2 s; under valgrind tight readings are rare). */
    uint64_t anchor = atomic_load(&c.tsc0);
    uint64_t give_up = tw__clock_ns(CLOCK_MONOTONIC) + 2 * SEC;
    while (!atomic_load(&c.broken) && atomic_load(&c.tsc0) == anchor &&
           tw__clock_ns(CLOCK_MONOTONIC) < give_up)
        (void)tw__tsc_refresh(&c);
    if (!atomic_load(&c.broken) && atomic_load(&c.tsc0) == anchor) {
        printf("  skipped: no tight reading in 2 s\n");
        return;
    }
    ASSERT(atomic_load(&c.broken));
    for (int i = 0; i < 1000; i++) {
        uint64_t m1 = tw__clock_ns(CLOCK_MONOTONIC);
        ASSERT(tw__tsc_now(&c) >= m1);
    }
    ASSERT(atomic_load(&c.mult) == 0);
}

/* Disabled: every reading is a clock reading. */
static void test_disabled(void)
{
    struct tw__tsc c;
    tw__tsc_init(&c, false);
    ASSERT(!c.usable);
    for (int i = 0; i < 1000; i++) {
        uint64_t m1 = tw__clock_ns(CLOCK_MONOTONIC);
        uint64_t e = tw__tsc_now(&c);
        ASSERT(e >= m1 && e <= tw__clock_ns(CLOCK_MONOTONIC));
    }
}

int main(void)
{
    RUN_TEST(test_ceil_div);
    RUN_TEST(test_never_early);
    RUN_TEST(test_lag_turns_off);
    RUN_TEST(test_disabled);
    return tw_test_done();
}
