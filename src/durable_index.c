/* SPDX-License-Identifier: MIT */
/*
 * src/durable_index.c - the journal's ordered index for tw_durable_list()
 * (src/durable_index.h): a treap of (tick, handle) ordered by (tick, key).
 *
 * Nodes are 32 bytes in chunks of DX_CHUNK, named by ids from 1 (0 is
 * none); freed ids go on a free list through their left link, and a chunk
 * once made stays until the index is freed, so an insert never moves
 * other nodes and costs no allocation except one chunk per DX_CHUNK.
 * Insert and erase are the classic split/merge recursions (expected depth
 * O(log n), so the recursion is shallow). A walk keeps the ancestors it
 * still has to visit on a fixed stack; if the tree is ever deeper than the
 * stack, the deepest-but-largest ancestors are dropped and the walk seeks
 * again from its last entry once the stack runs dry, so it stays correct.
 */
#include "durable_index.h"

#include <string.h>

#include "common.h"

#define DX_SHIFT 12
#define DX_CHUNK (1u << DX_SHIFT)

struct dx_node {
    uint64_t tick;
    uintptr_t h;
    uint32_t pri;
    uint32_t l, r;
};
#if UINTPTR_MAX == UINT64_MAX
_Static_assert(sizeof(struct dx_node) == 32, "a node is 32 bytes on LP64");
#endif

struct tw__dx {
    struct dx_node **chunks;
    size_t nchunks, cap;
    uint32_t next_id; /* ids below it have been handed out */
    uint32_t free;    /* free list of ids (through l) */
    uint32_t root;
    size_t count;
    uint64_t rng;
    tw__dx_key_fn key;
    void *ctx;
};

static struct dx_node *N(const tw__dx *x, uint32_t id)
{
    return &x->chunks[(id - 1) >> DX_SHIFT][(id - 1) & (DX_CHUNK - 1)];
}

tw__dx *tw__dx_new(tw__dx_key_fn key, void *ctx, uint64_t seed)
{
    tw__dx *x = tw__calloc(1, sizeof *x);
    if (!x)
        return NULL;
    x->key = key;
    x->ctx = ctx;
    x->next_id = 1;
    x->rng = seed | 1u;
    return x;
}

void tw__dx_free(tw__dx *x)
{
    if (!x)
        return;
    for (size_t i = 0; i < x->nchunks; i++)
        tw__free(x->chunks[i]);
    tw__free(x->chunks);
    tw__free(x);
}

size_t tw__dx_count(const tw__dx *x)
{
    return x->count;
}

static uint32_t rnd(tw__dx *x)
{
    x->rng ^= x->rng << 13;
    x->rng ^= x->rng >> 7;
    x->rng ^= x->rng << 17;
    return (uint32_t)(x->rng >> 16);
}

static uint32_t node_alloc(tw__dx *x)
{
    if (x->free) {
        uint32_t id = x->free;
        x->free = N(x, id)->l;
        return id;
    }
    if (((x->next_id - 1) & (DX_CHUNK - 1)) == 0) {
        if ((size_t)(x->next_id - 1) >> DX_SHIFT >= (UINT32_MAX >> DX_SHIFT))
            return 0;
        if (x->nchunks == x->cap) {
            size_t nc = x->cap ? x->cap * 2 : 16;
            struct dx_node **c = tw__realloc(x->chunks, nc * sizeof *c);
            if (!c)
                return 0;
            x->chunks = c;
            x->cap = nc;
        }
        struct dx_node *chunk = tw__malloc(DX_CHUNK * sizeof *chunk);
        if (!chunk)
            return 0;
        x->chunks[x->nchunks++] = chunk;
    }
    return x->next_id++;
}

/* (@tick, @k) against the entry of node @id: < 0, 0 or > 0. */
static int cmp_key(const tw__dx *x, uint64_t tick, const unsigned char *k,
                   size_t kl, uint32_t id)
{
    const struct dx_node *n = N(x, id);
    if (tick != n->tick)
        return tick < n->tick ? -1 : 1;
    const unsigned char *k2;
    size_t l2;
    x->key(x->ctx, n->h, &k2, &l2);
    size_t m = kl < l2 ? kl : l2;
    int c = m ? memcmp(k, k2, m) : 0; /* @k may be NULL when @kl is 0 */
    if (c)
        return c;
    return kl < l2 ? -1 : kl > l2;
}

/* Split @t into the nodes before (@tick, @k) and the others. */
static void split(tw__dx *x, uint32_t t, uint64_t tick, const unsigned char *k,
                  size_t kl, uint32_t *lo, uint32_t *hi)
{
    if (!t) {
        *lo = *hi = 0;
        return;
    }
    struct dx_node *n = N(x, t);
    if (cmp_key(x, tick, k, kl, t) > 0) { /* t goes low */
        split(x, n->r, tick, k, kl, &n->r, hi);
        *lo = t;
    } else {
        split(x, n->l, tick, k, kl, lo, &n->l);
        *hi = t;
    }
}

