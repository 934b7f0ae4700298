/* SPDX-License-Identifier: MIT */
/*
 * tests/realtime.h - real-time helpers shared by the threaded tests and
 * bench_service: CLOCK_MONOTONIC in nanoseconds and a sleep that resumes
 * after signals. Include after defining _POSIX_C_SOURCE.
 */
#ifndef TWHEEL_TEST_REALTIME_H
#define TWHEEL_TEST_REALTIME_H

#include <stdint.h>
#include <time.h>

#define MS UINT64_C(1000000)
#define SEC UINT64_C(1000000000)

static inline uint64_t mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

static inline void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / SEC), (long)(ns % SEC)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

#endif
