/* SPDX-License-Identifier: MIT */
/*
 * src/service.c - the thread-safe timer service (twheel/service.h).
 *
 * The design, the state word of a task record and the lock order are in
 * src/service_impl.h; the records themselves in the node pool
 * (src/node_pool.h), the executor threads in src/exec_pool.c. This file follows
 * a task down the pipeline:
 *
 *   submit        tw_schedule*(): validate, reserve, publish on the stack
 *   timer thread  takes the stack and the cancel marks, advances the wheel
 *   dispatch/run  the wheel's trampoline runs a due task or dispatches it
 *   cancel        tw_cancel(), tw_cancel_wait()
 *   life          create, start, stop (hands back what never ran), destroy
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

#include "fence.h"
#include "internal.h"
#include "node_pool.h"
#include "service_clock.h"
#include "service_impl.h"

#define DRAIN_BATCH 8192 /* submissions per timer-thread round */

#define TICK_MIN_NS UINT64_C(1000)
/* The shortest tick with which the producers publish without a barrier
 * (publish_ring()): the timer thread then asks the kernel for one at most
 * every two ticks, 5,000 times a second. Below it the rings' tails are
 * exchanged. */
#define FENCE_MIN_TICK_NS UINT64_C(100000)
#define TICK_MAX_NS (UINT64_C(86400) * 1000000000u)

/* Test hooks (internal.h): only in the test build of the library
 * (TW_TEST_HOOKS); the installed libraries have neither the variables nor
 * the calls. */
#ifdef TW_TEST_HOOKS
void (*tw__service_run_hook)(tw_service *s, tw_id job);
void (*tw__service_started_hook)(tw_service *s, tw_id id);
void (*tw__service_xpop_hook)(tw_service *s, tw_id id);
void (*tw__service_xdrop_hook)(tw_service *s, tw_id id);
void (*tw__service_accepted_hook)(tw_service *s, tw_id id);
void (*tw__service_reserved_hook)(tw_service *s);
void (*tw__service_pushed_hook)(tw_service *s);
void (*tw__service_drained_hook)(tw_service *s);
void (*tw__service_sum_hook)(tw_service *s);
void (*tw__service_lazy_hook)(tw_service *s, tw_id id, uint64_t now);
void (*tw__service_ring_hook)(tw_service *s, tw_id id, bool taken);
void (*tw__service_cancel_ring_hook)(tw_service *s, tw_id id);
#define TEST_HOOK(hook, ...)                                                   \
    do {                                                                       \
        if ((hook) != NULL)                                                    \
            (hook)(__VA_ARGS__);                                               \
    } while (0)
#else
#define TEST_HOOK(hook, ...) ((void)0)
#endif

/* The service whose thread this is, and the task this thread runs, for the
 * TW_EDEADLK checks of tw_service_stop() and tw_cancel_wait(). */
static _Thread_local struct {
    tw_service *s;
    tw_id id;
} tw_cur;

/* ------------------------------------------------------------------------ */
/* Clock and ticks. */

static uint64_t mono_ns(void)
{
    return tw__clock_ns(CLOCK_MONOTONIC);
}

/* Nanoseconds since the service was created. A caller-supplied clock
 * that steps back (against its contract) is held at its latest reading,
 * for every thread: the service's time never goes back, so nothing is due
 * that the wheel has passed and the timer thread never spins on it. */
static uint64_t rel_ns(const tw_service *s)
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

/* The entry of @fn in the function table, added if new: 0 and *@out, or
 * TW_EAGAIN if the table is full. Out of line: the first call with a
 * function, or a call without a producer. */
static __attribute__((noinline)) int fn_index(struct fn_table *ft,
                                              tw_task_fn fn, uint32_t *out)
{
    uint32_t h = fn_hash(fn);
    for (uint32_t i = 0; i <= ft->mask; i++) {
        uint32_t slot = (h + i) & ft->mask;
        tw_task_fn cur =
            atomic_load_explicit(&ft->fns[slot], memory_order_acquire);
        if (cur == NULL && atomic_compare_exchange_strong_explicit(
                               &ft->fns[slot], &cur, fn, memory_order_acq_rel,
                               memory_order_acquire))
            cur = fn; /* ours now */
        if (cur == fn) {
            *out = slot;
            return 0;
        }
    }
    return TW_EAGAIN;
}

/* The node @id names, with its current state, or NULL. */
static struct node *lookup(const tw_service *s, tw_id id, uint64_t *st)
{
    return s != NULL ? node_lookup(&s->pool, id, st) : NULL;
}

/* ------------------------------------------------------------------------ */
/* Waking the timer thread. */

static void wake(tw_service *s)
{
    pthread_mutex_lock(&s->timer.mu);
    s->timer.kicked = true;
    pthread_cond_signal(&s->timer.cv);
    pthread_mutex_unlock(&s->timer.mu);
}

/* After queueing work due at @tick: wake the thread if it sleeps past it. */
static void wake_for_tick(tw_service *s, uint64_t tick)
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
static void wake_for_cancel(tw_service *s)
{
    if (atomic_load(&s->timer.sleep_long) &&
        atomic_exchange(&s->timer.sleep_long, false))
        wake(s);
}

/* ------------------------------------------------------------------------ */
/* Submit: the producer's side. */

static int pending_reserve(tw_service *s)
{
    uint64_t v = atomic_load_explicit(&s->submit.pending, memory_order_relaxed);
    do {
        if (v & STOPPED_BIT)
            return TW_ESHUTDOWN;
        if (s->cfg.max_pending != 0 && v >= s->cfg.max_pending)
            return TW_EAGAIN;
    } while (!atomic_compare_exchange_weak_explicit(&s->submit.pending, &v,
                                                    v + 1, memory_order_relaxed,
                                                    memory_order_relaxed));
    return 0;
}

/* Release a pending slot, from a thread without a producer. */
static void pending_drop(tw_service *s)
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

static void stack_push(_Atomic(struct node *) *q, struct node *n)
{
    struct node *h = atomic_load_explicit(q, memory_order_relaxed);
    do {
        n->t.tw__next = h != NULL ? &h->t : NULL;
    } while (!atomic_compare_exchange_weak_explicit(
        q, &h, n, memory_order_seq_cst, memory_order_relaxed));
}

static void subq_push(tw_service *s, struct node *n)
{
    stack_push(&s->submit.subq, n);
}

/* ------------------------------------------------------------------------ */
/* Producers: each thread's own stack, count and magazine (struct prod).
 *
 * A thread caches the producers it owns, by service and the service's
 * serial (an address may be reused by a later service; a serial is not).
 * A producer leaves a thread's cache when the thread exits or needs the
 * entry for a fifth service; it is then released, under the registry of
 * live services, so that a release never touches a destroyed service. */

#define PROD_CACHE 4

/* initial-exec: no call to find the thread's block, in the shared
 * library too (the block is small). */
#define TLS_IE __attribute__((tls_model("initial-exec")))
static _Thread_local struct prod_ref {
    tw_service *s;
    uint64_t serial;
    struct prod *p;
} prod_cache[PROD_CACHE] TLS_IE;
static _Thread_local unsigned prod_victim TLS_IE;

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static tw_service *reg_head;
static pthread_key_t prod_key;
static pthread_once_t prod_key_once = PTHREAD_ONCE_INIT;
static int prod_key_rc;

/* Release the producer @r names if its service is still alive. */
static void prod_release(struct prod_ref *r)
{
    pthread_mutex_lock(&reg_mu);
    for (tw_service *x = reg_head; x != NULL; x = x->prods.reg_next)
        if (x == r->s && x->prods.serial == r->serial) {
            atomic_store_explicit(&r->p->owned, false, memory_order_release);
            break;
        }
    pthread_mutex_unlock(&reg_mu);
    r->s = NULL;
    r->p = NULL; /* prod_first() reads s == NULL as "no producer" */
}

/* Enter @s in the registry of live services. */
static void reg_add(tw_service *s)
{
    pthread_mutex_lock(&reg_mu);
    s->prods.reg_next = reg_head;
    if (reg_head != NULL)
        reg_head->prods.reg_prev = s;
    reg_head = s;
    pthread_mutex_unlock(&reg_mu);
}

/* Take @s out of it: from now on no thread releases a producer of @s. */
static void reg_remove(tw_service *s)
{
    pthread_mutex_lock(&reg_mu);
    if (s->prods.reg_prev != NULL)
        s->prods.reg_prev->prods.reg_next = s->prods.reg_next;
    else
        reg_head = s->prods.reg_next;
    if (s->prods.reg_next != NULL)
        s->prods.reg_next->prods.reg_prev = s->prods.reg_prev;
    pthread_mutex_unlock(&reg_mu);
}

static void prod_thread_exit(void *unused)
{
    (void)unused;
    for (unsigned i = 0; i < PROD_CACHE; i++)
        if (prod_cache[i].s != NULL)
            prod_release(&prod_cache[i]);
}

static void prod_key_init(void)
{
    prod_key_rc = pthread_key_create(&prod_key, prod_thread_exit);
}

/* A ring of 2^@bits slots (counted in @s's memory), or NULL. */
static struct ring *ring_new(tw_service *s, unsigned bits)
{
    uint32_t mask = (UINT32_C(1) << bits) - 1;
    struct ring *r = tw__calloc(1, ring_bytes(mask));
    if (r != NULL) {
        r->mask = mask;
        atomic_fetch_add_explicit(&s->mem, ring_bytes(mask),
                                  memory_order_relaxed);
    }
    return r;
}

/* Producer @p's owner's copies of ring @r's slots, bytes and mask. */
static void prod_ring_use(struct prod *p, struct ring *r)
{
    p->ring_slot = r->slot;
    p->ring_byte = ring_done(r, r->mask, 0);
    p->ring_mask = r->mask;
}

/* A producer's hot_fn while no call may take schedule_hot(): a function
 * no caller has, as tw_schedule() tests fn against hot_fn only. */
static void no_fn(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
}

/* An unowned producer of @s, now ours, or a new one; NULL if none can be
 * had (all MAX_PRODS taken, or no memory). */
