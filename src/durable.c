/* SPDX-License-Identifier: MIT */
/*
 * src/durable.c - STAND-IN for building the Redis backend on its own: the
 * public calls of twheel/durable.h, dispatching to the Redis backend only.
 * The journal backend's src/durable.c replaces this file whole; nothing of
 * the Redis backend lives here.
 */
#include "twheel/durable.h"

#include "durable_backend.h"

#ifndef TWHEEL_HAVE_REDIS
int tw__durable_redis_open(tw_durable **out, const tw_durable_config *cfg)
{
    (void)out;
    (void)cfg;
    return TW_EINVAL;
}
#endif

int tw_durable_open(tw_durable **out, const tw_durable_config *cfg)
{
    if (!out || !cfg || !cfg->fire)
        return TW_EINVAL;
    if (cfg->redis)
        return tw__durable_redis_open(out, cfg);
    return TW_EINVAL; /* the journal backend is not in this stand-in */
}

static int key_ok(const void *key, size_t key_len)
{
    return key && key_len >= 1 && key_len <= TW_DURABLE_KEY_MAX;
}

int tw_durable_schedule(tw_durable *d, const void *key, size_t key_len,
                        int64_t due_ms, const void *payload, size_t payload_len)
{
    if (!d || !key_ok(key, key_len) || payload_len > TW_DURABLE_PAYLOAD_MAX ||
        (payload_len && !payload))
        return TW_EINVAL;
    return d->ops->schedule(d, key, key_len, due_ms, payload, payload_len);
}

int tw_durable_cancel(tw_durable *d, const void *key, size_t key_len)
{
    if (!d || !key_ok(key, key_len))
        return TW_EINVAL;
    return d->ops->cancel(d, key, key_len);
}

int tw_durable_close(tw_durable *d)
{
    return d ? d->ops->close(d) : 0;
}

int tw_durable_stats_get(tw_durable *d, tw_durable_stats *out)
{
    if (!d || !out)
        return TW_EINVAL;
    return d->ops->stats(d, out);
}
