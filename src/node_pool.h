/* SPDX-License-Identifier: MIT */
/*
 * src/node_pool.h - a pool of timer records ("nodes"): their layout, the
 * chunks that hold them, the directory of chunks, index <-> address, the
 * free list and its batches, and a bitmap that marks nodes for the wheel's
 * owner. The pool knows nothing of its user (the service, src/service*.c):
 * it hands out nodes, takes them back, and marks them.
 *
 * A node is a tw_timer whose function pointer is one atomic 64-bit state
 * word (struct node below). The pool owns two parts of that word, the user
 * the rest:
 *
 *   bits 63..32  the generation: never 0 for a node that was handed out
 *                (a never-used node, zeroed, has 0), bumped each time the
 *                node is freed (node_release()), so that an id made of it
 *                names one use of the node only
 *   bits 31..5   while the node is free: the index + 1 of the first node
 *                of the next batch on the free list (POOL_INDEX_BITS bits
 *                right below the generation); otherwise the user's
 *   bits 4..0    the user's (the free list leaves them as they are)
 *
 * All the pool knows of the word's low half is that an index + 1 needs
 * POOL_INDEX_BITS (27) bits, which it puts at the top of the half: the user
 * lays its flags out below POOL_LINK_SHIFT. A node the pool frees or
 * makes has its low half 0, so the user's value 0 in its flags must mean
 * "free".
 *
 * Nodes live in chunks of 4096 that never move, found through a two-level
 * directory that only grows (lock-free: a thread that loses the race to
 * publish a block frees its own). Each chunk is aligned so that a node's
 * index follows from its address, and records an owner (the pointer given
 * to tw__pool_init()) for whoever holds only a node.
 *
 * The operations every schedule, run and cancel makes are here, inline, as
 * they were when they lived in one file with their callers: out of line
 * they cost about 30 more instructions per schedule call. The pool's
 * growth, its set-up and tear-down run rarely and are in src/node_pool.c.
 */
#ifndef TWHEEL_NODE_POOL_H
#define TWHEEL_NODE_POOL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common.h"
#include "twheel/wheel.h"

/* A cache line of padding in a struct, so that the fields on either side do
 * not share one (the name tells the pads of one struct apart); the pool's
 * struct and the service's (src/service_impl.h) use it. */
#define PAD(n) char pad##n[64]

/* ------------------------------------------------------------------------ */
/* The pool's part of the state word. */

/* Bits of an index + 1: at most 2^27 - 1 nodes. */
#define POOL_INDEX_BITS 27
#define POOL_LINK_SHIFT (32 - POOL_INDEX_BITS)
#define POOL_LINK_MASK ((UINT64_C(1) << POOL_INDEX_BITS) - 1)
#define POOL_LINK(st) ((uint32_t)(((st) >> POOL_LINK_SHIFT) & POOL_LINK_MASK))
#define POOL_GEN(st) ((uint32_t)((st) >> 32))

/* ------------------------------------------------------------------------ */
/* Nodes and their chunks. */

/* Chunks: 4096 nodes, each chunk in a block aligned to 2^18 bytes so that a
 * node's index follows from its address. */
#define CHUNK_BITS 12
#define CHUNK_NODES (1u << CHUNK_BITS)
#define CHUNK_ALIGN ((uintptr_t)1 << 18)
#define DIR_BITS 9 /* chunks per directory block: 512 */
#define DIR_BLOCKS 64
#define MAX_NODES ((UINT32_C(1) << POOL_INDEX_BITS) - 1)
_Static_assert((uint64_t)DIR_BLOCKS << (DIR_BITS + CHUNK_BITS) > MAX_NODES,
               "the directory reaches every index");

/*
 * A node is a wheel timer whose function pointer is the state word (on
 * LP64, where both are 8 bytes): a wheel that calls one function for every
 * timer (tw__wheel_set_fire) never reads a timer's tw__fn, so the 8 bytes
 * that would hold the same function in every node hold the state instead.
 * Nodes are never given to tw_timer_init() (which would write tw__fn over
 * the state).
 */
#if UINTPTR_MAX == UINT64_MAX
struct node {
    union {
        tw_timer t;
        struct {
            void *link_[3];         /* tw__next, tw__pprev, tw__expires */
            _Atomic uint64_t state; /* in place of tw__fn */
            void *arg_;             /* tw__arg */
        };
    };
};
_Static_assert(offsetof(struct node, state) == offsetof(tw_timer, tw__fn),
               "the state word is in the place of tw__fn");
