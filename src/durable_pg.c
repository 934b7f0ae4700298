/* SPDX-License-Identifier: MIT */
/*
 * src/durable_pg.c - durable timers on PostgreSQL: open, close, the
 * changes (schedule, cancel, their conditional forms, restore) and stats.
 *
 * The database is the source of truth: a timer is a row of twheel.timers
 * (src/durable_pg_schema.c), every change one statement in its own
 * transaction, acknowledged once committed, and any other client may
 * change the same rows by SQL inside its own transactions. Every handle
 * that opens a namespace (cfg.postgres_namespace) fires it: its firer
 * (src/durable_pg_fire.c) claims the rows due by the handle's wall clock
 * with FOR UPDATE SKIP LOCKED, so nodes never wait for each other's
 * claims, and hands them to the shared executor. A claim is a lease
 * (cfg.lease_ms by the database's clock): a node that dies mid-delivery
 * leaves its rows to whoever claims them after the lease (attempt + 1).
 * What a change through this handle stops, and how completions are fenced
 * by row versions: src/durable_pg.h.
 *
 * tw_durable_schedule_many is one statement a batch
 * (src/durable_pg_many.c); cancel_many is a loop over the single cancel
 * here: one round trip an item.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "durable_pg.h"
#include "common.h"

static char *dup_str(const char *s)
{
    size_t n = strlen(s) + 1;
    char *p = tw__malloc(n);
    if (p)
        memcpy(p, s, n);
    return p;
}

static int pg_schedule(tw_durable *base, const void *key, size_t key_len,
                       int64_t due_ms, const void *payload, size_t payload_len)
{
    struct pgd *d = (struct pgd *)base;
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_nskey(&p, d, key, key_len);
    tw__pg_p_i64(&p, due_ms);
    tw__pg_p_bytes(&p, payload, payload_len);
    PGresult *r = NULL;
    int rc = tw__pg_run(d, "SELECT twheel.schedule($1, $2, $3, $4)", &p, &r);
    if (rc)
        return rc;
    int64_t ver = tw__pg_i64(r, 0, 0);
    PQclear(r);
    tw__pg_changed(d, key, key_len, ver);
    tw__pg_wake(d, due_ms);
    return 0;
}

static int pg_cancel(tw_durable *base, const void *key, size_t key_len)
{
    struct pgd *d = (struct pgd *)base;
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_nskey(&p, d, key, key_len);
    PGresult *r = NULL;
    int rc = tw__pg_run(d, "SELECT twheel.cancel_v($1, $2)", &p, &r);
    if (rc)
        return rc;
    int64_t ver = tw__pg_i64(r, 0, 0);
    PQclear(r);
    if (!ver)
        return TW_ENOENT;
    tw__pg_changed(d, key, key_len, ver);
    pthread_mutex_lock(&d->mu);
    d->cancelled++;
    pthread_mutex_unlock(&d->mu);
    return 0;
}

/* One conditional item: the function's answer to a TW_E* code. */
static int cond_one(struct pgd *d, tw_durable_item *it,
                    const struct tw__cond *c, bool sched)
{
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_nskey(&p, d, it->key, it->key_len);
    if (sched) {
        tw__pg_p_i64(&p, it->due_ms);
        tw__pg_p_bytes(&p, it->payload, it->payload_len);
    }
    if (c->expect)
        tw__pg_p_bytes(&p, c->expect, c->expect_len);
    else
        tw__pg_p_null(&p);
    PGresult *r = NULL;
    int rc = tw__pg_run(d,
                        sched ? "SELECT twheel.schedule_if($1, $2, $3, $4, $5)"
                              : "SELECT twheel.cancel_if($1, $2, $3)",
                        &p, &r);
    if (rc)
        return rc;
    int64_t ver = tw__pg_i64(r, 0, 0);
    PQclear(r);
    if (ver == -1)
        return TW_ESTALE;
    if (ver == -2)
        return TW_ENOENT;
    tw__pg_changed(d, it->key, it->key_len, ver);
    if (sched)
        tw__pg_wake(d, it->due_ms);
    else {
        pthread_mutex_lock(&d->mu);
        d->cancelled++;
        pthread_mutex_unlock(&d->mu);
    }
    return 0;
}

static int pg_schedule_if(tw_durable *base, tw_durable_item *items,
                          const struct tw__cond *cond, size_t n)
{
    for (size_t i = 0; i < n; i++)
        items[i].result = cond_one((struct pgd *)base, &items[i], &cond[i], 1);
    return tw__durable_first_error(items, n);
}

