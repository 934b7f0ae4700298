/* SPDX-License-Identifier: MIT */
/*
 * tests/test_durable_redis.c - the Redis backend of twheel/durable.h
 * against real redis-server processes, which tests/redis_test.sh starts
 * and stops. Usage: test_durable_redis MODE SEEDS [args]; the shell
 * commands TW_REDIS_STOP, TW_REDIS_START, TW_REDIS_KILL and TW_REDIS_RESHARD
 * (environment) stop, start, kill -9 and reshard the servers.
 *
 * Modes:
 *   semantics  schedule, replace, cancel, retries, never early, bad input,
 *              release on close, two handles on one namespace; stats
 *              (backlog, lateness histogram); a check's bounded age
 *   econn      unreachable at open and mid-run: TW_ECONN, then recovery
 *   garbage    damaged data in every key of every shard: set aside into
 *              the quarantine hashes, the rest of each shard fires;
 *              records in a shard their key does not hash to
 *   stall      a master stopped (SIGSTOP) in a cluster: no cancelled key
 *              delivered after its cancel, healthy masters' keys on time
 *   many       tw_durable_schedule_many: batches, keys given twice, and
 *              (one server) a dead server's TW_ECONN per item
 *   crash      kill -9 of the server (appendfsync always) and restart:
 *              every acknowledged schedule is delivered
 *   failover   kill -9 of a master, WAIT 1 replica: every acknowledged
 *              schedule is delivered by the promoted replica
 *   reshard    slots migrate while timers are scheduled and fire
 *   share N KILL  N node processes share 3*N... timers (see share_main)
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "redis_client.h"
#include "redis_fixture.h"
#include "test.h"
#include "twheel/durable.h"

static const char *seeds;

static void sh(const char *var)
{
    const char *cmd = getenv(var);
    ASSERT(cmd);
    fprintf(stderr, "  [%s]\n", var);
    int rc = system(cmd);
    ASSERT_EQ(rc, 0);
}

/* ------------------------------------------------------------------------ */
/* A delivery table for keys "k<id>". */

#define MAXK 200000
struct rec {
    _Atomic uint32_t count;
    _Atomic int64_t first_us, due;
    _Atomic uint32_t last_attempt;
    _Atomic uint32_t early;
    char payload[16];
};
static struct rec *tab;
static _Atomic int retry_first; /* return this many ms on attempt 1 */
static _Atomic uint64_t deliveries;

static int key_id(const tw_durable_timer *t)
{
    char b[32];
    ASSERT(t->key_len < sizeof b);
    memcpy(b, t->key, t->key_len);
    b[t->key_len] = 0;
    ASSERT(b[0] == 'k');
    int id = atoi(b + 1);
    ASSERT(id >= 0 && id < MAXK);
    return id;
}

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    int64_t now = now_us();
    int id = key_id(t);
    struct rec *r = &tab[id];
    if (now < t->due_ms * 1000)
        r->early++;
    if (r->count == 0) {
        r->first_us = now;
        r->due = t->due_ms;
        size_t n = t->payload_len < 15 ? t->payload_len : 15;
        memcpy(r->payload, t->payload, n);
        r->payload[n] = 0;
    }
    r->last_attempt = t->attempt;
    r->count++;
    deliveries++;
    if (retry_first && t->attempt == 1)
        return retry_first;
    return 0;
}

static void reset_tab(void)
{
    memset(tab, 0, sizeof(*tab) * MAXK);
    retry_first = 0;
    deliveries = 0;
}

static tw_durable_config base_cfg(const char *ns)
{
    tw_durable_config c;
    memset(&c, 0, sizeof c);
    c.redis = seeds;
    c.redis_namespace = ns;
    c.fire = on_fire;
    c.shards = 8;
    c.horizon_ms = 300;
    c.lease_ms = 2000;
    /* A server set up as in production (tests/redis_prod.sh tls-cluster). */
    c.redis_password = getenv("TW_SEM_PASSWORD");
    c.redis_tls_ca_file = getenv("TW_SEM_TLS_CA");
    c.redis_tls_cert_file = getenv("TW_SEM_TLS_CERT");
    c.redis_tls_key_file = getenv("TW_SEM_TLS_KEY");
    return c;
}

static int sched(tw_durable *d, int id, int64_t due, const char *payload)
{
    char k[32];
    int n = snprintf(k, sizeof k, "k%d", id);
    return tw_durable_schedule(d, k, (size_t)n, due, payload,
                               payload ? strlen(payload) : 0);
}

static int cancel(tw_durable *d, int id)
{
    char k[32];
    int n = snprintf(k, sizeof k, "k%d", id);
    return tw_durable_cancel(d, k, (size_t)n);
}

/* Wait until @pred ids [lo, hi) are delivered, at most @ms. */
static bool wait_all(int lo, int hi, int ms)
{
    int64_t end = now_ms() + ms;
    while (now_ms() < end) {
        int i;
        for (i = lo; i < hi && tab[i].count; i++)
            ;
        if (i == hi)
            return true;
        sleep_ms(10);
    }
    return false;
}

/* Wait (at most 10 s, a bound for a loaded machine) until the namespace
 * of @d holds nothing (stats.pending 0: every key completed or
 * cancelled, its completion in Redis) and no callback of @d runs. From
 * then on no timer of the namespace can be delivered again: a delivery
 * needs its key in Redis (a claim is checked against its score there
 * before its callback starts). This replaces waiting a fixed time for
 * deliveries that must not come. */
static void settle(tw_durable *d)
{
    tw_durable_stats st;
    int64_t end = now_ms() + 10000;
    for (;;) {
        ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
        if ((st.pending == 0 && st.running == 0) || now_ms() >= end)
            break;
        sleep_ms(10);
    }
    ASSERT_EQ(st.pending, 0);
    ASSERT_EQ(st.running, 0);
}

static void check_none_early(int lo, int hi)
{
    for (int i = lo; i < hi; i++)
        ASSERT_EQ(tab[i].early, 0);
}

/* ------------------------------------------------------------------------ */

