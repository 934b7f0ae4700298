/* SPDX-License-Identifier: MIT */
/*
 * tests/test_clock_wall.c - wall-clock jumps do not reach the service.
 *
 * Runs under libfaketime (tests/CMakeLists.txt sets LD_PRELOAD,
 * FAKETIME_TIMESTAMP_FILE, FAKETIME_NO_CACHE=1 and
 * FAKETIME_DONT_FAKE_MONOTONIC=1): while tasks wait on a real service, the
 * test moves CLOCK_REALTIME back by a day, forward by two, back by three,
 * by rewriting the timestamp file, and checks first that each jump really
 * happened (and that CLOCK_MONOTONIC did not move). Every one-shot task must
 * still run once, never before its delay (CLOCK_MONOTONIC, measured around
 * the schedule call), and within a generous bound after it; periodic tasks
 * keep their rate. A service that waited on the wall clock would sleep a day
 * or spin through the jumps.
 *
 * Bounds: lateness under 2 s per task (a few ms on an unloaded machine);
 * periodic runs between a tenth of and one more than the ideal count (a
 * quarter failed a few times in 60 runs at a load average of 6-9 on 2
 * cores; a service that slept on the wall clock makes one or two runs).
 */
#define _POSIX_C_SOURCE 200809L

#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "fixture.h"
#include "test.h"
#include "twheel/service.h"

#define N 30

static uint64_t clock_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

/*
 * Set the faked wall-clock offset (libfaketime syntax); with @check, assert
 * that the wall clock jumped by @days and the monotonic clock did not.
 */
static void set_wall(const char *offset, int64_t days, bool check)
{
    const char *path = getenv("FAKETIME_TIMESTAMP_FILE");
    ASSERT_NOT_NULL(path);
    uint64_t r0 = clock_ns(CLOCK_REALTIME), m0 = clock_ns(CLOCK_MONOTONIC);
    FILE *f = fopen(path, "w");
    ASSERT_NOT_NULL(f);
    fprintf(f, "%s\n", offset);
    ASSERT_EQ(fclose(f), 0);
    uint64_t r1 = clock_ns(CLOCK_REALTIME), m1 = clock_ns(CLOCK_MONOTONIC);
    if (!check)
        return;
    int64_t jump = (int64_t)(r1 - r0) - (int64_t)(m1 - m0);
    /* The wall clock moved by @days (within a second), monotonic did not. */
    ASSERT_LT(llabs(jump - days * 86400 * (int64_t)SEC), (int64_t)SEC);
    ASSERT_LT(m1 - m0, SEC);
}

struct task {
    uint64_t delay, at;
    _Atomic uint64_t ran_at;
    _Atomic int runs;
};

static void one_shot(tw_id id, void *arg)
{
    struct task *t = arg;
    (void)id;
    atomic_store(&t->ran_at, clock_ns(CLOCK_MONOTONIC));
    atomic_fetch_add(&t->runs, 1);
}

static void tick(tw_id id, void *arg)
{
    (void)id;
    atomic_fetch_add((_Atomic int *)arg, 1);
}

static void run(uint32_t executors)
{
    static struct task t[N];
    static _Atomic int rate_runs, delay_runs;
    tw_service_config cfg = {0};
    cfg.executor_threads = executors;
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    atomic_store(&rate_runs, 0);
    atomic_store(&delay_runs, 0);
    uint64_t start = clock_ns(CLOCK_MONOTONIC);
    ASSERT_EQ(
        tw_schedule_fixed_rate(s, tick, &rate_runs, 10 * MS, 10 * MS, NULL), 0);
    ASSERT_EQ(
        tw_schedule_fixed_delay(s, tick, &delay_runs, 10 * MS, 10 * MS, NULL),
        0);
    for (int i = 0; i < N; i++) {
        t[i].delay = (uint64_t)(20 + 10 * i) * MS;
        atomic_store(&t[i].runs, 0);
        t[i].at = clock_ns(CLOCK_MONOTONIC);
        ASSERT_EQ(tw_schedule(s, one_shot, &t[i], t[i].delay, NULL), 0);
    }
    sleep_ms(15);
    set_wall("-1d", -1, true);
    sleep_ms(100);
    set_wall("+1d", 2, true);
    sleep_ms(100);
    set_wall("-2d", -3, true);
    uint64_t end = clock_ns(CLOCK_MONOTONIC) + 10 * SEC;
    bool done = false;
    while (!done && clock_ns(CLOCK_MONOTONIC) < end) {
        sleep_ms(5);
        done = true;
        for (int i = 0; i < N; i++)
            done &= atomic_load(&t[i].runs) == 1;
    }
    uint64_t elapsed = clock_ns(CLOCK_MONOTONIC) - start;
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 2); /* the periodic tasks */
    tw_service_destroy(s);
    set_wall("+0", 2, true);
    for (int i = 0; i < N; i++) {
        ASSERT_EQ(atomic_load(&t[i].runs), 1);
        uint64_t took = atomic_load(&t[i].ran_at) - t[i].at;
        ASSERT_GE(took, t[i].delay);
        ASSERT_LT(took, t[i].delay + 2 * SEC);
    }
    uint64_t ideal = elapsed / (10 * MS);
    ASSERT_LE((uint64_t)atomic_load(&rate_runs), ideal + 1);
    ASSERT_GE((uint64_t)atomic_load(&rate_runs), ideal / 10);
    ASSERT_LE((uint64_t)atomic_load(&delay_runs), ideal + 1);
    ASSERT_GE((uint64_t)atomic_load(&delay_runs), ideal / 10);
}

static void test_wall_clock_jumps(void)
{
    run(0);
    run(2);
}

int main(void)
{
    set_wall("+0", 0, false); /* whatever an interrupted run left */
    RUN_TEST(test_wall_clock_jumps);
    return tw_test_done();
}
