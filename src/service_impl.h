/* SPDX-License-Identifier: MIT */
/*
 * src/service_impl.h - the timer service's state, the meaning of its
 * records' state words, and the inline helpers its files share (the
 * src/service*.c files, listed at the top of src/service.c; the records
 * themselves are the node pool's, src/node_pool.h; src/exec_pool.c sees
 * none of it).
 *
 * Pipeline
 * --------
 * A task flows through the service in one direction:
 *
 *   producer (tw_schedule*)                     service_submit.c, service.c
 *     | takes a record from the node pool                   node_pool.[ch]
 *     v puts it in its ring (exact one-shot) or pushes it on a
 *     | submission stack (lock-free)                    service_ring.[ch]
 *   timer thread: takes the rings' new slots and the stacks
 *     | whole, the cancel bitmap too                     service_loop.c
 *     v arms the record in its tw_wheel                     wheel.c
 *   wheel: at the deadline calls the trampoline (dispatch) service_run.c
 *     v runs the task there, or hands it to an executor
 *   executor pool (or the caller's executor)               exec_pool.[ch]
 *     v runs the task; a periodic task goes back on the stack
 *   the record returns to the node pool's free list        node_pool.[ch]
 *
 * Cancels go against the flow: tw_cancel() only sets a bit in the record's
 * state word (and, for a record in the wheel, a bit in the cancel bitmap);
 * whoever owns the record at that moment sees the bit and frees it. A
 * task still in a ring slot is cancelled in the slot instead (RS_* below);
 * the ring's owner takes the record back at once.
 *
 * A ring slot outranks the state word while the task is in it: the node
 * reads LOC_RING, and the consumer's compare-and-swap of the slot
 * (RS_QUEUED to RS_TAKEN) hands the decision to the state word. So a cancel
 * wins either in the slot (before the take) or in the state word (after
 * it), never in both.
 *
 * Locks
 * -----
 * Producers and cancels take no lock in the common case. The mutexes, in
 * the order they may be taken:
 *
 *   life.stop_mu   start/stop; held while stop hands tasks back, so a
 *                  hand-back callback may take any of the ones below
 *   timer.mu       the timer thread's sleep and wake-ups (with timer.cv)
 *   exec.mu        the executor pool's queue (with exec.cv)
 *   wait.mu        tw_cancel_wait() sleepers (with wait.cv)
 *
 * timer.mu, exec.mu and wait.mu are leaves: nobody holds two of them, and
 * no task or callback of the caller runs under any of them.
 *
 * The state word
 * --------------
 * Task records ("nodes", 40 bytes on LP64) come from the node pool
 * (src/node_pool.h): a node is a tw_timer whose function pointer is one
 * atomic 64-bit state word, whose generation and free-list link are the
 * pool's and the rest the service's:
 *
 *   bits 63..32  generation (the pool's: never 0; bumped each time the
 *                node is freed)
 *   bits 31..5   payload: while the node is live, the index of the task
 *                function in the service's function table (bits 28..5),
 *                ST_HOLD and ST_DROPPED (bits 29, 30: a one-shot task that
 *                keeps its pending slot while it runs, and whether that
 *                slot was released or taken over) and ST_RELATIVE (bit
 *                31, see below); while it is on the free list, the pool's
 *                link (POOL_INDEX_BITS bits at POOL_LINK_SHIFT)
 *   bit  4       periodic (tw__arg points at a side record)
 *   bit  3       cancelled (or claimed by stop)
 *   bits 2..0    location: FREE, QUEUED, ARMED, DISPATCHED, RUNNING,
 *                RING
 *
 * A tw_id is generation << 32 | (index + 1), so a stale id never matches a
 * reused node. The location says who owns the node's links; only the owner
 * changes the location, and everybody else may only set the cancelled bit
 * by CAS. The owner that sees the cancelled bit frees the node:
 *
 *   FREE       -> QUEUED      a producer's schedule call
 *   FREE       -> RING        a producer's exact one-shot schedule call
 *   RING       -> QUEUED      the consumer takes the ring slot
 *   RING       -> FREE        the ring's owner cancelled it in the slot
 *   QUEUED     -> ARMED       the timer thread takes the stack
 *   ARMED      -> DISPATCHED  due, for an executor (timer thread)
 *   ARMED      -> RUNNING     due, run on the timer thread itself
 *   DISPATCHED -> RUNNING     an executor accepts it (once: a CAS)
 *   RUNNING    -> FREE        a one-shot task's run ended
 *   RUNNING    -> QUEUED      a periodic task's run ended on an executor
 *   RUNNING    -> ARMED       a periodic task's run ended on the timer thread
 *   (cancelled)-> FREE        whoever owns the node next sees the bit
 *
 *   QUEUED      on the submission stack (tw__next is the link, tw__expires
 *               the deadline tick, or with ST_RELATIVE the delay in ns
 *               that the timer thread adds to its clock when it takes the
 *               node: TW_SERVICE_LAZY_CLOCK; tw__pprev is no link but
 *               the width in ticks of the task's window, 0 for an exact
 *               deadline, or QUEUED_NS: tw__expires is the exact
 *               deadline in ns, relative, whose tick the timer thread
 *               works out); owner: the timer thread
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
 *   RING        in a producer's ring (an exact one-shot task not yet
 *               taken): the payload is the slot's place, tw__next the
 *               function's entry; the slot decides until the consumer
 *               takes it, and the consumer then moves it to QUEUED
 *               (keeping a cancelled bit a cancel set after the take)
 *
 * tw_service_stop() joins the threads, becomes the owner of everything and
 * claims each live node by setting its cancelled bit, so a racing
 * tw_cancel() and the hand-back can never both win.
 *
 * Producers (tw_schedule) never lock. A thread with a producer of its own
 * (struct prod below) takes a node from its magazine, adds one to its own
 * pending count and puts the node in its ring (an exact one-shot task
 * while the ring has room) or pushes it on its own Treiber stack; other
 * calls
 * pop a node from the shared free list (a Treiber stack of batches, head
 * tagged against ABA), reserve a pending slot in the shared count with one
 * atomic operation as the call's last fallible step (so a failing call
 * never holds one), and push the node on the shared stack. The timer
 * thread takes each stack whole with one exchange, the shared one first. The
 * timer thread publishes the tick it sleeps until; a producer wakes it (mutex +
 * condition variable on CLOCK_MONOTONIC) only when its deadline is earlier, so
 * scheduling work for later costs no system call. After a round with work the
 * timer thread sleeps until the next tick, even if more work has come (it
 * takes that then, in one batch), instead of sleeping long, so a burst of
 * cancels needs at most one wake-up and a stream of requests one round per
 * tick; when idle it sleeps without timeout.
 *
 * Task functions are stored as indexes into a small lock-free open-
 * addressing table (per service, max_callbacks entries): this is what keeps
 * a node at 40 bytes, since the index fits in the state word that takes the
 * place of the tw_timer's own callback (the wheel calls the service's
 * trampoline for every timer). The trampoline finds the service through
 * the node's chunk, which records its owner.
 */
