/* SPDX-License-Identifier: MIT */
/*
 * src/durable_pg_query.c - the PostgreSQL backend's look-ups: get, list,
 * scan, and the dead letters (list, rearm, delete).
 *
 * Each call is one statement, so one snapshot. list walks the index
 * (ns, greatest(due, 0), key) from the cursor's (due, key) with a row
 * comparison, so a page costs O(log n + max) whatever its depth; list_dead
 * walks the dead letters' primary key. scan pages through both tables by
 * key, SCAN_PAGE rows a statement, and calls the caller's function with no
 * connection held (it may call the store). A timer is DUE once its due
 * time has come by the handle's wall clock, and a pending timer's next
 * attempt is attempts + 1 unless a node holds a live claim of it (then
 * the delivery under way is attempt = attempts).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "durable_pg.h"
#include "common.h"

#define SCAN_PAGE 1000

int tw__pg_get(tw_durable *base, const void *key, size_t key_len,
               tw_durable_info *info, void *buf, size_t buf_len)
{
    struct pgd *d = (struct pgd *)base;
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_nskey(&p, d, key, key_len);
    PGresult *r = NULL;
    int rc = tw__pg_run(
        d,
        "SELECT due, attempts, payload, coalesce(lease_until >"
        " clock_timestamp(), false), false FROM twheel.timers"
        " WHERE ns = $1 AND key = $2 UNION ALL"
        " SELECT due, attempts, payload, false, true FROM twheel.dead"
        " WHERE ns = $1 AND key = $2",
        &p, &r);
    if (rc)
        return rc;
    if (!PQntuples(r)) {
        PQclear(r);
        return TW_ENOENT;
    }
    info->due_ms = tw__pg_i64(r, 0, 0);
    int32_t att = tw__pg_i32(r, 0, 1);
    bool claimed = tw__pg_bool(r, 0, 3), dead = tw__pg_bool(r, 0, 4);
    info->attempt = (uint32_t)(att < 0 ? 0 : att) + (dead || claimed ? 0 : 1);
    if (!info->attempt)
        info->attempt = 1;
    info->state = dead                             ? TW_DURABLE_DEAD
                  : info->due_ms <= tw__pg_wall(d) ? TW_DURABLE_DUE
                                                   : TW_DURABLE_WAITING;
    info->payload_len = (size_t)PQgetlength(r, 0, 2);
    if (buf_len)
        memcpy(buf, PQgetvalue(r, 0, 2),
               info->payload_len < buf_len ? info->payload_len : buf_len);
    PQclear(r);
    return 0;
}

/* Rows (key, due) of @r into @out as tw__list_put() takes them. */
static int put_rows(const struct pgd *d, const struct tw__list_req *q,
                    const PGresult *r, tw_durable_entry *out, bool *end,
                    uint32_t state)
{
    int n = PQntuples(r);
    size_t used = 0;
    int64_t now = tw__pg_wall(d);
    int i = 0;
    for (; i < n; i++) {
        int64_t due = tw__pg_i64(r, i, 1);
        if (!tw__list_put(q, &used, &out[i], PQgetvalue(r, i, 0),
                          (size_t)PQgetlength(r, i, 0),
                          due > 0 ? (uint64_t)due : 0, now))
            break;
        if (state)
            out[i].state = state;
    }
    *end = i == n && (size_t)n < q->max;
    return i;
}

int tw__pg_list(tw_durable *base, const struct tw__list_req *q,
                tw_durable_entry *out, bool *end)
{
    struct pgd *d = (struct pgd *)base;
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_text(&p, d->ns);
    tw__pg_p_i64(&p, q->from > INT64_MAX ? INT64_MAX : (int64_t)q->from);
    /* !after: from the first key of @from (keys are never empty). */
    tw__pg_p_bytes(&p, q->after ? q->key : NULL, q->after ? q->key_len : 0);
    tw__pg_p_i64(&p, q->to > INT64_MAX ? -1 : (int64_t)q->to);
    tw__pg_p_i64(&p, (int64_t)q->max);
    PGresult *r = NULL;
    int rc = tw__pg_run(
        d,
        "SELECT key, greatest(due, 0) FROM twheel.timers WHERE ns = $1"
        " AND (greatest(due, 0), key) > ($2, $3)"
        " AND ($4 < 0 OR greatest(due, 0) < $4)"
        " ORDER BY greatest(due, 0), key LIMIT $5",
        &p, &r);
    if (rc)
        return rc;
    int n = put_rows(d, q, r, out, end, 0);
    PQclear(r);
    return n;
}

