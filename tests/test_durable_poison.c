/* SPDX-License-Identifier: MIT */
/*
 * tests/test_durable_poison.c - a timer whose callback kills its process
 * (kill -9 of itself) on every delivery ends as a dead letter after
 * cfg.max_attempts deliveries, instead of crashing every process that
 * opens the store, forever.
 *
 * The parent starts a child that opens the store (a journal in a
 * temporary directory, or a Redis namespace), schedules "poison" and "ok"
 * due now once, and then polls: it reports when "poison" is a dead letter
 * and "ok" is done, and exits. The callback of "poison" reports its
 * attempt to the parent through a pipe (one write of a few bytes: a kill
 * cannot tear it) and sends SIGKILL to its own process. The parent starts
 * a new child after each kill, at most INCARNATIONS times, and checks
 * that the deliveries were attempts 1 .. MAX in order, each one a kill,
 * and that the next child found "poison" dead (attempts MAX) without a
 * callback. On the journal a delivery counts once its FIRE record is
 * durable, before the callback; on Redis, when the claim's lease (here
 * 1.5 s) runs out without a completion and the next claim gives the
 * timer back with its attempt counted up.
 *
 * "ok" (a callback that completes, due with "poison" in the same batch,
 * after it) is checked on the journal only: it must end done, not dead:
 * the kills happened before its callback started, and with a retry
 * policy the journal counts only deliveries whose callback started. Its
 * DONE record is written as the callback returns, so a kill right after
 * does not bring it back. Redis batches completions for up to
 * 500 ms, and every child here is killed within milliseconds of its first
 * deliveries, so "ok" would be delivered again in each (at least once),
 * and end dead or done depending on the order of its deliveries.
 *
 * Usage: test_durable_poison [poison REDIS_ADDR] [--max N]
 * --max 0 (no limit, the behaviour before the retry policy) makes the
 * test fail: every child is killed.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <twheel/durable.h>

#include "test.h"

#define INCARNATIONS 8
#define CHILD_SECONDS 30 /* a child that neither dies nor finishes: fail */

enum { M_ATTEMPT = 1, M_DEAD, M_ERROR };
struct msg {
    int type;
    uint32_t attempt;
    int rc;
};

static int out_fd;
static const char *redis_addr;
static char dir[64], ns[64];
static uint32_t max_attempts = 3;

static void send_msg(int type, uint32_t attempt, int rc)
{
    struct msg m = {type, attempt, rc};
    if (write(out_fd, &m, sizeof m) != (ssize_t)sizeof m)
        _exit(3);
}

static int fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    if (t->key_len == 6 && !memcmp(t->key, "poison", 6)) {
        send_msg(M_ATTEMPT, t->attempt, 0);
        kill(getpid(), SIGKILL);
        for (;;)
            pause();
    }
    return 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && errno == EINTR)
        ;
}

static void child(bool first)
{
    alarm(CHILD_SECONDS);
    tw_durable_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.fire = fire;
    cfg.max_attempts = max_attempts;
    if (redis_addr) {
        cfg.redis = redis_addr;
        cfg.redis_namespace = ns;
        cfg.shards = 4;
        cfg.horizon_ms = 200;
        /* Longer than a completion may wait for its batch (DONE_DELAY_MS,
         * 500 ms, src/redis_fire.c), or a completed timer would be
         * claimed again before its completion reached Redis. */
        cfg.lease_ms = 1500;
    } else {
        cfg.dir = dir;
    }
    tw_durable *d = NULL;
    int rc = tw_durable_open(&d, &cfg);
    if (rc) {
        send_msg(M_ERROR, 0, rc);
        _exit(2);
    }
    if (first) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t now = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
        /* One call: both are due in the same batch, and poison's
         * callback runs (and kills) before ok's starts (the wheel runs the
         * timers of one tick newest first; the test fails if ok ever
         * ends dead, which shows the order). */
        tw_durable_item it[2] = {{"ok", 2, now, "", 0, 0},
                                 {"poison", 6, now, "p", 1, 0}};
        if ((rc = redis_addr ? tw_durable_schedule_many(d, it + 1, 1)
                             : tw_durable_schedule_many(d, it, 2)) != 0) {
            send_msg(M_ERROR, 0, rc);
            _exit(2);
        }
    }
    for (;;) {
        tw_durable_info in;
        int pr = tw_durable_get(d, "poison", 6, &in, NULL, 0);
        tw_durable_info oin;
        int ok =
            redis_addr ? TW_ENOENT : tw_durable_get(d, "ok", 2, &oin, NULL, 0);
        if (ok == 0 && oin.state == TW_DURABLE_DEAD) {
            /* Killed with poison's crashes, though its callback never
             * started before them. */
            send_msg(M_ERROR, oin.attempt, -1001);
            _exit(2);
        }
        if (pr == 0 && in.state == TW_DURABLE_DEAD && ok == TW_ENOENT) {
            tw_durable_stats st;
            rc = tw_durable_stats_get(d, &st);
            if (rc == 0 && st.dead != 1)
                rc = -1000;
            send_msg(rc ? M_ERROR : M_DEAD, in.attempt, rc);
            _exit(tw_durable_close(d) ? 2 : 0);
        }
        if (pr && pr != TW_ENOENT) {
            send_msg(M_ERROR, 0, pr);
            _exit(2);
        }
        sleep_ms(5);
    }
}

