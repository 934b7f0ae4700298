/* SPDX-License-Identifier: MIT */
/*
 * src/durable_dead.c - twheel/durable.h's retry policy and dead-letter
 * calls: the policy's arithmetic, which both backends apply after each
 * callback, and the argument checks of tw_durable_rearm(),
 * tw_durable_dead_delete(), tw_durable_list_dead() and tw_durable_touch()
 * before the backend's operation (src/durable_backend.h). Where a backend
 * keeps its dead letters is described with the backend
 * (src/durable_journal.c, src/durable_redis.c).
 */
#define _GNU_SOURCE

#include "twheel/durable.h"

#include <limits.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "durable_backend.h"

#define RETRY_MS_DEFAULT 1000u

void tw__retry_init(struct tw__retry *p, const tw_durable_config *cfg)
{
    p->max_attempts = cfg->max_attempts;
    p->base_ms = cfg->retry_ms ? cfg->retry_ms : RETRY_MS_DEFAULT;
    p->max_ms = cfg->retry_max_ms;
    p->jitter_pct = cfg->retry_jitter_pct;
}

/* A random 64-bit word per thread (xorshift64*, seeded once from the
 * system): jitter needs spread, not secrecy. */
static uint64_t rnd(void)
{
    static _Thread_local uint64_t x;
    if (!x) {
        if (getrandom(&x, sizeof x, GRND_NONBLOCK) != (ssize_t)sizeof x)
            x = (uint64_t)time(NULL) ^ (uint64_t)(uintptr_t)&x;
        x |= 1;
    }
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    return x * UINT64_C(2685821657736338717);
}

/* The backoff before delivery @attempt + 1. */
static uint64_t backoff(const struct tw__retry *p, uint32_t attempt)
{
    uint64_t ms = p->base_ms;
    if (p->max_ms > p->base_ms) {
        /* base * 2^(attempt - 1), at most max_ms: doubling stops there. */
        for (uint32_t i = 1; i < attempt && ms < p->max_ms; i++)
            ms *= 2;
        if (ms > p->max_ms)
            ms = p->max_ms;
    }
    if (p->jitter_pct && ms > 1)
        ms -= rnd() % (ms * p->jitter_pct / 100 + 1);
    return ms ? ms : 1;
}

int tw__retry_next(const struct tw__retry *p, uint32_t attempt, int r)
{
    if (r == TW_DURABLE_FIRE_DEAD)
        return TW__RETRY_DEAD;
    if (r <= 0 && r != TW_DURABLE_FIRE_RETRY)
        return 0;
    if (p->max_attempts && attempt >= p->max_attempts)
        return TW__RETRY_DEAD;
    if (r > 0)
        return r;
    uint64_t ms = backoff(p, attempt);
    return ms > INT_MAX ? INT_MAX : (int)ms;
}

static bool key_ok(const void *key, size_t key_len)
{
    return key && key_len >= 1 && key_len <= TW_DURABLE_KEY_MAX;
}

/* 0, or why a change of @d is refused. */
static int refuse(tw_durable *d, bool change)
{
    if (atomic_load_explicit(&d->closing, memory_order_acquire))
        return TW_ESHUTDOWN;
    return change && d->readonly ? TW_EROFS : 0;
}

static int dead_op(tw_durable *d, const void *key, size_t key_len,
                   int64_t due_ms, bool del)
{
    if (!d || !key_ok(key, key_len))
        return TW_EINVAL;
    int rc = refuse(d, true);
    if (rc)
        return rc;
    return d->ops->dead_op ? d->ops->dead_op(d, key, key_len, due_ms, del)
                           : TW_ENOENT;
}

int tw_durable_rearm(tw_durable *d, const void *key, size_t key_len,
                     int64_t due_ms)
{
    return dead_op(d, key, key_len, due_ms, false);
}

int tw_durable_dead_delete(tw_durable *d, const void *key, size_t key_len)
{
    return dead_op(d, key, key_len, 0, true);
}

int tw_durable_restore(tw_durable *d, const tw_durable_scanned *t)
{
    if (!d || !t || !key_ok(t->key, t->key_len) ||
        t->payload_len > TW_DURABLE_PAYLOAD_MAX ||
        (!t->payload && t->payload_len))
        return TW_EINVAL;
    int rc = refuse(d, true);
    if (rc)
        return rc;
    return d->ops->restore ? d->ops->restore(d, t) : TW_EINVAL;
}

int tw_durable_touch(tw_durable *d, const void *key, size_t key_len)
{
    if (!d || !key_ok(key, key_len))
        return TW_EINVAL;
    int rc = refuse(d, true);
    if (rc)
        return rc;
    return d->ops->touch ? d->ops->touch(d, key, key_len) : TW_ENOENT;
}

int tw_durable_list_dead(tw_durable *d, tw_durable_cursor *cur,
                         tw_durable_entry *out, size_t max, void *keybuf,
                         size_t keybuf_len)
{
    if (!d || !cur || !out || !max || !keybuf || !keybuf_len ||
        cur->key_len > TW_DURABLE_KEY_MAX)
        return TW_EINVAL;
    int rc = refuse(d, false);
    if (rc)
        return rc;
    struct tw__list_req q = {
        .key = cur->key,
        .key_len = cur->key_len,
        .after = cur->key_len > 0,
        .max = max > INT_MAX ? (size_t)INT_MAX : max,
        .keybuf = keybuf,
        .keybuf_len = keybuf_len,
    };
    bool end = !d->ops->list_dead;
    int n = d->ops->list_dead ? d->ops->list_dead(d, &q, out, &end) : 0;
    if (n < 0)
        return n;
    if (n == 0 && !end)
        return TW_EINVAL; /* the next key does not fit @keybuf */
    if (n > 0) {
        const tw_durable_entry *last = &out[n - 1];
        cur->due_ms = 0;
        cur->key_len = (uint32_t)last->key_len;
        memmove(cur->key, last->key, last->key_len);
    }
    cur->done = end;
    return n;
}