static struct prod *prod_adopt(tw_service *s)
{
    uint32_t n = atomic_load_explicit(&s->prods.n, memory_order_acquire);
    for (uint32_t i = 0; i < n; i++) {
        struct prod *p =
            atomic_load_explicit(&s->prods.slot[i], memory_order_acquire);
        bool no = false;
        if (p != NULL &&
            !atomic_load_explicit(&p->owned, memory_order_relaxed) &&
            atomic_compare_exchange_strong_explicit(&p->owned, &no, true,
                                                    memory_order_acquire,
                                                    memory_order_relaxed))
            return p;
    }
    while (n < MAX_PRODS &&
           !atomic_compare_exchange_weak(&s->prods.n, &n, n + 1)) {
    }
    if (n >= MAX_PRODS)
        return NULL;
    struct prod *p = tw__calloc(1, sizeof(*p));
    if (p != NULL) {
        atomic_init(&p->owned, true);
        p->ring_tag = n << RING_BITS;
        p->hot_fn = no_fn;
        /* Without its ring the producer uses its stack only. */
        struct ring *r = ring_new(s, RING_MIN_BITS);
        if (r != NULL)
            prod_ring_use(p, r);
        p->ring_cap = RING_SLOTS;
        p->tail_plain = s->cfg.fence;
        atomic_init(&p->ring, r);
        atomic_fetch_add_explicit(&s->mem, sizeof(*p), memory_order_relaxed);
    }
    /* A slot that stays NULL (no memory) is skipped by everybody. */
    atomic_store_explicit(&s->prods.slot[n], p, memory_order_release);
    return p;
}

/* The calling thread's producer of @s, taken now if it has none: NULL
 * when the service has max_pending (which needs the shared count), is not
 * started yet, or no producer can be had. */
static __attribute__((noinline)) struct prod *prod_claim(tw_service *s)
{
    if (s->cfg.max_pending != 0 ||
        !atomic_load_explicit(&s->timer.started, memory_order_acquire))
        return NULL;
    pthread_once(&prod_key_once, prod_key_init);
    if (prod_key_rc != 0 || pthread_setspecific(prod_key, &prod_key) != 0)
        return NULL;
    struct prod *p = prod_adopt(s);
    if (p == NULL)
        return NULL;
    struct prod_ref *r = &prod_cache[prod_victim++ % PROD_CACHE];
    if (r->s != NULL)
        prod_release(r);
    *r = (struct prod_ref){s, s->prods.serial, p};
    return p;
}

/* This thread's producer for @s if it has one cached, else NULL. */
static inline struct prod *prod_cached(tw_service *s)
{
    for (unsigned i = 0; i < PROD_CACHE; i++)
        if (prod_cache[i].s == s && prod_cache[i].serial == s->prods.serial)
            return prod_cache[i].p;
    return NULL;
}

/* prod_cached() that looks at the first entry only, where the producer of
 * a thread's first service is (prod_claim()); NULL if it is not there. */
static inline struct prod *prod_first(const tw_service *s)
{
    /* An entry names a service (s != NULL) exactly when it holds a
     * producer, so that @s NULL finds none without a test of its own. */
    struct prod *p = prod_cache[0].p;
    return prod_cache[0].s == s && p != NULL &&
                   prod_cache[0].serial == s->prods.serial
               ? p
               : NULL;
}

static inline struct prod *prod_get(tw_service *s)
{
    struct prod *p = prod_cached(s);
    return p != NULL ? p : prod_claim(s);
}

static void trampoline(tw_timer *t, void *arg);
static inline bool cancel_id(tw_service *s, tw_id id, bool drop);

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

static bool kind_periodic(enum sched_kind kind)
{
    return kind == KIND_RATE || kind == KIND_DELAY;
}

/* The checks that need no memory: bad arguments, stopped, and (unless it
 * replaces a task) max_pending, so that a call that max_pending rejects
 * does not grow the record pool. */
static inline int sched_validate(tw_service *s, const struct sched *r)
{
    if (s == NULL || r->fn == NULL || (kind_periodic(r->kind) && !r->period))
        return TW_EINVAL;
    uint64_t p = atomic_load_explicit(&s->submit.pending, memory_order_relaxed);
    if (p & STOPPED_BIT)
        return TW_ESHUTDOWN;
    if (s->cfg.max_pending != 0 && p >= s->cfg.max_pending && r->replace == 0)
        return TW_EAGAIN;
    return 0;
}

/*
 * Take what the task needs: its side record, a node, a started service, a
 * function table entry and a pending slot, with one undo path.
 *
 * Order: everything that may fail and can be undone comes before the
 * pending slot, which is the last step: a call that fails holds no slot,
 * not even for a moment, so it never makes a concurrent valid call fail.
 * The function table is only read first; a new function takes its entry
 * after the slot (a call that max_pending rejects takes no entry), or,
 * when replacing, before it (the takeover cannot be undone).
 */
