/* SPDX-License-Identifier: MIT */
/*
 * tests/redis_fixture.h - helpers of the tests that run against real
 * redis-server processes (tests/test_durable_redis.c,
 * tests/test_redis_owner.c): the real wall clock, the load average and
 * the pid of a slot's server (sleep_ms is tests/fixture.h's).
 */
#ifndef TWHEEL_TEST_REDIS_FIXTURE_H
#define TWHEEL_TEST_REDIS_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "fixture.h" /* sleep_ms */
#include "redis_client.h"
#include "test.h"

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

/* The pid of the server that holds @slot (INFO server, routed there by
 * @rc). */
static inline pid_t slot_pid(tw__rc *rc, int slot)
{
    const char *argv[2] = {"INFO", "server"};
    size_t len[2] = {4, 6};
    tw__rc_cmd c = {2, argv, len, slot, NULL, 0};
    ASSERT_EQ(tw__rc_exec(rc, &c, 1), 0);
    ASSERT(c.reply && c.reply->type == REDIS_REPLY_STRING);
    const char *p = strstr(c.reply->str, "process_id:");
    ASSERT(p);
    pid_t pid = (pid_t)atoll(p + 11);
    freeReplyObject(c.reply);
    return pid;
}

#endif
