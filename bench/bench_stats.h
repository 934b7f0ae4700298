/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_stats.h - the order statistics the benchmark programs share
 * (bench_core, bench_service, churn_floor, fence_cost, fsync_probe): a
 * comparison of doubles for qsort() and the median of a sample. Header
 * only, as each program is built on its own.
 */
#ifndef TW_BENCH_STATS_H
#define TW_BENCH_STATS_H

#include <stddef.h>
#include <stdlib.h>

/* qsort() order of two doubles, ascending. */
static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Sorts @v[0..n) and returns its median (the mean of the middle two when
 * @n is even; 0 when it is 0). */
static inline double bench_median(double *v, size_t n)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof(*v), bench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif
