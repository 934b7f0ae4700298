/* SPDX-License-Identifier: MIT */
/*
 * bench/fence_cost.c - what the service's heavy barrier (src/fence.h,
 * membarrier(2)) costs: the timer thread calls it before a sleep of two
 * ticks or more, and every CPU that runs another thread of the process
 * is interrupted for it.
 *
 *   fence_cost [CALLS]   (default 20,000)
 *
 * Prints the time per call with no other thread, and with one thread
 * that keeps a CPU busy (the kernel then interrupts that CPU for each
 * call, unless the two threads share one CPU).
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fence.h"
#include "bench_stats.h"

static _Alignas(64) _Atomic int stop;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A thread of the process that keeps its CPU busy, as a producer would. */
static void *busy_loop(void *arg)
{
    volatile unsigned long n = 0;
    (void)arg;
    while (!atomic_load_explicit(&stop, memory_order_relaxed))
        n = n + 1;
    return NULL;
}

/* Median over 5 batches of @calls heavy barriers: seconds per call. */
static double per_call(long calls)
{
    double t[5];
    for (int r = 0; r < 5; r++) {
        double t0 = now_s();
        for (long i = 0; i < calls; i++)
            tw__fence_heavy();
        t[r] = (now_s() - t0) / (double)calls;
    }
    qsort(t, 5, sizeof(t[0]), bench_cmp_double);
    return t[2];
}

int main(int argc, char **argv)
{
    long calls = 20000;
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: fence_cost [CALLS]\n");
        return 0;
    }
    if (argc > 1) {
        char *end;
        calls = strtol(argv[1], &end, 10);
        if (*end || calls <= 0) {
            fprintf(stderr, "fence_cost: bad CALLS %s\n", argv[1]);
            return 2;
        }
    }
    if (!tw__fence_ready()) {
        printf("membarrier(2) not available: the service exchanges its "
               "producers' tails instead\n");
        return 0;
    }
    double alone = per_call(calls);
    pthread_t t;
    if (pthread_create(&t, NULL, busy_loop, NULL) != 0) {
        fprintf(stderr, "fence_cost: pthread_create failed\n");
        return 1;
    }
    struct timespec warm = {0, 50000000};
    nanosleep(&warm, NULL);
    double beside = per_call(calls);
    atomic_store(&stop, 1);
    pthread_join(t, NULL);
    printf("heavy barrier: %.2f us alone, %.2f us with a thread running "
           "beside it (medians of 5 x %ld calls)\n",
           alone * 1e6, beside * 1e6, calls);
    return 0;
}
