/* SPDX-License-Identifier: MIT */
/*
 * src/durable_pg_conn.c - the PostgreSQL backend's connections.
 *
 * A handle keeps a pool of PG_POOL connections for the calls of any
 * thread (schedule, cancel, look-ups, the completions of callbacks),
 * each used by one call at a time, connected on first use and dropped
 * when a statement fails for want of it (the next call connects again),
 * so a database restart costs the calls in flight a TW_ECONN and nothing
 * more. The firer has a connection of its own (src/durable_pg_fire.c).
 * Every statement is sent with PQsendQueryParams() (those run many
 * times a second under load, the firer's claims and the batched
 * completions, as statements prepared once a session: no parse and plan
 * each time): parameters and results in binary (bytea as its bytes,
 * integers in network order), never spliced into SQL text. Every call is
 * bounded: connections are nonblocking and have a statement_timeout (the
 * session's, else PG_STMT_MS); the client waits for the answer in poll() at
 * most that plus PG_SLACK_MS, after which the call is TW_ECONN and the
 * connection is dropped (a server that stopped answering: SIGSTOP, a hung
 * host). Each statement is its own transaction (autocommit), so a call returns
 * once its change is committed (durable as the server's synchronous_commit
 * says).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "durable_pg.h"
#include "common.h"

/* Type OIDs of the built-in types (pg_type.dat; fixed since 1996). */
#define OID_BYTEA 17u
#define OID_INT8 20u
#define OID_INT4 23u
#define OID_TEXT 25u

#define STR_(x) #x
#define STR(x) STR_(x)

uint64_t tw__pg_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

void tw__pg_p_init(struct pgp *p)
{
    p->n = 0;
}

static void p_add(struct pgp *p, const void *b, size_t n, unsigned int type)
{
    int i = p->n++;
    p->v[i] = n ? b : "";
    p->len[i] = (int)n;
    p->fmt[i] = 1;
    p->type[i] = type;
}

void tw__pg_p_bytes(struct pgp *p, const void *b, size_t n)
{
    p_add(p, b, n, OID_BYTEA);
}

void tw__pg_p_null(struct pgp *p)
{
    p_add(p, NULL, 0, OID_BYTEA);
    p->v[p->n - 1] = NULL;
}

void tw__pg_p_text(struct pgp *p, const char *s)
{
    p_add(p, s, strlen(s), OID_TEXT);
}

void tw__pg_p_i64(struct pgp *p, int64_t v)
{
    uint64_t u = (uint64_t)v;
    unsigned char *b = p->num[p->n];
    for (int i = 7; i >= 0; i--, u >>= 8)
        b[i] = (unsigned char)u;
    p_add(p, b, 8, OID_INT8);
}

void tw__pg_p_i32(struct pgp *p, int32_t v)
{
    uint32_t u = htonl((uint32_t)v);
    memcpy(p->num[p->n], &u, 4);
    p_add(p, p->num[p->n], 4, OID_INT4);
}

void tw__pg_p_nskey(struct pgp *p, const struct pgd *d, const void *key,
                    size_t key_len)
{
    tw__pg_p_text(p, d->ns);
    tw__pg_p_bytes(p, key, key_len);
}

int64_t tw__pg_i64(const PGresult *r, int row, int col)
{
    const unsigned char *b = (const unsigned char *)PQgetvalue(r, row, col);
    if (PQgetisnull(r, row, col) || PQgetlength(r, row, col) != 8)
        return 0;
    uint64_t u = 0;
    for (int i = 0; i < 8; i++)
        u = u << 8 | b[i];
    return (int64_t)u;
}

int32_t tw__pg_i32(const PGresult *r, int row, int col)
{
    uint32_t u;
    if (PQgetisnull(r, row, col) || PQgetlength(r, row, col) != 4)
        return 0;
    memcpy(&u, PQgetvalue(r, row, col), 4);
    return (int32_t)ntohl(u);
}

bool tw__pg_bool(const PGresult *r, int row, int col)
{
    return !PQgetisnull(r, row, col) && PQgetlength(r, row, col) == 1 &&
           PQgetvalue(r, row, col)[0];
}

