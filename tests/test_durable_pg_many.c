/* SPDX-License-Identifier: MIT */
/*
 * tests/test_durable_pg_many.c - tw_durable_schedule_many() on PostgreSQL
 * (src/durable_pg_many.c), on a real server (tests/pg_test.sh; TW_PG_URL):
 *   - the same batches through schedule_many into one namespace and
 *     through a loop of single schedules into another leave the same
 *     rows (replace of a pending key and of a dead letter, a key given
 *     twice ends with its last item, due times at the ends of int64,
 *     empty and 64 KiB payloads), with the same per-item results;
 *   - a batch larger than one statement holds (2,500 items);
 *   - an item the server refuses (a CHECK the test adds) fails alone,
 *     the others of its batch are written, as in the loop;
 *   - round trips: a batch of 32 is one statement and one transaction
 *     (transaction ids taken around it: two, as its INSERT runs in a
 *     subtransaction; statements counted in the server's log with
 *     log_statement = all for the handle's connections), where the loop
 *     takes 32 of each;
 *   - a firing handle delivers each timer of a batch once;
 *   - twheel.schedule_many from SQL returns the versions its rows have,
 *     in the items' order, and replaces the namespace's dead letters
 *     only.
 * Real clocks; every wait is for a state, bounded by WAIT_MS.
 */
#define _GNU_SOURCE
#include <libpq-fe.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock_fixture.h" /* now_ms */
#include "test.h"
#include "twheel/durable.h"

#define WAIT_MS 30000
#define BIG 2500

static const char *url;

static PGconn *conn(void)
{
    PGconn *c = PQconnectdb(url);
    ASSERT_EQ(PQstatus(c), CONNECTION_OK);
    return c;
}

static void sql(PGconn *c, const char *q)
{
    PGresult *r = PQexec(c, q);
    ExecStatusType st = PQresultStatus(r);
    if (st != PGRES_COMMAND_OK && st != PGRES_TUPLES_OK)
        fprintf(stderr, "%s: %s\n", q, PQerrorMessage(c));
    ASSERT(st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK);
    PQclear(r);
}

/* The one value of @q as a number. */
static long long sql_num(PGconn *c, const char *q)
{
    PGresult *r = PQexec(c, q);
    ASSERT_EQ(PQresultStatus(r), PGRES_TUPLES_OK);
    long long v = atoll(PQgetvalue(r, 0, 0));
    PQclear(r);
    return v;
}

static atomic_int fired[64];

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    char k[16] = "";
    if (t->key_len < sizeof k)
        memcpy(k, t->key, t->key_len); /* "f<i>", not NUL-terminated */
    int i = atoi(k + 1);
    if (i >= 0 && i < 64)
        atomic_fetch_add(&fired[i], 1);
    return 0;
}

static tw_durable *open_ns(const char *conninfo, const char *ns, bool fire)
{
    tw_durable_config c;
    memset(&c, 0, sizeof c);
    c.fire = on_fire;
    c.postgres = conninfo;
    c.postgres_namespace = ns;
    c.flags = fire ? 0 : TW_DURABLE_NOFIRE;
    tw_durable *d = NULL;
    ASSERT_EQ(tw_durable_open(&d, &c), 0);
    return d;
}

/* Apply @n items: as one batch, or one schedule each. */
static int apply(tw_durable *d, tw_durable_item *it, size_t n, bool batch)
{
    if (batch)
        return tw_durable_schedule_many(d, it, n);
    int first = 0;
    for (size_t i = 0; i < n; i++) {
        it[i].result =
            tw_durable_schedule(d, it[i].key, it[i].key_len, it[i].due_ms,
                                it[i].payload, it[i].payload_len);
        first = first ? first : it[i].result;
    }
    return first;
}