_Static_assert(sizeof(struct node) == 40, "a node is 40 bytes on LP64");
#else
struct node {
    tw_timer t;
    _Atomic uint64_t state;
};
#endif

/* Everything a chunk holds after its nodes. */
struct chunk_tail {
    void *raw;                             /* what to tw__free() */
    void *owner;                           /* tw__pool_init()'s @owner */
    uint32_t number;                       /* chunk index */
    _Atomic uint64_t l1;                   /* bit w: l0[w] may be non-zero */
    _Atomic uint64_t l0[CHUNK_NODES / 64]; /* marks (cancel_mark()) */
};

#define CHUNK_BYTES                                                            \
    (CHUNK_NODES * sizeof(struct node) + sizeof(struct chunk_tail))
_Static_assert(CHUNK_BYTES <= CHUNK_ALIGN, "a chunk fits its alignment");
/* What a chunk asks the allocator for: room to align it by hand. */
#define CHUNK_RAW_BYTES (CHUNK_BYTES + CHUNK_ALIGN - 1)

struct dirblock {
    _Atomic(struct node *) chunk[1u << DIR_BITS];
    _Atomic uint64_t dirty[(1u << DIR_BITS) / 64]; /* chunks with marks */
};

/* The size of the batches on the free list: what the timer thread frees at
 * a time, and what a producer takes for its magazine. */
#define MAG_NODES 64u

/*
 * The pool: chunks reached through a two-level directory, the free list
 * and the marks.
 */
struct node_pool {
    uint32_t salt; /* first generations differ between pools */
    void *owner;
    PAD(0);
    _Atomic uint64_t free_head; /* tag << 32 | (index + 1) */
    PAD(3);
    _Atomic uint32_t fresh; /* first never-used index (every cancel reads
                               it; it moves 64 at a time) */
    PAD(1);
    _Atomic uint64_t cancel_dirty; /* dirblocks with marks */
    PAD(2);
    _Atomic(struct dirblock *) dir[DIR_BLOCKS];
    /* The batch of nodes the wheel's owner is freeing (node_free_batched()).
     */
    struct node *free_first;
    uint32_t free_count;
    struct node *free_ring[4];   /* the batch's last 4 nodes, by count % 4 */
    _Atomic uint64_t nodes, mem; /* statistics */
};

/* An empty pool whose chunks record @owner; @salt varies the first
 * generations. */
void tw__pool_init(struct node_pool *p, void *owner, uint32_t salt);
/* Free every chunk. */
void tw__pool_destroy(struct node_pool *p);
/* Add the chunk holding node @idx (and its directory block) if missing.
 * Lock-free: a thread that loses the race to publish a block frees its
 * own. Returns 0 or TW_ENOMEM (a published directory block stays for
 * later growth). */
int tw__pool_grow(struct node_pool *p, uint32_t idx);

/* ------------------------------------------------------------------------ */
/* Index <-> address. */

static inline struct chunk_tail *chunk_tail_of(struct node *first)
{
    return (struct chunk_tail *)(void *)((char *)first +
                                         CHUNK_NODES * sizeof(struct node));
}

/* The chunk tail of the chunk that holds @n. */
static inline struct chunk_tail *chunk_tail_at(const struct node *n)
{
    uintptr_t base = (uintptr_t)n & ~(CHUNK_ALIGN - 1);
    return chunk_tail_of((struct node *)(void *)base);
}

/* The owner of the pool that holds @n. */
static inline void *node_owner(const struct node *n)
{
    return chunk_tail_at(n)->owner;
}

static inline struct node *node_at(const struct node_pool *p, uint32_t idx)
{
    struct dirblock *db = atomic_load_explicit(
        &((struct node_pool *)p)->dir[idx >> (CHUNK_BITS + DIR_BITS)],
        memory_order_acquire);
    struct node *c = atomic_load_explicit(
        &db->chunk[(idx >> CHUNK_BITS) & ((1u << DIR_BITS) - 1)],
        memory_order_acquire);
    return c + (idx & (CHUNK_NODES - 1));
}

static inline uint32_t node_index(const struct node *n)
{
    uintptr_t base = (uintptr_t)n & ~(CHUNK_ALIGN - 1);
    uint32_t off = (uint32_t)(((uintptr_t)n - base) / sizeof(struct node));
    return chunk_tail_at(n)->number << CHUNK_BITS | off;
}

static inline struct node *node_of_timer(tw_timer *t)
{
    return t ? TW_CONTAINER_OF(t, struct node, t) : NULL;
}

