/* SPDX-License-Identifier: MIT */
/*
 * src/durable.c - twheel/durable.h's public calls, the front of the
 * durable layer that both backends share.
 *
 * A call is checked here (NULL, empty or oversized key, oversized
 * payload, a store closing or read-only) and then dispatched through the
 * store's ops table (src/durable_backend.h) to the journal backend
 * (src/durable_journal.c, cfg->dir) or the Redis backend
 * (src/durable_redis.c, cfg->redis). The way back, a due timer's
 * delivery, is shared as well: a backend hands its deliveries to one
 * executor (src/durable_exec.c), which runs them inline or on
 * cfg->executor_threads threads and keeps the delivery counters of
 * tw_durable_stats; tw__durable_fire() marks the thread as inside a
 * callback (tw__durable_running, defined here), so that
 * tw_durable_close() from there is TW_EDEADLK instead of a wait for
 * itself; and once close has begun every change is refused with
 * TW_ESHUTDOWN. Calls made on many threads at once are batched by the
 * call combiner (src/durable_combine.c). The default clocks and the error
 * messages of open are here too. The retry policy and the dead-letter
 * calls are in src/durable_dead.c, look-ups in src/durable_query.c,
 * metrics in src/durable_metrics.c.
 */
#define _GNU_SOURCE

#include "twheel/durable.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "durable_backend.h"
#include "durable_exec.h"
#include "common.h"

/* ------------------------------------------------------------------------ */
/* Clocks and messages. */

int64_t tw__durable_real_wall_ms(void *arg)
{
    (void)arg;
    return (int64_t)(tw__clock_ns(CLOCK_REALTIME) / 1000000u);
}

uint64_t tw__durable_real_mono_ns(void *arg)
{
    (void)arg;
    return tw__clock_ns(CLOCK_MONOTONIC);
}

void tw__durable_errmsg(const tw_durable_config *cfg, const char *fmt, ...)
{
    if (!cfg->errbuf || !cfg->errbuf_len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cfg->errbuf, cfg->errbuf_len, fmt, ap);
    va_end(ap);
}

/* ------------------------------------------------------------------------ */
/* Public calls. */

#ifndef TWHEEL_HAVE_REDIS
/* Without the Redis backend built in, asking for it is a bad config. */
int tw__durable_redis_open(tw_durable **out, const tw_durable_config *cfg)
{
    (void)out;
    (void)cfg;
    return TW_EINVAL;
}
#endif

#ifndef TWHEEL_HAVE_POSTGRES
/* Without the PostgreSQL backend built in, asking for it is a bad config. */
int tw__durable_pg_open(tw_durable **out, const tw_durable_config *cfg)
{
    (void)out;
    tw__durable_errmsg(cfg, "postgres: this twheel was built without libpq");
    return TW_EINVAL;
}
#endif

int tw_durable_open_sized(tw_durable **out, const tw_durable_config *cfg,
                          size_t cfg_size)
{
    tw_durable_config c;
    if (cfg == NULL)
        return TW_EINVAL;
    int rc = tw__config_copy(&c, sizeof c, cfg, cfg_size);
    if (rc != 0) {
        /* Only a struct larger than ours fails, so @cfg holds errbuf. */
        tw__durable_errmsg(
            cfg,
            "config: a field of a newer twheel is set (this library "
            "knows %zu of the struct's %zu bytes)",
            sizeof c, cfg_size);
        return rc;
    }
    return (tw_durable_open)(out, &c);
}

/* The fields every backend shares, and which backend: TW_EINVAL with a
 * message naming the field, or 0. */
static int check_config(tw_durable **out, const tw_durable_config *cfg)
{
    if (!out) {
        tw__durable_errmsg(cfg, "out: NULL");
        return TW_EINVAL;
    }
    if (!cfg->fire) {
        tw__durable_errmsg(cfg, "fire: a callback is required");
        return TW_EINVAL;
    }
    if (cfg->postgres && (cfg->redis || cfg->dir)) {
        tw__durable_errmsg(cfg, "postgres: set neither dir nor redis with it");
        return TW_EINVAL;
    }
    if (cfg->redis && cfg->dir) {
        tw__durable_errmsg(cfg,
                           "dir and redis: set one (dir: a journal in that "
                           "directory; redis: the Redis backend)");
        return TW_EINVAL;
    }
    if (!cfg->redis && !cfg->postgres && (!cfg->dir || !cfg->dir[0])) {
        tw__durable_errmsg(cfg,
                           "dir: required (the journal's directory), or redis");
        return TW_EINVAL;
    }
    if (cfg->retry_jitter_pct > 100) {
        tw__durable_errmsg(cfg, "retry_jitter_pct: 0 .. 100");
        return TW_EINVAL;
    }
    if (cfg->redis && cfg->redis_check_gap_ms > 1000) {
        tw__durable_errmsg(cfg, "redis_check_gap_ms: 0 .. 1000 (0: 4)");
        return TW_EINVAL;
    }
    if (cfg->redis && cfg->shards > (1u << 20)) {
        tw__durable_errmsg(cfg, "shards: 0 < n <= 1048576 (0: 64)");
        return TW_EINVAL;
    }
    return 0;
}