#ifndef TWHEEL_SERVICE_IMPL_H
#define TWHEEL_SERVICE_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "exec_pool.h"
#include "node_pool.h"
#include "service_clock.h"
#include "service_internal.h"
#include "twheel/service.h"

/* ------------------------------------------------------------------------ */
/* The state word. */

enum {
    LOC_FREE = 0,
    LOC_QUEUED,
    LOC_ARMED,
    LOC_DISPATCHED,
    LOC_RUNNING,
    LOC_RING /* in a producer's ring; the payload is its slot (RING_*) */
};

#define ST_LOC_MASK UINT64_C(7)
#define ST_CANCELLED UINT64_C(8)
#define ST_PERIODIC UINT64_C(16)
#define ST_PAY_SHIFT POOL_LINK_SHIFT
#define ST_PAY_MASK POOL_LINK_MASK
#define ST_GEN(st) POOL_GEN(st)
/* The pool frees a node with its low half 0, and links free nodes through
 * the payload: the flags below it read FREE then. */
_Static_assert(LOC_FREE == 0, "a node the pool frees is FREE");
_Static_assert((ST_LOC_MASK | ST_CANCELLED | ST_PERIODIC) <
                   (UINT64_C(1) << POOL_LINK_SHIFT),
               "the pool's link leaves the flags alone");
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

/* ------------------------------------------------------------------------ */
/* The service. */

/* Task functions: a lock-free open-addressing table of max_callbacks
 * entries (a power of two); a live node's state word holds its function's
 * index (ST_FN()). */
struct fn_table {
    _Atomic(tw_task_fn) *fns;
    uint32_t mask;
};

struct tw__tsc; /* src/service_clock.h */

/*
 * A producer: the state of one thread that schedules or cancels on one
 * service without max_pending (up to MAX_PRODS of them; other threads, and
 * every thread of a service with max_pending, take the shared paths). The
 * thread that owns it finds it through a thread-local cache
 * (src/service_prod.h).
 *   - subq: its own submission stack, which only it and the timer thread
 *     (or stop) touch, instead of the shared one;
 *   - added, dropped: the tasks it reserved, and those its cancels (or
 *     refused calls) released; both only grow, written by the owner only
 *     (the pending count is a sum, see tw_service_pending());
 *   - a magazine of free nodes (a batch popped from the free list, or a
 *     range of never-used ones) that only the owner takes from.
 * A producer outlives its thread: when the thread exits (or evicts it from
 * its cache) it is released, and another thread may own it next, with its
 * counts and its magazine. Freed with the service.
 */
