/* SPDX-License-Identifier: MIT */
/*
 * src/key_table.c - the key table's growth and its slab (src/key_table.h
 * has the design and the look-ups).
 */
#include "key_table.h"

#include "common.h"

#define SLAB_CHUNKS_MAX ((size_t)(UINT32_MAX - 1) / TW__KEY_SLAB_UNITS)

/* Buckets of the previous table moved per key added: growth ends long
 * before the new table is full (after nold / TW__KEY_GROW_STEP of the
 * 2 * nold keys that would fill it). */
#define TW__KEY_GROW_STEP 4u

int tw__key_table_init(struct tw__key_table *t, size_t nbuckets, uint64_t seed)
{
    memset(t, 0, sizeof *t);
    t->seed = seed;
    t->buckets = tw__calloc(nbuckets, sizeof *t->buckets);
    if (!t->buckets)
        return TW_ENOMEM;
    t->nbuckets = nbuckets;
    return 0;
}

void tw__key_table_free(struct tw__key_table *t)
{
    for (size_t i = 0; i < t->slab.nchunks; i++)
        tw__free(t->slab.chunks[i]);
    tw__free(t->slab.chunks);
    tw__free(t->buckets);
    tw__free(t->old);
    memset(t, 0, sizeof *t);
}

/* Move the chain that starts at @h into table @b of @nb buckets (a power
 * of two). */
static void move_chain(struct tw__key_table *t, tw__key_handle h,
                       tw__key_handle *b, size_t nb)
{
    for (tw__key_handle nx; h; h = nx) {
        struct tw__key_entry *e = tw__key_entry_of(t, h);
        nx = tw__key_link(e);
        size_t j = tw__key_hash(t->seed, e->key, e->key_len) & (nb - 1);
        tw__key_link_set(e, b[j]);
        b[j] = h;
    }
}

static void grow_step(struct tw__key_table *t, size_t steps)
{
    if (t->old == NULL)
        return;
    for (; steps > 0 && t->moved < t->nold; steps--) {
        tw__key_handle h = t->old[t->moved];
        t->old[t->moved++] = 0;
        move_chain(t, h, t->buckets, t->nbuckets);
    }
    if (t->moved == t->nold) {
        tw__free(t->old);
        t->old = NULL;
        t->nold = t->moved = 0;
    }
}

void tw__key_grow_finish(struct tw__key_table *t)
{
    grow_step(t, SIZE_MAX);
}

/* Start loading the first entry of bucket @i + 8 and the second of bucket
 * @i (its first was asked for 8 buckets ago): the rehash below visits
 * entries in bucket order, which is random in memory. */
static void prefetch_chain(struct tw__key_table *t, size_t i)
{
    if (i + 8 < t->nbuckets && t->buckets[i + 8])
        __builtin_prefetch(tw__key_entry_of(t, t->buckets[i + 8]));
    if (i < t->nbuckets && t->buckets[i]) {
        tw__key_handle second =
            tw__key_link(tw__key_entry_of(t, t->buckets[i]));
        if (second)
            __builtin_prefetch(tw__key_entry_of(t, second));
    }
}

int tw__key_resize(struct tw__key_table *t, size_t nb)
{
    tw__key_grow_finish(t);
    tw__key_handle *b = tw__calloc(nb, sizeof *b);
    if (!b)
        return TW_ENOMEM;
    for (size_t i = 0; i < t->nbuckets; i++) {
        prefetch_chain(t, i + 8);
        move_chain(t, t->buckets[i], b, nb);
    }
    tw__free(t->buckets);
    t->buckets = b;
    t->nbuckets = nb;
    return 0;
}

/* One to two keys per 4-byte bucket: 2 to 4 bytes of table per key, up to
 * 6 while the table grows. */
int tw__key_reserve(struct tw__key_table *t)
{
    grow_step(t, TW__KEY_GROW_STEP);
    if (t->count < 2 * t->nbuckets) /* at most two keys per bucket */
        return 0;
    tw__key_grow_finish(t); /* not reached while growing: GROW_STEP */
    tw__key_handle *b = tw__calloc(t->nbuckets * 2, sizeof *b);
    if (!b)
        return TW_ENOMEM;
    t->old = t->buckets;
    t->nold = t->nbuckets;
    t->moved = 0;
    t->buckets = b;
    t->nbuckets *= 2;
    grow_step(t, TW__KEY_GROW_STEP);
    return 0;
}

static size_t entry_class(size_t key_len)
{
    return (offsetof(struct tw__key_entry, key) + key_len + TW__KEY_SLAB_GRAIN -
            1) /
           TW__KEY_SLAB_GRAIN;
}

size_t tw__key_entry_size(size_t key_len)
{
    return entry_class(key_len) * TW__KEY_SLAB_GRAIN;
}

/* Another chunk for the slab; false when out of memory or handles. */
static bool slab_grow(struct tw__key_slab *sl)
{
    if (sl->nchunks == SLAB_CHUNKS_MAX) /* handles would not fit */
        return false;
    if (sl->nchunks == sl->cap) {
        size_t nc = sl->cap ? sl->cap * 2 : 16;
        void **ch = tw__realloc(sl->chunks, nc * sizeof *ch);
        if (!ch)
            return false;
        sl->chunks = ch;
        sl->cap = nc;
    }
    unsigned char *c = tw__malloc(TW__KEY_SLAB_CHUNK);
    if (!c)
        return false;
    sl->chunks[sl->nchunks++] = c;
    sl->cur = c;
    sl->left = TW__KEY_SLAB_CHUNK;
    return true;
}

/* An entry's memory and its handle (*@h). An entry on a free list keeps
 * its handle in its arg slot; the list runs through its first word. */
static struct tw__key_entry *slab_alloc(struct tw__key_slab *sl, size_t cls,
                                        tw__key_handle *h)
{
    struct tw__key_entry *p = sl->free[cls];
    if (p) {
        memcpy(&sl->free[cls], p, sizeof(void *));
        *h = tw__key_link(p);
        return p;
    }
    size_t size = cls * TW__KEY_SLAB_GRAIN;
    if (sl->left < size && !slab_grow(sl))
        return NULL;
    p = (struct tw__key_entry *)sl->cur;
    *h = (tw__key_handle)(1 + (sl->nchunks - 1) * TW__KEY_SLAB_UNITS +
                          (TW__KEY_SLAB_CHUNK - sl->left) / TW__KEY_SLAB_GRAIN);
    sl->cur += size;
    sl->left -= size;
    return p;
}

void tw__key_entry_free(struct tw__key_table *t, struct tw__key_entry *e)
{
    size_t cls = entry_class(e->key_len);
    memcpy(e, &t->slab.free[cls], sizeof(void *));
    t->slab.free[cls] = e;
}

struct tw__key_entry *tw__key_entry_new(struct tw__key_table *t,
                                        const void *key, size_t len,
                                        tw_timer_fn fn)
{
    tw__key_handle h;
    struct tw__key_entry *e = slab_alloc(&t->slab, entry_class(len), &h);
    if (!e)
        return NULL;
    tw_timer_init(&e->tm, fn, NULL);
    tw__key_link_set(e, h);
    e->seg = e->off = 0;
    e->key_len = (uint16_t)len;
    e->fl = 0;
    memcpy(e->key, key, len);
    return e;
}
