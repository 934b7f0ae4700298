/* SPDX-License-Identifier: MIT */
/*
 * heap.c - binary min-heap with back-indices; see heap.h.
 *
 * Invariant: for every i > 0, a[(i - 1) / 2].key <= a[i].key, and
 * a[i].node->idx == i.
 */
#include "heap.h"

#include <errno.h>
#include <stdlib.h>

int heap_init(heap *h, size_t cap)
{
    h->n = 0;
    h->cap = cap ? cap : 16;
    h->a = malloc(h->cap * sizeof(*h->a));
    return h->a ? 0 : -ENOMEM;
}

void heap_free(heap *h)
{
    free(h->a);
    h->a = NULL;
    h->n = h->cap = 0;
}

static inline void place(heap *h, size_t i, heap_entry e)
{
    h->a[i] = e;
    e.node->idx = i;
}

static void sift_up(heap *h, size_t i, heap_entry e)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h->a[p].key <= e.key)
            break;
        place(h, i, h->a[p]);
        i = p;
    }
    place(h, i, e);
}

static void sift_down(heap *h, size_t i, heap_entry e)
{
    size_t n = h->n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && h->a[c + 1].key < h->a[c].key)
            c++;
        if (e.key <= h->a[c].key)
            break;
        place(h, i, h->a[c]);
        i = c;
    }
    place(h, i, e);
}

int heap_insert(heap *h, heap_node *x, uint64_t key)
{
    if (h->n == h->cap) {
        size_t cap = h->cap * 2;
        heap_entry *a = realloc(h->a, cap * sizeof(*a));
        if (!a)
            return -ENOMEM;
        h->a = a;
        h->cap = cap;
    }
    x->key = key;
    sift_up(h, h->n++, (heap_entry){key, x});
    return 0;
}

/* Put @e at the hole @i, moving it up or down as its key requires. */
static void fix(heap *h, size_t i, heap_entry e)
{
    if (i > 0 && e.key < h->a[(i - 1) / 2].key)
        sift_up(h, i, e);
    else
        sift_down(h, i, e);
}

void heap_remove(heap *h, heap_node *x)
{
    size_t i = x->idx;
    x->idx = HEAP_NONE;
    heap_entry last = h->a[--h->n];
    if (i != h->n)
        fix(h, i, last);
}

void heap_update(heap *h, heap_node *x, uint64_t key)
{
    x->key = key;
    fix(h, x->idx, (heap_entry){key, x});
}
