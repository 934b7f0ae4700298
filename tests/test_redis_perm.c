/* SPDX-License-Identifier: MIT */
/*
 * tests/test_redis_perm.c - a permission taken away after open, against
 * one server with an ACL user that tests/redis_prod.sh (scenario
 * perm-lost) sets up, starts and stops. Usage:
 *
 *   test_redis_perm ADDRESS RULE...
 *       $TW_ACL is a shell command that gives the user every rule of the
 *       smallest ACL, less the one named by its argument ("-": none).
 *       A RULE "stats:CMD" checks tw_durable_stats_get() without CMD;
 *       "own:CMD" runs the check below on a store with shard ownership
 *       (the first such RULE closes the store without it: put them last).
 *
 * The store is opened with the whole ACL. For each RULE in turn (a
 * command the store's claims or completions use): timers are scheduled,
 * some due at once (SCHED claims them) and some past the claim horizon
 * (a later CLAIM must take them), the rule is removed, and the store
 * must say so: stats.errors grows and cfg.on_error is called with
 * TW_EAUTH and a message naming the command, within 5 s (before, the
 * claims failed in silence: nothing counted, nothing told, the timers
 * never delivered), unless every timer is delivered without it (a
 * command only retries use, such as HSET). The rule is given back and every
 * timer is then delivered (bound: 20 s, past the claim leases of the
 * completions that failed). With ownership ("own:pexpire"), the refused
 * command is one of the ownership rounds' (before, those errors were
 * neither counted nor told: the shards' trust ran out in silence).
 * "stats:zcard": without ZCARD, stats must not say 0 pending while
 * timers wait: the call fails (TW_EAUTH), and the refusal is counted
 * (before, it returned 0 with pending 0).
 */
#define _GNU_SOURCE

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_fixture.h"
#include "test.h"
#include "twheel/durable.h"

#define PER_RULE 20
#define RULES_MAX 16

static atomic_int delivered[RULES_MAX * PER_RULE];
static atomic_int reports;
static pthread_mutex_t msg_mu = PTHREAD_MUTEX_INITIALIZER;
static char last_msg[512];
static int last_code;

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    int i = key_num(t, 'P', RULES_MAX * PER_RULE);
    if (i >= 0)
        atomic_fetch_add(&delivered[i], 1);
    return 0;
}

static void on_error(void *arg, int code, const char *msg)
{
    (void)arg;
    pthread_mutex_lock(&msg_mu);
    snprintf(last_msg, sizeof last_msg, "%s", msg);
    last_code = code;
    pthread_mutex_unlock(&msg_mu);
    atomic_fetch_add(&reports, 1);
}

static void acl(const char *rule)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "%s '%s'", getenv("TW_ACL"), rule);
    ASSERT_EQ(system(cmd), 0);
}

static uint64_t errors_now(tw_durable *d)
{
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    return st.errors;
}

/* How many timers of rule @r are not delivered yet. */
static int missing(int r)
{
    int n = 0;
    for (int j = 0; j < PER_RULE; j++)
        n += !atomic_load(&delivered[r * PER_RULE + j]);
    return n;
}

/* One rule: schedule, take it away, see the error counted and told,
 * give it back, see every timer delivered. Half the timers are due
 * @late_ms ahead: past the 2 s horizon, so a later CLAIM must take them
 * (with ownership, 5 s: past the shard's trust, which runs out 1.6 s
 * after the last renewal, plus the horizon: only an owner whose rounds
 * work claims them). */