int(tw_durable_open)(tw_durable **out, const tw_durable_config *cfg)
{
    if (!cfg)
        return TW_EINVAL;
    if (cfg->errbuf && cfg->errbuf_len)
        cfg->errbuf[0] = 0;
    int rc = check_config(out, cfg);
    if (!rc)
        rc = cfg->postgres ? tw__durable_pg_open(out, cfg)
             : cfg->redis  ? tw__durable_redis_open(out, cfg)
                           : tw__durable_journal_open(out, cfg);
    /* Every failure says something, if only the code's meaning. Never
     * cfg->redis itself: a URL may hold a password. */
    if (rc && cfg->errbuf && cfg->errbuf_len && !cfg->errbuf[0])
        tw__durable_errmsg(cfg, "%s: %s",
                           cfg->postgres ? "postgres"
                           : cfg->redis  ? "redis"
                                         : cfg->dir,
                           tw_strerror(rc));
    return rc;
}

static bool key_ok(const void *key, size_t key_len)
{
    return key && key_len >= 1 && key_len <= TW_DURABLE_KEY_MAX;
}

/* Once close has begun (a callback calling in while close waits for it),
 * every change is refused, whatever the backend. */
static bool closing(tw_durable *d)
{
    return atomic_load_explicit(&d->closing, memory_order_acquire);
}

int tw_durable_schedule(tw_durable *d, const void *key, size_t key_len,
                        int64_t due_ms, const void *payload, size_t payload_len)
{
    if (!d || !key_ok(key, key_len) || payload_len > TW_DURABLE_PAYLOAD_MAX ||
        (payload_len && !payload))
        return TW_EINVAL;
    if (closing(d))
        return TW_ESHUTDOWN;
    if (d->readonly)
        return TW_EROFS;
    return d->ops->schedule(d, key, key_len, due_ms, payload, payload_len);
}

int tw_durable_cancel(tw_durable *d, const void *key, size_t key_len)
{
    if (!d || !key_ok(key, key_len))
        return TW_EINVAL;
    if (closing(d))
        return TW_ESHUTDOWN;
    if (d->readonly)
        return TW_EROFS;
    return d->ops->cancel(d, key, key_len);
}

_Thread_local tw_durable *tw__durable_running;

int tw_durable_close(tw_durable *d)
{
    if (!d)
        return 0;
    if (d == tw__durable_running)
        return TW_EDEADLK; /* it would wait for this very callback */
    atomic_store_explicit(&d->closing, true, memory_order_release);
    return d->ops->close(d);
}

static bool item_ok(const tw_durable_item *it)
{
    return key_ok(it->key, it->key_len) &&
           it->payload_len <= TW_DURABLE_PAYLOAD_MAX &&
           (!it->payload_len || it->payload);
}

/* Set each item's result to 0, TW_EINVAL (a cancel reads only the key)
 * or, once @d is closing, TW_ESHUTDOWN; returns how many are still 0. */
static size_t check_items(tw_durable *d, tw_durable_item *items, size_t n,
                          bool cancel)
{
    int refuse = closing(d) ? TW_ESHUTDOWN : d->readonly ? TW_EROFS : 0;
    size_t valid = 0;
    for (size_t i = 0; i < n; i++) {
        bool ok = cancel ? key_ok(items[i].key, items[i].key_len)
                         : item_ok(&items[i]);
        items[i].result = ok ? refuse : TW_EINVAL;
        valid += ok && !refuse;
    }
    return valid;
}

int tw_durable_schedule_many(tw_durable *d, tw_durable_item *items, size_t n)
{
    if (!n)
        return 0;
    if (!d || !items)
        return TW_EINVAL;
    if (check_items(d, items, n, false) == n && d->ops->schedule_many)
        return d->ops->schedule_many(d, items, n);
    for (size_t i = 0; i < n; i++) {
        tw_durable_item *it = &items[i];
        if (!it->result)
            it->result = d->ops->schedule(d, it->key, it->key_len, it->due_ms,
                                          it->payload, it->payload_len);
    }
    return tw__durable_first_error(items, n);
}

int tw_durable_cancel_many(tw_durable *d, tw_durable_item *items, size_t n)
{
    if (!n)
        return 0;
    if (!d || !items)
        return TW_EINVAL;
    if (check_items(d, items, n, true) == n && d->ops->cancel_many)
        return d->ops->cancel_many(d, items, n);
    for (size_t i = 0; i < n; i++)
        if (!items[i].result)
            items[i].result = d->ops->cancel(d, items[i].key, items[i].key_len);
    return tw__durable_first_error(items, n);
}

