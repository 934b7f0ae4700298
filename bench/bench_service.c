/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_service.c - throughput, memory, idle wake-ups and lateness of
 * the thread-safe timer service (twheel/service.h).
 *
 * Usage: bench_service [--quick] [--tasks N] [--reps R] [--producers LIST]
 *                      [--throughput] [--exact] [--cpu]
 *
 * Measures, side by side for 1 and 2 producer threads (--producers 1,2,4:
 * any list of up to 4 counts, each at most 16), with N (default
 * 1,000,000) tasks whose delays are uniform in [1 s, 60 s] on a 1 ms tick:
 *   - tw_schedule calls per second, into a fresh service (the task pool
 *     grows and its pages are touched for the first time: "cold") and into
 *     one whose pool is already grown ("warm");
 *   - tw_cancel calls per second on those pending tasks;
 *   - schedule + immediate cancel pairs per second;
 * each without and with TW_SERVICE_LAZY_CLOCK (no clock read per call while
 * the timer thread is awake),
 * then bytes per pending task (record size, and resident memory growth
 * with N tasks pending), timer-thread wake-ups per second when idle (with
 * nothing pending, and with N tasks pending 1 to 2 hours away), and the
 * lateness
 * p50/p99/max of 100,000 tasks spread over 10 s on 1 ms ticks (--quick:
 * 20,000 over 2 s). --quick also uses N = 200,000 and shorter idle windows.
 *
 * Each throughput figure is the median of R runs (default 3, --quick 1);
 * after each table a "spread" line per figure gives median, min and max.
 * --throughput stops after the throughput table, --exact leaves out the
 * lazy-clock rows, --cpu divides by the producers' CPU time rather than
 * the wall-clock time (steadier on a loaded machine, for comparing builds;
 * not comparable with the Java peers' wall-clock figures). Output: one table,
 * each row "metric | 1 producer | 2 producers" (one column per count of
 * --producers) or a single value.
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "service_internal.h"
#include "twheel/service.h"
#include "fixture.h"
#include "bench_stats.h"

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

/* Resident set size in bytes (Linux /proc; 0 elsewhere). */
static uint64_t rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL)
        return 0;
    unsigned long size = 0, res = 0;
    if (fscanf(f, "%lu %lu", &size, &res) != 2)
        res = 0;
    fclose(f);
    return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

static void check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "bench_service: %s failed: %s\n", what,
                tw_strerror(rc));
        exit(1);
    }
}

static void nop_task(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
}

/* ------------------------------------------------------------------------ */
/* Producer threads. */

enum op { OP_SCHEDULE, OP_CANCEL, OP_PAIRS };

/* Cancels that found their task already run (see OP_CANCEL). */
static _Atomic uint64_t cancel_missed;

struct worker {
    pthread_t thread;
    tw_service *s;
    enum op op;
    uint64_t *delays; /* this worker's share */
    tw_id *ids;       /* this worker's share */
    size_t n;
    pthread_barrier_t *start;
    uint64_t t0, t1, c0, c1;
};

/* --cpu: rates from the producers' CPU time instead of the wall clock
 * (steadier on a loaded machine; not comparable with the Java figures). */
static int use_cpu_time;

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void *worker_main(void *p)
{
    struct worker *w = p;
    pthread_barrier_wait(w->start);
    w->c0 = thread_cpu_ns();
    w->t0 = mono_now();
    switch (w->op) {
    case OP_SCHEDULE:
        for (size_t i = 0; i < w->n; i++)
            if (tw_schedule(w->s, nop_task, NULL, w->delays[i], &w->ids[i]))
                abort();
        break;
    case OP_CANCEL:
        /* False only for a task that already ran: a phase that lasts
         * longer than the shortest delay (1 s) on a loaded machine. */
        for (size_t i = 0; i < w->n; i++)
            if (!tw_cancel(w->s, w->ids[i]))
                atomic_fetch_add_explicit(&cancel_missed, 1,
                                          memory_order_relaxed);
        break;
    case OP_PAIRS:
        for (size_t i = 0; i < w->n; i++) {
            tw_id id;
            if (tw_schedule(w->s, nop_task, NULL, w->delays[i], &id) ||
                !tw_cancel(w->s, id))
                abort();
        }
        break;
    }
    w->t1 = mono_now();
    w->c1 = thread_cpu_ns();
    return NULL;
}

