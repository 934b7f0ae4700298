/* SPDX-License-Identifier: MIT */
/*
 * bench/churn_floor.c - what a churn pair at 1e6 pending timers costs,
 * from the bare list operations up to the wheel's calls, beside the heap,
 * in one process.
 *
 * The workload is bench_core's churn on the same inputs (same generator,
 * same seed): N timers armed in array order at deadlines uniform in
 * [1, 2^20] ticks, then 2^20 pairs of "cancel timer pick[k], add it again
 * at a new deadline". Each engine runs on a fresh population; the engines
 * take turns within each repetition (the order rotates); medians.
 *
 *   lists          the memory work that no wheel on intrusive doubly-linked
 *                  lists avoids: unlink the timer (its own line and its two
 *                  neighbours', both prefetched as tw_wheel_cancel() does),
 *                  push it on the list of its slot (the wheel's slots of
 *                  2^16 ticks and its 8 lists a slot, chosen by the same
 *                  hash of the timer's address), each call out of line;
 *   +checks        the same plus the tests that the wheel's two calls
 *                  make before they change anything: NULL arguments and a
 *                  timer without a callback (TW_EINVAL), a pending timer
 *                  (an add moves it) and a due one (it joins the due list);
 *   +count         the same plus the exact count of pending timers that
 *                  tw_wheel_count() returns (one counter each for adds and
 *                  removes, as the wheel keeps);
 *   twheel-inline  tw_wheel_cancel_inline() and tw_wheel_add_unchecked();
 *   twheel         tw_wheel_cancel() and tw_wheel_add(), bench_core's
 *                  engine;
 *   heap           bench/heap.c, driven as bench_core drives it.
 *
 * Usage: churn_floor [N [REPS]]   (defaults: 1000000 timers, 7 repetitions).
 * Prints, per engine, ns per pair (wall clock, CLOCK_MONOTONIC_RAW, as
 * bench_core; and the thread's CPU time, which a busy machine's
 * preemptions do not inflate) as median [min..max], and the heap's median
 * over the engine's for each clock.
 */
#define _GNU_SOURCE
#include <twheel/wheel.h>

#include "heap.h"
#include "bench_stats.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define DL_MAX (UINT64_C(1) << 20)
#define STEPS ((size_t)1 << 20)
#define BASE 1000
#define MAX_REPS 64
#define BLOCK_SHIFT 14 /* TW_WHEEL_CHAIN_BLOCK */

static uint32_t *dl, *dl2, *pick;
static size_t n_timers;

