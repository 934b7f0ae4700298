/* SPDX-License-Identifier: MIT */
/*
 * src/service_producer.c - producers: each thread's own stack, count,
 * magazine and ring for a service (struct prod, src/service_impl.h).
 *
 * A thread caches the producers it owns, by service and the service's
 * serial (an address may be reused by a later service; a serial is not):
 * tw__svc_prod_cache, read inline by the calls (src/service_prod.h). A
 * producer leaves a thread's cache when the thread exits or needs the
 * entry for a fifth service; it is then released, under the registry of
 * live services, so that a release never touches a destroyed service.
 */

#define _POSIX_C_SOURCE 200809L

#include "twheel/service.h"

#include <pthread.h>
#include <stdatomic.h>

#include "service_impl.h"
#include "service_prod.h"

_Thread_local struct prod_ref tw__svc_prod_cache[PROD_CACHE] TLS_IE;
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
void tw__svc_reg_add(tw_service *s)
{
    pthread_mutex_lock(&reg_mu);
    s->prods.reg_next = reg_head;
    if (reg_head != NULL)
        reg_head->prods.reg_prev = s;
    reg_head = s;
    pthread_mutex_unlock(&reg_mu);
}

/* Take @s out of it: from now on no thread releases a producer of @s. */
void tw__svc_reg_remove(tw_service *s)
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
        if (tw__svc_prod_cache[i].s != NULL)
            prod_release(&tw__svc_prod_cache[i]);
}

static void prod_key_init(void)
{
    prod_key_rc = pthread_key_create(&prod_key, prod_thread_exit);
}

/* A producer's hot_fn while no call may take prod_schedule_cached(): a function
 * no caller has, as tw_schedule() tests fn against hot_fn only. */
void tw__svc_no_fn(tw_id id, void *arg)
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
        p->hot_fn = tw__svc_no_fn;
        /* Without its ring the producer uses its stack only. */
        struct ring *r = tw__svc_ring_new(s, RING_MIN_BITS);
        if (r != NULL)
            tw__svc_ring_use(p, r);
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
__attribute__((noinline)) struct prod *tw__svc_prod_claim(tw_service *s)
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
    struct prod_ref *r = &tw__svc_prod_cache[prod_victim++ % PROD_CACHE];
    if (r->s != NULL)
        prod_release(r);
    *r = (struct prod_ref){s, s->prods.serial, p};
    return p;
}