#define MAX_PRODS 64u

/*
 * A producer's ring: where its exact one-shot calls go (publish_exact())
 * while it has room, its own stack (subq) taking the rest. A slot is one
 * word, the task's id with an RS_* state in the top bits of its low half
 * (above the index + 1), eight to a cache line, and it carries the
 * cancel of the task in it:
 *
 *   RS_QUEUED     written by the owner, then published by moving tail
 *   RS_TAKEN      the consumer (timer thread, or stop) took the node: from
 *                 then on the node's state word decides, as for a node
 *                 from a stack
 *   RS_DONE       cancelled by the owner before the consumer took it: the
 *                 node went straight back to the owner's magazine, never
 *                 read by the consumer (so a schedule+cancel pair keeps
 *                 its record in the producer's cache)
 *   RS_CANCELLED  cancelled by another thread: the consumer frees the node
 *   RS_WITHDRAWN  the owner's call failed after publishing (stop began)
 *
 * Only the owner writes RS_QUEUED slots and tail, only the consumer moves
 * head; a slot below head is the owner's again. The node of a RS_QUEUED
 * slot reads LOC_RING with the slot's place (producer index << RING_BITS
 * | position) as its payload, so that tw_cancel() finds the slot from the
 * id; its tw__next holds the function's entry, which the consumer moves
 * into the state word when it takes the node.
 */
#define RING_BITS 16
#define RING_SLOTS (1u << RING_BITS) /* the most a ring grows to */
#define RING_MASK (RING_SLOTS - 1u)  /* a place's position, in any ring */
#define RING_MIN_BITS 10
#define RING_GROWS (RING_BITS - RING_MIN_BITS)

/*
 * A ring: its slots, then one byte per slot (ring_done()). A producer's
 * ring starts with 2^RING_MIN_BITS slots (9 KiB) and doubles, up to
 * RING_SLOTS (576 KiB), each time it was found full, at the first call
 * that finds it empty after that (tw__svc_ring_grow()): the consumer has
 * then taken every slot, so no slot of the old ring is read again by the
 * owner or the consumer. A cancel from another thread may still be
 * looking at the old ring (it read the producer's ring just before the
 * switch); that ring stays until the service is destroyed (at most
 * RING_GROWS of them, less memory than the last ring), and a slot of it
 * then only says RS_TAKEN or another task's id.
 */
struct ring {
    uint32_t mask; /* slots - 1 */
    _Atomic uint64_t slot[];
};

/* The size of a ring of @mask + 1 slots, in bytes. */
static inline size_t ring_bytes(uint32_t mask)
{
    return sizeof(struct ring) + ((size_t)mask + 1) * (sizeof(uint64_t) + 1);
}

#define RS_SHIFT 29
#define RS_MASK (UINT64_C(7) << RS_SHIFT)
enum { RS_QUEUED = 1, RS_TAKEN, RS_DONE, RS_CANCELLED, RS_WITHDRAWN };
_Static_assert(POOL_INDEX_BITS <= RS_SHIFT, "an id's low half fits below");

/* The slot word of task @id in state @rs (RS_*): the id is the word, so
 * that the calls that have the id (the schedule that made it, a cancel)
 * make the word with one instruction. */
static inline uint64_t rs_word(tw_id id, unsigned rs)
{
    return id | (uint64_t)rs << RS_SHIFT;
}

/* A slot word's state (RS_*) and the id of its task. */
static inline unsigned rs_state(uint64_t v)
{
    return (unsigned)(v >> RS_SHIFT) & 7u;
}

static inline tw_id rs_id(uint64_t v)
{
    return v & ~RS_MASK;
}

_Static_assert(((MAX_PRODS - 1u) << RING_BITS | RING_MASK) < (1u << 24),
               "a ring place fits the payload beside the flags above it");

/*
 * A slot's byte, after the ring's slots: 1 once the owner has cancelled
 * the slot's task (RS_DONE), 0 from its schedule call on. The consumer
 * reads it first and skips the slot when set: 64 slots to a line instead
 * of 8, so the lines the owner rewrites a lap later are fewer that the
 * consumer has read. A hint only: RS_DONE decides. Ring @r has @mask + 1
 * slots.
 */
static inline _Atomic uint8_t *ring_done(struct ring *r, uint32_t mask,
                                         uint32_t pos)
{
    return (_Atomic uint8_t *)(void *)(r->slot + (size_t)mask + 1) +
           (size_t)pos;
}

