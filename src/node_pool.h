/* SPDX-License-Identifier: MIT */
/*
 * src/node_pool.h - the node pool's operations (the records, the free list,
 * the cancel bitmap and the function table are described in
 * src/service_impl.h).
 *
 * The operations every schedule, run and cancel makes are here, inline, as
 * they were when they lived in one file with their callers: out of line
 * they cost about 30 more instructions per schedule call. The pool's
 * growth, its set-up and tear-down, and adding a function to the table run
 * rarely and are in src/node_pool.c.
 */
#ifndef TWHEEL_NODE_POOL_H
#define TWHEEL_NODE_POOL_H

#include "internal.h"
#include "service_impl.h"

/* An empty pool for @owner with a function table of @nfns entries (a power
 * of two). Returns 0 or TW_ENOMEM. */
int tw__pool_init(struct node_pool *p, struct tw_service *owner, uint32_t nfns,
                  uint32_t salt);
/* Free every chunk and the table. */
void tw__pool_destroy(struct node_pool *p);
/* Add the chunk holding node @idx (and its directory block) if missing.
 * Lock-free: a thread that loses the race to publish a block frees its
 * own. Returns 0 or TW_ENOMEM (a published directory block stays for
 * later growth). */
int tw__pool_grow(struct node_pool *p, uint32_t idx);
/* The entry of @fn in the function table, added if new: 0 and *@out, or
 * TW_EAGAIN if the table is full. */
int tw__fn_index(struct node_pool *p, tw_task_fn fn, uint32_t *out);

/* ------------------------------------------------------------------------ */
/* Allocation and the free list. Context: any thread unless noted. */

/* Make sure the chunk holding node @idx exists: 0 or TW_ENOMEM. */
static inline int pool_ensure(struct node_pool *p, uint32_t idx)
{
    struct dirblock *db = atomic_load_explicit(
        &p->dir[idx >> (CHUNK_BITS + DIR_BITS)], memory_order_acquire);
    if (db != NULL &&
        atomic_load_explicit(
            &db->chunk[(idx >> CHUNK_BITS) & ((1u << DIR_BITS) - 1)],
            memory_order_acquire) != NULL)
        return 0;
    return tw__pool_grow(p, idx);
}

/*
 * The free list is a Treiber stack of batches: a batch is a chain of free
 * nodes linked through their tw_timer's tw__next (NULL-terminated), and
 * the stack links each batch's first node to the next batch through its
 * state word's payload, which the head's tag guards against ABA. Only the
 * thread that popped a batch reads its chain (the push's release and the
 * pop's acquire order the links). The timer thread pushes the nodes it
 * frees in batches of up to MAG_NODES, a producer takes a whole batch for
 * its magazine (service_impl.h, struct prod) with one compare-and-swap.
 */

/* Push batch @first (its chain already linked) on the free list. */
static inline void free_push(struct node_pool *p, struct node *first)
{
    uint64_t nh_low = (uint64_t)node_index(first) + 1;
    uint64_t fst = atomic_load_explicit(&first->state, memory_order_relaxed);
    uint64_t keep = fst & ~(ST_PAY_MASK << ST_PAY_SHIFT);
    uint64_t h = atomic_load_explicit(&p->free_head, memory_order_relaxed);
    do {
        atomic_store_explicit(&first->state,
                              keep | ((h & 0xffffffffu) << ST_PAY_SHIFT),
                              memory_order_relaxed);
    } while (!atomic_compare_exchange_weak_explicit(
        &p->free_head, &h,
        (h & ~UINT64_C(0xffffffff)) + (UINT64_C(1) << 32) + nh_low,
        memory_order_release, memory_order_relaxed));
}

/* Pop a batch: its first node, or NULL if the list is empty. */
static inline struct node *free_pop(struct node_pool *p)
{
    uint64_t h = atomic_load_explicit(&p->free_head, memory_order_acquire);
    while ((uint32_t)h != 0) {
        struct node *n = node_at(p, (uint32_t)h - 1);
        uint64_t nst = atomic_load_explicit(&n->state, memory_order_relaxed);
        uint64_t nh =
            (h & ~UINT64_C(0xffffffff)) + (UINT64_C(1) << 32) + ST_PAY(nst);
        /* nst cannot be stale if the CAS wins: a reuse would have
         * changed the tag. */
        if (atomic_compare_exchange_weak_explicit(&p->free_head, &h, nh,
                                                  memory_order_acquire,
                                                  memory_order_acquire))
            return n;
    }
    return NULL;
}

