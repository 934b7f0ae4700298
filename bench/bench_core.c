/* SPDX-License-Identifier: MIT */
/*
 * bench_core.c - the C side of twheel's benchmark suite.
 *
 * Runs each workload on each engine, interleaving the engines repetition by
 * repetition so that a burst of noise from the rest of the machine hits all
 * of them alike, and prints the median ns per operation with the speed-up
 * over the binary-heap baseline of the same run (optionally also as CSV).
 *
 * Engines: twheel's core wheel in its default hierarchical mode and in
 * Netty's mode (one wheel of 512 slots with rounds), our binary min-heap
 * (bench/heap.c), and, when they were found at build time, libuv's timers
 * (uv_timer_start/uv_timer_stop, expiry driven through uv_run) and libevent's
 * (evtimer_add/evtimer_del, expiry driven through event_base_loop).
 *
 * One tick is one millisecond. libuv and libevent read the monotonic clock
 * themselves; this program interposes clock_gettime() (and epoll_wait(), to
 * turn the loops' sleeps into jumps of the virtual clock) so that their loops
 * run on the same virtual time as the wheel, without waiting for real time.
 * Our own timing uses CLOCK_MONOTONIC_RAW, which is never virtual.
 *
 * Usage: bench_core [--n 1000,1000000] [--reps 5] [--engines a,b]
 *                   [--workloads a,b] [--cap-ms 2000] [--csv FILE]
 *                   [--churn-steps N] [--callgrind 1] [--list]
 * --cap-ms bounds the stepped expiry runs (expire_1, expire_1024,
 * expire_next): a run stops after that long and reports ns per timer fired
 * so far ('*'); a cell whose warm-up was capped or took over twice the cap
 * is measured by that one run ('~'). A single advance (expire_jump) cannot
 * be stopped. Netty mode's stepped expiry walks every timer of a slot at
 * each visit (rounds), which is what needs the cap.
 * --callgrind 1 (under valgrind --tool=callgrind --collect-atstart=no):
 * one run per cell, no warm-up, counts dumped per run (see scripts/bench.sh).
 * The CSV file is appended to (a header is written if it is empty).
 */
#define _GNU_SOURCE
#include <twheel/wheel.h>

#include "heap.h"
#include "bench_stats.h"

#include <dlfcn.h>
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <time.h>

#if defined(__has_include)
#if __has_include(<valgrind/callgrind.h>)
#include <valgrind/callgrind.h>
#define TWB_HAVE_CALLGRIND 1
#endif
#endif
#ifdef TWB_HAVE_LIBUV
#include <uv.h>
#endif
#ifdef TWB_HAVE_LIBEVENT
#include <event2/event.h>
#endif

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

#define DL_MAX (UINT64_C(1) << 20) /* deadlines uniform in [1, DL_MAX] */
#define IDLE_TIMEOUT 60000         /* 60 s at 1 ms per tick */
#define IDLE_TICKS 4096            /* ticks the idle workload runs */

/* ------------------------------------------------------------------ */
/* Clocks: real for us, virtual for the event loops.                   */

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);
typedef int (*epoll_wait_fn)(int, struct epoll_event *, int, int);
typedef int (*epoll_pwait_fn)(int, struct epoll_event *, int, int,
                              const sigset_t *);

static clock_gettime_fn real_clock_gettime;
static epoll_wait_fn real_epoll_wait;
static epoll_pwait_fn real_epoll_pwait;
static int virt_on;         /* monotonic clocks are virtual */
static uint64_t virt_ms;    /* the virtual monotonic time */
static uint64_t virt_reads; /* how often a library read it */

static void clocks_init(void)
{
    /* The casts go through void * as POSIX allows for dlsym results. */
    void *p = dlsym(RTLD_NEXT, "clock_gettime");
    memcpy(&real_clock_gettime, &p, sizeof(p));
    p = dlsym(RTLD_NEXT, "epoll_wait");
    memcpy(&real_epoll_wait, &p, sizeof(p));
    p = dlsym(RTLD_NEXT, "epoll_pwait");
    memcpy(&real_epoll_pwait, &p, sizeof(p));
    if (!real_clock_gettime) {
        fprintf(stderr, "bench_core: cannot find clock_gettime\n");
        exit(1);
    }
}

