/* SPDX-License-Identifier: MIT */
/*
 * tests/test_durable_pg.c - what only the PostgreSQL backend does, on a
 * real server (tests/pg_test.sh makes and starts it; TW_PG_URL):
 *   - timers scheduled by SQL inside another client's transaction: rolled
 *     back, never delivered; committed, delivered once, with the NOTIFY
 *     that wakes the nodes sent at commit and not at rollback; the text
 *     and timestamptz forms of twheel.schedule(); a cancel committed by
 *     SQL before the due time stops the timer;
 *   - a cancel or replace through the handle stops a claimed delivery
 *     whose callback has not started;
 *   - a role with only the grants of docs/guide/postgres.md runs a node,
 *     one without them is refused at open (TW_EAUTH); connection strings
 *     that cannot work are refused without showing a password;
 *   - the schema refuses hostile rows (empty or oversized keys, oversized
 *     payloads, NULLs) and open refuses a newer schema version;
 *   - a fleet: three handles on one namespace share 3,000 timers that fall
 *     due together, each delivered exactly once, none early;
 *   - kill -9 of one of two nodes while timers fall due: every timer
 *     delivered, none of those cancelled before their due time;
 *   - a server restarted with pg_ctl restart -m immediate while timers
 *     fall due: every committed timer is delivered (at least once).
 * Real clocks throughout; every wait is for a state, bounded by WAIT_MS.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pg_fixture.h"

#define WAIT_MS PGF_WAIT_MS
#define FLEET_N 3000

/* Deliveries of keys "k<n>" count in hits[n] (and by node); other keys
 * go to the fixture's log (pgf_note()). */
static atomic_int hits[FLEET_N];
static atomic_int early, by_node[3];

/* The key "a-block" holds its callback until unblocked. */
static atomic_int blocked, unblocked;
static char last_payload[16];

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    if (t->key_len == 7 && !memcmp(t->key, "a-block", 7)) {
        atomic_store(&blocked, 1);
        while (!atomic_load(&unblocked))
            sleep_ms(1);
    }
    if (t->key_len == 8 && !memcmp(t->key, "c-victim", 8))
        snprintf(last_payload, sizeof last_payload, "%.*s", (int)t->payload_len,
                 (const char *)t->payload);
    if (now_ms() < t->due_ms)
        early++;
    char k[64];
    snprintf(k, sizeof k, "%.*s", (int)t->key_len, (const char *)t->key);
    int n;
    if (t->key_len > 1 && k[0] == 'k' && sscanf(k + 1, "%d", &n) == 1 &&
        n >= 0 && n < FLEET_N) {
        hits[n]++;
        by_node[(intptr_t)arg]++;
        return 0;
    }
    pgf_note(k, t->key_len);
    return 0;
}

/* Deliveries of @key so far, and when the last was (wall ms). */
static int count_of(const char *key)
{
    return pgf_count(key, NULL);
}

static int64_t at_of(const char *key)
{
    int64_t at = 0;
    pgf_count(key, &at);
    return at;
}

static tw_durable *open_ns(const char *ns, intptr_t node, uint32_t threads)
{
    return pgf_open(ns, on_fire, (void *)node, threads);
}

/* Run @q; its status must be @want. */
static void sql(PGconn *c, const char *q, ExecStatusType want)
{
    pgf_sql(c, want, "%s", q);
}

/* No timer of @d's namespace left: the completions of the deliveries seen
 * are in (made after the callbacks return, in batches). */
static void wait_none_pending(tw_durable *d)
{
    tw_durable_stats s = {0};
    for (int i = 0; i < PGF_WAIT_MS; i++, sleep_ms(1))
        if (!tw_durable_stats_get(d, &s) && s.pending == 0)
            break;
    ASSERT_EQ(s.pending, 0);
}

/* A timer scheduled and rolled back never fires; committed, it fires
 * once, and only the commit sends the NOTIFY. */
