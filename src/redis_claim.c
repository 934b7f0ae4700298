/* SPDX-License-Identifier: MIT */
/*
 * src/redis_claim.c - the Redis backend's claimers: one thread per group
 * of shards (the shards of one master, src/redis_groups.c) that runs
 * CLAIM on them every horizon/4 and puts the timers it gets into the
 * node's wheel, where src/redis_fire.c checks and fires them (its top
 * comment has the design: what a claim is, its token and its lease).
 *
 * Idle shards. Without ownership, a shard with nothing to claim is left
 * out of the rounds until its first waiting key nears the horizon, and
 * for at most horizon / CLAIM_IDLE_MAX (claim_idle_locked()).
 *
 * Chunks. A round goes to the master in round trips of about
 * CLAIM_CHUNK_KEYS keys, each shard weighed by what its last CLAIM took
 * (claim_chunk()): the group's checks and completions share the node's
 * connection to that master (src/redis_batch.c), and Redis runs one
 * client's whole pipeline before it serves another, so a check waits
 * behind one chunk, not behind the round.
 *
 * Threads: each group's claimer runs alone on its shards; it takes the
 * backend's mu to put timers in the wheel.
 */
#define _GNU_SOURCE

#include <stdlib.h>

#include "durable_redis_impl.h"

#define CLAIM_MAX 1000
/* A claim round goes in round trips of about this many keys
 * (claim_group()); a shard counts as at least CLAIM_WEIGHT_MIN. */
#ifndef CLAIM_CHUNK_KEYS
#define CLAIM_CHUNK_KEYS 256
#endif
#define CLAIM_WEIGHT_MIN 32
/* An idle shard is left out of the claim rounds for at most horizon /
 * CLAIM_IDLE_MAX (claim_idle_locked()). */
#define CLAIM_IDLE_MAX 2

/* The CLAIM calls of group @g's shards into @calls (at most d->shards),
 * fenced by ownership when it is on (a shard not this node's is left
 * out), every DAMAGE_SCAN_ROUNDS-th round with the scan for damaged
 * scores; how many. */
static size_t claim_calls(struct rd *d, struct grp *g, struct call *calls,
                          int64_t now)
{
    size_t n = 0;
    bool scan = g->claim_rounds++ % DAMAGE_SCAN_ROUNDS == 0;
    pthread_mutex_lock(&d->mu);
    for (uint32_t s = 0; s < d->shards; s++)
        if (&d->grp[d->grp_of[s]] == g &&
            (scan || d->own || now >= d->claim_idle[s]))
            calls[n++].shard = s;
    pthread_mutex_unlock(&d->mu);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = calls[i].shard;
        calls[m].shard = s;
        tw__rd_call_init(d, &calls[m], S_CLAIM, s);
        calls[m].epoch = 0;
        if (d->own && !tw__rd_call_fence(d, &calls[m]))
            continue; /* not this node's shard */
        struct call *c = &calls[m++];
        call_num(c, now);
        call_num(c, sat_add(now, d->horizon_ms));
        call_num(c, d->lease_ms);
        call_num(c, CLAIM_MAX);
        call_num(c, scan);
        call_num(c, !d->own); /* next: the first waiting key, when idle */
    }
    return m;
}

/* Shard @s had nothing to claim in the round of @now; @r is CLAIM's {} or
 * {score of its first waiting key past the horizon}. Without ownership,
 * the shard is left out of the rounds (but not the damage scans) until
 * that key is within the horizon, and for at most CLAIM_IDLE_MAX of the
 * horizon: a key that another node schedules past the horizon is still
 * claimed at least a quarter of the horizon before its due time, and a
 * claim of a dead node is taken back at most that much later than
 * before. A write of this node to the shard ends it at once
 * (claim_soon_locked()). mu held. */
static void claim_idle_locked(struct rd *d, uint32_t s, const redisReply *r,
                              int64_t now)
{
    int64_t until = sat_add(now, d->horizon_ms / CLAIM_IDLE_MAX);
    if (r->elements == 1 && r->element[0]->type == REDIS_REPLY_STRING) {
        double next = strtod(r->element[0]->str, NULL) - d->horizon_ms;
        if (next < (double)until)
            until = next > (double)now ? (int64_t)next : now;
    }
    d->claim_idle[s] = until;
}

/* The timers of one CLAIM reply @r (of call @c, sent at @csent, real
 * monotonic ms, with "now" @now) into the wheel; true when the shard had
 * more. mu held. */
static bool claim_reply(struct rd *d, const struct call *c, const redisReply *r,
                        int64_t now, uint64_t csent, int64_t wall,
                        uint64_t mono)
{
    if (!r || r->type != REDIS_REPLY_ARRAY)
        return false;
    if (r->elements <= 1) {
        claim_idle_locked(d, c->shard, r, now);
        return false;
    }
    uint64_t ver = reply_u64(r->element[1]);
    for (size_t i = 2; i + 3 <= r->elements; i += 3) {
        redisReply **e = r->element + i;
        struct pval v;
        if (e[0]->type != REDIS_REPLY_STRING ||
            e[2]->type != REDIS_REPLY_STRING ||
            !tw__rd_parse_val(e[2]->str, e[2]->len, &v))
            continue;
        struct rtimer *t =
            tw__rd_rt_new(d, c->shard, e[0]->str, e[0]->len, v.payload, v.len,
                          v.due, reply_u64(e[1]), v.attempt);
        if (!t) /* the lease expires and the timer comes back */
            continue;
        t->ver = ver;
        t->epoch = c->epoch;
        if (shard_of(d, t->data, t->key_len) != c->shard) {
            /* A copy in the wrong shard: removed (DONE), not delivered;
             * tw__rd_set_aside_wrong() keeps its value. */
            t->fired = true;
            tw__rd_pend_add(d, t, 0);
            continue;
        }
        if (t->epoch) /* the local image of its claim's end */
            t->dl = csent + (uint64_t)(v.due > now ? sat_sub(v.due, now) : 0) +
                    d->lease_ms - d->lease_ms / 5;
        tw__rd_rt_arm_locked(d, t, wall, mono);
    }
    return reply_u64(r->element[0]) != 0;
}