static uint64_t rng_next(uint64_t *s) /* splitmix64, as bench_core */
{
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static void *xmalloc(size_t size)
{
    void *p = malloc(size);
    if (p == NULL) {
        fprintf(stderr, "churn_floor: out of memory\n");
        exit(1);
    }
    return p;
}

static double clock_ns(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* The engines' calls stay calls that the compiler cannot specialise to
 * their one caller (a NULL test it could prove away, a result nobody
 * reads): as a call into the library is. */
#if defined(__GNUC__) && !defined(__clang__)
#define OUT_OF_LINE __attribute__((noipa))
#else
#define OUT_OF_LINE __attribute__((noinline))
#endif

struct sample {
    double wall, cpu; /* ns per pair */
};

/* The timed loop of every engine, as bench_core's workloads.inc. */
#define CHURN(s, cancel, add)                                                  \
    do {                                                                       \
        double w0 = clock_ns(CLOCK_MONOTONIC_RAW);                             \
        double c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);                         \
        for (size_t k = 0; k < STEPS; k++) {                                   \
            size_t i = pick[k % n_timers];                                     \
            cancel;                                                            \
            add;                                                               \
            (void)i;                                                           \
        }                                                                      \
        (s)->cpu = (clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0) / (double)STEPS;   \
        (s)->wall = (clock_ns(CLOCK_MONOTONIC_RAW) - w0) / (double)STEPS;      \
    } while (0)

/* ---- lists and lists+api: a timer of tw_timer's layout (40 bytes) ---- */

struct node {
    struct node *next, **pprev;
    uint64_t expires;
    void (*fn)(struct node *, void *);
    void *arg;
};

struct lists {
    uint64_t removes, adds, now;
    struct node **heads; /* [slot][chain], 256 x 8 */
};

static void node_fn(struct node *x, void *arg)
{
    (void)x, (void)arg;
}

static inline size_t chain_of(const struct node *x)
{
    uint32_t block = (uint32_t)((uintptr_t)x >> BLOCK_SHIFT);
    return (uint32_t)((uint64_t)block * UINT64_C(0x9E3779B1)) >> 29;
}

static inline void push(struct lists *l, struct node *x, uint64_t e)
{
    struct node **h = &l->heads[((e >> 16) & 255) * 8 + chain_of(x)];
    struct node *first = *h;
    x->expires = e;
    x->next = first;
    if (first != NULL)
        first->pprev = &x->next;
    *h = x;
    x->pprev = h;
}

static inline void unlink_node(struct node *x)
{
    struct node **pprev = x->pprev, *next = x->next;
    __builtin_prefetch(pprev, 1);
    if (next != NULL)
        __builtin_prefetch(next, 1);
    *pprev = next;
    x->pprev = NULL;
    if (next != NULL)
        next->pprev = pprev;
}

OUT_OF_LINE static void l_cancel(struct lists *l, struct node *x)
{
    (void)l;
    if (x->pprev != NULL)
        unlink_node(x);
}

OUT_OF_LINE static int l_add(struct lists *l, struct node *x, uint64_t e)
{
    push(l, x, e);
    return 0;
}

/* +checks (@count 0) and +count (@count 1). A move or a due timer does not
 * occur in this workload: the tests only have to be made. */
static inline __attribute__((always_inline)) bool
c_cancel(struct lists *l, struct node *x, int count)
{
    if (x == NULL || x->pprev == NULL || l == NULL)
        return false;
    unlink_node(x);
    if (count)
        l->removes++;
    return true;
}

static inline __attribute__((always_inline)) int
c_add(struct lists *l, struct node *x, uint64_t e, int count)
{
    if (l == NULL || x == NULL || x->fn == NULL)
        return TW_EINVAL;
    if (x->pprev != NULL || e <= l->now)
        return TW_EINVAL;
    push(l, x, e);
    if (count)
        l->adds++;
    return 0;
}

OUT_OF_LINE static bool k_cancel(struct lists *l, struct node *x)
{
    return c_cancel(l, x, 0);
}

OUT_OF_LINE static int k_add(struct lists *l, struct node *x, uint64_t e)
{
    return c_add(l, x, e, 0);
}

OUT_OF_LINE static bool n_cancel(struct lists *l, struct node *x)
{
    return c_cancel(l, x, 1);
}

OUT_OF_LINE static int n_add(struct lists *l, struct node *x, uint64_t e)
{
    return c_add(l, x, e, 1);
}

/* @mode: 0 lists, 1 +checks, 2 +count. */
static void run_lists(int mode, struct sample *s)
{
    struct lists l = {0, 0, BASE, NULL};
    l.heads = calloc(256 * 8, sizeof(*l.heads));
    struct node *x = xmalloc(n_timers * sizeof(*x));
    if (l.heads == NULL) {
        fprintf(stderr, "churn_floor: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n_timers; i++)
        x[i].pprev = NULL, x[i].fn = node_fn, x[i].arg = NULL;
    for (size_t i = 0; i < n_timers; i++)
        l_add(&l, &x[i], BASE + dl[i]);
    if (mode == 0)
        CHURN(s, l_cancel(&l, &x[i]),
              l_add(&l, &x[i], BASE + dl2[k % n_timers]));
    else if (mode == 1)
        CHURN(s, k_cancel(&l, &x[i]),
              k_add(&l, &x[i], BASE + dl2[k % n_timers]));
    else
        CHURN(s, n_cancel(&l, &x[i]),
              n_add(&l, &x[i], BASE + dl2[k % n_timers]));
    /* Every pair removed and added one timer (and the counts are used). */
    if (mode == 2 && (l.adds != STEPS || l.removes != STEPS)) {
        fprintf(stderr, "churn_floor: the lists lost timers\n");
        exit(1);
    }
    free(x);
    free(l.heads);
}

/* ---- the wheel ---- */

static void tw_fn(tw_timer *t, void *arg)
{
    (void)t, (void)arg;
}

static void run_wheel(int inl, struct sample *s)
{
    tw_wheel *w;
    if (tw_wheel_create(&w, NULL, BASE) != 0) {
        fprintf(stderr, "churn_floor: cannot create a wheel\n");
        exit(1);
    }
    tw_timer *t = xmalloc(n_timers * sizeof(*t));
    for (size_t i = 0; i < n_timers; i++)
        tw_timer_init(&t[i], tw_fn, NULL);
    for (size_t i = 0; i < n_timers; i++)
        tw_wheel_add(w, &t[i], BASE + dl[i]);
    if (inl)
        CHURN(s, tw_wheel_cancel_inline(w, &t[i]),
              tw_wheel_add_unchecked(w, &t[i], BASE + dl2[k % n_timers]));
    else
        CHURN(s, tw_wheel_cancel(w, &t[i]),
              tw_wheel_add(w, &t[i], BASE + dl2[k % n_timers]));
    if (tw_wheel_count(w) != n_timers) {
        fprintf(stderr, "churn_floor: the wheel lost timers\n");
        exit(1);
    }
    tw_wheel_destroy(w);
    free(t);
}

/* ---- the heap, as bench_core's engine "heap" ---- */

typedef struct {
    heap_node node;
    void (*fn)(void *);
    void *arg;
} hp_timer;

static void run_heap(struct sample *s)
{
    heap h;
    hp_timer *x = xmalloc(n_timers * sizeof(*x));
    if (heap_init(&h, n_timers) != 0) {
        fprintf(stderr, "churn_floor: out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n_timers; i++)
        heap_node_init(&x[i].node), x[i].fn = NULL, x[i].arg = &h;
    for (size_t i = 0; i < n_timers; i++)
        heap_insert(&h, &x[i].node, BASE + dl[i]);
    CHURN(s, if (x[i].node.idx != HEAP_NONE) heap_remove(&h, &x[i].node),
          if (x[i].node.idx != HEAP_NONE)
              heap_update(&h, &x[i].node, BASE + dl2[k % n_timers]);
          else heap_insert(&h, &x[i].node, BASE + dl2[k % n_timers]));
    heap_free(&h);
    free(x);
}

/* ---- driver ---- */

static const char *const names[] = {"lists",         "+checks", "+count",
                                    "twheel-inline", "twheel",  "heap"};
#define N_ENG (sizeof(names) / sizeof(names[0]))
#define HEAP_ENG (N_ENG - 1)

static void run_engine(size_t e, struct sample *s)
{
    if (e < 3)
        run_lists((int)e, s);
    else if (e < 5)
        run_wheel(e == 3, s);
    else
        run_heap(s);
}

static double load1(void)
{
    double l = -1;
    FILE *f = fopen("/proc/loadavg", "r");
    if (f != NULL) {
        if (fscanf(f, "%lf", &l) != 1)
            l = -1;
        fclose(f);
    }
    return l;
}

int main(int argc, char **argv)
{
    if (argc > 3 || (argc > 1 && strcmp(argv[1], "--help") == 0)) {
        int help = argc > 1 && strcmp(argv[1], "--help") == 0;
        fprintf(help ? stdout : stderr, "usage: churn_floor [N [REPS]]\n");
        return help ? 0 : 2;
    }
    /* Whole decimal numbers only: "12x", "-1" and "" are refused. */
    char *end = NULL;
    bool bad = false;
    n_timers = 1000000;
    long rl = 7;
    if (argc > 1) {
        n_timers = strtoull(argv[1], &end, 10);
        bad |= *end != '\0' || argv[1][0] == '-';
    }
    if (argc > 2) {
        rl = strtol(argv[2], &end, 10);
        bad |= *end != '\0';
    }
    int reps = rl >= 1 && rl <= MAX_REPS ? (int)rl : 0;
    if (bad || n_timers < 1 || n_timers > UINT32_MAX || reps == 0) {
        fprintf(stderr, "churn_floor: 1 <= N < 2^32, 1 <= REPS <= %d\n",
                MAX_REPS);
        return 2;
    }
    /* bench_core's input_make(): dl, dl2 and pick drawn in this order. */
    uint64_t seed = 20260521;
    dl = xmalloc(n_timers * sizeof(*dl));
    dl2 = xmalloc(n_timers * sizeof(*dl2));
    pick = xmalloc(n_timers * sizeof(*pick));
    for (size_t i = 0; i < n_timers; i++) {
        dl[i] = (uint32_t)(1 + rng_next(&seed) % DL_MAX);
        dl2[i] = (uint32_t)(1 + rng_next(&seed) % DL_MAX);
        pick[i] = (uint32_t)(rng_next(&seed) % n_timers);
    }
    static double wall[N_ENG][MAX_REPS], cpu[N_ENG][MAX_REPS];
    double load_start = load1();
    struct sample s;
    run_engine(4, &s); /* warm-up: page faults, allocator */
    for (int r = 0; r < reps; r++)
        for (size_t j = 0; j < N_ENG; j++) {
            size_t e = (j + (size_t)r) % N_ENG; /* each goes first in turn */
            run_engine(e, &s);
            wall[e][r] = s.wall;
            cpu[e][r] = s.cpu;
        }
    printf("churn_floor: %zu timers, 2^20 pairs, %d repetitions, load %.2f "
           "-> %.2f\n",
           n_timers, reps, load_start, load1());
    printf("%-14s %24s %24s %16s\n", "engine", "wall ns/pair", "cpu ns/pair",
           "heap/this w, cpu");
    double hw = bench_median(wall[HEAP_ENG], (size_t)reps),
           hc = bench_median(cpu[HEAP_ENG], (size_t)reps);
    for (size_t e = 0; e < N_ENG; e++) {
        double mw = bench_median(wall[e], (size_t)reps),
               mc = bench_median(cpu[e], (size_t)reps);
        char a[64], b[64];
        snprintf(a, sizeof(a), "%.1f [%.1f..%.1f]", mw, wall[e][0],
                 wall[e][reps - 1]);
        snprintf(b, sizeof(b), "%.1f [%.1f..%.1f]", mc, cpu[e][0],
                 cpu[e][reps - 1]);
        printf("%-14s %24s %24s %7.2fx %6.2fx\n", names[e], a, b, hw / mw,
               hc / mc);
    }
    free(dl);
    free(dl2);
    free(pick);
    return 0;
}
