/* SPDX-License-Identifier: MIT */
/*
 * src/key_table.h - the journal backend's key table: a chained hash table
 * from keys to key entries, the entries in a slab of their own.
 *
 * Entries: a key entry is a tw_timer in the backend's wheel (tick = Unix
 * ms) whose arg slot is the hash chain's link, where the key's current
 * record lives in the journal (segment, offset), the key's length and the
 * backend's flags: 52 bytes on LP64, then the key, in 8-byte size classes.
 *
 * Slab: entries come from 256 KiB chunks, one free list per 8-byte size
 * class, so an entry costs its own bytes rounded up to 8 and no allocator
 * header. Memory of freed entries is kept for new ones until the table is
 * freed.
 *
 * Handles: the table names an entry by a 32-bit handle, 1 + the entry's
 * 8-byte unit in the slab (chunk * TW__KEY_SLAB_UNITS + unit); 0 is none.
 * A bucket costs 4 bytes, and a chain runs through the entries' arg slots,
 * which hold handles too. An entry that is not in the table keeps its own
 * handle in its arg slot (tw__key_insert() and tw__key_take() keep this),
 * so it can always be freed.
 *
 * Growth: one to two keys per bucket. When the table doubles, the previous
 * one stays and TW__KEY_GROW_STEP of its buckets move per key added (in
 * tw__key_reserve()), so that no call pays for rehashing the whole table
 * at once (about a second at ten million keys). Only tw__key_reserve() and
 * tw__key_resize() move entries between buckets: a place tw__key_find()
 * returned stays valid until then.
 *
 * Not thread-safe: the backend's mutex guards the table. The small look-up
 * functions are inline here: they run once or more per schedule.
 */
#ifndef TWHEEL_KEY_TABLE_H
#define TWHEEL_KEY_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "twheel/durable.h"
#include "twheel/wheel.h"

/* A key's entry; @fl is the backend's (flags and counts). */
struct tw__key_entry {
    tw_timer tm;
    uint32_t seg, off; /* the record of the key's current version */
    uint16_t key_len;
    uint16_t fl;
    unsigned char key[];
};

/* The entry's own bytes on LP64, before the key (the guide's memory
 * figures count on them). */
_Static_assert(sizeof(void *) != 8 || offsetof(struct tw__key_entry, key) == 52,
               "a key entry is 52 bytes, then the key, on LP64");

typedef uint32_t tw__key_handle;

#define TW__KEY_SLAB_GRAIN 8u
#define TW__KEY_SLAB_CHUNK (256u * 1024u)
#define TW__KEY_SLAB_UNITS (TW__KEY_SLAB_CHUNK / TW__KEY_SLAB_GRAIN)
#define TW__KEY_SLAB_CLASSES                                                   \
    ((offsetof(struct tw__key_entry, key) + TW_DURABLE_KEY_MAX +               \
      TW__KEY_SLAB_GRAIN - 1) /                                                \
         TW__KEY_SLAB_GRAIN +                                                  \
     1)

struct tw__key_slab {
    void *free[TW__KEY_SLAB_CLASSES];
    unsigned char *cur;
    size_t left;
    void **chunks;
    size_t nchunks, cap;
};

struct tw__key_table {
    tw__key_handle *buckets; /* chains run through tw__key_link() */
    size_t nbuckets, count;
    /* While the table grows: the previous one, half as large, whose
     * buckets below @moved have been moved to @buckets. */
    tw__key_handle *old;
    size_t nold, moved;
    uint64_t seed;
    struct tw__key_slab slab;
};

/* A place in the table: a bucket (prev NULL) or the link of entry @prev. */
struct tw__key_pos {
    tw__key_handle *bucket;
    struct tw__key_entry *prev;
};

/* An empty table of @nbuckets (a power of two) hashed with @seed:
 * 0 or TW_ENOMEM. */
int tw__key_table_init(struct tw__key_table *t, size_t nbuckets, uint64_t seed);
/* Free the table and every entry (all live in the slab's chunks). */
void tw__key_table_free(struct tw__key_table *t);
/* Room for one more key; TW_ENOMEM with nothing changed. */
int tw__key_reserve(struct tw__key_table *t);
/* Finish a growth under way, then rehash into @nb buckets (a power of
 * two); TW_ENOMEM with nothing changed but the growth finished. */
int tw__key_resize(struct tw__key_table *t, size_t nb);
/* Finish a growth under way. */
void tw__key_grow_finish(struct tw__key_table *t);
/* A new entry for @key (not in the table) with its timer's callback @fn;
 * NULL when out of memory. */
