/* SPDX-License-Identifier: MIT */
/*
 * tests/test_pg_fleet.c - the PostgreSQL backend under continuous load
 * while things fail, on real servers (tests/pg_test.sh makes them):
 *   kill      three node processes fire one namespace; every 0.6 s one of
 *             them is killed with SIGKILL and started again;
 *   restart   the server is stopped with -m immediate and started again
 *             (TW_PG_RESTART) twice; then the first call on a connection
 *             the restart broke fails with TW_ECONN and the next succeeds;
 *   sync      the primary's WAL sender is held (SIGSTOP) for
 *             TW_FLEET_LAG_MS (300), then it and the primary are killed and
 *             the streaming standby, synchronous (synchronous_standby_names),
 *             promoted; every handle has both servers in its connection
 *             string (target_session_attrs=read-write, TW_PG_FAILOVER_URL);
 *   async     the same with asynchronous replication: what is lost is
 *             counted and printed; asserted: only what was acknowledged
 *             while replication was held (TW_FLEET_LAG_MS=0: no hold,
 *             nothing asserted of it).
 * Usage: test_pg_fleet MODE (under tests/pg_test.sh; TW_PG_STANDBY=1 for
 * sync and async).
 *
 * The load: this process, through a TW_DURABLE_NOFIRE handle, schedules
 * a new key every LOAD_EVERY_MS (due 0.4 to 1.4 s later) for LOAD_MS; of
 * them, some are cancelled or replaced well before their due time and
 * some cancelled or replaced at about their due time (racing the claim
 * and the completion, which must not erase the replacement). A call that
 * fails (the server away) is tried again until it succeeds; a schedule
 * tried again gets a new payload (its generation), so a delivery of an
 * attempt that was never acknowledged is told apart. The nodes are this
 * program run as "node" (exec'd, so no fork of a threaded process): each
 * delivery appends "key gen attempt start_ms due_ms" to its
 * incarnation's own file as its callback starts, which then works 3 ms.
 * A "ready" line comes first, once the node's handle is open: the
 * failures start once the first three nodes are ready.
 *
 * What is asserted (docs/guide/postgres.md, "What holds through
 * failures"), from the files once the namespace is empty and the nodes
 * closed:
 *   - lost: an acknowledged schedule or replace (the last of its key)
 *     never delivered: none;
 *   - after cancel: a delivery of a generation whose cancel or replace
 *     returned before its due time: none; one whose cancel or replace
 *     returned later may still start (claimed before the cancel
 *     committed), but within the lease of the cancel's return (a node
 *     drops, unstarted, a delivery whose claim came back 3/4 of the lease
 *     ago; the claim committed before the cancel did);
 *   - twice: a generation delivered more than once only when the earlier
 *     delivery's node was killed (kill), or it started in the window of
 *     an outage, from one lease before the server went away to when it
 *     was back (restart, sync); each later delivery with a larger attempt;
 *   - early: no callback before its due time.
 * async prints these counts instead of asserting them (besides early),
 * and asserts that each broken rule concerns a call acknowledged (or a
 * delivery started) after the standby was last seen up to date, just
 * before replication was held back.
 * Times measured (printed): the outage, and from the server being back
 * to the first acknowledged call and to the first delivery.
 * Real clocks; every wait is for a state, bounded by WAIT_MS.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock_fixture.h" /* now_ms, sleep_ms */
#include "test.h"
#include "twheel/durable.h"

#define WAIT_MS 30000   /* real time allowed for a state to be reached */
#define LOAD_MS 2500    /* how long new keys are scheduled */
#define LOAD_EVERY_MS 3 /* a new key this often */
#define LEASE_MS 2000   /* the nodes' cfg.lease_ms */
#define NKEYS (LOAD_MS / LOAD_EVERY_MS + 1)
#define NODES 3
#define MAX_INC 32 /* node incarnations */
#define MAX_OUT 2  /* outages */
#define NS "fleet"