static void one_rule(tw_durable *d, int r, const char *rule, int64_t late_ms)
{
    int64_t now = now_ms();
    for (int j = 0; j < PER_RULE; j++) {
        char k[16];
        int n = snprintf(k, sizeof k, "P%d", r * PER_RULE + j);
        /* Half due at once (claimed by SCHED), half later. */
        int64_t due = now + (j % 2 ? late_ms : 50);
        ASSERT_EQ(tw_durable_schedule(d, k, (size_t)n, due, "p", 1), 0);
    }
    uint64_t e0 = errors_now(d);
    int rep0 = atomic_load(&reports);
    acl(rule);
    int64_t t0 = now_ms();
    while ((errors_now(d) == e0 || atomic_load(&reports) == rep0) &&
           missing(r) && now_ms() - t0 < 5000)
        sleep_ms(20);
    if (!missing(r) && errors_now(d) == e0) {
        /* Not a command these timers' claims and completions use. */
        fprintf(stderr, "-%s: all delivered without it, no error\n", rule);
    } else {
        pthread_mutex_lock(&msg_mu);
        fprintf(stderr,
                "-%s: %llu errors, %d reports in %lld ms, the last: %s "
                "\"%s\"\n",
                rule, (unsigned long long)(errors_now(d) - e0),
                atomic_load(&reports) - rep0, (long long)(now_ms() - t0),
                tw_err_name(last_code), last_msg);
        char want[64];
        snprintf(want, sizeof want, "'%s'", rule);
        bool named = strstr(last_msg, "NOPERM") && strstr(last_msg, want);
        int code = last_code;
        pthread_mutex_unlock(&msg_mu);
        ASSERT_GT(errors_now(d), e0);
        ASSERT_GT(atomic_load(&reports), rep0);
        ASSERT(named);
        ASSERT_EQ(code, TW_EAUTH);
    }
    acl("-");
    t0 = now_ms();
    while (missing(r) && now_ms() - t0 < 20000)
        sleep_ms(20);
    fprintf(stderr, "+%s: %d of %d delivered %lld ms after it came back\n",
            rule, PER_RULE - missing(r), PER_RULE, (long long)(now_ms() - t0));
    ASSERT_EQ(missing(r), 0);
}

/* Stats without @cmd (rule @r): never 0 pending while PER_RULE timers
 * wait; the refusal counted once the rule is back. */
static void stats_rule(tw_durable *d, int r, const char *cmd)
{
    int64_t due = now_ms() + 600000;
    for (int j = 0; j < PER_RULE; j++) {
        char k[16];
        int n = snprintf(k, sizeof k, "S%d", r * PER_RULE + j);
        ASSERT_EQ(tw_durable_schedule(d, k, (size_t)n, due, "p", 1), 0);
    }
    uint64_t e0 = errors_now(d);
    acl(cmd);
    tw_durable_stats st;
    memset(&st, 0, sizeof st);
    int rc = tw_durable_stats_get(d, &st);
    acl("-");
    fprintf(stderr, "-%s: stats %s, pending %llu\n", cmd, tw_err_name(rc),
            (unsigned long long)st.pending);
    if (rc == 0)
        ASSERT_GE(st.pending, PER_RULE);
    else
        ASSERT_EQ(rc, TW_EAUTH);
    ASSERT_GT(errors_now(d), e0);
    for (int j = 0; j < PER_RULE; j++) {
        char k[16];
        int n = snprintf(k, sizeof k, "S%d", r * PER_RULE + j);
        ASSERT_EQ(tw_durable_cancel(d, k, (size_t)n), 0);
    }
}

static tw_durable *open_store(const char *addr, uint32_t shard_lease_ms)
{
    tw_durable_config cfg = {.fire = on_fire, .on_error = on_error};
    char err[512] = "";
    cfg.errbuf = err;
    cfg.errbuf_len = sizeof err;
    cfg.redis = addr;
    cfg.redis_namespace = "tw";
    cfg.shards = 4;
    cfg.redis_shard_lease_ms = shard_lease_ms;
    tw_durable *d = NULL;
    int rc = tw_durable_open(&d, &cfg);
    if (rc)
        fprintf(stderr, "open: %s %s\n", tw_err_name(rc), err);
    ASSERT_EQ(rc, 0);
    return d;
}

int main(int argc, char **argv)
{
    if (argc < 3 || !getenv("TW_ACL") || argc - 2 > RULES_MAX) {
        fprintf(stderr, "usage: TW_ACL=CMD %s ADDRESS RULE...\n", argv[0]);
        return 2;
    }
    acl("-");
    tw_durable *d = open_store(argv[1], 0);
    bool own = false;
    for (int i = 2; i < argc; i++) {
        if (!strncmp(argv[i], "stats:", 6)) {
            stats_rule(d, i - 2, argv[i] + 6);
            continue;
        }
        if (!strncmp(argv[i], "own:", 4) && !own) {
            ASSERT_EQ(tw_durable_close(d), 0);
            d = open_store(argv[1], 2000); /* a 2 s shard lease */
            own = true;
        }
        one_rule(d, i - 2, argv[i] + (own ? 4 : 0), own ? 5000 : 3000);
    }
    ASSERT_EQ(tw_durable_close(d), 0);
    return 0;
}
