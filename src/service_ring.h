/* SPDX-License-Identifier: MIT */
/*
 * src/service_ring.h - the consumer's side of the producers' rings (struct
 * ring, src/service_impl.h): the timer thread, or stop once it has joined
 * the thread, takes the new slots (src/service_loop.c). Inline, so that
 * the loop calls its take function directly. The rest of the ring is
 * src/service_ring.c.
 */
#ifndef TWHEEL_SERVICE_RING_H
#define TWHEEL_SERVICE_RING_H

#include "service_impl.h"

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
