/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_slack.c - exact deadlines against deadline windows (slack)
 * in the timer service: timer-thread wake-ups, its CPU time, and how late
 * tasks run.
 *
 * Usage: bench_slack [--tasks N] [--slack-ms M] [--tick-us T]
 *                    [--min-s A] [--max-s B]
 *
 * Default mode: two services side by side in one process, one exact and
 * one with tw_service_config.slack_ns = M ms (default 10), each given the
 * same N tasks (default 100,000) with delays uniform in [A s, B s]
 * (default [1, 60]) on a T us tick (default 1000), all run on the timer
 * thread. Reported per service, over the run phase (from the end of
 * scheduling until the last task ran): timer-thread wake-ups
 * (tw_service_stats.wakeups), the timer thread's CPU time
 * (pthread_getcpuclockid of the thread, read from inside its first and
 * last task), and two lateness histograms: the service's late_hist (from
 * the tick each task was given) and one the tasks keep themselves, from
 * the time they asked for (call time + delay).
 * bench_run_cost.c measures the cost of a run.
 */
#define _GNU_SOURCE

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fixture.h"
#include "twheel/service.h"

#ifndef TW_LATE_BUCKETS
#define TW_LATE_BUCKETS 32
#endif

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static void check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "bench_slack: %s failed: %s\n", what, tw_strerror(rc));
        exit(1);
    }
}

static uint64_t cpu_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------------ */
/* Exact against slack. */

struct side {
    const char *name;
    uint64_t slack_ns;
    tw_service *s;
    uint64_t *due;                      /* per task: mono time asked for */
    uint64_t own_hist[TW_LATE_BUCKETS]; /* from the time asked for */
    uint64_t runs, n;
    clockid_t cpu; /* the timer thread's CPU clock */
    uint64_t cpu_first, cpu_last;
    _Atomic int done;
};

struct job {
    struct side *side;
    size_t i;
};

static unsigned bucket(uint64_t late_us)
{
    unsigned b = late_us ? 64u - (unsigned)__builtin_clzll(late_us) : 0u;
    return b < TW_LATE_BUCKETS - 1 ? b : TW_LATE_BUCKETS - 1;
}

/* Runs on the side's timer thread only. */
static void side_task(tw_id id, void *arg)
{
    (void)id;
    struct job *j = arg;
    struct side *sd = j->side;
    uint64_t now = mono_now();
    uint64_t due = sd->due[j->i];
    sd->own_hist[bucket(now > due ? (now - due) / 1000 : 0)]++;
    if (sd->runs++ == 0) {
        pthread_getcpuclockid(pthread_self(), &sd->cpu);
        sd->cpu_first = cpu_ns(sd->cpu);
    }
    if (sd->runs == sd->n) {
        sd->cpu_last = cpu_ns(sd->cpu);
        atomic_store(&sd->done, 1);
    }
}

static void print_hist(const char *label, const uint64_t *h)
{
    printf("  %-28s", label);
    for (unsigned b = 0; b < TW_LATE_BUCKETS; b++) {
        if (h[b] == 0)
            continue;
        if (b == 0)
            printf(" <1us:%" PRIu64, h[b]);
        else if (b == TW_LATE_BUCKETS - 1)
            printf(" >=%" PRIu64 "us:%" PRIu64, (uint64_t)1 << (b - 1), h[b]);
        else
            printf(" <%" PRIu64 "us:%" PRIu64, (uint64_t)1 << b, h[b]);
    }
    printf("\n");
}

