/* SPDX-License-Identifier: MIT */
/*
 * src/node_pool.c - the node pool's rare operations: set-up, tear-down and
 * growth (the layout and the operations on every call's path are in
 * src/node_pool.h).
 *
 * Nodes live in chunks of 4096 that never move, found through a two-level
 * directory that only grows (lock-free: a thread that loses the race to
 * publish a block frees its own).
 */
#define _DEFAULT_SOURCE

#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "node_pool.h"

/* Fault in the pages of [@at, @at + @len) (@at page-aligned) with one
 * system call rather than a page fault each at the memset that follows:
 * the same pages, so the same memory. A hint: if the kernel has no
 * MADV_POPULATE_WRITE (before 5.14) or refuses, the memset faults them
 * in as before. */
static void populate(void *at, size_t len)
{
#if defined(__linux__) && defined(MADV_POPULATE_WRITE)
    (void)madvise(at, len, MADV_POPULATE_WRITE);
#else
    (void)at;
    (void)len;
#endif
}

void tw__pool_init(struct node_pool *p, void *owner, uint32_t salt)
{
    p->salt = salt;
    p->owner = owner;
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

int tw__pool_grow(struct node_pool *p, uint32_t idx)
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
    populate(mine, CHUNK_BYTES);
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
