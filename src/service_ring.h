/* SPDX-License-Identifier: MIT */
/*
 * src/service_ring.h - a producer's ring (struct ring, its slots and their
 * states: src/service_impl.h), the operations on every call, inline: its
 * owner publishes a task in it (publish_ring(), from tw_schedule()) and
 * cancels a task still in it (ring_cancel_own(), from tw_cancel()); the
 * consumer, the timer thread or stop once it has joined the thread, takes
 * the new slots (ring_drain(), inline so that it calls its take function
 * directly). The rare operations are src/service_ring.c.
 */
#ifndef TWHEEL_SERVICE_RING_H
#define TWHEEL_SERVICE_RING_H

#include "fence.h"
#include "service_impl.h"
#include "service_prod.h"

/* The owner's side. */

/*
 * Publish node @n (filled by publish_exact() for task @task, its
 * function's entry in p->last_fidx, *@id already set, @was its old
 * value) in slot @t of producer @p's ring, which has room, then the stop
 * check and the wake-up. The slot is written before the state word, so
 * that whoever sees LOC_RING sees the slot; the store of tail publishes
 * both. Between it and the reads of the stop bit and wake_ns (see
 * prod_schedule()) a full barrier is needed: the exchange of tail, or,
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
        return tw__svc_ring_undo(p, n, task, pos, id, was);
    return wake_for_due(s, due);
}

/* Node @n of task @id, cancelled in producer @p's ring by its owner (the
 * caller), is @p's again: the consumer will not read it. A new
 * generation, so that the id is stale, and into the magazine (or, beyond
 * MAG_NODES taken back, towards the pool: tw__svc_ring_spill()). */
static inline void ring_reclaim(tw_service *s, struct prod *p, struct node *n,
                                tw_id id)
{
    node_release_at(n, (uint32_t)id - 1, id);
    if (p->mag_back >= (int32_t)MAG_NODES) {
        tw__svc_ring_spill(s, p, n);
        return;
    }
    p->mag_back++;
    n->t.tw__next = p->mag != NULL ? &p->mag->t : NULL;
    p->mag = n;
}

/*
 * Cancel task @id, whose node @n waits in slot @pos of producer @p's ring,
 * as the ring's owner (the common case of a schedule+cancel pair): one
 * compare-and-swap on the slot, which the call that scheduled the task
 * wrote, and the node goes back to the magazine. The slot names the task
 * (generation and index, RS_QUEUED) only while the task waits in it: the
 * swap checks the id as well. False if it no longer waits there.
 * Context: @p's owner.
 */
static inline __attribute__((always_inline)) bool
ring_cancel_own(tw_service *s, struct prod *p, struct node *n, tw_id id,
                uint32_t pos)
{
    uint64_t v = rs_word(id, RS_QUEUED);
    if (!atomic_compare_exchange_strong(&p->ring_slot[pos], &v,
                                        rs_word(id, RS_DONE)))
        return false;
    atomic_store_explicit(&p->ring_byte[pos], 1, memory_order_relaxed);
    prod_drop(p);
    ring_reclaim(s, p, n, id);
    return true;
}

/* The consumer's side. */

static inline unsigned
ring_take(tw_service *s, struct prod *p, struct ring *r, uint32_t pos,
          void (*take)(tw_service *s, struct node *n, void *ctx), void *ctx);

/*
 * Take up to @max slots off the producers' rings, each to ring_take();
 * *@left set if some remain. Returns how many.
 * Context: the consumer.
 */
static inline unsigned ring_drain(tw_service *s, unsigned max,
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

/*
 * Slot @pos of ring @r, producer @p's ring when it published the slot,
 * below tail: take its node to @take as a node from a stack (LOC_QUEUED, its
 * function entry in the payload; cancelled if a cancel won, so that
 * @take frees it), or, for a task its owner cancelled, count it.
 * Returns 1 for a task its owner cancelled, else 0.
 * Context: the consumer (the timer thread, or stop once it is joined).
 */
static inline unsigned
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

/* Is any ring non-empty? (seq_cst loads of tail, as subq_any()). */
static inline bool ring_any(tw_service *s)
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

#endif
