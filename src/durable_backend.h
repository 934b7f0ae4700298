/* SPDX-License-Identifier: MIT */
/*
 * src/durable_backend.h - how twheel/durable.h reaches its backends.
 *
 * tw_durable_open() (src/durable.c) validates the parts of the config that
 * every backend shares (fire, key and payload limits are checked per call),
 * then opens the journal backend when cfg->redis is NULL and the Redis
 * backend (src/durable_redis.c) otherwise. Every backend's handle begins
 * with struct tw_durable, whose ops table the public calls dispatch through.
 * The public functions check their arguments (NULL, empty or oversized key,
 * oversized payload) before dispatching, so a backend sees valid input only.
 */
#ifndef TWHEEL_DURABLE_BACKEND_H
#define TWHEEL_DURABLE_BACKEND_H

#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

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

/* The store whose callback this thread is running, or NULL: close() of
 * that store from inside its own callback would wait for itself, and
 * returns TW_EDEADLK instead (src/durable.c). */
extern _Thread_local tw_durable *tw__durable_running;

/* Every backend calls its callbacks through this. */
static inline int tw__durable_fire(tw_durable *d, tw_durable_fire_fn fn,
                                   const tw_durable_timer *t, void *arg)
{
    tw_durable *outer = tw__durable_running;
    tw__durable_running = d;
    int res = fn(d, t, arg);
    tw__durable_running = outer;
    return res;
}

/* The first non-zero result of @items, or 0: what a schedule_many call
 * returns once every item's result is set. */
static inline int tw__durable_first_error(const tw_durable_item *items,
                                          size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (items[i].result)
            return items[i].result;
    return 0;
}

/* A store's retry policy (cfg.max_attempts, retry_*; src/durable_dead.c),
 * applied by both backends the same way. */
struct tw__retry {
    uint32_t max_attempts; /* 0: no limit */
    uint32_t base_ms, max_ms, jitter_pct;
};
#define TW__RETRY_DEAD (-1) /* tw__retry_next(): to the dead letters */

/* The policy of @cfg (checked by tw_durable_open()). */
void tw__retry_init(struct tw__retry *p, const tw_durable_config *cfg);
/* What follows a delivery of @attempt whose callback returned @r: 0 done,
 * n > 0 deliver again in n ms, or TW__RETRY_DEAD. */
int tw__retry_next(const struct tw__retry *p, uint32_t attempt, int r);
/* Whether a delivery of @attempt may run its callback at all: one past
 * max_attempts (the earlier ones crashed) goes to the dead letters. */
static inline bool tw__retry_may(const struct tw__retry *p, uint32_t attempt)
{
    return !p->max_attempts || attempt <= p->max_attempts;
}

/* The Redis backend's open (src/durable_redis.c). @cfg has been checked for
 * the shared fields and cfg->redis is non-NULL. */
int tw__durable_redis_open(tw_durable **out, const tw_durable_config *cfg);

#endif
