/* SPDX-License-Identifier: MIT */
/*
 * src/clock.h - clock readings shared by the service, the journal and the
 * Redis backend. Include after the file's feature macros (clock_gettime
 * needs POSIX).
 */
#ifndef TWHEEL_CLOCK_H
#define TWHEEL_CLOCK_H

#include <stdint.h>
#include <time.h>

/* @id's reading in nanoseconds. Inline: it is on every schedule call. */
static inline uint64_t tw__clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* *@ts = CLOCK_MONOTONIC now plus @ns, as pthread_cond_timedwait() takes
 * it on a condition variable of that clock. */
static inline void tw__mono_after(struct timespec *ts, uint64_t ns)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ns += (uint64_t)ts->tv_nsec;
    ts->tv_sec += (time_t)(ns / 1000000000u);
    ts->tv_nsec = (long)(ns % 1000000000u);
}

#endif
