/* SPDX-License-Identifier: MIT */
/*
 * tests/test_redis_calls.c - how many script calls the Redis backend
 * makes, against a real redis-server that tests/redis_test.sh starts and
 * stops. Usage: test_redis_calls MODE ADDRESS.
 *
 * combine: tw_durable_schedule_many() from many threads at once on one
 * server: the batches are combined into one SCHED call per shard
 * (rd_schedule_many() in src/durable_redis.c), and each caller still gets
 * the results of its own items. THREADS threads, released together, each
 * schedule N items over SHARDS shards (their own keys, due far past the
 * horizon, so nothing is claimed or fired); a quarter of each thread's keys are
 * also given by the next thread, with that thread's payload. Checked: every
 * call returns 0 and every item's result is 0; the store then holds each key
 * once, with the payload of one of the threads that gave it; the Redis server
 * ran fewer script calls (INFO commandstats, EVALSHA and EVAL) than THREADS x
 * SHARDS / 2, where one SCHED call per shard per batch makes THREADS x
 * SHARDS. The overlap of the calls is forced by a barrier and by their
 * number (each is a round trip of 64 script calls), not by a sleep.
 *
 * idle: a node with nothing to claim leaves its idle shards out of some
 * claim rounds (claim_idle_locked() in src/redis_fire.c): over IDLE_MS,
 * with a 400 ms horizon (a round every 100 ms), it runs fewer than 3/4
 * of the CLAIM calls that one per shard per round makes (the rounds
 * counted from the time that passed; a claimer that falls behind makes
 * fewer rounds, never more). Then a timer scheduled past the horizon on
 * an idle shard is delivered, within 1 s of its due time.
 *
 * chunk: a claim round goes to Redis in round trips of a few hundred keys
 * (claim_group() in src/redis_fire.c), because the node's checks share
 * its connection and Redis runs one client's pipeline before it serves
 * another: sent whole, a round of SHARDS shards with CH_KEYS keys each
 * held every check behind it (p99 29 ms at 20,000 timers/s). Here
 * SHARDS x CH_KEYS timers, all due at one time past the horizon, become
 * claimable together; a poll (one EVAL: the claimed keys and Redis's
 * total_reads_processed, read together) runs until all are claimed. The
 * read events Redis handled between the last poll that saw none claimed
 * and the first that saw all, less the polls' own, are the claim round's
 * round trips: at least CH_READS (in one pipeline it was 1 read; in
 * chunks about 29). Nothing else of the node runs then (nothing is due,
 * the schedules ended before), but the topology read once a second.
 */
#define _GNU_SOURCE

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "redis_fixture.h"
#include "test.h"
#include "twheel/durable.h"

enum { THREADS = 16, N = 512, SHARDS = 64, IDLE_MS = 2000, HORIZON = 400 };
enum { CH_KEYS = 150, CH_HORIZON = 2000, CH_READS = 12 };

static const char *seeds;
static pthread_barrier_t go;

struct loader {
    tw_durable *d;
    int id, rc;
    tw_durable_item it[N];
    char key[N][24], pay[N][24];
};

/* Thread @l->id's items: keys "c<id>-<i>", and for i < N / 4 the keys of
 * the next thread's last quarter ("c<id+1>-<N-1-i>"), all with payload
 * "p<id>-<i>", due an hour from now. */
static void *load_main(void *arg)
{
    struct loader *l = arg;
    int64_t due = now_ms() + 3600 * 1000;
    for (int i = 0; i < N; i++) {
        int kl = i < N / 4 ? snprintf(l->key[i], 24, "c%d-%d",
                                      (l->id + 1) % THREADS, N - 1 - i)
                           : snprintf(l->key[i], 24, "c%d-%d", l->id, i);
        int pl = snprintf(l->pay[i], 24, "p%d-%d", l->id, i);
        l->it[i] = (tw_durable_item){l->key[i], (size_t)kl, due,
                                     l->pay[i], (size_t)pl, -99};
    }
    pthread_barrier_wait(&go);
    l->rc = tw_durable_schedule_many(l->d, l->it, N);
    return NULL;
}