struct tw__key_entry *tw__key_entry_new(struct tw__key_table *t,
                                        const void *key, size_t len,
                                        tw_timer_fn fn);
/* Give an entry that is not in the table back to the slab. */
void tw__key_entry_free(struct tw__key_table *t, struct tw__key_entry *e);
/* Bytes an entry with a key of @key_len bytes takes in the slab. */
size_t tw__key_entry_size(size_t key_len);

static inline uint64_t tw__key_hash(uint64_t seed, const unsigned char *p,
                                    size_t n)
{
    uint64_t h = seed ^ (n * 0x9E3779B97F4A7C15u);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xff51afd7ed558ccdu;
        h ^= h >> 32;
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, p, n);
    h = (h ^ v) * 0xc4ceb9fe1a85ec53u;
    h ^= h >> 29;
    h *= 0xff51afd7ed558ccdu;
    return h ^ (h >> 32);
}

/* The entry of handle @h, or NULL. */
static inline struct tw__key_entry *
tw__key_entry_of(const struct tw__key_table *t, tw__key_handle h)
{
    if (!h)
        return NULL;
    h--;
    return (struct tw__key_entry *)((unsigned char *)
                                        t->slab.chunks[h / TW__KEY_SLAB_UNITS] +
                                    (size_t)(h % TW__KEY_SLAB_UNITS) *
                                        TW__KEY_SLAB_GRAIN);
}

/* The handle in @e's arg slot: the next entry of its chain while it is in
 * the table, its own handle while it is not. */
static inline tw__key_handle tw__key_link(const struct tw__key_entry *e)
{
    return (tw__key_handle)(uintptr_t)e->tm.tw__arg;
}

static inline void tw__key_link_set(struct tw__key_entry *e, tw__key_handle h)
{
    e->tm.tw__arg = (void *)(uintptr_t)h;
}

static inline tw__key_handle tw__key_pos_get(struct tw__key_pos p)
{
    return p.prev ? tw__key_link(p.prev) : *p.bucket;
}

static inline void tw__key_pos_set(struct tw__key_pos p, tw__key_handle h)
{
    if (p.prev)
        tw__key_link_set(p.prev, h);
    else
        *p.bucket = h;
}

/* The entry at @p, or NULL. */
static inline struct tw__key_entry *tw__key_at(const struct tw__key_table *t,
                                               struct tw__key_pos p)
{
    return tw__key_entry_of(t, tw__key_pos_get(p));
}

/* Put entry @e (not in the table) in at @p. */
static inline void tw__key_insert(struct tw__key_table *t, struct tw__key_pos p,
                                  struct tw__key_entry *e)
{
    tw__key_handle self = tw__key_link(e);
    tw__key_link_set(e, tw__key_pos_get(p));
    tw__key_pos_set(p, self);
    t->count++;
}

/* Take the entry at @p out of the table; returns it. */
static inline struct tw__key_entry *tw__key_take(struct tw__key_table *t,
                                                 struct tw__key_pos p)
{
    tw__key_handle self = tw__key_pos_get(p);
    struct tw__key_entry *e = tw__key_entry_of(t, self);
    tw__key_pos_set(p, tw__key_link(e));
    tw__key_link_set(e, self);
    t->count--;
    return e;
}

/* The bucket of hash @h: in the previous table while the table grows and
 * @h's bucket there has not been moved yet. */
static inline tw__key_handle *tw__key_bucket(const struct tw__key_table *t,
                                             uint64_t h)
{
    if (t->old != NULL) {
        size_t j = h & (t->nold - 1);
        if (j >= t->moved)
            return &t->old[j];
    }
    return &t->buckets[h & (t->nbuckets - 1)];
}

/* Where @key is in the table, or where it would go (tw__key_at() is
 * NULL). */
static inline struct tw__key_pos tw__key_find(const struct tw__key_table *t,
                                              const void *key, size_t len)
{
    struct tw__key_pos p = {tw__key_bucket(t, tw__key_hash(t->seed, key, len)),
                            NULL};
    for (struct tw__key_entry *e; (e = tw__key_at(t, p)) != NULL; p.prev = e)
        if (e->key_len == len && memcmp(e->key, key, len) == 0)
            return p;
    return p;
}

/* The entry of @key, or NULL. */
static inline struct tw__key_entry *tw__key_get(const struct tw__key_table *t,
                                                const void *key, size_t len)
{
    return tw__key_at(t, tw__key_find(t, key, len));
}

#endif
