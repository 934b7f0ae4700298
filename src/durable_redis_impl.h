/* SPDX-License-Identifier: MIT */
/*
 * src/durable_redis_impl.h - what the files of the Redis backend share
 * (src/durable_redis.c says which file does what): the handle struct rd,
 * a claimed timer (struct rtimer), a group of shards and its threads
 * (struct grp), a script call (struct call), the clocks, and the
 * functions one file calls in another. Locks: d->op_mu[g] (held while
 * a combined batch of group g runs, src/durable_redis.c; one at a time)
 * is taken before d->mu, never after; d->mu guards the wheel,
 * the timers' lists, the groups' queues and the counters; the executor
 * (d->exec) is called with neither held.
 */
#ifndef TWHEEL_DURABLE_REDIS_IMPL_H
#define TWHEEL_DURABLE_REDIS_IMPL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "common.h"
#include "durable_backend.h"
#include "durable_combine.h"
#include "durable_exec.h"
#include "redis_client.h"
#include "redis_owner.h"
#include "redis_scripts.h"

#define GROUPS_MAX 16 /* worker threads: one per master, at most */

/* A claimed timer in the node's wheel: the key, then the payload. */
struct rtimer {
    tw_timer tm;
    struct rtimer *next;            /* due list */
    struct rtimer *hnext, **hpprev; /* held list */
    struct rd *d;
    uint32_t shard, attempt;
    bool fired; /* its callback has started (stats: not backlog) */
    int64_t due_ms;
    uint64_t token;
    uint64_t ver;    /* :v of its shard when it was last known to be ours */
    bool full;       /* :v moved since: the next check reads its score */
    uint64_t chk_at; /* real monotonic ms: its last check was sent then */
    uint64_t epoch;  /* the shard's epoch when its owner claimed it, or 0 */
    uint64_t dl;     /* monotonic ms (rd_mono_ms): never fired from then on
                        (its claim may have run out); 0 = no limit */
    struct tw__durable_job job; /* its delivery while on the executor */
    size_t key_len, payload_len;
    char data[];
};

/* A callback's result waiting for its DONE (firer thread only). */
struct done {
    struct rtimer *r;
    int res;
};

/* The shards whose master is one node, and the thread that talks to it
 * for them: claims, checks and completions. A master that stalls holds
 * only its own group's thread (see src/redis_fire.c). */
struct grp {
    struct rd *d;
    pthread_t thr, cthr; /* checks and completions; claims */
    bool started, quit;  /* quit: stop its worker alone */
    pthread_cond_t cv, ccv;
    struct rtimer *todo; /* due timers to check, from the firer (mu) */
    struct done *pend;   /* callbacks done, DONE not yet sent (mu) */
    size_t npend, cap_pend;
    uint64_t pend_due;     /* mono ms: send the completions by then */
    uint32_t claim_rounds; /* its claimer's own: CLAIM rounds so far */
};

/* Every this many CLAIM rounds of a group (the first included), its CLAIM
 * calls also look for scores no script writes (src/redis_scripts.c):
 * two range reads a shard that find nothing unless data is damaged. */
#ifndef DAMAGE_SCAN_ROUNDS
#define DAMAGE_SCAN_ROUNDS 8
#endif

struct shard_keys {
    char name[NKEYS][96];
    size_t len[NKEYS];
    int slot;
};

/* The shortest time between two batches of claim checks, ms, unless
 * cfg.redis_check_gap_ms says otherwise (src/redis_fire.c). */
#ifndef CHECK_GAP_MS
#define CHECK_GAP_MS 4
#endif

struct rd {
    struct tw_durable base;
    tw__rc *rc;
    tw__own *own; /* shard ownership (cfg.redis_shard_lease_ms), or NULL */
    uint32_t shards, horizon_ms, lease_ms, wait_replicas, wait_timeout_ms;
    tw_durable_fire_fn fire;
    void *fire_arg;
    int64_t (*wall_fn)(void *);
    uint64_t (*mono_fn)(void *);
    void *clock_arg;
    char sha[S_COUNT][41];
    struct shard_keys *sk;

    /* One-per-call operations (op_run()), combined per group (master):
     * a stalled master holds only the batches of its own shards. */
    pthread_mutex_t op_mu[GROUPS_MAX];    /* held while a batch runs */
    struct tw__combiner comb[GROUPS_MAX]; /* by d->grp_of[] of the key */