struct prod {
    /* The line of subq holds nothing else (the padding on both sides, as
     * the allocation need not be aligned): the timer thread reads and
     * exchanges it all the time, and the owner's fields below would go
     * with it. */
    PAD(0);
    _Atomic(struct node *) subq;
    _Atomic uint64_t tail; /* ring positions published (the owner's) */
    PAD(1);
    _Atomic uint64_t head; /* ring positions taken (the consumer's) */
    PAD(3);
    _Atomic uint64_t added, dropped; /* only their sums over all mean much */
    _Atomic bool owned;
    /* The owner's: */
    struct node *mag; /* chain through tw__next */
    /* How many records mag holds beyond the batch it was last refilled
     * with (mag_refill() sets 0, a call that takes one subtracts 1, a
     * cancel that takes one back from the ring, ring_reclaim(), adds 1):
     * at most MAG_NODES. Beyond that such records go on spill, a chain
     * pushed on the pool's free list whole once it holds MAG_NODES, so
     * that a burst of cancels leaves a bounded number of records here,
     * out of the other threads' reach. */
    int32_t mag_back;
    uint32_t spill_n;
    struct node *spill;
    uint32_t fr_next, fr_end; /* never-used indexes [fr_next, fr_end) */
    tw_task_fn last_fn;       /* the last function and its entry */
    uint32_t last_fidx;
    /* last_fn on a service that may take prod_schedule_cached() (cfg.hot), else
     * no_fn, as it is at first: tw_schedule()'s one test for both. */
    tw_task_fn hot_fn;
    uint64_t ring_end; /* head + the ring's slots as last read: tail
                          stops there (0 without a ring: the stack only;
                          tail while the ring waits to grow) */
    uint32_t ring_tag; /* this producer's index << RING_BITS */
    /* The owner's copies of the ring's slots, bytes and mask. */
    _Atomic uint64_t *ring_slot;
    _Atomic uint8_t *ring_byte;
    uint32_t ring_mask;
    uint32_t ring_cap;  /* the most slots it may grow to */
    bool ring_grow;     /* found full: grows once it is found empty */
    bool tail_plain;    /* cfg.fence: tail is stored, not exchanged */
    uint8_t ring_old_n; /* rings it outgrew */
    /* The ring, NULL without one (no memory). Only the owner changes it
     * (tw__svc_ring_grow()); the consumer reads it after tail, other threads'
     * cancels when they find a task in it. */
    struct ring *_Atomic ring;
    struct ring *ring_old[RING_GROWS]; /* freed with the service */
    PAD(2);
};

/* The side record of a periodic task (tw__arg of its node). */
struct periodic {
    void *arg;
    uint64_t period_ns;
    uint64_t next_ns; /* fixed rate: the scheduled time of the next run */
    bool fixed_rate;
};

struct tw_service {
    /* Read-mostly configuration. */
    struct {
        uint64_t tick_ns;
        uint64_t start_ns; /* the clock at create: tick 0 */
        uint64_t max_pending;
        tw_clock_fn clock;
        void *clock_ctx;
        int32_t clock_id;          /* the built-in clock (clock == NULL), a
                                      clockid_t: monotonic or boottime */
        uint64_t slack_ns;         /* tw_schedule()'s default window */
        _Atomic uint64_t clock_hi; /* latest reading of clock (relative) */
        uint64_t tick_recip;       /* tw__recip(tick_ns) */
        struct tw__tsc *tsc;       /* producers' estimate: the built-in
                                      CLOCK_MONOTONIC only, else NULL */
        tw_execute_fn execute;
        void *execute_ctx;
        uint32_t nexec;
        bool lazy; /* TW_SERVICE_LAZY_CLOCK */
        bool hot; /* tw_schedule() may take prod_schedule_cached(): no slack, no
                     lazy clock, no max_pending, the built-in
                     CLOCK_MONOTONIC (its TSC estimate) */
        bool fence; /* tw__fence_heavy() may be used (src/fence.h): the
                       producers store their tails without a barrier */
        tw_wheel_config wcfg;
    } cfg;

    struct fn_table fns;
    struct node_pool pool;

    /* Producers to the timer thread. */
    struct {
        _Atomic(struct node *) subq; /* Treiber stack of QUEUED nodes */
        PAD(0);
        _Atomic uint64_t pending; /* count | STOPPED_BIT */
        PAD(1);
        /* Without max_pending: slots released by the timer thread,
         * executors and threads without a producer (wraps). */
        _Atomic uint64_t released;
        PAD(2);
    } submit;