/* A dump of a namespace's rows (both tables), for comparing. */
static char *dump(PGconn *c, const char *ns)
{
    char q[512];
    snprintf(q, sizeof q,
             "SELECT coalesce(string_agg(format('%%s %%s %%s %%s %%s', t, "
             "encode(key, 'hex'), due, md5(payload), attempts), E'\\n' "
             "ORDER BY t, key), '') FROM (SELECT 'p' t, key, due, payload, "
             "attempts FROM twheel.timers WHERE ns = '%s' UNION ALL SELECT "
             "'d', key, due, payload, attempts FROM twheel.dead WHERE ns = "
             "'%s') x",
             ns, ns);
    PGresult *r = PQexec(c, q);
    ASSERT_EQ(PQresultStatus(r), PGRES_TUPLES_OK);
    char *s = strdup(PQgetvalue(r, 0, 0));
    PQclear(r);
    return s;
}

#define ITEM(k, due, p, pl)                                                    \
    {                                                                          \
        k, sizeof k - 1, due, p, pl, 0                                         \
    }

static void test_same_as_loop(void)
{
    static char big[65536];
    memset(big, 'x', sizeof big);
    PGconn *c = conn();
    const char *ns[2] = {"m_batch", "m_loop"};
    int64_t far = now_ms() + 3600 * 1000;
    for (int b = 0; b < 2; b++) {
        tw_durable *d = open_ns(url, ns[b], false);
        char q[256];
        snprintf(q, sizeof q,
                 "INSERT INTO twheel.dead (ns, key, due, payload, attempts) "
                 "VALUES ('%s', 'dl', 5, 'gone', 3)",
                 ns[b]);
        sql(c, q);
        tw_durable_item pre[] = {ITEM("a", far, "old", 3)};
        ASSERT_EQ(apply(d, pre, 1, b == 0), 0);
        tw_durable_item it[] = {
            ITEM("a", far + 1, "new", 3),    /* replaces a pending key */
            ITEM("b", far + 2, "first", 5),  /* given twice: */
            ITEM("c", far + 3, NULL, 0),     /* an empty payload */
            ITEM("b", far + 4, "second", 6), /* the last one holds */
            ITEM("dl", far + 5, "back", 4),  /* replaces a dead letter */
            ITEM("min", INT64_MIN, "m", 1),  /* the ends of int64 */
            ITEM("max", INT64_MAX, "M", 1),
            {"big", 3, far + 6, big, sizeof big, 0},
        };
        size_t n = sizeof it / sizeof *it;
        for (size_t i = 0; i < n; i++)
            it[i].result = 12345;
        ASSERT_EQ(apply(d, it, n, b == 0), 0);
        for (size_t i = 0; i < n; i++)
            ASSERT_EQ(it[i].result, 0);
        /* An invalid item fails alone (TW_EINVAL), as in the loop. */
        tw_durable_item bad[] = {ITEM("v1", far, "1", 1),
                                 {"", 0, far, 0, 0, 0},
                                 ITEM("v2", far, "2", 1)};
        ASSERT_EQ(apply(d, bad, 3, b == 0), TW_EINVAL);
        ASSERT_EQ(bad[0].result, 0);
        ASSERT_EQ(bad[1].result, TW_EINVAL);
        ASSERT_EQ(bad[2].result, 0);
        ASSERT_EQ(tw_durable_close(d), 0);
    }
    char *x = dump(c, ns[0]), *y = dump(c, ns[1]);
    if (strcmp(x, y))
        fprintf(stderr, "batch:\n%s\nloop:\n%s\n", x, y);
    ASSERT_STR_EQ(x, y);
    ASSERT(strstr(x, "p 62 ")); /* b */
    ASSERT(!strstr(x, "\nd ")); /* the dead letter replaced */
    free(x);
    free(y);
    PQfinish(c);
}