static inline int sched_reserve(tw_service *s, const struct sched *r,
                                struct reserved *v)
{
    int rc = fn_find(&s->fns, r->fn, &v->fidx);
    if (rc < 0)
        return rc;
    bool fn_new = rc == 1;
    rc = periodic_new(r->kind, r->arg, r->period, &v->rec);
    if (rc != 0)
        return rc;
    bool have_node = (rc = node_alloc(&s->pool, &v->idx, &v->st)) == 0;
    if (have_node)
        v->n = node_at(&s->pool, v->idx);
    /* The first call starts the service only once its memory is there. */
    if (rc == 0 &&
        !atomic_load_explicit(&s->timer.started, memory_order_acquire))
        rc = tw_service_start(s);
    if (rc == 0 && fn_new && r->replace != 0)
        rc = fn_index(&s->fns, r->fn, &v->fidx);
    if (rc == 0)
        rc = take_slot(s, r->replace, r->replaced);
    if (rc == 0 && fn_new && r->replace == 0 &&
        (rc = fn_index(&s->fns, r->fn, &v->fidx)))
        pending_drop(s); /* the table filled up meanwhile */
    if (rc == 0)
        return 0;
    if (have_node)
        node_unalloc(&s->pool, v->idx, v->st);
    tw__free(v->rec);
    return rc;
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

/*
 * Schedule a task of @kind. @width: a one-shot's window in ns (0: exact).
 * A non-zero @replace is a task to take over (see take_slot()), only for
 * KIND_HOLD.
 */
static int schedule(tw_service *s, tw_task_fn fn, void *arg, uint64_t delay,
                    uint64_t width, uint64_t period, enum sched_kind kind,
                    tw_id replace, bool *replaced, tw_id *id)
{
    struct sched r = {fn, arg, delay, period, width, kind, replace, replaced};
    struct reserved v; /* each field set before it is read */
    int rc = sched_validate(s, &r);
    if (rc == 0)
        rc = sched_reserve(s, &r, &v);
    if (rc == 0)
        sched_publish(s, &r, &v, &s->submit.subq, id);
    return rc;
}

/* Refill producer @p's magazine: a batch from the free list, else a range
 * of never-used nodes. False: no memory. */
static __attribute__((noinline)) bool mag_refill(tw_service *s, struct prod *p)
{
    uint32_t f;
    p->mag_back = 0;
    p->mag = free_pop(&s->pool);
    if (p->mag != NULL)
        return true;
    if (fresh_take(&s->pool, MAG_NODES, &f) != 0)
        return false;
    p->fr_next = f;
    p->fr_end = f + MAG_NODES;
    return true;
}

/* A node from producer @p's magazine (*@v: its index, state), or false if
 * it is empty and cannot be refilled. Context: @p's owner. */
static inline bool mag_take(tw_service *s, struct prod *p, struct reserved *v)
{
    if (p->mag == NULL && p->fr_next == p->fr_end && !mag_refill(s, p))
        return false;
    struct node *n = p->mag;
    if (n != NULL) {
        p->mag = node_of_timer(n->t.tw__next);
        p->mag_back--;
        /* The next call's node, most likely last written by the timer
         * thread: its miss overlaps this call. */
        if (p->mag != NULL)
            __builtin_prefetch(p->mag, 1);
        v->idx = node_index(n);
        v->st = atomic_load_explicit(&n->state, memory_order_relaxed);
    } else {
        v->idx = p->fr_next++;
        v->st = fresh_state(&s->pool, v->idx);
        n = node_at(&s->pool, v->idx);
    }
    v->n = n;
    return true;
}

/* Put back what mag_take() gave (*@v). */
static void mag_put(struct prod *p, const struct reserved *v)
{
    v->n->t.tw__expires = node_handle(v->st, node_index(v->n));
    atomic_store_explicit(&v->n->state, v->st, memory_order_relaxed);
    v->n->t.tw__next = p->mag != NULL ? &p->mag->t : NULL;
    p->mag = v->n;
}

/*
 * Stop has begun after schedule_fast() pushed node @v->n on producer @p's
 * stack: take the node back if it is still there. Only @p's owner pushes
 * on that stack, so its top is this call's node unless somebody took the
 * stack whole (stop, or the timer thread before it quit); that somebody
 * then arms it or hands it back, and the call has succeeded. Returns
 * TW_ESHUTDOWN (the node back in the magazine, the count dropped, *@id
 * back to @was) or 0.
 * Context: @p's owner.
 */
static __attribute__((noinline)) int schedule_undo(tw_service *s,
                                                   struct prod *p,
                                                   const struct reserved *v,
                                                   tw_id *id, tw_id was)
{
    struct node *top = atomic_exchange(&p->subq, NULL);
    if (top == NULL)
        return 0;
    struct node *rest = node_of_timer(top->t.tw__next);
    if (rest != NULL) { /* older calls' nodes: back for stop to take */
        struct node *tail = rest;
        while (tail->t.tw__next != NULL)
            tail = node_of_timer(tail->t.tw__next);
        struct node *h = atomic_load(&p->subq);
        do {
            tail->t.tw__next = h != NULL ? &h->t : NULL;
        } while (!atomic_compare_exchange_weak(&p->subq, &h, rest));
    }
    uint64_t st = atomic_load(&v->n->state);
    do {
        if (st & ST_CANCELLED) {
            /* A cancel with the id (not returned yet, but an id can be
             * guessed) won and released the slot. */
            node_free(&s->pool, v->n);
            atomic_fetch_add_explicit(&s->cancelled, 1, memory_order_relaxed);
            return 0;
        }
    } while (!atomic_compare_exchange_weak(&v->n->state, &st, v->st));
    prod_drop(p);
    mag_put(p, v);
    if (id != NULL)
        *id = was; /* a failed call leaves *@id as it was */
    return TW_ESHUTDOWN;
}

/*
 * Stop has begun after publish_ring() published node @n in slot @pos of
 * producer @p's ring: withdraw it unless the consumer (stop) took it or a
 * cancel won (then the call has succeeded); @task is its id. Returns
 * TW_ESHUTDOWN (the node back in the magazine, FREE in its generation,
 * the count dropped, *@id back to @was) or 0. Context: @p's owner.
 */
static __attribute__((noinline)) int ring_undo(struct prod *p, struct node *n,
                                               tw_id task, uint32_t pos,
                                               tw_id *id, tw_id was)
{
    uint64_t v = rs_word(task, RS_QUEUED);
    if (!atomic_compare_exchange_strong(&p->ring_slot[pos], &v,
                                        rs_word(task, RS_WITHDRAWN)))
        return 0;
    prod_drop(p);
    mag_put(p, &(struct reserved){.n = n, .st = task & ~UINT64_C(0xffffffff)});
    if (id != NULL)
        *id = was;
    return TW_ESHUTDOWN;
}

/* wake_for_due() when the timer thread sleeps past the task's tick (or
 * is being woken): out of line, so that the producers' fast path makes
 * no call and keeps its values in caller-saved registers. Returns 0. */
static __attribute__((noinline)) int wake_for_due_slow(tw_service *s,
                                                       uint64_t due)
{
    wake_for_tick(s, ceil_tick(s, due));
    return 0;
}

/* After the publication of a task due @due ns after the start: wake the
 * timer thread if it sleeps past the task's tick. Returns 0. */
static inline __attribute__((always_inline)) int wake_for_due(tw_service *s,
                                                              uint64_t due)
{
    if (due < atomic_load(&s->timer.wake_ns)) /* tick < sleep_until */
        return wake_for_due_slow(s, due);
    return 0;
}

/*
 * Publish node @n (filled by publish_exact() for task @task, its
 * function's entry in p->last_fidx, *@id already set, @was its old
 * value) in slot @t of producer @p's ring, which has room, then the stop
 * check and the wake-up. The slot is written before the state word, so
 * that whoever sees LOC_RING sees the slot; the store of tail publishes
 * both. Between it and the reads of the stop bit and wake_ns (see
 * schedule_fast()) a full barrier is needed: the exchange of tail, or,
 * with p->tail_plain, a release store and tw__fence_light() against the
 * tw__fence_heavy() of timer_sleep() and tw_service_stop() (so that a
 * schedule and cancel pair makes one atomic read-modify-write, not two).
 * Context: @p's owner.
 */
static inline __attribute__((always_inline)) int
publish_ring(tw_service *s, struct prod *p, struct node *n, tw_id task,
             uint64_t due, uint64_t t, tw_id *id, tw_id was)
{
    uint64_t gen = task & ~UINT64_C(0xffffffff);
    uint32_t pos = (uint32_t)t & p->ring_mask;
    n->t.tw__next = (tw_timer *)(uintptr_t)p->last_fidx;
    atomic_store_explicit(&p->ring_slot[pos], rs_word(task, RS_QUEUED),
                          memory_order_relaxed);
    atomic_store_explicit(&n->state,
                          gen | (uint64_t)(p->ring_tag | pos) << ST_PAY_SHIFT |
                              LOC_RING,
                          memory_order_release);
    atomic_store_explicit(&p->ring_byte[pos], 0, memory_order_relaxed);
    if (p->tail_plain) {
        atomic_store_explicit(&p->tail, t + 1, memory_order_release);
        tw__fence_light();
    } else {
        atomic_exchange(&p->tail, t + 1);
    }
    TEST_HOOK(tw__service_pushed_hook, s);
    if (atomic_load(&s->submit.pending) & STOPPED_BIT)
        return ring_undo(p, n, task, pos, id, was);
    return wake_for_due(s, due);
}

/*
 * Producer @p's ring, found full before and empty now (the consumer has
 * taken every slot up to tail): a ring twice its size in its place, or,
 * without the memory, the same ring for good. See struct ring.
 * Context: @p's owner.
 */
static __attribute__((noinline)) void prod_ring_grow(tw_service *s,
                                                     struct prod *p)
{
    struct ring *old = atomic_load_explicit(&p->ring, memory_order_relaxed);
    struct ring *r = NULL;
    p->ring_grow = false;
    if (p->ring_old_n == RING_GROWS ||
        (r = ring_new(s, (unsigned)__builtin_ctz(old->mask + 1) + 1)) == NULL) {
        p->ring_cap = old->mask + 1;
        return;
    }
    p->ring_old[p->ring_old_n++] = old;
    prod_ring_use(p, r);
    /* Published to the consumer by the next store of tail. */
    atomic_store_explicit(&p->ring, r, memory_order_release);
}

/*
 * publish_exact() when producer @p's ring looked full: read head again,
 * and publish node @n (filled for task @task, *@id set, @was its old
 * value) in the ring if it has room now, else on
 * @p's stack (as before there was a ring). Out of line and with few
 * arguments, so that publish_exact() reaches it by a jump. Context: @p's
 * owner.
 */
static __attribute__((noinline)) int publish_full(tw_service *s, struct prod *p,
                                                  struct node *n, tw_id task,
                                                  tw_id *id, tw_id was)
{
    uint64_t gen = task & ~UINT64_C(0xffffffff);
    uint64_t due = n->t.tw__expires;
    uint64_t t = atomic_load_explicit(&p->tail, memory_order_relaxed);
    if (atomic_load_explicit(&p->ring, memory_order_relaxed) != NULL) {
        uint64_t h = atomic_load_explicit(&p->head, memory_order_acquire);
        if (p->ring_grow && h == t)
            prod_ring_grow(s, p);
        if (!p->ring_grow) {
            p->ring_end = h + p->ring_mask + 1;
            if (t != p->ring_end)
                return publish_ring(s, p, n, task, due, t, id, was);
            /* Full. A ring that may grow takes nothing more until it is
             * empty again, then grows; meanwhile, the stack. The timer
             * thread is woken to empty it now instead of at its next
             * tick (at most RING_GROWS times in a producer's life). */
            p->ring_grow = p->ring_mask + 1 < p->ring_cap;
            if (p->ring_grow)
                wake(s);
        }
    }
    atomic_store_explicit(
        &n->state, gen | ((uint64_t)p->last_fidx << ST_PAY_SHIFT) | LOC_QUEUED,
        memory_order_release);
    n->t.tw__pprev = QUEUED_NS; /* tw__next: the link */
    stack_push(&p->subq, n);
    TEST_HOOK(tw__service_pushed_hook, s);
    if (atomic_load(&s->submit.pending) & STOPPED_BIT) {
        /* What schedule_undo() puts back (see mag_take()). */
        struct reserved v = {.n = n, .st = gen};
        return schedule_undo(s, p, &v, id, was);
    }
    return wake_for_due(s, due);
}

/*
 * The end of an exact one-shot schedule by producer @p: fill node @n (FREE,
 * reserved and counted) for task @task, for the function whose
 * entry is p->last_fidx and a task due @due ns after the start (the timer
 * thread works out its tick: QUEUED_NS), set *@id, publish it in @p's
 * ring (its stack when the ring is full). Returns 0 or TW_ESHUTDOWN (see
 * schedule_fast()). Context: @p's owner.
 */
static inline __attribute__((always_inline)) int
publish_exact(tw_service *s, struct prod *p, struct node *n, tw_id task,
              void *arg, uint64_t due, tw_id *id)
{
    n->t.tw__expires = due; /* QUEUED_NS (for the ring: ring_take()) */
    n->t.tw__arg = arg;
    /* *@id before the push: the task may run at once and read it. */
    tw_id was = 0;
    if (id != NULL) {
        was = *id;
        *id = task;
    }
    uint64_t t = atomic_load_explicit(&p->tail, memory_order_relaxed);
    if (t != p->ring_end)
        return publish_ring(s, p, n, task, due, t, id, was);
    return publish_full(s, p, n, task, id, was);
}

/*
 * tw_schedule() of an exact one-shot task by producer @p: its function
 * from @p's last one or the table, a node from its magazine, a slot in its
 * own count, its own stack. Returns 0, TW_ESHUTDOWN, TW_EAGAIN (the table
 * filled up meanwhile), or 1 if the shared path must do the call.
 *
 * One atomic read-modify-write: the push. The count goes up (a plain
 * store: only @p's owner writes it) before the push, and the stop check
 * (seq_cst) comes after it. Stop sets STOPPED_BIT (seq_cst) before it
 * takes the stacks (seq_cst exchanges) and sums the counts. If the check
 * does not see the bit, stop's exchange of this stack comes after the push
 * and takes the node, and with it (release, acquire) the count. If it
 * does, the node may be on the stack after stop took it for the last
 * time: schedule_undo() takes it back.
 */
static inline int schedule_fast(tw_service *s, struct prod *p, tw_task_fn fn,
                                void *arg, uint64_t delay, tw_id *id)
{
    struct reserved v;
    int rc = 0;
    v.rec = NULL;
    if (fn == p->last_fn)
        v.fidx = p->last_fidx;
    else if ((rc = fn_find(&s->fns, fn, &v.fidx)) < 0)
        return 1; /* table full: the shared path says so */
    if (!mag_take(s, p, &v))
        return 1;
    if (rc == 1 && (rc = fn_index(&s->fns, fn, &v.fidx)) != 0) {
        mag_put(p, &v); /* the table filled up meanwhile */
        return rc;
    }
    if (fn != p->last_fn) {
        p->last_fn = fn;
        p->last_fidx = v.fidx;
        p->hot_fn = s->cfg.hot ? fn : no_fn;
    }
    atomic_store_explicit(
        &p->added, atomic_load_explicit(&p->added, memory_order_relaxed) + 1,
        memory_order_relaxed);
    TEST_HOOK(tw__service_reserved_hook, s);
    if (s->cfg.lazy) {
        struct sched r = {fn, arg, delay, 0, 0, KIND_ONCE, 0, NULL};
        tw_id was = id != NULL ? *id : 0;
        sched_publish(s, &r, &v, &p->subq, id);
        TEST_HOOK(tw__service_pushed_hook, s);
        if (atomic_load(&s->submit.pending) & STOPPED_BIT)
            return schedule_undo(s, p, &v, id, was);
        return 0;
    }
    /* sched_publish() for an exact one-shot deadline, written out: through
     * sched_publish() a tw_schedule() runs 6.5% more instructions
     * (callgrind, bench_service --throughput --exact --producers 1). */
    return publish_exact(s, p, v.n, make_id(v.st, v.idx), arg,
                         add_sat(rel_ns_deadline(s), delay), id);
}

/*
 * schedule_fast() when everything is at hand (s->cfg.hot, the function
 * that @p's last call used, a node in its magazine), from @now, the
 * CLOCK_MONOTONIC estimate: the same steps, written for the fewest
 * instructions and registers (no call on the way, so no frame; the rare
 * cases are calls in tail position). Context: @p's owner.
 */
static inline __attribute__((always_inline)) int
schedule_hot(tw_service *s, struct prod *p, void *arg, uint64_t delay,
             tw_id *id, uint64_t now)
{
    struct node *n = p->mag, *next = node_of_timer(n->t.tw__next);
    p->mag = next;
    p->mag_back--;
    /* The next node (see mag_take()) and, from the timer thread's free
     * batches, the one 4 further (node_free_batched()); prefetching NULL
     * or a stale pointer is harmless. */
    __builtin_prefetch(next, 1);
    __builtin_prefetch((const void *)n->t.tw__pprev, 1);
    /* @now is CLOCK_MONOTONIC (or the estimate, never earlier) and the
     * start a reading of it at create: not below it. */
    uint64_t due = add_sat(now - s->cfg.start_ns, delay);
    /* A node in a magazine holds its next id (node_handle()). */
    tw_id task = n->t.tw__expires;
    atomic_store_explicit(
        &p->added, atomic_load_explicit(&p->added, memory_order_relaxed) + 1,
        memory_order_relaxed);
    TEST_HOOK(tw__service_reserved_hook, s);
    return publish_exact(s, p, n, task, arg, due, id);
}

/* tw_schedule() when schedule_hot() could not be taken at once: the
 * producer further down the thread's cache, the clock from
 * tw__tsc_refresh(), a new function or an empty magazine
 * (schedule_fast()), or the shared path. */
static __attribute__((noinline)) int schedule_warm(tw_service *s, tw_task_fn fn,
                                                   void *arg, uint64_t delay_ns,
                                                   tw_id *id)
{
    /* A producer exists only on a started service (prod_claim()), so
     * this path does not read `started`, which shares a line with what
     * the timer thread writes all the time. */
    if (s != NULL && fn != NULL && s->cfg.slack_ns == 0) {
        struct prod *p = prod_get(s);
        if (p != NULL && fn == p->hot_fn && p->mag != NULL)
            return schedule_hot(s, p, arg, delay_ns, id,
                                tw__tsc_now(s->cfg.tsc));
        int rc = p != NULL ? schedule_fast(s, p, fn, arg, delay_ns, id) : 1;
        if (rc <= 0)
            return rc;
    }
    return schedule(s, fn, arg, delay_ns, s ? s->cfg.slack_ns : 0, 0, KIND_ONCE,
                    0, NULL, id);
}

/* tw_schedule() with everything at hand but the TSC estimate: the clock
 * from tw__tsc_refresh() (a stale anchor, or no estimate on this machine).
 * Out of line, so that tw_schedule() never has the call. */
static __attribute__((noinline)) int schedule_clock(tw_service *s,
                                                    struct prod *p, void *arg,
                                                    uint64_t delay_ns,
                                                    tw_id *id)
{
    return schedule_hot(s, p, arg, delay_ns, id, tw__tsc_refresh(s->cfg.tsc));
}

int tw_schedule(tw_service *s, tw_task_fn fn, void *arg, uint64_t delay_ns,
                tw_id *id)
{
    /* The thread's first cached producer only (prod_claim() fills the
     * cache from its first entry); the others take schedule_warm(). */
    struct prod *p;
    uint64_t now;
    if ((p = prod_first(s)) != NULL && fn == p->hot_fn && p->mag != NULL) {
        if (tw__tsc_fast(s->cfg.tsc, &now))
            return schedule_hot(s, p, arg, delay_ns, id, now);
        return schedule_clock(s, p, arg, delay_ns, id);
    }
    return schedule_warm(s, fn, arg, delay_ns, id);
}

int tw_schedule_window(tw_service *s, tw_task_fn fn, void *arg,
                       uint64_t earliest_ns, uint64_t latest_ns, tw_id *id)
{
    if (latest_ns < earliest_ns)
        return TW_EINVAL;
    return schedule(s, fn, arg, earliest_ns, latest_ns - earliest_ns, 0,
                    KIND_ONCE, 0, NULL, id);
}

int tw__schedule_replace(tw_service *s, tw_task_fn fn, void *arg,
                         uint64_t delay_ns, tw_id old, bool *old_cancelled,
                         tw_id *id)
{
    if (old_cancelled != NULL)
        *old_cancelled = false;
    return schedule(s, fn, arg, delay_ns, s ? s->cfg.slack_ns : 0, 0, KIND_HOLD,
                    old, old_cancelled, id);
}

int tw_schedule_fixed_rate(tw_service *s, tw_task_fn fn, void *arg,
                           uint64_t initial_delay_ns, uint64_t period_ns,
                           tw_id *id)
{
    return schedule(s, fn, arg, initial_delay_ns, 0, period_ns, KIND_RATE, 0,
                    NULL, id);
}

int tw_schedule_fixed_delay(tw_service *s, tw_task_fn fn, void *arg,
                            uint64_t initial_delay_ns, uint64_t delay_ns,
                            tw_id *id)
{
    return schedule(s, fn, arg, initial_delay_ns, 0, delay_ns, KIND_DELAY, 0,
                    NULL, id);
}

/* ------------------------------------------------------------------------ */
/* The timer thread. */

static void dispatch_flush(tw_service *s);

/*
 * A node from the submission stack. *@ctx is the timer thread's reading of
 * the relative time in ns for a lazy node's deadline (0 until first
 * needed): a reading taken after the exchange that took @n off its stack,
 * so after the schedule call that pushed it. subq_drain() resets it to 0
 * at each exchange; a reading kept across one would be earlier than the
 * calls whose nodes that exchange takes, and their tasks would run early.
 * Context: the wheel's owner.
 */
static void take_submission(tw_service *s, struct node *n, void *ctx)
{
    uint64_t *now = ctx, st;
    /* The window's width (see sched_publish()), not a link. */
    uint64_t span = (uintptr_t)n->t.tw__pprev;
    n->t.tw__pprev = NULL;
    if (!move_or_free(s, n, LOC_ARMED, ST_RELATIVE, true, &st))
        return;
    if (span == (uintptr_t)QUEUED_NS) { /* schedule_hot() */
        n->t.tw__expires = ceil_tick(s, n->t.tw__expires);
        span = 0;
    }
    if (st & ST_RELATIVE) {
        if (*now == 0)
            *now = rel_ns(s) | 1; /* never 0; 1 ns later is harmless */
        n->t.tw__expires = ceil_tick(s, add_sat(*now, n->t.tw__expires));
        TEST_HOOK(tw__service_lazy_hook, s, make_id(st, node_index(n)), *now);
    }
    uint64_t first = n->t.tw__expires;
    if (first != NEVER && span == 0)
        tw__wheel_add_any(s->timer.wheel, &n->t, first);
    else if (first != NEVER)
        tw__wheel_add_window_any(s->timer.wheel, &n->t, first, first + span);
}

/* Submission stack @k: the producers' 0 .. n-1, the shared one n. NULL if
 * producer @k has none (yet). */
static inline _Atomic(struct node *) *subq_at(tw_service *s, uint32_t k,
                                              uint32_t n)
{
    if (k == n)
        return &s->submit.subq;
    struct prod *p =
        atomic_load_explicit(&s->prods.slot[k], memory_order_acquire);
    return p != NULL ? &p->subq : NULL;
}

/* The next whole submission stack of this pass, taken with one exchange,
 * or NULL when the pass has seen them all: each stack at most once per
 * pass, so that what a thread pushed in two goes runs in two rounds, in
 * order. *@pos: the pass's position, the shared stack first (what a thread
 * pushed there before it had a producer comes before what it pushed on
 * its own), then the producers' from s->timer.rr. */
static struct node *subq_next(tw_service *s, uint32_t *pos)
{
    uint32_t n = atomic_load_explicit(&s->prods.n, memory_order_acquire);
    if (n > MAX_PRODS)
        n = MAX_PRODS;
    while (*pos <= n) {
        uint32_t k = (*pos)++;
        _Atomic(struct node *) *q =
            k == 0 ? &s->submit.subq : subq_at(s, (s->timer.rr + k - 1) % n, n);
        if (q != NULL && atomic_load(q) != NULL)
            return atomic_exchange(q, NULL);
    }
    return NULL;
}

static bool ring_any(tw_service *s);

/* Is any submission stack or ring non-empty? (seq_cst loads: the timer thread's
 * side of the wake-up handshake, see timer_sleep()). */
static bool subq_any(tw_service *s)
{
    uint32_t n = atomic_load_explicit(&s->prods.n, memory_order_acquire);
    if (n > MAX_PRODS)
        n = MAX_PRODS;
    for (uint32_t k = 0; k <= n; k++) {
        _Atomic(struct node *) *q = subq_at(s, k, n);
        if (q != NULL && atomic_load(q) != NULL)
            return true;
    }
    return ring_any(s);
}

/*
 * Take up to @max nodes off the submission stacks, each to @take: first
 * what is left of the stack taken earlier, then each stack once (a whole
 * stack, with one exchange). Returns how many. Shared by the timer thread and
 * by stop, which owns the stacks once the thread is joined.
 * @reading: NULL, or the clock reading that @take uses for deadlines,
 * reset to 0 (not read yet) at each exchange: a call may push onto a stack
 * after the reading and before that stack's exchange in the same pass.
 * What is left of an earlier round's stack was exchanged before any
 * reading of this round.
 */
static inline unsigned subq_drain(tw_service *s, unsigned max,
                                  void (*take)(tw_service *s, struct node *n,
                                               void *ctx),
                                  void *ctx, uint64_t *reading)
{
    uint32_t pos = 0;
    unsigned i;
    s->timer.rr++;
    for (i = 0; i < max; i++) {
        if (s->timer.local == NULL) {
            if ((s->timer.local = subq_next(s, &pos)) == NULL)
                break;
            if (reading != NULL)
                *reading = 0;
        }
        struct node *n = s->timer.local;
        s->timer.local = node_of_timer(n->t.tw__next);
        take(s, n, ctx);
    }
    return i;
}

/*
 * Slot @pos of ring @r, producer @p's ring when it published the slot,
 * below tail: take its node to @take as a node from a stack (LOC_QUEUED, its
 * function entry in the payload; cancelled if a cancel won, so that
 * @take frees it), or, for a task its owner cancelled, count it.
 * Returns 1 for a task its owner cancelled, else 0.
 * Context: the consumer (the timer thread, or stop once it is joined).
 */
static unsigned
ring_take(tw_service *s, struct prod *p, struct ring *r, uint32_t pos,
          void (*take)(tw_service *s, struct node *n, void *ctx), void *ctx)
{
    _Atomic uint64_t *w = &r->slot[pos];
    uint64_t v = atomic_load_explicit(w, memory_order_acquire);
    if (rs_state(v) == RS_QUEUED)
        TEST_HOOK(tw__service_ring_hook, s, rs_id(v), false);
    while (rs_state(v) == RS_QUEUED &&
           !atomic_compare_exchange_weak(w, &v, rs_word(rs_id(v), RS_TAKEN))) {
    }
    unsigned rs = rs_state(v);
    if (rs == RS_QUEUED)
        TEST_HOOK(tw__service_ring_hook, s, rs_id(v), true);
    if (rs == RS_DONE)
        return 1;
    if (rs != RS_QUEUED && rs != RS_CANCELLED)
        return 0; /* withdrawn */
    struct node *n = node_at(&s->pool, (uint32_t)rs_id(v) - 1);
    uint64_t fidx = (uintptr_t)n->t.tw__next;
    uint64_t ring_pay = p->ring_tag | pos;
    n->t.tw__pprev = QUEUED_NS; /* its deadline is in ns */
    /* From LOC_RING to LOC_QUEUED, the function's entry in place of the
     * slot's place. After RS_TAKEN a cancel may set the cancelled bit in
     * the state word meanwhile (nothing else): the exclusive or keeps it.
     * After RS_CANCELLED nobody else writes it. */
    uint64_t flip = (ring_pay ^ fidx) << ST_PAY_SHIFT | (LOC_RING ^ LOC_QUEUED);
    if (rs == RS_QUEUED)
        atomic_fetch_xor(&n->state, flip);
    else
        atomic_store(
            &n->state,
            (atomic_load_explicit(&n->state, memory_order_relaxed) ^ flip) |
                ST_CANCELLED);
    take(s, n, ctx);
    return 0;
}

/*
 * Take up to @max slots off the producers' rings, each to ring_take();
 * *@left set if some remain. Returns how many.
 * Context: the consumer.
 */
static unsigned ring_drain(tw_service *s, unsigned max,
                           void (*take)(tw_service *s, struct node *n,
                                        void *ctx),
                           void *ctx, bool *left)
{
    uint32_t np = atomic_load_explicit(&s->prods.n, memory_order_acquire);
    unsigned done = 0;
    uint64_t owner_cancelled = 0;
    for (uint32_t k = 0; k < np && k < MAX_PRODS; k++) {
        struct prod *p =
            atomic_load_explicit(&s->prods.slot[k], memory_order_acquire);
        if (p == NULL)
            continue;
        uint64_t h = atomic_load_explicit(&p->head, memory_order_relaxed);
        uint64_t t = atomic_load(&p->tail);
        /* After tail: the ring its slots up to tail went into (the owner
         * changes it only when it has found the ring empty). */
        struct ring *r = atomic_load_explicit(&p->ring, memory_order_acquire);
        if (r == NULL)
            continue;
        if (t - h > max - done) {
            t = h + (max - done);
            *left = true;
        }
        done += (unsigned)(t - h);
        uint32_t mask = r->mask;
        /* Newest first, as from a stack: the wheel fires tasks of one
         * tick in the order they were scheduled. */
        for (uint64_t i = t; i != h; i--) {
            uint32_t pos = (uint32_t)(i - 1) & mask;
            if (atomic_load_explicit(ring_done(r, mask, pos),
                                     memory_order_relaxed))
                owner_cancelled++; /* RS_DONE: no need to read the slot */
            else
                owner_cancelled += ring_take(s, p, r, pos, take, ctx);
        }
        atomic_store_explicit(&p->head, t, memory_order_release);
    }
    if (owner_cancelled != 0)
        atomic_fetch_add_explicit(&s->cancelled, owner_cancelled,
                                  memory_order_relaxed);
    return done;
}

/* Is any ring non-empty? (seq_cst loads of tail, as subq_any()). */
static bool ring_any(tw_service *s)
{
    uint32_t np = atomic_load_explicit(&s->prods.n, memory_order_acquire);
    for (uint32_t k = 0; k < np && k < MAX_PRODS; k++) {
        struct prod *p =
            atomic_load_explicit(&s->prods.slot[k], memory_order_acquire);
        if (p != NULL &&
            atomic_load(&p->tail) !=
                atomic_load_explicit(&p->head, memory_order_relaxed))
            return true;
    }
    return false;
}

/* A node marked in the cancel bitmap. Context: the wheel's owner. */
static void take_cancel(struct node *n, void *ctx)
{
    tw_service *s = ctx;
    uint64_t st = atomic_load(&n->state);
    if (ST_LOC(st) != LOC_ARMED || !(st & ST_CANCELLED))
        return; /* already freed (and maybe reused) by the wheel */
    tw_wheel_cancel(s->timer.wheel, &n->t);
    node_free_batched(&s->pool, n);
    atomic_fetch_add_explicit(&s->cancelled, 1, memory_order_relaxed);
}

/* The absolute CLOCK_MONOTONIC time of tick @target; false if none fits. */
static bool tick_deadline(const tw_service *s, uint64_t target,
                          struct timespec *ts)
{
    if (target == NEVER || target > NEVER / s->cfg.tick_ns)
        return false;
    uint64_t abs;
    if (s->cfg.clock == NULL && s->cfg.clock_id == (int32_t)CLOCK_MONOTONIC) {
        abs = add_sat(s->cfg.start_ns, target * s->cfg.tick_ns);
    } else {
        /* Another clock: wait for the time left on it, re-read after at
         * most TW__SVC_WAIT_CAP_NS on the built-in BOOTTIME. */
        uint64_t rel = rel_ns(s), want = target * s->cfg.tick_ns;
        uint64_t left = want > rel ? want - rel : 0;
        if (s->cfg.clock == NULL)
            left = tw__svc_wait_ns((clockid_t)s->cfg.clock_id, left);
        abs = add_sat(mono_ns(), left);
    }
    if (abs / 1000000000u >= (uint64_t)INT32_MAX)
        return false;
    ts->tv_sec = (time_t)(abs / 1000000000u);
    ts->tv_nsec = (long)(abs % 1000000000u);
    return true;
}

/*
 * Sleep until tick @target (@now: this round's tick), or until woken. A
 * @nap (after a round that took work, @target at most @now + 1) sleeps
 * even if more work has come meanwhile: it is taken at the next tick, in
 * one batch, instead of a round per few submissions, whose exchanges of
 * the producers' stacks and reads of their nodes race the producers for
 * those cache lines. A request due before @target wakes the thread
 * (wake_for_tick()), one pushed before sleep_until was set waits at most
 * until @target, and a cancel's record is released within the tick.
 */
static void timer_sleep(tw_service *s, uint64_t target, uint64_t now, bool nap)
{
    struct timespec ts;
    bool timed = tick_deadline(s, target, &ts);
    /* The first ns of tick target - 1, plus 1: a deadline before it has
     * a tick before target (NEVER: every finite deadline). */
    uint64_t wake_ns = target == 0 ? 0
                       : target - 1 < NEVER / s->cfg.tick_ns
                           ? (target - 1) * s->cfg.tick_ns + 1
                           : NEVER;
    pthread_mutex_lock(&s->timer.mu);
    atomic_store(&s->timer.sleep_until, target);
    atomic_store(&s->timer.wake_ns, wake_ns);
    atomic_store(&s->timer.sleep_long, target > now + 1);
    /* The producers publish in their rings without a full barrier
     * (publish_ring()): this one stands for it, before the rings are read,
     * when the sleep may be longer than the next tick. A nap, or a sleep
     * to the next tick, may miss a task published meanwhile, which then
     * waits until @target, as the comment above says. */
    if (s->cfg.fence && !nap && target > now + 1)
        tw__fence_heavy();
    if (!s->timer.kicked && !atomic_load(&s->timer.quit) &&
        (nap || (!subq_any(s) && atomic_load(&s->pool.cancel_dirty) == 0))) {
        if (timed)
            pthread_cond_timedwait(&s->timer.cv, &s->timer.mu, &ts);
        else
            pthread_cond_wait(&s->timer.cv, &s->timer.mu);
        atomic_fetch_add_explicit(&s->wakeups, 1, memory_order_relaxed);
    }
    s->timer.kicked = false;
    atomic_store(&s->timer.wake_ns, 0);
    atomic_store(&s->timer.sleep_until, 0);
    atomic_store(&s->timer.sleep_long, false);
    pthread_mutex_unlock(&s->timer.mu);
}

static void *timer_main(void *p)
{
    tw_service *s = p;
    tw_cur.s = s;
    tw_cur.id = 0;
    while (!atomic_load(&s->timer.quit)) {
        uint64_t taken_at = 0;
        atomic_fetch_add(&s->timer.round_begin, 1);
        unsigned took =
            subq_drain(s, DRAIN_BATCH, take_submission, &taken_at, &taken_at);
        bool ring_left = false;
        took += ring_drain(s, DRAIN_BATCH - took, take_submission, &taken_at,
                           &ring_left);
        bool active = took != 0;
        if (atomic_load(&s->pool.cancel_dirty) != 0) {
            cancel_drain(&s->pool, take_cancel, s);
            active = true;
        }
        TEST_HOOK(tw__service_drained_hook, s);
        s->timer.round_ns = rel_ns(s);
        s->timer.round_fresh = true;
        uint64_t now = s->timer.round_ns / s->cfg.tick_ns;
        tw_wheel_advance(s->timer.wheel, now);
        dispatch_flush(s);
        free_flush(&s->pool);
        atomic_fetch_add(&s->timer.round_end, 1);
        if (s->timer.local != NULL || ring_left ||
            (!active &&
             (subq_any(s) || atomic_load(&s->pool.cancel_dirty) != 0)))
            continue;
        uint64_t next = tw_wheel_next_expiry(s->timer.wheel);
        if (next <= now)
            continue;
        if (active && next > now + 1)
            next = now + 1; /* poll once more before sleeping long */
        timer_sleep(s, next, now, active);
    }
    free_flush(&s->pool);
    tw_cur.s = NULL;
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Dispatch and run. */

/* After the run of a task ended (its state word changed): wake the
 * tw_cancel_wait() callers. The fence orders that state change (a release
 * store on some paths) before the load of `waiters`; the waiter increments
 * `waiters` before it reads the state, so one of the two sees the other.
 * Without it the load may pass the store (x86 store buffer) and a waiter
 * that read the old state sleeps forever. */
static void notify_waiters(tw_service *s)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&s->wait.waiters) != 0) {
        pthread_mutex_lock(&s->wait.mu);
        pthread_cond_broadcast(&s->wait.cv);
        pthread_mutex_unlock(&s->wait.mu);
    }
}

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