static _Atomic int64_t fired_late = -1; /* ms after due, of the last */

/* Records how late a delivery started (the combine test's never come). */
static int never_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    fired_late = now_ms() - t->due_ms;
    return 0;
}

/* EVALSHA and EVAL calls the server has run (INFO commandstats). The
 * claims are the only script calls of an idle node. */
static long long script_calls(redisContext *rc)
{
    redisReply *r = redisCommand(rc, "INFO commandstats");
    ASSERT(r && r->type == REDIS_REPLY_STRING);
    long long n = 0;
    for (const char *p = r->str; (p = strstr(p, "cmdstat_eval")) != NULL;) {
        const char *c = strstr(p, "calls=");
        ASSERT_NOT_NULL(c);
        n += atoll(c + 6);
        p = c;
    }
    freeReplyObject(r);
    return n;
}

/* Each key of thread @t is held once, with one of its givers' payload. */
static void check_keys(tw_durable *d, const struct loader *l, int t)
{
    for (int i = N / 4; i < N; i++) {
        char buf[32];
        tw_durable_info info;
        const char *k = l[t].key[i];
        ASSERT_EQ(tw_durable_get(d, k, strlen(k), &info, buf, sizeof buf), 0);
        ASSERT_EQ(info.state, TW_DURABLE_WAITING);
        buf[info.payload_len < sizeof buf ? info.payload_len : 0] = 0;
        char mine[24], prev[24];
        snprintf(mine, sizeof mine, "p%d-%d", t, i);
        snprintf(prev, sizeof prev, "p%d-%d", (t + THREADS - 1) % THREADS,
                 N - 1 - i);
        ASSERT(!strcmp(buf, mine) || (i >= N - N / 4 && !strcmp(buf, prev)));
    }
}

/* A node on namespace @ns (SHARDS shards, the horizon @horizon_ms or the
 * default), and a plain connection to the server into *@rc. */
static tw_durable *open_node(const char *ns, uint32_t horizon_ms,
                             redisContext **rc)
{
    char host[64];
    int port;
    ASSERT_EQ(sscanf(seeds, "%63[^:]:%d", host, &port), 2);
    *rc = redisConnect(host, port);
    ASSERT(*rc && !(*rc)->err);
    tw_durable_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.redis = seeds;
    cfg.redis_namespace = ns;
    cfg.shards = SHARDS;
    cfg.horizon_ms = horizon_ms;
    cfg.fire = never_fire;
    tw_durable *d;
    ASSERT_EQ(tw_durable_open(&d, &cfg), 0);
    return d;
}

static void combine(void)
{
    redisContext *rc;
    tw_durable *d = open_node("combine", 0, &rc);
    static struct loader l[THREADS];
    pthread_t th[THREADS];
    ASSERT_EQ(pthread_barrier_init(&go, NULL, THREADS), 0);
    long long c0 = script_calls(rc);
    for (int t = 0; t < THREADS; t++) {
        l[t].d = d;
        l[t].id = t;
        ASSERT_EQ(pthread_create(&th[t], NULL, load_main, &l[t]), 0);
    }
    for (int t = 0; t < THREADS; t++)
        ASSERT_EQ(pthread_join(th[t], NULL), 0);
    long long calls = script_calls(rc) - c0;
    for (int t = 0; t < THREADS; t++) {
        ASSERT_EQ(l[t].rc, 0);
        for (int i = 0; i < N; i++)
            ASSERT_EQ(l[t].it[i].result, 0);
    }
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(st.pending, (uint64_t)THREADS * (N - N / 4));
    for (int t = 0; t < THREADS; t++)
        check_keys(d, l, t);
    printf("combine: %d threads x %d items over %d shards: %lld script "
           "calls (uncombined: %d)\n",
           THREADS, N, SHARDS, calls, THREADS * SHARDS);
    ASSERT_LT(calls, THREADS * SHARDS / 2);
    pthread_barrier_destroy(&go);
    tw_durable_close(d);
    redisFree(rc);
}