/* More items than one statement takes; then a row the server refuses. */
static void test_big_and_refused(void)
{
    static tw_durable_item it[BIG];
    static char keys[BIG][16];
    PGconn *c = conn();
    tw_durable *d = open_ns(url, "m_big", false);
    for (int i = 0; i < BIG; i++) {
        int n = snprintf(keys[i], sizeof keys[i], "k%05d", i);
        it[i] = (tw_durable_item){keys[i], (size_t)n, now_ms() + 3600000 + i,
                                  keys[i], (size_t)n, 1};
    }
    ASSERT_EQ(tw_durable_schedule_many(d, it, BIG), 0);
    for (int i = 0; i < BIG; i++)
        ASSERT_EQ(it[i].result, 0);
    ASSERT_EQ(sql_num(c, "SELECT count(*) FROM twheel.timers WHERE ns = "
                         "'m_big' AND key::text = '\\x' || encode(payload, "
                         "'hex')"),
              BIG);
    sql(c, "ALTER TABLE twheel.timers ADD CONSTRAINT m_no_bad"
           " CHECK (key <> 'bad'::bytea)");
    tw_durable_item three[] = {ITEM("ok1", 1, "", 0), ITEM("bad", 1, "", 0),
                               ITEM("ok2", 1, "", 0)};
    ASSERT_EQ(tw_durable_schedule_many(d, three, 3), TW_EIO);
    ASSERT_EQ(three[0].result, 0);
    ASSERT_EQ(three[1].result, TW_EIO);
    ASSERT_EQ(three[2].result, 0);
    ASSERT_EQ(sql_num(c, "SELECT count(*) FROM twheel.timers WHERE ns = "
                         "'m_big' AND key IN ('ok1', 'ok2', 'bad')"),
              2);
    sql(c, "ALTER TABLE twheel.timers DROP CONSTRAINT m_no_bad");
    ASSERT_EQ(tw_durable_close(d), 0);
    PQfinish(c);
}

/* Lines of the server's log that contain @what. */
static int log_count(const char *what)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/../log", getenv("TW_PG_DATA"));
    FILE *f = fopen(path, "r");
    ASSERT_NOT_NULL(f);
    char line[8192];
    int n = 0;
    while (fgets(line, sizeof line, f))
        n += strstr(line, what) != NULL;
    fclose(f);
    return n;
}

/* Transactions and statements of a batch of 32 and of a loop of 32
 * (statements: those of the handle's connections naming
 * twheel.schedule or schedule_many in the server's log). */
static void test_round_trips(void)
{
    PGconn *c = conn();
    char ci[2048];
    snprintf(ci, sizeof ci, "%s options='-c log_statement=all'", url);
    tw_durable *d = open_ns(ci, "m_rt", false);
    static char keys[32][8];
    tw_durable_item it[32];
    for (int b = 0; b < 2; b++) {
        for (int i = 0; i < 32; i++) {
            int n = snprintf(keys[i], sizeof keys[i], "%c%02d", "bl"[b], i);
            it[i] = (tw_durable_item){keys[i], (size_t)n, now_ms() + 3600000,
                                      "p",     1,         0};
        }
        int stmts = log_count("twheel.schedule");
        long long x0 = sql_num(c, "SELECT txid_current()");
        ASSERT_EQ(apply(d, it, 32, b == 0), 0);
        long long x1 = sql_num(c, "SELECT txid_current()");
        stmts = log_count("twheel.schedule") - stmts;
        fprintf(stderr, "%s of 32: %lld transactions, %d statements\n",
                b ? "loop" : "batch", x1 - x0 - 1, stmts);
        /* The batch: one transaction, whose INSERT runs in a
         * subtransaction (twheel.schedule_many's fast path), which takes
         * an id of its own. */
        if (b)
            ASSERT_EQ(x1 - x0 - 1, 32);
        else
            ASSERT(x1 - x0 - 1 >= 1 && x1 - x0 - 1 <= 2);
        ASSERT_EQ(stmts, b ? 32 : 1);
    }
    ASSERT_EQ(tw_durable_close(d), 0);
    PQfinish(c);
}

