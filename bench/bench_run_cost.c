/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_run_cost.c - what one task run costs the timer service's
 * timer thread.
 *
 * Usage: bench_run_cost [--tasks N] [--lazy]
 *
 * N (default 1,000,000) tasks due at the same moment run one after another
 * on the timer thread in one round; the time from the first task's start to
 * the last one's, divided by N - 1, is the cost of a run (the service's
 * bookkeeping plus a call of an empty task). Best of 5. --lazy: with
 * TW_SERVICE_LAZY_CLOCK. Uses only the 0.1
 * API, so the same source builds against an older library:
 * scripts/bench_slack.sh compares this tree with a baseline commit.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture.h"
#include "twheel/service.h"

static void check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "bench_run_cost: %s failed: %s\n", what,
                tw_strerror(rc));
        exit(1);
    }
}

static _Atomic uint64_t rc_first, rc_last, rc_runs;
static uint64_t rc_n;

static void rc_task(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
    uint64_t n = atomic_load_explicit(&rc_runs, memory_order_relaxed) + 1;
    atomic_store_explicit(&rc_runs, n, memory_order_relaxed);
    if (n == 1)
        atomic_store(&rc_first, mono_now());
    else if (n == rc_n)
        atomic_store(&rc_last, mono_now());
}

static double run_cost(size_t n, uint32_t flags)
{
    tw_service *s;
    tw_service_config cfg = {0};
    cfg.flags = flags;
    check(tw_service_create(&s, &cfg), "tw_service_create");
    check(tw_service_start(s), "tw_service_start");
    atomic_store(&rc_runs, 0);
    rc_n = n;
    /* All due at one moment 500 ms from now, after the last call. */
    uint64_t due = mono_now() + 500 * MS;
    for (size_t i = 0; i < n; i++) {
        uint64_t now = mono_now();
        check(tw_schedule(s, rc_task, NULL, due > now ? due - now : 0, NULL),
              "tw_schedule");
    }
    while (atomic_load(&rc_runs) < n)
        sleep_ns(10 * MS);
    tw_service_destroy(s);
    return (double)(atomic_load(&rc_last) - atomic_load(&rc_first)) /
           (double)(n - 1);
}

int main(int argc, char **argv)
{
    size_t n = 1000000;
    uint32_t flags = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--tasks") == 0 && i + 1 < argc) {
            n = (size_t)strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--lazy") == 0) {
            flags = TW_SERVICE_LAZY_CLOCK;
        } else {
            int help = strcmp(argv[i], "--help") == 0;
            fprintf(help ? stdout : stderr, "usage: %s [--tasks N] [--lazy]\n",
                    argv[0]);
            return help ? 0 : 2;
        }
    }
    if (n < 2)
        n = 2;
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double ns = run_cost(n, flags);
        best = r == 0 || ns < best ? ns : best;
    }
    printf("run cost%s: %zu tasks due together, best of 5: %.1f ns/run\n",
           flags ? " (lazy clock)" : "", n, best);
    return 0;
}
