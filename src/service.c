/* SPDX-License-Identifier: MIT */
/*
 * src/service.c - the thread-safe timer service (twheel/service.h).
 *
 * Design
 * ------
 * Task records ("nodes", 48 bytes on LP64) live in chunks of 4096 that never
 * move; a node is a tw_timer (40 bytes) plus one atomic 64-bit state word:
 *
 *   bits 63..32  generation (never 0; bumped each time the node is freed)
 *   bits 31..5   payload: while the node is live, the index of the task
 *                function in the service's function table (bits 28..5),
 *                ST_HOLD and ST_DROPPED (bits 29, 30: a one-shot task that
 *                keeps its pending slot while it runs, and whether that
 *                slot was released or taken over) and ST_RELATIVE (bit
 *                31, see below); while it is on the free list, the next
 *                free node (+1)
 *   bit  4       periodic (tw__arg points at a side record)
 *   bit  3       cancelled (or claimed by stop)
 *   bits 2..0    location: FREE, QUEUED, ARMED, DISPATCHED, RUNNING
 *
 * A tw_id is generation << 32 | (index + 1), so a stale id never matches a
 * reused node. The location says who owns the node's links; only the owner
 * changes the location, and everybody else may only set the cancelled bit
 * by CAS. The owner that sees the cancelled bit frees the node:
 *
 *   QUEUED      on the submission stack (tw__next is the link, tw__expires
 *               the deadline tick, or with ST_RELATIVE the delay in ns
 *               that the timer thread adds to its clock when it takes the
 *               node: TW_SERVICE_LAZY_CLOCK; tw__pprev is no link but
 *               the width in ticks of the task's window, 0 for an exact
 *               deadline); owner: the timer thread
 *   ARMED       in the wheel (or parked forever for a "never" deadline);
 *               owner: the timer thread. A cancel also sets the node's bit
 *               in a hierarchical bitmap so the timer thread unlinks and
 *               frees it within a tick.
 *   DISPATCHED  given to an executor; owner: whoever runs it.
 *               tw_service_run() accepts it with a CAS to RUNNING, so a
 *               job is taken once. A cancel that wins while the node
 *               waits in the pool's queue unlinks and frees it there
 *               (under the pool's mutex, which executors take to pop).
 *   RUNNING     its function runs; a one-shot task cannot be cancelled
 *               any more, a periodic one can (it is freed after the run)
 *
 * tw_service_stop() joins the threads, becomes the owner of everything and
 * claims each live node by setting its cancelled bit, so a racing
 * tw_cancel() and the hand-back can never both win.
 *
 * Producers (tw_schedule) never lock: they pop a node from a Treiber free
 * list (head tagged against ABA), reserve a pending slot with one atomic
 * operation as the call's last fallible step (so a failing call never
 * holds one), and push the node on a Treiber submission stack that the timer
 * thread takes whole with one exchange. The timer thread publishes the tick
 * it sleeps until; a producer wakes it (mutex + condition variable on
 * CLOCK_MONOTONIC) only when its deadline is earlier, so scheduling work
 * for later costs no system call. After a round with work the timer thread
 * polls once more a tick later instead of sleeping long, so a burst of
 * cancels needs at most one wake-up; when idle it sleeps without timeout.
 *
 * Task functions are stored as indexes into a small lock-free open-
 * addressing table (per service, max_callbacks entries): this is what keeps
 * a node at 48 bytes, since the tw_timer's own callback slot must hold the
 * service's trampoline.
 */
#define _POSIX_C_SOURCE 200809L

#include "twheel/service.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "service_clock.h"

/* ------------------------------------------------------------------------ */
/* Constants. */

enum { LOC_FREE = 0, LOC_QUEUED, LOC_ARMED, LOC_DISPATCHED, LOC_RUNNING };

#define ST_LOC_MASK UINT64_C(7)
#define ST_CANCELLED UINT64_C(8)
#define ST_PERIODIC UINT64_C(16)
#define ST_PAY_SHIFT 5
#define ST_PAY_MASK ((UINT64_C(1) << 27) - 1)
#define ST_GEN(st) ((uint32_t)((st) >> 32))
#define ST_LOC(st) ((unsigned)((st)&ST_LOC_MASK))
#define ST_PAY(st) ((uint32_t)(((st) >> ST_PAY_SHIFT) & ST_PAY_MASK))
/* Live nodes: the payload's low 24 bits are the function index; a QUEUED
 * one-shot node may have ST_RELATIVE: tw__expires holds its delay in ns,
 * and the timer thread computes its deadline (TW_SERVICE_LAZY_CLOCK). */
#define ST_FN(st) (ST_PAY(st) & ((UINT32_C(1) << 24) - 1))
#define ST_RELATIVE (UINT64_C(1) << 31)
/* A one-shot task of tw__schedule_replace() keeps its pending slot while it
 * runs (ST_HOLD), so that a replacing call can take the slot over: whoever
 * sets ST_DROPPED on the RUNNING node first, the run's end or the
 * replacing call, decides who releases the slot. While a one-shot node is
 * RUNNING nobody else writes its state word. */
#define ST_HOLD (UINT64_C(1) << 29)
#define ST_DROPPED (UINT64_C(1) << 30)

/* Chunks: 4096 nodes, each chunk in a block aligned to 2^18 bytes so that a
 * node's index follows from its address. */
#define CHUNK_BITS 12
#define CHUNK_NODES (1u << CHUNK_BITS)
#define CHUNK_ALIGN ((uintptr_t)1 << 18)
#define DIR_BITS 9 /* chunks per directory block: 512 */
#define DIR_BLOCKS 64
/* At most 2^27 - 1 nodes: the index + 1 must fit the 27-bit payload. */
#define MAX_NODES ((UINT32_C(1) << 27) - 1)

#define NEVER UINT64_MAX /* deadline tick of a task that never runs */
#define STOPPED_BIT (UINT64_C(1) << 63)
#define DRAIN_BATCH 8192 /* submissions per timer-thread round */

#define TICK_MIN_NS UINT64_C(1000)
#define TICK_MAX_NS (UINT64_C(86400) * 1000000000u)

/* ------------------------------------------------------------------------ */
/* Types. */

struct node {
    tw_timer t;
    _Atomic uint64_t state;
};

#if UINTPTR_MAX == UINT64_MAX
_Static_assert(sizeof(struct node) == 48, "a node is 48 bytes on LP64");
#endif

/* Everything a chunk holds after its nodes. */
struct chunk_tail {
    void *raw;                             /* what to tw__free() */
    uint32_t number;                       /* chunk index */
    _Atomic uint64_t l1;                   /* bit w: l0[w] may be non-zero */
    _Atomic uint64_t l0[CHUNK_NODES / 64]; /* cancel bits of ARMED nodes */
};

#define CHUNK_BYTES                                                            \
    (CHUNK_NODES * sizeof(struct node) + sizeof(struct chunk_tail))
_Static_assert(CHUNK_BYTES <= CHUNK_ALIGN, "a chunk fits its alignment");
/* What a chunk asks the allocator for: room to align it by hand. */
#define CHUNK_RAW_BYTES (CHUNK_BYTES + CHUNK_ALIGN - 1)

struct dirblock {
    _Atomic(struct node *) chunk[1u << DIR_BITS];
    _Atomic uint64_t dirty[(1u << DIR_BITS) / 64]; /* chunks with bits */
};

struct periodic {
    void *arg;
    uint64_t period_ns;
    uint64_t next_ns; /* fixed rate: the scheduled time of the next run */
    bool fixed_rate;
};

#define PAD(n) char pad##n[64]

struct tw_service {
    /* Read-mostly configuration. */
    uint64_t tick_ns;
    uint64_t start_ns; /* the clock at create: tick 0 */
    uint64_t max_pending;
    tw_clock_fn clock;
    void *clock_ctx;
    clockid_t clock_id;        /* the built-in clock (clock == NULL) */
    uint64_t slack_ns;         /* tw_schedule()'s default window */
    _Atomic uint64_t clock_hi; /* latest reading of clock (relative) */
    tw_execute_fn execute;
    void *execute_ctx;
    uint32_t nexec;
    uint32_t fn_mask;
    bool lazy; /* TW_SERVICE_LAZY_CLOCK */
    _Atomic(tw_task_fn) *fns;
    uint32_t salt;
    tw_wheel_config wcfg;
    PAD(0);

    _Atomic uint64_t free_head; /* tag << 32 | (index + 1) */
    _Atomic uint32_t fresh;     /* first never-used index */
    PAD(1);
    _Atomic(struct node *) subq; /* Treiber stack of QUEUED nodes */
    PAD(2);
    _Atomic uint64_t pending; /* count | STOPPED_BIT */
    PAD(3);
    _Atomic uint64_t sleep_until; /* tick; 0 while awake */
    _Atomic bool sleep_long;      /* asleep for more than a tick */
    _Atomic bool in_task; /* lazy only: the timer thread runs a callback */
    _Atomic uint64_t cancel_dirty; /* dirblocks with cancel bits */
    PAD(4);