/* ------------------------------------------------------------------------ */
/* Conditional writes: checked here, then split into the items and the
 * conditions the backends take (struct tw__cond). */

/* Items converted on the stack up to this many; more take an allocation. */
#define IF_STACK 16

static bool cond_item_ok(const tw_durable_item_if *it, bool cancel)
{
    if (!key_ok(it->key, it->key_len) ||
        it->expect_len > TW_DURABLE_PAYLOAD_MAX ||
        (it->expect_len && !it->expect))
        return false;
    if (cancel)
        return it->expect != NULL; /* no "cancel if absent" */
    return it->payload_len <= TW_DURABLE_PAYLOAD_MAX &&
           (!it->payload_len || it->payload);
}

/* Check @in[0 .. n), copy the valid ones to @items and @cond (results 0,
 * TW_EINVAL, or TW_ESHUTDOWN or TW_EROFS for every item of a store that
 * refuses changes). Returns how many are still 0. */
static size_t split_if(tw_durable *d, tw_durable_item_if *in, size_t n,
                       bool cancel, tw_durable_item *items,
                       struct tw__cond *cond)
{
    int refuse = closing(d) ? TW_ESHUTDOWN : d->readonly ? TW_EROFS : 0;
    size_t valid = 0;
    for (size_t i = 0; i < n; i++) {
        bool ok = cond_item_ok(&in[i], cancel);
        in[i].result = ok ? refuse : TW_EINVAL;
        if (!ok || refuse)
            continue;
        items[valid] =
            (tw_durable_item){in[i].key,     in[i].key_len,     in[i].due_ms,
                              in[i].payload, in[i].payload_len, 0};
        cond[valid++] = (struct tw__cond){in[i].expect, in[i].expect_len};
    }
    return valid;
}

/* The conditional batch @in of @n items, schedules or cancels. */
static int run_if(tw_durable *d, tw_durable_item_if *in, size_t n, bool cancel)
{
    if (!n)
        return 0;
    if (!d || !in)
        return TW_EINVAL;
    tw_durable_item sitems[IF_STACK], *items = sitems;
    struct tw__cond scond[IF_STACK], *cond = scond;
    if (n > IF_STACK) {
        items = tw__malloc(n * sizeof *items);
        cond = tw__malloc(n * sizeof *cond);
        if (!items || !cond) {
            tw__free(items);
            tw__free(cond);
            for (size_t i = 0; i < n; i++)
                in[i].result = TW_ENOMEM;
            return TW_ENOMEM;
        }
    }
    size_t m = split_if(d, in, n, cancel, items, cond);
    if (m)
        (void)(cancel ? d->ops->cancel_if(d, items, cond, m)
                      : d->ops->schedule_if(d, items, cond, m));
    /* The valid items went out in order: give their results back. */
    for (size_t i = 0, j = 0; i < n && j < m; i++)
        if (!in[i].result)
            in[i].result = items[j++].result;
    if (items != sitems) {
        tw__free(items);
        tw__free(cond);
    }
    int first = 0;
    for (size_t i = 0; i < n && !first; i++)
        first = in[i].result;
    return first;
}

int tw_durable_schedule_many_if(tw_durable *d, tw_durable_item_if *items,
                                size_t n)
{
    return run_if(d, items, n, false);
}

int tw_durable_cancel_many_if(tw_durable *d, tw_durable_item_if *items,
                              size_t n)
{
    return run_if(d, items, n, true);
}

int tw_durable_schedule_if(tw_durable *d, const void *key, size_t key_len,
                           const void *expect, size_t expect_len,
                           int64_t due_ms, const void *payload,
                           size_t payload_len)
{
    tw_durable_item_if it = {key,         key_len, due_ms,     payload,
                             payload_len, expect,  expect_len, 0};
    if (!d)
        return TW_EINVAL;
    return run_if(d, &it, 1, false);
}

int tw_durable_cancel_if(tw_durable *d, const void *key, size_t key_len,
                         const void *expect, size_t expect_len)
{
    tw_durable_item_if it = {.key = key,
                             .key_len = key_len,
                             .expect = expect,
                             .expect_len = expect_len};
    if (!d)
        return TW_EINVAL;
    return run_if(d, &it, 1, true);
}

int tw_durable_stats_get_sized(tw_durable *d, tw_durable_stats *out,
                               size_t out_size)
{
    if (!d || !out || out_size < offsetof(tw_durable_stats, backlog))
        return TW_EINVAL;
    tw_durable_stats full;
    memset(&full, 0, sizeof full);
    int rc = d->ops->stats(d, &full);
    if (rc == 0)
        tw__stats_copy_out(out, out_size, &full, sizeof full);
    return rc;
}

int(tw_durable_stats_get)(tw_durable *d, tw_durable_stats *out)
{
    return tw_durable_stats_get_sized(d, out, sizeof(tw_durable_stats));
}
