/* SPDX-License-Identifier: MIT */
/*
 * tests/test_pg_perf.c - the PostgreSQL backend's wake-ups and completions
 * that keep its commits cheap, on a real server (tests/pg_test.sh makes
 * and starts it; TW_PG_URL):
 *   - a timer due more than PG_NOTIFY_MS (2 s) ahead is scheduled without
 *     a NOTIFY (a listener sees only the near one's), and is still
 *     delivered on time: the nodes' poll found it before its due time;
 *   - completions in batches (src/durable_pg_batch.c): 300 timers falling
 *     due together complete in far fewer transactions than timers; one
 *     replaced by SQL while the batch was delivered keeps its new due time
 *     and payload (the batch's fence per row), the other 299 are gone.
 * A node killed mid-batch and a server killed with completions not yet
 * flushed are covered by tests/test_durable_pg.c (test_kill_node,
 * test_restart: every timer delivered again, none lost).
 * Real clocks; every wait is for a state, bounded by WAIT_MS.
 */
#define _GNU_SOURCE
#include <libpq-fe.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "test.h"
#include "twheel/durable.h"

#define WAIT_MS 30000 /* real time allowed for an expected delivery */
#define LATE_MS 500   /* generous bound on lateness (a loaded machine) */
#define NB 300        /* timers of the batch test */

static const char *url;
static PGconn *side; /* the callback's own connection (the replace) */
static atomic_int fired_far, fired_b[NB];
static atomic_llong far_late;

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static PGconn *client(void)
{
    PGconn *c = PQconnectdb(url);
    ASSERT_EQ(PQstatus(c), CONNECTION_OK);
    return c;
}

/* Run @q; its status must be @want; the first field of the first row. */
static long long sql(PGconn *c, const char *q, ExecStatusType want)
{
    PGresult *r = PQexec(c, q);
    if (PQresultStatus(r) != want)
        fprintf(stderr, "%s: %s\n", q, PQerrorMessage(c));
    ASSERT_EQ(PQresultStatus(r), want);
    long long v = want == PGRES_TUPLES_OK && PQntuples(r)
                      ? atoll(PQgetvalue(r, 0, 0))
                      : 0;
    PQclear(r);
    return v;
}

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    char k[64];
    snprintf(k, sizeof k, "%.*s", (int)t->key_len, (const char *)t->key);
    int n;
    if (!strcmp(k, "far")) {
        atomic_store(&far_late, (long long)(wall_ms() - t->due_ms));
        atomic_fetch_add(&fired_far, 1);
    } else if (sscanf(k, "b-%d", &n) == 1 && n >= 0 && n < NB) {
        /* The first of the batch replaces b-150, claimed with it. */
        if (n == 0)
            sql(side,
                "SELECT twheel.schedule('batch', 'b-150', now() +"
                " interval '1 hour', 'kept')",
                PGRES_TUPLES_OK);
        atomic_fetch_add(&fired_b[n], 1);
    }
    return 0;
}

static tw_durable *open_ns(const char *ns)
{
    tw_durable_config c;
    memset(&c, 0, sizeof c);
    c.postgres = url;
    c.postgres_namespace = ns;
    c.fire = on_fire;
    tw_durable *d = NULL;
    ASSERT_EQ(tw_durable_open(&d, &c), 0);
    return d;
}

/* NOTIFYs on @c for @ns so far. */
static int notifies(PGconn *c, const char *ns)
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

/* A far timer sends no NOTIFY, a near one does; the far one is still
 * delivered on time, found by the node's poll. */
static void test_far_no_notify(void)
{
    tw_durable *d = open_ns("far");
    PGconn *c = client(), *l = client();
    sql(l, "LISTEN twheel", PGRES_COMMAND_OK);
    sql(c, "SELECT twheel.schedule('far', 'far', now() + interval '3.5 s')",
        PGRES_TUPLES_OK);
    /* Committed after the far one: its NOTIFY comes after any of the
     * far one's (the server sends them in commit order). */
    sql(c, "SELECT twheel.schedule('far', 'near', now() + interval '1 s')",
        PGRES_TUPLES_OK);
    int n = 0;
    for (int i = 0; i < WAIT_MS && !n; i++, sleep_ms(1))
        n = notifies(l, "far");
    sleep_ms(100);
    n += notifies(l, "far");
    ASSERT_EQ(n, 1);
    for (int i = 0; i < WAIT_MS && !atomic_load(&fired_far); i++)
        sleep_ms(1);
    ASSERT_EQ(atomic_load(&fired_far), 1);
    long long late = atomic_load(&far_late);
    fprintf(stderr, "  far: delivered %lld ms after its due time\n", late);
    ASSERT(late >= 0 && late < LATE_MS);
    ASSERT_EQ(tw_durable_close(d), 0);
    PQfinish(c);
    PQfinish(l);
}

/* 300 timers due together: completed in batches (far fewer write
 * transactions than timers), each fenced by its claim's version. */
static void test_batch_fence(void)
{
    tw_durable *d = open_ns("batch");
    PGconn *c = client();
    side = client();
    long long x0 = sql(c, "SELECT txid_current()", PGRES_TUPLES_OK);
    sql(c,
        "SELECT count(twheel.schedule('batch', 'b-' || lpad(i::text, 3, '0'),"
        " now() + interval '300 ms', '')) FROM generate_series(0, 299) i",
        PGRES_TUPLES_OK);
    int all = 0;
    for (int w = 0; w < WAIT_MS && all < NB; w++, sleep_ms(1)) {
        all = 0;
        for (int i = 0; i < NB; i++)
            all += atomic_load(&fired_b[i]) > 0;
    }
    ASSERT_EQ(all, NB);
    tw_durable_stats s;
    for (int w = 0; w < WAIT_MS; w++, sleep_ms(1))
        if (!tw_durable_stats_get(d, &s) && s.pending <= 1 && !s.running)
            break;
    ASSERT_EQ(s.pending, 1);
    long long xids = sql(c, "SELECT txid_current()", PGRES_TUPLES_OK) - x0;
    fprintf(stderr, "  batch: %d timers, %lld write transactions\n", NB, xids);
    ASSERT(xids < NB / 2);
    ASSERT_EQ(sql(c,
                  "SELECT count(*) FROM twheel.timers WHERE ns = 'batch'"
                  " AND key = 'b-150' AND payload = 'kept' AND owner IS NULL"
                  " AND due > (extract(epoch FROM now()) * 1000 + 3000000)",
                  PGRES_TUPLES_OK),
              1);
    int again = 0;
    for (int i = 0; i < NB; i++)
        again += atomic_load(&fired_b[i]) != 1;
    ASSERT_EQ(again, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    PQfinish(side);
    PQfinish(c);
}

int main(void)
{
    url = getenv("TW_PG_URL");
    if (!url) {
        fprintf(stderr, "no TW_PG_URL (tests/pg_test.sh): skipped\n");
        return 77;
    }
    RUN_TEST(test_far_no_notify);
    RUN_TEST(test_batch_fence);
    return 0;
}