/* A firing handle delivers each timer of a batch once. */
static void test_delivered(void)
{
    tw_durable *d = open_ns(url, "m_fire", true);
    static char keys[64][8];
    tw_durable_item it[64];
    int64_t now = now_ms();
    for (int i = 0; i < 64; i++) {
        int n = snprintf(keys[i], sizeof keys[i], "f%d", i);
        it[i] = (tw_durable_item){keys[i], (size_t)n, now + i % 8, "", 0, 0};
    }
    ASSERT_EQ(tw_durable_schedule_many(d, it, 64), 0);
    for (int ms = 0; ms < WAIT_MS; ms++) {
        int all = 1;
        for (int i = 0; i < 64; i++)
            all &= atomic_load(&fired[i]) >= 1;
        if (all)
            break;
        sleep_ms(1);
    }
    tw_durable_stats s;
    for (int ms = 0; ms < WAIT_MS; ms++) {
        ASSERT_EQ(tw_durable_stats_get(d, &s), 0);
        if (!s.pending && !s.running)
            break;
        sleep_ms(1);
    }
    ASSERT_EQ(tw_durable_close(d), 0);
    for (int i = 0; i < 64; i++)
        ASSERT_EQ(atomic_load(&fired[i]), 1);
}

/* The one value of @q as text (freed by the caller). */
static char *sql_text(PGconn *c, const char *q)
{
    PGresult *r = PQexec(c, q);
    if (PQresultStatus(r) != PGRES_TUPLES_OK)
        fprintf(stderr, "%s: %s\n", q, PQerrorMessage(c));
    ASSERT_EQ(PQresultStatus(r), PGRES_TUPLES_OK);
    char *s = strdup(PQgetvalue(r, 0, 0));
    PQclear(r);
    return s;
}

/* twheel.schedule_many from SQL, new keys (its plain INSERT): it returns
 * each item's version as its row has it, in the items' order; a dead
 * letter of an item's key goes, and a namespace's dead letters are its
 * own (one of another namespace with the same key stays). */
static void test_sql_versions(void)
{
    PGconn *c = conn();
    sql(c, "INSERT INTO twheel.dead (ns, key, due, payload, attempts) VALUES"
           " ('m_sqlv', 'x9', 5, 'gone', 3), ('m_sqlw', 'k1', 5, 'kept', 3)");
    char *v = sql_text(c, "SELECT twheel.schedule_many('m_sqlv',"
                          " '{k2,k1,x9}'::bytea[], '{7,5,6}', '{a,b,c}')");
    char *rows = sql_text(
        c, "SELECT array_agg(t.ver ORDER BY u.i) FROM unnest("
           "'{k2,k1,x9}'::bytea[]) WITH ORDINALITY u(k, i) JOIN twheel.timers"
           " t ON t.ns = 'm_sqlv' AND t.key = u.k");
    ASSERT_STR_EQ(v, rows);
    ASSERT_EQ(sql_num(c, "SELECT count(DISTINCT ver) FROM twheel.timers"
                         " WHERE ns = 'm_sqlv'"),
              3);
    ASSERT_EQ(sql_num(c, "SELECT count(*) FROM twheel.dead WHERE ns ="
                         " 'm_sqlv'"),
              0);
    ASSERT_EQ(sql_num(c, "SELECT count(*) FROM twheel.dead WHERE ns ="
                         " 'm_sqlw' AND key = 'k1'"),
              1);
    free(v);
    free(rows);
    PQfinish(c);
}

int main(void)
{
    url = getenv("TW_PG_URL");
    if (!url || !getenv("TW_PG_DATA")) {
        fprintf(stderr, "TW_PG_URL unset (tests/pg_test.sh sets it): "
                        "skipped\n");
        return 77;
    }
    RUN_TEST(test_same_as_loop);
    RUN_TEST(test_big_and_refused);
    RUN_TEST(test_round_trips);
    RUN_TEST(test_delivered);
    RUN_TEST(test_sql_versions);
    return 0;
}
