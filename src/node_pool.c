/* SPDX-License-Identifier: MIT */
/*
 * src/node_pool.c - the service's task records (src/service_impl.h).
 *
 * Records live in chunks of 4096 that never move, found through a two-level
 * directory that only grows (lock-free: a thread that loses the race to
 * publish a block frees its own). Free records form a Treiber stack whose
 * head carries a tag against ABA; a record's generation is bumped each time
 * it is freed, so an id names one use of a record only. A cancel of a
 * record in the wheel sets its bit in a three-level bitmap (record, chunk,
 * directory block) that the timer thread drains. Task functions are kept in
 * a lock-free open-addressing table, a record stores its function's index.
 */
#include <string.h>

#include "internal.h"
#include "service_impl.h"

int tw__pool_init(struct node_pool *p, struct tw_service *owner, uint32_t nfns,
                  uint32_t salt)
{
    p->fns = tw__calloc((size_t)nfns, sizeof(*p->fns));
    if (p->fns == NULL)
        return TW_ENOMEM;
    p->fn_mask = nfns - 1;
    p->salt = salt;
    p->owner = owner;
    atomic_fetch_add(&p->mem, (uint64_t)nfns * sizeof(*p->fns));
    return 0;
}

void tw__pool_destroy(struct node_pool *p)
{
    for (unsigned d = 0; d < DIR_BLOCKS; d++) {
        struct dirblock *db = atomic_load(&p->dir[d]);
        if (db == NULL)
            continue;
        for (unsigned c = 0; c < (1u << DIR_BITS); c++) {
            struct node *first = atomic_load(&db->chunk[c]);
            if (first != NULL)
                tw__free(chunk_tail_of(first)->raw);
        }
        tw__free(db);
    }
    tw__free((void *)p->fns);
}

/* The directory block for chunk @d, made if missing. NULL: no memory. */
static struct dirblock *dir_ensure(struct node_pool *p, uint32_t d)
{
    struct dirblock *db =
        atomic_load_explicit(&p->dir[d], memory_order_acquire);
    if (db != NULL)
        return db;
    struct dirblock *mine = tw__calloc(1, sizeof(*mine));
    if (mine == NULL)
        return NULL;
    if (atomic_compare_exchange_strong_explicit(&p->dir[d], &db, mine,
                                                memory_order_acq_rel,
                                                memory_order_acquire)) {
        atomic_fetch_add_explicit(&p->mem, sizeof(*mine), memory_order_relaxed);
        return mine;
    }
    tw__free(mine);
    return db;
}

/*
 * Make sure the chunk holding node @idx exists. Returns 0 or TW_ENOMEM (a
 * published directory block stays for later growth).
 */