static void idle(void)
{
    redisContext *rc;
    tw_durable *d = open_node("idle", HORIZON, &rc);
    long long c0 = script_calls(rc);
    int64_t t0 = now_ms();
    sleep_ms(IDLE_MS);
    long long calls = script_calls(rc) - c0;
    int64_t rounds = (now_ms() - t0) / (HORIZON / 4) + 1;
    printf("idle: %lld CLAIM calls in %lld rounds of %d shards\n", calls,
           (long long)rounds, SHARDS);
    ASSERT_LT(calls * 4, rounds * SHARDS * 3);
    int64_t due = now_ms() + HORIZON + 300;
    ASSERT_EQ(tw_durable_schedule(d, "late", 4, due, "x", 1), 0);
    while (fired_late < 0 && now_ms() < due + 5000)
        sleep_ms(10);
    printf("idle: delivered %lld ms after due\n", (long long)fired_late);
    ASSERT_GE(fired_late, 0);
    ASSERT_LT(fired_late, 1000);
    tw_durable_close(d);
    redisFree(rc);
}

/* The claimed keys of namespace "chunk" and Redis's read events so far,
 * read by one command (one read event). */
static void claimed_reads(redisContext *rc, long long *claimed,
                          long long *reads)
{
    redisReply *r =
        redisCommand(rc, "EVAL %s 0 %d",
                     "local c=0 for s=0,ARGV[1]-1 do c=c+redis.call('ZCOUNT',"
                     "'{chunk:'..s..'}:d','-inf','(0') end "
                     "local i=redis.call('INFO','stats') return {c,tonumber("
                     "string.match(i,'total_reads_processed:(%d+)'))}",
                     SHARDS);
    ASSERT(r && r->type == REDIS_REPLY_ARRAY && r->elements == 2);
    *claimed = r->element[0]->integer;
    *reads = r->element[1]->integer;
    freeReplyObject(r);
}

/* SHARDS x CH_KEYS timers due at @due, 500 a call. */
static void chunk_load(tw_durable *d, int64_t due)
{
    enum { B = 500 };
    static tw_durable_item it[B];
    static char key[B][24];
    for (int i = 0, n = 0; i < SHARDS * CH_KEYS; i++) {
        snprintf(key[n], sizeof key[n], "k%d", i);
        it[n] = (tw_durable_item){.key = key[n],
                                  .key_len = strlen(key[n]),
                                  .due_ms = due,
                                  .payload = "x",
                                  .payload_len = 1};
        if (++n == B || i + 1 == SHARDS * CH_KEYS) {
            ASSERT_EQ(tw_durable_schedule_many(d, it, (size_t)n), 0);
            n = 0;
        }
    }
}

static void chunk(void)
{
    redisContext *rc;
    tw_durable *d = open_node("chunk", CH_HORIZON, &rc);
    int64_t due = now_ms() + CH_HORIZON + 2000;
    chunk_load(d, due);
    /* The round that claims them starts after due - CH_HORIZON. */
    ASSERT_LT(now_ms(), due - CH_HORIZON - 100);
    long long claimed = 0, reads = 0, r0 = 0, polls = 0;
    while (claimed < SHARDS * CH_KEYS && now_ms() < due) {
        claimed_reads(rc, &claimed, &reads);
        if (!claimed) {
            r0 = reads;
            polls = 0;
        } else {
            polls++; /* its own read event, after r0 */
        }
        sleep_ms(1);
    }
    ASSERT_EQ(claimed, SHARDS * CH_KEYS);
    long long rounds = reads - r0 - polls;
    printf("chunk: %d keys over %d shards claimed in %lld read events\n",
           SHARDS * CH_KEYS, SHARDS, rounds);
    ASSERT_GE(rounds, CH_READS);
    tw_durable_close(d);
    redisFree(rc);
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[1], "combine") && strcmp(argv[1], "idle") &&
                      strcmp(argv[1], "chunk"))) {
        fprintf(stderr, "usage: test_redis_calls combine|idle|chunk ADDRESS\n");
        return 2;
    }
    seeds = argv[2];
    if (!strcmp(argv[1], "combine"))
        combine();
    else if (!strcmp(argv[1], "idle"))
        idle();
    else
        chunk();
    printf("%s: ok\n", argv[1]);
    return 0;
}