/* The end of the run of ST_HOLD node @n (state @running): release its
 * pending slot unless a replacing call took it over. That call may have set
 * ST_DROPPED before the run's own state reading (in the window between an
 * executor's acceptance and the run), so the bit is cleared from what the
 * compare-and-swap expects: whoever sets it first decides. */
static void hold_release(tw_service *s, struct node *n, uint64_t running)
{
    running &= ~ST_DROPPED;
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
    if (timer_thread && (s->timer.round_fresh || s->cfg.lazy)) {
        s->timer.round_fresh = false;
        return s->timer.round_ns;
    }
    return rel_ns(s);
}

/* Count a run that started at @start_ns, due at tick @due_tick, in the
 * lateness histogram (which is also the count of runs). */
static void late_count(tw_service *s, uint64_t start_ns, uint64_t due_tick)
{
    uint64_t due;
    if (__builtin_mul_overflow(due_tick, s->cfg.tick_ns, &due))
        due = UINT64_MAX; /* no division on this path: it runs per task */
    uint64_t late_us = start_ns > due ? (start_ns - due) / 1000u : 0;
    atomic_fetch_add_explicit(&s->late[tw__late_bucket(late_us)], 1,
                              memory_order_relaxed);
}

/* Call the function of node @n, which has just become RUNNING (state
 * @rst), as task @id; a one-shot task's slot is released first.
 * @timer_thread: called by the timer thread (for run_start_ns()). */
