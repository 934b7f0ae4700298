/* SPDX-License-Identifier: MIT */
/*
 * src/durable_backend.h - how twheel/durable.h reaches its backends.
 *
 * What a backend differs in: its handle begins with struct tw_durable,
 * whose ops table (store a batch, cancel a batch, close, stats, look-ups,
 * dead letters) the public calls of src/durable.c dispatch through, and
 * its open. tw_durable_open() validates the parts of the config that every
 * backend shares, then opens the journal backend when cfg->redis is NULL
 * and the Redis backend otherwise. The public functions check their
 * arguments (NULL, empty or oversized key, oversized payload) before
 * dispatching, so a backend sees valid input only. What the backends
 * share (the executor, delivery counters and rules, retry policy, clocks)
 * is in src/durable_exec.h.
 */
#ifndef TWHEEL_DURABLE_BACKEND_H
#define TWHEEL_DURABLE_BACKEND_H

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include "durable_exec.h"
#include "twheel/durable.h"

/* A listing call as the backends see it: the entries with (due, key)
 * after (@from, @key) (@after) or with due >= @from (!@after), due < @to,
 * at most @max, keys copied to @keybuf. Dues are the wheel's: Unix ms,
 * before 1970 as 0. */
struct tw__list_req {
    uint64_t from, to;
    const unsigned char *key;
    size_t key_len;
    bool after;
    size_t max; /* 1 .. INT_MAX */
    unsigned char *keybuf;
    size_t keybuf_len;
};

/* Copy key @k of @len bytes into @q's key buffer at *@used, if it fits,
 * and make entry @e of it. False when it does not fit. */
static inline bool tw__list_put(const struct tw__list_req *q, size_t *used,
                                tw_durable_entry *e, const void *k, size_t len,
                                uint64_t due, int64_t now)
{
    if (len > q->keybuf_len - *used)
        return false;
    memcpy(q->keybuf + *used, k, len);
    e->key = q->keybuf + *used;
    e->key_len = len;
    e->due_ms = (int64_t)due;
    e->state =
        now >= 0 && due <= (uint64_t)now ? TW_DURABLE_DUE : TW_DURABLE_WAITING;
    e->reserved = 0;
    *used += len;
    return true;
}

/* The condition of a conditional write (tw_durable_schedule_if() and
 * friends): @expect NULL, the key must not be pending; else it must be
 * pending with a payload that begins with the @expect_len bytes at
 * @expect. */
struct tw__cond {
    const void *expect;
    size_t expect_len;
};

/* The result of @c against a key whose pending payload is @pl (@pl_len
 * bytes), or that is not pending (@pending false): 0 (it holds),
 * TW_ESTALE or TW_ENOENT. */
static inline int tw__cond_check(const struct tw__cond *c, bool pending,
                                 const void *pl, size_t pl_len)
{
    if (!c->expect)
        return pending ? TW_ESTALE : 0;
    if (!pending)
        return TW_ENOENT;
    if (!c->expect_len)
        return 0;
    return pl && pl_len >= c->expect_len &&
                   !memcmp(pl, c->expect, c->expect_len)
               ? 0
               : TW_ESTALE;
}

struct tw_durable_ops {
    int (*schedule)(tw_durable *d, const void *key, size_t key_len,
                    int64_t due_ms, const void *payload, size_t payload_len);
    int (*cancel)(tw_durable *d, const void *key, size_t key_len);
    int (*close)(tw_durable *d);                        /* also frees d */
    int (*stats)(tw_durable *d, tw_durable_stats *out); /* out is zeroed */
    /* Optional (NULL = a loop over schedule). Items are valid; the backend
     * sets every item's result and returns the first error or 0. */
    int (*schedule_many)(tw_durable *d, tw_durable_item *items, size_t n);
    /* Optional (NULL = a loop over cancel). Only key and key_len of the
     * items are read; the rest as for schedule_many. */
    int (*cancel_many)(tw_durable *d, tw_durable_item *items, size_t n);
    /* tw_durable_get() and tw_durable_list() (src/durable_query.c checks
     * their arguments: a valid key, non-NULL info; *info is zeroed). */
    int (*get)(tw_durable *d, const void *key, size_t key_len,
               tw_durable_info *info, void *buf, size_t buf_len);
    /* The entries of @q into @out (q->max of them at most), in (due, key)
     * order; *@end set when the range has no more. Returns how many, or a
     * negative error. */
    int (*list)(tw_durable *d, const struct tw__list_req *q,
                tw_durable_entry *out, bool *end);
    /* tw_durable_scan() (@fn non-NULL). */
    long (*scan)(tw_durable *d, tw_durable_scan_fn fn, void *arg);
    /* Dead letters (src/durable_dead.c checks the arguments and refuses
     * changes of a read-only store): tw_durable_rearm() at @due_ms, or
     * tw_durable_dead_delete() when @del; tw_durable_list_dead() with
     * @q's from and to unused (its keys in byte order after q->key when
     * q->after); tw_durable_touch(). */
    int (*dead_op)(tw_durable *d, const void *key, size_t key_len,
                   int64_t due_ms, bool del);
    int (*list_dead)(tw_durable *d, const struct tw__list_req *q,
                     tw_durable_entry *out, bool *end);
    int (*touch)(tw_durable *d, const void *key, size_t key_len);
    /* Conditional schedules and cancels (tw_durable_schedule_many_if(),
     * _cancel_many_if()): as schedule_many and cancel_many, item i
     * applied only if @cond[i] holds against the store as the items
     * before it left it (each check atomic with its write), else its
     * result is TW_ESTALE or TW_ENOENT. Items and conditions are valid
     * (a cancel's expect is non-NULL). */
    int (*schedule_if)(tw_durable *d, tw_durable_item *items,
                       const struct tw__cond *cond, size_t n);
    int (*cancel_if)(tw_durable *d, tw_durable_item *items,
                     const struct tw__cond *cond, size_t n);
    /* tw_durable_restore() (arguments checked, store writable). */
    int (*restore)(tw_durable *d, const tw_durable_scanned *t);
};

struct tw_durable {
    const struct tw_durable_ops *ops;
    /* tw_durable_close() has begun: the public calls refuse every change
     * (TW_ESHUTDOWN) from then on, for every backend (src/durable.c). */
    atomic_bool closing;
    /* Opened with TW_DURABLE_READONLY: the public calls refuse every
     * change (TW_EROFS). */
    bool readonly;
};

/* Each backend's open. @cfg has been checked for the shared fields
 * (src/durable.c). The journal's (src/durable_journal_open.c): cfg->dir
 * is set. */
int tw__durable_journal_open(tw_durable **out, const tw_durable_config *cfg);
/* The Redis backend's (src/durable_redis.c): cfg->redis is non-NULL. */
int tw__durable_redis_open(tw_durable **out, const tw_durable_config *cfg);
/* The PostgreSQL backend's (src/durable_pg.c): cfg->postgres is non-NULL
 * (and neither dir nor redis). */
int tw__durable_pg_open(tw_durable **out, const tw_durable_config *cfg);

#endif