    pthread_mutex_t mu;
    pthread_cond_t cv, claim_cv; /* the firer's, the topology thread's */
    tw_wheel *wheel;             /* ticks: monotonic ms; under mu */
    struct rtimer *due;          /* filled by the wheel's callbacks */
    struct rtimer *held;         /* every rtimer alive */
    struct rtimer *ready; /* checked, waiting for their due time (firer) */
    bool stop, gstop;     /* stop the firer and topology; then the groups */
    bool thr_on, claimer_on;
    bool no_mget; /* MGET refused (an ACL without it): GET per shard (mu) */
    pthread_t thr, claimer;
    struct grp grp[GROUPS_MAX];
    uint8_t *grp_of;     /* per shard: its group (mu) */
    int64_t *claim_idle; /* per shard: its CLAIM may be left out of a round
                            before this wall ms (mu); src/redis_fire.c */
    char grp_name[GROUPS_MAX][64]; /* "host:port" of each group's master */
    uint32_t ngrp;
    uint64_t next_check;   /* no claim check before (real monotonic ms) */
    uint32_t check_gap_ms; /* cfg.redis_check_gap_ms, else CHECK_GAP_MS */
    uint64_t cancelled;
    struct tw__durable_counts counts; /* fired, retried, running, late */
    uint64_t cb_start;       /* rd_mono_ms when the last callback began, or 0
                                when none runs; under mu */
    uint32_t shard_lease_ms; /* cfg.redis_shard_lease_ms */
    /* The callbacks' executor (cfg.executor_threads; 0: they run on the
     * firer thread), src/durable_exec.h. */
    struct tw__durable_exec exec;
    uint32_t nexec;
    struct tw__retry retry; /* cfg's retry policy */
    /* TW_DURABLE_NOFIRE: no threads, nothing claimed or delivered; a
     * schedule is refused (SCHED claims what is due soon at once). */
    bool nofire;
    /* Error replies to the background work (claims, checks, completions;
     * tw__rd_bg_errors(), src/redis_fire.c): how many, cfg.on_error, and
     * the real monotonic ms before which it is not called again. */
    _Atomic uint64_t errors, err_quiet_until;
    void (*on_error)(void *arg, int code, const char *msg);
    void *on_error_arg;
};

/* The most a call takes: CLAIM with its fence, 3 + NKEYS + 2 + 6. */
#define CALL_ARGS 17
struct call {
    const char *argv[CALL_ARGS];
    size_t len[CALL_ARGS];
    char num[6][24];
    int argc, nnum, script;
    uint32_t shard;
    char fence[TW__OWN_FENCE_MAX]; /* tw__rd_call_fence */
    uint64_t epoch;
};

/* A value of :p, "due,attempt,payload". */
struct pval {
    int64_t due;
    uint32_t attempt;
    const char *payload;
    size_t len;
};

/* ------------------------------------------------------------------------ */
/* Clocks. Due times are any int64 (the whole range, as for the journal);
 * every sum with one saturates instead of overflowing. */

