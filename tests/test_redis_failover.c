/* SPDX-License-Identifier: MIT */
/*
 * tests/test_redis_failover.c - Sentinel failovers under load, against a
 * master, one replica and three sentinels that tests/redis_prod.sh
 * (scenario sentinel-load) starts and stops. Usage:
 *
 *   test_redis_failover KEY=VALUE...
 *       addr=, password=, spassword= as test_redis_prod; the shell
 *       commands $TW_FAILOVER (SENTINEL FAILOVER, returns once the
 *       sentinels name a new master that says it is one) and $TW_KILL
 *       (kill -9 of the master, the same wait, then the killed server
 *       restarted as the new master's replica).
 *
 * A writer thread schedules timers due 1 s ahead, one every 2 ms, and
 * cancels every tenth right after its schedule, throughout; the
 * failover, calls resumed, the kill, calls resumed. What is checked is
 * the store's promise with cfg.wait_replicas = 1 and one replica
 * (docs/guide/redis.md, Sentinel): a schedule that returned 0 was on the
 * replica, which is the one promoted, so every such timer is delivered
 * at least once unless a cancel of it was sent (a cancel that returned 0
 * was acknowledged; one that failed may or may not have happened). Each
 * phase prints how long the sentinels took to name the new master and
 * after how long schedules and deliveries resumed; nothing is asserted
 * about those times but a generous bound (30 s).
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

#define NKEYS 60000
#define DUE_AHEAD_MS 1000
#define RESUME_MS 30000

static atomic_char acked[NKEYS]; /* schedule returned 0 */
static atomic_char cancel_sent[NKEYS];
static atomic_char cancelled[NKEYS]; /* cancel returned 0 */
static atomic_int delivered[NKEYS];
static atomic_int late_cancel; /* deliveries after a cancel's 0 */
static atomic_bool stop_writer;
static atomic_llong mark_ms;        /* a phase's start */
static atomic_int first_after = -1; /* first key acked after mark_ms */
static atomic_llong fired_after_ms; /* first delivery of such a key */
static atomic_llong fired_any_ms;   /* first delivery after mark_ms */
static atomic_int nwritten;

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    int i = key_num(t, 'L', NKEYS);
    if (i < 0)
        return 0;
    if (atomic_load(&cancelled[i]))
        atomic_fetch_add(&late_cancel, 1);
    atomic_fetch_add(&delivered[i], 1);
    if (atomic_load(&mark_ms) && !atomic_load(&fired_any_ms))
        atomic_store(&fired_any_ms, now_ms());
    int fa = atomic_load(&first_after);
    if (fa >= 0 && i >= fa && !atomic_load(&fired_after_ms))
        atomic_store(&fired_after_ms, now_ms());
    return 0;
}

static void *writer(void *arg)
{
    tw_durable *d = arg;
    for (int i = 0; i < NKEYS && !atomic_load(&stop_writer); i++) {
        char k[16];
        int n = snprintf(k, sizeof k, "L%d", i);
        atomic_store(&nwritten, i + 1);
        if (tw_durable_schedule(d, k, (size_t)n, now_ms() + DUE_AHEAD_MS, "p",
                                1) == 0) {
            atomic_store(&acked[i], 1);
            if (atomic_load(&first_after) < 0 && atomic_load(&mark_ms) &&
                now_ms() >= atomic_load(&mark_ms))
                atomic_store(&first_after, i);
        }
        if (i % 10 == 0) {
            atomic_store(&cancel_sent[i], 1);
            if (tw_durable_cancel(d, k, (size_t)n) == 0)
                atomic_store(&cancelled[i], 1);
        }
        sleep_ms(2);
    }
    return NULL;
}

/* Run the shell command in the environment variable @var (a failover that
 * returns once it is done) and wait for schedules and deliveries to
 * resume; print the times. */
