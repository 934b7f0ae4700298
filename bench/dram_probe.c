/* SPDX-License-Identifier: MIT */
/*
 * bench/dram_probe.c - the memory's floor under a random access: the time
 * of one load from a random cache line of a buffer larger than the caches,
 * with one load in flight at a time (each address read from the line
 * before: the latency) and with several independent chains read in turn
 * (as many loads in flight as chains: what out-of-order execution can
 * overlap, the throughput of random misses).
 *
 * The core wheel's churn at 1e6 (cancel a random pending timer, add one)
 * touches at least one random timer of 40 MB per pair whatever the
 * layout of its lists, so this is the floor under a churn pair that no
 * list layout can go below (BENCHMARKS.md, core round).
 *
 * Usage: dram_probe [MIB [LOADS]]   (defaults: 256 MiB, 4,000,000 loads
 * per chain count). Prints one line per chain count (1, 2, 4, 8, 16):
 * mib, chains, ns_per_load.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define LINE 64
#define MAX_CHAINS 16

struct line {
    struct line *next;
    char pad[LINE - sizeof(struct line *)];
};

static double now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static uint64_t rng = 0x9e3779b97f4a7c15u;

static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* One cycle through all @n lines in a random order (Sattolo's shuffle of
 * the visiting order). */
static int link_cycle(struct line *l, size_t n)
{
    size_t *order = malloc(n * sizeof *order);
    if (!order)
        return -1;
    for (size_t i = 0; i < n; i++)
        order[i] = i;
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)(next_rand() % i);
        size_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    for (size_t i = 0; i < n; i++)
        l[order[i]].next = &l[order[(i + 1) % n]];
    free(order);
    return 0;
}

/* ns per load with @k chains read in turn, @loads loads per chain. */
static double chase(struct line *l, size_t n, int k, long loads)
{
    struct line *p[MAX_CHAINS];
    for (int c = 0; c < k; c++)
        p[c] = &l[(size_t)c * (n / (size_t)k)];
    double t0 = now_ns();
    for (long i = 0; i < loads; i++)
        for (int c = 0; c < k; c++)
            p[c] = p[c]->next;
    double t1 = now_ns();
    /* Keep the chase: its end points feed the output. */
    uintptr_t sink = 0;
    for (int c = 0; c < k; c++)
        sink ^= (uintptr_t)p[c];
    if (sink == 1)
        puts("");
    return (t1 - t0) / ((double)loads * k);
}

int main(int argc, char **argv)
{
    int help = argc == 2 && strcmp(argv[1], "--help") == 0;
    if (help || argc > 3) {
        fprintf(help ? stdout : stderr, "usage: %s [MIB [LOADS]]\n", argv[0]);
        return help ? 0 : 2;
    }
    long mib = argc > 1 ? atol(argv[1]) : 256;
    long loads = argc > 2 ? atol(argv[2]) : 4000000;
    if (mib < 1 || mib > 65536 || loads < 1) {
        fprintf(stderr, "dram_probe: 1 <= MIB <= 65536, LOADS >= 1\n");
        return 2;
    }
    size_t n = (size_t)mib * 1024 * 1024 / LINE;
    struct line *l = aligned_alloc(4096, n * LINE);
    if (!l || link_cycle(l, n) != 0) {
        fprintf(stderr, "dram_probe: out of memory\n");
        free(l);
        return 1;
    }
    chase(l, n, 1, loads / 4); /* warm the page tables */
    for (int k = 1; k <= MAX_CHAINS; k *= 2)
        printf("dram_probe mib=%ld chains=%d ns_per_load=%.1f\n", mib, k,
               chase(l, n, k, k == 1 ? loads : loads / 2));
    free(l);
    return 0;
}
