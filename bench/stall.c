/* stall.c: fill a durable store (SYNC_NONE) with N keys, one schedule per
 * call, and report the longest call and the sum of calls over 10 ms. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "twheel/durable.h"
static int nofire(tw_durable *d, const tw_durable_timer *t, void *a)
{
    (void)d;
    (void)t;
    (void)a;
    return 0;
}
static unsigned long long ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000000000ull + t.tv_nsec;
}
int main(int argc, char **argv)
{
    tw_durable_config c;
    memset(&c, 0, sizeof c);
    c.dir = argv[1];
    c.fire = nofire;
    c.sync = TW_DURABLE_SYNC_NONE;
    c.segment_bytes = (uint64_t)1 << 30;
    size_t n = strtoull(argv[2], 0, 10);
    tw_durable *d;
    if (tw_durable_open(&d, &c))
        return 1;
    struct timespec w;
    clock_gettime(CLOCK_REALTIME, &w);
    long long due = w.tv_sec * 1000ll + 86400000ll;
    unsigned long long worst = 0, over = 0, t0 = ns();
    size_t nover = 0;
    char k[32];
    for (size_t i = 0; i < n; i++) {
        snprintf(k, sizeof k, "key-%012zu", i);
        unsigned long long a = ns();
        if (tw_durable_schedule(d, k, 16, due, "p", 1))
            return 2;
        unsigned long long b = ns() - a;
        if (b > worst)
            worst = b;
        if (b > 10000000ull) {
            over += b;
            nover++;
            fprintf(stderr, " [%zu: %.0f ms]", i, b / 1e6);
        }
    }
    printf(
        "n=%zu total_s=%.2f worst_ms=%.1f calls_over_10ms=%zu their_ms=%.1f\n",
        n, (ns() - t0) / 1e9, worst / 1e6, nover, over / 1e6);
    tw_durable_close(d);
    return 0;
}