    /* Pool growth. */
    _Atomic(struct dirblock *) dir[DIR_BLOCKS];

    /* Timer thread. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool kicked; /* under mu */
    _Atomic bool quit;
    _Atomic bool started;
    pthread_t thread;
    tw_wheel *wheel;
    struct node *local;      /* taken from subq, not yet processed */
    struct node *free_first; /* nodes freed this round, not yet pushed */
    struct node *free_last;
    struct node *disp_first; /* dispatched this round */
    struct node *disp_last;
    uint64_t disp_count;
    uint64_t round_ns; /* the clock at this round's advance */
    bool round_fresh;  /* no task has run on this thread since round_ns */

    /* Executor pool. */
    pthread_mutex_t xmu;
    pthread_cond_t xcv;
    /* Dispatched nodes waiting for an executor, under xmu: linked through
     * tw__next, and tw__pprev points at whatever points at the node (NULL
     * once taken), so that a cancel can unlink one. */
    tw_timer *xq_head, **xq_tailp;
    bool xquit; /* under xmu */
    pthread_t *xthreads;
    _Atomic uint64_t busy;    /* dispatched or running, not yet finished */
    _Atomic uint64_t backlog; /* dispatched, not yet started or dropped */

    /* tw_cancel_wait(). */
    pthread_mutex_t wmu;
    pthread_cond_t wcv;
    _Atomic uint32_t waiters;

    /* Start/stop. */
    pthread_mutex_t stop_mu;
    bool stop_done; /* under stop_mu */

    /* Timer-thread rounds begun and ended (tw__service_sync). */
    _Atomic uint64_t round_begin, round_end;

    /* Statistics. Runs are counted in late[] only (ran is their sum). */
    _Atomic uint64_t cancelled, handed, wakeups, nodes, mem;
    PAD(5);
    _Atomic uint64_t late[TW_LATE_BUCKETS];
};

/* Test hooks (internal.h): only in the test build of the library
 * (TW_TEST_HOOKS); the installed libraries have neither the variables nor
 * the calls. */
#ifdef TW_TEST_HOOKS
void (*tw__service_run_hook)(tw_service *s, tw_id job);
void (*tw__service_started_hook)(tw_service *s, tw_id id);
void (*tw__service_xpop_hook)(tw_service *s, tw_id id);
void (*tw__service_xdrop_hook)(tw_service *s, tw_id id);
#define TEST_HOOK(hook, ...)                                                   \
    do {                                                                       \
        if ((hook) != NULL)                                                    \
            (hook)(__VA_ARGS__);                                               \
    } while (0)
#else
#define TEST_HOOK(hook, ...) ((void)0)
#endif

/* The task this thread is running, for TW_EDEADLK checks. */
static _Thread_local struct {
    tw_service *s;
    tw_id id;
} tw_cur;

/* ------------------------------------------------------------------------ */
/* Clock and ticks. */

static uint64_t mono_ns(void)
{
    return tw__svc_clock_ns(CLOCK_MONOTONIC);
}

/* Nanoseconds since the service was created. A caller-supplied clock
 * that steps back (against its contract) is held at its latest reading,
 * for every thread: the service's time never goes back, so nothing is due
 * that the wheel has passed and the timer thread never spins on it. */
static uint64_t rel_ns(const tw_service *s)
{
    if (s->clock == NULL) {
        uint64_t now = tw__svc_clock_ns(s->clock_id);
        return now > s->start_ns ? now - s->start_ns : 0;
    }
    uint64_t now = s->clock(s->clock_ctx);
    now = now > s->start_ns ? now - s->start_ns : 0;
    _Atomic uint64_t *hi = &((tw_service *)s)->clock_hi;
    uint64_t h = atomic_load_explicit(hi, memory_order_relaxed);
    while (now > h &&
           !atomic_compare_exchange_weak_explicit(
               hi, &h, now, memory_order_relaxed, memory_order_relaxed)) {
    }
    return now > h ? now : h;
}

/* The first tick at or after @ns (relative), NEVER when @ns is. */
static uint64_t ceil_tick(const tw_service *s, uint64_t ns)
{
    if (ns == NEVER)
        return NEVER;
    return ns / s->tick_ns + (ns % s->tick_ns != 0);
}

/* @a + @b, or NEVER if that does not fit. */
static uint64_t add_sat(uint64_t a, uint64_t b)
{
    return b >= NEVER - a ? NEVER : a + b;
}

/* ------------------------------------------------------------------------ */
/* The node pool. */

static struct chunk_tail *chunk_tail_of(struct node *first)
{
    return (struct chunk_tail *)(void *)((char *)first +
                                         CHUNK_NODES * sizeof(struct node));
}

static struct node *node_at(const tw_service *s, uint32_t idx)
{
    struct dirblock *db = atomic_load_explicit(
        &((tw_service *)s)->dir[idx >> (CHUNK_BITS + DIR_BITS)],
        memory_order_acquire);
    struct node *c = atomic_load_explicit(
        &db->chunk[(idx >> CHUNK_BITS) & ((1u << DIR_BITS) - 1)],
        memory_order_acquire);
    return c + (idx & (CHUNK_NODES - 1));
}

static uint32_t node_index(const struct node *n)
{
    uintptr_t base = (uintptr_t)n & ~(CHUNK_ALIGN - 1);
    const struct chunk_tail *ct = chunk_tail_of((struct node *)(void *)base);
    uint32_t off = (uint32_t)(((uintptr_t)n - base) / sizeof(struct node));
    return ct->number << CHUNK_BITS | off;
}

static tw_id make_id(uint64_t st, uint32_t idx)
{
    return (st & ~UINT64_C(0xffffffff)) | (uint64_t)(idx + 1);
}

static uint64_t next_gen(uint64_t st)
{
    uint32_t g = ST_GEN(st) + 1;
    return (uint64_t)(g ? g : 1) << 32;
}

/*
 * Make sure the chunk holding node @idx exists. Lock-free: a thread that
 * loses the race to publish a new block frees its own. Returns 0 or
 * TW_ENOMEM (a published directory block stays for later growth).
 * Context: any thread.
 */
static int pool_ensure(tw_service *s, uint32_t idx)
{
    uint32_t d = idx >> (CHUNK_BITS + DIR_BITS);
    uint32_t c = (idx >> CHUNK_BITS) & ((1u << DIR_BITS) - 1);
    struct dirblock *db =
        atomic_load_explicit(&s->dir[d], memory_order_acquire);
    if (db == NULL) {
        struct dirblock *mine = tw__calloc(1, sizeof(*mine));
        if (mine == NULL)
            return TW_ENOMEM;
        if (atomic_compare_exchange_strong_explicit(&s->dir[d], &db, mine,
                                                    memory_order_acq_rel,
                                                    memory_order_acquire)) {
            atomic_fetch_add_explicit(&s->mem, sizeof(*mine),
                                      memory_order_relaxed);
            db = mine;
        } else {
            tw__free(mine);
        }
    }
    struct node *first =
        atomic_load_explicit(&db->chunk[c], memory_order_acquire);
    if (first != NULL)
        return 0;
    /* Aligned so that a node's address gives its chunk; only the bytes
     * used are requested and touched. Zeroed so that unused nodes have
     * generation 0, which no id carries. */
    /* Through the library's allocator, aligned by hand: CHUNK_ALIGN - 1
     * bytes more than needed, of which only the CHUNK_BYTES used are ever
     * touched (untouched pages cost no memory). */
    void *raw = tw__malloc(CHUNK_RAW_BYTES);
    if (raw == NULL)
        return TW_ENOMEM;
    uintptr_t at = ((uintptr_t)raw + CHUNK_ALIGN - 1) & ~(CHUNK_ALIGN - 1);
    struct node *mine = (struct node *)at;
    memset(mine, 0, CHUNK_BYTES);
    struct chunk_tail *ct = chunk_tail_of(mine);
    ct->raw = raw;
    ct->number = idx >> CHUNK_BITS;
    if (atomic_compare_exchange_strong_explicit(&db->chunk[c], &first, mine,
                                                memory_order_acq_rel,
                                                memory_order_acquire)) {
        /* Counted as used: the alignment slack is never touched. */
        atomic_fetch_add_explicit(&s->mem, CHUNK_BYTES, memory_order_relaxed);
        atomic_fetch_add_explicit(&s->nodes, CHUNK_NODES, memory_order_relaxed);
    } else {
        tw__free(raw);
    }
    return 0;
}

/*
 * Take a free node: from the free list, else a never-used one. On success
 * *@st is its state word (FREE, with the generation to use).
 */