static int pg_cancel_if(tw_durable *base, tw_durable_item *items,
                        const struct tw__cond *cond, size_t n)
{
    for (size_t i = 0; i < n; i++)
        items[i].result = cond_one((struct pgd *)base, &items[i], &cond[i], 0);
    return tw__durable_first_error(items, n);
}

static int pg_restore(tw_durable *base, const tw_durable_scanned *t)
{
    struct pgd *d = (struct pgd *)base;
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_nskey(&p, d, t->key, t->key_len);
    tw__pg_p_i64(&p, t->due_ms);
    tw__pg_p_bytes(&p, t->payload, t->payload_len);
    tw__pg_p_i32(&p,
                 (int32_t)(t->attempt > INT32_MAX ? INT32_MAX : t->attempt));
    unsigned char dead = t->state == TW_DURABLE_DEAD;
    p.n++;
    p.v[p.n - 1] = (const char *)(dead ? "\1" : "\0");
    p.len[p.n - 1] = 1;
    p.fmt[p.n - 1] = 1;
    p.type[p.n - 1] = 16; /* bool */
    PGresult *r = NULL;
    int rc =
        tw__pg_run(d, "SELECT twheel.restore($1, $2, $3, $4, $5, $6)", &p, &r);
    if (rc)
        return rc;
    int64_t v = tw__pg_i64(r, 0, 0);
    PQclear(r);
    if (v < 0)
        return TW_EEXIST;
    if (!dead)
        tw__pg_wake(d, t->due_ms);
    return 0;
}

static int pg_stats(tw_durable *base, tw_durable_stats *out)
{
    struct pgd *d = (struct pgd *)base;
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_text(&p, d->ns);
    tw__pg_p_i64(&p, tw__pg_wall(d));
    PGresult *r = NULL;
    int rc =
        tw__pg_run(d,
                   "SELECT (SELECT count(*) FROM twheel.timers WHERE ns = $1),"
                   " (SELECT count(*) FROM twheel.timers WHERE ns = $1"
                   "  AND greatest(due, 0) <= $2 AND (lease_until IS NULL"
                   "  OR lease_until < clock_timestamp())),"
                   " (SELECT count(*) FROM twheel.dead WHERE ns = $1),"
                   " (SELECT count(*) FROM twheel.quarantine WHERE ns = $1)",
                   &p, &r);
    if (rc)
        return rc;
    out->pending = (uint64_t)tw__pg_i64(r, 0, 0);
    uint64_t unclaimed = (uint64_t)tw__pg_i64(r, 0, 1);
    out->dead = (uint64_t)tw__pg_i64(r, 0, 2);
    out->quarantined = (uint64_t)tw__pg_i64(r, 0, 3);
    PQclear(r);
    pthread_mutex_lock(&d->mu);
    tw__durable_counts_stats(&d->counts, out);
    out->backlog += unclaimed;
    out->cancelled = d->cancelled;
    out->recovered = d->recovered;
    out->recovery_us = d->recovery_us;
    pthread_mutex_unlock(&d->mu);
    return 0;
}

static void pg_free(struct pgd *d)
{
    tw__pg_pool_close(&d->pool);
    pthread_mutex_destroy(&d->mu);
    for (size_t i = 0; i < d->nraced; i++)
        tw__free(d->raced[i].key);
    tw__free(d->raced);
    tw__free(d->conninfo);
    tw__free(d->ns);
    tw__free(d);
}

static int pg_close(tw_durable *base)
{
    struct pgd *d = (struct pgd *)base;
    if (!d->base.readonly && !d->nofire)
        tw__pg_fire_stop(d);
    pg_free(d);
    return 0;
}

static const struct tw_durable_ops pg_ops = {
    .schedule = pg_schedule,
    .schedule_many = tw__pg_schedule_many, /* src/durable_pg_many.c */
    .cancel = pg_cancel,
    .close = pg_close,
    .stats = pg_stats,
    .get = tw__pg_get,
    .list = tw__pg_list,
    .scan = tw__pg_scan,
    .dead_op = tw__pg_dead_op,
    .list_dead = tw__pg_list_dead,
    .touch = tw__pg_touch,
    .schedule_if = pg_schedule_if,
    .cancel_if = pg_cancel_if,
    .restore = pg_restore,
};