static void call_task(tw_service *s, struct node *n, uint64_t rst, tw_id id,
                      bool timer_thread)
{
    bool periodic = (rst & ST_PERIODIC) != 0;
    bool hold = (rst & ST_HOLD) != 0;
    if (!periodic && !hold)
        pending_drop(s);
    void *arg =
        periodic ? ((struct periodic *)n->t.tw__arg)->arg : n->t.tw__arg;
    tw_task_fn fn = fn_at(&s->fns, rst);
    tw_service *saved_s = tw_cur.s;
    tw_id saved_id = tw_cur.id;
    tw_cur.s = s;
    tw_cur.id = id;
    uint64_t due_tick = n->t.tw__expires;
    uint64_t start = run_start_ns(s, timer_thread);
    fn(id, arg);
    tw_cur.s = saved_s;
    tw_cur.id = saved_id;
    late_count(s, start, due_tick);
    if (hold)
        hold_release(s, n, (rst & ~ST_LOC_MASK) | LOC_RUNNING);
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
    tw_id id = make_id(rst, node_index(n));
    TEST_HOOK(tw__service_started_hook, s, id);
    call_task(s, n, rst, id, inline_wheel);
    if (!(rst & ST_PERIODIC)) {
        if (inline_wheel)
            node_free_batched(&s->pool, n);
        else
            node_free(&s->pool, n);
    } else {
        uint64_t tick = ceil_tick(s, periodic_next(s, n->t.tw__arg));
        if (!inline_wheel)
            requeue(s, n, tick);
        else if (move_or_free(s, n, LOC_ARMED, 0, true, &rst) && tick != NEVER)
            tw__wheel_add_any(s->timer.wheel, &n->t, tick);
    }
    notify_waiters(s);
}