/* libpq prints the server's notices (a WARNING as the server shuts down)
 * to stderr by default; a library prints nothing. */
static void quiet(void *arg, const char *msg)
{
    (void)arg;
    (void)msg;
}

/* Every statement of @c bounded on the server: statement_timeout as the
 * connection string or the role set it, else PG_STMT_MS; the client's
 * bound on a call into *@call_ms (that plus PG_SLACK_MS). */
static int bound(PGconn *c, int *call_ms)
{
    PGresult *r = NULL;
    int rc = tw__pg_exec(c, PG_STMT_MS + PG_SLACK_MS,
                         "SELECT setting::bigint FROM pg_settings"
                         " WHERE name = 'statement_timeout'",
                         NULL, &r);
    if (rc)
        return rc;
    int64_t ms = PQntuples(r) == 1 ? tw__pg_i64(r, 0, 0) : 0;
    PQclear(r);
    if (ms <= 0 || ms > INT32_MAX - PG_SLACK_MS) {
        ms = PG_STMT_MS;
        rc =
            tw__pg_exec(c, PG_STMT_MS + PG_SLACK_MS,
                        "SET statement_timeout = " STR(PG_STMT_MS), NULL, NULL);
    }
    *call_ms = (int)ms + PG_SLACK_MS;
    return rc;
}

/* Why @c (not connected) failed: TW_EAUTH when the server refused the
 * role or its credentials (wrong password, none given, a role without
 * LOGIN or unknown, pg_hba.conf), TW_ENOENT for a database that does not
 * exist, else TW_ECONN. libpq gives no SQLSTATE for a failed connect: the
 * server's messages (auth.c, postinit.c) are matched in English, the
 * server's default; in another lc_messages these read TW_ECONN. */
static int connect_code(PGconn *c)
{
    static const char *const auth[] = {"authentication failed",
                                       "not permitted to log in",
                                       "no pg_hba.conf entry",
                                       "pg_hba.conf rejects",
                                       "28P01",
                                       "28000"};
    if (!c)
        return TW_ENOMEM;
    if (PQconnectionNeedsPassword(c))
        return TW_EAUTH;
    const char *m = PQerrorMessage(c);
    for (size_t i = 0; i < sizeof auth / sizeof auth[0]; i++)
        if (strstr(m, auth[i]))
            return TW_EAUTH;
    if (strstr(m, "FATAL") && strstr(m, "role \"") &&
        strstr(m, "does not exist"))
        return TW_EAUTH;
    if (strstr(m, "FATAL") && strstr(m, "database \"") &&
        strstr(m, "does not exist"))
        return TW_ENOENT;
    return TW_ECONN;
}

PGconn *tw__pg_connect(const char *conninfo, int *call_ms, int *code, char *err,
                       size_t err_len)
{
    /* Later keywords win, and the expanded @conninfo comes last: its own
     * connect_timeout or application_name overrides these defaults. */
    const char *const keys[] = {"connect_timeout", "application_name", "dbname",
                                NULL};
    const char *const vals[] = {"10", "twheel", conninfo, NULL};
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    int rc = TW_ECONN;
    if (c && PQstatus(c) == CONNECTION_OK) {
        PQsetNoticeProcessor(c, quiet, NULL);
        /* Nonblocking: a write to a server that stopped reading never
         * blocks past a call's bound (await()). */
        if (!PQsetnonblocking(c, 1) && !(rc = bound(c, call_ms)))
            return c;
    } else {
        rc = connect_code(c);
    }
    if (code)
        *code = rc;
    if (err && err_len) {
        /* libpq's message names host and port, never the password. */
        snprintf(err, err_len, "postgres: %s",
                 c ? PQerrorMessage(c) : "out of memory");
        size_t n = strlen(err);
        while (n && (err[n - 1] == '\n' || err[n - 1] == ' '))
            err[--n] = 0;
    }
    PQfinish(c);
    return NULL;
}

