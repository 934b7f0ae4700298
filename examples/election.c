/* SPDX-License-Identifier: MIT */
/*
 * election - a Raft-style election timer on a RepeatedTimer.
 *
 * A follower runs an election timer: a tw_repeated whose adjust_timeout hook
 * randomizes every timeout into [timeout, 2 * timeout), as Raft does to
 * keep followers from standing for election at the same moment. A leader,
 * simulated by a fixed-rate task on the same tw_service, sends a heartbeat
 * every --heartbeat; each heartbeat calls tw_repeated_reset(), which pushes
 * the election back. After --leader-for the leader falls silent. The output
 * shows that the timer never fires while heartbeats arrive, and fires once,
 * between one and two timeouts after the last heartbeat, once they stop
 * (the follower then becomes leader and stops its election timer).
 *
 * Usage: election [--heartbeat DUR] [--timeout DUR] [--leader-for DUR]
 * Exit codes: 0 if the timer behaved as described (and for --help), 1 if
 * not, 2 on bad options.
 * Build: cc election.c $(pkg-config --cflags --libs twheel)
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <twheel/repeated.h>

#define MS UINT64_C(1000000)
#define MAX_DURATION_MS (UINT64_C(3600) * 1000)

/* Nanoseconds on CLOCK_MONOTONIC, the clock the service runs on. */
static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* "<integer>ms" or "<integer>s", 1 ms to an hour, into nanoseconds. */
static int parse_duration(const char *s, uint64_t *ns)
{
    char *end;
    unsigned long long v;

    if (s[0] < '0' || s[0] > '9')
        return -1;
    v = strtoull(s, &end, 10);
    if (strcmp(end, "s") == 0 && v <= MAX_DURATION_MS / 1000)
        v *= 1000;
    else if (strcmp(end, "ms") != 0)
        return -1;
    if (v == 0 || v > MAX_DURATION_MS)
        return -1;
    *ns = (uint64_t)v * MS;
    return 0;
}

struct node {
    uint64_t t0;
    uint64_t seed; /* for the randomized timeout; used under the timer's
                      own lock (adjust_timeout) */
    tw_repeated *election;
    atomic_uint_fast64_t heartbeats;
    atomic_uint_fast64_t last_heartbeat_ns;
    atomic_uint_fast64_t elections;
    atomic_uint_fast64_t election_ns;
    atomic_bool leader_silent;
    atomic_uint_fast64_t elections_while_heartbeats;
};

static uint64_t since(const struct node *n, uint64_t t)
{
    return (t - n->t0) / MS;
}

/* Raft's randomized election timeout: uniform in [timeout, 2 * timeout). */
static uint64_t randomize(tw_repeated *rt, uint64_t timeout, void *arg)
{
    struct node *n = arg;
    (void)rt;
    n->seed ^= n->seed << 13;
    n->seed ^= n->seed >> 7;
    n->seed ^= n->seed << 17;
    return timeout + n->seed % timeout;
}

/* The election timer fired: no heartbeat for a whole timeout. */
static void on_election_timeout(tw_repeated *rt, void *arg)
{
    struct node *n = arg;
    uint64_t now = now_ns();
    uint64_t last = atomic_load(&n->last_heartbeat_ns);

    if (!atomic_load(&n->leader_silent))
        atomic_fetch_add(&n->elections_while_heartbeats, 1);
    atomic_store(&n->election_ns, now);
    printf("t=%5" PRIu64 " ms  election timeout, %" PRIu64
           " ms after the last heartbeat: standing for election, "
           "becoming leader\n",
           since(n, now), (now - last) / MS);
    /* A leader needs no election timer (Raft would start its own
     * heartbeats here). */
    tw_repeated_stop(rt);
    atomic_fetch_add(&n->elections, 1);
}

/* The leader's heartbeat reaches the follower: push the election back. */
static void on_heartbeat(tw_id id, void *arg)
{
    struct node *n = arg;
    uint64_t count = atomic_fetch_add(&n->heartbeats, 1) + 1;
    uint64_t now = now_ns();

    (void)id;
    atomic_store(&n->last_heartbeat_ns, now);
    tw_repeated_reset(n->election, 0);
    if (count % 5 == 1)
        printf("t=%5" PRIu64 " ms  heartbeat %" PRIu64
               ": election timer reset (elections so far: %" PRIu64 ")\n",
               since(n, now), count, (uint64_t)atomic_load(&n->elections));
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: election [--heartbeat DUR] [--timeout DUR] "
            "[--leader-for DUR]\n"
            "  DUR is an integer followed by ms or s; the heartbeat must be "
            "shorter than the timeout.\n"
            "  Defaults: --heartbeat 50ms --timeout 150ms --leader-for 1s\n");
}