    /* The producers (see struct prod). */
    struct {
        _Atomic(struct prod *) slot[MAX_PRODS];
        _Atomic uint32_t n; /* slots taken (a slot may still be NULL) */
        uint64_t serial;    /* unique per service, for the thread caches */
        struct tw_service *reg_prev, *reg_next; /* live services */
    } prods;

    /* The timer thread. */
    struct {
        _Atomic uint64_t sleep_until; /* tick; 0 while awake */
        /* A request due (relative ns) before this wakes the thread: the
         * first ns of tick sleep_until - 1, plus 1; 0 while awake. */
        _Atomic uint64_t wake_ns;
        _Atomic bool sleep_long; /* asleep for more than a tick */
        _Atomic bool in_task;    /* lazy only: the timer thread runs a task */
        PAD(0);
        pthread_mutex_t mu;
        pthread_cond_t cv;
        bool kicked; /* under mu */
        _Atomic bool quit;
        _Atomic bool started;
        pthread_t thread;
        tw_wheel *wheel;
        struct node *local;      /* taken from subq, not yet processed */
        uint32_t rr;             /* the producer subq_next() looks at first */
        struct node *disp_first; /* dispatched this round */
        struct node *disp_last;
        uint64_t disp_count;
        uint64_t round_ns; /* the clock at this round's advance */
        bool round_fresh;  /* no task has run on this thread since round_ns */
        /* Rounds begun and ended (tw__service_sync). */
        _Atomic uint64_t round_begin, round_end;
    } timer;

    /* Dispatch: the built-in executor pool, and the jobs given out. */
    struct exec_pool exec;
    _Atomic uint64_t busy;    /* dispatched or running, not yet finished */
    _Atomic uint64_t backlog; /* dispatched, not yet started or dropped */

    /* tw_cancel_wait(). */
    struct {
        pthread_mutex_t mu;
        pthread_cond_t cv;
        _Atomic uint32_t waiters;
    } wait;

    /* Start/stop. */
    struct {
        pthread_mutex_t stop_mu;
        bool stop_done; /* under stop_mu */
        /* Set once stop has handed everything back: from then on
         * tw_service_pending() is 0, even while a producer that counted
         * a task after stop's last sum has not yet seen the stop. */
        atomic_bool stopped;
    } life;

    /* Statistics (the pool keeps its own). Runs are counted in late[]
     * only: ran is their sum. mem: the bytes held outside the pool. */
    _Atomic uint64_t cancelled, handed, wakeups, mem;
    PAD(2);
    _Atomic uint64_t late[TW_LATE_BUCKETS];
};

#define NEVER UINT64_MAX /* deadline tick of a task that never runs */
/* tw__pprev of a QUEUED node whose tw__expires is a deadline in ns. */
#define QUEUED_NS ((tw_timer **)UINTPTR_MAX)
#define STOPPED_BIT (UINT64_C(1) << 63)

/* ------------------------------------------------------------------------ */
/* Node helpers, inline: they are on every call's path. */

static inline tw_id make_id(uint64_t st, uint32_t idx)
{
    return (st & ~UINT64_C(0xffffffff)) | (uint64_t)(idx + 1);
}

/* A node about to be queued: not linked, no deadline yet, @arg (its state
 * word, in the place of tw__fn, is left alone: nodes never go through
 * tw_timer_init()). */
static inline void node_init(struct node *n, void *arg)
{
    n->t.tw__next = NULL;
    n->t.tw__pprev = NULL;
    n->t.tw__expires = 0;
    n->t.tw__arg = arg;
}

/* The node @id names, with its current state, or NULL. A node whose
 * generation differs from the id's is not the id's task: every caller
 * checks that, and a location other than FREE (a never-used node, the
 * only one with generation 0, is FREE). */
static inline struct node *node_lookup(const struct node_pool *p, tw_id id,
                                       uint64_t *st)
{
    uint32_t idx = (uint32_t)id - 1; /* an id's low half 0: UINT32_MAX */
    if (idx >= atomic_load_explicit(&((struct node_pool *)p)->fresh,
                                    memory_order_acquire))
        return NULL;
    struct node *n = node_at(p, idx);
    *st = atomic_load(&n->state);
    return n;
}

/* Free the side record of owned node @n if it has one; its state word. */
static inline uint64_t side_record_free(struct node *n)
{
    uint64_t st = atomic_load_explicit(&n->state, memory_order_relaxed);
    if (st & ST_PERIODIC)
        tw__free(n->t.tw__arg);
    return st;
}

/* Free owned node @n and its side record: now (a batch of one), or into
 * the batch the timer thread is building (pushed when full or at
 * free_flush()). It gets a new generation and reads FREE. */
static inline void node_free(struct node_pool *p, struct node *n)
{
    pool_free(p, n, side_record_free(n));
}

