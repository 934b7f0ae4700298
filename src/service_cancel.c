/* SPDX-License-Identifier: MIT */
/*
 * src/service_cancel.c - tw_cancel() and tw_cancel_wait(). A cancel only
 * sets the cancelled bit of the task's state word, or, for a task still in
 * a producer's ring, marks its slot (the ring's owner takes the record
 * straight back: ring_cancel_own(), src/service_ring.h); whoever owns the
 * record then frees it (src/service_impl.h, "The state word"). Read from the
 * top, it follows one call: tw_cancel(), cancel_id() (the owner's ring slot),
 * then cancel_state() and the rarer cases below it.
 */

#define _POSIX_C_SOURCE 200809L

#include "twheel/service.h"

#include <pthread.h>
#include <stdatomic.h>

#include "service_impl.h"
#include "service_prod.h"
#include "service_ring.h"

struct drop {
    tw_service *s;
    tw_id id;
};

/* Defined below, in the order a call meets them. */
static inline __attribute__((always_inline)) bool
cancel_id(tw_service *s, tw_id id, bool drop);
static inline __attribute__((always_inline)) bool
cancel_state(tw_service *s, struct node *n, tw_id id, uint64_t st, bool drop);
static __attribute__((noinline)) bool
cancel_won(tw_service *s, struct node *n, tw_id id, unsigned loc, bool drop);
__attribute__((noinline)) static void drop_queued(tw_service *s, struct node *n,
                                                  tw_id id);
static bool still_dispatched(tw_timer *job, void *arg);
static __attribute__((noinline)) bool
cancel_ring(tw_service *s, struct node *n, tw_id id, uint64_t st, bool drop);
static bool still_running(const tw_service *s, tw_id id);

bool tw_cancel(tw_service *s, tw_id id)
{
    return cancel_id(s, id, true);
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
     * ring, before the consumer took the task (src/service_ring.h). */
    struct prod *p = prod_first(s);
    uint32_t pay = ST_PAY(st);
    if (p != NULL && drop && (pay & ~RING_MASK) == p->ring_tag) {
        uint32_t pos = pay & RING_MASK; /* within this ring: rings grow */
        if (ring_cancel_own(s, p, n, id, pos))
            return true;
    }
    return cancel_ring(s, n, id, st, drop);
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

bool tw__svc_cancel(tw_service *s, tw_id id, bool drop)
{
    return cancel_id(s, id, drop);
}

int tw_cancel_wait(tw_service *s, tw_id id)
{
    if (s == NULL)
        return TW_EINVAL;
    if (tw__svc_cur.s == s && tw__svc_cur.id == id && id != 0)
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