int tw__pg_list_dead(tw_durable *base, const struct tw__list_req *q,
                     tw_durable_entry *out, bool *end)
{
    struct pgd *d = (struct pgd *)base;
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_text(&p, d->ns);
    tw__pg_p_bytes(&p, q->after ? q->key : NULL, q->after ? q->key_len : 0);
    tw__pg_p_i64(&p, (int64_t)q->max);
    PGresult *r = NULL;
    int rc = tw__pg_run(d,
                        "SELECT key, due FROM twheel.dead WHERE ns = $1"
                        " AND key > $2 ORDER BY key LIMIT $3",
                        &p, &r);
    if (rc)
        return rc;
    int n = put_rows(d, q, r, out, end, TW_DURABLE_DEAD);
    PQclear(r);
    return n;
}

/* One page of @table after @key: rows (key, payload, due, attempts,
 * claimed). */
static int scan_page(struct pgd *d, bool dead, const void *key, size_t key_len,
                     PGresult **r)
{
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_nskey(&p, d, key, key_len);
    tw__pg_p_i32(&p, SCAN_PAGE);
    return tw__pg_run(
        d,
        dead ? "SELECT key, payload, due, attempts, false FROM twheel.dead"
               " WHERE ns = $1 AND key > $2 ORDER BY key LIMIT $3"
             : "SELECT key, payload, due, attempts, coalesce(lease_until >"
               " clock_timestamp(), false) FROM twheel.timers"
               " WHERE ns = $1 AND key > $2 ORDER BY key LIMIT $3",
        &p, r);
}

/* Hand the rows of @r to @fn; > 0 when @fn stopped the scan (its value
 * in *@stop). */
static int scan_rows(struct pgd *d, bool dead, const PGresult *r,
                     tw_durable_scan_fn fn, void *arg, long *count, int *stop)
{
    int64_t now = tw__pg_wall(d);
    for (int i = 0; i < PQntuples(r); i++) {
        int32_t att = tw__pg_i32(r, i, 3);
        bool claimed = tw__pg_bool(r, i, 4);
        tw_durable_scanned t = {PQgetvalue(r, i, 0),
                                (size_t)PQgetlength(r, i, 0),
                                PQgetvalue(r, i, 1),
                                (size_t)PQgetlength(r, i, 1),
                                tw__pg_i64(r, i, 2),
                                (uint32_t)(att < 0 ? 0 : att),
                                0};
        if (!dead && !claimed)
            t.attempt++;
        if (!t.attempt)
            t.attempt = 1;
        t.state = dead              ? TW_DURABLE_DEAD
                  : t.due_ms <= now ? TW_DURABLE_DUE
                                    : TW_DURABLE_WAITING;
        (*count)++;
        int s = fn(arg, &t);
        if (s) {
            *stop = s;
            return 1;
        }
    }
    return 0;
}

long tw__pg_scan(tw_durable *base, tw_durable_scan_fn fn, void *arg)
{
    struct pgd *d = (struct pgd *)base;
    long count = 0;
    for (int dead = 0; dead < 2; dead++) {
        unsigned char last[TW_DURABLE_KEY_MAX];
        size_t last_len = 0;
        for (;;) {
            PGresult *r = NULL;
            int rc = scan_page(d, dead, last, last_len, &r);
            if (rc)
                return rc;
            int n = PQntuples(r), stop = 0;
            if (n) {
                last_len = (size_t)PQgetlength(r, n - 1, 0);
                if (last_len > sizeof last)
                    last_len = sizeof last;
                memcpy(last, PQgetvalue(r, n - 1, 0), last_len);
            }
            int s = scan_rows(d, dead, r, fn, arg, &count, &stop);
            PQclear(r);
            if (s)
                return stop < 0 ? stop : count;
            if (n < SCAN_PAGE)
                break;
        }
    }
    return count;
}

int tw__pg_dead_op(tw_durable *base, const void *key, size_t key_len,
                   int64_t due_ms, bool del)
{
    struct pgd *d = (struct pgd *)base;
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_nskey(&p, d, key, key_len);
    if (!del)
        tw__pg_p_i64(&p, due_ms);
    PGresult *r = NULL;
    int rc = tw__pg_run(
        d,
        del ? "DELETE FROM twheel.dead WHERE ns = $1 AND key = $2"
            : "WITH x AS (DELETE FROM twheel.dead WHERE ns = $1 AND key = $2"
              " RETURNING payload) INSERT INTO twheel.timers"
              " (ns, key, due, payload) SELECT $1, $2, $3, payload FROM x"
              " ON CONFLICT (ns, key) DO NOTHING",
        &p, &r);
    if (rc)
        return rc;
    bool hit = atoi(PQcmdTuples(r)) == 1;
    PQclear(r);
    if (!hit)
        return TW_ENOENT;
    if (!del)
        tw__pg_wake(d, due_ms);
    return 0;
}