/* Exported (the build hides symbols by default) so that the libraries'
 * calls bind here. */
#define INTERPOSE __attribute__((visibility("default")))

INTERPOSE int clock_gettime(clockid_t id, struct timespec *ts)
{
    if (virt_on && (id == CLOCK_MONOTONIC || id == CLOCK_MONOTONIC_COARSE)) {
        virt_reads++;
        ts->tv_sec = (time_t)(virt_ms / 1000);
        ts->tv_nsec = (long)(virt_ms % 1000 * 1000000);
        return 0;
    }
    return real_clock_gettime(id, ts);
}

/* A loop that would sleep @timeout ms instead moves the virtual clock. */
static int virt_sleep(int timeout)
{
    if (virt_on && timeout != 0) {
        if (timeout > 0)
            virt_ms += (uint64_t)timeout;
        return 0;
    }
    return timeout;
}

INTERPOSE int epoll_wait(int fd, struct epoll_event *ev, int max, int timeout)
{
    return real_epoll_wait(fd, ev, max, virt_sleep(timeout));
}

INTERPOSE int epoll_pwait(int fd, struct epoll_event *ev, int max, int timeout,
                          const sigset_t *mask)
{
    return real_epoll_pwait(fd, ev, max, virt_sleep(timeout), mask);
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    real_clock_gettime(CLOCK_MONOTONIC_RAW, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/*
 * Timed regions. Under valgrind (--callgrind), instructions and simulated
 * cache misses are collected inside them only, and dumped after each run
 * with the run's name, so that noise-free counts sit next to wall times.
 */
static int cg_mode;

static inline uint64_t t_begin(void)
{
#ifdef TWB_HAVE_CALLGRIND
    if (cg_mode)
        CALLGRIND_TOGGLE_COLLECT;
#endif
    return now_ns();
}

static inline uint64_t t_end(void)
{
    uint64_t t = now_ns();
#ifdef TWB_HAVE_CALLGRIND
    if (cg_mode)
        CALLGRIND_TOGGLE_COLLECT;
#endif
    return t;
}

/* Bytes currently allocated through malloc (small and mmapped blocks). */
static size_t heap_bytes(void)
{
    struct mallinfo2 mi = mallinfo2();
    return mi.uordblks + mi.hblkhd;
}

/* ------------------------------------------------------------------ */
/* Inputs shared by every engine.                                       */

enum {
    WL_ADD,
    WL_ADD_RAND,
    WL_CANCEL,
    WL_CANCEL_RAND,
    WL_EXP_1,
    WL_EXP_1024,
    WL_EXP_NEXT,
    WL_EXP_JUMP,
    WL_CHURN,
    WL_IDLE,
    WL_MEMORY,
    WL_COUNT
};

static const struct {
    const char *name, *unit, *what;
} wl_info[WL_COUNT] = {
    {"add", "ns/op", "add N timers, array order"},
    {"add_rand", "ns/op", "add N timers, random order"},
    {"cancel", "ns/op", "cancel N pending timers, array order"},
    {"cancel_rand", "ns/op", "cancel N pending timers, random order"},
    {"expire_1", "ns/timer", "advance in 1-tick steps until all fired"},
    {"expire_1024", "ns/timer", "advance in 1024-tick steps until all fired"},
    {"expire_next", "ns/timer", "jump to each next expiry until all fired"},
    {"expire_jump", "ns/timer", "one advance past every deadline"},
    {"churn", "ns/pair", "N pending; cancel one + add one, 2^20 times"},
    {"idle", "ns/op",
     "60 s idle timeouts: N/1000 re-arms per tick, "
     "4096 ticks; per re-arm or expiry"},
    {"memory", "B/timer", "bytes allocated per pending timer"},
};

struct input {
    size_t n;
    uint64_t base;  /* the start tick */
    uint32_t *dl;   /* deadline offsets, uniform in [1, DL_MAX] */
    uint32_t *dl2;  /* more of them, for churn */
    uint32_t *perm; /* a random permutation of 0..n-1 */
    uint32_t *dlp;  /* dl in the order of perm: dlp[k] = dl[perm[k]] */
    uint32_t *pick; /* random indices in 0..n-1, with repeats */
    size_t churn_steps;
    uint64_t cap_ns; /* a bound on one expiry run */
};

struct sample {
    double ns, ops;
    size_t fired;
    int capped;
};

struct engine;

static uint64_t rng_next(uint64_t *s)
{
    /* splitmix64: fixed seeds make every run see the same inputs. */
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static void *xmalloc(size_t size)
{
    void *p = malloc(size ? size : 1);
    if (!p) {
        fprintf(stderr, "bench_core: out of memory (%zu bytes)\n", size);
        exit(1);
    }
    return p;
}

static void input_make(struct input *in, size_t n)
{
    uint64_t s = 20260521;
    in->n = n;
    in->base = 1000;
    in->dl = xmalloc(n * sizeof(*in->dl));
    in->dl2 = xmalloc(n * sizeof(*in->dl2));
    in->perm = xmalloc(n * sizeof(*in->perm));
    in->dlp = xmalloc(n * sizeof(*in->dlp));
    in->pick = xmalloc(n * sizeof(*in->pick));
    for (size_t i = 0; i < n; i++) {
        in->dl[i] = (uint32_t)(1 + rng_next(&s) % DL_MAX);
        in->dl2[i] = (uint32_t)(1 + rng_next(&s) % DL_MAX);
        in->pick[i] = (uint32_t)(rng_next(&s) % n);
        in->perm[i] = (uint32_t)i;
    }
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(rng_next(&s) % i);
        uint32_t t = in->perm[i - 1];
        in->perm[i - 1] = in->perm[j];
        in->perm[j] = t;
    }
    for (size_t k = 0; k < n; k++)
        in->dlp[k] = in->dl[in->perm[k]];
}

static void input_free(struct input *in)
{
    free(in->dl);
    free(in->dl2);
    free(in->perm);
    free(in->dlp);
    free(in->pick);
}

/* ------------------------------------------------------------------ */
/* The engines. Each one: setup, teardown, add, cancel, advance,        */
/* advance_next (to the next expiry), and the fields fired/rearm/now.   */

struct engine {
    const char *name;
    int (*run)(const struct engine *, const struct input *, int,
               struct sample *);
    tw_wheel_config cfg; /* twheel only */
};

/* twheel core wheel: "tw" */
typedef struct {
    tw_wheel *w;
    tw_timer *t;
    size_t fired;
    uint64_t rearm, now;
} tw_t;

static void tw_cb(tw_timer *t, void *arg)
{
    tw_t *e = arg;
    e->fired++;
    if (e->rearm)
        tw_wheel_add(e->w, t, e->now + e->rearm);
}

static int tw_setup(tw_t *e, const struct engine *eng, size_t n, uint64_t now)
{
    if (tw_wheel_create(&e->w, &eng->cfg, now) != 0)
        return -1;
    e->t = xmalloc(n * sizeof(*e->t));
    for (size_t i = 0; i < n; i++)
        tw_timer_init(&e->t[i], tw_cb, e);
    return 0;
}

static void tw_teardown(tw_t *e)
{
    tw_wheel_destroy(e->w);
    free(e->t);
}

static inline void tw_add(tw_t *e, size_t i, uint64_t expires)
{
    tw_wheel_add(e->w, &e->t[i], expires);
}

static inline void tw_cancel(tw_t *e, size_t i)
{
    tw_wheel_cancel(e->w, &e->t[i]);
}

static inline void tw_advance(tw_t *e, uint64_t now)
{
    tw_wheel_advance(e->w, now);
}

static inline void tw_advance_next(tw_t *e)
{
    uint64_t t = tw_wheel_next_expiry(e->w);
    e->now = t;
    tw_wheel_advance(e->w, t);
}

#define ENG tw
#include "workloads.inc"

/* Our binary min-heap: "hp" */
typedef struct hp_timer {
    heap_node node;
    void (*fn)(struct hp_timer *, void *);
    void *arg;
} hp_timer;

typedef struct {
    heap h;
    hp_timer *t;
    size_t fired;
    uint64_t rearm, now;
} hp_t;

static inline void hp_add(hp_t *e, size_t i, uint64_t expires)
{
    hp_timer *x = &e->t[i];
    if (x->node.idx != HEAP_NONE)
        heap_update(&e->h, &x->node, expires);
    else
        heap_insert(&e->h, &x->node, expires); /* cannot fail: preallocated */
}

static void hp_cb(hp_timer *x, void *arg)
{
    hp_t *e = arg;
    e->fired++;
    if (e->rearm)
        hp_add(e, (size_t)(x - e->t), e->now + e->rearm);
}

static int hp_setup(hp_t *e, const struct engine *eng, size_t n, uint64_t now)
{
    (void)eng;
    (void)now;
    if (heap_init(&e->h, n) != 0)
        return -1;
    e->t = xmalloc(n * sizeof(*e->t));
    for (size_t i = 0; i < n; i++) {
        heap_node_init(&e->t[i].node);
        e->t[i].fn = hp_cb;
        e->t[i].arg = e;
    }
    return 0;
}

static void hp_teardown(hp_t *e)
{
    heap_free(&e->h);
    free(e->t);
}

static inline void hp_cancel(hp_t *e, size_t i)
{
    if (e->t[i].node.idx != HEAP_NONE)
        heap_remove(&e->h, &e->t[i].node);
}

static inline void hp_advance(hp_t *e, uint64_t now)
{
    while (heap_min_key(&e->h) <= now) {
        hp_timer *x = (hp_timer *)(void *)heap_min(&e->h);
        heap_remove(&e->h, &x->node);
        x->fn(x, x->arg);
    }
}

static inline void hp_advance_next(hp_t *e)
{
    e->now = heap_min_key(&e->h);
    hp_advance(e, e->now);
}

#define ENG hp
#include "workloads.inc"

#ifdef TWB_HAVE_LIBUV
/* libuv: "lu". An unreferenced async handle gives the loop one file
 * descriptor to poll, as every real libuv program has; without one uv_run
 * skips epoll altogether. */
typedef struct {
    uv_loop_t loop;
    uv_async_t wake;
    uv_timer_t *t;
    size_t n, fired;
    uint64_t rearm, now;
} lu_t;

static void lu_cb(uv_timer_t *h)
{
    lu_t *e = h->data;
    e->fired++;
    if (e->rearm)
        uv_timer_start(h, lu_cb, e->rearm, 0);
}

static int lu_setup(lu_t *e, const struct engine *eng, size_t n, uint64_t now)
{
    (void)eng;
    virt_ms = now;
    if (uv_loop_init(&e->loop) != 0)
        return -1;
    uv_async_init(&e->loop, &e->wake, NULL);
    uv_unref((uv_handle_t *)&e->wake);
    e->n = n;
    e->t = xmalloc(n * sizeof(*e->t));
    for (size_t i = 0; i < n; i++) {
        uv_timer_init(&e->loop, &e->t[i]);
        e->t[i].data = e;
    }
    return 0;
}

static void lu_teardown(lu_t *e)
{
    for (size_t i = 0; i < e->n; i++)
        uv_close((uv_handle_t *)&e->t[i], NULL);
    uv_close((uv_handle_t *)&e->wake, NULL);
    uv_run(&e->loop, UV_RUN_DEFAULT);
    uv_loop_close(&e->loop);
    free(e->t);
}

static inline void lu_add(lu_t *e, size_t i, uint64_t expires)
{
    uint64_t now = uv_now(&e->loop);
    uv_timer_start(&e->t[i], lu_cb, expires > now ? expires - now : 0, 0);
}

static inline void lu_cancel(lu_t *e, size_t i)
{
    uv_timer_stop(&e->t[i]);
}

static inline void lu_advance(lu_t *e, uint64_t now)
{
    virt_ms = now;
    uv_run(&e->loop, UV_RUN_NOWAIT);
}

static inline void lu_advance_next(lu_t *e)
{
    uv_run(&e->loop, UV_RUN_ONCE); /* sleeps, i.e. jumps, to the next one */
    e->now = virt_ms;
}

#define ENG lu
#include "workloads.inc"
#endif

#ifdef TWB_HAVE_LIBEVENT
/* libevent: "le". Events are preallocated in one array and set up with
 * event_assign(), as an embedding server would. */
typedef struct {
    struct event_base *b;
    unsigned char *ev;
    size_t sz, n, fired;
    uint64_t rearm, now;
} le_t;

static inline struct event *le_ev(le_t *e, size_t i)
{
    return (struct event *)(void *)(e->ev + i * e->sz);
}

static inline void le_arm(struct event *ev, uint64_t delay)
{
    struct timeval tv = {(time_t)(delay / 1000),
                         (suseconds_t)(delay % 1000 * 1000)};
    evtimer_add(ev, &tv);
}

static void le_cb(evutil_socket_t fd, short what, void *arg)
{
    le_t *e = arg;
    (void)fd;
    (void)what;
    e->fired++;
    if (e->rearm)
        le_arm(event_base_get_running_event(e->b), e->rearm);
}

static int le_setup(le_t *e, const struct engine *eng, size_t n, uint64_t now)
{
    (void)eng;
    virt_ms = now;
    e->b = event_base_new();
    if (!e->b)
        return -1;
    e->n = n;
    e->sz = event_get_struct_event_size();
    e->ev = xmalloc(n * e->sz);
    for (size_t i = 0; i < n; i++)
        evtimer_assign(le_ev(e, i), e->b, le_cb, e);
    return 0;
}

static void le_teardown(le_t *e)
{
    for (size_t i = 0; i < e->n; i++)
        evtimer_del(le_ev(e, i));
    event_base_free(e->b);
    free(e->ev);
}

static inline void le_add(le_t *e, size_t i, uint64_t expires)
{
    le_arm(le_ev(e, i), expires > virt_ms ? expires - virt_ms : 0);
}

static inline void le_cancel(le_t *e, size_t i)
{
    evtimer_del(le_ev(e, i));
}

static inline void le_advance(le_t *e, uint64_t now)
{
    virt_ms = now;
    event_base_loop(e->b, EVLOOP_NONBLOCK | EVLOOP_ONCE);
}

static inline void le_advance_next(le_t *e)
{
    event_base_loop(e->b, EVLOOP_ONCE);
    e->now = virt_ms;
}

#define ENG le
#include "workloads.inc"
#endif

/* bench_core_1list names its wheel (built with one list per slot) apart. */
#ifndef TWB_TWHEEL_NAME
#define TWB_TWHEEL_NAME "twheel"
#endif
static const struct engine engines[] = {
    {TWB_TWHEEL_NAME, tw_run, {0, 0}}, {"twheel-netty", tw_run, {512, 1}},
    {"heap", hp_run, {0, 0}},
#ifdef TWB_HAVE_LIBUV
    {"libuv", lu_run, {0, 0}},
#endif
#ifdef TWB_HAVE_LIBEVENT
    {"libevent", le_run, {0, 0}},
#endif
};
#define N_ENGINES (sizeof(engines) / sizeof(engines[0]))
#define HEAP_ENGINE 2

/* ------------------------------------------------------------------ */
/* Driver.                                                               */

struct cell {
    double *v; /* per-repetition values */
    int nv;
    int capped, failed;
    int single; /* the warm-up was capped or took over 2 caps: it is the
                   one run */
    size_t fired;
};

static double median(struct cell *c)
{
    return bench_median(c->v, (size_t)c->nv);
}

/* Parse a comma-separated list of names into a bit set; -1 if unknown. */
static int parse_names(const char *arg, const char *const *names, int count,
                       unsigned *set)
{
    char buf[512];
    snprintf(buf, sizeof(buf), "%s", arg);
    *set = 0;
    for (char *save, *tok = strtok_r(buf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        int i;
        for (i = 0; i < count; i++)
            if (strcmp(tok, names[i]) == 0)
                break;
        if (i == count) {
            fprintf(stderr, "bench_core: unknown name '%s'\n", tok);
            return -1;
        }
        *set |= 1u << i;
    }
    return 0;
}

static int help_asked; /* --help: the usage on stdout, exit status 0 */

static void usage(void)
{
    fprintf(help_asked ? stdout : stderr,
            "usage: bench_core [--n N,N...] [--reps R] [--engines a,b]\n"
            "                  [--workloads a,b] [--cap-ms MS] [--csv FILE]\n"
            "                  [--churn-steps N] [--callgrind 1] [--list]\n");
    exit(help_asked ? 0 : 2);
}

int main(int argc, char **argv)
{
    help_asked = argc == 2 && strcmp(argv[1], "--help") == 0;
    const char *n_list = "1000000", *csv_path = NULL;
    const char *eng_names[N_ENGINES], *wl_names[WL_COUNT];
    unsigned eng_set = (1u << N_ENGINES) - 1, wl_set = 0;
    int reps = 5;
    uint64_t cap_ms = 2000;
    size_t churn_steps = (size_t)1 << 20;

    for (size_t i = 0; i < N_ENGINES; i++)
        eng_names[i] = engines[i].name;
    for (int i = 0; i < WL_COUNT; i++)
        wl_names[i] = wl_info[i].name;
    /* The default set: the core's add, cancel and expiry. */
    wl_set = 1u << WL_ADD | 1u << WL_ADD_RAND | 1u << WL_CANCEL |
             1u << WL_CANCEL_RAND | 1u << WL_EXP_1 | 1u << WL_EXP_JUMP |
             1u << WL_MEMORY;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--list") == 0) {
            printf("engines:");
            for (size_t k = 0; k < N_ENGINES; k++)
                printf(" %s", engines[k].name);
            printf("\nworkloads:\n");
            for (int k = 0; k < WL_COUNT; k++)
                printf("  %-12s %-9s %s\n", wl_info[k].name, wl_info[k].unit,
                       wl_info[k].what);
            return 0;
        }
        if (!v)
            usage();
        i++;
        if (strcmp(a, "--n") == 0)
            n_list = v;
        else if (strcmp(a, "--reps") == 0)
            reps = atoi(v);
        else if (strcmp(a, "--cap-ms") == 0)
            cap_ms = strtoull(v, NULL, 10);
        else if (strcmp(a, "--churn-steps") == 0)
            churn_steps = strtoull(v, NULL, 10);
        else if (strcmp(a, "--callgrind") == 0)
            cg_mode = atoi(v);
        else if (strcmp(a, "--csv") == 0)
            csv_path = v;
        else if (strcmp(a, "--engines") == 0) {
            if (parse_names(v, eng_names, (int)N_ENGINES, &eng_set))
                return 2;
        } else if (strcmp(a, "--workloads") == 0) {
            if (strcmp(v, "all") == 0)
                wl_set = (1u << WL_COUNT) - 1;
            else if (parse_names(v, wl_names, WL_COUNT, &wl_set))
                return 2;
        } else
            usage();
    }
    if (reps < 1 || churn_steps < 1)
        usage();

    clocks_init();
    virt_on = 1;
    FILE *csv = NULL;
    if (csv_path) {
        csv = fopen(csv_path, "a"); /* appends: the suite runs us often */
        if (!csv) {
            perror(csv_path);
            return 1;
        }
        fseek(csv, 0, SEEK_END);
        if (ftell(csv) == 0)
            fprintf(csv, "n,workload,engine,unit,median,min,max,reps,"
                         "speedup_vs_heap,fired_fraction,note\n");
    }
    printf("twheel bench_core: ticks are 1 ms; deadlines uniform in "
           "[1, 2^20] ticks; %d repetitions after one warm-up, median;\n"
           "'xH' = heap time / engine time in the same run (above 1 = "
           "faster than the heap). sizeof(tw_timer) = %zu bytes.\n",
           reps, sizeof(tw_timer));

    int status = 0;
    char nbuf[256];
    snprintf(nbuf, sizeof(nbuf), "%s", n_list);
    for (char *save, *tok = strtok_r(nbuf, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        size_t n = (size_t)strtod(tok, NULL);
        if (n < 1) {
            fprintf(stderr, "bench_core: bad --n '%s'\n", tok);
            return 2;
        }
        struct input in;
        input_make(&in, n);
        in.churn_steps = churn_steps;
        in.cap_ns = cap_ms * 1000000u;

        printf("\n== %zu pending timers\n%-12s %-9s", n, "workload", "unit");
        for (size_t k = 0; k < N_ENGINES; k++)
            if (eng_set >> k & 1)
                printf(" %18s", engines[k].name);
        printf("\n");
        for (int wl = 0; wl < WL_COUNT; wl++) {
            if (!(wl_set >> wl & 1))
                continue;
            struct cell cells[N_ENGINES];
            int nrep = wl == WL_MEMORY || cg_mode ? 1 : reps;
            memset(cells, 0, sizeof(cells));
            /* Repetition -1 is the warm-up; engines interleave. */
            for (int r = wl == WL_MEMORY || cg_mode ? 0 : -1; r < nrep; r++) {
                for (size_t k = 0; k < N_ENGINES; k++) {
                    struct cell *c = &cells[k];
                    struct sample s;
                    if (!(eng_set >> k & 1) || c->failed || c->single)
                        continue;
                    if (!c->v)
                        c->v = xmalloc((size_t)nrep * sizeof(double));
                    if (engines[k].run(&engines[k], &in, wl, &s) != 0) {
                        fprintf(stderr, "bench_core: %s failed on %s\n",
                                engines[k].name, wl_info[wl].name);
                        c->failed = 1;
                        status = 1;
                        continue;
                    }
                    if (cg_mode && wl != WL_MEMORY) {
                        char label[96];
                        snprintf(label, sizeof(label), "%s/%s/%zu",
                                 engines[k].name, wl_info[wl].name, n);
#ifdef TWB_HAVE_CALLGRIND
                        CALLGRIND_DUMP_STATS_AT(label);
#endif
                        printf("callgrind %s ops=%.0f\n", label, s.ops);
                    }
                    c->capped |= s.capped;
                    c->fired = s.fired;
                    if (wl >= WL_EXP_1 && wl <= WL_EXP_JUMP && !s.capped &&
                        s.fired != n) {
                        fprintf(stderr, "bench_core: %s fired %zu of %zu\n",
                                engines[k].name, s.fired, n);
                        c->failed = 1;
                        status = 1;
                    }
                    /* A capped warm-up, or one slower than twice the cap,
                     * is kept as the only run: some engine/workload pairs
                     * take minutes. */
                    if (r < 0 && (s.capped || s.ns > 2.0 * (double)in.cap_ns))
                        c->single = 1;
                    if (r >= 0 || c->single)
                        c->v[c->nv++] = s.ops > 0 ? s.ns / s.ops : 0;
                }
            }
            double heap_med = 0;
            if (eng_set >> HEAP_ENGINE & 1 && !cells[HEAP_ENGINE].failed)
                heap_med = median(&cells[HEAP_ENGINE]);
            printf("%-12s %-9s", wl_info[wl].name, wl_info[wl].unit);
            for (size_t k = 0; k < N_ENGINES; k++) {
                struct cell *c = &cells[k];
                if (!(eng_set >> k & 1))
                    continue;
                if (c->failed) {
                    printf(" %18s", "failed");
                    continue;
                }
                double med = median(c);
                double sp = heap_med > 0 && med > 0 ? heap_med / med : 0;
                char buf[64];
                if (sp > 0)
                    snprintf(buf, sizeof(buf), "%.1f %5.2fxH%s%s", med, sp,
                             c->capped ? "*" : "", c->single ? "~" : "");
                else
                    snprintf(buf, sizeof(buf), "%.1f%s%s", med,
                             c->capped ? "*" : "", c->single ? "~" : "");
                printf(" %18s", buf);
                if (csv) {
                    char note[128] = "";
                    if (c->capped || c->single)
                        snprintf(note, sizeof(note), "%s%s",
                                 c->capped ? "capped: ns per timer fired so "
                                             "far; "
                                           : "",
                                 c->single ? "one run (warm-up capped or over "
                                             "twice the cap)"
                                           : "");
                    fprintf(csv,
                            "%zu,%s,%s,%s,%.2f,%.2f,%.2f,%d,%.3f,%.4f,"
                            "%s\n",
                            n, wl_info[wl].name, engines[k].name,
                            wl_info[wl].unit, med, c->v[0], c->v[c->nv - 1],
                            c->nv, sp, (double)c->fired / (double)n, note);
                }
            }
            printf("\n");
            fflush(stdout);
            for (size_t k = 0; k < N_ENGINES; k++)
                free(cells[k].v);
        }
        input_free(&in);
    }
    printf("\n* = capped at %llu ms per run: ns per timer fired so far "
           "(the early part of the run).\n~ = one run only: the warm-up "
           "was capped or took longer than twice the cap.\n",
           (unsigned long long)cap_ms);
    if (virt_reads == 0 && (eng_set >> HEAP_ENGINE) > 1)
        printf("warning: the event loops never read the virtual clock\n");
    if (csv)
        fclose(csv);
    return status;
}