static void semantics(void)
{
    char ns[32];
    snprintf(ns, sizeof ns, "sem%d", (int)getpid());
    tw_durable_config cfg = base_cfg(ns);
    tw_durable *d;
    reset_tab();

    /* Bad input: nothing written. */
    ASSERT_EQ(tw_durable_open(NULL, &cfg), TW_EINVAL);
    tw_durable_config bad = cfg;
    bad.fire = NULL;
    ASSERT_EQ(tw_durable_open(&d, &bad), TW_EINVAL);
    bad = cfg;
    bad.redis = "no-port";
    ASSERT_EQ(tw_durable_open(&d, &bad), TW_EINVAL);
    ASSERT_EQ(tw_durable_open(&d, &cfg), 0);
    static char big[TW_DURABLE_KEY_MAX + 1];
    memset(big, 'x', sizeof big);
    ASSERT_EQ(tw_durable_schedule(d, NULL, 1, 0, NULL, 0), TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule(d, "k", 0, 0, NULL, 0), TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule(d, big, sizeof big, 0, NULL, 0), TW_EINVAL);
    ASSERT_EQ(
        tw_durable_schedule(d, "k1", 2, 0, NULL, TW_DURABLE_PAYLOAD_MAX + 1),
        TW_EINVAL);
    ASSERT_EQ(tw_durable_cancel(d, big, sizeof big), TW_EINVAL);
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(st.pending, 0);

    int64_t t0 = now_ms();
    /* 1: plain, within the horizon (claimed by the schedule call). */
    ASSERT_EQ(sched(d, 1, t0 + 150, "one"), 0);
    /* 2: beyond the horizon (claimed later by CLAIM). */
    ASSERT_EQ(sched(d, 2, t0 + 900, "two"), 0);
    /* 3: replaced while claimed: only the new version fires. */
    ASSERT_EQ(sched(d, 3, t0 + 200, "old"), 0);
    ASSERT_EQ(sched(d, 3, t0 + 600, "new"), 0);
    /* 4: replaced while waiting in Redis: new due earlier. */
    ASSERT_EQ(sched(d, 4, t0 + 1500, "old"), 0);
    ASSERT_EQ(sched(d, 4, t0 + 400, "new"), 0);
    /* 5: cancelled while claimed; 6: cancelled while waiting. */
    ASSERT_EQ(sched(d, 5, t0 + 200, "x"), 0);
    ASSERT_EQ(sched(d, 6, t0 + 1200, "x"), 0);
    ASSERT_EQ(cancel(d, 5), 0);
    ASSERT_EQ(cancel(d, 6), 0);
    ASSERT_EQ(cancel(d, 5), TW_ENOENT);
    ASSERT_EQ(cancel(d, 7), TW_ENOENT);
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(st.pending, 4);
    /* 8: in the past: fires at once. */
    ASSERT_EQ(sched(d, 8, t0 - 5000, "past"), 0);
    /* 9: empty payload. */
    ASSERT_EQ(sched(d, 9, t0 + 50, NULL), 0);
    ASSERT(wait_all(1, 5, 5000));
    ASSERT(wait_all(8, 10, 5000));
    settle(d); /* nothing can fire from now on */
    check_none_early(1, 10);
    ASSERT_EQ(tab[1].count, 1);
    ASSERT_EQ(tab[2].count, 1);
    ASSERT_EQ(tab[3].count, 1);
    ASSERT(!strcmp(tab[3].payload, "new"));
    ASSERT_EQ(tab[3].due, t0 + 600);
    ASSERT_EQ(tab[4].count, 1);
    ASSERT(!strcmp(tab[4].payload, "new"));
    ASSERT_EQ(tab[5].count, 0);
    ASSERT_EQ(tab[6].count, 0);
    ASSERT_EQ(tab[8].count, 1);
    ASSERT_EQ(tab[9].count, 1);
    ASSERT_EQ(tab[9].payload[0], 0);
    ASSERT(!strcmp(tab[1].payload, "one"));
    ASSERT_EQ(tab[1].last_attempt, 1);
    ASSERT_EQ(cancel(d, 1), TW_ENOENT); /* done means gone */
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(st.pending, 0);
    ASSERT_EQ(st.fired, 6);
    ASSERT_EQ(st.cancelled, 2);

    /* 10: replaced just after its callback, while the completion waits
     * for its batch (up to 500 ms): the completion must find the key no
     * longer ours and leave the new version (due beyond the horizon,
     * waiting in Redis) alone. */
    ASSERT_EQ(sched(d, 10, now_ms() + 20, "first"), 0);
    for (int i = 0; i < 5000 && tab[10].count == 0; i++)
        sleep_ms(1);
    ASSERT_EQ(tab[10].count, 1);
    ASSERT_EQ(sched(d, 10, now_ms() + 1200, "second"), 0);
    for (int i = 0; i < 5000 && tab[10].count < 2; i++)
        sleep_ms(1);
    ASSERT_EQ(tab[10].count, 2);
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(st.fired, 8);

    /* Retries: attempt 1 asks for 100 ms more, attempt 2 is done. */
    retry_first = 100;
    t0 = now_ms();
    ASSERT_EQ(sched(d, 20, t0 + 50, "r"), 0);
    ASSERT_EQ(sched(d, 21, t0 + 500, "r"), 0);
    int64_t end = now_ms() + 5000;
    while ((tab[20].count < 2 || tab[21].count < 2) && now_ms() < end)
        sleep_ms(10);
    ASSERT_EQ(tab[20].count, 2);
    ASSERT_EQ(tab[20].last_attempt, 2);
    ASSERT_EQ(tab[21].count, 2);
    ASSERT_EQ(tab[21].last_attempt, 2);
    check_none_early(20, 22);
    retry_first = 0;
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(st.retried, 2);

    /* Close keeps pending timers for the next open; claims are given back
     * (no wait for the lease) with attempt still 1. */
    t0 = now_ms();
    ASSERT_EQ(sched(d, 30, t0 + 250, "c"), 0);  /* claimed by us */
    ASSERT_EQ(sched(d, 31, t0 + 2500, "c"), 0); /* in Redis */
    ASSERT_EQ(tw_durable_close(d), 0);
    ASSERT_EQ(tab[30].count, 0);
    ASSERT_EQ(tw_durable_open(&d, &cfg), 0);
    ASSERT(wait_all(30, 32, 6000));
    ASSERT_EQ(tab[30].last_attempt, 1);
    ASSERT_EQ(tab[31].last_attempt, 1);
    check_none_early(30, 32);

    /* Two handles on one namespace: each timer once. */
    tw_durable *d2;
    ASSERT_EQ(tw_durable_open(&d2, &cfg), 0);
    t0 = now_ms();
    for (int i = 100; i < 400; i++)
        ASSERT_EQ(sched(i % 2 ? d : d2, i, t0 + 200 + (i % 50) * 20, "m"), 0);
    ASSERT(wait_all(100, 400, 8000));
    settle(d);
    settle(d2);
    for (int i = 100; i < 400; i++)
        ASSERT_EQ(tab[i].count, 1);
    check_none_early(100, 400);
    ASSERT_EQ(tw_durable_close(d2), 0);

    /* A node that dies holding claims: its leases expire and another node
     * delivers with attempt 2. Simulated by a child killed with -9. */
    t0 = now_ms();
    fflush(NULL);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        /* A fresh process (exec), so that no thread of ours is copied. */
        char t0s[32];
        snprintf(t0s, sizeof t0s, "%lld", (long long)t0);
        execl("/proc/self/exe", "test_durable_redis", "dienode", seeds, ns, t0s,
              (char *)NULL);
        _exit(99);
    }
    int status;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT(WIFEXITED(status) && WEXITSTATUS(status) == 3);
    ASSERT(wait_all(500, 520, 3000 + 2000 + 4000));
    for (int i = 500; i < 520; i++) {
        ASSERT_EQ(tab[i].count, 1);
        ASSERT_EQ(tab[i].last_attempt, 2);
        /* Not before the lease ran out. */
        ASSERT(tab[i].first_us >= (t0 + 3000 + 2000) * 1000);
    }
    ASSERT_EQ(tw_durable_close(d), 0);
    printf("semantics: ok\n");
}

/* The node of semantics() that dies holding claims (a process of its
 * own). */
static void dienode(const char *ns, int64_t t0)
{
    tw_durable *dc;
    tw_durable_config cc = base_cfg(ns);
    cc.horizon_ms = 5000; /* claims everything below at once */
    if (tw_durable_open(&dc, &cc))
        _exit(1);
    for (int i = 500; i < 520; i++)
        if (sched(dc, i, t0 + 3000, "dead"))
            _exit(2);
    _exit(3); /* no close: the claims stay leased */
}

/* ------------------------------------------------------------------------ */

static void econn(void)
{
    tw_durable_config cfg = base_cfg("econn");
    tw_durable *d = NULL;
    tw_durable_config dead = cfg;
    dead.redis = "127.0.0.1:1";
    ASSERT_EQ(tw_durable_open(&d, &dead), TW_ECONN);
    ASSERT(d == NULL);
    reset_tab();
    ASSERT_EQ(tw_durable_open(&d, &cfg), 0);
    int64_t t0 = now_ms();
    ASSERT_EQ(sched(d, 1, t0 + 2500, "a"), 0);
    ASSERT_EQ(sched(d, 2, t0 + 1000, "b"), 0); /* claimed by us */
    sh("TW_REDIS_STOP");
    int64_t stopped = now_ms(); /* the shell may be slow under load */
    /* A big first write to the dead server: TW_ECONN. (A write after the
     * peer's reset would raise SIGPIPE, which redis_client.c blocks; this
     * does not reliably force that second write: loopback send buffers
     * take the whole megabyte at once.) */
    static char bigp[TW_DURABLE_PAYLOAD_MAX];
    memset(bigp, 'p', sizeof bigp);
    ASSERT_EQ(tw_durable_schedule(d, "k3", 2, t0 + 100, bigp, sizeof bigp),
              TW_ECONN);
    ASSERT_EQ(sched(d, 3, t0 + 100, "c"), TW_ECONN);
    ASSERT_EQ(cancel(d, 1), TW_ECONN);
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(d, &st), TW_ECONN);
    while (now_ms() < t0 + 1500)
        sleep_ms(50);
    /* Timer 2 is due but cannot be checked: not fired while Redis is
     * away (if Redis went away before its check, sent at most 5 ms before
     * its due time). */
    if (stopped < t0 + 1000 - 5)
        ASSERT_EQ(tab[2].count, 0);
    sh("TW_REDIS_START");
    int64_t end = now_ms() + 10000;
    int rc;
    while ((rc = sched(d, 4, now_ms() + 100, "d")) != 0 && now_ms() < end)
        sleep_ms(50);
    ASSERT_EQ(rc, 0);
    ASSERT(wait_all(1, 3, 8000));
    ASSERT(wait_all(4, 5, 3000));
    ASSERT_EQ(tab[3].count, 0);
    check_none_early(1, 5);
    ASSERT_EQ(tw_durable_close(d), 0);
    printf("econn: ok\n");
}

/* ------------------------------------------------------------------------ */
/* Stats: backlog counts due timers whose callback has not started (here:
 * claimed by this node while its firer is held in a callback); late_hist
 * has one entry per delivery, in the bucket of how late it started. */

static _Atomic int gate_state; /* 1: the first callback waits for 2 */

static int gate_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    int expect = 1;
    if (atomic_compare_exchange_strong(&gate_state, &expect, 3))
        while (gate_state != 2)
            sleep_ms(1);
    return on_fire(d, t, arg);
}

static uint64_t hist_sum(const tw_durable_stats *s, unsigned from)
{
    uint64_t n = 0;
    for (unsigned b = from; b < TW_LATE_BUCKETS; b++)
        n += s->late_hist[b];
    return n;
}

/* The executor_threads of the next open_gated(). */
static uint32_t gate_exec;

/* A store of its own namespace (@prefix and our pid) whose first callback
 * waits for gate_state 2. */
static tw_durable *open_gated(const char *prefix)
{
    char ns[32];
    snprintf(ns, sizeof ns, "%s%d", prefix, (int)getpid());
    tw_durable_config cfg = base_cfg(ns);
    cfg.fire = gate_fire;
    cfg.executor_threads = gate_exec;
    tw_durable *d;
    reset_tab();
    gate_state = 1;
    ASSERT_EQ(tw_durable_open(&d, &cfg), 0);
    return d;
}

