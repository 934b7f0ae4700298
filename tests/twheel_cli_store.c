/* SPDX-License-Identifier: MIT */
/*
 * tests/twheel_cli_store.c - stores for tests/twheel_cli.sh to point the
 * twheel tool at.
 *   make DIR N          a journal with N timers t000.. (due an hour and
 *                       more ahead, i seconds apart, payload "p<i>") and
 *                       one whose key has bytes a terminal cannot show;
 *                       and two dead letters, dead-a and dead-b (their
 *                       callbacks returned TW_DURABLE_FIRE_DEAD)
 *   redis ADDR NS N     the same N timers and dead letters in a Redis
 *                       namespace (8 shards), and "huge" due at 2^53 + 1 ms
 *   load DIR N          a live store under load for a backup: schedule
 *                       l000000.. (N of them, each printed on stdout once
 *                       acknowledged) and, between them, schedule r00..r49
 *                       due now (delivered and done at once) three times
 *                       each, in 8 KiB segments, so that old segments are
 *                       compacted and deleted while it runs
 *   rload ADDR NS N     the same load on a Redis namespace (8 shards)
 *   hold DIR N          open the journal of "make DIR N", schedule held-1,
 *                       print "held", wait for a line on stdin, then check
 *                       that the store still holds N + 2 timers, can
 *                       schedule held-2 and closes cleanly (exit 0)
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <twheel/durable.h>

#include "clock_fixture.h" /* now_ms */

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    return t->key_len > 5 && !memcmp(t->key, "dead-", 5) ? TW_DURABLE_FIRE_DEAD
                                                         : 0;
}

/* Schedule dead-a and dead-b due now and wait (10 s at most) until both
 * are dead letters. */
static int make_dead(tw_durable *d, int64_t now)
{
    int rc;
    if ((rc = tw_durable_schedule(d, "dead-a", 6, now, "da", 2)) ||
        (rc = tw_durable_schedule(d, "dead-b", 6, now, "db", 2)))
        return rc;
    for (int i = 0; i < 10000; i++) {
        tw_durable_stats s;
        if ((rc = tw_durable_stats_get(d, &s)))
            return rc;
        if (s.dead == 2)
            return 0;
        nanosleep(&(struct timespec){0, 1000000}, NULL);
    }
    return TW_EAGAIN;
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "twheel_cli_store: %s: %s\n", what, tw_strerror(rc));
    return 1;
}

/* Where @argv's store is: a Redis namespace or a journal directory. */
static void configure(tw_durable_config *c, char **argv)
{
    if (!strcmp(argv[1], "redis") || !strcmp(argv[1], "rload")) {
        c->redis = argv[2];
        c->redis_namespace = argv[3];
        c->shards = 8;
    } else {
        c->dir = argv[2];
    }
    if (!strcmp(argv[1], "load"))
        c->segment_bytes = 8192;
}

/* "load DIR N" (the store is open): see the top of the file. */
static int load(tw_durable *d, long n)
{
    char pay[200];
    memset(pay, 'x', sizeof pay);
    int64_t base = now_ms() + 3600 * 1000;
    for (long i = 0; i < n; i++) {
        char k[16];
        int kl = snprintf(k, sizeof k, "l%06ld", i);
        int rc =
            tw_durable_schedule(d, k, (size_t)kl, base + i, pay, sizeof pay);
        if (rc)
            return fail("schedule", rc);
        printf("%s\n", k);
        fflush(stdout);
        for (long j = 0; j < 3; j++) { /* three dead records to one live */
            kl = snprintf(k, sizeof k, "r%02ld", (i * 3 + j) % 50);
            if ((rc = tw_durable_schedule(d, k, (size_t)kl, now_ms(), pay,
                                          sizeof pay)))
                return fail("schedule", rc);
        }
    }
    return tw_durable_close(d) ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    tw_durable_config c = {.fire = on_fire};
    const char *mode = argv[1];
    long n = atol(argv[argc - 1]);
    configure(&c, argv);
    tw_durable *d;
    int rc = tw_durable_open(&d, &c);
    if (rc)
        return fail("open", rc);
    if (!strcmp(mode, "load") || !strcmp(mode, "rload"))
        return load(d, n);
    int64_t base = now_ms() + 3600 * 1000;
    if (strcmp(mode, "hold")) {
        for (long i = 0; i < n; i++) {
            char k[16], p[16];
            int kl = snprintf(k, sizeof k, "t%03ld", i);
            int pl = snprintf(p, sizeof p, "p%ld", i);
            rc = tw_durable_schedule(d, k, (size_t)kl, base + i * 1000, p,
                                     (size_t)pl);
            if (rc)
                return fail("schedule", rc);
        }
        rc = tw_durable_schedule(d, "bin\x01\xff", 5, base + n * 1000, "", 0);
        if (rc)
            return fail("schedule", rc);
        if ((rc = make_dead(d, now_ms())))
            return fail("dead letters", rc);
        /* Redis lists due times past 2^53 as doubles: check must still
         * find this one sound. */
        if (!strcmp(mode, "redis") &&
            (rc = tw_durable_schedule(d, "huge", 4, (INT64_C(1) << 53) + 1, "",
                                      0)))
            return fail("schedule", rc);
        return tw_durable_close(d) ? 1 : 0;
    }
    if ((rc = tw_durable_schedule(d, "held-1", 6, base, "h", 1)))
        return fail("schedule held-1", rc);
    puts("held");
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof line, stdin))
        return fail("stdin", TW_EIO);
    tw_durable_stats s;
    if ((rc = tw_durable_stats_get(d, &s)))
        return fail("stats", rc);
    if (s.pending != (uint64_t)n + 2) {
        fprintf(stderr, "twheel_cli_store: %llu pending, want %ld\n",
                (unsigned long long)s.pending, n + 2);
        return 1;
    }
    if ((rc = tw_durable_schedule(d, "held-2", 6, base, "h", 1)))
        return fail("schedule held-2", rc);
    return tw_durable_close(d) ? 1 : 0;
}