/* The wheel's callback for every node: run it here, or queue it for this
 * round's dispatch. The node's chunk names its service. Context: timer
 * thread. */
static void trampoline(tw_timer *t, void *arg)
{
    (void)arg;
    struct node *n = node_of_timer(t);
    tw_service *s = node_owner(n);
    if (s->cfg.execute == NULL && s->cfg.nexec == 0) {
        /* With the lazy clock: while a task runs here nobody takes the
         * submissions, so calls meanwhile read the clock themselves. */
        if (s->cfg.lazy)
            atomic_store_explicit(&s->timer.in_task, true,
                                  memory_order_relaxed);
        run_node(s, n, true);
        if (s->cfg.lazy)
            atomic_store_explicit(&s->timer.in_task, false,
                                  memory_order_relaxed);
        return;
    }
    uint64_t st;
    if (!move_or_free(s, n, LOC_DISPATCHED, 0, true, &st))
        return;
    atomic_fetch_add(&s->busy, 1);
    s->timer.disp_count++;
    n->t.tw__next = NULL;
    if (s->timer.disp_last != NULL)
        s->timer.disp_last->t.tw__next = &n->t;
    else
        s->timer.disp_first = n;
    s->timer.disp_last = n;
}

/* Hand this round's due nodes to the executors. Context: timer thread. */
static void dispatch_flush(tw_service *s)
{
    struct node *first = s->timer.disp_first;
    if (first == NULL)
        return;
    s->timer.disp_first = s->timer.disp_last = NULL;
    /* Counted before any executor can take one (and count it down). */
    atomic_fetch_add_explicit(&s->backlog, s->timer.disp_count,
                              memory_order_relaxed);
    s->timer.disp_count = 0;
    if (s->cfg.execute == NULL) {
        tw__exec_push(&s->exec, &first->t);
        return;
    }
    while (first != NULL) {
        struct node *n = first;
        first = node_of_timer(n->t.tw__next);
        uint64_t st = atomic_load(&n->state);
        s->cfg.execute(s, make_id(st, node_index(n)), s->cfg.execute_ctx);
    }
}

static void run_dispatched(tw_service *s, struct node *n)
{
    TEST_HOOK(tw__service_accepted_hook, s,
              make_id(atomic_load(&n->state), node_index(n)));
    run_node(s, n, false);
    atomic_fetch_sub(&s->busy, 1);
}

/* The executor pool's take(): an executor has unlinked @job and holds the
 * pool's mutex. It leaves DISPATCHED there, so that a cancel
 * (drop_queued()) never reads a node that an executor may free (and a
 * producer reuse) meanwhile: under the mutex, DISPATCHED means not taken.
 * A node cancelled while queued is freed here, still under the mutex. */
static bool exec_take(tw_timer *job, void *ctx)
{
    tw_service *s = ctx;
    struct node *n = node_of_timer(job);
    atomic_fetch_sub_explicit(&s->backlog, 1, memory_order_relaxed);
    TEST_HOOK(tw__service_xpop_hook, s,
              make_id(atomic_load(&n->state), node_index(n)));
    uint64_t st;
    if (move_or_free(s, n, LOC_RUNNING, 0, false, &st))
        return true;
    atomic_fetch_sub(&s->busy, 1);
    return false;
}

/* The executor pool's run(). */
static void exec_run(tw_timer *job, void *ctx)
{
    run_dispatched(ctx, node_of_timer(job));
}