int tw__pg_code(const PGresult *r, PGconn *c)
{
    if (c && PQstatus(c) != CONNECTION_OK)
        return TW_ECONN;
    const char *st = r ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : NULL;
    if (!st)
        return r ? TW_EIO : TW_ENOMEM;
    if (!strncmp(st, "08", 2) || !strncmp(st, "57P", 3))
        return TW_ECONN; /* connection exceptions, admin shutdown */
    if (!strncmp(st, "28", 2) || !strcmp(st, "42501"))
        return TW_EAUTH; /* authorization, insufficient privilege */
    if (!strcmp(st, "55P03") || !strcmp(st, "57014"))
        return TW_EBUSY; /* lock not available, statement timeout */
    if (!strcmp(st, "53100"))
        return TW_ENOSPC; /* disk full */
    if (!strncmp(st, "53", 2))
        return TW_ENOMEM; /* insufficient resources */
    return TW_EIO;
}

/* Wait until @c's socket is ready for @ev or the mono ms @end: 1 ready,
 * 0 timed out, -1 an error. */
static int ready(PGconn *c, short ev, uint64_t end)
{
    for (;;) {
        uint64_t now = tw__pg_mono_ms();
        if (now >= end)
            return 0;
        struct pollfd pf = {PQsocket(c), ev, 0};
        int n = poll(&pf, 1, (int)(end - now));
        if (n > 0)
            return 1;
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

/* The answer to what was just sent on @c, waited for until @ms from now:
 * 0 with its last result in *@out, or TW_ECONN (timed out, or the
 * connection broke: the caller drops it). */
static int await(PGconn *c, int ms, PGresult **out)
{
    uint64_t end = tw__pg_mono_ms() + (uint64_t)ms;
    int f;
    while ((f = PQflush(c)) == 1)
        if (ready(c, POLLOUT | POLLIN, end) <= 0 || !PQconsumeInput(c))
            return TW_ECONN;
    if (f < 0)
        return TW_ECONN;
    PGresult *last = NULL, *r;
    for (;;) {
        while (PQisBusy(c)) {
            if (ready(c, POLLIN, end) <= 0 || !PQconsumeInput(c)) {
                PQclear(last);
                return TW_ECONN;
            }
        }
        if (!(r = PQgetResult(c)))
            break;
        /* Keep the first error, else the last result. */
        if (last && PQresultStatus(last) == PGRES_FATAL_ERROR) {
            PQclear(r);
            continue;
        }
        PQclear(last);
        last = r;
    }
    *out = last;
    return 0;
}

/* @r (consumed) as 0 with *@res, or a TW_E* code. */
static int result(PGconn *c, PGresult *r, PGresult **res)
{
    ExecStatusType st = r ? PQresultStatus(r) : PGRES_FATAL_ERROR;
    if (st != PGRES_TUPLES_OK && st != PGRES_COMMAND_OK) {
        int rc = tw__pg_code(r, c);
        PQclear(r);
        return rc;
    }
    if (res)
        *res = r;
    else
        PQclear(r);
    return 0;
}

int tw__pg_exec(PGconn *c, int ms, const char *sql, const struct pgp *p,
                PGresult **res)
{
    PGresult *r = NULL;
    if (!PQsendQueryParams(c, sql, p ? p->n : 0, p ? p->type : NULL,
                           p ? p->v : NULL, p ? p->len : NULL,
                           p ? p->fmt : NULL, 1))
        return TW_ECONN; /* the write failed: drop it */
    int rc = await(c, ms, &r);
    return rc ? rc : result(c, r, res);
}

int tw__pg_exec_prep(PGconn *c, int ms, unsigned *mask, int id, const char *sql,
                     const struct pgp *p, PGresult **res)
{
    char name[16];
    snprintf(name, sizeof name, "tw%d", id);
    PGresult *r = NULL;
    if (!(*mask & 1u << id)) {
        if (!PQsendPrepare(c, name, sql, p->n, p->type))
            return TW_ECONN;
        int rc = await(c, ms, &r);
        if (!rc)
            rc = result(c, r, NULL);
        if (rc)
            return rc;
        *mask |= 1u << id;
    }
    if (!PQsendQueryPrepared(c, name, p->n, p->v, p->len, p->fmt, 1))
        return TW_ECONN; /* the write failed: drop it */
    int rc = await(c, ms, &r);
    return rc ? rc : result(c, r, res);
}

int tw__pg_exec_script(PGconn *c, int ms, const char *sql)
{
    PGresult *r = NULL;
    if (!PQsendQuery(c, sql))
        return TW_ECONN; /* the write failed: drop it */
    int rc = await(c, ms, &r);
    return rc ? rc : result(c, r, NULL);
}

int tw__pg_run(struct pgd *d, const char *sql, const struct pgp *p,
               PGresult **res)
{
    int rc = 0;
    PGconn *c = tw__pg_take(d, &rc);
    if (!c)
        return rc;
    rc = tw__pg_exec(c, atomic_load(&d->call_ms), sql, p, res);
    tw__pg_give(d, c, rc == TW_ECONN || PQstatus(c) != CONNECTION_OK);
    return rc;
}

int tw__pg_pool_init(struct pgpool *p)
{
    memset(p, 0, sizeof *p);
    if (pthread_mutex_init(&p->mu, NULL))
        return TW_ENOMEM;
    if (pthread_cond_init(&p->cv, NULL)) {
        pthread_mutex_destroy(&p->mu);
        return TW_ENOMEM;
    }
    return 0;
}

void tw__pg_pool_close(struct pgpool *p)
{
    for (int i = 0; i < PG_POOL; i++)
        PQfinish(p->c[i]);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
}

/* A free slot of the pool, marked busy; waits while all are, at most
 * @ms (each holder's call is bounded, but a queue of them need not be):
 * then -1. */
static int slot_take(struct pgpool *p, int ms)
{
    struct timespec end;
    clock_gettime(CLOCK_REALTIME, &end);
    end.tv_sec += ms / 1000;
    end.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (end.tv_nsec >= 1000000000L) {
        end.tv_sec++;
        end.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&p->mu);
    for (;;) {
        for (int i = 0; i < PG_POOL; i++) {
            if (!p->busy[i]) {
                p->busy[i] = true;
                pthread_mutex_unlock(&p->mu);
                return i;
            }
        }
        if (pthread_cond_timedwait(&p->cv, &p->mu, &end) == ETIMEDOUT) {
            pthread_mutex_unlock(&p->mu);
            return -1;
        }
    }
}

/* A slot of the pool with its connection (connected, maybe now), or -1
 * with *@rc. */
static int take(struct pgd *d, int *rc)
{
    struct pgpool *p = &d->pool;
    int i = slot_take(p, atomic_load(&d->call_ms));
    if (i < 0) {
        *rc = TW_EBUSY; /* every connection busy for a call's bound */
        return -1;
    }
    /* The slot is ours: its connection may be made without the lock. */
    int ms = 0;
    *rc = TW_ECONN;
    if (!p->c[i] && (p->c[i] = tw__pg_connect(d->conninfo, &ms, rc, NULL, 0))) {
        atomic_store(&d->call_ms, ms);
        p->prep[i] = 0; /* a new session: nothing prepared */
    }
    if (p->c[i])
        return i;
    pthread_mutex_lock(&p->mu);
    p->busy[i] = false;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return -1;
}

PGconn *tw__pg_take(struct pgd *d, int *rc)
{
    int i = take(d, rc);
    return i < 0 ? NULL : d->pool.c[i];
}

int tw__pg_run_prep(struct pgd *d, int id, const char *sql, const struct pgp *p,
                    PGresult **res)
{
    int rc = 0, i = take(d, &rc);
    if (i < 0)
        return rc;
    PGconn *c = d->pool.c[i];
    rc = tw__pg_exec_prep(c, atomic_load(&d->call_ms), &d->pool.prep[i], id,
                          sql, p, res);
    tw__pg_give(d, c, rc == TW_ECONN || PQstatus(c) != CONNECTION_OK);
    return rc;
}

void tw__pg_give(struct pgd *d, PGconn *c, bool broken)
{
    struct pgpool *p = &d->pool;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < PG_POOL; i++) {
        if (p->c[i] == c && p->busy[i]) {
            if (broken) {
                PQfinish(c);
                p->c[i] = NULL;
            }
            p->busy[i] = false;
            break;
        }
    }
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}
