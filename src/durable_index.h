/* SPDX-License-Identifier: MIT */
/*
 * src/durable_index.h - an ordered index of the journal's pending timers,
 * for tw_durable_list(): entries (tick, h), h an opaque non-zero word (the
 * node), in order of (tick, key bytes), where the key of a handle is asked of
 * the store. Internal.
 *
 * A treap (a binary search tree whose nodes also carry random priorities,
 * kept in heap order, so its expected depth is O(log n) whatever the
 * order of insertions) in chunks of 32-byte nodes named by 32-bit ids.
 * Not thread-safe: the store calls it under its lock.
 */
#ifndef TWHEEL_DURABLE_INDEX_H
#define TWHEEL_DURABLE_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The key of entry @h (never 0) of the store @ctx. */
typedef void (*tw__dx_key_fn)(void *ctx, uintptr_t h, const unsigned char **key,
                              size_t *len);

typedef struct tw__dx tw__dx;

/* An empty index, or NULL when out of memory. */
tw__dx *tw__dx_new(tw__dx_key_fn key, void *ctx, uint64_t seed);
void tw__dx_free(tw__dx *x);

/* Add handle @h at @tick. 0 or TW_ENOMEM (nothing changed). */
int tw__dx_insert(tw__dx *x, uint64_t tick, uintptr_t h);

/* Whether handle @h is in at @tick. */
bool tw__dx_has(const tw__dx *x, uint64_t tick, uintptr_t h);

/* Remove handle @h if it is in at @tick; returns whether it was. */
bool tw__dx_erase(tw__dx *x, uint64_t tick, uintptr_t h);

/* Entries in the index. */
size_t tw__dx_count(const tw__dx *x);

/* Ancestors a walk keeps: more than twice the expected depth of a treap
 * of 2^32 entries (a test builds with a tiny stack to exercise the
 * fallback). */
#ifndef TW__DX_STACK
#define TW__DX_STACK 96
#endif

/* A walk in order from a position. */
typedef struct tw__dx_iter {
    tw__dx *x;
    size_t depth;
    uint32_t stack[TW__DX_STACK];
    /* Set when the tree was deeper than the stack: the walk seeks again
     * from the last entry instead (still correct, O(log n) a step). */
    bool reseek;
    uint64_t last_tick;
    uintptr_t last_h;
} tw__dx_iter;

/* Start @it at the first entry after (@tick, @key) when @after, else at
 * the first at or after it (an empty @key: the first at @tick or later). */
void tw__dx_seek(tw__dx_iter *it, tw__dx *x, uint64_t tick,
                 const unsigned char *key, size_t len, bool after);

/* The next entry: true with *@tick and *@h, or false at the end. */
bool tw__dx_next(tw__dx_iter *it, uint64_t *tick, uintptr_t *h);

#endif