void tw_service_run(tw_service *s, tw_id job)
{
    /* Only a caller-supplied executor receives jobs. On a pool service a
     * DISPATCHED node is linked in the pool's queue, which only the pool
     * may take it from. */
    if (s == NULL || s->cfg.execute == NULL)
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

/* ------------------------------------------------------------------------ */
/* Cancel. */

struct drop {
    tw_service *s;
    tw_id id;
};

/* Is @job still task @id, waiting for an executor? Under the pool's mutex,
 * which executors hold to leave DISPATCHED. */
static bool still_dispatched(tw_timer *job, void *arg)
{
    struct drop *d = arg;
    uint64_t st = atomic_load(&node_of_timer(job)->state);
    TEST_HOOK(tw__service_xdrop_hook, d->s, d->id);
    return ST_GEN(st) == ST_GEN(d->id) && ST_LOC(st) == LOC_DISPATCHED;
}

/*
 * After tw_cancel() won on node @n of task @id while it was DISPATCHED:
 * if it still waits in the executor queue, take it out and free it now
 * rather than when an executor gets to it (which may be long when every
 * executor runs a long task). A node not in the queue (being flushed) is
 * freed by its owner. Out of line, so that the common cancel keeps a small
 * stack frame.
 */
__attribute__((noinline)) static void drop_queued(tw_service *s, struct node *n,
                                                  tw_id id)
{
    struct drop d = {s, id};
    if (!tw__exec_remove(&s->exec, &n->t, still_dispatched, &d))
        return;
    atomic_fetch_sub_explicit(&s->backlog, 1, memory_order_relaxed);
    node_free(&s->pool, n);
    atomic_fetch_add_explicit(&s->cancelled, 1, memory_order_relaxed);
    atomic_fetch_sub(&s->busy, 1);
}

/* What a cancel does once it has won on node @n of task @id, which was at
 * @loc: release the pending slot (@drop), mark the node for the timer
 * thread, wake it. Out of line, so that cancel_id() keeps no stack frame
 * in its common case. */
static __attribute__((noinline)) bool
cancel_won(tw_service *s, struct node *n, tw_id id, unsigned loc, bool drop)
{
    if (drop) {
        struct prod *p = prod_get(s);
        if (p != NULL)
            prod_drop(p);
        else
            pending_drop(s);
    }
    if (loc == LOC_ARMED)
        cancel_mark(&s->pool, n, (uint32_t)id - 1);
    if (loc == LOC_ARMED || loc == LOC_QUEUED || loc == LOC_RING)
        wake_for_cancel(s);
    if (loc == LOC_DISPATCHED && s->cfg.nexec != 0)
        drop_queued(s, n, id);
    return true;
}

/* Node @n (released), one more than the magazine of producer @p keeps:
 * onto its spill chain, which goes to the pool's free list as a batch
 * once it holds MAG_NODES. */
static __attribute__((noinline)) void ring_spill(tw_service *s, struct prod *p,
                                                 struct node *n)
{
    n->t.tw__next = p->spill != NULL ? &p->spill->t : NULL;
    p->spill = n;
    if (++p->spill_n == MAG_NODES) {
        free_push(&s->pool, n);
        p->spill = NULL;
        p->spill_n = 0;
    }
}

/* Node @n of task @id, cancelled in producer @p's ring by its owner (the
 * caller), is @p's again: the consumer will not read it. A new
 * generation, so that the id is stale, and into the magazine (or, beyond
 * MAG_NODES taken back, towards the pool: ring_spill()). */
static inline void ring_reclaim(tw_service *s, struct prod *p, struct node *n,
                                tw_id id)
{
    node_release_at(n, (uint32_t)id - 1, id);
    if (p->mag_back >= (int32_t)MAG_NODES) {
        ring_spill(s, p, n);
        return;
    }
    p->mag_back++;
    n->t.tw__next = p->mag != NULL ? &p->mag->t : NULL;
    p->mag = n;
}

/* Cancel task @id, whose node @n read @st, by its state word: true if
 * this call did. @drop: release its pending slot (false: a replacing
 * schedule call takes it over). */
static inline __attribute__((always_inline)) bool
cancel_state(tw_service *s, struct node *n, tw_id id, uint64_t st, bool drop)
{
    unsigned loc;
    do {
        /* Another generation, or cancelled already. */
        if (((st ^ id) >> 32 | (st & ST_CANCELLED)) != 0)
            return false;
        loc = ST_LOC(st);
        if (loc != LOC_QUEUED &&
            (loc == LOC_FREE || (loc == LOC_RUNNING && !(st & ST_PERIODIC))))
            return false;
    } while (!atomic_compare_exchange_weak(&n->state, &st, st | ST_CANCELLED));
    /* The common case without a call: a task the timer thread has not
     * taken yet, cancelled by a thread with a producer, while the timer
     * thread does not sleep long (wake_for_cancel() would do nothing). */
    if ((loc == LOC_QUEUED || loc == LOC_RING) && drop) {
        struct prod *p = prod_first(s);
        if (p == NULL)
            p = prod_cached(s);
        if (p != NULL) {
            prod_drop(p);
            if (!atomic_load(&s->timer.sleep_long))
                return true;
            return cancel_won(s, n, id, loc, false);
        }
    }
    return cancel_won(s, n, id, loc, drop);
}

/*
 * Cancel task @id, whose node @n read @st (LOC_RING), in its ring slot:
 * the slot's compare-and-swap decides against the consumer and other
 * cancels. The owner of the ring takes the node straight back into its
 * magazine (RS_DONE); another thread leaves it to the consumer
 * (RS_CANCELLED), which frees it within a tick. Once the consumer has
 * taken the node (RS_TAKEN), its state word decides, as for a node from a
 * stack. Out of line: cancel_id() does the owner's common case.
 */
static __attribute__((noinline)) bool
cancel_ring(tw_service *s, struct node *n, tw_id id, uint64_t st, bool drop)
{
    if (((st ^ id) >> 32 | (st & ST_CANCELLED)) != 0)
        return false;
    uint32_t pay = ST_PAY(st);
    struct prod *rp = atomic_load_explicit(&s->prods.slot[pay >> RING_BITS],
                                           memory_order_acquire);
    TEST_HOOK(tw__service_cancel_ring_hook, s, id);
    /* The ring the task went into, or a later one (then its slot is not
     * the task's: the consumer has taken it). */
    struct ring *r = atomic_load_explicit(&rp->ring, memory_order_acquire);
    if ((pay & RING_MASK) > r->mask)
        return cancel_state(s, n, id, atomic_load(&n->state), drop);
    _Atomic uint64_t *w = &r->slot[pay & RING_MASK];
    uint64_t v = atomic_load(w);
    if (v == rs_word(id, RS_QUEUED)) {
        struct prod *p = prod_first(s);
        if (p == NULL)
            p = prod_cached(s);
        bool mine = p == rp;
        if (atomic_compare_exchange_strong(
                w, &v, rs_word(id, mine ? RS_DONE : RS_CANCELLED))) {
            if (drop && p != NULL)
                prod_drop(p);
            else if (drop)
                pending_drop(s);
            if (mine)
                ring_reclaim(s, p, n, id);
            else
                wake_for_cancel(s);
            return true;
        }
    }
    if (rs_id(v) == id && rs_state(v) != RS_TAKEN)
        return false; /* cancelled or withdrawn already */
    /* Taken (or the slot moved on after the consumer took the node, whose
     * state word then reads another location). */
    return cancel_state(s, n, id, atomic_load(&n->state), drop);
}

/* Cancel task @id; true if this call did. @drop: release its pending slot
 * (false: a replacing schedule call takes it over). */
static inline __attribute__((always_inline)) bool cancel_id(tw_service *s,
                                                            tw_id id, bool drop)
{
    uint64_t st;
    struct node *n = lookup(s, id, &st);
    if (n == NULL)
        return false;
    if (ST_LOC(st) != LOC_RING)
        return cancel_state(s, n, id, st, drop);
    /* The common case of a schedule+cancel pair: the thread that owns the
     * ring, before the consumer took the task. One compare-and-swap on
     * the slot, which the call that scheduled the task wrote, and the
     * node goes back to the magazine. */
    struct prod *p = prod_first(s);
    uint32_t pay = ST_PAY(st);
    if (p != NULL && drop && (pay & ~RING_MASK) == p->ring_tag) {
        /* The slot names the task (generation and index, RS_QUEUED) only
         * while the task waits in it: the swap checks the id as well. */
        uint32_t pos = pay & RING_MASK; /* within this ring: rings grow */
        uint64_t v = rs_word(id, RS_QUEUED);
        if (atomic_compare_exchange_strong(&p->ring_slot[pos], &v,
                                           rs_word(id, RS_DONE))) {
            atomic_store_explicit(&p->ring_byte[pos], 1, memory_order_relaxed);
            prod_drop(p);
            ring_reclaim(s, p, n, id);
            return true;
        }
    }
    return cancel_ring(s, n, id, st, drop);
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
    atomic_fetch_add(&s->wait.waiters, 1);
    pthread_mutex_lock(&s->wait.mu);
    while (still_running(s, id))
        pthread_cond_wait(&s->wait.cv, &s->wait.mu);
    pthread_mutex_unlock(&s->wait.mu);
    atomic_fetch_sub(&s->wait.waiters, 1);
    return r;
}

/* The sum of every producer's added (@dropped false) or dropped count. */
static uint64_t prods_sum(tw_service *m, bool dropped)
{
    uint64_t v = 0;
    uint32_t n = atomic_load_explicit(&m->prods.n, memory_order_acquire);
    for (uint32_t k = 0; k < n && k < MAX_PRODS; k++) {
        struct prod *p =
            atomic_load_explicit(&m->prods.slot[k], memory_order_acquire);
        if (p != NULL)
            v += atomic_load(dropped ? &p->dropped : &p->added);
    }
    return v;
}

/* The pending count: reservations (the shared count and every producer's
 * added) less releases (the shared released and every producer's
 * dropped); without max_pending all of these only grow. Releases are read
 * first, all seq_cst: a release is ordered after its reservation, which
 * may be another producer's, so every release read has its reservation
 * read too, and a reservation still held when the releases are read is
 * counted. The sum is thus never below the reservations held throughout
 * the call, and never wraps: 0 only when nothing is pending. Stop's side
 * of the handshake in schedule_fast() is its exchange of each producer's
 * stack, after which it reads the added counts.
 * With max_pending, only the shared count moves, down as well. */
uint64_t tw_service_pending(const tw_service *s)
{
    if (s == NULL)
        return 0;
    tw_service *m = (tw_service *)s;
    if (atomic_load(&m->life.stopped))
        return 0;
    uint64_t out = atomic_load(&m->submit.released) + prods_sum(m, true);
    TEST_HOOK(tw__service_sum_hook, m);
    uint64_t in =
        (atomic_load(&m->submit.pending) & ~STOPPED_BIT) + prods_sum(m, false);
    return in - out;
}

/* ------------------------------------------------------------------------ */
/* Life: create, start, stop, destroy. */

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

/* The service's own mutexes and condition variables (the executor pool
 * has its own). */
enum { N_MUTEX = 3, N_COND = 2 };
struct syncs {
    pthread_mutex_t *mu[N_MUTEX];
    pthread_cond_t *cv[N_COND];
};

static struct syncs syncs_of(tw_service *s)
{
    return (struct syncs){{&s->timer.mu, &s->wait.mu, &s->life.stop_mu},
                          {&s->timer.cv, &s->wait.cv}};
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

/* The sizes a config asks for, defaults applied and rounded up. */
struct sizes {
    uint64_t tick, slots;
    uint32_t nfns;
    clockid_t clock_id;
};

/* 0 and *@z, or TW_EINVAL if a field of @cfg is out of range. */
static int config_sizes(const tw_service_config *cfg, struct sizes *z)
{
    if (tw__svc_clock_id(cfg->clock_id, &z->clock_id) != 0 ||
        (cfg->clock != NULL && cfg->clock_id != 0))
        return TW_EINVAL;
    uint64_t tick = cfg->tick_ns ? cfg->tick_ns : UINT64_C(1000000);
    uint64_t slots = cfg->ticks_per_wheel ? cfg->ticks_per_wheel : 512;
    uint64_t maxfn = cfg->max_callbacks ? cfg->max_callbacks : 1024;
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
    z->tick = tick;
    z->slots = slots;
    z->nfns = (uint32_t)p2;
    return 0;
}

/* Fill the new service's configuration. */
static void config_apply(tw_service *s, const tw_service_config *cfg,
                         const struct sizes *z)
{
    s->cfg.tick_ns = z->tick;
    s->cfg.max_pending = cfg->max_pending;
    s->cfg.clock = cfg->clock;
    s->cfg.clock_ctx = cfg->clock_ctx;
    s->cfg.clock_id = (int32_t)z->clock_id;
    s->cfg.slack_ns = cfg->slack_ns;
    s->cfg.execute = cfg->execute;
    s->cfg.execute_ctx = cfg->execute_ctx;
    s->cfg.nexec = cfg->executor_threads;
    s->cfg.lazy = (cfg->flags & TW_SERVICE_LAZY_CLOCK) != 0;
    s->cfg.tick_recip = tw__recip(z->tick);
    if (cfg->clock == NULL && z->clock_id == CLOCK_MONOTONIC)
        s->cfg.tsc = tw__tsc_mono();
    s->cfg.hot = s->cfg.tsc != NULL && !s->cfg.lazy && s->cfg.slack_ns == 0 &&
                 s->cfg.max_pending == 0;
    s->cfg.fence = z->tick >= FENCE_MIN_TICK_NS && tw__fence_ready();
    s->cfg.start_ns = s->cfg.clock ? s->cfg.clock(s->cfg.clock_ctx)
                                   : tw__clock_ns((clockid_t)s->cfg.clock_id);
    atomic_fetch_add(&s->mem, sizeof(*s));
}

int(tw_service_create)(tw_service **out, const tw_service_config *cfg)
{
    static const tw_service_config defaults = {0};
    static _Atomic uint64_t serial;
    struct sizes z;
    if (out == NULL)
        return TW_EINVAL;
    if (cfg == NULL)
        cfg = &defaults;
    int rc = config_sizes(cfg, &z);
    if (rc != 0)
        return rc;
    tw_service *s = tw__calloc(1, sizeof(*s));
    if (s == NULL)
        return TW_ENOMEM;
    uint64_t sn = atomic_fetch_add(&serial, 1) + 1;
    uint32_t salt =
        (uint32_t)sn * UINT32_C(0x85EBCA6B) ^ (uint32_t)(uintptr_t)s;
    s->prods.serial = sn;
    tw__pool_init(&s->pool, s, salt);
    s->fns.fns = tw__calloc((size_t)z.nfns, sizeof(*s->fns.fns));
    if (s->fns.fns == NULL) {
        rc = TW_ENOMEM;
        goto fail_pool;
    }
    s->fns.mask = z.nfns - 1;
    atomic_fetch_add(&s->mem, (uint64_t)z.nfns * sizeof(*s->fns.fns));
    rc = tw__exec_init(&s->exec, cfg->executor_threads, exec_take, exec_run, s);
    if (rc != 0)
        goto fail_exec;
    s->cfg.wcfg.slots = (uint32_t)z.slots;
    s->cfg.wcfg.levels = cfg->levels;
    if ((rc = tw_wheel_create(&s->timer.wheel, &s->cfg.wcfg, 0)) != 0)
        goto fail_wheel;
    tw__wheel_set_fire(s->timer.wheel, trampoline, s); /* see struct node */
    if ((rc = sync_init(s)) != 0)
        goto fail_sync;
    config_apply(s, cfg, &z);
    reg_add(s);
    *out = s;
    return 0;

fail_sync:
    tw_wheel_destroy(s->timer.wheel);
fail_wheel:
    tw__exec_destroy(&s->exec);
fail_exec:
    tw__free((void *)s->fns.fns);
fail_pool:
    tw__free(s);
    return rc;
}

/* Stop and join the timer thread, then the executors (they finish the
 * tasks already due). */
static void join_threads(tw_service *s)
{
    atomic_store(&s->timer.quit, true);
    wake(s);
    pthread_join(s->timer.thread, NULL);
    tw__exec_stop(&s->exec);
}

int tw_service_start(tw_service *s)
{
    if (s == NULL)
        return TW_EINVAL;
    /* Checked before the lock too: stop holds it while it hands tasks
     * back, and its callback may call us. */
    if (atomic_load(&s->submit.pending) & STOPPED_BIT)
        return TW_ESHUTDOWN;
    /* Started: a no-op, and without the lock. A task calling us must not
     * wait for a stop that has taken the lock and waits for the task. */
    if (atomic_load_explicit(&s->timer.started, memory_order_acquire))
        return 0;
    pthread_mutex_lock(&s->life.stop_mu);
    int rc = 0;
    if (atomic_load(&s->submit.pending) & STOPPED_BIT)
        rc = TW_ESHUTDOWN;
    if (rc != 0 || atomic_load(&s->timer.started))
        goto out;
    rc = tw__exec_start(&s->exec);
    if (rc == 0) {
        rc = pthread_create(&s->timer.thread, NULL, timer_main, s);
        if (rc == 0) {
            atomic_store_explicit(&s->timer.started, true,
                                  memory_order_release);
            goto out;
        }
        tw__exec_stop(&s->exec);
    }
    rc = rc == ENOMEM ? TW_ENOMEM : TW_EAGAIN;
out:
    pthread_mutex_unlock(&s->life.stop_mu);
    return rc;
}

/* Where stop hands tasks back, and how many it handed. */
struct handing {
    tw_unprocessed_fn fn;
    void *ctx;
    uint64_t handed;
};

/* Hand node @n (claimed: cancelled bit set by us) back, then free it. */
static void hand_back(tw_service *s, struct node *n, uint64_t st,
                      struct handing *h)
{
    pending_drop(s);
    if (h->fn != NULL) {
        void *arg = n->t.tw__arg;
        if (st & ST_PERIODIC)
            arg = ((struct periodic *)arg)->arg;
        h->fn(make_id(st, node_index(n)), fn_at(&s->fns, st), arg, h->ctx);
    }
    node_free(&s->pool, n);
    atomic_fetch_add_explicit(&s->handed, 1, memory_order_relaxed);
    h->handed++;
}

/* Claim owned node @n for stop and hand it back, unless a cancel had won
 * (then free it): the cancelled bit decides. */
static void stop_take(tw_service *s, struct node *n, void *ctx)
{
    uint64_t v = atomic_load(&n->state);
    do {
        if (v & ST_CANCELLED) {
            node_free(&s->pool, n);
            atomic_fetch_add_explicit(&s->cancelled, 1, memory_order_relaxed);
            return;
        }
    } while (!atomic_compare_exchange_weak(&n->state, &v, v | ST_CANCELLED));
    hand_back(s, n, v, ctx);
}

static void ignore_cancel(struct node *n, void *ctx)
{
    (void)n;
    (void)ctx;
}

/* Everything in the wheel, cancelled or not; nodes beyond fresh were never
 * used. Then the cancel marks, which are all stale now. */
static void stop_wheel(tw_service *s, struct handing *h)
{
    uint32_t fresh = atomic_load(&s->pool.fresh);
    for (uint32_t i = 0; i < fresh; i++) {
        struct node *n = node_at(&s->pool, i);
        if (ST_LOC(atomic_load(&n->state)) != LOC_ARMED)
            continue;
        tw_wheel_cancel(s->timer.wheel, &n->t);
        stop_take(s, n, h);
    }
    cancel_drain(&s->pool, ignore_cancel, NULL);
}

/* The submission stack, until every accepted task is accounted for: a
 * producer may still be between its reservation and its push. */
static void stop_submissions(tw_service *s, struct handing *h)
{
    for (;;) {
        bool left = false;
        if (subq_drain(s, UINT_MAX, stop_take, h, NULL) != 0 ||
            ring_drain(s, UINT_MAX, stop_take, h, &left) != 0)
            continue;
        if (tw_service_pending(s) == 0)
            break;
        sched_yield();
    }
}

int tw_service_stop(tw_service *s, tw_unprocessed_fn fn, void *ctx)
{
    if (s == NULL)
        return TW_EINVAL;
    if (tw_cur.s == s)
        return TW_EDEADLK;
    pthread_mutex_lock(&s->life.stop_mu);
    if (s->life.stop_done) {
        pthread_mutex_unlock(&s->life.stop_mu);
        return 0;
    }
    atomic_fetch_or(&s->submit.pending, STOPPED_BIT);
    /* For the producers' rings (publish_ring()): a schedule either sees
     * the bit or has published its slot before the rings are drained. */
    if (s->cfg.fence)
        tw__fence_heavy();
    if (atomic_load(&s->timer.started)) {
        join_threads(s);
        /* A caller-supplied executor: wait for the jobs it holds. */
        while (atomic_load(&s->busy) != 0) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
    struct handing h = {fn, ctx, 0};
    /* While @fn runs, this thread counts as one of the service's: a stop
     * from the callback returns TW_EDEADLK. */
    tw_service *saved_s = tw_cur.s;
    tw_cur.s = s;
    stop_wheel(s, &h);
    stop_submissions(s, &h);
    tw_cur.s = saved_s;
    s->life.stop_done = true;
    atomic_store(&s->life.stopped, true);
    pthread_mutex_unlock(&s->life.stop_mu);
    return h.handed > INT_MAX ? INT_MAX : (int)h.handed;
}

int tw_service_destroy(tw_service *s)
{
    if (s == NULL)
        return 0;
    /* From a task, the timer thread (a caller-supplied executor's callback)
     * or stop's callback: stop would wait for this very thread and the
     * frees below would pull the service from under it. */
    if (tw_cur.s == s)
        return TW_EDEADLK;
    tw_service_stop(s, NULL, NULL);
    reg_remove(s);
    for (uint32_t k = 0; k < atomic_load(&s->prods.n) && k < MAX_PRODS; k++) {
        struct prod *p = atomic_load(&s->prods.slot[k]);
        if (p != NULL) {
            tw__free(atomic_load(&p->ring));
            for (unsigned i = 0; i < p->ring_old_n; i++)
                tw__free(p->ring_old[i]);
        }
        tw__free(p);
    }
    tw__pool_destroy(&s->pool);
    tw__free((void *)s->fns.fns);
    sync_destroy(s, N_MUTEX, N_COND);
    tw__exec_destroy(&s->exec);
    tw_wheel_destroy(s->timer.wheel);
    tw__free(s);
    return 0;
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
    st.nodes = atomic_load_explicit(&m->pool.nodes, memory_order_relaxed);
    st.memory_bytes = atomic_load_explicit(&m->pool.mem, memory_order_relaxed) +
                      atomic_load_explicit(&m->mem, memory_order_relaxed);
    st.backlog = atomic_load_explicit(&m->backlog, memory_order_relaxed);
    tw__svc_stats_out(out, out_size, &st);
    return 0;
}

void(tw_service_get_stats)(const tw_service *s, tw_service_stats *out)
{
    (void)tw_service_get_stats_sized(s, out,
                                     offsetof(tw_service_stats, backlog));
}

/* ------------------------------------------------------------------------ */
/* Test hooks (internal.h). */

void tw__service_kick(tw_service *s)
{
    wake(s);
}

void tw__service_sync(tw_service *s)
{
    /* Rounds are numbered from 1; round r0 + 1 begins after this call. */
    uint64_t r0 = atomic_load(&s->timer.round_begin);
    wake(s);
    while ((atomic_load(&s->timer.round_end) < r0 + 1 ||
            atomic_load(&s->busy) != 0) &&
           atomic_load(&s->timer.started) && !atomic_load(&s->timer.quit)) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

uint32_t tw__service_waiters(tw_service *s)
{
    return atomic_load(&s->wait.waiters);
}

uint32_t tw__service_producers(tw_service *s, uint32_t *owned)
{
    uint32_t n = atomic_load(&s->prods.n), o = 0;
    n = n < MAX_PRODS ? n : MAX_PRODS;
    for (uint32_t k = 0; k < n; k++) {
        struct prod *p = atomic_load(&s->prods.slot[k]);
        o += p != NULL && atomic_load(&p->owned);
    }
    if (owned != NULL)
        *owned = o;
    return n;
}

size_t tw__service_node_size(void)
{
    return sizeof(struct node);
}
