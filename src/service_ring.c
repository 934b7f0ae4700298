/* SPDX-License-Identifier: MIT */
/*
 * src/service_ring.c - a producer's ring (struct ring, src/service_impl.h),
 * its rare operations: its memory, its growth, the withdrawal of a slot
 * when stop begins during a call, the spill of records its owner's
 * cancels took back beyond a magazine. The operations on every call are
 * inline in src/service_ring.h; a cancel from another thread marks a slot
 * in cancel_ring() (src/service_cancel.c).
 */

#define _POSIX_C_SOURCE 200809L

#include "twheel/service.h"

#include <stdatomic.h>

#include "service_impl.h"
#include "service_prod.h"

/* A ring of 2^@bits slots (counted in @s's memory), or NULL. */
struct ring *tw__svc_ring_new(tw_service *s, unsigned bits)
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
void tw__svc_ring_use(struct prod *p, struct ring *r)
{
    p->ring_slot = r->slot;
    p->ring_byte = ring_done(r, r->mask, 0);
    p->ring_mask = r->mask;
}

/*
 * Producer @p's ring, found full before and empty now (the consumer has
 * taken every slot up to tail): a ring twice its size in its place, or,
 * without the memory, the same ring for good. See struct ring.
 * Context: @p's owner.
 */
__attribute__((noinline)) void tw__svc_ring_grow(tw_service *s, struct prod *p)
{
    struct ring *old = atomic_load_explicit(&p->ring, memory_order_relaxed);
    struct ring *r = NULL;
    p->ring_grow = false;
    if (p->ring_old_n == RING_GROWS ||
        (r = tw__svc_ring_new(s, (unsigned)__builtin_ctz(old->mask + 1) + 1)) ==
            NULL) {
        p->ring_cap = old->mask + 1;
        return;
    }
    p->ring_old[p->ring_old_n++] = old;
    tw__svc_ring_use(p, r);
    /* Published to the consumer by the next store of tail. */
    atomic_store_explicit(&p->ring, r, memory_order_release);
}

/*
 * Stop has begun after publish_ring() published node @n in slot @pos of
 * producer @p's ring: withdraw it unless the consumer (stop) took it or a
 * cancel won (then the call has succeeded); @task is its id. Returns
 * TW_ESHUTDOWN (the node back in the magazine, FREE in its generation,
 * the count dropped, *@id back to @was) or 0. Context: @p's owner.
 */
__attribute__((noinline)) int tw__svc_ring_undo(struct prod *p, struct node *n,
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

/* Node @n (released), one more than the magazine of producer @p keeps:
 * onto its spill chain, which goes to the pool's free list as a batch
 * once it holds MAG_NODES. */
__attribute__((noinline)) void tw__svc_ring_spill(tw_service *s, struct prod *p,
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
