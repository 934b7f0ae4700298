/* SPDX-License-Identifier: MIT */
/*
 * src/durable_pg_batch.c - the PostgreSQL backend's completions in
 * batches: one thread per handle that completes many fired rows in one
 * statement and one commit.
 *
 * A delivery whose callback ended with done or retry (src/durable_pg_fire.c,
 * run_one()) is queued here rather than completed by its executor thread,
 * which goes on with the next callback at once. The thread takes what is
 * queued (up to PG_BATCH), once the oldest has waited PG_FIN_GATHER_MS
 * for company (a completion holds up no callback, and the statement, not
 * the row, is what costs the server), and completes it in one statement:
 * the rows go as three binary arrays (key bytea[], ver bigint[], the
 * retry's due bigint[], NULL for done), unnested into a DELETE of the
 * done rows and an UPDATE of the retried ones, each fenced per row by the
 * version its claim got: a row replaced, cancelled or claimed again meanwhile
 * is left alone, the batch's other rows complete. The rows are found through
 * the primary key (key = ANY of the keys) and then written by their ctid (TID
 * scans): joins on the key were planned as scans of the whole namespace
 * (1 ms a batch at 1,000 pending timers, growing with them). The rows are
 * not locked first (that was a second write, and a WAL record, a row):
 * the DELETE and UPDATE carry the fence themselves (ver = one of the
 * batch's versions; versions are never handed out twice, so only the
 * claimed write of a row has it), and a row written meanwhile is
 * re-checked by the server against it in its latest version (READ
 * COMMITTED), so a row replaced, cancelled or claimed again is left
 * alone as before. The statement is prepared once a connection. While it
 * runs, the next batch gathers (a group commit).
 *
 * The statement's transaction commits with synchronous_commit off (set by
 * set_config(..., true) inside it): it does not wait for its WAL to reach
 * the disk. A server crash can lose the last completions (up to about
 * three times wal_writer_delay); their rows then stay claimed until the
 * lease runs out, and are delivered again: at least once, as a node's
 * crash already allows. Nothing else is weakened: schedules, cancels and
 * claims commit as before.
 *
 * The batch does not wait for a row lock longer than 1 ms (lock_timeout,
 * set inside it: 55P03 as the single completion's NOWAIT): a batch that
 * did not get in (a row an
 * application's open transaction holds, the database away, a deadlock)
 * is handed row by row to the single completion, which keeps what does
 * not get in and tries it again (src/durable_pg_fire.c). A job leaves
 * d->jobs (the counters' end of its callback) only once its completion is
 * in. Close stops the executor first, then this thread, which completes
 * everything queued before it ends.
 *
 * Locks: b->mu guards the queue; it is never held with d->mu or while a
 * statement runs.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "durable_pg.h"
#include "common.h"

#define OID_BYTEA 17u
#define OID_INT8 20u
#define OID_BYTEA_ARR 1001u
#define OID_INT8_ARR 1016u

static const char batch_sql[] =
    "WITH s AS (SELECT set_config('synchronous_commit', 'off', true) AS v,"
    " set_config('lock_timeout', '1', true) AS w),"
    " u AS (SELECT * FROM unnest($2::bytea[], $3::bigint[], $4::bigint[])"
    " AS u(key, ver, due)),"
    " l AS (SELECT t.ctid, u.ver, u.due FROM twheel.timers t JOIN u"
    " ON t.key = u.key AND t.ver = u.ver WHERE t.ns = $1"
    " AND t.key = ANY ($2::bytea[])),"
    " x AS (DELETE FROM twheel.timers t WHERE t.ctid = ANY (ARRAY("
    "SELECT ctid FROM l WHERE due IS NULL)) AND t.ver = ANY (ARRAY("
    "SELECT ver FROM l WHERE due IS NULL)) RETURNING 1),"
    " y AS (UPDATE twheel.timers t SET due = (SELECT l.due FROM l"
    " WHERE l.ver = t.ver), owner = NULL, lease_until = NULL"
    " WHERE t.ctid = ANY (ARRAY(SELECT ctid FROM l WHERE due IS NOT NULL))"
    " AND t.ver = ANY (ARRAY(SELECT ver FROM l WHERE due IS NOT NULL))"
    " RETURNING 1)"
    " SELECT (SELECT v || w FROM s), (SELECT count(*) FROM x),"
    " (SELECT count(*) FROM y)";

/* One statement completing @v[0 .. @n): 0 or a TW_E* code. */
static int run_batch(struct pgd *d, const struct pgfin *v, size_t n)
{
    size_t kb = 20, ib = 20 + 16 * n;
    for (size_t i = 0; i < n; i++)
        kb += 4 + v[i].j->key_len;
    struct pgarr k = {tw__malloc(kb), 0}, ver = {tw__malloc(ib), 0};
    struct pgarr due = {tw__malloc(ib), 0};
    int rc = TW_ENOMEM;
    if (k.b && ver.b && due.b) {
        tw__pg_arr_head(&k, OID_BYTEA, n);
        tw__pg_arr_head(&ver, OID_INT8, n);
        tw__pg_arr_head(&due, OID_INT8, n);
        for (size_t i = 0; i < n; i++) {
            tw__pg_arr_put(&k, v[i].j->data, v[i].j->key_len);
            tw__pg_arr_i64(&ver, v[i].j->ver);
            if (v[i].next > 0)
                tw__pg_arr_i64(&due, v[i].due);
            else
                tw__pg_arr_null(&due); /* done */
        }
        struct pgp p;
        tw__pg_p_init(&p);
        tw__pg_p_text(&p, d->ns);
        tw__pg_p_arr(&p, &k, OID_BYTEA_ARR);
        tw__pg_p_arr(&p, &ver, OID_INT8_ARR);
        tw__pg_p_arr(&p, &due, OID_INT8_ARR);
        rc = tw__pg_run_prep(d, PG_PREP_BATCH, batch_sql, &p, NULL);
    }
    tw__free(k.b);
    tw__free(ver.b);
    tw__free(due.b);
    return rc;
}

