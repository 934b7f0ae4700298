/* SPDX-License-Identifier: MIT */
/*
 * tests/clock_fixture.h - real time for the tests and benchmarks that run
 * on it: time units, the monotonic and wall clocks, sleeps that resume
 * after signals, and WAIT_FOR, which polls a condition with a bound. The
 * service, Redis and PostgreSQL fixtures share it. Include after defining
 * _POSIX_C_SOURCE (or _GNU_SOURCE).
 */
#ifndef TWHEEL_TEST_CLOCK_FIXTURE_H
#define TWHEEL_TEST_CLOCK_FIXTURE_H

#include <stdint.h>
#include <time.h>

#include "test.h"

#define US UINT64_C(1000)
#define MS UINT64_C(1000000)
#define SEC UINT64_C(1000000000)

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

/* Sleep @ns, resuming after signals. */
static inline void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / SEC), (long)(ns % SEC)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static inline void sleep_us(uint64_t us)
{
    sleep_ns(us * US);
}

static inline void sleep_ms(uint64_t ms)
{
    sleep_ns(ms * MS);
}

/* CLOCK_REALTIME in milliseconds (the durable store's wall clock). */
static inline int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* CLOCK_REALTIME in microseconds. */
static inline int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* CLOCK_MONOTONIC in milliseconds. */
static inline int64_t mono_ms(void)
{
    return (int64_t)(mono_now() / MS);
}

/* Poll @cond every millisecond for at most @sec seconds, then assert it. */
#define WAIT_FOR(cond, sec)                                                    \
    do {                                                                       \
        uint64_t wf_end_ = mono_now() + (uint64_t)(sec)*SEC;                   \
        while (!(cond) && mono_now() < wf_end_)                                \
            sleep_ns(MS);                                                      \
        ASSERT(cond);                                                          \
    } while (0)

#endif
