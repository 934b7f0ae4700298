/* SPDX-License-Identifier: MIT */
/*
 * src/service_prod.h - what the calls on a producer's thread share
 * (src/service_submit.c, src/service_cancel.c, src/service_ring.c,
 * src/service_producer.c): the thread's cache of producers, read inline on
 * every call, the magazine's put-back, and the producer and ring
 * functions those files call.
 */
#ifndef TWHEEL_SERVICE_PROD_H
#define TWHEEL_SERVICE_PROD_H

#include "service_impl.h"

#define PROD_CACHE 4

/* initial-exec: no call to find the thread's block, in the shared
 * library too (the block is small). */
#define TLS_IE __attribute__((tls_model("initial-exec")))
/* The producers this thread owns (src/service_producer.c). */
extern _Thread_local struct prod_ref {
    tw_service *s;
    uint64_t serial;
    struct prod *p;
} tw__svc_prod_cache[PROD_CACHE] TLS_IE;

/* src/service_producer.c: the calling thread's producer of @s, taken now
 * if it has none (see tw__svc_prod_claim() there); a function no caller
 * has, a producer's hot_fn while no call may take
 * prod_schedule_cached(). */
struct prod *tw__svc_prod_claim(tw_service *s);
void tw__svc_no_fn(tw_id id, void *arg);
/* src/service_ring.c: a ring of 2^@bits slots; the owner's copies of its
 * slots, bytes and mask; its growth; a slot withdrawn when stop began
 * during the call that published it. */
struct ring *tw__svc_ring_new(tw_service *s, unsigned bits);
void tw__svc_ring_use(struct prod *p, struct ring *r);
void tw__svc_ring_grow(tw_service *s, struct prod *p);
void tw__svc_ring_spill(tw_service *s, struct prod *p, struct node *n);
int tw__svc_ring_undo(struct prod *p, struct node *n, tw_id task, uint32_t pos,
                      tw_id *id, tw_id was);

/* This thread's producer for @s if it has one cached, else NULL. */
static inline struct prod *prod_cached(tw_service *s)
{
    for (unsigned i = 0; i < PROD_CACHE; i++)
        if (tw__svc_prod_cache[i].s == s &&
            tw__svc_prod_cache[i].serial == s->prods.serial)
            return tw__svc_prod_cache[i].p;
    return NULL;
}

/* prod_cached() that looks at the first entry only, where the producer of
 * a thread's first service is (tw__svc_prod_claim()); NULL if it is not there.
 */
static inline struct prod *prod_first(const tw_service *s)
{
    /* An entry names a service (s != NULL) exactly when it holds a
     * producer, so that @s NULL finds none without a test of its own. */
    struct prod *p = tw__svc_prod_cache[0].p;
    return tw__svc_prod_cache[0].s == s && p != NULL &&
                   tw__svc_prod_cache[0].serial == s->prods.serial
               ? p
               : NULL;
}

static inline struct prod *prod_get(tw_service *s)
{
    struct prod *p = prod_cached(s);
    return p != NULL ? p : tw__svc_prod_claim(s);
}

/* Put back what mag_take() gave (*@v). */
static inline void mag_put(struct prod *p, const struct reserved *v)
{
    v->n->t.tw__expires = node_handle(v->st, node_index(v->n));
    atomic_store_explicit(&v->n->state, v->st, memory_order_relaxed);
    v->n->t.tw__next = p->mag != NULL ? &p->mag->t : NULL;
    p->mag = v->n;
}

#endif
