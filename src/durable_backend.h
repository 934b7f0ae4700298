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

#include "twheel/durable.h"

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
};

struct tw_durable {
    const struct tw_durable_ops *ops;
    /* tw_durable_close() has begun: the public calls refuse every change
     * (TW_ESHUTDOWN) from then on, for every backend (src/durable.c). */
    atomic_bool closing;
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

/* The Redis backend's open (src/durable_redis.c). @cfg has been checked for
 * the shared fields and cfg->redis is non-NULL. */
int tw__durable_redis_open(tw_durable **out, const tw_durable_config *cfg);

#endif