int main(int argc, char **argv)
{
    size_t n = 0;
    uint64_t slack_ms = 10, tick_us = 1000, min_s = 1, max_s = 60;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--tasks") == 0 && i + 1 < argc)
            n = (size_t)strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--slack-ms") == 0 && i + 1 < argc)
            slack_ms = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--tick-us") == 0 && i + 1 < argc)
            tick_us = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--min-s") == 0 && i + 1 < argc)
            min_s = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--max-s") == 0 && i + 1 < argc)
            max_s = strtoull(argv[++i], NULL, 10);
        else {
            int help = strcmp(argv[i], "--help") == 0;
            fprintf(help ? stdout : stderr,
                    "usage: %s [--tasks N] [--slack-ms M] [--tick-us T] "
                    "[--min-s A] [--max-s B]\n",
                    argv[0]);
            return help ? 0 : 2;
        }
    }
    n = n ? n : 100000;
    if (max_s <= min_s || n < 1) {
        fprintf(stderr, "bench_slack: need --max-s > --min-s, N > 0\n");
        return 2;
    }
    struct side sides[2] = {{.name = "exact"},
                            {.name = "slack", .slack_ns = slack_ms * MS}};
    struct job *jobs = calloc(2 * n, sizeof(*jobs));
    uint64_t *delays = calloc(n, sizeof(*delays));
    if (jobs == NULL || delays == NULL)
        abort();
    uint64_t rng = 1;
    uint64_t span = (max_s - min_s) * SEC;
    for (size_t i = 0; i < n; i++)
        delays[i] = min_s * SEC + rng_next(&rng) % span;
    for (int k = 0; k < 2; k++) {
        struct side *sd = &sides[k];
        sd->n = n;
        sd->due = calloc(n, sizeof(*sd->due));
        if (sd->due == NULL)
            abort();
        tw_service_config cfg = {.tick_ns = tick_us * 1000,
                                 .slack_ns = sd->slack_ns};
        check(tw_service_create(&sd->s, &cfg), "tw_service_create");
        check(tw_service_start(sd->s), "tw_service_start");
    }
    /* Interleaved, so that both see the same moments. */
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < 2; k++) {
            struct side *sd = &sides[k];
            struct job *j = &jobs[(size_t)k * n + i];
            j->side = sd;
            j->i = i;
            sd->due[i] = mono_now() + delays[i];
            check(tw_schedule(sd->s, side_task, j, delays[i], NULL),
                  "tw_schedule");
        }
    }
    sleep_ns(200 * MS); /* the poll after the burst */
    tw_service_stats st0[2], st1[2];
    for (int k = 0; k < 2; k++)
        tw_service_get_stats(sides[k].s, &st0[k]);
    while (!atomic_load(&sides[0].done) || !atomic_load(&sides[1].done))
        sleep_ns(100 * MS);
    for (int k = 0; k < 2; k++)
        tw_service_get_stats(sides[k].s, &st1[k]);

    printf("twheel service, exact deadlines against %" PRIu64
           " ms of slack: %zu tasks, delays uniform in [%" PRIu64 " s, %" PRIu64
           " s], %" PRIu64 " us tick, tasks on the timer "
           "thread\n\n",
           slack_ms, n, min_s, max_s, tick_us);
    printf("%-44s %14s %14s\n", "metric (run phase)", sides[0].name,
           sides[1].name);
    uint64_t w[2], c[2];
    for (int k = 0; k < 2; k++) {
        w[k] = st1[k].wakeups - st0[k].wakeups;
        c[k] = sides[k].cpu_last - sides[k].cpu_first;
    }
    printf("%-44s %14" PRIu64 " %14" PRIu64 "\n", "timer-thread wake-ups", w[0],
           w[1]);
    printf("%-44s %14.1f %14.1f\n", "timer-thread CPU, first to last run (ms)",
           (double)c[0] / 1e6, (double)c[1] / 1e6);
    printf("%-44s %14.2f %14.2f\n", "tasks per wake-up",
           (double)n / (double)(w[0] ? w[0] : 1),
           (double)n / (double)(w[1] ? w[1] : 1));
    printf("%-44s %14s %14.1fx\n", "wake-ups, exact / slack", "",
           (double)w[0] / (double)(w[1] ? w[1] : 1));
    printf("\nlateness histograms (bucket upper bound: runs)\n");
    for (int k = 0; k < 2; k++) {
        printf("%s:\n", sides[k].name);
        print_hist("service late_hist (tick)", st1[k].late_hist);
        print_hist("from the time asked for", sides[k].own_hist);
    }
    for (int k = 0; k < 2; k++) {
        tw_service_destroy(sides[k].s);
        free(sides[k].due);
    }
    free(jobs);
    free(delays);
    return 0;
}