extern char **environ;

static const char *url; /* the primary */

static PGconn *pg(const char *conninfo)
{
    PGconn *c = PQconnectdb(conninfo);
    ASSERT_EQ(PQstatus(c), CONNECTION_OK);
    return c;
}

static void sql(PGconn *c, const char *q)
{
    PGresult *r = PQexec(c, q);
    if (PQresultStatus(r) != PGRES_COMMAND_OK &&
        PQresultStatus(r) != PGRES_TUPLES_OK)
        fprintf(stderr, "%s: %s\n", q, PQerrorMessage(c));
    ASSERT(PQresultStatus(r) == PGRES_COMMAND_OK ||
           PQresultStatus(r) == PGRES_TUPLES_OK);
    PQclear(r);
}

/* The first row's first column of @q: 1 when it is "t". */
static bool sql_true(PGconn *c, const char *q)
{
    PGresult *r = PQexec(c, q);
    bool t = PQresultStatus(r) == PGRES_TUPLES_OK && PQntuples(r) > 0 &&
             !strcmp(PQgetvalue(r, 0, 0), "t");
    PQclear(r);
    return t;
}

/* A handle on namespace NS at @conninfo: a node (@fire) or, with
 * @fire NULL, a client that never delivers (TW_DURABLE_NOFIRE); NULL
 * (said on stderr) if open fails. */
static int no_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)t;
    (void)arg;
    abort();
}

static tw_durable *open_handle(const char *conninfo, tw_durable_fire_fn fire)
{
    tw_durable_config c;
    memset(&c, 0, sizeof c);
    char err[256];
    c.postgres = conninfo;
    c.postgres_namespace = NS;
    c.fire = fire ? fire : no_fire;
    c.flags = fire ? 0 : TW_DURABLE_NOFIRE;
    c.executor_threads = 2;
    c.lease_ms = LEASE_MS;
    c.errbuf = err;
    c.errbuf_len = sizeof err;
    tw_durable *d = NULL;
    int rc = tw_durable_open(&d, &c);
    if (rc)
        fprintf(stderr, "open: %d %s\n", rc, err);
    return rc ? NULL : d;
}

/* ---- a node: fires the namespace until SIGTERM, then closes ---- */

static FILE *node_out;

static int node_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    /* One line per delivery, written as the callback starts; then 3 ms
     * of work, in which a SIGKILL leaves a started delivery without its
     * completion (delivered again: rule 4). */
    fprintf(node_out, "%.*s %u %lld %lld\n", (int)t->payload_len,
            (const char *)t->payload, t->attempt, (long long)now_ms(),
            (long long)t->due_ms);
    fflush(node_out);
    sleep_ms(3);
    return 0;
}

static int node_main(const char *path)
{
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    /* Blocked before any thread starts, so sigwait() below gets it. */
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    node_out = fopen(path, "a");
    if (!node_out)
        return 2;
    tw_durable *d = open_handle(getenv("TW_FLEET_URL"), node_fire);
    if (!d)
        return 2;
    fputs("ready\n", node_out); /* open returned: the node fires */
    fflush(node_out);
    int sig;
    sigwait(&set, &sig);
    int rc = tw_durable_close(d);
    fclose(node_out);
    return rc ? 3 : 0;
}

/* ---- the nodes' incarnations, seen from the test ---- */

static struct inc {
    pid_t pid;
    bool killed;
    char path[96];
} incs[MAX_INC];
static int ninc, live[NODES]; /* live[i]: node i's incarnation */
static char dir[] = "/tmp/twpgfleet.XXXXXX";
static char self[512];

static int spawn_node(void)
{
    ASSERT_LT(ninc, MAX_INC);
    struct inc *in = &incs[ninc];
    snprintf(in->path, sizeof in->path, "%s/inc%d", dir, ninc);
    char *argv[] = {self, (char *)"node", in->path, NULL};
    ASSERT_EQ(posix_spawn(&in->pid, self, NULL, NULL, argv, environ), 0);
    return ninc++;
}