static int bad_option(const char *opt, const char *val)
{
    fprintf(stderr, "election: bad %s '%s'\n", opt, val ? val : "(missing)");
    usage(stderr);
    return 2;
}

int main(int argc, char **argv)
{
    static struct node node;
    struct node *n = &node;
    uint64_t heartbeat = 50 * MS, timeout = 150 * MS, leader_for = 1000 * MS;
    tw_service_config scfg = {.tick_ns = MS};
    tw_service *s = NULL;
    tw_id hb = 0;
    uint64_t stop_ns, gap;
    bool ok;

    static const struct option opts[] = {
        {"heartbeat", required_argument, NULL, 'b'},
        {"timeout", required_argument, NULL, 't'},
        {"leader-for", required_argument, NULL, 'l'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};
    int c;

    while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        uint64_t *dst = c == 'b'   ? &heartbeat
                        : c == 't' ? &timeout
                        : c == 'l' ? &leader_for
                                   : NULL;
        if (c == 'h') {
            usage(stdout);
            return 0;
        }
        if (dst == NULL) /* getopt_long has said what was wrong */
            return bad_option("option", argv[optind - 1]);
        if (parse_duration(optarg, dst) != 0)
            return bad_option(opts[c == 'b'   ? 0
                                   : c == 't' ? 1
                                              : 2]
                                  .name,
                              optarg);
    }
    if (optind < argc)
        return bad_option("argument", argv[optind]);
    if (heartbeat >= timeout)
        return bad_option("--heartbeat", "not shorter than --timeout");
    setvbuf(stdout, NULL, _IOLBF, 0);

    n->t0 = now_ns();
    n->seed = n->t0 | 1;
    atomic_store(&n->last_heartbeat_ns, n->t0);
    tw_repeated_config ecfg = {"election", timeout, on_election_timeout,
                               randomize,  NULL,    n};
    if (tw_service_create(&s, &scfg) != 0 ||
        tw_repeated_create(&n->election, s, &ecfg) != 0 ||
        tw_repeated_start(n->election) != 0 ||
        tw_schedule_fixed_rate(s, on_heartbeat, n, heartbeat, heartbeat, &hb) !=
            0) {
        fprintf(stderr, "election: setup failed\n");
        return 1;
    }
    printf("t=    0 ms  follower: election timeout %" PRIu64 "..%" PRIu64
           " ms (randomized), leader heartbeat every %" PRIu64
           " ms for %" PRIu64 " ms\n",
           timeout / MS, 2 * timeout / MS - 1, heartbeat / MS, leader_for / MS);

    usleep((useconds_t)(leader_for / 1000));
    atomic_store(&n->leader_silent, true);
    tw_cancel_wait(s, hb); /* the leader falls silent */
    stop_ns = now_ns();
    printf("t=%5" PRIu64 " ms  leader silent after %" PRIu64
           " heartbeats; elections while they arrived: %" PRIu64 "\n",
           since(n, stop_ns), (uint64_t)atomic_load(&n->heartbeats),
           (uint64_t)atomic_load(&n->elections_while_heartbeats));

    /* Wait for the election (generously), then as long again for a second
     * one that must not come. */
    for (int i = 0; i < 1000 && atomic_load(&n->elections) == 0; i++)
        usleep((useconds_t)(timeout / 1000 / 50 + 1));
    usleep((useconds_t)(2 * timeout / 1000));
    tw_repeated_destroy(n->election);
    tw_service_destroy(s);

    gap =
        atomic_load(&n->election_ns) > atomic_load(&n->last_heartbeat_ns)
            ? atomic_load(&n->election_ns) - atomic_load(&n->last_heartbeat_ns)
            : 0;
    ok = atomic_load(&n->elections_while_heartbeats) == 0 &&
         atomic_load(&n->elections) == 1 && gap >= timeout;
    printf("result: %s: %" PRIu64
           " election(s) while heartbeats arrived, %" PRIu64
           " after they stopped, %" PRIu64
           " ms after the last one (timeout %" PRIu64 "..%" PRIu64 " ms)\n",
           ok ? "ok" : "UNEXPECTED",
           (uint64_t)atomic_load(&n->elections_while_heartbeats),
           (uint64_t)(atomic_load(&n->elections) -
                      atomic_load(&n->elections_while_heartbeats)),
           gap / MS, timeout / MS, 2 * timeout / MS - 1);
    return ok ? 0 : 1;
}