#define MAX_PRODUCERS 16

/* Run @op on @nthreads threads over @n tasks; returns operations/s. */
static double run_op(tw_service *s, enum op op, int nthreads, uint64_t *delays,
                     tw_id *ids, size_t n)
{
    struct worker w[MAX_PRODUCERS];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)nthreads);
    size_t per = n / (size_t)nthreads;
    for (int k = 0; k < nthreads; k++) {
        w[k] = (struct worker){.s = s,
                               .op = op,
                               .delays = delays + per * k,
                               .ids = ids + per * k,
                               .n = per,
                               .start = &start};
        if (pthread_create(&w[k].thread, NULL, worker_main, &w[k]) != 0)
            abort();
    }
    uint64_t t0 = UINT64_MAX, t1 = 0, cpu = 0;
    for (int k = 0; k < nthreads; k++) {
        pthread_join(w[k].thread, NULL);
        cpu += w[k].c1 - w[k].c0;
        if (w[k].t0 < t0)
            t0 = w[k].t0;
        if (w[k].t1 > t1)
            t1 = w[k].t1;
    }
    pthread_barrier_destroy(&start);
    if (use_cpu_time) /* as if each thread had run on its own core */
        return (double)(per * (size_t)nthreads) /
               ((double)cpu / (double)nthreads / 1e9);
    return (double)(per * (size_t)nthreads) / ((double)(t1 - t0) / 1e9);
}

/* Wait until the timer thread has released every cancelled task. */
static void wait_released(tw_service *s, uint64_t cancelled)
{
    tw_service_stats st;
    for (;;) {
        tw_service_get_stats(s, &st);
        if (st.cancelled >= cancelled)
            return;
        sleep_ns(MS);
    }
}

struct tput {
    double cold, warm, cancel, pairs;
    double lo[4], hi[4]; /* the slowest and the fastest run of each */
};

#define MAX_REPS 99

static struct tput throughput(int nthreads, uint32_t flags, uint64_t *delays,
                              tw_id *ids, size_t n, int reps)
{
    double v[4][MAX_REPS];
    tw_service_config cfg = {.flags = flags};
    for (int r = 0; r < reps; r++) {
        tw_service *s;
        check(tw_service_create(&s, &cfg), "tw_service_create");
        check(tw_service_start(s), "tw_service_start");
        uint64_t cancelled = 0;
        atomic_store(&cancel_missed, 0);
        v[0][r] = run_op(s, OP_SCHEDULE, nthreads, delays, ids, n);
        v[2][r] = run_op(s, OP_CANCEL, nthreads, delays, ids, n);
        cancelled += n - n % (size_t)nthreads;
        wait_released(s, cancelled - atomic_load(&cancel_missed));
        v[1][r] = run_op(s, OP_SCHEDULE, nthreads, delays, ids, n);
        run_op(s, OP_CANCEL, nthreads, delays, ids, n);
        cancelled += n - n % (size_t)nthreads;
        wait_released(s, cancelled - atomic_load(&cancel_missed));
        v[3][r] = run_op(s, OP_PAIRS, nthreads, delays, ids, n);
        if (atomic_load(&cancel_missed) != 0)
            fprintf(stderr,
                    "bench_service: %" PRIu64 " cancels found their task run "
                    "(a phase outlasted the 1 s shortest delay)\n",
                    atomic_load(&cancel_missed));
        tw_service_stop(s, NULL, NULL);
        tw_service_destroy(s);
    }
    struct tput t;
    t.cold = bench_median(v[0], (size_t)reps);
    t.warm = bench_median(v[1], (size_t)reps);
    t.cancel = bench_median(v[2], (size_t)reps);
    t.pairs = bench_median(v[3], (size_t)reps);
    for (int m = 0; m < 4; m++) { /* bench_median() sorted each row */
        t.lo[m] = v[m][0];
        t.hi[m] = v[m][reps - 1];
    }
    return t;
}

/* ------------------------------------------------------------------------ */
/* Lateness. */

static uint64_t *late_due;
static uint64_t *late_ns;