static inline int64_t sat_add(int64_t a, int64_t b)
{
    int64_t r;
    if (__builtin_add_overflow(a, b, &r))
        return b > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

/* @a - @b, saturated. */
static inline int64_t sat_sub(int64_t a, int64_t b)
{
    int64_t r;
    if (__builtin_sub_overflow(a, b, &r))
        return b < 0 ? INT64_MAX : INT64_MIN;
    return r;
}

static inline int64_t rd_wall(struct rd *d)
{
    return d->wall_fn(d->clock_arg);
}

/* The monotonic clock in ms, never the hook's: for pacing I/O. */
static inline uint64_t real_mono_ms(void)
{
    return tw__clock_ns(CLOCK_MONOTONIC) / 1000000u;
}

/* The wall clock in us (the hook's ms when one is set). */
static inline int64_t rd_wall_us(struct rd *d)
{
    if (d->wall_fn != tw__durable_real_wall_ms)
        return d->wall_fn(d->clock_arg) * 1000;
    return (int64_t)(tw__clock_ns(CLOCK_REALTIME) / 1000u);
}

static inline uint64_t rd_mono_ms(struct rd *d)
{
    return d->mono_fn(d->clock_arg) / 1000000u;
}

static inline uint32_t shard_of(const struct rd *d, const void *key, size_t len)
{
    const unsigned char *p = key;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return (uint32_t)(h % d->shards);
}

static inline uint64_t reply_u64(const redisReply *r)
{
    if (!r)
        return 0;
    if (r->type == REDIS_REPLY_INTEGER)
        return r->integer > 0 ? (uint64_t)r->integer : 0;
    if (r->type == REDIS_REPLY_STRING && r->str)
        return strtoull(r->str, NULL, 10);
    return 0;
}

/* Which master holds each shard (CLUSTER SLOTS) into d->grp_of
 * (src/redis_groups.c). */
void tw__rd_grp_refresh(struct rd *d);

/* A write of this node may have put a waiting key into @shard's :d: its
 * next CLAIM round includes it (src/redis_fire.c, idle shards). mu held. */
static inline void claim_soon_locked(struct rd *d, uint32_t shard)
{
    d->claim_idle[shard] = 0;
}

static inline void call_arg(struct call *c, const void *p, size_t n)
{
    c->argv[c->argc] = n ? p : "";
    c->len[c->argc++] = n;
}

static inline void call_num(struct call *c, long long v)
{
    char *b = c->num[c->nnum++];
    int n = snprintf(b, 24, "%lld", v);
    call_arg(c, b, (size_t)n);
}

/* ------------------------------------------------------------------------ */
/* What the files of the backend share. */

/* Script calls (src/redis_call.c). */
void tw__rd_script_head(const struct rd *d, const char **av, size_t *al,
                        int script, uint32_t shard);
void tw__rd_call_init(struct rd *d, struct call *c, int script, uint32_t shard);
bool tw__rd_call_fence(struct rd *d, struct call *c);
void tw__rd_put_nums(const char **argv, size_t *len, char (*num)[24],
                     const long long *v, size_t n);
int tw__rd_run_cmds(struct rd *d, tw__rc_cmd *cmds, const int *script,
                    size_t n);
/* Count and tell (cfg.on_error) the error replies among @cmds[0..n) of
 * the background work of group @g (claims, claim checks, completions):
 * @script[i] the script command i ran (S_*) or < 0 for a plain command;
 * @script NULL: all ran script @one. An MGET's error is not counted (the
 * checks fall back to GET). Call without mu. src/redis_errors.c. */
void tw__rd_bg_errors(struct rd *d, const struct grp *g, const tw__rc_cmd *cmds,
                      const int *script, int one, size_t n);
/* The same for the ownership rounds' commands @cmds[0..n) (every error
 * reply counts; told as "shard ownership"); @arg the store. The hook of
 * tw__own_open(). src/redis_errors.c. */
void tw__rd_own_errors(void *arg, const tw__rc_cmd *cmds, size_t n);
/* The error replies among a caller's reads @cmds[0..n) (not WRONGTYPE:
 * damage, read as 0) counted in d->errors; returns TW_EAUTH if one was a
 * refusal (NOPERM...), TW_EIO for another error, else 0.
 * src/redis_errors.c. */
int tw__rd_read_errors(struct rd *d, const tw__rc_cmd *cmds, size_t n);
/* The keys of the CLAIM replies @cmds[0..n) (of @calls) found in a shard
 * they do not hash to: each value set aside in that shard's :q as
 * w:<key>, counted (stats.quarantined) and told (cfg.on_error, TW_EIO);
 * claim_reply() queued their removal (a DONE). Without mu.
 * src/redis_errors.c. */
void tw__rd_set_aside_wrong(struct rd *d, const struct call *calls,
                            const tw__rc_cmd *cmds, size_t n);
int tw__rd_run_calls(struct rd *d, struct call *calls, tw__rc_cmd *cmds,
                     size_t n);
void tw__rd_wait_many(struct rd *d, const uint32_t *shard, int *rc, size_t n);
int tw__rd_call_int(struct rd *d, struct call *c, long long *out);
bool tw__rd_parse_val(const char *s, size_t n, struct pval *v);

/* One array of a block that tw__rd_alloc_parts() allocates: @out is the
 * address of the array's pointer (of any object type). */
struct tw__rd_part {
    void *out;
    size_t count, size;
};
void *tw__rd_alloc_parts(const struct tw__rd_part *parts, size_t n);

/* What an open checks (src/redis_checks.c): the keys reachable, the
 * namespace's record (its shard count into d->shards when @adopt), the
 * keys' types (reports through cfg.on_damage), every command allowed.
 * 0 or a code, its message in @eb (cfg.errbuf) for the record, in the
 * client's last error for the others. tw__rd_probe_perms() runs again
 * after open when a background call is refused (src/redis_errors.c), to
 * name the command. */
int tw__rd_probe_keys(struct rd *d);
int tw__rd_meta(struct rd *d, const char *ns, bool ro, bool adopt, char *eb,
                size_t el);
int tw__rd_type_scan(struct rd *d, const tw_durable_config *cfg);
int tw__rd_probe_perms(struct rd *d, const char *ns);

/* Local timers, claiming and firing (src/redis_fire.c). */
struct rtimer *tw__rd_rt_new(struct rd *d, uint32_t shard, const void *key,
                             size_t key_len, const void *payload,
                             size_t payload_len, int64_t due, uint64_t token,
                             uint32_t attempt);
void tw__rd_rt_arm_locked(struct rd *d, struct rtimer *r, int64_t wall,
                          uint64_t mono);
void tw__rd_rt_free_locked(struct rd *d, struct rtimer *r);
int tw__rd_start(struct rd *d);
void tw__rd_stop(struct rd *d);
int tw__rd_touch(tw_durable *base, const void *key, size_t key_len);
/* Queue the completion of @r with result @res for its group's next DONE
 * (mu held). src/redis_fire.c. */
void tw__rd_pend_add(struct rd *d, struct rtimer *r, int res);
/* A group's claimer thread (@arg: its struct grp). src/redis_claim.c. */
void *tw__rd_group_claim(void *arg);

/* Look-ups and listings (src/redis_query.c). */
int tw__rd_get(tw_durable *base, const void *key, size_t key_len,
               tw_durable_info *info, void *buf, size_t buf_len);
int tw__rd_list(tw_durable *base, const struct tw__list_req *q,
                tw_durable_entry *out, bool *end);
int tw__rd_list_dead(tw_durable *base, const struct tw__list_req *q,
                     tw_durable_entry *out, bool *end);
long tw__rd_scan(tw_durable *base, tw_durable_scan_fn fn, void *arg);
int tw__rd_restore(tw_durable *base, const tw_durable_scanned *t);
int tw__rd_dead_op(tw_durable *base, const void *key, size_t key_len,
                   int64_t due_ms, bool del);

#endif