static int node_alloc(tw_service *s, uint32_t *idx, uint64_t *st)
{
    uint64_t h = atomic_load_explicit(&s->free_head, memory_order_acquire);
    while ((uint32_t)h != 0) {
        uint32_t i = (uint32_t)h - 1;
        uint64_t nst =
            atomic_load_explicit(&node_at(s, i)->state, memory_order_relaxed);
        uint64_t nh =
            (h & ~UINT64_C(0xffffffff)) + (UINT64_C(1) << 32) + ST_PAY(nst);
        if (atomic_compare_exchange_weak_explicit(&s->free_head, &h, nh,
                                                  memory_order_acquire,
                                                  memory_order_acquire)) {
            *idx = i;
            /* Re-read: nst may be stale if the CAS raced a reuse; it
             * cannot be, since the tag changed on any reuse. */
            *st = nst;
            return 0;
        }
    }
    uint32_t f = atomic_load_explicit(&s->fresh, memory_order_relaxed);
    for (;;) {
        if (f >= MAX_NODES)
            return TW_ENOMEM;
        int rc = pool_ensure(s, f);
        if (rc != 0)
            return rc;
        if (atomic_compare_exchange_weak_explicit(&s->fresh, &f, f + 1,
                                                  memory_order_release,
                                                  memory_order_relaxed))
            break;
    }
    *idx = f;
    /* A first generation that differs between services, so that an id of
     * one service is unlikely to match a node of another. */
    uint32_t g = (s->salt ^ (f * UINT32_C(0x9E3779B1))) | 1;
    *st = (uint64_t)g << 32;
    return 0;
}

/* Push the chain @first..@last (linked through their payloads) on the free
 * list. @last's payload is overwritten. */
static void free_push(tw_service *s, struct node *first, struct node *last)
{
    uint64_t nh_low = (uint64_t)node_index(first) + 1;
    uint64_t lst = atomic_load_explicit(&last->state, memory_order_relaxed);
    uint64_t keep = lst & ~(ST_PAY_MASK << ST_PAY_SHIFT);
    uint64_t h = atomic_load_explicit(&s->free_head, memory_order_relaxed);
    do {
        atomic_store_explicit(&last->state,
                              keep | ((h & 0xffffffffu) << ST_PAY_SHIFT),
                              memory_order_relaxed);
    } while (!atomic_compare_exchange_weak_explicit(
        &s->free_head, &h,
        (h & ~UINT64_C(0xffffffff)) + (UINT64_C(1) << 32) + nh_low,
        memory_order_release, memory_order_relaxed));
}

/* Mark @n free (new generation) and free its side record. It is not on
 * the free list yet. */
static void node_retire(struct node *n, uint64_t next_link)
{
    uint64_t st = atomic_load_explicit(&n->state, memory_order_relaxed);
    if (st & ST_PERIODIC)
        tw__free(n->t.tw__arg);
    atomic_store_explicit(&n->state,
                          next_gen(st) | (next_link << ST_PAY_SHIFT) | LOC_FREE,
                          memory_order_release);
}

/* Free @n now. Context: any thread that owns @n. */
static void node_free(tw_service *s, struct node *n)
{
    node_retire(n, 0);
    free_push(s, n, n);
}

/* Free @n at the end of the timer thread's round (one CAS per round). */
static void node_free_batched(tw_service *s, struct node *n)
{
    uint64_t link = s->free_first ? (uint64_t)node_index(s->free_first) + 1 : 0;
    node_retire(n, link);
    if (s->free_first == NULL)
        s->free_last = n;
    s->free_first = n;
}

static void free_flush(tw_service *s)
{
    if (s->free_first != NULL) {
        free_push(s, s->free_first, s->free_last);
        s->free_first = s->free_last = NULL;
    }
}

/*
 * Move owned node @n to location @loc, clearing the bits @clear, unless it
 * was cancelled: then free it (batched: on the timer thread, at the end of
 * its round) and return false. *@was receives the state before the move.
 */
static bool move_or_free(tw_service *s, struct node *n, unsigned loc,
                         uint64_t clear, bool batched, uint64_t *was)
{
    uint64_t v = atomic_load(&n->state);
    do {
        if (v & ST_CANCELLED) {
            if (batched)
                node_free_batched(s, n);
            else
                node_free(s, n);
            atomic_fetch_add_explicit(&s->cancelled, 1, memory_order_relaxed);
            return false;
        }
    } while (!atomic_compare_exchange_weak(&n->state, &v,
                                           (v & ~(ST_LOC_MASK | clear)) | loc));
    *was = v;
    return true;
}

/* ------------------------------------------------------------------------ */
/* Cancel bits: a node cancelled while ARMED is marked here, leaf first,
 * then each summary level. The timer thread takes each level with an
 * exchange, top first, so a bit set at any time is seen in this round or
 * the next. A summary bit that is already set need not be set again: the
 * consumer clears it before it reads the level below (all seq_cst). */

static void or_bit(_Atomic uint64_t *w, unsigned bit)
{
    uint64_t m = UINT64_C(1) << bit;
    if (!(atomic_load(w) & m))
        atomic_fetch_or(w, m);
}

static void cancel_mark(tw_service *s, struct node *n, uint32_t idx)
{
    struct node *first = n - (idx & (CHUNK_NODES - 1));
    struct chunk_tail *ct = chunk_tail_of(first);
    unsigned off = idx & (CHUNK_NODES - 1);
    atomic_fetch_or(&ct->l0[off / 64], UINT64_C(1) << (off % 64));
    or_bit(&ct->l1, off / 64);
    uint32_t c = idx >> CHUNK_BITS;
    struct dirblock *db =
        atomic_load_explicit(&s->dir[c >> DIR_BITS], memory_order_acquire);
    unsigned ci = c & ((1u << DIR_BITS) - 1);
    or_bit(&db->dirty[ci / 64], ci % 64);
    or_bit(&s->cancel_dirty, c >> DIR_BITS);
}