static void late_task(tw_id id, void *arg)
{
    (void)id;
    size_t i = (size_t)(uintptr_t)arg;
    uint64_t now = mono_now();
    late_ns[i] = now > late_due[i] ? now - late_due[i] : 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static void lateness(size_t n, uint64_t spread, uint64_t out[3])
{
    late_due = calloc(n, sizeof(*late_due));
    late_ns = calloc(n, sizeof(*late_ns));
    if (late_due == NULL || late_ns == NULL)
        abort();
    tw_service *s;
    tw_service_config cfg = {.tick_ns = MS};
    check(tw_service_create(&s, &cfg), "tw_service_create");
    uint64_t rng = 7;
    for (size_t i = 0; i < n; i++) {
        uint64_t d = rng_next(&rng) % spread;
        late_due[i] = mono_now() + d;
        check(tw_schedule(s, late_task, (void *)(uintptr_t)i, d, NULL),
              "tw_schedule");
    }
    while (tw_service_pending(s) != 0)
        sleep_ns(10 * MS);
    tw_service_stop(s, NULL, NULL); /* waits for the last task */
    tw_service_destroy(s);
    qsort(late_ns, n, sizeof(*late_ns), cmp_u64);
    out[0] = late_ns[n / 2];
    out[1] = late_ns[(size_t)((double)n * 0.99)];
    out[2] = late_ns[n - 1];
    free(late_due);
    free(late_ns);
}

/* ------------------------------------------------------------------------ */

/* Parse "1,2,4" into @out (at most 4 counts, each 1..MAX_PRODUCERS). */
static int parse_producers(const char *arg, int *out)
{
    int k = 0;
    for (const char *p = arg; *p != '\0' && k < 4;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > MAX_PRODUCERS)
            return 0;
        out[k++] = (int)v;
        p = *end == ',' ? end + 1 : end;
        if (*end != ',' && *end != '\0')
            return 0;
    }
    return k;
}

static int help_asked; /* --help: the usage on stdout, exit status 0 */

static void usage(const char *argv0)
{
    fprintf(help_asked ? stdout : stderr,
            "usage: %s [--quick] [--tasks N] [--reps R] [--producers 1,2,4] "
            "[--throughput] [--exact] [--cpu]\n",
            argv0);
    exit(help_asked ? 0 : 2);
}

/* The throughput table: one row per metric, one column per producer
 * count. */
static void throughput_table(const int *np, int nnp, int clocks,
                             uint64_t *delays, tw_id *ids, size_t n, int reps)
{
    static const char *const names[4] = {
        "schedule (fresh pool", "schedule (pool grown", "cancel (pending tasks",
        "schedule+cancel pairs"};
    printf("%-40s", "metric (M operations/s)");
    for (int k = 0; k < nnp; k++)
        printf(" %11d producer%s", np[k], np[k] == 1 ? " " : "s");
    printf("\n");
    for (int lazy = 0; lazy < clocks; lazy++) {
        uint32_t fl = lazy ? TW_SERVICE_LAZY_CLOCK : 0;
        struct tput t[4];
        for (int k = 0; k < nnp; k++)
            t[k] = throughput(np[k], fl, delays, ids, n, reps);
        for (int m = 0; m < 4; m++) {
            char label[80];
            snprintf(label, sizeof(label), "%s%s%s", names[m],
                     lazy ? ", lazy clock" : "", m < 3 ? ")" : "");
            printf("%-40s", label);
            for (int k = 0; k < nnp; k++) {
                const double *f = &t[k].cold;
                printf(" %20.1f", f[m] / 1e6);
            }
            printf("\n");
        }
        /* The spread of each figure, for scripts: one line per metric and
         * producer count, "spread METRIC CLOCK PRODUCERS median min max". */
        static const char *const keys[4] = {"schedule", "schedule_grown",
                                            "cancel", "pairs"};
        for (int m = 0; m < 4; m++)
            for (int k = 0; k < nnp; k++) {
                const double *f = &t[k].cold;
                printf("spread %s %s %d %.2f %.2f %.2f\n", keys[m],
                       lazy ? "lazy" : "exact", np[k], f[m] / 1e6,
                       t[k].lo[m] / 1e6, t[k].hi[m] / 1e6);
            }
        fflush(stdout);
    }
}