static int pool_ensure(struct node_pool *p, uint32_t idx)
{
    uint32_t c = (idx >> CHUNK_BITS) & ((1u << DIR_BITS) - 1);
    struct dirblock *db = dir_ensure(p, idx >> (CHUNK_BITS + DIR_BITS));
    if (db == NULL)
        return TW_ENOMEM;
    struct node *first =
        atomic_load_explicit(&db->chunk[c], memory_order_acquire);
    if (first != NULL)
        return 0;
    /* Through the library's allocator, aligned by hand so that a node's
     * address gives its chunk: CHUNK_ALIGN - 1 bytes more than needed, of
     * which only the CHUNK_BYTES used are ever touched (untouched pages
     * cost no memory). Zeroed so that unused nodes have generation 0,
     * which no id carries. */
    void *raw = tw__malloc(CHUNK_RAW_BYTES);
    if (raw == NULL)
        return TW_ENOMEM;
    uintptr_t at = ((uintptr_t)raw + CHUNK_ALIGN - 1) & ~(CHUNK_ALIGN - 1);
    struct node *mine = (struct node *)at;
    memset(mine, 0, CHUNK_BYTES);
    struct chunk_tail *ct = chunk_tail_of(mine);
    ct->raw = raw;
    ct->owner = p->owner;
    ct->number = idx >> CHUNK_BITS;
    if (atomic_compare_exchange_strong_explicit(&db->chunk[c], &first, mine,
                                                memory_order_acq_rel,
                                                memory_order_acquire)) {
        /* Counted as used: the alignment slack is never touched. */
        atomic_fetch_add_explicit(&p->mem, CHUNK_BYTES, memory_order_relaxed);
        atomic_fetch_add_explicit(&p->nodes, CHUNK_NODES, memory_order_relaxed);
    } else {
        tw__free(raw);
    }
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Allocation and the free list. */

int tw__node_alloc(struct node_pool *p, uint32_t *idx, uint64_t *st)
{
    uint64_t h = atomic_load_explicit(&p->free_head, memory_order_acquire);
    while ((uint32_t)h != 0) {
        uint32_t i = (uint32_t)h - 1;
        uint64_t nst =
            atomic_load_explicit(&node_at(p, i)->state, memory_order_relaxed);
        uint64_t nh =
            (h & ~UINT64_C(0xffffffff)) + (UINT64_C(1) << 32) + ST_PAY(nst);
        if (atomic_compare_exchange_weak_explicit(&p->free_head, &h, nh,
                                                  memory_order_acquire,
                                                  memory_order_acquire)) {
            *idx = i;
            /* nst cannot be stale: had the CAS raced a reuse, the tag
             * would have changed. */
            *st = nst;
            return 0;
        }
    }
    uint32_t f = atomic_load_explicit(&p->fresh, memory_order_relaxed);
    for (;;) {
        if (f >= MAX_NODES)
            return TW_ENOMEM;
        int rc = pool_ensure(p, f);
        if (rc != 0)
            return rc;
        if (atomic_compare_exchange_weak_explicit(&p->fresh, &f, f + 1,
                                                  memory_order_release,
                                                  memory_order_relaxed))
            break;
    }
    *idx = f;
    /* A first generation that differs between services, so that an id of
     * one service is unlikely to match a node of another. */
    uint32_t g = (p->salt ^ (f * UINT32_C(0x9E3779B1))) | 1;
    *st = (uint64_t)g << 32;
    return 0;
}

/* Push the chain @first..@last (linked through their payloads) on the free
 * list. @last's payload is overwritten. */
static void free_push(struct node_pool *p, struct node *first,
                      struct node *last)
{
    uint64_t nh_low = (uint64_t)node_index(first) + 1;
    uint64_t lst = atomic_load_explicit(&last->state, memory_order_relaxed);
    uint64_t keep = lst & ~(ST_PAY_MASK << ST_PAY_SHIFT);
    uint64_t h = atomic_load_explicit(&p->free_head, memory_order_relaxed);
    do {
        atomic_store_explicit(&last->state,
                              keep | ((h & 0xffffffffu) << ST_PAY_SHIFT),
                              memory_order_relaxed);
    } while (!atomic_compare_exchange_weak_explicit(
        &p->free_head, &h,
        (h & ~UINT64_C(0xffffffff)) + (UINT64_C(1) << 32) + nh_low,
        memory_order_release, memory_order_relaxed));
}

void tw__node_unalloc(struct node_pool *p, uint32_t idx, uint64_t st)
{
    struct node *n = node_at(p, idx);
    atomic_store_explicit(&n->state, (st & ~UINT64_C(0xffffffff)) | LOC_FREE,
                          memory_order_relaxed);
    free_push(p, n, n);
}

static uint64_t next_gen(uint64_t st)
{
    uint32_t g = ST_GEN(st) + 1;
    return (uint64_t)(g ? g : 1) << 32;
}

/* Mark @n free (new generation) and free its side record. It is not on
 * the free list yet. */
static void node_retire(struct node *n, uint64_t next_link)
{
    uint64_t st = atomic_load_explicit(&n->state, memory_order_relaxed);
    if (st & ST_PERIODIC)
        tw__free(n->t.tw__arg);
    atomic_store_explicit(&n->state,
                          next_gen(st) | (next_link << ST_PAY_SHIFT) | LOC_FREE,
                          memory_order_release);
}

void tw__node_free(struct node_pool *p, struct node *n)
{
    node_retire(n, 0);
    free_push(p, n, n);
}

void tw__node_free_batched(struct node_pool *p, struct node *n)
{
    uint64_t link = p->free_first ? (uint64_t)node_index(p->free_first) + 1 : 0;
    node_retire(n, link);
    if (p->free_first == NULL)
        p->free_last = n;
    p->free_first = n;
}

void tw__free_flush(struct node_pool *p)
{
    if (p->free_first != NULL) {
        free_push(p, p->free_first, p->free_last);
        p->free_first = p->free_last = NULL;
    }
}

/* ------------------------------------------------------------------------ */
/* Cancel bits: a node cancelled while ARMED is marked here, leaf first,
 * then each summary level. The timer thread takes each level with an
 * exchange, top first, so a bit set at any time is seen in this round or
 * the next. A summary bit that is already set need not be set again: the
 * consumer clears it before it reads the level below (all seq_cst). */

static void or_bit(_Atomic uint64_t *w, unsigned bit)
{
    uint64_t m = UINT64_C(1) << bit;
    if (!(atomic_load(w) & m))
        atomic_fetch_or(w, m);
}

void tw__cancel_mark(struct node_pool *p, struct node *n, uint32_t idx)
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
static void drain_chunk(struct node *first,
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

void tw__cancel_drain(struct node_pool *p,
                      void (*fn)(struct node *n, void *ctx), void *ctx)
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

static uint32_t fn_hash(tw_task_fn fn)
{
    uint64_t x = (uint64_t)(uintptr_t)fn * UINT64_C(0x9E3779B97F4A7C15);
    return (uint32_t)(x >> 40);
}

int tw__fn_index(struct node_pool *p, tw_task_fn fn, uint32_t *out)
{
    uint32_t h = fn_hash(fn);
    for (uint32_t i = 0; i <= p->fn_mask; i++) {
        uint32_t slot = (h + i) & p->fn_mask;
        tw_task_fn cur =
            atomic_load_explicit(&p->fns[slot], memory_order_acquire);
        if (cur == NULL && atomic_compare_exchange_strong_explicit(
                               &p->fns[slot], &cur, fn, memory_order_acq_rel,
                               memory_order_acquire))
            cur = fn; /* ours now */
        if (cur == fn) {
            *out = slot;
            return 0;
        }
    }
    return TW_EAGAIN;
}

int tw__fn_find(struct node_pool *p, tw_task_fn fn, uint32_t *out)
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
