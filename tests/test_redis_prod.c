/* SPDX-License-Identifier: MIT */
/*
 * tests/test_redis_prod.c - the Redis backend against servers set up as in
 * production (passwords, ACL users, TLS, Unix sockets, databases,
 * Sentinel), which tests/redis_prod.sh starts and stops. Usage:
 *
 *   test_redis_prod open EXPECT [KEY=VALUE...]
 *       tw_durable_open with the config KEY=VALUE gives (addr, user,
 *       password, suser, spassword, ca, cadir, cert, key, sni, ns), checks
 *       its code is EXPECT (0, TW_EAUTH, TW_ECONN, TW_EINVAL, TW_EIO) and,
 *       on failure, that errbuf holds every want=TEXT and none of the
 *       secret=TEXT. On success a timer is scheduled, replaced, fires
 *       once with the new payload; a keep=KEY timer is left pending (due
 *       in an hour) for the script to find in Redis; another is looked up,
 *       listed and cancelled, and the stats read.
 *   test_redis_prod wait-fresh ADDRESS KILL
 *       the client: a WAIT that would be the first command of a new
 *       connection (the one that carried the writes was killed by the
 *       shell command KILL) fails with TW_ECONN instead of counting no
 *       writes; on a connection that wrote, WAIT answers.
 *   test_redis_prod sentinel KEY=VALUE...
 *       timers flow through a Sentinel-managed master with wait_replicas
 *       1 while $TW_FAILOVER (SENTINEL FAILOVER) runs; every acknowledged
 *       schedule is still pending afterwards, and calls succeed again on
 *       the new master.
 */
#define _GNU_SOURCE

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock_fixture.h"
#include "redis_client.h"
#include "test.h"
#include "twheel/durable.h"

static const char *wants[8], *secrets[8], *keep;
static int nwants, nsecrets;

static void set_field(tw_durable_config *cfg, const char *kv)
{
    const char *eq = strchr(kv, '=');
    ASSERT_NOT_NULL(eq);
    size_t n = (size_t)(eq - kv);
    const char *v = eq + 1;
#define F(name, field)                                                         \
    if (n == strlen(name) && !strncmp(kv, name, n)) {                          \
        cfg->field = v;                                                        \
        return;                                                                \
    }
    F("addr", redis)
    F("user", redis_user)
    F("password", redis_password)
    F("suser", redis_sentinel_user)
    F("spassword", redis_sentinel_password)
    F("ca", redis_tls_ca_file)
    F("cadir", redis_tls_ca_dir)
    F("cert", redis_tls_cert_file)
    F("key", redis_tls_key_file)
    F("sni", redis_tls_server_name)
    F("ns", redis_namespace)
#undef F
    if (!strncmp(kv, "lease=", 6))
        cfg->redis_shard_lease_ms = (uint32_t)atoi(v);
    else if (!strncmp(kv, "wait=", 5))
        cfg->wait_replicas = (uint32_t)atoi(v);
    else if (!strncmp(kv, "want=", 5) && nwants < 8)
        wants[nwants++] = v;
    else if (!strncmp(kv, "secret=", 7) && nsecrets < 8)
        secrets[nsecrets++] = v;
    else if (!strncmp(kv, "keep=", 5))
        keep = v;
    else
        TW_TEST_FAIL_("unknown setting %s", kv);
}

static int code_of(const char *s)
{
    static const struct {
        const char *name;
        int code;
    } codes[] = {{"0", 0},
                 {"TW_EAUTH", TW_EAUTH},
                 {"TW_ECONN", TW_ECONN},
                 {"TW_EINVAL", TW_EINVAL},
                 {"TW_EIO", TW_EIO}};
    for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
        if (!strcmp(s, codes[i].name))
            return codes[i].code;
    TW_TEST_FAIL_("unknown code %s", s);
}

static atomic_int fired, fired_new;

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    atomic_fetch_add(&fired, 1);
    if (t->payload_len == 3 && !memcmp(t->payload, "new", 3))
        atomic_fetch_add(&fired_new, 1);
    return 0;
}