/* The state word a never-used node @idx starts with: a first generation
 * that differs between services, so that an id of one service is unlikely
 * to match a node of another. */
static inline uint64_t fresh_state(const struct node_pool *p, uint32_t idx)
{
    uint32_t g = (p->salt ^ (idx * UINT32_C(0x9E3779B1))) | 1;
    return (uint64_t)g << 32;
}

/* Take @count never-used indexes: *@first the first of them, their chunks
 * made. Returns 0 or TW_ENOMEM. */
static inline int fresh_take(struct node_pool *p, uint32_t count,
                             uint32_t *first)
{
    uint32_t f = atomic_load_explicit(&p->fresh, memory_order_relaxed);
    for (;;) {
        if (f > MAX_NODES - count)
            return TW_ENOMEM;
        int rc = pool_ensure(p, f);
        if (rc == 0)
            rc = pool_ensure(p, f + count - 1);
        if (rc != 0)
            return rc;
        if (atomic_compare_exchange_weak_explicit(&p->fresh, &f, f + count,
                                                  memory_order_release,
                                                  memory_order_relaxed))
            break;
    }
    *first = f;
    return 0;
}

/* Take a free node: *@idx its index, *@st its state word (FREE, with the
 * generation to use). Returns 0 or TW_ENOMEM. For a thread without a
 * magazine: the rest of a popped batch goes back on the list. */
static inline int node_alloc(struct node_pool *p, uint32_t *idx, uint64_t *st)
{
    struct node *n = free_pop(p);
    if (n != NULL) {
        struct node *rest = node_of_timer(n->t.tw__next);
        if (rest != NULL)
            free_push(p, rest);
        *idx = node_index(n);
        *st = atomic_load_explicit(&n->state, memory_order_relaxed);
        return 0;
    }
    int rc = fresh_take(p, 1, idx);
    if (rc == 0)
        *st = fresh_state(p, *idx);
    return rc;
}

/* Give back node @idx that node_alloc() returned with state @st. */
static inline void node_unalloc(struct node_pool *p, uint32_t idx, uint64_t st)
{
    struct node *n = node_at(p, idx);
    atomic_store_explicit(&n->state, (st & ~UINT64_C(0xffffffff)) | LOC_FREE,
                          memory_order_relaxed);
    n->t.tw__next = NULL;
    free_push(p, n);
}

static inline uint64_t next_gen(uint64_t st)
{
    uint32_t g = ST_GEN(st) + 1;
    return (uint64_t)(g ? g : 1) << 32;
}

/* Mark @n free (new generation) and free its side record. It is not on
 * the free list yet. */
static inline void node_retire(struct node *n)
{
    uint64_t st = atomic_load_explicit(&n->state, memory_order_relaxed);
    if (st & ST_PERIODIC)
        tw__free(n->t.tw__arg);
    atomic_store_explicit(&n->state, next_gen(st) | LOC_FREE,
                          memory_order_release);
}

/* Free @n now (its owner): a batch of one. */
static inline void node_free(struct node_pool *p, struct node *n)
{
    node_retire(n);
    n->t.tw__next = NULL;
    free_push(p, n);
}

/* Free @n into the batch being built, pushed when full or at
 * free_flush(). Context: timer thread. */
static inline void node_free_batched(struct node_pool *p, struct node *n)
{
    node_retire(n);
    n->t.tw__next = p->free_first != NULL ? &p->free_first->t : NULL;
    /* While free, tw__pprev points 4 nodes further down the chain (or
     * anywhere: it is only prefetched), so that a producer taking the
     * nodes in chain order asks for a line 4 calls ahead. */
    n->t.tw__pprev = (tw_timer **)(void *)p->free_ring[p->free_count & 3];
    p->free_ring[p->free_count & 3] = n;
    p->free_first = n;
    if (++p->free_count == MAG_NODES) {
        free_push(p, n);
        p->free_first = NULL;
        p->free_count = 0;
    }
}

static inline void free_flush(struct node_pool *p)
{
    if (p->free_first != NULL) {
        free_push(p, p->free_first);
        p->free_first = NULL;
        p->free_count = 0;
    }
}

