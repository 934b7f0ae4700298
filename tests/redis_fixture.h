/* SPDX-License-Identifier: MIT */
/*
 * tests/redis_fixture.h - helpers of the tests that run against real
 * redis-server processes (tests/test_durable_redis.c,
 * tests/test_redis_owner.c): the real wall clock and the load average
 * (sleep_ms is tests/fixture.h's).
 */
#ifndef TWHEEL_TEST_REDIS_FIXTURE_H
#define TWHEEL_TEST_REDIS_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "fixture.h" /* sleep_ms */

static inline int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline int64_t wall_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* The 1-minute load average, 0 when unknown. */
static inline double load_avg(void)
{
    double l = 0;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf", &l) != 1)
            l = 0;
        fclose(f);
    }
    return l;
}

#endif