/* Schedule, replace and see one delivery of the new version. */
static void flow(tw_durable *d)
{
    int64_t due = now_ms() + 100;
    ASSERT_EQ(tw_durable_schedule(d, "k1", 2, due, "old", 3), 0);
    ASSERT_EQ(tw_durable_schedule(d, "k1", 2, due, "new", 3), 0);
    ASSERT_EQ(tw_durable_cancel(d, "nokey", 5), TW_ENOENT);
    for (int i = 0; i < 1000 && atomic_load(&fired) == 0; i++)
        sleep_ms(10);
    sleep_ms(200); /* a second delivery would come within this */
    ASSERT_EQ(atomic_load(&fired), 1);
    ASSERT_EQ(atomic_load(&fired_new), 1);
    if (keep)
        ASSERT_EQ(tw_durable_schedule(d, keep, strlen(keep),
                                      now_ms() + 3600 * 1000, "kept", 4),
                  0);
    /* The operator's calls too (the smallest ACL must cover them): look
     * up, list, stats, cancel of a pending key. */
    int64_t far = now_ms() + 7200 * 1000;
    ASSERT_EQ(tw_durable_schedule(d, "k2", 2, far, "later", 5), 0);
    tw_durable_info info;
    char buf[16];
    ASSERT_EQ(tw_durable_get(d, "k2", 2, &info, buf, sizeof buf), 0);
    ASSERT_EQ(info.due_ms, far);
    ASSERT_EQ(info.payload_len, 5);
    tw_durable_cursor cur = TW_DURABLE_CURSOR_INIT;
    tw_durable_entry e[4];
    char keys[TW_DURABLE_KEY_MAX];
    ASSERT_EQ(tw_durable_list(d, far, far + 1, &cur, e, 4, keys, sizeof keys),
              1);
    ASSERT_EQ(e[0].key_len, 2);
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT(st.pending >= 1);
    ASSERT_EQ(tw_durable_cancel(d, "k2", 2), 0);
}

static int open_main(int argc, char **argv)
{
    int expect = code_of(argv[2]);
    tw_durable_config cfg = {.fire = on_fire};
    char err[512];
    memset(err, 'x', sizeof err);
    err[sizeof err - 1] = 0;
    cfg.errbuf = err;
    cfg.errbuf_len = sizeof err;
    cfg.shards = 4;
    for (int i = 3; i < argc; i++)
        set_field(&cfg, argv[i]);
    tw_durable *d = NULL;
    int rc = tw_durable_open(&d, &cfg);
    fprintf(stderr, "open: %s \"%s\"\n", tw_err_name(rc), rc ? err : "");
    ASSERT_STR_EQ(tw_err_name(rc), tw_err_name(expect));
    if (rc) {
        for (int i = 0; i < nwants; i++)
            if (!strstr(err, wants[i]))
                TW_TEST_FAIL_("message \"%s\" lacks \"%s\"", err, wants[i]);
        for (int i = 0; i < nsecrets; i++)
            if (strstr(err, secrets[i]))
                TW_TEST_FAIL_("message \"%s\" shows a secret", err);
        return 0;
    }
    flow(d);
    ASSERT_EQ(tw_durable_close(d), 0);
    return 0;
}

/* ---- Sentinel failover ---- */

#define SKEYS 4000
static atomic_int acked[SKEYS]; /* 1: schedule returned 0 */
static atomic_bool stop_writer;

static void *writer(void *arg)
{
    tw_durable *d = arg;
    int64_t far = now_ms() + 3600 * 1000;
    for (int i = 0; i < SKEYS && !atomic_load(&stop_writer); i++) {
        char k[16];
        int n = snprintf(k, sizeof k, "s%d", i);
        if (tw_durable_schedule(d, k, (size_t)n, far, "p", 1) == 0)
            atomic_store(&acked[i], 1);
        sleep_ms(1);
    }
    return NULL;
}

