/* SPDX-License-Identifier: MIT */
/*
 * bench/rmw_floor.c - the floor under a service schedule+cancel pair: what
 * its atomic read-modify-writes cost alone on this machine.
 *
 *   rmw_floor [ITERATIONS]   (default 100,000,000)
 *
 * Without membarrier(2) a pair runs two locked read-modify-writes on the
 * producer, each on a line no other thread is touching at that moment:
 * the publication of the record (an exchange whose full barrier is also
 * the producer's half of the wake-up handshake with a sleeping timer
 * thread), and the cancel's compare-and-swap of the ring slot (it races
 * the timer thread's take). With membarrier(2) the publication is a
 * plain store (src/fence.h) and only the cancel's remains: half the
 * first figure below. This program runs two sequentially consistent
 * compare-and-swaps, each on its own cache line of its own thread, and
 * prints ns per iteration: the part of a pair no change of the
 * instructions around them can remove. For scale it also prints one
 * locked add and one plain increment per iteration.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Alignas(64) _Atomic uint64_t line_a;
static _Alignas(64) _Atomic uint64_t line_b;
static _Alignas(64) volatile uint64_t plain;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    long n = 100000000;
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: rmw_floor [ITERATIONS]\n");
        return 0;
    }
    if (argc > 1) {
        char *end;
        n = strtol(argv[1], &end, 10);
        if (*end || n <= 0) {
            fprintf(stderr, "rmw_floor: bad ITERATIONS %s\n", argv[1]);
            return 2;
        }
    }
    double t0 = now_s();
    for (long i = 0; i < n; i++) {
        uint64_t x = (uint64_t)i, y = (uint64_t)i;
        atomic_compare_exchange_strong(&line_a, &x, (uint64_t)i + 1);
        atomic_compare_exchange_strong(&line_b, &y, (uint64_t)i + 1);
    }
    double t1 = now_s();
    for (long i = 0; i < n; i++)
        atomic_fetch_add(&line_a, 1);
    double t2 = now_s();
    for (long i = 0; i < n; i++)
        plain = plain + 1;
    double t3 = now_s();
    printf("two seq_cst CAS %.2f ns, one locked add %.2f ns, one plain "
           "increment %.2f ns per iteration (%ld iterations)\n",
           (t1 - t0) / (double)n * 1e9, (t2 - t1) / (double)n * 1e9,
           (t3 - t2) / (double)n * 1e9, n);
    return atomic_load(&line_a) == 0 && atomic_load(&line_b) == 0;
}