/* The handle's fields from @cfg; 0 or TW_ENOMEM. */
static int pg_init(struct pgd *d, const tw_durable_config *cfg)
{
    d->base.ops = &pg_ops;
    atomic_init(&d->base.closing, false);
    d->base.readonly = cfg->flags & TW_DURABLE_READONLY;
    d->nofire = cfg->flags & TW_DURABLE_NOFIRE;
    d->fire = cfg->fire;
    d->fire_arg = cfg->fire_arg;
    d->wall_ms = cfg->wall_ms ? cfg->wall_ms : tw__durable_real_wall_ms;
    d->clock_arg = cfg->clock_arg;
    d->injected = cfg->wall_ms != NULL;
    d->lease_ms = cfg->lease_ms ? cfg->lease_ms : 30000;
    d->nexec = cfg->executor_threads;
    d->hint = INT64_MAX;
    d->evfd = -1;
    tw__retry_init(&d->retry, cfg);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    char host[64] = "";
    gethostname(host, sizeof host - 1);
    snprintf(d->node, sizeof d->node, "%s:%ld:%lx", host, (long)getpid(),
             (unsigned long)(ts.tv_nsec ^ (long)(uintptr_t)d));
    d->conninfo = dup_str(cfg->postgres);
    d->ns = dup_str(cfg->postgres_namespace ? cfg->postgres_namespace : "tw");
    if (!d->conninfo || !d->ns || pthread_mutex_init(&d->mu, NULL)) {
        tw__free(d->conninfo);
        tw__free(d->ns);
        return TW_ENOMEM;
    }
    if (tw__pg_pool_init(&d->pool)) {
        pthread_mutex_destroy(&d->mu);
        tw__free(d->conninfo);
        tw__free(d->ns);
        return TW_ENOMEM;
    }
    return 0;
}

/* Install or check the schema, count what is pending (stats.recovered). */
static int pg_prepare(struct pgd *d, const tw_durable_config *cfg)
{
    int rc = 0;
    char *perr = NULL;
    PQconninfoOption *opts = PQconninfoParse(d->conninfo, &perr);
    PQconninfoFree(opts);
    if (!opts) {
        /* libpq's message quotes the bad part; a password may be in it. */
        tw__durable_errmsg(cfg, "postgres: not a valid connection string");
        PQfreemem(perr);
        return TW_EINVAL;
    }
    /* The first connection of the pool, made here for open's message. */
    int ms = 0;
    PGconn *c =
        tw__pg_connect(d->conninfo, &ms, &rc, cfg->errbuf, cfg->errbuf_len);
    if (!c)
        return rc;
    atomic_store(&d->call_ms, ms);
    d->pool.c[0] = c;
    d->pool.busy[0] = true;
    uint64_t t0 = tw__pg_mono_ms();
    rc = tw__pg_schema(c, ms, d->base.readonly, cfg->errbuf, cfg->errbuf_len);
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_text(&p, d->ns);
    PGresult *r = NULL;
    if (!rc && !(rc = tw__pg_exec(
                     c, ms, "SELECT count(*) FROM twheel.timers WHERE ns = $1",
                     &p, &r))) {
        d->recovered = (uint64_t)tw__pg_i64(r, 0, 0);
        d->recovery_us = (tw__pg_mono_ms() - t0) * 1000u;
        PQclear(r);
    }
    tw__pg_give(d, c, rc == TW_ECONN || PQstatus(c) != CONNECTION_OK);
    return rc;
}

int tw__durable_pg_open(tw_durable **out, const tw_durable_config *cfg)
{
    /* A namespace is the NOTIFY payload of every schedule (at most 8000
     * bytes) and part of the primary key beside a key of up to 1 KiB (an
     * index entry holds at most ~2.7 KiB): held to Redis's 64 bytes. */
    const char *ns = cfg->postgres_namespace;
    if (!cfg->postgres[0] || (ns && (!ns[0] || strlen(ns) > PG_NS_MAX))) {
        tw__durable_errmsg(cfg, cfg->postgres[0]
                                    ? "postgres_namespace: 1 to "
                                      "64 bytes"
                                    : "postgres: empty connection string");
        return TW_EINVAL;
    }
    struct pgd *d = tw__calloc(1, sizeof *d);
    if (!d)
        return TW_ENOMEM;
    int rc = pg_init(d, cfg);
    if (rc) {
        tw__free(d);
        return rc;
    }
    rc = pg_prepare(d, cfg);
    if (!rc && !d->base.readonly && !d->nofire)
        rc = tw__pg_fire_start(d);
    if (rc) {
        pg_free(d);
        return rc;
    }
    *out = &d->base;
    return 0;
}