static void stats_test(void)
{
    tw_durable *d = open_gated("st");
    tw_durable_stats st;
    int64_t t0 = now_ms();
    ASSERT_EQ(sched(d, 300, t0 - 5000, "late"), 0); /* held in its callback */
    while (gate_state != 3)
        sleep_ms(1);
    for (int i = 301; i < 306; i++)
        ASSERT_EQ(sched(d, i, t0 - 10, "b"), 0);
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(st.backlog, 5);
    ASSERT_EQ(hist_sum(&st, 0), 1);
    /* 5 s late: bucket 23 holds [2^22, 2^23) us. */
    ASSERT_EQ(hist_sum(&st, 23), 1);
    gate_state = 2;
    ASSERT(wait_all(300, 306, 5000));
    for (int i = 0; i < 5000; i++) {
        ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
        if (st.fired == 6 && !st.backlog)
            break;
        sleep_ms(1);
    }
    ASSERT_EQ(st.backlog, 0);
    ASSERT_EQ(st.fired, 6);
    ASSERT_EQ(hist_sum(&st, 0), 6);
    ASSERT_EQ(tw_durable_close(d), 0);
    printf("stats: ok\n");
}

/* ------------------------------------------------------------------------ */
/* Raw commands to the servers, for planting and reading data behind the
 * store's back (routed by the slot of the first key). */

static tw__rc *raw;

static redisReply *rawv(int argc, const char **argv)
{
    size_t len[16];
    ASSERT(argc <= 16);
    for (int i = 0; i < argc; i++)
        len[i] = strlen(argv[i]);
    tw__rc_cmd c = {
        argc, argv, len, argc > 1 ? tw__rc_slot(argv[1], len[1]) : -1, NULL, 0};
    ASSERT_EQ(tw__rc_exec(raw, &c, 1), 0);
    ASSERT(c.reply);
    return c.reply;
}

#define RAW(...)                                                               \
    freeReplyObject(                                                           \
        rawv(sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *),     \
             (const char *[]){__VA_ARGS__}))

/* The name of shard @s's key with suffix @c in namespace @ns. */
static const char *skey(char *b, const char *ns, int s, char c)
{
    snprintf(b, 96, "{%s:%d}:%c", ns, s, c);
    return b;
}

static bool has_field(const char *ns, int s, const char *field)
{
    char k[96];
    redisReply *r =
        rawv(3, (const char *[]){"HEXISTS", skey(k, ns, s, 'q'), field});
    bool yes = r->type == REDIS_REPLY_INTEGER && r->integer == 1;
    if (!yes)
        fprintf(stderr, "  {%s:%d}:q has no field %s\n", ns, s, field);
    freeReplyObject(r);
    return yes;
}

/* The shard of @key among @shards (as src/durable_redis_impl.h: FNV-1a). */
static int shard_of_key(const char *key, int shards)
{
    uint64_t h = 1469598103934665603ull;
    for (const unsigned char *p = (const unsigned char *)key; *p; p++)
        h = (h ^ *p) * 1099511628211ull;
    return (int)(h % (uint64_t)shards);
}

/* The namespace record {ns:meta} (issue 41): written at the first open,
 * an open with another shard count refused naming both, a read-only
 * open with shards 0 takes the recorded count, a namespace without the
 * record (made by an older version) adopted, a damaged or newer record
 * refused. */
static int open_err(const char *ns, uint32_t shards, uint32_t flags, char *err,
                    size_t len, tw_durable **out)
{
    tw_durable_config c = base_cfg(ns);
    c.shards = shards;
    c.flags = flags;
    c.errbuf = err;
    c.errbuf_len = len;
    err[0] = '\0';
    *out = NULL;
    return tw_durable_open(out, &c);
}

static void meta_expect(const char *ns, const char *text)
{
    char k[96];
    snprintf(k, sizeof k, "{%s:meta}", ns);
    redisReply *r = rawv(2, (const char *[]){"GET", k});
    ASSERT(r->type == REDIS_REPLY_STRING);
    ASSERT_STR_EQ(r->str, text);
    freeReplyObject(r);
}