static inline void node_free_batched(struct node_pool *p, struct node *n)
{
    pool_free_batched(p, n, side_record_free(n));
}

/* ------------------------------------------------------------------------ */
/* The function table. */

static inline uint32_t fn_hash(tw_task_fn fn)
{
    uint64_t x = (uint64_t)(uintptr_t)fn * UINT64_C(0x9E3779B97F4A7C15);
    return (uint32_t)(x >> 40);
}

/* Look @fn up without taking an entry: 0 and *@out its entry, 1 if it is
 * not there but there is room, TW_EAGAIN if the table is full. */
static inline int fn_find(const struct fn_table *ft, tw_task_fn fn,
                          uint32_t *out)
{
    uint32_t h = fn_hash(fn);
    for (uint32_t i = 0; i <= ft->mask; i++) {
        uint32_t slot = (h + i) & ft->mask;
        tw_task_fn cur =
            atomic_load_explicit(&ft->fns[slot], memory_order_acquire);
        if (cur == NULL)
            return 1;
        if (cur == fn) {
            *out = slot;
            return 0;
        }
    }
    return TW_EAGAIN;
}

static inline tw_task_fn fn_at(const struct fn_table *ft, uint64_t st)
{
    return atomic_load_explicit(&ft->fns[ST_FN(st)], memory_order_acquire);
}

/* ------------------------------------------------------------------------ */
/* Shared by the service's files (src/service*.c). */

/* Test hooks (src/service_internal.h): calls only in the test build of
 * the library (TW_TEST_HOOKS). */
#ifdef TW_TEST_HOOKS
#define TEST_HOOK(hook, ...)                                                   \
    do {                                                                       \
        if ((hook) != NULL)                                                    \
            (hook)(__VA_ARGS__);                                               \
    } while (0)
#else
#define TEST_HOOK(hook, ...) ((void)0)
#endif

/* The service whose thread this is, and the task this thread runs, for the
 * TW_EDEADLK checks of tw_service_stop() and tw_cancel_wait() (defined in
 * src/service.c). */
struct tw__svc_cur {
    tw_service *s;
    tw_id id;
};
extern _Thread_local struct tw__svc_cur tw__svc_cur;

/* ------------------------------------------------------------------------ */
/* Clock and ticks. */

/* Nanoseconds since the service was created. A caller-supplied clock
 * that steps back (against its contract) is held at its latest reading,
 * for every thread: the service's time never goes back, so nothing is due
 * that the wheel has passed and the timer thread never spins on it. */
static inline uint64_t rel_ns(const tw_service *s)
{
    if (s->cfg.clock == NULL) {
        uint64_t now = tw__clock_ns((clockid_t)s->cfg.clock_id);
        return now > s->cfg.start_ns ? now - s->cfg.start_ns : 0;
    }
    uint64_t now = s->cfg.clock(s->cfg.clock_ctx);
    now = now > s->cfg.start_ns ? now - s->cfg.start_ns : 0;
    _Atomic uint64_t *hi = &((tw_service *)s)->cfg.clock_hi;
    uint64_t h = atomic_load_explicit(hi, memory_order_relaxed);
    while (now > h &&
           !atomic_compare_exchange_weak_explicit(
               hi, &h, now, memory_order_relaxed, memory_order_relaxed)) {
    }
    return now > h ? now : h;
}

/* A producer's reading for a deadline: rel_ns(), or, on the built-in
 * CLOCK_MONOTONIC, the TSC estimate, which is never earlier than the
 * clock and at most a few us later (src/service_clock.c). Only for
 * deadlines: the timer thread decides what is due on rel_ns(). */
static inline uint64_t rel_ns_deadline(const tw_service *s)
{
    if (s->cfg.tsc == NULL)
        return rel_ns(s);
    uint64_t now = tw__tsc_now(s->cfg.tsc);
    return now > s->cfg.start_ns ? now - s->cfg.start_ns : 0;
}

/* The first tick at or after @ns (relative), NEVER when @ns is. */
static inline uint64_t ceil_tick(const tw_service *s, uint64_t ns)
{
    if (ns == NEVER)
        return NEVER;
    return tw__ceil_div(ns, s->cfg.tick_ns, s->cfg.tick_recip);
}

/* @a + @b, or NEVER if that does not fit. */
static inline uint64_t add_sat(uint64_t a, uint64_t b)
{
    uint64_t r;
    return __builtin_add_overflow(a, b, &r) ? NEVER : r;
}

/* ------------------------------------------------------------------------ */
/* Owners: move a node on, or free it if it was cancelled. */

