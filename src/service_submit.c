/* SPDX-License-Identifier: MIT */
/*
 * src/service_submit.c - a producer's tw_schedule(): the submission path of
 * a thread with a producer of its own (struct prod, src/service_impl.h),
 * and its clock.
 *
 * Read from the top, it follows one call: tw_schedule() finds the thread's
 * first producer, its last task function and a record in its magazine at
 * hand and reads the TSC estimate of the clock (src/service_clock.h), then
 * prod_schedule_cached() fills the record, publish_exact() and
 * publish_ring() (src/service_ring.h) put it in the producer's ring and
 * wake_for_due() (src/service_impl.h) wakes the timer thread if it sleeps
 * past the task's tick. Below them the
 * calls that cannot take that path, each a step further from it:
 *
 *   prod_schedule_refresh()   the clock from tw__tsc_refresh()
 *   schedule_find_producer()  a producer further down the thread's cache,
 *                             or a new one (src/service_producer.c)
 *   prod_schedule()           a new function, an empty magazine, the lazy
 *                             clock
 *   tw__svc_schedule_shared() everything else (src/service.c)
 *
 * and the ring's full and stop cases (publish_full(), schedule_undo();
 * the ring itself is src/service_ring.c).
 */

#define _POSIX_C_SOURCE 200809L

#include "twheel/service.h"

#include <stdatomic.h>

#include "fence.h"
#include "service_impl.h"
#include "service_prod.h"
#include "service_ring.h"

/* Defined below, in the order a call meets them. */
static inline __attribute__((always_inline)) int
prod_schedule_cached(tw_service *s, struct prod *p, void *arg, uint64_t delay,
                     tw_id *id, uint64_t now);
static inline __attribute__((always_inline)) int
publish_exact(tw_service *s, struct prod *p, struct node *n, tw_id task,
              void *arg, uint64_t due, tw_id *id);
static __attribute__((noinline)) int
prod_schedule_refresh(tw_service *s, struct prod *p, void *arg,
                      uint64_t delay_ns, tw_id *id);
static __attribute__((noinline)) int
schedule_find_producer(tw_service *s, tw_task_fn fn, void *arg,
                       uint64_t delay_ns, tw_id *id);
static inline int prod_schedule(tw_service *s, struct prod *p, tw_task_fn fn,
                                void *arg, uint64_t delay, tw_id *id);
static inline bool mag_take(tw_service *s, struct prod *p, struct reserved *v);
static __attribute__((noinline)) bool mag_refill(tw_service *s, struct prod *p);
static __attribute__((noinline)) int publish_full(tw_service *s, struct prod *p,
                                                  struct node *n, tw_id task,
                                                  tw_id *id, tw_id was);
static __attribute__((noinline)) int schedule_undo(tw_service *s,
                                                   struct prod *p,
                                                   const struct reserved *v,
                                                   tw_id *id, tw_id was);

int tw_schedule(tw_service *s, tw_task_fn fn, void *arg, uint64_t delay_ns,
                tw_id *id)
{
    /* The thread's first cached producer only (tw__svc_prod_claim() fills the
     * cache from its first entry); the others take schedule_find_producer(). */
    struct prod *p;
    uint64_t now;
    if ((p = prod_first(s)) != NULL && fn == p->hot_fn && p->mag != NULL) {
        if (tw__tsc_fast(s->cfg.tsc, &now))
            return prod_schedule_cached(s, p, arg, delay_ns, id, now);
        return prod_schedule_refresh(s, p, arg, delay_ns, id);
    }
    return schedule_find_producer(s, fn, arg, delay_ns, id);
}

/*
 * prod_schedule() when everything is at hand (s->cfg.hot, the function
 * that @p's last call used, a node in its magazine), from @now, the
 * CLOCK_MONOTONIC estimate: the same steps, written for the fewest
 * instructions and registers (no call on the way, so no frame; the rare
 * cases are calls in tail position). Context: @p's owner.
 */
static inline __attribute__((always_inline)) int
prod_schedule_cached(tw_service *s, struct prod *p, void *arg, uint64_t delay,
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

/*
 * The end of an exact one-shot schedule by producer @p: fill node @n (FREE,
 * reserved and counted) for task @task, for the function whose
 * entry is p->last_fidx and a task due @due ns after the start (the timer
 * thread works out its tick: QUEUED_NS), set *@id, publish it in @p's
 * ring (its stack when the ring is full). Returns 0 or TW_ESHUTDOWN (see
 * prod_schedule()). Context: @p's owner.
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

/* tw_schedule() with everything at hand but the TSC estimate: the clock
 * from tw__tsc_refresh() (a stale anchor, or no estimate on this machine).
 * Out of line, so that tw_schedule() never has the call. */
static __attribute__((noinline)) int
prod_schedule_refresh(tw_service *s, struct prod *p, void *arg,
                      uint64_t delay_ns, tw_id *id)
{
    return prod_schedule_cached(s, p, arg, delay_ns, id,
                                tw__tsc_refresh(s->cfg.tsc));
}

/* tw_schedule() when prod_schedule_cached() could not be taken at once: the
 * producer further down the thread's cache, the clock from
 * tw__tsc_refresh(), a new function or an empty magazine
 * (prod_schedule()), or the shared path. */
static __attribute__((noinline)) int
schedule_find_producer(tw_service *s, tw_task_fn fn, void *arg,
                       uint64_t delay_ns, tw_id *id)
{
    /* A producer exists only on a started service (tw__svc_prod_claim()), so
     * this path does not read `started`, which shares a line with what
     * the timer thread writes all the time. */
    if (s != NULL && fn != NULL && s->cfg.slack_ns == 0) {
        struct prod *p = prod_get(s);
        if (p != NULL && fn == p->hot_fn && p->mag != NULL)
            return prod_schedule_cached(s, p, arg, delay_ns, id,
                                        tw__tsc_now(s->cfg.tsc));
        int rc = p != NULL ? prod_schedule(s, p, fn, arg, delay_ns, id) : 1;
        if (rc <= 0)
            return rc;
    }
    return tw__svc_schedule_shared(s, fn, arg, delay_ns,
                                   s ? s->cfg.slack_ns : 0, 0, KIND_ONCE, 0,
                                   NULL, id);
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
static inline int prod_schedule(tw_service *s, struct prod *p, tw_task_fn fn,
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
    if (rc == 1 && (rc = tw__svc_fn_index(&s->fns, fn, &v.fidx)) != 0) {
        mag_put(p, &v); /* the table filled up meanwhile */
        return rc;
    }
    if (fn != p->last_fn) {
        p->last_fn = fn;
        p->last_fidx = v.fidx;
        p->hot_fn = s->cfg.hot ? fn : tw__svc_no_fn;
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
            tw__svc_ring_grow(s, p);
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
 * Stop has begun after prod_schedule() pushed node @v->n on producer @p's
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