static void kill_node(int i)
{
    struct inc *in = &incs[live[i]];
    ASSERT_EQ(kill(in->pid, SIGKILL), 0);
    int st;
    ASSERT_EQ(waitpid(in->pid, &st, 0), in->pid);
    ASSERT(WIFSIGNALED(st));
    in->killed = true;
    live[i] = spawn_node();
}

/* Until incarnation @i has opened its handle (its file says "ready"). */
static void wait_ready(int i)
{
    int64_t t0 = now_ms();
    for (;;) {
        FILE *f = fopen(incs[i].path, "r");
        char line[128];
        bool ready = false;
        while (f && !ready && fgets(line, sizeof line, f))
            ready = !strcmp(line, "ready\n");
        if (f)
            fclose(f);
        if (ready)
            return;
        ASSERT_LT(now_ms() - t0, WAIT_MS);
        sleep_ms(10);
    }
}

/* Each live node closed (SIGTERM): exits 0 once its handle closed. */
static void stop_nodes(void)
{
    for (int i = 0; i < NODES; i++)
        ASSERT_EQ(kill(incs[live[i]].pid, SIGTERM), 0);
    for (int i = 0; i < NODES; i++) {
        int st;
        ASSERT_EQ(waitpid(incs[live[i]].pid, &st, 0), incs[live[i]].pid);
        if (!WIFEXITED(st) || WEXITSTATUS(st))
            fprintf(stderr, "node %d: exit %d, signal %d\n", i,
                    WIFEXITED(st) ? WEXITSTATUS(st) : -1,
                    WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        ASSERT(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    }
}

/* ---- the load and its ledger ---- */

/* What becomes of a key after its schedule: nothing, a cancel or a
 * replace well before its due time, or one at about its due time. */
enum plan { P_NONE, P_CANCEL, P_REPLACE, P_RACE_CANCEL, P_RACE_REPLACE };

/* An acknowledged schedule of a key: its generation and due time, and
 * when a cancel or replace of it returned (0: it is the key's last). */
struct ack {
    int gen;
    int64_t due, acked, ended;
};

static struct key {
    enum plan plan;
    int64_t plan_at;
    bool planned; /* the plan carried out */
    bool cancelled;
    int gens;        /* generations tried */
    int nack;        /* acknowledged ones in ack[] */
    struct ack a[2]; /* the first schedule, the replacement */
} keys[NKEYS];
static int nkeys;
static tw_durable *client;
static uint64_t seed = 45;

/* Outages: from the server going away to its being back. */
static struct {
    _Atomic int64_t down, up;  /* up: 0 while away */
    _Atomic int64_t first_ack; /* the first call acknowledged after up */
    int64_t first_dlv;         /* the first delivery started after up */
} outs[MAX_OUT];
static atomic_int nout;

/* The outages so far (at most MAX_OUT: outage() asserts it). */
static int outages(void)
{
    int o = atomic_load(&nout);
    return o < MAX_OUT ? o : MAX_OUT;
}

static int failed_calls, cancel_noent;
static _Atomic int64_t lag_from; /* the standby had all WAL up to then */
static int64_t held_at;          /* when the WAL sender was stopped */

/* What broke the rules (counted at check time from the files). */
static struct {
    int before_lag; /* of the counts below: before replication was held */
    int delivered, lost, after_cancel, raced, late_raced, twice_ok, twice_bad,
        early, unacked;
    int64_t race_lag; /* the most a raced delivery started after */
} tally;

/* Count a broken rule in @count, whose acknowledgement (or delivery) was
 * at @t; tally.before_lag also when that was before replication was held
 * (or when it never was). */
static void broken(int *count, int64_t t)
{
    (*count)++;
    int64_t l = atomic_load(&lag_from);
    tally.before_lag += !l || t < l;
}

static void keyname(char *k, size_t n, int i)
{
    snprintf(k, n, "k%d", i);
}

/* A call that failed for want of the server (the only failure this load
 * may see) is tried again, every 20 ms, for at most WAIT_MS. */
static bool again(int rc, int64_t t0)
{
    if (rc == 0 || rc == TW_ENOENT)
        return false;
    if (rc != TW_ECONN)
        fprintf(stderr, "  call failed: %d\n", rc);
    ASSERT_EQ(rc, TW_ECONN);
    ASSERT_LT(now_ms() - t0, WAIT_MS);
    failed_calls++;
    sleep_ms(20);
    return true;
}

static void note_ack(void)
{
    int64_t now = now_ms(), zero = 0;
    int o = atomic_load(&nout) - 1;
    if (o >= 0 && outs[o].up && now >= outs[o].up)
        atomic_compare_exchange_strong(&outs[o].first_ack, &zero, now);
}

/* Schedule key @i due at @due: a new generation per attempt. */
static void put(int i, int64_t due)
{
    struct key *k = &keys[i];
    char name[16], pl[32];
    keyname(name, sizeof name, i);
    int64_t t0 = now_ms();
    int rc;
    do {
        snprintf(pl, sizeof pl, "%s g%d", name, k->gens++);
        rc = tw_durable_schedule(client, name, strlen(name), due, pl,
                                 strlen(pl));
    } while (again(rc, t0));
    ASSERT_EQ(rc, 0);
    if (k->nack)
        k->a[k->nack - 1].ended = now_ms();
    ASSERT_LT(k->nack, 2);
    k->a[k->nack++] = (struct ack){k->gens - 1, due, now_ms(), 0};
    note_ack();
}

static void cancel(int i)
{
    struct key *k = &keys[i];
    char name[16];
    keyname(name, sizeof name, i);
    int64_t t0 = now_ms();
    int rc, tries = 0;
    do {
        rc = tw_durable_cancel(client, name, strlen(name));
        tries++;
    } while (again(rc, t0));
    /* TW_ENOENT: delivered already (it was due), or (tried again) the
     * attempt before committed; else the timer was lost. */
    int64_t now = now_ms();
    if (rc == TW_ENOENT && tries == 1 && now < k->a[k->nack - 1].due)
        broken(&cancel_noent, k->a[k->nack - 1].acked);
    k->a[k->nack - 1].ended = now;
    k->cancelled = true;
    note_ack();
}

static void new_key(int64_t now)
{
    int i = nkeys++;
    struct key *k = &keys[i];
    int64_t due = now + 400 + (int64_t)(tw_test_rand(&seed) % 1000);
    unsigned r = (unsigned)(tw_test_rand(&seed) % 100);
    k->plan = r < 50   ? P_NONE
              : r < 62 ? P_CANCEL
              : r < 74 ? P_REPLACE
              : r < 87 ? P_RACE_CANCEL
                       : P_RACE_REPLACE;
    k->plan_at = k->plan >= P_RACE_CANCEL
                     ? due - 10 + (int64_t)(tw_test_rand(&seed) % 20)
                     : now + 50 + (int64_t)(tw_test_rand(&seed) % 100);
    k->planned = k->plan == P_NONE;
    put(i, due);
}

/* The plans whose time has come; whether any is left. */
static bool run_plans(int64_t now)
{
    bool left = false;
    for (int i = 0; i < nkeys; i++) {
        struct key *k = &keys[i];
        if (k->planned)
            continue;
        if (k->plan_at > now) {
            left = true;
            continue;
        }
        k->planned = true;
        if (k->plan == P_REPLACE || k->plan == P_RACE_REPLACE)
            put(i, now_ms() + 300 + (int64_t)(tw_test_rand(&seed) % 700));
        else
            cancel(i);
    }
    return left;
}

static void run_load(void)
{
    int64_t t0 = now_ms(), next = t0;
    for (;;) {
        int64_t now = now_ms();
        bool loading = now - t0 < LOAD_MS && nkeys < NKEYS;
        while (loading && now >= next && nkeys < NKEYS) {
            new_key(now);
            next += LOAD_EVERY_MS;
        }
        if (!run_plans(now_ms()) && !loading)
            return;
        sleep_ms(1);
    }
}

/* ---- the failures, on a thread of their own beside the load ---- */

static int mode_kill, mode_async;
static const char *failure[2]; /* shell commands: down (and up) */

static void outage(const char *down, const char *up)
{
    int o = atomic_load(&nout);
    ASSERT_LT(o, MAX_OUT);
    outs[o].down = now_ms();
    atomic_store(&nout, o + 1);
    ASSERT_EQ(system(down), 0);
    if (up)
        ASSERT_EQ(system(up), 0);
    outs[o].up = now_ms();
}

/* Replication held back before a failover: once the standby has
 * received all the WAL the primary had written (so every call
 * acknowledged before is on the standby), the primary's WAL sender is
 * stopped (SIGSTOP) for @ms, then killed (the primary is killed next):
 * what the primary committed meanwhile never reaches the standby.
 * Synchronous replication acknowledges nothing meanwhile (each commit
 * waits for the standby); asynchronous acknowledges it, and loses it. */
static void hold_replication(int ms)
{
    PGconn *p = pg(url), *s = pg(getenv("TW_PG_STANDBY_URL"));
    int64_t t = now_ms();
    PGresult *r = PQexec(p, "SELECT pg_current_wal_lsn()");
    ASSERT_EQ(PQresultStatus(r), PGRES_TUPLES_OK);
    char q[128];
    snprintf(q, sizeof q, "SELECT pg_last_wal_receive_lsn() >= '%s'",
             PQgetvalue(r, 0, 0));
    PQclear(r);
    while (!sql_true(s, q)) {
        ASSERT_LT(now_ms() - t, WAIT_MS);
        sleep_ms(1);
    }
    r = PQexec(p, "SELECT pid FROM pg_stat_replication");
    ASSERT_EQ(PQresultStatus(r), PGRES_TUPLES_OK);
    ASSERT_EQ(PQntuples(r), 1);
    pid_t pid = (pid_t)atoi(PQgetvalue(r, 0, 0));
    PQclear(r);
    PQfinish(s);
    PQfinish(p);
    ASSERT_EQ(kill(pid, SIGSTOP), 0);
    held_at = now_ms();
    lag_from = t;
    sleep_ms(ms);
    ASSERT_EQ(kill(pid, SIGKILL), 0);
}

static int lag_ms = 300; /* TW_FLEET_LAG_MS */

static void *failures(void *arg)
{
    (void)arg;
    if (mode_kill) {
        for (int i = 0; i < 4; i++) {
            sleep_ms(i ? 600 : 500);
            kill_node(i % NODES);
        }
    } else if (!failure[1]) {
        sleep_ms(600);
        outage(failure[0], NULL);
        sleep_ms(700);
        outage(failure[0], NULL);
    } else {
        sleep_ms(1000);
        if (lag_ms)
            hold_replication(lag_ms);
        outage(failure[0], failure[1]);
    }
    return NULL;
}

/* ---- what the nodes delivered ---- */

struct dlv {
    int key, gen, inc;
    unsigned attempt;
    int64_t start, due;
};

static struct dlv *dl;
static size_t ndl, capdl;

static void read_inc(int inc)
{
    FILE *f = fopen(incs[inc].path, "r");
    if (!f)
        return; /* killed before its first delivery, maybe before open */
    char line[128];
    struct dlv d = {.inc = inc};
    long long start, due;
    while (fgets(line, sizeof line, f)) {
        /* A line cut by SIGKILL is no delivery the test can count. */
        if (sscanf(line, "k%d g%d %u %lld %lld", &d.key, &d.gen, &d.attempt,
                   &start, &due) != 5 ||
            !strchr(line, '\n'))
            continue;
        ASSERT(d.key >= 0 && d.key < nkeys);
        d.start = start;
        d.due = due;
        if (ndl == capdl) {
            capdl = capdl ? capdl * 2 : 4096;
            dl = realloc(dl, capdl * sizeof *dl);
            ASSERT_NOT_NULL(dl);
        }
        dl[ndl++] = d;
    }
    fclose(f);
}

static int by_key(const void *a, const void *b)
{
    const struct dlv *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    if (x->gen != y->gen)
        return x->gen < y->gen ? -1 : 1;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* A delivery that started @lag ms after a cancel or replace returned
 * at or after its due time (rule 3). */
static void note_race(int64_t lag)
{
    tally.raced++;
    if (lag > tally.race_lag)
        tally.race_lag = lag;
}

/* May @d be followed by another delivery of its generation? */
static bool may_repeat(const struct dlv *d)
{
    if (mode_kill)
        return incs[d->inc].killed;
    for (int i = 0; i < outages(); i++)
        if (d->start >= outs[i].down - LEASE_MS && d->start <= outs[i].up)
            return true;
    return false;
}

/* The deliveries @d[0..@m) of acknowledged generation @a. */
static void check_ack(const struct ack *a, bool last, const struct dlv *d,
                      size_t m)
{
    if (last && !m)
        broken(&tally.lost, a->acked);
    for (size_t j = 0; j < m; j++) {
        ASSERT_EQ(d[j].due, a->due);
        if (a->ended && d[j].start > a->ended) {
            if (a->ended < a->due)
                broken(&tally.after_cancel, a->ended);
            else if (d[j].start - a->ended >= LEASE_MS)
                broken(&tally.late_raced, a->ended);
            else
                note_race(d[j].start - a->ended);
        } else if (a->ended && a->ended < a->due) {
            broken(&tally.after_cancel, a->ended); /* (and early) */
        }
        if (j + 1 < m) {
            bool ok = may_repeat(&d[j]) && d[j + 1].attempt > d[j].attempt;
            tally.twice_ok += ok;
            if (!ok)
                broken(&tally.twice_bad, d[j].start);
            if (!ok && tally.twice_bad <= 5) /* the first few */
                fprintf(stderr, "  twice: k%d g%d at %lld and %lld\n", d[j].key,
                        d[j].gen, (long long)d[j].start,
                        (long long)d[j + 1].start);
        }
    }
}

static void check_key(int i, const struct dlv *d, size_t m)
{
    const struct key *k = &keys[i];
    size_t j = 0;
    while (j < m) {
        size_t e = j;
        while (e < m && d[e].gen == d[j].gen)
            e++;
        const struct ack *a = NULL;
        for (int x = 0; x < k->nack; x++)
            if (k->a[x].gen == d[j].gen)
                a = &k->a[x];
        if (!a)
            tally.unacked += (int)(e - j); /* an attempt that failed */
        j = e;
    }
    for (int x = 0; x < k->nack; x++) {
        const struct ack *a = &k->a[x];
        size_t b = 0, e;
        while (b < m && d[b].gen != a->gen)
            b++;
        for (e = b; e < m && d[e].gen == a->gen; e++)
            ;
        check_ack(a, x == k->nack - 1 && !k->cancelled, d + b, e - b);
    }
}

static void check_all(void)
{
    for (int i = 0; i < ninc; i++)
        read_inc(i);
    qsort(dl, ndl, sizeof *dl, by_key);
    for (size_t j = 0; j < ndl; j++) {
        tally.early += dl[j].start < dl[j].due;
        for (int o = 0; o < outages(); o++)
            if (dl[j].start >= outs[o].up &&
                (!outs[o].first_dlv || dl[j].start < outs[o].first_dlv))
                outs[o].first_dlv = dl[j].start;
    }
    tally.delivered = (int)ndl;
    size_t j = 0;
    for (int i = 0; i < nkeys; i++) {
        size_t b = j;
        while (j < ndl && dl[j].key == i)
            j++;
        check_key(i, dl + b, j - b);
    }
}

/* ---- the test ---- */

/* Replication as the mode wants it: synchronous (every commit waits for
 * the standby's flush) or asynchronous, the standby streaming. */
static void replication(bool sync)
{
    PGconn *c = pg(url);
    if (sync) {
        sql(c, "ALTER SYSTEM SET synchronous_standby_names = '*'");
        sql(c, "SELECT pg_reload_conf()");
    }
    const char *q = sync ? "SELECT count(*) > 0 FROM pg_stat_replication"
                           " WHERE sync_state = 'sync'"
                         : "SELECT count(*) > 0 FROM pg_stat_replication"
                           " WHERE state = 'streaming'";
    int w = 0;
    while (w < WAIT_MS && !sql_true(c, q)) {
        sleep_ms(10);
        w += 10;
    }
    ASSERT_LT(w, WAIT_MS);
    PQfinish(c);
}

static tw_durable *open_client(const char *conninfo)
{
    tw_durable *d = open_handle(conninfo, NULL);
    ASSERT_NOT_NULL(d);
    return d;
}

/* Until the namespace has no timer left (the last deliveries completed;
 * a failed look-up is tried again). */
static void wait_empty(void)
{
    int64_t t0 = now_ms();
    for (;;) {
        tw_durable_stats s;
        int rc = tw_durable_stats_get(client, &s);
        if (rc == 0 && s.pending == 0)
            return;
        ASSERT_LT(now_ms() - t0, WAIT_MS);
        sleep_ms(20);
    }
}

/* Calls acknowledged while replication was held back. */
static int acked_in_lag(void)
{
    int64_t from = held_at, to = outs[0].down;
    int c = 0;
    for (int i = 0; i < nkeys; i++)
        for (int x = 0; x < keys[i].nack; x++) {
            const struct ack *a = &keys[i].a[x];
            c += a->acked >= from && a->acked < to;
            c += a->ended >= from && a->ended < to;
        }
    return c;
}

static void report(const char *mode)
{
    if (atomic_load(&lag_from))
        fprintf(stderr,
                "  %s: replication held back %d ms before the failover: %d "
                "calls acknowledged meanwhile; of the rules broken, %d before "
                "the standby was last seen up to date (%lld ms before)\n",
                mode, lag_ms, acked_in_lag(), tally.before_lag,
                (long long)(held_at - lag_from));
    fprintf(stderr,
            "  %s: %d keys, %d deliveries; lost %d, after cancel %d, raced "
            "%d (late %d, at most %lld ms after), twice %d in the window "
            "(%d outside), early %d, of unacknowledged attempts %d; calls "
            "tried again %d, cancels that found nothing %d\n",
            mode, nkeys, tally.delivered, tally.lost, tally.after_cancel,
            tally.raced, tally.late_raced, (long long)tally.race_lag,
            tally.twice_ok, tally.twice_bad, tally.early, tally.unacked,
            failed_calls, cancel_noent);
    for (int o = 0; o < outages(); o++)
        fprintf(stderr,
                "  %s: outage %d: %lld ms; server back to the first "
                "acknowledged call %lld ms, to the first delivery %lld ms\n",
                mode, o, (long long)(outs[o].up - outs[o].down),
                (long long)(outs[o].first_ack - outs[o].up),
                (long long)(outs[o].first_dlv - outs[o].up));
}

static void fleet(const char *mode)
{
    ASSERT_NOT_NULL(mkdtemp(dir));
    client = open_client(getenv("TW_FLEET_URL"));
    for (int i = 0; i < NODES; i++)
        live[i] = spawn_node();
    for (int i = 0; i < NODES; i++)
        wait_ready(live[i]);
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, failures, NULL), 0);
    int64_t t0 = now_ms();
    run_load();
    ASSERT_EQ(pthread_join(th, NULL), 0);
    int64_t t1 = now_ms();
    wait_empty();
    int64_t t2 = now_ms();
    stop_nodes();
    fprintf(stderr,
            "  %s: load %lld ms, drained in %lld ms, nodes closed in %lld ms\n",
            mode, (long long)(t1 - t0), (long long)(t2 - t1),
            (long long)(now_ms() - t2));
    check_all();
    report(mode);
    ASSERT_EQ(tally.early, 0);
    if (mode_async && lag_ms)
        ASSERT_EQ(tally.before_lag, 0); /* only what the lag held is lost */
    if (!mode_async) {
        ASSERT_EQ(tally.lost, 0);
        ASSERT_EQ(tally.after_cancel, 0);
        ASSERT_EQ(tally.late_raced, 0);
        ASSERT_EQ(tally.twice_bad, 0);
        ASSERT_EQ(cancel_noent, 0);
    }
    ASSERT_EQ(tw_durable_close(client), 0);
    for (int i = 0; i < ninc; i++)
        unlink(incs[i].path);
    rmdir(dir);
    free(dl);
}

/* After a restart of the server, the first call on a connection it
 * broke fails with TW_ECONN and changes nothing; the next reconnects and
 * succeeds (docs/guide/postgres.md). One thread, so the calls take the
 * same pooled connection. */
static void reconnect(void)
{
    tw_durable *d = open_client(url);
    int64_t due = now_ms() + 3600 * 1000;
    ASSERT_EQ(tw_durable_schedule(d, "p1", 2, due, "", 0), 0);
    ASSERT_EQ(system(failure[0]), 0);
    int rc = tw_durable_schedule(d, "p2", 2, due, "", 0);
    ASSERT_EQ(rc, TW_ECONN);
    tw_durable_info info;
    ASSERT_EQ(tw_durable_get(d, "p2", 2, &info, NULL, 0), TW_ENOENT);
    ASSERT_EQ(tw_durable_get(d, "p1", 2, &info, NULL, 0), 0);
    ASSERT_EQ(tw_durable_schedule(d, "p2", 2, due, "", 0), 0);
    ASSERT_EQ(tw_durable_cancel(d, "p1", 2), 0);
    ASSERT_EQ(tw_durable_cancel(d, "p2", 2), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "node"))
        return node_main(argv[2]);
    const char *mode = argc == 2 ? argv[1] : "";
    url = getenv("TW_PG_URL");
    if (!url) {
        fprintf(stderr, "TW_PG_URL unset (tests/pg_test.sh sets it): "
                        "skipped\n");
        return 77;
    }
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    ASSERT(len > 0);
    self[len] = 0;
    const char *nodes_url = url;
    if (!strcmp(mode, "kill")) {
        mode_kill = 1;
    } else if (!strcmp(mode, "restart")) {
        failure[0] = getenv("TW_PG_RESTART");
    } else if (!strcmp(mode, "sync") || !strcmp(mode, "async")) {
        mode_async = !strcmp(mode, "async");
        if (getenv("TW_FLEET_LAG_MS"))
            lag_ms = atoi(getenv("TW_FLEET_LAG_MS"));
        failure[0] = getenv("TW_PG_STOP");
        failure[1] = getenv("TW_PG_PROMOTE");
        nodes_url = getenv("TW_PG_FAILOVER_URL");
        if (!failure[0] || !failure[1] || !nodes_url) {
            fprintf(stderr, "no standby (TW_PG_STANDBY=1 tests/pg_test.sh)\n");
            return 1;
        }
        replication(!mode_async);
    } else {
        fprintf(stderr, "usage: test_pg_fleet kill|restart|sync|async\n");
        return 2;
    }
    ASSERT(mode_kill || failure[0]);
    /* Before any thread: the nodes find it in their environment. */
    ASSERT_EQ(setenv("TW_FLEET_URL", nodes_url, 1), 0);
    fleet(mode);
    if (!strcmp(mode, "restart"))
        reconnect();
    printf("%s: passed\n", mode);
    return 0;
}
