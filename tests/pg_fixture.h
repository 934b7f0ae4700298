/* SPDX-License-Identifier: MIT */
/*
 * tests/pg_fixture.h - what the PostgreSQL tests share (run by
 * tests/pg_test.sh, which starts a server and sets TW_PG_URL): real
 * clocks, a client connection and statements on it, opening a handle on
 * a namespace, and a log of deliveries by key (how many, when) that a
 * test's callback fills with pgf_note() and waits on with pgf_wait_count().
 * Every wait is for a state, bounded by PGF_WAIT_MS. Include after
 * defining _GNU_SOURCE.
 */
#ifndef TWHEEL_TEST_PG_FIXTURE_H
#define TWHEEL_TEST_PG_FIXTURE_H

#include <libpq-fe.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock_fixture.h"
#include "test.h"
#include "twheel/durable.h"

#define PGF_WAIT_MS 30000 /* real time allowed for an expected delivery */
#define PGF_KEYS 64       /* keys the delivery log tells apart */

static const char *pgf_url; /* TW_PG_URL, set by pgf_init() */

/* TW_PG_URL, or exit 77 (skipped) when the test runs without a server. */
static inline void pgf_init(void)
{
    pgf_url = getenv("TW_PG_URL");
    if (!pgf_url) {
        fprintf(stderr, "TW_PG_URL unset (tests/pg_test.sh sets it): "
                        "skipped\n");
        exit(77);
    }
}

/* ------------------------------------------------------------------------ */
/* The delivery log. */

static pthread_mutex_t pgf_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
    char name[40];
    int count;
    int64_t at; /* wall ms of the last delivery */
} pgf_log[PGF_KEYS];
static int pgf_nlog;

/* One delivery of @key. */
static inline void pgf_note(const void *key, size_t len)
{
    pthread_mutex_lock(&pgf_mu);
    int i = 0;
    while (i < pgf_nlog && (strlen(pgf_log[i].name) != len ||
                            memcmp(pgf_log[i].name, key, len)))
        i++;
    if (i == pgf_nlog && pgf_nlog < PGF_KEYS) {
        snprintf(pgf_log[i].name, sizeof pgf_log[i].name, "%.*s", (int)len,
                 (const char *)key);
        pgf_nlog++;
    }
    if (i < PGF_KEYS) {
        pgf_log[i].count++;
        pgf_log[i].at = now_ms();
    }
    pthread_mutex_unlock(&pgf_mu);
}

/* Deliveries of @key so far; its last one's wall ms into *@at (if set). */
static inline int pgf_count(const char *key, int64_t *at)
{
    pthread_mutex_lock(&pgf_mu);
    int c = 0;
    for (int i = 0; i < pgf_nlog; i++)
        if (!strcmp(pgf_log[i].name, key)) {
            c = pgf_log[i].count;
            if (at)
                *at = pgf_log[i].at;
        }
    pthread_mutex_unlock(&pgf_mu);
    return c;
}

/* Wait up to @ms for @n deliveries of @key; whether they came. */
static inline bool pgf_wait_count_ms(const char *key, int n, int ms)
{
    int64_t end = mono_ms() + ms;
    while (pgf_count(key, NULL) < n && mono_ms() < end)
        sleep_ms(1);
    return pgf_count(key, NULL) >= n;
}

static inline void pgf_wait_count(const char *key, int n)
{
    ASSERT(pgf_wait_count_ms(key, n, PGF_WAIT_MS));
    ASSERT_EQ(pgf_count(key, NULL), n);
}

/* ------------------------------------------------------------------------ */
/* Handles and clients. */

/* A config for @ns at @url (NULL: TW_PG_URL) delivering to @fire; its
 * message goes to @err (256 bytes). */
static inline tw_durable_config pgf_config(const char *url, const char *ns,
                                           tw_durable_fire_fn fire, void *arg,
                                           char *err)
{
    tw_durable_config c;
    memset(&c, 0, sizeof c);
    c.postgres = url ? url : pgf_url;
    c.postgres_namespace = ns;
    c.fire = fire;
    c.fire_arg = arg;
    c.errbuf = err;
    c.errbuf_len = 256;
    return c;
}

/* A handle on @ns with @threads executor threads; the open must work. */
static inline tw_durable *pgf_open(const char *ns, tw_durable_fire_fn fire,
                                   void *arg, uint32_t threads)
{
    char err[256];
    tw_durable_config c = pgf_config(NULL, ns, fire, arg, err);
    c.executor_threads = threads;
    tw_durable *d = NULL;
    int rc = tw_durable_open(&d, &c);
    if (rc)
        fprintf(stderr, "open: %d %s\n", rc, err);
    ASSERT_EQ(rc, 0);
    return d;
}

/* A client connection to TW_PG_URL (or to TW_PG_URL as @role). */
static inline PGconn *pgf_client_as(const char *role)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s%s%s", pgf_url, role ? " user=" : "",
             role ? role : "");
    PGconn *c = PQconnectdb(buf);
    if (PQstatus(c) != CONNECTION_OK)
        fprintf(stderr, "connect: %s\n", PQerrorMessage(c));
    ASSERT_EQ(PQstatus(c), CONNECTION_OK);
    return c;
}

static inline PGconn *pgf_client(void)
{
    return pgf_client_as(NULL);
}

/* Run @q formatted with @ap on @c; its status must be @want. */
static inline PGresult *pgf_vexec(PGconn *c, ExecStatusType want, const char *q,
                                  va_list ap)
{
    char buf[2048];
    vsnprintf(buf, sizeof buf, q, ap);
    PGresult *r = PQexec(c, buf);
    if (PQresultStatus(r) != want)
        fprintf(stderr, "%s: %s\n", buf, PQerrorMessage(c));
    ASSERT_EQ(PQresultStatus(r), want);
    return r;
}

/* Run @q (printf format) on @c; its status must be @want. */
static inline __attribute__((format(printf, 3, 4))) void
pgf_sql(PGconn *c, ExecStatusType want, const char *q, ...)
{
    va_list ap;
    va_start(ap, q);
    PQclear(pgf_vexec(c, want, q, ap));
    va_end(ap);
}

/* The first value of the query @q (printf format) on @c, a number. */
static inline __attribute__((format(printf, 2, 3))) long long
pgf_num(PGconn *c, const char *q, ...)
{
    va_list ap;
    va_start(ap, q);
    PGresult *r = pgf_vexec(c, PGRES_TUPLES_OK, q, ap);
    va_end(ap);
    ASSERT_GE(PQntuples(r), 1);
    long long v = atoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    return v;
}

/* NOTIFYs on @c (which LISTENs) for @ns so far. */
static inline int pgf_notifies(PGconn *c, const char *ns)
{
    int n = 0;
    PQconsumeInput(c);
    PGnotify *m;
    while ((m = PQnotifies(c))) {
        n += !strcmp(m->extra, ns);
        PQfreemem(m);
    }
    return n;
}

/* A timer of @ns due now, scheduled by SQL after the ones under test,
 * delivered: the firer had a round in which to (wrongly) fire them. */
static inline void pgf_sentinel(PGconn *c, const char *ns, const char *key)
{
    pgf_sql(c, PGRES_TUPLES_OK, "SELECT twheel.schedule('%s', '%s', now(), '')",
            ns, key);
    pgf_wait_count(key, 1);
}

#endif