static int sentinel_main(int argc, char **argv)
{
    tw_durable_config cfg = {.fire = on_fire};
    char err[512] = "";
    cfg.errbuf = err;
    cfg.errbuf_len = sizeof err;
    cfg.shards = 4;
    cfg.wait_replicas = 1;
    cfg.wait_timeout_ms = 2000;
    for (int i = 2; i < argc; i++)
        set_field(&cfg, argv[i]);
    tw_durable *d = NULL;
    int rc = tw_durable_open(&d, &cfg);
    if (rc)
        fprintf(stderr, "open: %s %s\n", tw_err_name(rc), err);
    ASSERT_EQ(rc, 0);
    flow(d);
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, writer, d), 0);
    sleep_ms(500);
    const char *failover = getenv("TW_FAILOVER");
    ASSERT_NOT_NULL(failover);
    int64_t t0 = now_ms();
    ASSERT_EQ(system(failover), 0);
    fprintf(stderr, "sentinel: failover done in %lld ms\n",
            (long long)(now_ms() - t0));
    /* Calls resume on the new master: a schedule after the failover
     * succeeds within 30 s. */
    t0 = now_ms();
    int ok = TW_ECONN;
    while (ok != 0 && now_ms() - t0 < 30000) {
        ok = tw_durable_schedule(d, "after", 5, now_ms() + 3600 * 1000, "a", 1);
        if (ok)
            sleep_ms(100);
    }
    ASSERT_EQ(ok, 0);
    fprintf(stderr, "sentinel: calls resumed %lld ms after the failover\n",
            (long long)(now_ms() - t0));
    sleep_ms(300); /* the writer goes on, on the new master */
    atomic_store(&stop_writer, true);
    pthread_join(t, NULL);
    /* Every acknowledged schedule is pending on the new master: its
     * cancel finds it. */
    int nacked = 0;
    for (int i = 0; i < SKEYS; i++) {
        if (!atomic_load(&acked[i]))
            continue;
        char k[16];
        int n = snprintf(k, sizeof k, "s%d", i);
        nacked++;
        int c;
        for (int tries = 0;
             (c = tw_durable_cancel(d, k, (size_t)n)) == TW_ECONN &&
             tries < 100;
             tries++)
            sleep_ms(100);
        if (c != 0)
            TW_TEST_FAIL_("acknowledged %s lost: cancel gives %s", k,
                          tw_err_name(c));
    }
    fprintf(stderr, "sentinel: %d acknowledged schedules, none lost\n", nacked);
    ASSERT_GT(nacked, 100);
    ASSERT_EQ(tw_durable_cancel(d, "after", 5), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    return 0;
}

/* ---- WAIT only on the connection that carried the writes ---- */

static int exec1(tw__rc *c, int argc, const char **argv, long long *out)
{
    size_t len[3];
    for (int i = 0; i < argc; i++)
        len[i] = strlen(argv[i]);
    tw__rc_cmd cmd = {argc, argv, len, tw__rc_slot("twk", 3), NULL, 0};
    int rc = tw__rc_exec(c, &cmd, 1);
    if (!rc) {
        ASSERT_NE(cmd.reply->type, REDIS_REPLY_ERROR);
        *out = cmd.reply->integer;
        freeReplyObject(cmd.reply);
    }
    return rc;
}

static int wait_main(const char *addr, const char *kill)
{
    static const char *set[3] = {"SET", "twk", "v"};
    static const char *wait[3] = {"WAIT", "0", "100"};
    tw__rc *c;
    char err[256] = "";
    tw__rc_opts o = {.addr = addr, .errbuf = err, .errbuf_len = sizeof err};
    ASSERT_EQ(tw__rc_open(&c, &o), 0);
    long long v;
    ASSERT_EQ(exec1(c, 3, set, &v), 0);
    ASSERT_EQ(exec1(c, 3, wait, &v), 0); /* same connection: answered */
    ASSERT_EQ(system(kill), 0);
    /* The dead connection: no reply. */
    ASSERT_EQ(exec1(c, 3, wait, &v), TW_ECONN);
    sleep_ms(100); /* past the reconnect back-off */
    /* A new connection whose first command would be WAIT: refused. */
    ASSERT_EQ(exec1(c, 3, wait, &v), TW_ECONN);
    /* After a write on it, WAIT counts that write. */
    ASSERT_EQ(exec1(c, 3, set, &v), 0);
    ASSERT_EQ(exec1(c, 3, wait, &v), 0);
    tw__rc_close(c);
    fprintf(stderr, "wait-fresh: ok\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 4 && !strcmp(argv[1], "wait-fresh"))
        return wait_main(argv[2], argv[3]);
    if (argc >= 3 && !strcmp(argv[1], "open"))
        return open_main(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "sentinel"))
        return sentinel_main(argc, argv);
    fprintf(stderr,
            "usage: %s open EXPECT [KEY=VALUE...] | sentinel "
            "KEY=VALUE...\n",
            argv[0]);
    return 2;
}