/*
 * Move owned node @n to location @loc, clearing the bits @clear, unless it
 * was cancelled: then free it (batched: on the timer thread, at the end of
 * its round) and return false. *@was receives the state before the move
 * (or before the free).
 */
static inline bool move_or_free(tw_service *s, struct node *n, unsigned loc,
                                uint64_t clear, bool batched, uint64_t *was)
{
    uint64_t v = atomic_load(&n->state);
    do {
        if (v & ST_CANCELLED) {
            if (batched)
                node_free_batched(&s->pool, n);
            else
                node_free(&s->pool, n);
            atomic_fetch_add_explicit(&s->cancelled, 1, memory_order_relaxed);
            *was = v;
            return false;
        }
    } while (!atomic_compare_exchange_weak(&n->state, &v,
                                           (v & ~(ST_LOC_MASK | clear)) | loc));
    *was = v;
    return true;
}

/* The node @id names, with its current state, or NULL. */
static inline struct node *lookup(const tw_service *s, tw_id id, uint64_t *st)
{
    return s != NULL ? node_lookup(&s->pool, id, st) : NULL;
}

/* ------------------------------------------------------------------------ */
/* Waking the timer thread (it sleeps in timer_sleep(), src/service_loop.c). */

static inline void wake(tw_service *s)
{
    pthread_mutex_lock(&s->timer.mu);
    s->timer.kicked = true;
    pthread_cond_signal(&s->timer.cv);
    pthread_mutex_unlock(&s->timer.mu);
}

/* After queueing work due at @tick: wake the thread if it sleeps past it. */
static inline void wake_for_tick(tw_service *s, uint64_t tick)
{
    uint64_t v = atomic_load(&s->timer.sleep_until);
    while (tick < v) {
        if (atomic_compare_exchange_weak(&s->timer.sleep_until, &v, 0)) {
            /* No other call need come here until the thread sleeps
             * again (and sets wake_ns again, under timer.mu, so the
             * wake() below follows any store it overwrites). */
            atomic_store(&s->timer.wake_ns, 0);
            wake(s);
            return;
        }
    }
}

/* After a cancel: the memory must be released within a tick. */
static inline void wake_for_cancel(tw_service *s)
{
    if (atomic_load(&s->timer.sleep_long) &&
        atomic_exchange(&s->timer.sleep_long, false))
        wake(s);
}

/* src/service_loop.c: wake_for_due() when the timer thread sleeps past the
 * task's tick (or is being woken): out of line, so that the producers'
 * fast path makes no call and keeps its values in caller-saved registers.
 * Returns 0. */
int tw__svc_wake_for_due(tw_service *s, uint64_t due);

/* After the publication of a task due @due ns after the start: wake the
 * timer thread if it sleeps past the task's tick. Returns 0. */