static uint32_t merge(tw__dx *x, uint32_t a, uint32_t b)
{
    if (!a || !b)
        return a ? a : b;
    if (N(x, a)->pri > N(x, b)->pri) {
        N(x, a)->r = merge(x, N(x, a)->r, b);
        return a;
    }
    N(x, b)->l = merge(x, a, N(x, b)->l);
    return b;
}

static uint32_t insert(tw__dx *x, uint32_t t, uint32_t id,
                       const unsigned char *k, size_t kl)
{
    struct dx_node *n = N(x, id);
    if (!t)
        return id;
    struct dx_node *tn = N(x, t);
    if (n->pri > tn->pri) {
        split(x, t, n->tick, k, kl, &n->l, &n->r);
        return id;
    }
    if (cmp_key(x, n->tick, k, kl, t) < 0)
        tn->l = insert(x, tn->l, id, k, kl);
    else
        tn->r = insert(x, tn->r, id, k, kl);
    return t;
}

int tw__dx_insert(tw__dx *x, uint64_t tick, uintptr_t h)
{
    uint32_t id = node_alloc(x);
    if (!id)
        return TW_ENOMEM;
    struct dx_node *n = N(x, id);
    n->tick = tick;
    n->h = h;
    n->pri = rnd(x);
    n->l = n->r = 0;
    const unsigned char *k;
    size_t kl;
    x->key(x->ctx, h, &k, &kl);
    x->root = insert(x, x->root, id, k, kl);
    x->count++;
    return 0;
}

bool tw__dx_has(const tw__dx *x, uint64_t tick, uintptr_t h)
{
    const unsigned char *k;
    size_t kl;
    x->key(x->ctx, h, &k, &kl);
    for (uint32_t t = x->root; t;) {
        int c = cmp_key(x, tick, k, kl, t);
        if (c == 0)
            return N(x, t)->h == h;
        t = c < 0 ? N(x, t)->l : N(x, t)->r;
    }
    return false;
}

static uint32_t erase(tw__dx *x, uint32_t t, uint64_t tick,
                      const unsigned char *k, size_t kl, uintptr_t h,
                      bool *found)
{
    if (!t)
        return 0;
    struct dx_node *n = N(x, t);
    int c = cmp_key(x, tick, k, kl, t);
    if (c < 0) {
        n->l = erase(x, n->l, tick, k, kl, h, found);
    } else if (c > 0) {
        n->r = erase(x, n->r, tick, k, kl, h, found);
    } else if (n->h == h) {
        uint32_t m = merge(x, n->l, n->r);
        n->l = x->free;
        x->free = t;
        *found = true;
        return m;
    }
    return t;
}

bool tw__dx_erase(tw__dx *x, uint64_t tick, uintptr_t h)
{
    const unsigned char *k;
    size_t kl;
    bool found = false;
    x->key(x->ctx, h, &k, &kl);
    x->root = erase(x, x->root, tick, k, kl, h, &found);
    x->count -= found;
    return found;
}

#define STACK_MAX ((size_t)TW__DX_STACK)

/* Push @id; when the stack is full, the bottom (largest) entry goes and
 * the walk will seek again once the rest is used up. */
static void push(tw__dx_iter *it, uint32_t id)
{
    if (it->depth == STACK_MAX) {
        memmove(it->stack, it->stack + 1, (STACK_MAX - 1) * sizeof(uint32_t));
        it->depth--;
        it->reseek = true;
    }
    it->stack[it->depth++] = id;
}

/* Push the nodes of @t's subtree on the way to its first entry after
 * (@tick, @k) (@after) or at or after it. */
static void descend(tw__dx_iter *it, uint32_t t, uint64_t tick,
                    const unsigned char *k, size_t kl, bool after)
{
    while (t) {
        int c = cmp_key(it->x, tick, k, kl, t);
        if (c < 0 || (c == 0 && !after)) {
            push(it, t);
            t = N(it->x, t)->l;
        } else {
            t = N(it->x, t)->r;
        }
    }
}

void tw__dx_seek(tw__dx_iter *it, tw__dx *x, uint64_t tick,
                 const unsigned char *key, size_t len, bool after)
{
    it->x = x;
    it->depth = 0;
    it->reseek = false;
    descend(it, x->root, tick, key, len, after);
}

bool tw__dx_next(tw__dx_iter *it, uint64_t *tick, uintptr_t *h)
{
    if (!it->depth && it->reseek) {
        const unsigned char *k;
        size_t kl;
        it->x->key(it->x->ctx, it->last_h, &k, &kl);
        it->reseek = false;
        descend(it, it->x->root, it->last_tick, k, kl, true);
    }
    if (!it->depth)
        return false;
    uint32_t id = it->stack[--it->depth];
    const struct dx_node *n = N(it->x, id);
    for (uint32_t m = n->r; m; m = N(it->x, m)->l)
        push(it, m);
    *tick = it->last_tick = n->tick;
    *h = it->last_h = n->h;
    return true;
}