/* ------------------------------------------------------------------------ */
/* Cancel bits: a node cancelled while ARMED is marked here, leaf first,
 * then each summary level. The timer thread takes each level with an
 * exchange, top first, so a bit set at any time is seen in this round or
 * the next. A summary bit that is already set need not be set again: the
 * consumer clears it before it reads the level below (all seq_cst). */

static inline void or_bit(_Atomic uint64_t *w, unsigned bit)
{
    uint64_t m = UINT64_C(1) << bit;
    if (!(atomic_load(w) & m))
        atomic_fetch_or(w, m);
}

/* Mark ARMED node @n (index @idx) cancelled for the timer thread. */
static inline void cancel_mark(struct node_pool *p, struct node *n,
                               uint32_t idx)
{
    struct node *first = n - (idx & (CHUNK_NODES - 1));
    struct chunk_tail *ct = chunk_tail_of(first);
    unsigned off = idx & (CHUNK_NODES - 1);
    atomic_fetch_or(&ct->l0[off / 64], UINT64_C(1) << (off % 64));
    or_bit(&ct->l1, off / 64);
    uint32_t c = idx >> CHUNK_BITS;
    struct dirblock *db =
        atomic_load_explicit(&p->dir[c >> DIR_BITS], memory_order_acquire);
    unsigned ci = c & ((1u << DIR_BITS) - 1);
    or_bit(&db->dirty[ci / 64], ci % 64);
    or_bit(&p->cancel_dirty, c >> DIR_BITS);
}

/* The marked nodes of chunk @first. */
static inline void drain_chunk(struct node *first,
                               void (*fn)(struct node *n, void *ctx), void *ctx)
{
    struct chunk_tail *ct = chunk_tail_of(first);
    uint64_t l1 = atomic_exchange(&ct->l1, 0);
    while (l1) {
        unsigned lb = (unsigned)__builtin_ctzll(l1);
        l1 &= l1 - 1;
        uint64_t l0 = atomic_exchange(&ct->l0[lb], 0);
        while (l0) {
            unsigned nb = (unsigned)__builtin_ctzll(l0);
            l0 &= l0 - 1;
            fn(first + lb * 64 + nb, ctx);
        }
    }
}

/* Call @fn(@n, @ctx) for every marked node, clearing the marks.
 * Context: the wheel's owner. */
static inline void cancel_drain(struct node_pool *p,
                                void (*fn)(struct node *n, void *ctx),
                                void *ctx)
{
    uint64_t d = atomic_exchange(&p->cancel_dirty, 0);
    while (d) {
        unsigned b = (unsigned)__builtin_ctzll(d);
        d &= d - 1;
        struct dirblock *db =
            atomic_load_explicit(&p->dir[b], memory_order_acquire);
        for (unsigned w = 0; w < (1u << DIR_BITS) / 64; w++) {
            uint64_t cw = atomic_exchange(&db->dirty[w], 0);
            while (cw) {
                unsigned cb = (unsigned)__builtin_ctzll(cw);
                cw &= cw - 1;
                drain_chunk(atomic_load_explicit(&db->chunk[w * 64 + cb],
                                                 memory_order_acquire),
                            fn, ctx);
            }
        }
    }
}

/* ------------------------------------------------------------------------ */
/* Function table. */

static inline uint32_t fn_hash(tw_task_fn fn)
{
    uint64_t x = (uint64_t)(uintptr_t)fn * UINT64_C(0x9E3779B97F4A7C15);
    return (uint32_t)(x >> 40);
}

/* Look @fn up without taking an entry: 0 and *@out its entry, 1 if it is
 * not there but there is room, TW_EAGAIN if the table is full. */
static inline int fn_find(struct node_pool *p, tw_task_fn fn, uint32_t *out)
{
    uint32_t h = fn_hash(fn);
    for (uint32_t i = 0; i <= p->fn_mask; i++) {
        uint32_t slot = (h + i) & p->fn_mask;
        tw_task_fn cur =
            atomic_load_explicit(&p->fns[slot], memory_order_acquire);
        if (cur == NULL)
            return 1;
        if (cur == fn) {
            *out = slot;
            return 0;
        }
    }
    return TW_EAGAIN;
}

#endif