static void test_transactions(void)
{
    tw_durable *d = open_ns("txn", 0, 0);
    PGconn *c = pgf_client(), *l = pgf_client();
    sql(l, "LISTEN twheel", PGRES_COMMAND_OK);
    sql(c, "BEGIN", PGRES_COMMAND_OK);
    sql(c, "SELECT twheel.schedule('txn', 'rolled', now(), 'x')",
        PGRES_TUPLES_OK);
    sql(c, "ROLLBACK", PGRES_COMMAND_OK);
    sleep_ms(100);
    ASSERT_EQ(pgf_notifies(l, "txn"), 0);
    sql(c, "BEGIN", PGRES_COMMAND_OK);
    sql(c,
        "SELECT twheel.schedule('txn', 'committed'::bytea,"
        " (extract(epoch FROM now()) * 1000)::bigint, 'y'::bytea)",
        PGRES_TUPLES_OK);
    int64_t t0 = now_ms();
    sql(c, "COMMIT", PGRES_COMMAND_OK);
    pgf_wait_count("committed", 1);
    fprintf(stderr, "  commit to callback: %lld ms\n",
            (long long)(at_of("committed") - t0));
    for (int i = 0; i < WAIT_MS && !pgf_notifies(l, "txn"); i++)
        sleep_ms(1);
    /* A timer due after the rolled-back one fired: it had its chance. */
    pgf_sentinel(c, "txn", "sentinel");
    sleep_ms(200);
    ASSERT_EQ(count_of("rolled"), 0);
    ASSERT_EQ(count_of("committed"), 1);
    wait_none_pending(d);
    PQfinish(l);
    PQfinish(c);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* A cancel committed by SQL before the due time: never delivered. */
static void test_sql_cancel(void)
{
    tw_durable *d = open_ns("cxl", 0, 0);
    PGconn *c = pgf_client();
    sql(c,
        "SELECT twheel.schedule('cxl', 'gone', now() + interval '1 s', 'x'),"
        " twheel.schedule('cxl', 'kept', now() + interval '1 s', 'y')",
        PGRES_TUPLES_OK);
    PGresult *r = PQexec(c, "SELECT twheel.cancel('cxl', 'gone')");
    ASSERT_STR_EQ(PQgetvalue(r, 0, 0), "t");
    PQclear(r);
    r = PQexec(c, "SELECT twheel.cancel('cxl', 'never')");
    ASSERT_STR_EQ(PQgetvalue(r, 0, 0), "f");
    PQclear(r);
    pgf_wait_count("kept", 1);
    pgf_sentinel(c, "cxl", "sentinel2");
    ASSERT_EQ(count_of("gone"), 0);
    PQfinish(c);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* A cancel or replace through the handle that returned stops a
 * delivery the handle had claimed and whose callback had not started:
 * "b-victim" and "c-victim" are claimed in the same round as "a-block"
 * and queued behind its callback, which holds the firer (no executor
 * threads) while they are cancelled and replaced. */
static void test_cancel_claimed(void)
{
    tw_durable *d = open_ns("claimed", 0, 0);
    PGconn *c = pgf_client();
    sql(c,
        "SELECT twheel.schedule('claimed', k, now(), 'old') FROM"
        " unnest(ARRAY['a-block', 'b-victim', 'c-victim']) k",
        PGRES_TUPLES_OK);
    for (int i = 0; i < WAIT_MS && !atomic_load(&blocked); i++)
        sleep_ms(1);
    ASSERT(atomic_load(&blocked));
    PGresult *r = PQexec(c, "SELECT count(*) FROM twheel.timers WHERE"
                            " ns = 'claimed' AND owner IS NOT NULL");
    ASSERT_STR_EQ(PQgetvalue(r, 0, 0), "3"); /* all three claimed */
    PQclear(r);
    ASSERT_EQ(tw_durable_cancel(d, "b-victim", 8), 0);
    ASSERT_EQ(tw_durable_schedule(d, "c-victim", 8, now_ms(), "new", 3), 0);
    atomic_store(&unblocked, 1);
    pgf_wait_count("c-victim", 1);
    pgf_wait_count("a-block", 1);
    pgf_sentinel(c, "claimed", "sentinel3");
    ASSERT_EQ(count_of("b-victim"), 0);
    ASSERT_EQ(count_of("c-victim"), 1);
    ASSERT_STR_EQ(last_payload, "new");
    PQfinish(c);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* Rows the library could not hold are refused by the schema itself. */
static void test_hostile_rows(void)
{
    tw_durable *d = open_ns("bad", 0, 0);
    PGconn *c = pgf_client();
    const char *bad[] = {
        "SELECT twheel.schedule('bad', ''::bytea, 0, ''::bytea)",
        "SELECT twheel.schedule('bad', repeat('k', 1025)::bytea, 0, ''::bytea)",
        "SELECT twheel.schedule('bad', 'k'::bytea, NULL::bigint, ''::bytea)",
        "SELECT twheel.schedule('bad', NULL::bytea, 0, ''::bytea)",
        "SELECT twheel.schedule('bad', 'k', now(), repeat('p', 1048577))",
        "INSERT INTO twheel.timers (ns, key, due, payload, attempts)"
        " VALUES ('bad', 'k', 0, '', -1)",
        "INSERT INTO twheel.dead (ns, key, due, payload, attempts)"
        " VALUES ('bad', '', 0, '', 0)",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        sql(c, bad[i], PGRES_FATAL_ERROR);
    /* NULL payload is an empty one. */
    sql(c, "SELECT twheel.schedule('bad', 'nullpl'::bytea, 0, NULL::bytea)",
        PGRES_TUPLES_OK);
    pgf_wait_count("nullpl", 1);
    wait_none_pending(d);
    ASSERT_EQ(tw_durable_close(d), 0);
    /* A schema newer than this library: refused at open, not written. */
    sql(c, "UPDATE twheel.version SET v = v + 1", PGRES_COMMAND_OK);
    char err[256];
    tw_durable_config cfg = pgf_config(NULL, NULL, on_fire, NULL, err);
    ASSERT_EQ(tw_durable_open(&d, &cfg), TW_EINVAL);
    ASSERT(strstr(err, "version"));
    sql(c, "UPDATE twheel.version SET v = v - 1", PGRES_COMMAND_OK);
    PQfinish(c);
}

/* A row written by hand with attempts at the column's limit is claimed
 * (its count held at the limit) and delivered: before, the claim's
 * "attempts + 1" overflowed and failed every claim of the namespace. */
static void test_attempts_limit(void)
{
    tw_durable *d = open_ns("lk", 0, 0);
    PGconn *c = pgf_client();
    sql(c,
        "INSERT INTO twheel.timers (ns, key, due, payload, attempts)"
        " VALUES ('lk', 'maxatt', 0, '', 2147483647)",
        PGRES_COMMAND_OK);
    sql(c, "SELECT pg_notify('twheel', 'lk')", PGRES_TUPLES_OK);
    pgf_wait_count("maxatt", 1);
    pgf_sentinel(c, "lk", "after");
    wait_none_pending(d);
    PQfinish(c);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* A role with exactly the grants of docs/guide/postgres.md runs a node;
 * one without them is refused at open with TW_EAUTH and a message. */
static void test_permissions(void)
{
    PGconn *c = pgf_client();
    sql(c, "CREATE ROLE node LOGIN", PGRES_COMMAND_OK);
    sql(c, "CREATE ROLE nobody_here LOGIN", PGRES_COMMAND_OK);
    sql(c,
        "GRANT USAGE ON SCHEMA twheel TO node;"
        "GRANT SELECT, INSERT, UPDATE, DELETE ON twheel.timers, twheel.dead"
        " TO node; GRANT SELECT ON twheel.version TO node;"
        "GRANT SELECT, INSERT ON twheel.quarantine TO node;"
        "GRANT USAGE ON SEQUENCE twheel.ver_seq TO node",
        PGRES_COMMAND_OK);
    char err[256], as[512];
    snprintf(as, sizeof as, "%s user=node", pgf_url);
    tw_durable_config cfg = pgf_config(as, "perm", on_fire, NULL, err);
    tw_durable *d = NULL;
    ASSERT_EQ(tw_durable_open(&d, &cfg), 0);
    ASSERT_EQ(tw_durable_schedule(d, "perm1", 5, now_ms(), "", 0), 0);
    pgf_wait_count("perm1", 1);
    ASSERT_EQ(tw_durable_close(d), 0);
    snprintf(as, sizeof as, "%s user=nobody_here", pgf_url);
    ASSERT_EQ(tw_durable_open(&d, &cfg), TW_EAUTH);
    ASSERT(strstr(err, "postgres"));
    fprintf(stderr, "  refused: %s\n", err);
    PQfinish(c);
}

/* Connection strings that cannot work: TW_EINVAL for one libpq cannot
 * parse, TW_ECONN for an unreachable server; no message shows a
 * password. */
static void test_bad_conninfo(void)
{
    static const struct {
        const char *s;
        int rc;
    } v[] = {
        {"nonsense=1 password=sekrit", TW_EINVAL},
        {"host=127.0.0.1 port=1 password=sekrit connect_timeout=2", TW_ECONN},
        {"postgresql://u:sekrit@127.0.0.1:1/db?connect_timeout=2", TW_ECONN},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        char err[256];
        tw_durable_config cfg = pgf_config(v[i].s, NULL, on_fire, NULL, err);
        tw_durable *d = (tw_durable *)&cfg;
        ASSERT_EQ(tw_durable_open(&d, &cfg), v[i].rc);
        ASSERT(d == (tw_durable *)&cfg); /* unchanged */
        ASSERT(err[0]);
        ASSERT(!strstr(err, "sekrit"));
    }
}

/* Three handles on one namespace: every timer exactly once, none early. */
static void test_fleet(void)
{
    tw_durable *d[3];
    for (int i = 0; i < 3; i++)
        d[i] = open_ns("fleet", i, 2);
    PGconn *c = pgf_client();
    char q[256];
    snprintf(q, sizeof q,
             "SELECT count(twheel.schedule('fleet', 'k' || i, now() +"
             " (i %% 500) * interval '1 ms', '')) FROM"
             " generate_series(0, %d) i",
             FLEET_N - 1);
    int64_t t0 = now_ms();
    sql(c, q, PGRES_TUPLES_OK);
    int done = 0;
    for (int w = 0; w < WAIT_MS && done < FLEET_N; w++) {
        done = 0;
        for (int i = 0; i < FLEET_N; i++)
            done += atomic_load(&hits[i]) > 0;
        sleep_ms(1);
    }
    int64_t t1 = now_ms();
    if (done < FLEET_N) {
        fprintf(stderr, "  fleet: %d of %d delivered\n", done, FLEET_N);
        PGresult *r = PQexec(c, "SELECT encode(key, 'escape'), due,"
                                " attempts, owner, lease_until, now() FROM"
                                " twheel.timers WHERE ns = 'fleet' LIMIT 5");
        for (int i = 0; i < PQntuples(r); i++)
            fprintf(stderr, "  %s %s %s %s %s %s\n", PQgetvalue(r, i, 0),
                    PQgetvalue(r, i, 1), PQgetvalue(r, i, 2),
                    PQgetvalue(r, i, 3), PQgetvalue(r, i, 4),
                    PQgetvalue(r, i, 5));
        PQclear(r);
    }
    sleep_ms(300);
    for (int i = 0; i < FLEET_N; i++)
        ASSERT_EQ(atomic_load(&hits[i]), 1);
    ASSERT_EQ(atomic_load(&early), 0);
    fprintf(stderr, "  fleet: %d timers in %lld ms, by node %d %d %d\n",
            FLEET_N, (long long)(t1 - t0), atomic_load(&by_node[0]),
            atomic_load(&by_node[1]), atomic_load(&by_node[2]));
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(tw_durable_close(d[i]), 0);
    PGresult *r = PQexec(c, "SELECT count(*) FROM twheel.timers"
                            " WHERE ns = 'fleet'");
    ASSERT_STR_EQ(PQgetvalue(r, 0, 0), "0");
    PQclear(r);
    PQfinish(c);
}

/* pg_ctl restart -m immediate while timers fall due: each committed one
 * is delivered (at least once: a completion the crash lost repeats). */
static void test_restart(void)
{
    const char *restart = getenv("TW_PG_RESTART");
    if (!restart) {
        fprintf(stderr, "  no TW_PG_RESTART: skipped\n");
        return;
    }
    for (int i = 0; i < FLEET_N; i++)
        atomic_store(&hits[i], 0);
    tw_durable *d = open_ns("restart", 0, 2);
    PGconn *c = pgf_client();
    sql(c,
        "SELECT count(twheel.schedule('restart', 'k' || i, now() +"
        " (i * 2) * interval '1 ms', '')) FROM generate_series(0, 999) i",
        PGRES_TUPLES_OK);
    PQfinish(c);
    sleep_ms(700);
    ASSERT_EQ(system(restart), 0);
    int done = 0;
    for (int w = 0; w < WAIT_MS && done < 1000; w++) {
        done = 0;
        for (int i = 0; i < 1000; i++)
            done += atomic_load(&hits[i]) > 0;
        sleep_ms(1);
    }
    ASSERT_EQ(done, 1000);
    ASSERT_EQ(atomic_load(&early), 0);
    int again = 0;
    for (int i = 0; i < 1000; i++)
        again += atomic_load(&hits[i]) - 1;
    fprintf(stderr, "  restart: 1000 delivered, %d again\n", again);
    tw_durable_stats s;
    for (int w = 0; w < WAIT_MS; w++) {
        if (!tw_durable_stats_get(d, &s) && s.pending == 0)
            break;
        sleep_ms(1);
    }
    ASSERT_EQ(s.pending, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* kill -9 of a node under load: the child node writes each key it
 * delivers to a file before its callback returns. */
static int child_fd = -1;

static int child_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    char line[64];
    int n = snprintf(line, sizeof line, "%.*s\n", (int)t->key_len,
                     (const char *)t->key);
    if (write(child_fd, line, (size_t)n) != n)
        _exit(3);
    return 0;
}

static void child_node(const char *path)
{
    child_fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0600);
    char err[256];
    tw_durable_config c = pgf_config(NULL, "kill", child_fire, NULL, err);
    c.executor_threads = 2;
    c.lease_ms = 1000;
    tw_durable *d = NULL;
    if (child_fd < 0 || tw_durable_open(&d, &c))
        _exit(2);
    for (;;)
        pause();
}

/* Keys the child delivered, from its file. */
static void child_hits(const char *path, int *seen, int n)
{
    FILE *f = fopen(path, "r");
    ASSERT_NOT_NULL(f);
    char line[64];
    int k;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "k%d", &k) == 1 && k >= 0 && k < n)
            seen[k]++;
    fclose(f);
}

/* Two nodes share 2,000 timers falling due over 1.5 s; one is killed
 * with SIGKILL in the middle. Every timer is delivered (its claims move
 * to the other node after the 1 s lease), and the 100 timers cancelled
 * through the survivor before their due time are delivered by neither. */
static void test_kill_node(void)
{
    enum { N = 2000, CXL = 1900 };
    for (int i = 0; i < FLEET_N; i++)
        atomic_store(&hits[i], 0);
    char path[] = "/tmp/twpgkill.XXXXXX";
    int fd = mkstemp(path);
    ASSERT_GE(fd, 0);
    close(fd);
    PGconn *c = pgf_client();
    sql(c,
        "SELECT count(twheel.schedule('kill', 'k' || i, now() + interval"
        " '500 ms' + (i * 3 / 4) * interval '1 ms', '')) FROM"
        " generate_series(0, 1999) i",
        PGRES_TUPLES_OK);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0)
        child_node(path);
    char err[256];
    tw_durable_config cfg = pgf_config(NULL, "kill", on_fire, NULL, err);
    cfg.executor_threads = 2;
    cfg.lease_ms = 1000;
    tw_durable *d = NULL;
    ASSERT_EQ(tw_durable_open(&d, &cfg), 0);
    for (int i = CXL; i < N; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%d", i);
        ASSERT_EQ(tw_durable_cancel(d, k, strlen(k)), 0);
    }
    sleep_ms(1000); /* the child is delivering now */
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int st;
    ASSERT_EQ(waitpid(pid, &st, 0), pid);
    ASSERT(WIFSIGNALED(st));
    static int seen[N];
    int done = 0;
    for (int w = 0; w < WAIT_MS / 10 && done < CXL; w++) {
        memset(seen, 0, sizeof seen);
        child_hits(path, seen, N);
        done = 0;
        for (int i = 0; i < CXL; i++)
            done += seen[i] + atomic_load(&hits[i]) > 0;
        sleep_ms(10);
    }
    int by_child = 0, again = 0;
    for (int i = 0; i < CXL; i++) {
        by_child += seen[i] > 0;
        again += seen[i] + atomic_load(&hits[i]) - 1;
    }
    fprintf(stderr, "  kill: %d delivered (%d by the killed node, %d again)\n",
            done, by_child, again);
    ASSERT_EQ(done, CXL);
    for (int i = CXL; i < N; i++)
        ASSERT_EQ(seen[i] + atomic_load(&hits[i]), 0);
    ASSERT_EQ(atomic_load(&early), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    unlink(path);
    PQfinish(c);
}

int main(void)
{
    pgf_init();
    RUN_TEST(test_transactions);
    RUN_TEST(test_sql_cancel);
    RUN_TEST(test_cancel_claimed);
    RUN_TEST(test_hostile_rows);
    RUN_TEST(test_attempts_limit);
    RUN_TEST(test_permissions);
    RUN_TEST(test_bad_conninfo);
    RUN_TEST(test_fleet);
    RUN_TEST(test_kill_node);
    RUN_TEST(test_restart);
    return 0;
}