/* The handle of the next use of node @idx whose state word is (or will
 * be, FREE) @st: its generation << 32 | @idx + 1. A free node keeps it in
 * its tw__expires, which means nothing else while the node is free, so
 * that whoever takes the node from a magazine has the node's next handle
 * (the service's task id) with one load instead of working the index
 * out of the address. Every way into a magazine or the free list writes
 * it: node_release(), node_unalloc(), and the user's own put-backs. */
static inline uint64_t node_handle(uint64_t st, uint32_t idx)
{
    return (st & ~UINT64_C(0xffffffff)) | (uint64_t)(idx + 1);
}

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
 * state word's link (POOL_LINK()), which the head's tag guards against ABA.
 * Only the thread that popped a batch reads its chain (the push's release
 * and the pop's acquire order the links). The wheel's owner pushes the
 * nodes it frees in batches of up to MAG_NODES (node_free_batched()), and
 * a thread may take a whole batch with one compare-and-swap (free_pop()).
 */

/* Push batch @first (its chain already linked) on the free list. */
static inline void free_push(struct node_pool *p, struct node *first)
{
    uint64_t nh_low = (uint64_t)node_index(first) + 1;
    uint64_t fst = atomic_load_explicit(&first->state, memory_order_relaxed);
    uint64_t keep = fst & ~(POOL_LINK_MASK << POOL_LINK_SHIFT);
    uint64_t h = atomic_load_explicit(&p->free_head, memory_order_relaxed);
    do {
        atomic_store_explicit(&first->state,
                              keep | ((h & 0xffffffffu) << POOL_LINK_SHIFT),
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
            (h & ~UINT64_C(0xffffffff)) + (UINT64_C(1) << 32) + POOL_LINK(nst);
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
 * that differs between pools, so that an id of one service is unlikely
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

/* Take a free node: *@idx its index, *@st its state word (the low half 0,
 * the generation to use). Returns 0 or TW_ENOMEM. For a thread without a
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

/* Give back node @idx that node_alloc() returned with state @st (same
 * generation). */
static inline void node_unalloc(struct node_pool *p, uint32_t idx, uint64_t st)
{
    struct node *n = node_at(p, idx);
    n->t.tw__expires = node_handle(st, idx);
    atomic_store_explicit(&n->state, st & ~UINT64_C(0xffffffff),
                          memory_order_relaxed);
    n->t.tw__next = NULL;
    free_push(p, n);
}

static inline uint64_t next_gen(uint64_t st)
{
    uint32_t g = POOL_GEN(st) + 1;
    return (uint64_t)(g ? g : 1) << 32;
}

/* Mark @n (index @idx), whose state word is @st, free: a new generation,
 * the low half 0, its next handle in tw__expires. It is not on the free
 * list yet. */
static inline void node_release_at(struct node *n, uint32_t idx, uint64_t st)
{
    uint64_t g = next_gen(st);
    n->t.tw__expires = node_handle(g, idx);
    atomic_store_explicit(&n->state, g, memory_order_release);
}

static inline void node_release(struct node *n, uint64_t st)
{
    node_release_at(n, node_index(n), st);
}

/* Free @n (state @st) now: a batch of one. */
static inline void pool_free(struct node_pool *p, struct node *n, uint64_t st)
{
    node_release(n, st);
    n->t.tw__next = NULL;
    free_push(p, n);
}

/* Free @n (state @st) into the batch being built, pushed when full or at
 * free_flush(). Context: the wheel's owner. */
static inline void pool_free_batched(struct node_pool *p, struct node *n,
                                     uint64_t st)
{
    node_release(n, st);
    n->t.tw__next = p->free_first != NULL ? &p->free_first->t : NULL;
    /* While free, tw__pprev points 4 nodes further down the chain (or
     * anywhere: it is only prefetched), so that a thread taking the
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
/* Marks: a node marked (for the service: cancelled while ARMED) is set
 * here, leaf first, then each summary level. The wheel's owner takes each
 * level with an exchange, top first, so a bit set at any time is seen in
 * this round or the next. A summary bit that is already set need not be
 * set again: the consumer clears it before it reads the level below (all
 * seq_cst). */

static inline void or_bit(_Atomic uint64_t *w, unsigned bit)
{
    uint64_t m = UINT64_C(1) << bit;
    if (!(atomic_load(w) & m))
        atomic_fetch_or(w, m);
}

/* Mark node @n (index @idx) for the wheel's owner. */
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

#endif