static inline __attribute__((always_inline)) int wake_for_due(tw_service *s,
                                                              uint64_t due)
{
    if (due < atomic_load(&s->timer.wake_ns)) /* tick < sleep_until */
        return tw__svc_wake_for_due(s, due);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Pending counts and submission stacks. */

/* Release a pending slot, from a thread without a producer. */
static inline void pending_drop(tw_service *s)
{
    if (s->cfg.max_pending != 0)
        atomic_fetch_sub_explicit(&s->submit.pending, 1, memory_order_relaxed);
    else
        atomic_fetch_add_explicit(&s->submit.released, 1, memory_order_release);
}

/* Producer @p released a pending slot. Context: its owner. */
static inline void prod_drop(struct prod *p)
{
    atomic_store_explicit(
        &p->dropped,
        atomic_load_explicit(&p->dropped, memory_order_relaxed) + 1,
        memory_order_release);
}

static inline void stack_push(_Atomic(struct node *) *q, struct node *n)
{
    struct node *h = atomic_load_explicit(q, memory_order_relaxed);
    do {
        n->t.tw__next = h != NULL ? &h->t : NULL;
    } while (!atomic_compare_exchange_weak_explicit(
        q, &h, n, memory_order_seq_cst, memory_order_relaxed));
}

/* ------------------------------------------------------------------------ */
/* One schedule call: shared by the shared path (src/service.c) and a
 * producer's call with the lazy clock (src/service_submit.c). */

enum sched_kind {
    KIND_ONCE,  /* one-shot */
    KIND_HOLD,  /* one-shot that keeps its pending slot while it runs */
    KIND_RATE,  /* fixed rate */
    KIND_DELAY, /* fixed delay */
};

/* One schedule call's arguments. */
struct sched {
    tw_task_fn fn;
    void *arg;
    uint64_t delay, period;
    uint64_t width; /* one-shot: the window's width in ns (0: exact) */
    enum sched_kind kind;
    tw_id replace; /* KIND_HOLD: a task to take over (see take_slot()) */
    bool *replaced;
};

/* What sched_reserve() took for the call (apart from its pending slot).
 * Kept apart from struct sched, whose fields then stay in registers. */
struct reserved {
    uint32_t fidx, idx; /* function table entry, node index */
    struct node *n;     /* the node */
    uint64_t st;        /* its state word, FREE */
    struct periodic *rec;
};

static inline bool kind_periodic(enum sched_kind kind)
{
    return kind == KIND_RATE || kind == KIND_DELAY;
}

/* Fill the reserved node and push it on submission stack @q. */
static inline void sched_publish(tw_service *s, const struct sched *r,
                                 const struct reserved *v,
                                 _Atomic(struct node *) *q, tw_id *id)
{
    uint64_t flags = kind_periodic(r->kind) ? ST_PERIODIC
                     : r->kind == KIND_HOLD ? ST_HOLD
                                            : 0;
    void *arg = v->rec != NULL ? (void *)v->rec : r->arg;
    /* Lazy clock: the timer thread is awake or polling, so it takes the
     * request within about a tick and reads the clock then. */
    bool lazy =
        s->cfg.lazy && v->rec == NULL && r->width == 0 &&
        !atomic_load_explicit(&s->timer.sleep_long, memory_order_relaxed) &&
        !atomic_load_explicit(&s->timer.in_task, memory_order_relaxed);
    uint64_t tick = r->delay, last = r->delay;
    if (lazy) {
        flags |= ST_RELATIVE;
    } else {
        uint64_t due = add_sat(rel_ns_deadline(s), r->delay);
        if (v->rec != NULL)
            v->rec->next_ns = due;
        last = tick = ceil_tick(s, due);
        if (r->width != 0 && due != NEVER)
            tw__svc_window(s->cfg.tick_ns, due, r->width, &tick, &last);
    }
    struct node *n = v->n;
    node_init(n, arg);
    n->t.tw__expires = tick;
    /* While QUEUED, tw__pprev carries the window's width in ticks (a
     * narrower window is still inside the caller's). */
    n->t.tw__pprev = (tw_timer **)(uintptr_t)(last - tick < UINTPTR_MAX - 1
                                                  ? last - tick
                                                  : UINTPTR_MAX - 1);
    uint64_t st = (v->st & ~UINT64_C(0xffffffff)) |
                  ((uint64_t)v->fidx << ST_PAY_SHIFT) | flags | LOC_QUEUED;
    if (id != NULL)
        *id = make_id(st, v->idx);
    atomic_store_explicit(&n->state, st, memory_order_release);
    stack_push(q, n);
    if (lazy)
        wake_for_cancel(s); /* it went to sleep long meanwhile */
    else
        wake_for_tick(s, last); /* only if it sleeps past the window */
}

/* ------------------------------------------------------------------------ */
/* Functions one file of the service calls in another. */

/* src/service.c: the entry of @fn in the function table, added if new: 0
 * and *@out, or TW_EAGAIN if the table is full. */
int tw__svc_fn_index(struct fn_table *ft, tw_task_fn fn, uint32_t *out);
/* src/service.c: the shared path, for any call: schedule a task of @kind.
 * @width: a one-shot's window in ns (0: exact). A non-zero @replace is a
 * task to take over (see take_slot()), only for KIND_HOLD. */
int tw__svc_schedule_shared(tw_service *s, tw_task_fn fn, void *arg,
                            uint64_t delay, uint64_t width, uint64_t period,
                            enum sched_kind kind, tw_id replace, bool *replaced,
                            tw_id *id);
/* src/service_cancel.c: cancel task @id (tw_cancel() with @drop; false: a
 * replacing schedule call takes its pending slot over). */
bool tw__svc_cancel(tw_service *s, tw_id id, bool drop);
/* src/service_loop.c: the timer thread; and stop's hand-back of every
 * task in the wheel and the submissions once the thread is joined (to
 * @fn, with @ctx), returning how many it handed back. */
void *tw__svc_timer_main(void *s);
uint64_t tw__svc_stop_drain(tw_service *s, tw_unprocessed_fn fn, void *ctx);
/* src/service_run.c: hand this round's due nodes to the executors; the
 * wheel's callback for every node; the executor pool's take() and run(). */
void tw__svc_dispatch_flush(tw_service *s);
void tw__svc_trampoline(tw_timer *t, void *arg);
bool tw__svc_exec_take(tw_timer *job, void *ctx);
void tw__svc_exec_run(tw_timer *job, void *ctx);
/* src/service_producer.c: the registry of live services (see struct
 * prod): enter @s, take it out. */
void tw__svc_reg_add(tw_service *s);
void tw__svc_reg_remove(tw_service *s);

#endif