/* Call @fn for every marked node, clearing the marks. */
static void cancel_drain(tw_service *s, void (*fn)(tw_service *, struct node *))
{
    uint64_t d = atomic_exchange(&s->cancel_dirty, 0);
    while (d) {
        unsigned b = (unsigned)__builtin_ctzll(d);
        d &= d - 1;
        struct dirblock *db =
            atomic_load_explicit(&s->dir[b], memory_order_acquire);
        for (unsigned w = 0; w < (1u << DIR_BITS) / 64; w++) {
            uint64_t cw = atomic_exchange(&db->dirty[w], 0);
            while (cw) {
                unsigned cb = (unsigned)__builtin_ctzll(cw);
                cw &= cw - 1;
                struct node *first = atomic_load_explicit(
                    &db->chunk[w * 64 + cb], memory_order_acquire);
                struct chunk_tail *ct = chunk_tail_of(first);
                uint64_t l1 = atomic_exchange(&ct->l1, 0);
                while (l1) {
                    unsigned lb = (unsigned)__builtin_ctzll(l1);
                    l1 &= l1 - 1;
                    uint64_t l0 = atomic_exchange(&ct->l0[lb], 0);
                    while (l0) {
                        unsigned nb = (unsigned)__builtin_ctzll(l0);
                        l0 &= l0 - 1;
                        fn(s, first + lb * 64 + nb);
                    }
                }
            }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Function table. */

static int fn_index(tw_service *s, tw_task_fn fn, uint32_t *out)
{
    uint64_t x = (uint64_t)(uintptr_t)fn * UINT64_C(0x9E3779B97F4A7C15);
    uint32_t h = (uint32_t)(x >> 40);
    for (uint32_t p = 0; p <= s->fn_mask; p++) {
        uint32_t slot = (h + p) & s->fn_mask;
        tw_task_fn cur =
            atomic_load_explicit(&s->fns[slot], memory_order_acquire);
        if (cur == NULL) {
            if (atomic_compare_exchange_strong_explicit(&s->fns[slot], &cur, fn,
                                                        memory_order_acq_rel,
                                                        memory_order_acquire) ||
                cur == fn) {
                *out = slot;
                return 0;
            }
        }
        if (cur == fn) {
            *out = slot;
            return 0;
        }
    }
    return TW_EAGAIN;
}

/* Look @fn up without taking an entry: 0 and *@out its entry, 1 if it is
 * not there but there is room, TW_EAGAIN if the table is full. */
static int fn_find(tw_service *s, tw_task_fn fn, uint32_t *out)
{
    uint64_t x = (uint64_t)(uintptr_t)fn * UINT64_C(0x9E3779B97F4A7C15);
    uint32_t h = (uint32_t)(x >> 40);
    for (uint32_t p = 0; p <= s->fn_mask; p++) {
        uint32_t slot = (h + p) & s->fn_mask;
        tw_task_fn cur =
            atomic_load_explicit(&s->fns[slot], memory_order_acquire);
        if (cur == NULL)
            return 1;
        if (cur == fn) {
            *out = slot;
            return 0;
        }
    }
    return TW_EAGAIN;
}

static tw_task_fn fn_at(const tw_service *s, uint64_t st)
{
    return atomic_load_explicit(&((tw_service *)s)->fns[ST_FN(st)],
                                memory_order_acquire);
}

/* ------------------------------------------------------------------------ */
/* Waking the timer thread. */

static void wake(tw_service *s)
{
    pthread_mutex_lock(&s->mu);
    s->kicked = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

/* After queueing work due at @tick: wake the thread if it sleeps past it. */
static void wake_for_tick(tw_service *s, uint64_t tick)
{
    uint64_t v = atomic_load(&s->sleep_until);
    while (tick < v) {
        if (atomic_compare_exchange_weak(&s->sleep_until, &v, 0)) {
            wake(s);
            return;
        }
    }
}

/* After a cancel: the memory must be released within a tick. */
static void wake_for_cancel(tw_service *s)
{
    if (atomic_load(&s->sleep_long) && atomic_exchange(&s->sleep_long, false))
        wake(s);
}

void tw__service_kick(tw_service *s)
{
    wake(s);
}

void tw__service_sync(tw_service *s)
{
    /* Rounds are numbered from 1; round r0 + 1 begins after this call. */
    uint64_t r0 = atomic_load(&s->round_begin);
    wake(s);
    while (
        (atomic_load(&s->round_end) < r0 + 1 || atomic_load(&s->busy) != 0) &&
        atomic_load(&s->started) && !atomic_load(&s->quit)) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

/* ------------------------------------------------------------------------ */
/* Pending count. */

static int pending_reserve(tw_service *s)
{
    uint64_t v = atomic_load_explicit(&s->pending, memory_order_relaxed);
    do {
        if (v & STOPPED_BIT)
            return TW_ESHUTDOWN;
        if (s->max_pending != 0 && v >= s->max_pending)
            return TW_EAGAIN;
    } while (!atomic_compare_exchange_weak_explicit(
        &s->pending, &v, v + 1, memory_order_relaxed, memory_order_relaxed));
    return 0;
}

static void pending_drop(tw_service *s)
{
    atomic_fetch_sub_explicit(&s->pending, 1, memory_order_relaxed);
}

/* ------------------------------------------------------------------------ */
/* Submission. */

static void subq_push(tw_service *s, struct node *n)
{
    struct node *h = atomic_load_explicit(&s->subq, memory_order_relaxed);
    do {
        n->t.tw__next = h != NULL ? &h->t : NULL;
    } while (!atomic_compare_exchange_weak_explicit(
        &s->subq, &h, n, memory_order_seq_cst, memory_order_relaxed));
}

static struct node *node_of_timer(tw_timer *t)
{
    return t ? TW_CONTAINER_OF(t, struct node, t) : NULL;
}

/* Re-queue periodic node @n (owned, RUNNING) for deadline @tick; frees it
 * instead if it was cancelled meanwhile. Context: not the timer thread. */
static void requeue(tw_service *s, struct node *n, uint64_t tick)
{
    uint64_t st;
    n->t.tw__expires = tick;
    if (!move_or_free(s, n, LOC_QUEUED, 0, false, &st))
        return; /* cancelled while running */
    subq_push(s, n);
    wake_for_tick(s, tick);
}

static void trampoline(tw_timer *t, void *arg);
static bool cancel_id(tw_service *s, tw_id id, bool drop);
static struct node *lookup(const tw_service *s, tw_id id, uint64_t *st);

enum sched_kind {
    KIND_ONCE,  /* one-shot */
    KIND_HOLD,  /* one-shot that keeps its pending slot while it runs */
    KIND_RATE,  /* fixed rate */
    KIND_DELAY, /* fixed delay */
};

/* Give back node @idx that node_alloc() returned with state @st. */
static void node_unalloc(tw_service *s, uint32_t idx, uint64_t st)
{
    struct node *n = node_at(s, idx);
    atomic_store_explicit(&n->state, (st & ~UINT64_C(0xffffffff)) | LOC_FREE,
                          memory_order_relaxed);
    free_push(s, n, n);
}

/*
 * A pending slot for a new task. With @replace (a task of
 * tw__schedule_replace(), which keeps its slot while it runs): take over
 * that task's slot, by cancelling it, or, if it is running, by releasing
 * the slot in its place; *@replaced says whether the cancel won. Else, or
 * when @replace is gone, a free slot. Returns 0, TW_EAGAIN or
 * TW_ESHUTDOWN; on failure nothing changed.
 */
static int take_slot(tw_service *s, tw_id replace, bool *replaced)
{
    if (replace != 0) {
        if (cancel_id(s, replace, false)) {
            if (replaced != NULL)
                *replaced = true;
            return 0;
        }
        uint64_t st;
        struct node *n = lookup(s, replace, &st);
        while (n != NULL && ST_GEN(st) == ST_GEN(replace) &&
               ST_LOC(st) == LOC_RUNNING &&
               (st & (ST_HOLD | ST_DROPPED | ST_PERIODIC)) == ST_HOLD) {
            if (atomic_compare_exchange_weak(&n->state, &st, st | ST_DROPPED))
                return 0; /* its run ends without releasing the slot */
        }
    }
    return pending_reserve(s);
}

/* The record of a periodic task, or NULL for a one-shot (@kind). */
static int periodic_new(enum sched_kind kind, void *arg, uint64_t period,
                        struct periodic **out)
{
    *out = NULL;
    if (kind == KIND_ONCE || kind == KIND_HOLD)
        return 0;
    struct periodic *rec = tw__malloc(sizeof(*rec));
    if (rec == NULL)
        return TW_ENOMEM;
    rec->arg = arg;
    rec->period_ns = period;
    rec->fixed_rate = kind == KIND_RATE;
    *out = rec;
    return 0;
}

/*
 * Schedule a task of @kind. @period: a periodic task's period; for a
 * one-shot task the width in ns of its window (0: exact; see
 * tw_schedule_window()). A non-zero @replace is a task to take over
 * (see take_slot()), only for KIND_HOLD.
 *
 * Order: everything that may fail and can be undone comes before the
 * pending slot, which is the last step: a call that fails holds no slot,
 * not even for a moment, so it never makes a concurrent valid call fail.
 * The function table is only read first; a new function takes its entry
 * after the slot (a call that max_pending rejects takes no entry), or,
 * when replacing, before it (the takeover cannot be undone). A call that
 * max_pending rejects does not grow the record pool (checked first).
 */
static int schedule(tw_service *s, tw_task_fn fn, void *arg, uint64_t delay,
                    uint64_t period, enum sched_kind kind, tw_id replace,
                    bool *replaced, tw_id *id)
{
    bool periodic = kind == KIND_RATE || kind == KIND_DELAY;
    if (s == NULL || fn == NULL || (periodic && period == 0))
        return TW_EINVAL;
    uint64_t p = atomic_load_explicit(&s->pending, memory_order_relaxed);
    if (p & STOPPED_BIT)
        return TW_ESHUTDOWN;
    if (s->max_pending != 0 && p >= s->max_pending && replace == 0)
        return TW_EAGAIN;
    uint32_t fidx = 0, idx = 0;
    int rc = fn_find(s, fn, &fidx);
    if (rc < 0)
        return rc;
    bool fn_new = rc == 1;
    struct periodic *rec = NULL;
    rc = periodic_new(kind, arg, period, &rec);
    if (rc != 0)
        return rc;
    uint64_t st = 0;
    bool have_node = (rc = node_alloc(s, &idx, &st)) == 0;
    /* The first call starts the service only once its memory is there. */
    if (rc == 0 && !atomic_load_explicit(&s->started, memory_order_acquire))
        rc = tw_service_start(s);
    if (rc == 0 && fn_new && replace != 0)
        rc = fn_index(s, fn, &fidx);
    if (rc == 0)
        rc = take_slot(s, replace, replaced);
    if (rc == 0 && fn_new && replace == 0 && (rc = fn_index(s, fn, &fidx)))
        pending_drop(s); /* the table filled up meanwhile */
    if (rc != 0) {
        if (have_node)
            node_unalloc(s, idx, st);
        tw__free(rec);
        return rc;
    }
    uint64_t flags = periodic ? ST_PERIODIC : kind == KIND_HOLD ? ST_HOLD : 0;
    if (rec != NULL)
        arg = rec;
    uint64_t width = rec == NULL ? period : 0;
    /* Lazy clock: the timer thread is awake or polling, so it takes the
     * request within about a tick and reads the clock then. */
    bool lazy = s->lazy && rec == NULL && width == 0 &&
                !atomic_load_explicit(&s->sleep_long, memory_order_relaxed) &&
                !atomic_load_explicit(&s->in_task, memory_order_relaxed);
    uint64_t tick = delay, last = delay;
    if (lazy) {
        flags |= ST_RELATIVE;
    } else {
        uint64_t due = add_sat(rel_ns(s), delay);
        if (rec != NULL)
            rec->next_ns = due;
        last = tick = ceil_tick(s, due);
        if (width != 0 && due != NEVER)
            tw__svc_window(s->tick_ns, due, width, &tick, &last);
    }
    struct node *n = node_at(s, idx);
    tw_timer_init(&n->t, trampoline, arg);
    n->t.tw__expires = tick;
    /* While QUEUED, tw__pprev carries the window's width in ticks (a
     * narrower window is still inside the caller's). */
    n->t.tw__pprev =
        (tw_timer **)(uintptr_t)(last - tick < UINTPTR_MAX ? last - tick
                                                           : UINTPTR_MAX);
    st = (st & ~UINT64_C(0xffffffff)) | ((uint64_t)fidx << ST_PAY_SHIFT) |
         flags | LOC_QUEUED;
    if (id != NULL)
        *id = make_id(st, idx);
    atomic_store_explicit(&n->state, st, memory_order_release);
    subq_push(s, n);
    if (lazy)
        wake_for_cancel(s); /* it went to sleep long meanwhile */
    else
        wake_for_tick(s, last); /* only if it sleeps past the window */
    return 0;
}

int tw_schedule(tw_service *s, tw_task_fn fn, void *arg, uint64_t delay_ns,
                tw_id *id)
{
    return schedule(s, fn, arg, delay_ns, s ? s->slack_ns : 0, KIND_ONCE, 0,
                    NULL, id);
}

int tw_schedule_window(tw_service *s, tw_task_fn fn, void *arg,
                       uint64_t earliest_ns, uint64_t latest_ns, tw_id *id)
{
    if (latest_ns < earliest_ns)
        return TW_EINVAL;
    return schedule(s, fn, arg, earliest_ns, latest_ns - earliest_ns, KIND_ONCE,
                    0, NULL, id);
}

int tw__schedule_replace(tw_service *s, tw_task_fn fn, void *arg,
                         uint64_t delay_ns, tw_id old, bool *old_cancelled,
                         tw_id *id)
{
    if (old_cancelled != NULL)
        *old_cancelled = false;
    return schedule(s, fn, arg, delay_ns, s ? s->slack_ns : 0, KIND_HOLD, old,
                    old_cancelled, id);
}

int tw_schedule_fixed_rate(tw_service *s, tw_task_fn fn, void *arg,
                           uint64_t initial_delay_ns, uint64_t period_ns,
                           tw_id *id)
{
    return schedule(s, fn, arg, initial_delay_ns, period_ns, KIND_RATE, 0, NULL,
                    id);
}

int tw_schedule_fixed_delay(tw_service *s, tw_task_fn fn, void *arg,
                            uint64_t initial_delay_ns, uint64_t delay_ns,
                            tw_id *id)
{
    return schedule(s, fn, arg, initial_delay_ns, delay_ns, KIND_DELAY, 0, NULL,
                    id);
}

/* ------------------------------------------------------------------------ */
/* Cancel. */

/* The node @id names, with its current state, or NULL. */
static struct node *lookup(const tw_service *s, tw_id id, uint64_t *st)
{
    uint32_t low = (uint32_t)id;
    if (s == NULL || low == 0 || ST_GEN(id) == 0 ||
        low > atomic_load_explicit(&((tw_service *)s)->fresh,
                                   memory_order_acquire))
        return NULL;
    struct node *n = node_at(s, low - 1);
    *st = atomic_load(&n->state);
    return n;
}

static void xq_drop_cancelled(tw_service *s, struct node *n, tw_id id);

/* Cancel task @id; true if this call did. @drop: release its pending slot
 * (false: a replacing schedule call takes it over). */
static bool cancel_id(tw_service *s, tw_id id, bool drop)
{
    uint64_t st;
    struct node *n = lookup(s, id, &st);
    if (n == NULL)
        return false;
    unsigned loc;
    do {
        if (ST_GEN(st) != ST_GEN(id) || (st & ST_CANCELLED))
            return false;
        loc = ST_LOC(st);
        if (loc == LOC_FREE || (loc == LOC_RUNNING && !(st & ST_PERIODIC)))
            return false;
    } while (!atomic_compare_exchange_weak(&n->state, &st, st | ST_CANCELLED));
    if (drop)
        pending_drop(s);
    if (loc == LOC_ARMED)
        cancel_mark(s, n, (uint32_t)id - 1);
    if (loc == LOC_ARMED || loc == LOC_QUEUED)
        wake_for_cancel(s);
    if (loc == LOC_DISPATCHED && s->nexec != 0)
        xq_drop_cancelled(s, n, id);
    return true;
}

bool tw_cancel(tw_service *s, tw_id id)
{
    return cancel_id(s, id, true);
}

/* Is task @id's function running (or about to)? */
static bool still_running(const tw_service *s, tw_id id)
{
    uint64_t st;
    struct node *n = lookup(s, id, &st);
    if (n == NULL || ST_GEN(st) != ST_GEN(id))
        return false;
    unsigned loc = ST_LOC(st);
    return loc == LOC_RUNNING ||
           (loc == LOC_DISPATCHED && !(st & ST_CANCELLED));
}

int tw_cancel_wait(tw_service *s, tw_id id)
{
    if (s == NULL)
        return TW_EINVAL;
    if (tw_cur.s == s && tw_cur.id == id && id != 0)
        return TW_EDEADLK;
    int r = tw_cancel(s, id) ? 1 : 0;
    if (!still_running(s, id))
        return r;
    atomic_fetch_add(&s->waiters, 1);
    pthread_mutex_lock(&s->wmu);
    while (still_running(s, id))
        pthread_cond_wait(&s->wcv, &s->wmu);
    pthread_mutex_unlock(&s->wmu);
    atomic_fetch_sub(&s->waiters, 1);
    return r;
}

/* After the run of a task ended (its state word changed): wake the
 * tw_cancel_wait() callers. The fence orders that state change (a release
 * store on some paths) before the load of `waiters`; the waiter increments
 * `waiters` before it reads the state, so one of the two sees the other.
 * Without it the load may pass the store (x86 store buffer) and a waiter
 * that read the old state sleeps forever. */
static void notify_waiters(tw_service *s)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&s->waiters) != 0) {
        pthread_mutex_lock(&s->wmu);
        pthread_cond_broadcast(&s->wcv);
        pthread_mutex_unlock(&s->wmu);
    }
}

uint64_t tw_service_pending(const tw_service *s)
{
    if (s == NULL)
        return 0;
    return atomic_load_explicit(&((tw_service *)s)->pending,
                                memory_order_relaxed) &
           ~STOPPED_BIT;
}

/* ------------------------------------------------------------------------ */
/* Running tasks. */

/* The next deadline (relative ns) of periodic task @rec after a run. */
static uint64_t periodic_next(const tw_service *s, struct periodic *rec)
{
    uint64_t now = rel_ns(s);
    if (!rec->fixed_rate)
        return add_sat(now, rec->period_ns);
    uint64_t next = add_sat(rec->next_ns, rec->period_ns);
    if (next != NEVER && next <= now) {
        /* Late by a period or more: skip the missed runs, no burst. */
        uint64_t k = (now - next) / rec->period_ns + 1;
        if (k > (NEVER - next) / rec->period_ns)
            next = NEVER;
        else
            next += k * rec->period_ns;
    }
    rec->next_ns = next;
    return next;
}

/* The end of the run of ST_HOLD node @n (state @running): release its
 * pending slot unless a replacing call took it over. */
static void hold_release(tw_service *s, struct node *n, uint64_t running)
{
    if (atomic_compare_exchange_strong(&n->state, &running,
                                       running | ST_DROPPED))
        pending_drop(s);
}

/* The clock (relative ns) at the start of a run. The timer thread reuses
 * its round's reading for the first task it runs after it (nothing ran in
 * between), which saves the clock read when a wake-up runs one task; with
 * TW_SERVICE_LAZY_CLOCK for every task of the round. */
static uint64_t run_start_ns(tw_service *s, bool timer_thread)
{
    if (timer_thread && (s->round_fresh || s->lazy)) {
        s->round_fresh = false;
        return s->round_ns;
    }
    return rel_ns(s);
}

/* Count a run that started at @start_ns, due at tick @due_tick, in the
 * lateness histogram (which is also the count of runs). */
static void late_count(tw_service *s, uint64_t start_ns, uint64_t due_tick)
{
    uint64_t due;
    if (__builtin_mul_overflow(due_tick, s->tick_ns, &due))
        due = UINT64_MAX; /* no division on this path: it runs per task */
    uint64_t late_us = start_ns > due ? (start_ns - due) / 1000u : 0;
    atomic_fetch_add_explicit(&s->late[tw__late_bucket(late_us)], 1,
                              memory_order_relaxed);
}

/*
 * Run owned node @n (location ARMED or DISPATCHED), or free it if it was
 * cancelled.
 * @inline_wheel: we are the timer thread inside tw_wheel_advance, and a
 * periodic task goes straight back into the wheel.
 */
static void run_node(tw_service *s, struct node *n, bool inline_wheel)
{
    uint64_t rst;
    if (!move_or_free(s, n, LOC_RUNNING, 0, inline_wheel, &rst)) {
        /* A cancelled job that tw_service_run() accepted was RUNNING for
         * a moment: a tw_cancel_wait() may have seen that and sleeps. */
        if (!inline_wheel)
            notify_waiters(s);
        return;
    }
    bool periodic = (rst & ST_PERIODIC) != 0;
    tw_id id = make_id(rst, node_index(n));
    TEST_HOOK(tw__service_started_hook, s, id);
    bool hold = (rst & ST_HOLD) != 0;
    if (!periodic && !hold)
        pending_drop(s);
    struct periodic *rec = periodic ? n->t.tw__arg : NULL;
    void *arg = periodic ? rec->arg : n->t.tw__arg;
    tw_task_fn fn = fn_at(s, rst);
    tw_service *saved_s = tw_cur.s;
    tw_id saved_id = tw_cur.id;
    tw_cur.s = s;
    tw_cur.id = id;
    uint64_t due_tick = n->t.tw__expires;
    uint64_t start = run_start_ns(s, inline_wheel);
    fn(id, arg);
    tw_cur.s = saved_s;
    tw_cur.id = saved_id;
    late_count(s, start, due_tick);
    if (hold)
        hold_release(s, n, (rst & ~ST_LOC_MASK) | LOC_RUNNING);
    if (!periodic) {
        if (inline_wheel)
            node_free_batched(s, n);
        else
            node_free(s, n);
    } else {
        uint64_t tick = ceil_tick(s, periodic_next(s, rec));
        if (!inline_wheel)
            requeue(s, n, tick);
        else if (move_or_free(s, n, LOC_ARMED, 0, true, &rst) && tick != NEVER)
            tw_wheel_add(s->wheel, &n->t, tick);
    }
    notify_waiters(s);
}

/* The wheel's callback for every node. Context: timer thread. */
static void trampoline(tw_timer *t, void *arg)
{
    (void)arg;
    struct node *n = node_of_timer(t);
    tw_service *s = tw_cur.s; /* the timer thread sets it for its life */
    if (s->execute == NULL && s->nexec == 0) {
        /* With the lazy clock: while a task runs here nobody takes the
         * submissions, so calls meanwhile read the clock themselves. */
        if (s->lazy)
            atomic_store_explicit(&s->in_task, true, memory_order_relaxed);
        run_node(s, n, true);
        if (s->lazy)
            atomic_store_explicit(&s->in_task, false, memory_order_relaxed);
        return;
    }
    uint64_t st;
    if (!move_or_free(s, n, LOC_DISPATCHED, 0, true, &st))
        return;
    atomic_fetch_add(&s->busy, 1);
    s->disp_count++;
    n->t.tw__next = NULL;
    if (s->disp_last != NULL)
        s->disp_last->t.tw__next = &n->t;
    else
        s->disp_first = n;
    s->disp_last = n;
}

/* Hand this round's due nodes to the executors. Context: timer thread. */
static void dispatch_flush(tw_service *s)
{
    struct node *first = s->disp_first;
    if (first == NULL)
        return;
    s->disp_first = s->disp_last = NULL;
    /* Counted before any executor can take one (and count it down). */
    atomic_fetch_add_explicit(&s->backlog, s->disp_count, memory_order_relaxed);
    s->disp_count = 0;
    if (s->execute != NULL) {
        while (first != NULL) {
            struct node *n = first;
            first = node_of_timer(n->t.tw__next);
            uint64_t st = atomic_load(&n->state);
            s->execute(s, make_id(st, node_index(n)), s->execute_ctx);
        }
        return;
    }
    /* The links are set under the lock: a cancel reads them there. */
    pthread_mutex_lock(&s->xmu);
    tw_timer **pp = s->xq_tailp;
    *pp = &first->t;
    for (tw_timer *t = &first->t; t != NULL; t = t->tw__next) {
        t->tw__pprev = pp;
        pp = &t->tw__next;
    }
    s->xq_tailp = pp;
    pthread_cond_signal(&s->xcv);
    pthread_mutex_unlock(&s->xmu);
}

/* Take node @n out of the executor queue. Context: under xmu. */
static void xq_unlink(tw_service *s, struct node *n)
{
    tw_timer *next = n->t.tw__next;
    *n->t.tw__pprev = next;
    if (next != NULL)
        next->tw__pprev = n->t.tw__pprev;
    else
        s->xq_tailp = n->t.tw__pprev;
    n->t.tw__pprev = NULL;
}

/*
 * After tw_cancel() won on node @n of task @id while it was DISPATCHED:
 * if it still waits in the executor queue, take it out and free it now
 * rather than when an executor gets to it (which may be long when every
 * executor runs a long task). Under xmu nothing else can take it; a node
 * not in the queue (being flushed) is freed by its owner. Executors leave
 * DISPATCHED under xmu, so a node seen DISPATCHED here is not freed
 * while we read its links.
 */
static void xq_drop_cancelled(tw_service *s, struct node *n, tw_id id)
{
    pthread_mutex_lock(&s->xmu);
    uint64_t st = atomic_load(&n->state);
    TEST_HOOK(tw__service_xdrop_hook, s, id);
    bool queued = ST_GEN(st) == ST_GEN(id) && ST_LOC(st) == LOC_DISPATCHED &&
                  n->t.tw__pprev != NULL;
    if (queued) {
        xq_unlink(s, n);
        atomic_fetch_sub_explicit(&s->backlog, 1, memory_order_relaxed);
    }
    pthread_mutex_unlock(&s->xmu);
    if (!queued)
        return;
    node_free(s, n);
    atomic_fetch_add_explicit(&s->cancelled, 1, memory_order_relaxed);
    atomic_fetch_sub(&s->busy, 1);
}

static void run_dispatched(tw_service *s, struct node *n)
{
    run_node(s, n, false);
    atomic_fetch_sub(&s->busy, 1);
}

void tw_service_run(tw_service *s, tw_id job)
{
    /* Only a caller-supplied executor receives jobs. On a pool service a
     * DISPATCHED node is linked in the pool's queue, which only the pool
     * may take it from. */
    if (s == NULL || s->execute == NULL)
        return;
    uint64_t st = 0;
    struct node *n = lookup(s, job, &st);
    if (n != NULL)
        TEST_HOOK(tw__service_run_hook, s, job);
    /* Accept the job once: a compare-and-swap out of DISPATCHED. A forged
     * id, a job already accepted (a repeated or concurrent call) or a
     * stale one (its node freed or reused) is ignored. */
    do {
        if (n == NULL || ST_GEN(st) != ST_GEN(job) ||
            ST_LOC(st) != LOC_DISPATCHED)
            return;
    } while (!atomic_compare_exchange_weak(&n->state, &st,
                                           (st & ~ST_LOC_MASK) | LOC_RUNNING));
    atomic_fetch_sub_explicit(&s->backlog, 1, memory_order_relaxed);
    run_dispatched(s, n);
}

static void *executor_main(void *p)
{
    tw_service *s = p;
    pthread_mutex_lock(&s->xmu);
    for (;;) {
        struct node *n = node_of_timer(s->xq_head);
        if (n == NULL) {
            if (s->xquit)
                break;
            pthread_cond_wait(&s->xcv, &s->xmu);
            continue;
        }
        xq_unlink(s, n);
        atomic_fetch_sub_explicit(&s->backlog, 1, memory_order_relaxed);
        TEST_HOOK(tw__service_xpop_hook, s,
                  make_id(atomic_load(&n->state), node_index(n)));
        if (s->xq_head != NULL)
            pthread_cond_signal(&s->xcv); /* more for another executor */
        /* Leave DISPATCHED under xmu, so that xq_drop_cancelled() never
         * reads a node that an executor may free (and a producer reuse)
         * meanwhile: under xmu, DISPATCHED means not taken. A node
         * cancelled while queued is freed here, still under xmu. */
        uint64_t st;
        if (!move_or_free(s, n, LOC_RUNNING, 0, false, &st)) {
            atomic_fetch_sub(&s->busy, 1);
            continue;
        }
        pthread_mutex_unlock(&s->xmu);
        run_dispatched(s, n);
        pthread_mutex_lock(&s->xmu);
    }
    pthread_mutex_unlock(&s->xmu);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* The timer thread. */

/*
 * A node from the submission stack. *@now is the relative time in ns read
 * after the node was taken from the stack (0 until first needed).
 * Context: the wheel's owner.
 */
static void take_submission(tw_service *s, struct node *n, uint64_t *now)
{
    uint64_t st;
    /* The window's width (see schedule()), not a link. */
    uint64_t span = (uintptr_t)n->t.tw__pprev;
    n->t.tw__pprev = NULL;
    if (!move_or_free(s, n, LOC_ARMED, ST_RELATIVE, true, &st))
        return;
    if (st & ST_RELATIVE) {
        if (*now == 0)
            *now = rel_ns(s) | 1; /* never 0; 1 ns later is harmless */
        n->t.tw__expires = ceil_tick(s, add_sat(*now, n->t.tw__expires));
    }
    uint64_t first = n->t.tw__expires;
    if (first != NEVER && span == 0)
        tw_wheel_add(s->wheel, &n->t, first);
    else if (first != NEVER)
        tw_wheel_add_window(s->wheel, &n->t, first, first + span);
}

/* A node marked in the cancel bitmap. Context: the wheel's owner. */
static void take_cancel(tw_service *s, struct node *n)
{
    uint64_t st = atomic_load(&n->state);
    if (ST_LOC(st) != LOC_ARMED || !(st & ST_CANCELLED))
        return; /* already freed (and maybe reused) by the wheel */
    tw_wheel_cancel(s->wheel, &n->t);
    node_free_batched(s, n);
    atomic_fetch_add_explicit(&s->cancelled, 1, memory_order_relaxed);
}

static void timer_sleep(tw_service *s, uint64_t target, uint64_t now)
{
    struct timespec ts;
    bool timed = false;
    if (target != NEVER && target <= NEVER / s->tick_ns) {
        uint64_t abs;
        if (s->clock == NULL && s->clock_id == CLOCK_MONOTONIC) {
            abs = add_sat(s->start_ns, target * s->tick_ns);
        } else {
            /* Another clock: wait for the time left on it, re-read after
             * at most TW__SVC_WAIT_CAP_NS on the built-in BOOTTIME. */
            uint64_t rel = rel_ns(s), want = target * s->tick_ns;
            uint64_t left = want > rel ? want - rel : 0;
            if (s->clock == NULL)
                left = tw__svc_wait_ns(s->clock_id, left);
            abs = add_sat(mono_ns(), left);
        }
        if (abs / 1000000000u < (uint64_t)INT32_MAX) {
            ts.tv_sec = (time_t)(abs / 1000000000u);
            ts.tv_nsec = (long)(abs % 1000000000u);
            timed = true;
        }
    }
    pthread_mutex_lock(&s->mu);
    atomic_store(&s->sleep_until, target);
    atomic_store(&s->sleep_long, target > now + 1);
    if (!s->kicked && !atomic_load(&s->quit) && atomic_load(&s->subq) == NULL &&
        atomic_load(&s->cancel_dirty) == 0) {
        if (timed)
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        else
            pthread_cond_wait(&s->cv, &s->mu);
        atomic_fetch_add_explicit(&s->wakeups, 1, memory_order_relaxed);
    }
    s->kicked = false;
    atomic_store(&s->sleep_until, 0);
    atomic_store(&s->sleep_long, false);
    pthread_mutex_unlock(&s->mu);
}

static void *timer_main(void *p)
{
    tw_service *s = p;
    tw_cur.s = s;
    tw_cur.id = 0;
    while (!atomic_load(&s->quit)) {
        bool active = false;
        uint64_t taken_at = 0;
        atomic_fetch_add(&s->round_begin, 1);
        if (s->local == NULL)
            s->local = atomic_exchange(&s->subq, NULL);
        for (unsigned i = 0; s->local != NULL && i < DRAIN_BATCH; i++) {
            struct node *n = s->local;
            s->local = node_of_timer(n->t.tw__next);
            take_submission(s, n, &taken_at);
            active = true;
        }
        if (atomic_load(&s->cancel_dirty) != 0) {
            cancel_drain(s, take_cancel);
            active = true;
        }
        s->round_ns = rel_ns(s);
        s->round_fresh = true;
        uint64_t now = s->round_ns / s->tick_ns;
        tw_wheel_advance(s->wheel, now);
        dispatch_flush(s);
        free_flush(s);
        atomic_fetch_add(&s->round_end, 1);
        if (s->local != NULL || atomic_load(&s->subq) != NULL ||
            atomic_load(&s->cancel_dirty) != 0)
            continue;
        uint64_t next = tw_wheel_next_expiry(s->wheel);
        if (next <= now)
            continue;
        if (active && next > now + 1)
            next = now + 1; /* poll once more before sleeping long */
        timer_sleep(s, next, now);
    }
    free_flush(s);
    tw_cur.s = NULL;
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Create, start, stop, destroy. */

static int cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0)
        return TW_ENOMEM;
    int rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
    return rc == 0 ? 0 : TW_ENOMEM;
}

/* The service's mutexes and condition variables. */
enum { N_MUTEX = 4, N_COND = 3 };
struct syncs {
    pthread_mutex_t *mu[N_MUTEX];
    pthread_cond_t *cv[N_COND];
};

static struct syncs syncs_of(tw_service *s)
{
    return (struct syncs){{&s->mu, &s->xmu, &s->wmu, &s->stop_mu},
                          {&s->cv, &s->xcv, &s->wcv}};
}

/* Destroy the first @nm mutexes and @nc condition variables. */
static void sync_destroy(tw_service *s, unsigned nm, unsigned nc)
{
    struct syncs y = syncs_of(s);
    while (nc > 0)
        pthread_cond_destroy(y.cv[--nc]);
    while (nm > 0)
        pthread_mutex_destroy(y.mu[--nm]);
}

/* All on CLOCK_MONOTONIC. Returns 0 or TW_ENOMEM with nothing left. */
static int sync_init(tw_service *s)
{
    struct syncs y = syncs_of(s);
    unsigned nm = 0, nc = 0;
    while (nm < N_MUTEX && pthread_mutex_init(y.mu[nm], NULL) == 0)
        nm++;
    while (nm == N_MUTEX && nc < N_COND && cond_init_mono(y.cv[nc]) == 0)
        nc++;
    if (nm == N_MUTEX && nc == N_COND)
        return 0;
    sync_destroy(s, nm, nc);
    return TW_ENOMEM;
}

int tw_service_create_sized(tw_service **out, const tw_service_config *cfg,
                            size_t cfg_size)
{
    tw_service_config c;
    if (cfg == NULL)
        return (tw_service_create)(out, NULL);
    int rc = tw__config_copy(&c, sizeof c, cfg, cfg_size);
    return rc != 0 ? rc : (tw_service_create)(out, &c);
}

int(tw_service_create)(tw_service **out, const tw_service_config *cfg)
{
    static const tw_service_config defaults = {0};
    static _Atomic uint32_t serial;
    if (out == NULL)
        return TW_EINVAL;
    if (cfg == NULL)
        cfg = &defaults;
    uint64_t tick = cfg->tick_ns ? cfg->tick_ns : UINT64_C(1000000);
    uint64_t slots = cfg->ticks_per_wheel ? cfg->ticks_per_wheel : 512;
    uint64_t maxfn = cfg->max_callbacks ? cfg->max_callbacks : 1024;
    clockid_t clock_id;
    if (tw__svc_clock_id(cfg->clock_id, &clock_id) != 0 ||
        (cfg->clock != NULL && cfg->clock_id != 0))
        return TW_EINVAL;
    if (tick < TICK_MIN_NS || tick > TICK_MAX_NS ||
        slots > (UINT64_C(1) << 30) || cfg->levels > 64 ||
        cfg->executor_threads > 1024 || maxfn > (UINT64_C(1) << 24) ||
        (cfg->flags & ~TW_SERVICE_LAZY_CLOCK) != 0 ||
        (cfg->execute != NULL && cfg->executor_threads != 0))
        return TW_EINVAL;
    uint64_t p2 = 1;
    while (p2 < slots)
        p2 <<= 1;
    slots = p2;
    /* One revolution of the first level must fit in 64 bits of ns. */
    if (slots > UINT64_MAX / tick)
        return TW_EINVAL;
    p2 = 1;
    while (p2 < maxfn)
        p2 <<= 1;

    tw_service *s = tw__calloc(1, sizeof(*s));
    if (s == NULL)
        return TW_ENOMEM;
    s->fns = tw__calloc((size_t)p2, sizeof(*s->fns));
    if (cfg->executor_threads != 0)
        s->xthreads = tw__calloc(cfg->executor_threads, sizeof(pthread_t));
    s->wcfg.slots = (uint32_t)slots;
    s->wcfg.levels = cfg->levels;
    int rc = TW_ENOMEM;
    if (s->fns == NULL || (cfg->executor_threads != 0 && s->xthreads == NULL))
        goto fail_mem;
    rc = tw_wheel_create(&s->wheel, &s->wcfg, 0);
    if (rc != 0)
        goto fail_mem;
    rc = sync_init(s);
    if (rc != 0) {
        tw_wheel_destroy(s->wheel);
        goto fail_mem;
    }
    s->tick_ns = tick;
    s->max_pending = cfg->max_pending;
    s->clock = cfg->clock;
    s->clock_ctx = cfg->clock_ctx;
    s->clock_id = clock_id;
    s->slack_ns = cfg->slack_ns;
    s->execute = cfg->execute;
    s->execute_ctx = cfg->execute_ctx;
    s->nexec = cfg->executor_threads;
    s->fn_mask = (uint32_t)p2 - 1;
    s->lazy = (cfg->flags & TW_SERVICE_LAZY_CLOCK) != 0;
    s->xq_tailp = &s->xq_head;
    uint32_t sn = atomic_fetch_add(&serial, 1) + 1;
    s->salt = sn * UINT32_C(0x85EBCA6B) ^ (uint32_t)(uintptr_t)s;
    s->start_ns =
        s->clock ? s->clock(s->clock_ctx) : tw__svc_clock_ns(s->clock_id);
    atomic_store(&s->mem, sizeof(*s) + p2 * sizeof(*s->fns));
    *out = s;
    return 0;

fail_mem:
    tw__free(s->xthreads);
    tw__free((void *)s->fns);
    tw__free(s);
    return rc;
}

/* Stop and join the first @nexec executors and, if @timer, the timer
 * thread. */
static void join_threads(tw_service *s, uint32_t nexec, bool timer)
{
    if (timer) {
        atomic_store(&s->quit, true);
        wake(s);
        pthread_join(s->thread, NULL);
    }
    pthread_mutex_lock(&s->xmu);
    s->xquit = true;
    pthread_cond_broadcast(&s->xcv);
    pthread_mutex_unlock(&s->xmu);
    for (uint32_t i = 0; i < nexec; i++)
        pthread_join(s->xthreads[i], NULL);
}

int tw_service_start(tw_service *s)
{
    if (s == NULL)
        return TW_EINVAL;
    /* Checked before the lock too: stop holds it while it hands tasks
     * back, and its callback may call us. */
    if (atomic_load(&s->pending) & STOPPED_BIT)
        return TW_ESHUTDOWN;
    /* Started: a no-op, and without the lock. A task calling us must not
     * wait for a stop that has taken the lock and waits for the task. */
    if (atomic_load_explicit(&s->started, memory_order_acquire))
        return 0;
    pthread_mutex_lock(&s->stop_mu);
    int rc = 0;
    if (atomic_load(&s->pending) & STOPPED_BIT)
        rc = TW_ESHUTDOWN;
    if (rc != 0 || atomic_load(&s->started))
        goto out;
    uint32_t i;
    for (i = 0; i < s->nexec; i++) {
        rc = pthread_create(&s->xthreads[i], NULL, executor_main, s);
        if (rc != 0)
            break;
    }
    if (rc == 0) {
        rc = pthread_create(&s->thread, NULL, timer_main, s);
        if (rc == 0) {
            atomic_store_explicit(&s->started, true, memory_order_release);
            goto out;
        }
    }
    join_threads(s, i, false);
    s->xquit = false;
    rc = rc == ENOMEM ? TW_ENOMEM : TW_EAGAIN;
out:
    pthread_mutex_unlock(&s->stop_mu);
    return rc;
}

/* Hand node @n (claimed: cancelled bit set by us) back, then free it. */
static int hand_back(tw_service *s, struct node *n, uint64_t st,
                     tw_unprocessed_fn fn, void *ctx)
{
    pending_drop(s);
    if (fn != NULL) {
        void *arg = n->t.tw__arg;
        if (st & ST_PERIODIC)
            arg = ((struct periodic *)arg)->arg;
        fn(make_id(st, node_index(n)), fn_at(s, st), arg, ctx);
    }
    node_free(s, n);
    atomic_fetch_add_explicit(&s->handed, 1, memory_order_relaxed);
    return 1;
}

/* Claim owned node @n for stop: 1 if we won (st updated), 0 if a cancel
 * had won (then free it). */
static int claim(tw_service *s, struct node *n, uint64_t *st)
{
    uint64_t v = atomic_load(&n->state);
    do {
        if (v & ST_CANCELLED) {
            node_free(s, n);
            atomic_fetch_add_explicit(&s->cancelled, 1, memory_order_relaxed);
            return 0;
        }
    } while (!atomic_compare_exchange_weak(&n->state, &v, v | ST_CANCELLED));
    *st = v;
    return 1;
}

static void ignore_cancel(tw_service *s, struct node *n)
{
    (void)s;
    (void)n;
}

int tw_service_stop(tw_service *s, tw_unprocessed_fn fn, void *ctx)
{
    if (s == NULL)
        return TW_EINVAL;
    if (tw_cur.s == s)
        return TW_EDEADLK;
    pthread_mutex_lock(&s->stop_mu);
    if (s->stop_done) {
        pthread_mutex_unlock(&s->stop_mu);
        return 0;
    }
    atomic_fetch_or(&s->pending, STOPPED_BIT);
    if (atomic_load(&s->started)) {
        join_threads(s, s->nexec, true); /* executors finish due tasks */
        /* A caller-supplied executor: wait for the jobs it holds. */
        while (atomic_load(&s->busy) != 0) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
    uint64_t handed = 0;
    /* While @fn runs, this thread counts as one of the service's: a stop
     * from the callback returns TW_EDEADLK. */
    tw_service *saved_s = tw_cur.s;
    tw_cur.s = s;
    /* Everything in the wheel, cancelled or not; nodes beyond fresh were
     * never used. */
    uint32_t fresh = atomic_load(&s->fresh);
    for (uint32_t i = 0; i < fresh; i++) {
        struct node *n = node_at(s, i);
        uint64_t st = atomic_load(&n->state);
        if (ST_LOC(st) != LOC_ARMED)
            continue;
        tw_wheel_cancel(s->wheel, &n->t);
        if (claim(s, n, &st))
            handed += (uint64_t)hand_back(s, n, st, fn, ctx);
    }
    /* Marks of nodes freed above are stale. */
    cancel_drain(s, ignore_cancel);
    /* The submission stack, until every accepted task is accounted for:
     * a producer may still be between its reservation and its push. */
    for (;;) {
        while (s->local != NULL) {
            struct node *n = s->local;
            s->local = node_of_timer(n->t.tw__next);
            uint64_t st;
            if (claim(s, n, &st))
                handed += (uint64_t)hand_back(s, n, st, fn, ctx);
        }
        s->local = atomic_exchange(&s->subq, NULL);
        if (s->local == NULL) {
            if (tw_service_pending(s) == 0)
                break;
            sched_yield();
        }
    }
    tw_cur.s = saved_s;
    s->stop_done = true;
    pthread_mutex_unlock(&s->stop_mu);
    return handed > INT_MAX ? INT_MAX : (int)handed;
}

void tw_service_destroy(tw_service *s)
{
    if (s == NULL)
        return;
    tw_service_stop(s, NULL, NULL);
    for (unsigned d = 0; d < DIR_BLOCKS; d++) {
        struct dirblock *db = atomic_load(&s->dir[d]);
        if (db == NULL)
            continue;
        for (unsigned c = 0; c < (1u << DIR_BITS); c++) {
            struct node *first = atomic_load(&db->chunk[c]);
            if (first != NULL)
                tw__free(chunk_tail_of(first)->raw);
        }
        tw__free(db);
    }
    sync_destroy(s, N_MUTEX, N_COND);
    tw_wheel_destroy(s->wheel);
    tw__free(s->xthreads);
    tw__free((void *)s->fns);
    tw__free(s);
}

int tw_service_get_stats_sized(const tw_service *s, tw_service_stats *out,
                               size_t out_size)
{
    if (s == NULL || out == NULL ||
        out_size < offsetof(tw_service_stats, backlog))
        return TW_EINVAL;
    tw_service *m = (tw_service *)s;
    tw_service_stats st = {0};
    st.pending = tw_service_pending(s);
    for (unsigned i = 0; i < TW_LATE_BUCKETS; i++) {
        st.late_hist[i] =
            atomic_load_explicit(&m->late[i], memory_order_relaxed);
        st.ran += st.late_hist[i];
    }
    st.cancelled = atomic_load_explicit(&m->cancelled, memory_order_relaxed);
    st.handed_back = atomic_load_explicit(&m->handed, memory_order_relaxed);
    st.wakeups = atomic_load_explicit(&m->wakeups, memory_order_relaxed);
    st.nodes = atomic_load_explicit(&m->nodes, memory_order_relaxed);
    st.memory_bytes = atomic_load_explicit(&m->mem, memory_order_relaxed);
    st.backlog = atomic_load_explicit(&m->backlog, memory_order_relaxed);
    tw__svc_stats_out(out, out_size, &st);
    return 0;
}

void(tw_service_get_stats)(const tw_service *s, tw_service_stats *out)
{
    (void)tw_service_get_stats_sized(s, out,
                                     offsetof(tw_service_stats, backlog));
}

uint32_t tw__service_waiters(tw_service *s)
{
    return atomic_load(&s->waiters);
}

size_t tw__service_node_size(void)
{
    return sizeof(struct node);
}