static void phase(const char *name, const char *var)
{
    const char *cmd = getenv(var);
    ASSERT_NOT_NULL(cmd);
    int before = atomic_load(&nwritten);
    int64_t t0 = now_ms();
    ASSERT_EQ(system(cmd), 0);
    int64_t t1 = now_ms();
    atomic_store(&fired_after_ms, 0);
    atomic_store(&fired_any_ms, 0);
    atomic_store(&first_after, -1);
    atomic_store(&mark_ms, t1);
    while (atomic_load(&first_after) < 0 && now_ms() - t1 < RESUME_MS)
        sleep_ms(10);
    int64_t t2 = now_ms();
    if (atomic_load(&first_after) < 0)
        TW_TEST_FAIL_("%s: no schedule acknowledged within %d ms", name,
                      RESUME_MS);
    while (!atomic_load(&fired_after_ms) && now_ms() - t2 < RESUME_MS)
        sleep_ms(10);
    if (!atomic_load(&fired_after_ms))
        TW_TEST_FAIL_("%s: no delivery resumed within %d ms", name, RESUME_MS);
    fprintf(stderr,
            "%s: new master named after %lld ms; from the start, "
            "deliveries after %lld ms, schedules acknowledged again after "
            "%lld ms and delivered after %lld ms; %d schedules sent "
            "meanwhile\n",
            name, (long long)(t1 - t0),
            (long long)(atomic_load(&fired_any_ms) - t0), (long long)(t2 - t0),
            (long long)(atomic_load(&fired_after_ms) - t0),
            atomic_load(&nwritten) - before);
}

/* Every acknowledged timer without a cancel sent is delivered within
 * @bound_ms; the count of each kind is printed. */
static void check_delivered(int64_t bound_ms)
{
    int64_t t0 = now_ms();
    int missing = 0, nacked = 0, twice = 0, ncancel = 0;
    do {
        missing = nacked = twice = ncancel = 0;
        for (int i = 0; i < NKEYS; i++) {
            if (atomic_load(&cancelled[i]))
                ncancel++;
            if (!atomic_load(&acked[i]) || atomic_load(&cancel_sent[i]))
                continue;
            nacked++;
            int n = atomic_load(&delivered[i]);
            missing += n == 0;
            twice += n > 1;
        }
        if (missing)
            sleep_ms(50);
    } while (missing && now_ms() - t0 < bound_ms);
    for (int i = 0, shown = 0; i < NKEYS && shown < 10; i++)
        if (atomic_load(&acked[i]) && !atomic_load(&cancel_sent[i]) &&
            !atomic_load(&delivered[i])) {
            fprintf(stderr, "lost: L%d\n", i);
            shown++;
        }
    fprintf(stderr,
            "%d acknowledged timers without a cancel: %d delivered, %d of "
            "them more than once, %d lost; %d cancels acknowledged, %d "
            "deliveries after one\n",
            nacked, nacked - missing, twice, missing, ncancel,
            atomic_load(&late_cancel));
    ASSERT_EQ(missing, 0);
    ASSERT_GT(nacked, 500);
}

int main(int argc, char **argv)
{
    tw_durable_config cfg = {.fire = on_fire};
    char err[512] = "";
    cfg.errbuf = err;
    cfg.errbuf_len = sizeof err;
    cfg.shards = 4;
    cfg.wait_replicas = 1;
    if (getenv("TW_WAIT_REPLICAS")) /* 0: see that a loss is caught */
        cfg.wait_replicas = (uint32_t)atoi(getenv("TW_WAIT_REPLICAS"));
    cfg.wait_timeout_ms = 1000;
    cfg.executor_threads = 2;
    for (int i = 1; i < argc; i++) {
        const char *v = strchr(argv[i], '=');
        ASSERT_NOT_NULL(v);
        v++;
        if (!strncmp(argv[i], "addr=", 5))
            cfg.redis = v;
        else if (!strncmp(argv[i], "password=", 9))
            cfg.redis_password = v;
        else if (!strncmp(argv[i], "spassword=", 10))
            cfg.redis_sentinel_password = v;
        else
            TW_TEST_FAIL_("unknown setting %s", argv[i]);
    }
    tw_durable *d = NULL;
    int rc = tw_durable_open(&d, &cfg);
    if (rc)
        fprintf(stderr, "open: %s %s\n", tw_err_name(rc), err);
    ASSERT_EQ(rc, 0);
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, writer, d), 0);
    sleep_ms(1200); /* timers flowing: some delivered, some claimed */
    phase("SENTINEL FAILOVER", "TW_FAILOVER");
    sleep_ms(1000);
    phase("kill -9 of the master", "TW_KILL");
    sleep_ms(1000);
    atomic_store(&stop_writer, true);
    pthread_join(t, NULL);
    check_delivered(RESUME_MS);
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    fprintf(stderr, "stats: fired %llu, pending %llu, quarantined %llu\n",
            (unsigned long long)st.fired, (unsigned long long)st.pending,
            (unsigned long long)st.quarantined);
    ASSERT_EQ(tw_durable_close(d), 0);
    return 0;
}
