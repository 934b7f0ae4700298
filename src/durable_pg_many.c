/* SPDX-License-Identifier: MIT */
/*
 * src/durable_pg_many.c - tw_durable_schedule_many() on PostgreSQL: a
 * batch in one statement, so one round trip and one commit for many
 * timers rather than one of each per timer.
 *
 * The items go as three arrays (keys bytea[], dues bigint[], payloads
 * bytea[]; binary, never spliced into SQL) to twheel.schedule_many()
 * (src/durable_pg_schema.c): one INSERT ... ON CONFLICT of their last
 * item per key, what a loop of single schedules does, item after item,
 * in one transaction. So a key given twice ends with its last item, a
 * pending key or a dead letter is replaced, each item gets the version
 * of its key's last write (the local rule of src/durable_pg.h holds for
 * each key: that version is above any of the key's earlier ones) and
 * NOTIFY is sent once at commit. A batch is cut into
 * statements of at most PG_MANY_ITEMS items and about PG_MANY_BYTES of
 * keys and payloads (each its own transaction, as the items of the loop
 * were).
 *
 * Results are per item as for the loop: a statement the server refused
 * (rolled back whole: a constraint, a lock timeout, a privilege) is run
 * again item by item through the single schedule, so that each item gets
 * its own result and the items that can be written are; a statement
 * whose connection failed (TW_ECONN: committed or not, unknown) gives
 * every item of it that code, as a single call does, and the next
 * statement is still tried.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <string.h>

#include "durable_pg.h"
#include "common.h"

#define PG_MANY_ITEMS 1000
#define PG_MANY_BYTES (8u << 20)

/* Array and element type OIDs (pg_type.dat). */
#define OID_BYTEA 17u
#define OID_INT8 20u
#define OID_BYTEA_ARR 1001u
#define OID_INT8_ARR 1016u

static const char many_sql[] =
    "SELECT u.v FROM unnest(twheel.schedule_many($1, $2::bytea[],"
    " $3::bigint[], $4::bytea[])) WITH ORDINALITY AS u(v, i) ORDER BY u.i";

static void put32(struct pgarr *a, uint32_t v)
{
    v = htonl(v);
    memcpy(a->b + a->len, &v, 4);
    a->len += 4;
}

void tw__pg_arr_head(struct pgarr *a, uint32_t elem, size_t n)
{
    put32(a, 1); /* dimensions */
    put32(a, 0); /* no NULLs */
    put32(a, elem);
    put32(a, (uint32_t)n); /* elements */
    put32(a, 1);           /* lower bound */
}

void tw__pg_arr_put(struct pgarr *a, const void *p, size_t n)
{
    put32(a, (uint32_t)n);
    if (n)
        memcpy(a->b + a->len, p, n);
    a->len += n;
}

void tw__pg_arr_i64(struct pgarr *a, int64_t v)
{
    unsigned char be[8];
    uint64_t u = (uint64_t)v;
    for (int i = 7; i >= 0; i--, u >>= 8)
        be[i] = (unsigned char)u;
    tw__pg_arr_put(a, be, 8);
}

void tw__pg_arr_null(struct pgarr *a)
{
    put32(a, UINT32_MAX); /* length -1 */
}

/* How many items from @items (@n of them) the next statement takes. */
static size_t chunk_len(const tw_durable_item *items, size_t n)
{
    size_t k = 0, bytes = 0;
    while (k < n && k < PG_MANY_ITEMS) {
        size_t b = items[k].key_len + items[k].payload_len;
        if (k && bytes + b > PG_MANY_BYTES)
            break;
        bytes += b;
        k++;
    }
    return k;
}

void tw__pg_p_arr(struct pgp *p, const struct pgarr *a, unsigned int type)
{
    int i = p->n++;
    p->v[i] = (const char *)a->b;
    p->len[i] = (int)a->len;
    p->fmt[i] = 1;
    p->type[i] = type;
}

/* The statement of @n items: 0 and the versions in *@r, or a code. */
static int many_exec(struct pgd *d, const tw_durable_item *it, size_t n,
                     PGresult **r)
{
    size_t kb = 20, pb = 20, db = 20 + 12 * n;
    for (size_t i = 0; i < n; i++)
        kb += 4 + it[i].key_len, pb += 4 + it[i].payload_len;
    struct pgarr k = {tw__malloc(kb), 0}, du = {tw__malloc(db), 0};
    struct pgarr pl = {tw__malloc(pb), 0};
    int rc = TW_ENOMEM;
    if (k.b && du.b && pl.b) {
        tw__pg_arr_head(&k, OID_BYTEA, n);
        tw__pg_arr_head(&du, OID_INT8, n);
        tw__pg_arr_head(&pl, OID_BYTEA, n);
        for (size_t i = 0; i < n; i++) {
            tw__pg_arr_put(&k, it[i].key, it[i].key_len);
            tw__pg_arr_i64(&du, it[i].due_ms);
            tw__pg_arr_put(&pl, it[i].payload, it[i].payload_len);
        }
        struct pgp p;
        tw__pg_p_init(&p);
        tw__pg_p_text(&p, d->ns);
        tw__pg_p_arr(&p, &k, OID_BYTEA_ARR);
        tw__pg_p_arr(&p, &du, OID_INT8_ARR);
        tw__pg_p_arr(&p, &pl, OID_BYTEA_ARR);
        rc = tw__pg_run(d, many_sql, &p, r);
    }
    tw__free(k.b);
    tw__free(du.b);
    tw__free(pl.b);
    return rc;
}

/* One statement's items: each its result, its version noted. */
static void many_chunk(struct pgd *d, tw_durable_item *it, size_t n)
{
    PGresult *r = NULL;
    int rc = many_exec(d, it, n, &r);
    if (!rc && PQntuples(r) != (int)n) { /* committed, not as asked */
        PQclear(r);
        rc = TW_EIO;
    } else if (rc && rc != TW_ECONN) {
        rc = 0; /* refused and rolled back: item by item below */
        r = NULL;
    }
    if (rc) { /* outcome unknown: as a single call that lost its link */
        for (size_t i = 0; i < n; i++)
            it[i].result = rc;
        return;
    }
    if (!r) {
        for (size_t i = 0; i < n; i++)
            it[i].result = d->base.ops->schedule(
                &d->base, it[i].key, it[i].key_len, it[i].due_ms, it[i].payload,
                it[i].payload_len);
        return;
    }
    int64_t first = INT64_MAX;
    for (size_t i = 0; i < n; i++) {
        it[i].result = 0;
        tw__pg_changed(d, it[i].key, it[i].key_len, tw__pg_i64(r, (int)i, 0));
        first = it[i].due_ms < first ? it[i].due_ms : first;
    }
    PQclear(r);
    tw__pg_wake(d, first);
}

int tw__pg_schedule_many(tw_durable *base, tw_durable_item *items, size_t n)
{
    struct pgd *d = (struct pgd *)base;
    for (size_t done = 0; done < n;) {
        size_t k = chunk_len(items + done, n - done);
        many_chunk(d, items + done, k);
        done += k;
    }
    return tw__durable_first_error(items, n);
}