/* Complete @v[0 .. @n) and end the jobs; a batch that did not get in
 * (a row another transaction holds locked: NOWAIT; the database away; a
 * deadlock) goes row by row to the single completion, which keeps what
 * does not get in and tries it again (src/durable_pg_fire.c). */
static void flush(struct pgd *d, const struct pgfin *v, size_t n)
{
    if (run_batch(d, v, n)) {
        for (size_t i = 0; i < n; i++)
            tw__pg_fin_one(d, v[i].j, v[i].next, v[i].res);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        if (v[i].next > 0)
            tw__pg_wake(d, v[i].due);
        tw__pg_job_fin(d, v[i].j, v[i].res);
    }
}

/* Wait (b->mu held) until the oldest queued completion is
 * PG_FIN_GATHER_MS old, a batch is full or close began. */
static void gather_locked(struct pgbatch *b)
{
    for (;;) {
        uint64_t now = tw__pg_mono_ms(), end = b->first_at + PG_FIN_GATHER_MS;
        if (b->stop || b->n >= PG_BATCH || now >= end)
            return;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t ns = (uint64_t)ts.tv_nsec + (end - now) * 1000000u;
        ts.tv_sec += (time_t)(ns / 1000000000u);
        ts.tv_nsec = (long)(ns % 1000000000u);
        pthread_cond_timedwait(&b->cv, &b->mu, &ts);
    }
}

static void *batch_main(void *arg)
{
    struct pgd *d = arg;
    struct pgbatch *b = &d->batch;
    struct pgfin *v = tw__malloc(PG_BATCH * sizeof *v);
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->n && !b->stop)
            pthread_cond_wait(&b->cv, &b->mu);
        if (!b->n)
            break;
        gather_locked(b);
        size_t m = b->n < PG_BATCH ? b->n : PG_BATCH;
        if (!v)
            m = 1; /* no memory for a batch: one at a time from the queue */
        const struct pgfin *src = b->q;
        struct pgfin one;
        if (v)
            memcpy(v, src, m * sizeof *v);
        else
            one = src[0];
        memmove(b->q, b->q + m, (b->n - m) * sizeof *b->q);
        b->n -= m;
        b->first_at = tw__pg_mono_ms(); /* what is left waits anew */
        pthread_mutex_unlock(&b->mu);
        flush(d, v ? v : &one, m);
        pthread_mutex_lock(&b->mu);
    }
    pthread_mutex_unlock(&b->mu);
    tw__free(v);
    return NULL;
}

bool tw__pg_batch_add(struct pgd *d, struct pgjob *j, int next, int res)
{
    struct pgbatch *b = &d->batch;
    if (!b->on)
        return false;
    int64_t due = 0;
    if (next > 0) {
        int64_t now = tw__pg_wall(d);
        due = now > INT64_MAX - next ? INT64_MAX : now + next;
    }
    pthread_mutex_lock(&b->mu);
    if (b->n == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : PG_BATCH;
        struct pgfin *q = tw__realloc(b->q, cap * sizeof *q);
        if (!q) {
            pthread_mutex_unlock(&b->mu);
            return false; /* completed by the caller, alone */
        }
        b->q = q;
        b->cap = cap;
    }
    if (!b->n)
        b->first_at = tw__pg_mono_ms();
    b->q[b->n++] = (struct pgfin){j, next, res, due};
    if (b->n == 1 || b->n >= PG_BATCH)
        pthread_cond_signal(&b->cv); /* the thread waits for these */
    pthread_mutex_unlock(&b->mu);
    return true;
}

void tw__pg_batch_start(struct pgd *d)
{
    struct pgbatch *b = &d->batch;
    memset(b, 0, sizeof *b);
    if (pthread_mutex_init(&b->mu, NULL))
        return;
    pthread_condattr_t ca;
    bool cv = !pthread_condattr_init(&ca);
    cv = cv && !pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) &&
         !pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
    if (!cv) {
        pthread_mutex_destroy(&b->mu);
        return;
    }
    b->inited = true;
    b->on = !pthread_create(&b->thr, NULL, batch_main, d);
}

void tw__pg_batch_stop(struct pgd *d)
{
    struct pgbatch *b = &d->batch;
    if (!b->inited)
        return;
    if (b->on) {
        pthread_mutex_lock(&b->mu);
        b->stop = true;
        pthread_cond_signal(&b->cv);
        pthread_mutex_unlock(&b->mu);
        pthread_join(b->thr, NULL);
        b->on = false;
    }
    tw__free(b->q);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    b->inited = false;
}
