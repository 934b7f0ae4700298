/* SPDX-License-Identifier: MIT */
/*
 * tests/redis_fixture.h - helpers of the tests that run against real
 * redis-server processes (tests/test_durable_redis.c,
 * tests/test_redis_owner.c, tests/test_redis_failover.c,
 * tests/test_redis_perm.c): the load average, the pid of a slot's
 * server (the clocks are tests/clock_fixture.h's) and the number
 * in a delivered timer's key.
 */
#ifndef TWHEEL_TEST_REDIS_FIXTURE_H
#define TWHEEL_TEST_REDIS_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

#include "clock_fixture.h"
#include "redis_client.h"
#include "test.h"
#include "twheel/durable.h"

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

/* The number after the one-letter @prefix in @t's key ("L42": 42), or -1
 * when the key is not @prefix and a number below @max. */
static inline int key_num(const tw_durable_timer *t, char prefix, int max)
{
    char k[16];
    size_t n = t->key_len < sizeof k - 1 ? t->key_len : sizeof k - 1;
    memcpy(k, t->key, n);
    k[n] = 0;
    int i = atoi(k + 1);
    return k[0] == prefix && i >= 0 && i < max ? i : -1;
}

#endif
