/* SPDX-License-Identifier: MIT */
/*
 * bench/durable_fill.c - the longest calls while a journal store fills.
 *
 *   durable_fill DIR N [SEGMENT_MB]
 *
 * Opens a store in DIR (SYNC_NONE; one 1 GiB segment by default, so that
 * no segment is closed while it fills; SEGMENT_MB makes segments of that
 * size, to see the calls that close one), schedules N keys one per call, and
 * prints every call that took over 10 ms (as [key count: ms]), the longest call
 * and the fill time. Built against an older tree's libtwheel.a it shows
 * what that version did (bench/history/BENCHMARKS-notebook.md, "The key
 * table grows a few buckets at a time").
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "twheel/durable.h"

static int no_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)t;
    (void)arg;
    return 0;
}

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    int help = argc == 2 && strcmp(argv[1], "--help") == 0;
    if (help || (argc != 3 && argc != 4)) {
        fprintf(help ? stdout : stderr,
                "usage: durable_fill DIR N [SEGMENT_MB]\n");
        return help ? 0 : 2;
    }
    tw_durable_config c;
    memset(&c, 0, sizeof c);
    c.dir = argv[1];
    c.fire = no_fire;
    c.sync = TW_DURABLE_SYNC_NONE;
    c.segment_bytes = UINT64_C(1) << 30;
    if (argc == 4)
        c.segment_bytes = strtoull(argv[3], NULL, 10) << 20;
    size_t n = strtoull(argv[2], NULL, 10);
    tw_durable *d;
    int rc = tw_durable_open(&d, &c);
    if (rc) {
        fprintf(stderr, "open: %s\n", tw_strerror(rc));
        return 1;
    }
    struct timespec w;
    clock_gettime(CLOCK_REALTIME, &w);
    int64_t due = (int64_t)w.tv_sec * 1000 + 86400000;
    uint64_t worst = 0, over = 0, t0 = mono_ns();
    size_t nover = 0;
    char k[32];
    for (size_t i = 0; i < n; i++) {
        snprintf(k, sizeof k, "key-%012zu", i);
        uint64_t a = mono_ns();
        rc = tw_durable_schedule(d, k, 16, due, "p", 1);
        uint64_t b = mono_ns() - a;
        if (rc) {
            fprintf(stderr, "schedule: %s\n", tw_strerror(rc));
            return 1;
        }
        if (b > worst)
            worst = b;
        if (b > 10000000u) {
            over += b;
            nover++;
            printf(" [%zu: %.0f ms]", i, (double)b / 1e6);
        }
    }
    printf("n=%zu total_s=%.2f worst_ms=%.1f calls_over_10ms=%zu "
           "their_ms=%.1f\n",
           n, (double)(mono_ns() - t0) / 1e9, (double)worst / 1e6, nover,
           (double)over / 1e6);
    tw_durable_close(d);
    return 0;
}