static void shards_refused(const char *ns)
{
    char err[256];
    tw_durable *d;
    ASSERT_EQ(open_err(ns, 16, 0, err, sizeof err, &d), TW_EINVAL);
    ASSERT(d == NULL);
    printf("  refused: %s\n", err);
    ASSERT(strstr(err, "has 8 shards") && strstr(err, "asked for 16"));
    ASSERT_EQ(open_err(ns, 16, TW_DURABLE_READONLY, err, sizeof err, &d),
              TW_EINVAL);
    ASSERT_EQ(open_err(ns, 4, TW_DURABLE_NOFIRE, err, sizeof err, &d),
              TW_EINVAL);
    ASSERT(strstr(err, "has 8 shards") && strstr(err, "asked for 4"));
    /* Read-only with shards 0: the record's 8, every timer seen. */
    ASSERT_EQ(open_err(ns, 0, TW_DURABLE_READONLY, err, sizeof err, &d), 0);
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(st.pending, 20);
    ASSERT_EQ(tw_durable_close(d), 0);
    /* A writing open with shards 0 takes it too. */
    ASSERT_EQ(open_err(ns, 0, 0, err, sizeof err, &d), 0);
    ASSERT_EQ(tw_durable_cancel(d, "k5", 2), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

static void shards_test(void)
{
    char ns[32], k[96], err[256];
    snprintf(ns, sizeof ns, "sh%d", (int)getpid());
    snprintf(k, sizeof k, "{%s:meta}", ns);
    ASSERT_EQ(tw__rc_open(&raw, &(tw__rc_opts){.addr = seeds}), 0);
    tw_durable *d;
    ASSERT_EQ(open_err(ns, 8, 0, err, sizeof err, &d), 0);
    for (int i = 0; i < 20; i++)
        ASSERT_EQ(sched(d, i, now_ms() + 1000000, "x"), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    meta_expect(ns, "twheel-redis format 1 shards 8");
    shards_refused(ns);
    /* A namespace of an older version (no record): adopted. */
    RAW("DEL", k);
    ASSERT_EQ(open_err(ns, 8, 0, err, sizeof err, &d), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    meta_expect(ns, "twheel-redis format 1 shards 8");
    /* A read-only open writes nothing. */
    RAW("DEL", k);
    ASSERT_EQ(open_err(ns, 8, TW_DURABLE_READONLY, err, sizeof err, &d), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    redisReply *r = rawv(2, (const char *[]){"EXISTS", k});
    ASSERT_EQ(r->integer, 0);
    freeReplyObject(r);
    RAW("SET", k, "garbage");
    ASSERT_EQ(open_err(ns, 8, 0, err, sizeof err, &d), TW_EINVAL);
    ASSERT(strstr(err, "damaged") && strstr(err, k));
    RAW("SET", k, "twheel-redis format 2 shards 8");
    ASSERT_EQ(open_err(ns, 8, 0, err, sizeof err, &d), TW_EINVAL);
    ASSERT(strstr(err, "format 2 is newer"));
    RAW("DEL", k);
    RAW("HSET", k, "f", "v");
    ASSERT_EQ(open_err(ns, 8, 0, err, sizeof err, &d), TW_EIO);
    ASSERT(strstr(err, "WRONGTYPE"));
    tw__rc_close(raw);
    raw = NULL;
}

/* Conditional writes (SCHED_IF, CANCEL with expected bytes) on damaged
 * shards: keys of the wrong type are set aside and the write goes on; a
 * pending key whose value cannot be read is stale for a non-empty expect,
 * and matches an empty one. */
static void garbage_cas(void)
{
    char ns[32], k[96];
    snprintf(ns, sizeof ns, "gc%d", (int)getpid());
    int sa = shard_of_key("ca", 4), sb = shard_of_key("cb", 4);
    RAW("SET", skey(k, ns, sa, 'd'), "not a zset");
    RAW("SET", skey(k, ns, sa, 'p'), "not a hash");
    RAW("HSET", skey(k, ns, sb, 'p'), "cb", "zzz");
    /* Far off: never claimed during the test. */
    RAW("ZADD", skey(k, ns, sb, 'd'), "4102444800000", "cb");
    tw_durable_config cfg = base_cfg(ns);
    cfg.shards = 4;
    tw_durable *d;
    ASSERT_EQ(tw_durable_open(&d, &cfg), 0);
    int64_t far = now_ms() + 1000000;
    ASSERT_EQ(tw_durable_schedule_if(d, "ca", 2, NULL, 0, far, "t1", 2), 0);
    ASSERT(has_field(ns, sa, "k:d"));
    ASSERT(has_field(ns, sa, "k:p"));
    ASSERT_EQ(tw_durable_schedule_if(d, "ca", 2, "t0", 2, far, "t2", 2),
              TW_ESTALE);
    ASSERT_EQ(tw_durable_schedule_if(d, "ca", 2, "t1", 2, far, "t2", 2), 0);
    ASSERT_EQ(tw_durable_cancel_if(d, "ca", 2, "t2", 2), 0);
    ASSERT_EQ(tw_durable_schedule_if(d, "cb", 2, "z", 1, far, "t1", 2),
              TW_ESTALE);
    ASSERT_EQ(tw_durable_cancel_if(d, "cb", 2, "z", 1), TW_ESTALE);
    ASSERT_EQ(tw_durable_schedule_if(d, "cb", 2, "", 0, far, "t1", 2), 0);
    ASSERT_EQ(tw_durable_cancel_if(d, "cb", 2, "t1", 2), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* Scores no script writes (issue 41): -inf, +inf, -1e300, 1e300 and one
 * just below -2^53, each on a key whose value is sound and due now: each
 * set aside (s:<key>, counted in stats.quarantined) and its timer
 * delivered, as are the sound timers beside them. */
static void garbage_scores(void)
{
    static const char *const sc[] = {"-inf", "+inf", "-1e300", "1e300",
                                     "-9007199254740994"};
    char ns[32], k[96], key[16], val[64], f[32];
    snprintf(ns, sizeof ns, "gs%d", (int)getpid());
    reset_tab();
    int64_t t0 = now_ms();
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof key, "k%d", 100 + i);
        snprintf(val, sizeof val, "%lld,1,bad", (long long)t0);
        int s = shard_of_key(key, 4);
        RAW("HSET", skey(k, ns, s, 'p'), key, val);
        RAW("ZADD", skey(k, ns, s, 'd'), sc[i], key);
    }
    tw_durable_config cfg = base_cfg(ns);
    cfg.shards = 4;
    tw_durable *d;
    ASSERT_EQ(tw_durable_open(&d, &cfg), 0);
    for (int i = 0; i < 20; i++)
        ASSERT_EQ(sched(d, i, t0 + 100 + 10 * i, "ok"), 0);
    ASSERT(wait_all(0, 20, 10000));
    ASSERT(wait_all(100, 105, 10000));
    for (int i = 0; i < 5; i++) {
        snprintf(key, sizeof key, "k%d", 100 + i);
        snprintf(f, sizeof f, "s:%s", key);
        ASSERT(has_field(ns, shard_of_key(key, 4), f));
        ASSERT_EQ(tab[100 + i].last_attempt, 2); /* a claim that ran out */
    }
    settle(d);
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(st.quarantined, 5);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* Records in a shard their key does not hash to (a copy made by an
 * operator or a bug; issue 41): k200 copied into the next shard and its
 * real timer then cancelled, k201 copied beside its real timer. Each copy
 * is set aside when a claim takes it (w:<key> in that shard's :q,
 * counted in stats.quarantined and told to cfg.on_error), never
 * delivered; the real k201 is delivered once. Before, the copy of k200
 * was delivered after its cancel and k201 twice. */
static _Atomic int wrong_told;
static void wrong_err(void *arg, int code, const char *msg)
{
    (void)arg;
    if (code == TW_EIO && strstr(msg, "does not hash to"))
        wrong_told++;
}

static void garbage_wrong_shard(void)
{
    char ns[32], k[96], key[16], val[64], f[32];
    snprintf(ns, sizeof ns, "gw%d", (int)getpid());
    reset_tab();
    tw_durable_config cfg = base_cfg(ns);
    cfg.shards = 4;
    cfg.on_error = wrong_err;
    tw_durable *d;
    ASSERT_EQ(tw_durable_open(&d, &cfg), 0);
    int64_t t0 = now_ms();
    for (int i = 0; i < 2; i++) {
        ASSERT_EQ(sched(d, 200 + i, t0 + 3600 * 1000, "real"), 0);
        snprintf(key, sizeof key, "k%d", 200 + i);
        int w = (shard_of_key(key, 4) + 1) % 4;
        snprintf(val, sizeof val, "%lld,1,copy", (long long)(t0 + 500));
        RAW("HSET", skey(k, ns, w, 'p'), key, val);
        snprintf(val, sizeof val, "%lld", (long long)(t0 + 500));
        RAW("ZADD", skey(k, ns, w, 'd'), val, key);
    }
    ASSERT_EQ(tw_durable_cancel(d, "k200", 4), 0);
    ASSERT_EQ(sched(d, 201, t0 + 500, "real"), 0);
    ASSERT(wait_all(201, 202, 10000));
    for (int i = 0; i < 2; i++) {
        snprintf(key, sizeof key, "k%d", 200 + i);
        snprintf(f, sizeof f, "w:%s", key);
        int w = (shard_of_key(key, 4) + 1) % 4;
        for (int t = 0; t < 20 && !has_field(ns, w, f); t++)
            sleep_ms(100);
        ASSERT(has_field(ns, w, f));
    }
    settle(d);
    ASSERT_EQ(tab[200].count, 0);
    ASSERT_EQ(tab[201].count, 1);
    ASSERT_STR_EQ(tab[201].payload, "real");
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(st.quarantined, 2);
    ASSERT_EQ(st.pending, 0);
    ASSERT(wrong_told >= 1);
    ASSERT_EQ(tw_durable_close(d), 0);
}

/* Shard 0: bad values (they go to quarantine as p:<key>). */
static const char *const badv[][2] = {{"bad", "garbage"},
                                      {"nodig", "abc,1,x"},
                                      {"huge", "99999999999999999999,1,x"},
                                      {"max+1", "9223372036854775808,1,x"},
                                      {"negatt", "5,-1,x"},
                                      {"bigatt", "5,4294967296,x"},
                                      {"nocomma", "5,1"},
                                      {"empty", ""}};

/* The garbage of garbage() into namespace @ns (4 shards); the shard of
 * its bad dead letter. */
static int garbage_plant(const char *ns)
{
    char k[96], due[32], v[64];
    int64_t t0 = now_ms();
    snprintf(due, sizeof due, "%lld", (long long)t0);
    /* Shard 0: bad values; a fractional score and a lease that ran out,
     * both with good values, must still fire (k905 and k901 hash to
     * shard 0, k902 to 1, k904 to 3: a key in another shard is a copy,
     * set aside, garbage_wrong_shard()). */
    for (size_t i = 0; i < sizeof badv / sizeof badv[0]; i++) {
        RAW("HSET", skey(k, ns, 0, 'p'), badv[i][0], badv[i][1]);
        RAW("ZADD", skey(k, ns, 0, 'd'), due, badv[i][0]);
    }
    RAW("ZADD", skey(k, ns, 0, 'd'), due, "novalue");
    RAW("HSET", skey(k, ns, 0, 'p'), "lease", "junk");
    RAW("ZADD", skey(k, ns, 0, 'd'), "-1024", "lease");
    RAW("ZADD", skey(k, ns, 0, 'd'), "-2048", "lease2");
    RAW("SET", skey(k, ns, 0, 's'), "junk");
    RAW("SET", skey(k, ns, 0, 'v'), "1e300");
    snprintf(v, sizeof v, "%lld,1,frac", (long long)t0);
    RAW("HSET", skey(k, ns, 0, 'p'), "k905", v);
    snprintf(v, sizeof v, "%lld.5", (long long)t0);
    RAW("ZADD", skey(k, ns, 0, 'd'), v, "k905");
    snprintf(v, sizeof v, "%lld,1,lease", (long long)t0);
    RAW("HSET", skey(k, ns, 0, 'p'), "k901", v);
    RAW("ZADD", skey(k, ns, 0, 'd'), "-1024", "k901");
    /* Shard 1: :p, :q and :x (dead letters) are strings; a timer of :d
     * lost its value. */
    RAW("SET", skey(k, ns, 1, 'p'), "not a hash");
    RAW("SET", skey(k, ns, 1, 'x'), "not a zset");
    RAW("SET", skey(k, ns, 1, 'q'), "not a hash either");
    RAW("ZADD", skey(k, ns, 1, 'd'), due, "k902");
    /* Shard 2: :d is a string, :s a hash. */
    RAW("SET", skey(k, ns, 2, 'd'), "not a zset");
    RAW("HSET", skey(k, ns, 2, 's'), "a", "b");
    /* Shard 3: :v a hash, :s a list; a score no script writes (+inf:
     * set aside, and its timer delivered as a claim that ran out). */
    RAW("HSET", skey(k, ns, 3, 'v'), "a", "b");
    RAW("LPUSH", skey(k, ns, 3, 's'), "x");
    RAW("HSET", skey(k, ns, 3, 'p'), "k904", "1,1,x");
    RAW("ZADD", skey(k, ns, 3, 'd'), "+inf", "k904");

    /* A dead letter whose value is not "due,attempt,payload". */
    int ds = shard_of_key("kdead", 4);
    RAW("ZADD", skey(k, ns, ds, 'x'), "0", "kdead");
    RAW("HSET", skey(k, ns, ds, 'p'), "kdead", "zzz");

    return ds;
}

/* What garbage() must find set aside: every field, and their count in
 * the stats. Returns how many there are. */
static long long garbage_fields(const char *ns, int ds)
{
    char k[96];
    ASSERT(has_field(ns, ds, "p:kdead"));
    char f[64];
    for (size_t i = 0; i < sizeof badv / sizeof badv[0]; i++) {
        snprintf(f, sizeof f, "p:%s", badv[i][0]);
        ASSERT(has_field(ns, 0, f));
    }
    static const struct {
        int shard;
        const char *field;
    } set_aside[] = {{0, "d:novalue"}, {0, "p:lease"}, {0, "d:lease2"},
                     {0, "k:s"},       {0, "k:v"},     {1, "k:p"},
                     {1, "k:q"},       {1, "k:x"},     {1, "d:k902"},
                     {2, "k:d"},       {2, "k:s"},     {3, "k:v"},
                     {3, "k:s"},       {3, "s:k904"}};
    for (size_t i = 0; i < sizeof set_aside / sizeof set_aside[0]; i++)
        ASSERT(has_field(ns, set_aside[i].shard, set_aside[i].field));
    long long total = 0;
    for (int s = 0; s < 4; s++) {
        redisReply *r = rawv(2, (const char *[]){"HLEN", skey(k, ns, s, 'q')});
        ASSERT_EQ(r->type, REDIS_REPLY_INTEGER);
        total += r->integer;
        freeReplyObject(r);
    }
    /* The fields above, per shard, and p:kdead. */
    ASSERT_EQ(total, 14 + 4 + 2 + 2 + 1);
    return total;
}

/* The planted timers with sound values fired (until @end at most): the
 * fractional score, the lease that ran out, the +inf score; not the one
 * without a value. */
static void garbage_planted_fired(int64_t end)
{
    while ((tab[905].count < 2 || tab[901].count < 1 || tab[904].count < 1) &&
           now_ms() < end)
        sleep_ms(10);
    ASSERT_EQ(tab[905].count, 2);
    ASSERT(!strcmp(tab[905].payload, "frac"));
    ASSERT_EQ(tab[901].count, 1);
    ASSERT_EQ(tab[901].last_attempt, 2);
    ASSERT(!strcmp(tab[6].payload, "new"));
    ASSERT_EQ(tab[902].count, 0);
    ASSERT_EQ(tab[904].count, 1);
    ASSERT_EQ(tab[904].last_attempt, 2);
    check_none_early(0, 40);
}

/* Garbage in every key of every shard (values that are not
 * "due,attempt,payload", due times and attempts out of range, a member of
 * :d without a value, leases that ran out with no or a bad value, :s and
 * :v that are not numbers, and keys of the wrong type: a string, a hash or
 * a list where another type is expected, the quarantine hash itself a
 * string, the dead letters' sorted set a string, a dead letter with a bad
 * value): every normal timer scheduled after it fires (each twice: a
 * retry runs DONE over the same shards), a cancel and a replace work, the
 * damage is set aside into :q and counted in the stats. */
static void garbage(void)
{
    char ns[32];
    snprintf(ns, sizeof ns, "gb%d", (int)getpid());
    ASSERT_EQ(tw__rc_open(&raw, &(tw__rc_opts){.addr = seeds}), 0);
    reset_tab();
    int ds = garbage_plant(ns);
    tw_durable_config cfg = base_cfg(ns);
    cfg.shards = 4;
    tw_durable *d;
    ASSERT_EQ(tw_durable_open(&d, &cfg), 0);
    retry_first = 100;
    /* Beyond the horizon (300 ms): claimed by CLAIM, which reads the
     * garbage; 40 keys fall into every one of the 4 shards. */
    int64_t t0 = now_ms();
    for (int i = 0; i < 40; i++)
        ASSERT_EQ(sched(d, i, t0 + 500 + 10 * i, "n"), 0);
    ASSERT_EQ(cancel(d, 5), 0);
    ASSERT_EQ(sched(d, 6, t0 + 600, "new"), 0);
    int64_t end = now_ms() + 15000;
    for (int i = 0; i < 40; i++) {
        uint32_t want = i == 5 ? 0 : 2;
        while (tab[i].count < want && now_ms() < end)
            sleep_ms(10);
        if (tab[i].count != want)
            fprintf(stderr, "  k%d delivered %u times\n", i,
                    (unsigned)tab[i].count);
        ASSERT_EQ(tab[i].count, want);
    }
    garbage_planted_fired(end);
    /* The bad dead letter: re-arming it sets its value aside (TW_EIO),
     * and it is neither dead nor pending any more. */
    tw_durable_info in;
    ASSERT_EQ(tw_durable_rearm(d, "kdead", 5, now_ms()), TW_EIO);
    ASSERT_EQ(tw_durable_get(d, "kdead", 5, &in, NULL, 0), TW_ENOENT);
    ASSERT_EQ(tw_durable_rearm(d, "kdead", 5, now_ms()), TW_ENOENT);
    tw_durable_cursor dc = TW_DURABLE_CURSOR_INIT;
    tw_durable_entry de[4];
    char dkb[TW_DURABLE_KEY_MAX];
    ASSERT_EQ(tw_durable_list_dead(d, &dc, de, 4, dkb, sizeof dkb), 0);
    ASSERT_EQ(dc.done, 1);

    long long total = garbage_fields(ns, ds);
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(st.quarantined, (uint64_t)total);
    /* The old-sized struct gets no quarantined field (and no overflow). */
    ASSERT_EQ(tw_durable_stats_get_sized(
                  d, &st, offsetof(tw_durable_stats, quarantined)),
              0);
    ASSERT_EQ(tw_durable_close(d), 0);
    retry_first = 0;
    garbage_cas();
    garbage_scores();
    garbage_wrong_shard();
    tw__rc_close(raw);
    printf("garbage: ok\n");
}

/* ------------------------------------------------------------------------ */
/* A stalled master (SIGSTOP) in a 3-master cluster. Keys A0..A3 (healthy
 * masters) and B0 (the stalled master) are due at +400 ms, the master of
 * B is stopped at +300 ms and the A keys are cancelled at +500 ms. A
 * cancelled key must never be delivered after its cancel returned (a check
 * answer is trusted for CHECK_MAX_AGE_MS at most), and the H keys (healthy
 * masters, due at +600 .. +1500 ms while the master is stopped) must be
 * delivered on time: within STALL_LATE_MS of their due time (generous for
 * a loaded 2-core machine: on an idle one they start 0-5 ms late; a round
 * that waited for the stopped master would make them 1-2.5 s late). The
 * B keys (due +400 .. +1200 ms) are delivered after SIGCONT. */

#define STALL_MS 2500
#define STALL_LATE_MS 800

/* The port of the master of @slot, from CLUSTER SLOTS. */
static long long master_port(int slot)
{
    redisReply *r = rawv(2, (const char *[]){"CLUSTER", "SLOTS"});
    long long port = -1;
    ASSERT_EQ(r->type, REDIS_REPLY_ARRAY);
    for (size_t i = 0; i < r->elements; i++) {
        redisReply *e = r->element[i];
        if (e->elements >= 3 && e->element[0]->integer <= slot &&
            slot <= e->element[1]->integer)
            port = e->element[2]->element[1]->integer;
    }
    freeReplyObject(r);
    ASSERT(port > 0);
    return port;
}

static uint32_t fnv_shard(const char *k, uint32_t shards)
{
    uint64_t h = 1469598103934665603ull;
    for (; *k; k++)
        h = (h ^ (unsigned char)*k) * 1099511628211ull;
    return (uint32_t)(h % shards);
}

/* The master port of key k<id>'s shard in namespace @ns. */
static long long port_of_key(const char *ns, int id, uint32_t shards)
{
    char k[32], sk[96];
    snprintf(k, sizeof k, "k%d", id);
    skey(sk, ns, (int)fnv_shard(k, shards), 'd');
    return master_port(tw__rc_slot(sk, strlen(sk)));
}

/* Calls for healthy masters while another thread's call waits for the
 * stopped one: each under STALL_CALL_MS (issue 41; with one combiner for
 * every master they waited for the stalled master's round, 1.2 s and
 * more). */
#define STALL_CALL_MS 100
struct stall_caller {
    tw_durable *d;
    const int *ids; /* 5 keys on the stopped master */
    atomic_bool stop;
    atomic_int calls;
};

static void *stall_caller_main(void *arg)
{
    struct stall_caller *c = arg;
    for (int i = 0; !atomic_load(&c->stop); i++) {
        atomic_fetch_add(&c->calls, 1);
        sched(c->d, c->ids[i % 5], now_ms() + 3600 * 1000, "x");
    }
    return NULL;
}

/* The other thread's state: it outlives stall_calls(), joined after
 * SIGCONT (its call returns then, or with TW_ECONN). */
static struct stall_caller stall_c;
static pthread_t stall_th;

static void stall_calls(tw_durable *d, const int *bx, const int *hx)
{
    struct stall_caller *c = &stall_c;
    c->d = d;
    c->ids = bx;
    ASSERT_EQ(pthread_create(&stall_th, NULL, stall_caller_main, c), 0);
    sleep_ms(100); /* its first call now waits for the stopped master */
    int64_t worst = 0, far = now_ms() + 3600 * 1000;
    for (int i = 0; i < 10; i++) {
        int64_t t = now_us();
        ASSERT_EQ(sched(d, hx[i], far, "h2"), 0);
        int64_t ts = now_us() - t;
        t = now_us();
        ASSERT_EQ(cancel(d, hx[i]), 0);
        int64_t tc = now_us() - t;
        worst = ts > worst ? ts : worst;
        worst = tc > worst ? tc : worst;
        if (worst >= STALL_CALL_MS * 1000)
            fprintf(stderr, "  call %d: schedule %lld us, cancel %lld us\n", i,
                    (long long)ts, (long long)tc);
        ASSERT_LT(worst, STALL_CALL_MS * 1000);
        sleep_ms(30);
    }
    fprintf(stderr,
            "  healthy masters' schedules and cancels during the stop: "
            "slowest %lld us (%d calls to the stopped one begun)\n",
            (long long)worst, atomic_load(&c->calls));
    ASSERT(atomic_load(&c->calls) >= 1);
    ASSERT_LT(worst, STALL_CALL_MS * 1000);
    atomic_store(&c->stop, true);
}

/* The stall test's keys: B on the stopped master (due during the stop),
 * A and H on the others; bx and hx, never due, for stall_calls(). */
struct stall_keys {
    int a[4], b[3], h[10], bx[5], hx[10];
};

static void stall_pick(const char *ns, uint32_t shards, long long bport,
                       struct stall_keys *k)
{
    int na = 0, nb = 0, nh = 0, nbx = 0, nhx = 0;
    for (int id = 1; na < 4 || nb < 3 || nh < 10; id++) {
        ASSERT(id < 10000);
        bool onb = port_of_key(ns, id, shards) == bport;
        if (onb && nb < 3)
            k->b[nb++] = id;
        else if (!onb && na < 4)
            k->a[na++] = id;
        else if (!onb && nh < 10)
            k->h[nh++] = id;
    }
    for (int id = 10000; nbx < 5 || nhx < 10; id++) {
        ASSERT(id < 20000);
        bool onb = port_of_key(ns, id, shards) == bport;
        if (onb && nbx < 5)
            k->bx[nbx++] = id;
        else if (!onb && nhx < 10)
            k->hx[nhx++] = id;
    }
}

/* After SIGCONT: the B keys delivered, no A key after its cancel
 * returned, the H keys on time. */
static void stall_check(const struct stall_keys *k, int64_t t0,
                        const int64_t *cancelled_us)
{
    int64_t end = now_ms() + 20000;
    while (now_ms() < end) {
        int i = 0;
        while (i < 3 && tab[k->b[i]].count)
            i++;
        if (i == 3)
            break;
        sleep_ms(10);
    }
    sleep_ms(500);
    for (int i = 0; i < 4; i++) {
        struct rec *r = &tab[k->a[i]];
        fprintf(stderr,
                "  A k%d: %u deliveries, first %+lld ms from due, "
                "cancel returned %+lld ms\n",
                k->a[i], (unsigned)r->count,
                r->count ? (long long)(r->first_us / 1000 - (t0 + 400)) : 0,
                (long long)(cancelled_us[i] / 1000 - (t0 + 400)));
        ASSERT(r->count <= 1);
        if (r->count)
            ASSERT(r->first_us < cancelled_us[i]);
    }
    for (int i = 0; i < 10; i++) {
        struct rec *r = &tab[k->h[i]];
        long long late = r->count ? r->first_us / 1000 - r->due : -1;
        fprintf(stderr, "  H k%d: %u deliveries, %lld ms late\n", k->h[i],
                (unsigned)r->count, late);
        ASSERT_EQ(r->count, 1);
        ASSERT(late < STALL_LATE_MS);
    }
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(tab[k->b[i]].count, 1);
    check_none_early(0, 10000);
}

static void stall(void)
{
    char ns[32], sk[96];
    snprintf(ns, sizeof ns, "stall%d", (int)getpid());
    ASSERT_EQ(tw__rc_open(&raw, &(tw__rc_opts){.addr = seeds}), 0);
    tw_durable_config cfg = base_cfg(ns);
    cfg.shards = 16;
    cfg.horizon_ms = 2000; /* everything below is claimed when scheduled */
    cfg.lease_ms = 10000;  /* no lease runs out during the stall */
    /* Pick the keys: B on the master of shard 0's slot, A and H elsewhere. */
    int bslot = tw__rc_slot(skey(sk, ns, 0, 'd'), strlen(sk));
    long long bport = master_port(bslot);
    struct stall_keys k;
    stall_pick(ns, cfg.shards, bport, &k);
    pid_t bpid = slot_pid(raw, bslot);
    reset_tab();
    tw_durable *d;
    ASSERT_EQ(tw_durable_open(&d, &cfg), 0);
    int64_t t0 = now_ms();
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(sched(d, k.a[i], t0 + 400, "a"), 0);
    for (int i = 0; i < 3; i++)
        ASSERT_EQ(sched(d, k.b[i], t0 + 400 + 400 * i, "b"), 0);
    for (int i = 0; i < 10; i++)
        ASSERT_EQ(sched(d, k.h[i], t0 + 600 + 100 * i, "h"), 0);
    while (now_ms() < t0 + 300)
        sleep_ms(1);
    fprintf(stderr, "  SIGSTOP master :%lld (pid %d) at +%lld ms\n", bport,
            (int)bpid, (long long)(now_ms() - t0));
    ASSERT_EQ(kill(bpid, SIGSTOP), 0);
    while (now_ms() < t0 + 500)
        sleep_ms(1);
    int64_t cancelled_us[4];
    for (int i = 0; i < 4; i++) {
        int rc = cancel(d, k.a[i]);
        cancelled_us[i] = now_us();
        /* 0, or TW_ENOENT if its delivery was already completed. */
        ASSERT(rc == 0 || rc == TW_ENOENT);
    }
    stall_calls(d, k.bx, k.hx);
    while (now_ms() < t0 + 300 + STALL_MS)
        sleep_ms(5);
    ASSERT_EQ(kill(bpid, SIGCONT), 0);
    pthread_join(stall_th, NULL);
    fprintf(stderr, "  SIGCONT at +%lld ms\n", (long long)(now_ms() - t0));
    stall_check(&k, t0, cancelled_us);
    ASSERT_EQ(tw_durable_close(d), 0);
    tw__rc_close(raw);
    printf("stall: ok\n");
}

/* ------------------------------------------------------------------------ */
/* A check's answer has a bounded age (CHECK_MAX_AGE_MS, 200 ms, in
 * src/redis_fire.c). Six keys due at once are checked in one round;
 * the first callback blocks; meanwhile all six are cancelled (0), and the
 * callback is held 600 ms more. The five whose callbacks had not started
 * must never start: their answers are too old by then, so they are
 * checked again and found cancelled. With @nexec executor threads (1:
 * the five wait in the executor's queue behind the first), the age is
 * judged when a callback is about to start on its executor thread. */
static void age_test(const char *prefix, uint32_t nexec)
{
    gate_exec = nexec;
    tw_durable *d = open_gated(prefix);
    int64_t t0 = now_ms();
    for (int i = 600; i < 606; i++) /* within the horizon: claimed now */
        ASSERT_EQ(sched(d, i, t0 + 200, "v"), 0);
    for (int i = 0; i < 5000 && gate_state != 3; i++)
        sleep_ms(1);
    ASSERT_EQ(gate_state, 3);
    for (int i = 600; i < 606; i++)
        ASSERT_EQ(cancel(d, i), 0);
    sleep_ms(600);
    gate_state = 2;
    sleep_ms(1000);
    uint64_t n = 0;
    for (int i = 600; i < 606; i++)
        n += tab[i].count;
    ASSERT_EQ(n, 1); /* the one whose callback was running */
    ASSERT_EQ(tw_durable_close(d), 0);
    gate_exec = 0;
    printf("age (executor_threads %u): ok\n", (unsigned)nexec);
}

/* ------------------------------------------------------------------------ */
/* tw_durable_schedule_many: many items per shard (more than one SCHED call
 * each), due within and beyond the horizon, keys given twice in a batch,
 * and (one server) a dead server failing every item with TW_ECONN. */

#define MANY_N 10000

static void many_item(tw_durable_item *it, char (*k)[16], char (*p)[16], int id,
                      int64_t due, const char *payload)
{
    int n = snprintf(*k, sizeof *k, "k%d", id);
    snprintf(*p, sizeof *p, "%s", payload);
    *it = (tw_durable_item){*k, (size_t)n, due, *p, strlen(*p), 12345};
}

static void many_replaced(tw_durable *d, int64_t t0)
{
    /* Three keys twice each: far then near, near then far, near twice. */
    tw_durable_item it[6];
    char k[6][16], p[6][16];
    many_item(&it[0], &k[0], &p[0], MANY_N + 0, t0 + 5000, "old");
    many_item(&it[1], &k[1], &p[1], MANY_N + 1, t0 + 50, "old");
    many_item(&it[2], &k[2], &p[2], MANY_N + 2, t0 + 60, "old");
    many_item(&it[3], &k[3], &p[3], MANY_N + 0, t0 + 100, "new");
    many_item(&it[4], &k[4], &p[4], MANY_N + 1, t0 + 900, "new");
    many_item(&it[5], &k[5], &p[5], MANY_N + 2, t0 + 150, "new");
    ASSERT_EQ(tw_durable_schedule_many(d, it, 6), 0);
    for (int i = 0; i < 6; i++)
        ASSERT_EQ(it[i].result, 0);
}

static void many_dead(tw_durable *d)
{
    tw_durable_item it[5];
    char k[5][16], p[5][16];
    sh("TW_REDIS_STOP");
    for (int i = 0; i < 5; i++)
        many_item(&it[i], &k[i], &p[i], MANY_N + 10 + i, now_ms() + 100 * i,
                  "x");
    ASSERT_EQ(tw_durable_schedule_many(d, it, 5), TW_ECONN);
    for (int i = 0; i < 5; i++)
        ASSERT_EQ(it[i].result, TW_ECONN);
    sh("TW_REDIS_START");
}

/* The claim checks of timers due together in several shards, some of
 * them replaced after the claim: a replaced timer's old claim is dropped
 * (its shard's version moved), and every timer fires once, with its last
 * payload. */
static void many_checks(void)
{
    enum { N = 64, BASE = 3 * MANY_N };
    char ns[32];
    snprintf(ns, sizeof ns, "chk%d", (int)getpid());
    tw_durable_config cfg = base_cfg(ns);
    cfg.horizon_ms = 5000; /* the replace comes long before the due time */
    reset_tab();
    tw_durable *d;
    ASSERT_EQ(tw_durable_open(&d, &cfg), 0);
    tw_durable_item it[N];
    char k[N][16], p[N][16];
    int64_t due = now_ms() + 1500; /* in the horizon: claimed at once */
    for (int i = 0; i < N; i++)
        many_item(&it[i], &k[i], &p[i], BASE + i, due, "old");
    ASSERT_EQ(tw_durable_schedule_many(d, it, N), 0);
    for (int i = 0; i < 4; i++)
        many_item(&it[i], &k[i], &p[i], BASE + i, due, "new");
    ASSERT_EQ(tw_durable_schedule_many(d, it, 4), 0);
    ASSERT(wait_all(BASE, BASE + N, 20000));
    settle(d); /* an old version can no longer be delivered */
    for (int i = 0; i < N; i++) {
        ASSERT_EQ(tab[BASE + i].count, 1);
        ASSERT_STR_EQ(tab[BASE + i].payload, i < 4 ? "new" : "old");
    }
    check_none_early(BASE, BASE + N);
    ASSERT_EQ(tw_durable_close(d), 0);
}

static void many(void)
{
    many_checks();
    char ns[32];
    snprintf(ns, sizeof ns, "many%d", (int)getpid());
    tw_durable_config cfg = base_cfg(ns);
    tw_durable *d;
    reset_tab();
    ASSERT_EQ(tw_durable_open(&d, &cfg), 0);
    tw_durable_item *it = calloc(MANY_N, sizeof *it);
    char(*k)[16] = calloc(MANY_N, sizeof *k), (*p)[16] = calloc(MANY_N, 16);
    ASSERT(it && k && p);
    int64_t t0 = now_ms();
    for (int i = 0; i < MANY_N; i++) /* half within the 300 ms horizon */
        many_item(&it[i], &k[i], &p[i], i, t0 + 100 + (i % 2) * 600 + i % 97,
                  "p");
    ASSERT_EQ(tw_durable_schedule_many(d, it, MANY_N), 0);
    for (int i = 0; i < MANY_N; i++)
        ASSERT_EQ(it[i].result, 0);
    many_replaced(d, t0);
    ASSERT(wait_all(0, MANY_N + 3, 20000));
    settle(d); /* nor a second delivery of an old version */
    for (int i = 0; i < MANY_N + 3; i++) {
        ASSERT_EQ(tab[i].count, 1);
        ASSERT_STR_EQ(tab[i].payload, i < MANY_N ? "p" : "new");
    }
    ASSERT_EQ(tab[MANY_N + 1].due, t0 + 900);
    check_none_early(0, MANY_N + 3);
    if (getenv("TW_REDIS_STOP"))
        many_dead(d);
    ASSERT_EQ(tw_durable_close(d), 0);
    free(it);
    free(k);
    free(p);
    printf("many: ok\n");
}

/* Schedule from a thread until told to stop; remember what was
 * acknowledged. */
struct flow {
    tw_durable *d;
    int lo, next, hi;
    int64_t spread_ms;
    _Atomic bool stop;
    uint8_t *acked;
    int errors;
};

static void *flow_main(void *arg)
{
    struct flow *f = arg;
    while (!f->stop && f->next < f->hi) {
        int id = f->next++;
        int rc = sched(f->d, id, now_ms() + 300 + (id % 7) * f->spread_ms, "f");
        if (rc == 0)
            f->acked[id] = 1;
        else
            f->errors++;
        if (id % 10 == 0)
            sleep_ms(1);
    }
    return NULL;
}

static void check_acked(struct flow *f, int ms)
{
    int64_t end = now_ms() + ms;
    int missing;
    do {
        missing = 0;
        for (int i = f->lo; i < f->next; i++)
            if (f->acked[i] && !tab[i].count)
                missing++;
        if (missing)
            sleep_ms(50);
    } while (missing && now_ms() < end);
    int acked = 0, dup = 0;
    for (int i = f->lo; i < f->next; i++) {
        acked += f->acked[i];
        dup += tab[i].count > 1;
    }
    printf("  acked %d, errors %d, missing %d, delivered twice %d\n", acked,
           f->errors, missing, dup);
    ASSERT_EQ(missing, 0);
    /* The run did exercise the flow (a sanitizer build on a loaded 2-core
     * machine acknowledges a few hundred in its 3 s). */
    ASSERT(acked >= 100);
    check_none_early(f->lo, f->next);
}

/* kill -9 / failover / reshard while timers flow. */
static void flow_test(const char *mode)
{
    bool failover = !strcmp(mode, "failover");
    tw_durable_config cfg = base_cfg(mode);
    cfg.shards = 64;
    cfg.horizon_ms = 500;
    cfg.lease_ms = 3000;
    if (failover)
        cfg.wait_replicas = 1;
    reset_tab();
    tw_durable *d;
    ASSERT_EQ(tw_durable_open(&d, &cfg), 0);
    static uint8_t acked[MAXK];
    memset(acked, 0, sizeof acked);
    struct flow f = {d, 0, 0, 20000, 400, false, acked, 0};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, flow_main, &f), 0);
    sleep_ms(1000);
    if (!strcmp(mode, "reshard")) {
        sh("TW_REDIS_RESHARD");
        sleep_ms(500);
    } else {
        sh("TW_REDIS_KILL");
        sleep_ms(failover ? 3000 : 300);
        if (!failover)
            sh("TW_REDIS_START");
        sleep_ms(1500);
    }
    f.stop = true;
    pthread_join(th, NULL);
    check_acked(&f, 20000);
    tw__rc_stats rs;
    tw__durable_redis_client_stats(d, &rs);
    printf("  client: %llu round trips for %llu commands, MOVED %llu, ASK "
           "%llu, map refreshes %llu, reconnects %llu\n",
           (unsigned long long)rs.batches, (unsigned long long)rs.commands,
           (unsigned long long)rs.moved, (unsigned long long)rs.ask,
           (unsigned long long)rs.refreshes, (unsigned long long)rs.reconnects);
    if (!strcmp(mode, "reshard"))
        ASSERT(rs.moved + rs.ask > 0); /* the migration was seen */
    else if (failover)
        ASSERT(rs.refreshes > 1); /* the promoted replica was found */
    else
        ASSERT(rs.reconnects > 0); /* the restarted server was */
    ASSERT_EQ(tw_durable_close(d), 0);
    printf("%s: ok\n", mode);
}

/* ------------------------------------------------------------------------ */
/* Several node processes sharing one namespace. */

struct drec {
    uint32_t id, attempt;
    int64_t due_ms, fired_us;
};
static int out_fd = -1;

static int node_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    struct drec r = {(uint32_t)key_id(t), t->attempt, t->due_ms, now_us()};
    ASSERT_EQ(write(out_fd, &r, sizeof r), (ssize_t)sizeof r);
    return 0;
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

struct loader {
    tw_durable *d;
    int lo, hi;
    int64_t start;
    int spread, th;
};

/* Two threads of 16 schedule one call per timer, the others 500 per
 * tw_durable_schedule_many. */
static void *load_main(void *arg)
{
    struct loader *l = arg;
    if (l->th % 8 == 1) {
        for (int i = l->lo; i < l->hi; i++)
            ASSERT_EQ(sched(l->d, i, l->start + (i * 7919L) % l->spread, "s"),
                      0);
        return NULL;
    }
    tw_durable_item it[500];
    char k[500][16], p[500][16];
    for (int i = l->lo; i < l->hi; i += 500) {
        int m = l->hi - i < 500 ? l->hi - i : 500;
        for (int j = 0; j < m; j++)
            many_item(&it[j], &k[j], &p[j], i + j,
                      l->start + ((i + j) * 7919L) % l->spread, "s");
        ASSERT_EQ(tw_durable_schedule_many(l->d, it, (size_t)m), 0);
    }
    return NULL;
}

/* share NODES TIMERS KILL(0/1) DIR */
static void share(int nodes, int timers, bool kill_one, const char *dir)
{
    char ns[32];
    snprintf(ns, sizeof ns, "share%d", (int)getpid());
    tw_durable_config cfg = base_cfg(ns);
    cfg.shards = 64;
    cfg.horizon_ms = 1000;
    cfg.lease_ms = kill_one ? 2000 : 30000;
    cfg.fire = node_fire;
    int64_t t_load = now_ms();
    int64_t start = t_load + 3000 + timers / 20;
    int spread = 4000;
    {
        /* Load everything first from this process, then close (nothing of
         * it is claimed: all due beyond the horizon). */
        tw_durable *d;
        ASSERT_EQ(tw_durable_open(&d, &cfg), 0);
        pthread_t th[16];
        struct loader l[16];
        for (int i = 0; i < 16; i++) {
            l[i] = (struct loader){
                d, timers * i / 16, timers * (i + 1) / 16, start, spread, i};
            ASSERT_EQ(pthread_create(&th[i], NULL, load_main, &l[i]), 0);
        }
        for (int i = 0; i < 16; i++)
            pthread_join(th[i], NULL);
        ASSERT_EQ(tw_durable_close(d), 0);
        printf("  loaded %d timers in %lld ms\n", timers,
               (long long)(now_ms() - t_load));
        ASSERT(now_ms() < start - 1000); /* the load fit before the due */
    }
    fflush(NULL);
    pid_t pids[8];
    for (int n = 0; n < nodes; n++) {
        pids[n] = fork();
        ASSERT(pids[n] >= 0);
        if (pids[n] == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
            char path[512];
            snprintf(path, sizeof path, "%s/node%d.bin", dir, n);
            out_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
            if (out_fd < 0)
                _exit(1);
            tw_durable *d;
            if (tw_durable_open(&d, &cfg))
                _exit(2);
            for (;;)
                sleep_ms(1000);
        }
    }
    if (kill_one) {
        /* Node 0 dies in the middle of the firing window, holding claims. */
        while (now_ms() < start + spread / 2)
            sleep_ms(10);
        kill(pids[0], SIGKILL);
        printf("  killed node 0 at due window + %d ms\n", spread / 2);
    }
    /* Everything is due by start + spread; give the lease and slack for
     * a loaded machine on top. */
    int64_t deadline = start + spread + cfg.lease_ms + 20000;
    uint32_t *count = calloc((size_t)timers, sizeof *count);
    int64_t *late = calloc((size_t)timers, sizeof *late);
    ASSERT(count && late);
    int delivered = 0, early = 0, dups = 0, retried = 0;
    struct drec *buf = malloc(sizeof *buf * 4096);
    off_t offs[8] = {0};
    int fds[8];
    for (int n = 0; n < nodes; n++) {
        char path[512];
        snprintf(path, sizeof path, "%s/node%d.bin", dir, n);
        while ((fds[n] = open(path, O_RDONLY)) < 0)
            sleep_ms(10);
    }
    while (delivered < timers && now_ms() < deadline) {
        sleep_ms(100);
        for (int n = 0; n < nodes; n++) {
            ssize_t got;
            while ((got = pread(fds[n], buf, sizeof *buf * 4096, offs[n])) >=
                   (ssize_t)sizeof *buf) {
                size_t k = (size_t)got / sizeof *buf;
                offs[n] += (off_t)(k * sizeof *buf);
                for (size_t i = 0; i < k; i++) {
                    struct drec *r = &buf[i];
                    ASSERT(r->id < (uint32_t)timers);
                    if (r->fired_us < r->due_ms * 1000)
                        early++;
                    if (r->attempt > 1)
                        retried++;
                    if (count[r->id]++) {
                        dups++;
                        continue;
                    }
                    late[r->id] = r->fired_us - r->due_ms * 1000;
                    delivered++;
                }
            }
        }
    }
    for (int n = 0; n < nodes; n++) {
        kill(pids[n], SIGKILL);
        waitpid(pids[n], NULL, 0);
        close(fds[n]);
    }
    int64_t *sorted = malloc(sizeof *sorted * (size_t)timers);
    ASSERT(sorted);
    size_t m = 0;
    for (int i = 0; i < timers; i++)
        if (count[i])
            sorted[m++] = late[i];
    qsort(sorted, m, sizeof *sorted, cmp64);
    printf("  %d nodes, %d timers: delivered %d, twice %d, attempt>1 %d, "
           "early %d; lateness us p50 %lld p99 %lld max %lld\n",
           nodes, timers, delivered, dups, retried, early,
           m ? (long long)sorted[m / 2] : -1,
           m ? (long long)sorted[m * 99 / 100] : -1,
           m ? (long long)sorted[m - 1] : -1);
    ASSERT_EQ(delivered, timers);
    ASSERT_EQ(early, 0);
    double load = load_avg();
    if (kill_one)
        ASSERT(retried > 0); /* node 0's claims came back with attempt 2 */
    else if (load > 2.0 * (double)sysconf(_SC_NPROCESSORS_ONLN))
        /* 3 nodes, 3 Redis masters and the test on cores already busy
         * with other work: lateness is the wait for a core (p99 0.7-5.8 s
         * measured at a load of 7-14 on 2 cores, before and after the
         * same change), so it is printed, not asserted. */
        printf("  lateness not asserted: load average %.1f\n", load);
    else
        /* Bound for a loaded 2-core machine shared with other builds; the
         * measured figures are printed above and, for the redis_share
         * scenario, in bench/history/BENCHMARKS-notebook.md ("Round 4" of
         * "Durable timers on Redis": "The firer must not sleep while
         * behind"). */
        ASSERT(sorted[m * 99 / 100] < 500000);
    free(sorted);
    free(buf);
    free(count);
    free(late);
    printf("share: ok\n");
}

/* ------------------------------------------------------------------------ */
/* cfg.redis_check_gap_ms: the claim checks' round trips, counted by Redis. */

/* Calls of @cmd since the last CONFIG RESETSTAT (INFO commandstats). */
static long long cmd_calls(const char *cmd)
{
    redisReply *r = rawv(2, (const char *[]){"INFO", "commandstats"});
    ASSERT(r->type == REDIS_REPLY_STRING);
    char pat[64];
    snprintf(pat, sizeof pat, "cmdstat_%s:calls=", cmd);
    const char *p = strstr(r->str, pat);
    long long n = p ? atoll(p + strlen(pat)) : 0;
    freeReplyObject(r);
    return n;
}

/* 150 timers due 10 ms apart on 8 shards, with a check gap of @gap ms (0:
 * the default): all delivered once, none early; returns the MGETs (one per
 * batch of checks, on one server) Redis ran while they fired, and the
 * latest start after due in *@late_ms. */
static long long gap_run(uint32_t gap, int64_t *late_ms)
{
    char ns[32];
    snprintf(ns, sizeof ns, "gap%u_%d", gap, (int)getpid());
    tw_durable_config cfg = base_cfg(ns);
    cfg.redis_check_gap_ms = gap;
    tw_durable *d;
    reset_tab();
    ASSERT_EQ(tw_durable_open(&d, &cfg), 0);
    enum { N = 150 };
    int64_t t0 = now_ms() + 700;
    for (int i = 0; i < N; i++)
        ASSERT_EQ(sched(d, i, t0 + 10 * i, "g"), 0);
    RAW("CONFIG", "RESETSTAT");
    ASSERT(wait_all(0, N, 20000)); /* 1.5 s of timers; a loaded machine */
    settle(d);
    long long mget = cmd_calls("mget");
    check_none_early(0, N);
    *late_ms = 0;
    for (int i = 0; i < N; i++) {
        ASSERT_EQ(tab[i].count, 1);
        int64_t late = tab[i].first_us / 1000 - tab[i].due;
        if (late > *late_ms)
            *late_ms = late;
    }
    tw_durable_close(d);
    return mget;
}

/* A longer gap batches the checks of more timers into one round trip:
 * with the default 4 ms the 150 timers 10 ms apart take about one MGET
 * each (at least half of them asserted: a check late on a loaded machine
 * takes the timers due by then), with 250 ms at most one per 250 ms of
 * the 1.5 s (6, and up to 14 asserted: a batch after a late one starts at
 * once). A gap above 1000 ms is TW_EINVAL, naming the field. */
static void gap_test(void)
{
    ASSERT_EQ(tw__rc_open(&raw, &(tw__rc_opts){.addr = seeds}), 0);
    int64_t late_def, late_gap;
    long long def = gap_run(0, &late_def);
    long long gap = gap_run(250, &late_gap);
    printf("gap: MGETs %lld with the default gap (latest start %lld ms after "
           "due), %lld with 250 ms (%lld ms)\n",
           def, (long long)late_def, gap, (long long)late_gap);
    ASSERT(def >= 75);
    ASSERT(gap >= 1 && gap <= 14);
    tw__rc_close(raw);
    raw = NULL;

    char err[128];
    tw_durable_config cfg = base_cfg("gapbad");
    cfg.redis_check_gap_ms = 1001;
    cfg.errbuf = err;
    cfg.errbuf_len = sizeof err;
    tw_durable *d = NULL;
    ASSERT_EQ(tw_durable_open(&d, &cfg), TW_EINVAL);
    ASSERT(d == NULL);
    ASSERT(strstr(err, "redis_check_gap_ms") != NULL);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* The library must survive SIGPIPE at its default (fatal) disposition,
     * whatever the caller's shell passed down. */
    signal(SIGPIPE, SIG_DFL);
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODE SEEDS [args]\n", argv[0]);
        return 2;
    }
    seeds = argv[2];
    tab = calloc(MAXK, sizeof *tab);
    ASSERT(tab);
    const char *mode = argv[1];
    if (!strcmp(mode, "semantics")) {
        semantics();
        stats_test();
        age_test("age", 0);
        age_test("agex", 1);
    } else if (!strcmp(mode, "dienode") && argc == 5)
        dienode(argv[3], strtoll(argv[4], NULL, 10));
    else if (!strcmp(mode, "econn"))
        econn();
    else if (!strcmp(mode, "garbage"))
        garbage();
    else if (!strcmp(mode, "stall"))
        stall();
    else if (!strcmp(mode, "many"))
        many();
    else if (!strcmp(mode, "gap"))
        gap_test();
    else if (!strcmp(mode, "shards"))
        shards_test();
    else if (!strcmp(mode, "crash") || !strcmp(mode, "failover") ||
             !strcmp(mode, "reshard"))
        flow_test(mode);
    else if (!strcmp(mode, "share") && argc == 7)
        share(atoi(argv[3]), atoi(argv[4]), atoi(argv[5]) != 0, argv[6]);
    else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    free(tab);
    return 0;
}
