/* SPDX-License-Identifier: MIT */
/*
 * heap.h - the binary min-heap baseline used by the benchmarks.
 *
 * The structure libuv and libevent keep their timers in: a binary min-heap
 * ordered by expiry, with each node remembering its position so that a
 * pending timer can be removed in O(log n). Ours stores the key next to the
 * node pointer in the array (one cache line holds four entries), which makes
 * it a little faster than both of theirs: the baseline is a fair one.
 *
 * Thread safety: none; one thread owns a heap and its nodes.
 */
#ifndef TWHEEL_BENCH_HEAP_H
#define TWHEEL_BENCH_HEAP_H

#include <stddef.h>
#include <stdint.h>

/* A caller-owned node; embed it. idx == HEAP_NONE while not in a heap. */
typedef struct heap_node {
    uint64_t key;
    size_t idx;
} heap_node;

#define HEAP_NONE ((size_t)-1)

typedef struct heap_entry {
    uint64_t key;
    heap_node *node;
} heap_entry;

typedef struct heap {
    heap_entry *a;
    size_t n, cap;
} heap;

/* heap_init - an empty heap with room for @cap nodes. Returns 0 or -ENOMEM. */
int heap_init(heap *h, size_t cap);

/* heap_free - release the array; nodes still inside are just forgotten. */
void heap_free(heap *h);

/* heap_node_init - mark @x as not in any heap. */
static inline void heap_node_init(heap_node *x)
{
    x->idx = HEAP_NONE;
}

/*
 * heap_insert - insert @x (not in a heap) with key @key, growing the array
 * if needed. Returns 0 or -ENOMEM (nothing changed).
 */
int heap_insert(heap *h, heap_node *x, uint64_t key);

/* heap_remove - remove @x, which must be in @h. */
void heap_remove(heap *h, heap_node *x);

/* heap_update - change the key of @x (in @h) and restore the order. */
void heap_update(heap *h, heap_node *x, uint64_t key);

/* heap_min - the node with the smallest key, or NULL when empty. */
static inline heap_node *heap_min(const heap *h)
{
    return h->n ? h->a[0].node : NULL;
}

/* heap_min_key - the smallest key, UINT64_MAX when empty. */
static inline uint64_t heap_min_key(const heap *h)
{
    return h->n ? h->a[0].key : UINT64_MAX;
}

#endif /* TWHEEL_BENCH_HEAP_H */