int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--max") && i + 1 < argc)
            max_attempts = (uint32_t)atoi(argv[++i]);
        else if (!strcmp(argv[i], "poison") && i + 1 < argc)
            redis_addr = argv[++i];
    }
    if (redis_addr) {
        snprintf(ns, sizeof ns, "twpoison%ld", (long)getpid());
    } else {
        snprintf(dir, sizeof dir, "/tmp/twpoison.XXXXXX");
        ASSERT_NOT_NULL(mkdtemp(dir));
    }
    uint32_t seen[INCARNATIONS];
    int nseen = 0, kills = 0;
    bool dead = false;
    uint32_t dead_attempt = 0;
    for (int inc = 0; inc < INCARNATIONS && !dead; inc++) {
        int p[2];
        ASSERT_EQ(pipe(p), 0);
        pid_t pid = fork();
        ASSERT_GE(pid, 0);
        if (pid == 0) {
            close(p[0]);
            out_fd = p[1];
            child(inc == 0);
        }
        close(p[1]);
        struct msg m;
        while (read(p[0], &m, sizeof m) == (ssize_t)sizeof m) {
            if (m.type == M_ERROR) {
                fprintf(stderr, "child %d: error %d\n", inc, m.rc);
                ASSERT(0);
            }
            if (m.type == M_ATTEMPT && nseen < INCARNATIONS)
                seen[nseen++] = m.attempt;
            if (m.type == M_DEAD) {
                dead = true;
                dead_attempt = m.attempt;
            }
        }
        close(p[0]);
        int st;
        ASSERT_EQ(waitpid(pid, &st, 0), pid);
        if (WIFSIGNALED(st)) {
            ASSERT_EQ(WTERMSIG(st), SIGKILL); /* not the alarm */
            kills++;
        } else {
            ASSERT(WIFEXITED(st));
            ASSERT_EQ(WEXITSTATUS(st), 0);
        }
        fprintf(stderr, "incarnation %d: %s\n", inc,
                WIFSIGNALED(st) ? "killed in the callback" : "finished");
    }
    ASSERT(dead);
    ASSERT_EQ((uint32_t)kills, max_attempts);
    ASSERT_EQ((uint32_t)nseen, max_attempts);
    for (int i = 0; i < nseen; i++)
        ASSERT_EQ(seen[i], (uint32_t)i + 1);
    ASSERT_EQ(dead_attempt, max_attempts);
    if (!redis_addr) {
        /* The segment that holds the DEAD record says format 3 in its
         * header (journal.h): a twheel from before dead letters refuses
         * it instead of misreading it. */
        int v3 = 0;
        for (int no = 1; no < 100; no++) {
            char name[128];
            unsigned char hdr[12];
            snprintf(name, sizeof name, "%s/%010d.twj", dir, no);
            FILE *f = fopen(name, "rb");
            if (!f)
                continue;
            if (fread(hdr, 1, sizeof hdr, f) == sizeof hdr &&
                !memcmp(hdr, "TWJOURN1", 8) && hdr[8] == 3 && !hdr[9] &&
                !hdr[10] && !hdr[11])
                v3++;
            fclose(f);
        }
        ASSERT_GE(v3, 1);
        char cmd[96];
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        ASSERT_EQ(system(cmd), 0);
    }
    fprintf(stderr, "poison: %d kills, then a dead letter (attempts %u)\n",
            kills, dead_attempt);
    return 0;
}