/* How many of the CLAIM calls @calls[0..n) (at least one) go in one round
 * trip: shards are added while the keys they are expected to claim stay
 * below CLAIM_CHUNK_KEYS. A shard is expected to take what it took in its
 * last CLAIM (@last, NULL: nothing), or @avg (what the shards of this round
 * took so far, on average) if that is more, and at least
 * CLAIM_WEIGHT_MIN: after a quiet spell, the round's first chunk holds
 * CLAIM_CHUNK_KEYS / CLAIM_WEIGHT_MIN shards and the next ones follow
 * what those took. */
static size_t claim_chunk(const struct call *calls, size_t n,
                          const uint32_t *last, uint32_t avg)
{
    size_t i = 0, w = 0;
    while (i < n && (i == 0 || w < CLAIM_CHUNK_KEYS)) {
        uint32_t k = last ? last[calls[i].shard] : 0;
        k = k > avg ? k : avg;
        w += k > CLAIM_WEIGHT_MIN ? k : CLAIM_WEIGHT_MIN;
        i++;
    }
    return i;
}

/* How many timers a CLAIM reply @r holds. */
static uint32_t claimed(const redisReply *r)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements < 2)
        return 0;
    return (uint32_t)((r->elements - 2) / 3);
}

/* Run the @n CLAIM calls of one chunk (built at @now, the round's first
 * sent at @csent) and take their timers; *@more when a shard had more,
 * @last[shard] (unless NULL) what each took, *@took the sum. False if a call
 * got no reply (the rest of
 * the round waits for the next one, rather than for one time-out a
 * chunk). */
static bool claim_run(struct rd *d, struct grp *g, struct call *calls,
                      tw__rc_cmd *cmds, size_t n, int64_t now, uint64_t csent,
                      uint32_t *last, bool *more, uint64_t *took)
{
    bool ok = tw__rd_run_calls(d, calls, cmds, n) != TW_ENOMEM;
    tw__rd_bg_errors(d, g, cmds, NULL, S_CLAIM, n);
    int64_t wall = rd_wall(d);
    uint64_t mono = rd_mono_ms(d);
    pthread_mutex_lock(&d->mu);
    for (size_t c = 0; c < n; c++) {
        *more |=
            claim_reply(d, &calls[c], cmds[c].reply, now, csent, wall, mono);
        uint32_t k = claimed(cmds[c].reply);
        *took += k;
        if (last)
            last[calls[c].shard] = k;
        ok &= !cmds[c].err;
    }
    pthread_mutex_unlock(&d->mu);
    tw__rd_set_aside_wrong(d, calls, cmds, n);
    return ok;
}

/* CLAIM on the shards of group @g, in chunks of about CLAIM_CHUNK_KEYS
 * keys, one round trip each (@last: what each shard took in its last
 * CLAIM). The node's connection to the master is shared with the checks
 * and completions, and Redis runs a client's whole pipeline before it
 * serves another client, so a check waits for at most one chunk, not for
 * the round (a round of 64 shards with 150 keys each held the checks for
 * tens of ms). The leases of a later chunk are counted from the round's
 * first send, so the node's image of them ends early, never late.
 * Returns true when some shard had more. */
static bool claim_group(struct rd *d, struct grp *g, uint32_t *last)
{
    size_t n = 0;
    struct call *calls = tw__malloc(d->shards * sizeof *calls);
    tw__rc_cmd *cmds = tw__calloc(d->shards, sizeof *cmds);
    bool more = false;
    if (calls && cmds) {
        int64_t now = rd_wall(d);
        n = claim_calls(d, g, calls, now);
        uint64_t csent = rd_mono_ms(d);
        uint64_t took = 0;
        for (size_t i = 0, k; i < n; i += k) {
            k = claim_chunk(calls + i, n - i, last,
                            i ? (uint32_t)(took / i) : 0);
            if (!claim_run(d, g, calls + i, cmds + i, k, now, csent, last,
                           &more, &took))
                break;
        }
    }
    if (cmds)
        tw__rc_free_replies(cmds, n);
    tw__free(calls);
    tw__free(cmds);
    return more;
}

/* A group's claimer: CLAIM on its shards every horizon/4 (idle ones less
 * often; at once again when a shard had more than CLAIM_MAX due), on its
 * own thread so that
 * checks never wait for a claim round trip. */
void *tw__rd_group_claim(void *arg)
{
    struct grp *g = arg;
    struct rd *d = g->d;
    uint64_t period = d->horizon_ms / 4 ? d->horizon_ms / 4 : 1;
    /* Per shard: how many timers its last CLAIM took (claim_chunk()). */
    uint32_t *last = tw__calloc(d->shards, sizeof *last);
    pthread_mutex_lock(&d->mu);
    while (!d->stop) {
        pthread_mutex_unlock(&d->mu);
        bool more = claim_group(d, g, last);
        pthread_mutex_lock(&d->mu);
        if (more || d->stop)
            continue;
        struct timespec ts;
        tw__mono_after(&ts, (uint64_t)period * 1000000u);
        pthread_cond_timedwait(&g->ccv, &d->mu, &ts);
    }
    pthread_mutex_unlock(&d->mu);
    tw__free(last);
    return NULL;
}