int main(int argc, char **argv)
{
    int quick = 0, reps = 0, only_tput = 0, clocks = 2, np[4] = {1, 2};
    int nnp = 2;
    size_t n = 1000000;
    help_asked = argc == 2 && strcmp(argv[1], "--help") == 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            quick = 1;
            n = 200000;
        } else if (strcmp(argv[i], "--tasks") == 0 && i + 1 < argc) {
            n = (size_t)strtoull(argv[++i], NULL, 10);
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1 || reps > MAX_REPS)
                usage(argv[0]);
        } else if (strcmp(argv[i], "--producers") == 0 && i + 1 < argc) {
            if ((nnp = parse_producers(argv[++i], np)) == 0)
                usage(argv[0]);
        } else if (strcmp(argv[i], "--throughput") == 0) {
            only_tput = 1;
        } else if (strcmp(argv[i], "--exact") == 0) {
            clocks = 1;
        } else if (strcmp(argv[i], "--cpu") == 0) {
            use_cpu_time = 1;
        } else {
            usage(argv[0]);
        }
    }
    if (n < 16)
        n = 16;
    if (reps == 0)
        reps = quick ? 1 : 3;
    uint64_t *delays = malloc(n * sizeof(*delays));
    tw_id *ids = malloc(n * sizeof(*ids));
    if (delays == NULL || ids == NULL)
        abort();
    uint64_t rng = 1;
    for (size_t i = 0; i < n; i++)
        delays[i] = SEC + rng_next(&rng) % (59 * SEC);

    printf("twheel service benchmark: %zu tasks, delays uniform in "
           "[1 s, 60 s], 1 ms tick, median of %d\n\n",
           n, reps);
    throughput_table(np, nnp, clocks, delays, ids, n, reps);
    if (only_tput) {
        free(delays);
        free(ids);
        return 0;
    }

    /* Memory: resident growth with n tasks pending in a fresh service. */
    tw_service *s;
    check(tw_service_create(&s, NULL), "tw_service_create");
    check(tw_service_start(s), "tw_service_start");
    tw__service_sync(s);
    uint64_t rss0 = rss_bytes();
    for (size_t i = 0; i < n; i++)
        delays[i] += 3600 * SEC; /* nothing fires while we watch */
    run_op(s, OP_SCHEDULE, 1, delays, ids, n);
    tw__service_sync(s);
    uint64_t rss1 = rss_bytes();
    tw_service_stats st;
    tw_service_get_stats(s, &st);
    printf("\n%-40s %14zu\n", "bytes per task record (sizeof)",
           tw__service_node_size());
    printf("%-40s %14.1f\n", "resident bytes per pending task",
           (double)(rss1 - rss0) / (double)n);
    printf("%-40s %14.1f\n", "allocated bytes per pending task",
           (double)st.memory_bytes / (double)n);

    /* Idle wake-ups: n tasks pending far away, then nothing pending. */
    uint64_t win = quick ? SEC : 3 * SEC;
    sleep_ns(100 * MS); /* let the last poll after the burst pass */
    tw_service_get_stats(s, &st);
    uint64_t w0 = st.wakeups, t0 = mono_now();
    sleep_ns(win);
    tw_service_get_stats(s, &st);
    double busy_idle =
        (double)(st.wakeups - w0) / ((double)(mono_now() - t0) / 1e9);
    tw_service_stop(s, NULL, NULL);
    tw_service_destroy(s);

    check(tw_service_create(&s, NULL), "tw_service_create");
    check(tw_service_start(s), "tw_service_start");
    t0 = mono_now();
    sleep_ns(win);
    tw_service_get_stats(s, &st);
    double idle = (double)st.wakeups / ((double)(mono_now() - t0) / 1e9);
    tw_service_destroy(s);
    printf("%-40s %14.2f\n", "idle wake-ups/s, nothing pending", idle);
    printf("%-40s %14.2f\n", "idle wake-ups/s, all pending in 1-2 h",
           busy_idle);

    size_t ln = quick ? 20000 : 100000;
    uint64_t spread = quick ? 2 * SEC : 10 * SEC;
    uint64_t lat[3];
    lateness(ln, spread, lat);
    char label[80];
    snprintf(label, sizeof(label),
             "lateness us, %zu tasks over %" PRIu64 " s:", ln, spread / SEC);
    printf("%-40s %9s %9s %9s\n", label, "p50", "p99", "max");
    printf("%-40s %9.1f %9.1f %9.1f\n", "", (double)lat[0] / 1e3,
           (double)lat[1] / 1e3, (double)lat[2] / 1e3);
    free(delays);
    free(ids);
    return 0;
}
