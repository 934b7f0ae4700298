/* SPDX-License-Identifier: MIT */
/*
 * src/durable_redis.c - the Redis backend of twheel/durable.h: open,
 * schedule and cancel (with the combiner of one-per-call operations),
 * stats, close.
 *
 * The backend in files, in the order a timer goes through them:
 *   src/redis_scripts.[ch]    the Lua scripts and the data model they keep
 *                             in Redis (a shard's keys, tokens, versions,
 *                             dead letters, quarantine)
 *   src/durable_redis.c       this file: open, schedule/cancel, stats,
 *                             close
 *   src/redis_checks.c        what an open checks: the namespace's
 *                             record, the keys' types, permissions
 *   src/redis_call.c          the script calls every part sends: a
 *                             shard's keys, its fence, pipelined runs,
 *                             WAIT for replicas
 *   src/redis_eval.[ch]       loading scripts, EVALSHA and NOSCRIPT ->
 *                             EVAL (the one copy, ownership's too)
 *   src/redis_owner.[ch]      fenced shard ownership
 *                             (cfg.redis_shard_lease_ms)
 *   src/redis_fire.c          claiming, checking, firing, completing
 *   src/redis_groups.c        which master holds each shard (the groups)
 *   src/redis_query.c         get, list, scan, dead letters
 *   src/durable_redis_impl.h  struct rd and what the files share
 *   src/redis_client.[ch]     the connections (hiredis protocol, cluster
 *                             routing, Sentinel, TLS; its files are listed
 *                             in src/redis_client_impl.h)
 * Calls between them go one way (docs/architecture.md draws it): this
 * file calls the others, src/redis_fire.c and src/redis_query.c call
 * src/redis_call.c, and nothing calls back into this file.
 *
 * Schedules. tw_durable_schedule_many groups its items by shard: one SCHED
 * call per shard (up to SCHED_CHUNK items), all calls pipelined, one round
 * trip per Redis node. tw_durable_schedule and tw_durable_cancel from many
 * threads are combined (src/durable_combine.h): the calls queued while a
 * batch is in flight become the next batch (op_run()); on one server (not
 * a cluster), so are tw_durable_schedule_many calls (rd_schedule_many()).
 * SCHED moves :v when one of its keys existed (HSET counts the new
 * fields), CANCEL when it removed a key.
 *
 * Due times. Any int64: a due time the wall clock has reached fires at
 * once (INT64_MIN included) and one it has not stays pending (INT64_MAX
 * in practice forever), as in the journal. The value keeps the due time
 * exactly; the score of a waiting key is max(due, 0) (a negative score is
 * a claim), a double, exact below 2^53. Tokens and versions need the wall
 * clock below 2^53 / 1024 ms (the year 2248). Local arithmetic on due
 * times saturates (sat_add).
 */
#define _GNU_SOURCE

#include <stdlib.h>

#include "durable_redis_impl.h"
#include "redis_eval.h"

/* ------------------------------------------------------------------------ */
/* Open. */

static const struct tw_durable_ops rd_ops;
static void rd_free(struct rd *d);
static void op_round(struct tw__combine_req *first, void *ctx);

/* A handle with @cfg's settings (defaults filled in); NULL when out of
 * memory. */
static struct rd *rd_new(const tw_durable_config *cfg)
{
    struct rd *d = tw__calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->base.ops = &rd_ops;
    d->shards = cfg->shards ? cfg->shards : 64;
    d->horizon_ms = cfg->horizon_ms ? cfg->horizon_ms : 2000;
    d->lease_ms = cfg->lease_ms ? cfg->lease_ms : 30000;
    d->shard_lease_ms = cfg->redis_shard_lease_ms;
    d->check_gap_ms =
        cfg->redis_check_gap_ms ? cfg->redis_check_gap_ms : CHECK_GAP_MS;
    if (cfg->redis_shard_lease_ms && cfg->redis_shard_lease_ms < d->lease_ms)
        d->lease_ms = cfg->redis_shard_lease_ms;
    d->wait_replicas = cfg->wait_replicas;
    d->wait_timeout_ms = cfg->wait_timeout_ms ? cfg->wait_timeout_ms : 1000;
    d->fire = cfg->fire;
    d->fire_arg = cfg->fire_arg;
    d->on_error = cfg->on_error;
    d->on_error_arg = cfg->on_error_arg;
    d->nexec = cfg->executor_threads;
    tw__retry_init(&d->retry, cfg);
    /* The clock defaults of every backend (src/durable.c). */
    d->wall_fn = cfg->wall_ms ? cfg->wall_ms : tw__durable_real_wall_ms;
    d->mono_fn = cfg->mono_ns ? cfg->mono_ns : tw__durable_real_mono_ns;
    d->clock_arg = cfg->clock_arg;
    pthread_mutex_init(&d->mu, NULL);
    for (int g = 0; g < GROUPS_MAX; g++) {
        pthread_mutex_init(&d->op_mu[g], NULL);
        tw__combine_init(&d->comb[g], &d->op_mu[g], op_round, NULL, d);
    }
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&d->cv, &ca);
    pthread_cond_init(&d->claim_cv, &ca);
    for (int g = 0; g < GROUPS_MAX; g++) {
        d->grp[g].d = d;
        pthread_cond_init(&d->grp[g].cv, &ca);
        pthread_cond_init(&d->grp[g].ccv, &ca);
    }
    pthread_condattr_destroy(&ca);
    d->grp_of = tw__calloc(d->shards, 1);
    d->claim_idle = tw__calloc(d->shards, sizeof *d->claim_idle);
    if (!d->grp_of || !d->claim_idle) {
        rd_free(d);
        return NULL;
    }
    return d;
}

/* The names and slots of every shard's keys. */
static int rd_keys(struct rd *d, const char *ns)
{
    if (d->shards > 1u << 20)
        return TW_EINVAL;
    d->sk = tw__calloc(d->shards, sizeof *d->sk);
    if (!d->sk)
        return TW_ENOMEM;
    for (uint32_t s = 0; s < d->shards; s++) {
        for (int k = 0; k < NKEYS; k++)
            d->sk[s].len[k] =
                (size_t)snprintf(d->sk[s].name[k], sizeof d->sk[s].name[k],
                                 "{%s:%u}:%c", ns, s, tw__redis_key_suffix[k]);
        d->sk[s].slot = tw__rc_slot(d->sk[s].name[0], d->sk[s].len[0]);
    }
    return 0;
}

/* Can this node deliver its shards' timers? Not while callbacks have
 * held every thread that runs them (the firer, or all executor_threads)
 * for half a shard lease: the node then stops renewing its ownership, so
 * that the other nodes take its shards (and the claims that run out), as
 * they would take a silent node's. cb_start is the start of the last
 * callback that began, so all those running began at least that long
 * ago. */
static bool own_healthy(void *arg)
{
    struct rd *d = arg;
    uint64_t cap = d->nexec ? d->nexec : 1;
    pthread_mutex_lock(&d->mu);
    uint64_t since = d->cb_start, running = d->counts.running;
    pthread_mutex_unlock(&d->mu);
    return !since || running < cap ||
           rd_mono_ms(d) - since < d->shard_lease_ms / 2;
}

/* A shard became this node's: claim at once. */
static void own_gain(void *arg)
{
    struct rd *d = arg;
    pthread_mutex_lock(&d->mu);
    for (int g = 0; g < GROUPS_MAX; g++)
        pthread_cond_signal(&d->grp[g].ccv);
    pthread_mutex_unlock(&d->mu);
}

/* The per-shard arrays again after a read-only open took the record's
 * shard count. */
static int rd_reshape(struct rd *d, const char *ns)
{
    tw__free(d->sk);
    tw__free(d->grp_of);
    tw__free(d->claim_idle);
    d->sk = NULL;
    d->grp_of = tw__calloc(d->shards, 1);
    d->claim_idle = tw__calloc(d->shards, sizeof *d->claim_idle);
    return d->grp_of && d->claim_idle ? rd_keys(d, ns) : TW_ENOMEM;
}

/* Connect, load the scripts, check the keys' permission and the
 * namespace record. */
static int rd_connect(struct rd *d, const tw_durable_config *cfg,
                      const char *ns)
{
    tw__rc_opts o = {cfg->redis,
                     cfg->redis_user,
                     cfg->redis_password,
                     cfg->redis_sentinel_user,
                     cfg->redis_sentinel_password,
                     cfg->redis_tls_ca_file,
                     cfg->redis_tls_ca_dir,
                     cfg->redis_tls_cert_file,
                     cfg->redis_tls_key_file,
                     cfg->redis_tls_server_name,
                     cfg->errbuf,
                     cfg->errbuf_len};
    int rc = tw__rc_open(&d->rc, &o);
    if (rc)
        return rc;
    rc = tw__eval_load(d->rc, tw__redis_scripts, S_COUNT, d->sha);
    if (!rc)
        rc = tw__rd_probe_keys(d);
    if (rc) {
        tw__rc_last_error(d->rc, cfg->errbuf, cfg->errbuf_len);
        return rc;
    }
    bool ro = cfg->flags & (TW_DURABLE_READONLY | TW_DURABLE_NOFIRE);
    bool adopt = !cfg->shards;
    uint32_t asked = d->shards;
    rc = tw__rd_meta(d, ns, ro, adopt, cfg->errbuf, cfg->errbuf_len);
    if (!rc && d->shards != asked)
        rc = rd_reshape(d, ns);
    if (!rc && cfg->on_damage)
        rc = tw__rd_type_scan(d, cfg);
    if (!rc && !ro && (rc = tw__rd_probe_perms(d, ns)))
        tw__rc_last_error(d->rc, cfg->errbuf, cfg->errbuf_len);
    return rc;
}

int tw__durable_redis_open(tw_durable **out, const tw_durable_config *cfg)
{
    const char *ns = cfg->redis_namespace ? cfg->redis_namespace : "tw";
    if (!*ns || strlen(ns) > 64 || strchr(ns, '{') || strchr(ns, '}')) {
        if (cfg->errbuf && cfg->errbuf_len)
            snprintf(cfg->errbuf, cfg->errbuf_len,
                     "redis_namespace: 1 to 64 bytes without '{' or '}'");
        return TW_EINVAL;
    }
    struct rd *d = rd_new(cfg);
    if (!d)
        return TW_ENOMEM;
    int rc = rd_keys(d, ns);
    if (!rc && tw_wheel_create(&d->wheel, NULL, rd_mono_ms(d)))
        rc = TW_ENOMEM;
    if (!rc)
        rc = rd_connect(d, cfg, ns);
    d->base.readonly = cfg->flags & TW_DURABLE_READONLY;
    d->nofire = cfg->flags & TW_DURABLE_NOFIRE;
    if (!rc && !d->base.readonly && !d->nofire && cfg->redis_shard_lease_ms)
        rc = tw__own_open(&d->own, d->rc, ns, d->shards,
                          cfg->redis_shard_lease_ms, own_gain, own_healthy,
                          tw__rd_own_errors, d);
    if (!rc && !d->base.readonly && !d->nofire)
        rc = tw__rd_start(d);
    if (rc) {
        rd_free(d);
        return rc;
    }
    *out = &d->base;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Schedules. */

/* Schedules: the items grouped by shard, one SCHED call per shard (at most
 * SCHED_CHUNK items each), all of them pipelined: one round trip per node.
 * A shard's calls go in item order on one connection, so a key given twice
 * ends with its last item. */

#define SCHED_CHUNK 1000
#define VAL_HEAD 24                 /* "due,1," at most */
#define SCHED_FIXED (3 + NKEYS + 3) /* EVALSHA sha 5 keys.. 3 numbers */

/* What a batch holds per item and per command. */
struct sb_item {
    struct rtimer *rt; /* its local timer if due in the horizon */
    size_t cmd, pos;   /* its command, its triple in it */
    long long tok;     /* the token of its claim, or 0 */
};
struct sb_cmd {
    size_t cnt, arg0, ibase; /* items, first argument, first slot in who */
};

struct sbatch {
    struct rd *d;
    tw_durable_item *it;
    const struct tw__cond *cond; /* per item (SCHED_IF), or NULL (SCHED) */
    size_t stride;               /* arguments per item: 3, or 4 with cond */
    size_t n, ncmd;
    int64_t now;
    struct sb_item *item; /* per item */
    struct sb_cmd *cm;    /* per command (at most one per item) */
    size_t *who;          /* per command from its ibase: its items */
    uint32_t *cshard;     /* per command: its shard */
    size_t *cur;          /* per shard: its open command + 1, or 0 */
    tw__rc_cmd *cmds;
    int *script;
    const char **argv;
    size_t *len;
    char (*num)[24]; /* per item its due, then 3 per command */
    char *vals;      /* per item its value in :p, "due,1,payload" */
    void *block;     /* every array above, in one allocation */
};

static void sb_free(struct sbatch *b)
{
    if (b->block)
        for (size_t i = 0; i < b->n; i++)
            tw__free(b->item[i].rt);
    tw__free(b->block);
}

/* Allocate the batch's arrays at once, sized for the worst case (a
 * command per shard, and one more per SCHED_CHUNK items), and the local
 * timers of the items due within the horizon; an item whose timer cannot
 * be allocated fails with TW_ENOMEM and is not sent. */
static int sb_alloc(struct sbatch *b)
{
    size_t n = b->n, S = b->d->shards;
    size_t ncmd = S + n / SCHED_CHUNK < n ? S + n / SCHED_CHUNK : n;
    size_t vbytes = 1;
    for (size_t i = 0; i < n; i++)
        vbytes += VAL_HEAD + b->it[i].payload_len +
                  (b->cond ? 1 + b->cond[i].expect_len : 0);
    size_t nargs = b->stride * n + SCHED_FIXED * ncmd + 1;
    struct tw__rd_part parts[] = {
        {&b->item, n + 1, sizeof *b->item},
        {&b->cm, ncmd + 1, sizeof *b->cm},
        {&b->who, n + 1, sizeof *b->who},
        {&b->cshard, ncmd + 1, sizeof *b->cshard},
        {&b->cur, S, sizeof *b->cur},
        {&b->cmds, ncmd + 1, sizeof *b->cmds},
        {&b->script, ncmd + 1, sizeof *b->script},
        {&b->argv, nargs, sizeof *b->argv},
        {&b->len, nargs, sizeof *b->len},
        {&b->num, 4 * n + 1, sizeof *b->num},
        {&b->vals, vbytes, 1},
    };
    b->block = tw__rd_alloc_parts(parts, sizeof parts / sizeof parts[0]);
    if (!b->block)
        return TW_ENOMEM;
    int64_t until = sat_add(b->now, b->d->horizon_ms);
    for (size_t i = 0; i < n; i++) {
        tw_durable_item *it = &b->it[i];
        it->result = 0;
        if (it->due_ms > until)
            continue;
        b->item[i].rt = tw__rd_rt_new(
            b->d, shard_of(b->d, it->key, it->key_len), it->key, it->key_len,
            it->payload, it->payload_len, it->due_ms, 0, 1);
        if (!b->item[i].rt)
            it->result = TW_ENOMEM;
    }
    return 0;
}

/* Give each item to its shard's open command (a new one when the shard has
 * none or it is full), then lay out every command's arguments. */
static void sb_plan(struct sbatch *b)
{
    for (size_t i = 0; i < b->n; i++) {
        tw_durable_item *it = &b->it[i];
        if (it->result)
            continue;
        uint32_t sh = shard_of(b->d, it->key, it->key_len);
        size_t c = b->cur[sh];
        if (!c || b->cm[c - 1].cnt == SCHED_CHUNK) {
            c = b->cur[sh] = ++b->ncmd;
            b->cm[c - 1].cnt = 0;
            b->cshard[c - 1] = sh;
        }
        b->item[i].cmd = c - 1;
        b->item[i].pos = b->cm[c - 1].cnt++;
    }
    for (size_t c = 0, ni = 0, nargs = 0; c < b->ncmd; c++) {
        b->cm[c].arg0 = nargs;
        nargs += SCHED_FIXED + b->stride * b->cm[c].cnt;
        b->cm[c].ibase = ni;
        ni += b->cm[c].cnt;
    }
    for (size_t i = 0; i < b->n; i++)
        if (!b->it[i].result)
            b->who[b->cm[b->item[i].cmd].ibase + b->item[i].pos] = i;
}

/* Item @i's condition as SCHED_IF takes it ("a": absent, or "=" and the
 * expected bytes) at @v, into argument @at; returns the end of it. */
static char *sb_cond(struct sbatch *b, size_t i, size_t at, char *v)
{
    const struct tw__cond *c = &b->cond[i];
    b->argv[at] = v;
    b->len[at] = c->expect ? 1 + c->expect_len : 1;
    *v = c->expect ? '=' : 'a';
    if (c->expect_len)
        memcpy(v + 1, c->expect, c->expect_len);
    return v + b->len[at];
}

/* Fill every command: the script call's head, then one triple per item
 * (with its condition: a quadruple). */
static void sb_fill(struct sbatch *b)
{
    struct rd *d = b->d;
    int script = b->cond ? S_SCHED_IF : S_SCHED;
    long long head[3] = {sat_add(b->now, d->horizon_ms), b->now, d->lease_ms};
    for (size_t c = 0; c < b->ncmd; c++) {
        const char **av = b->argv + b->cm[c].arg0;
        size_t *al = b->len + b->cm[c].arg0;
        struct shard_keys *k = &d->sk[b->cshard[c]];
        tw__rd_script_head(d, av, al, script, b->cshard[c]);
        tw__rd_put_nums(av + 3 + NKEYS, al + 3 + NKEYS, b->num + b->n + 3 * c,
                        head, 3);
        b->cmds[c] = (tw__rc_cmd){(int)(SCHED_FIXED + b->stride * b->cm[c].cnt),
                                  av,
                                  al,
                                  k->slot,
                                  NULL,
                                  0};
        b->script[c] = script;
    }
    char *v = b->vals;
    for (size_t i = 0; i < b->n; i++) {
        tw_durable_item *it = &b->it[i];
        if (it->result)
            continue;
        const struct sb_item *e = &b->item[i];
        size_t at = b->cm[e->cmd].arg0 + SCHED_FIXED + b->stride * e->pos;
        long long due = it->due_ms;
        b->argv[at] = it->key;
        b->len[at] = it->key_len;
        tw__rd_put_nums(b->argv + at + 1, b->len + at + 1, b->num + i, &due, 1);
        size_t h = b->len[at + 1];
        memcpy(v, b->argv[at + 1], h);
        memcpy(v + h, ",1,", 3);
        if (it->payload_len)
            memcpy(v + h + 3, it->payload, it->payload_len);
        b->argv[at + 2] = v;
        b->len[at + 2] = h + 3 + it->payload_len;
        v += b->len[at + 2];
        if (b->cond)
            v = sb_cond(b, i, at + 3, v);
    }
}

/* SCHED_IF's reply to command @c: each item's code (0 applied, 1
 * stale, 2 not pending) into its result; *@r becomes the SCHED reply
 * within it. TW_EIO if the reply is not of that shape. */
static int sb_codes(struct sbatch *b, size_t c, const redisReply **r)
{
    const redisReply *top = *r, *st;
    if (!top || top->type != REDIS_REPLY_ARRAY || top->elements != 2 ||
        (st = top->element[0])->type != REDIS_REPLY_ARRAY ||
        st->elements != b->cm[c].cnt)
        return TW_EIO;
    for (size_t p = 0; p < st->elements; p++)
        if (st->element[p]->type != REDIS_REPLY_INTEGER ||
            st->element[p]->integer < 0 || st->element[p]->integer > 2)
            return TW_EIO;
    for (size_t p = 0; p < st->elements; p++) {
        long long code = st->element[p]->integer;
        b->it[b->who[b->cm[c].ibase + p]].result = code == 1   ? TW_ESTALE
                                                   : code == 2 ? TW_ENOENT
                                                               : 0;
    }
    *r = top->element[1];
    return 0;
}

/* Read command @c's reply, the shard's version and (item, token) pairs,
 * into the tokens of its items and the versions of their timers; a
 * command with no reply, or not SCHED's, fails its items. */
static void sb_reply(struct sbatch *b, size_t c)
{
    const redisReply *r = b->cmds[c].reply;
    int err = b->cmds[c].err;
    if (!err && b->cond)
        err = sb_codes(b, c, &r);
    if (!err && (!r || r->type != REDIS_REPLY_ARRAY ||
                 (r->elements && r->elements % 2 == 0)))
        err = TW_EIO;
    uint64_t ver = !err && r->elements ? reply_u64(r->element[0]) : 0;
    for (size_t e = 1; !err && e < r->elements; e += 2) {
        const redisReply *j = r->element[e], *t = r->element[e + 1];
        if (j->type != REDIS_REPLY_INTEGER || t->type != REDIS_REPLY_INTEGER ||
            j->integer < 1 || (size_t)j->integer > b->cm[c].cnt)
            err = TW_EIO;
        else {
            size_t i = b->who[b->cm[c].ibase + (size_t)j->integer - 1];
            b->item[i].tok = t->integer;
            if (b->item[i].rt)
                b->item[i].rt->ver = ver;
        }
    }
    for (size_t p = 0; err && p < b->cm[c].cnt; p++)
        b->it[b->who[b->cm[c].ibase + p]].result = err;
}

/* Each item's result from its command's reply; the items claimed at once
 * go into the wheel. */
static void sb_results(struct sbatch *b)
{
    struct rd *d = b->d;
    for (size_t c = 0; c < b->ncmd; c++)
        sb_reply(b, c);
    int64_t wall = rd_wall(d);
    uint64_t mono = rd_mono_ms(d);
    bool armed = false;
    pthread_mutex_lock(&d->mu);
    for (size_t c = 0; c < b->ncmd; c++)
        claim_soon_locked(d, b->cshard[c]);
    for (size_t i = 0; i < b->n; i++) {
        struct sb_item *e = &b->item[i];
        if (!b->it[i].result && e->tok > 0 && e->rt) {
            e->rt->token = (uint64_t)e->tok;
            tw__rd_rt_arm_locked(d, e->rt, wall, mono);
            e->rt = NULL;
            armed = true;
        }
    }
    if (armed)
        pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
}

/* WAIT on the node of each command's shard; a failure fails its items. */
static void sb_wait(struct sbatch *b)
{
    if (!b->d->wait_replicas || !b->ncmd)
        return;
    int *rc = tw__malloc(b->ncmd * sizeof *rc);
    if (rc)
        tw__rd_wait_many(b->d, b->cshard, rc, b->ncmd);
    for (size_t i = 0; i < b->n; i++)
        if (!b->it[i].result)
            b->it[i].result = rc ? rc[b->item[i].cmd] : TW_ENOMEM;
    tw__free(rc);
}

/* A batch of schedules, conditional (SCHED_IF) when @cond is not NULL. */
static int sched_run(tw_durable *base, tw_durable_item *items,
                     const struct tw__cond *cond, size_t n)
{
    if (((struct rd *)base)->nofire) {
        for (size_t i = 0; i < n; i++)
            items[i].result = TW_EINVAL;
        return n ? TW_EINVAL : 0;
    }
    struct sbatch b = {.d = (struct rd *)base,
                       .it = items,
                       .cond = cond,
                       .stride = cond ? 4 : 3,
                       .n = n};
    b.now = rd_wall(b.d);
    int rc = sb_alloc(&b);
    if (rc) {
        for (size_t i = 0; i < n; i++)
            items[i].result = rc;
        sb_free(&b);
        return rc;
    }
    sb_plan(&b);
    sb_fill(&b);
    tw__rd_run_cmds(b.d, b.cmds, b.script, b.ncmd);
    sb_results(&b);
    for (size_t c = 0; c < b.ncmd; c++)
        if (b.cmds[c].reply)
            freeReplyObject(b.cmds[c].reply);
    sb_wait(&b);
    sb_free(&b);
    return tw__durable_first_error(items, n);
}

static int rd_schedule_if(tw_durable *base, tw_durable_item *items,
                          const struct tw__cond *cond, size_t n)
{
    return sched_run(base, items, cond, n);
}

/* ------------------------------------------------------------------------ */
/* One-per-call schedules and cancels from many threads: combined by the
 * durable layer's call combiner (src/durable_combine.h), one per master
 * (the key's shard's group, d->grp_of), each under its own d->op_mu[g]
 * (a batch does its round trips without d->mu). The caller that gets a
 * group's op_mu takes every call queued so far for that group (its own
 * and every other thread's) and runs them as one batch (op_batch()):
 * the schedules as one sched_run(), the cancels as one pipelined
 * round trip; the others sleep until their call is answered, and the
 * calls queued meanwhile make the next batch. */

enum { OP_SCHED, OP_CANCEL, OP_MANY };

struct op_wait {
    struct tw__combine_req req; /* first: the combiner's */
    int kind;
    tw_durable_item it;    /* a cancel uses key and key_len */
    tw_durable_item *many; /* OP_MANY: a schedule_many's items */
    size_t nmany;
};

/* WAIT after the cancels that succeeded; a failed WAIT fails its cancel. */
static void cancel_wait(struct rd *d, struct op_wait **v,
                        const struct call *calls, size_t n)
{
    uint32_t *sh = tw__malloc(n * sizeof *sh);
    int *rc = tw__malloc(n * sizeof *rc);
    size_t m = 0;
    for (size_t i = 0; sh && rc && i < n; i++)
        if (!v[i]->it.result)
            sh[m++] = calls[i].shard;
    if (sh && rc)
        tw__rd_wait_many(d, sh, rc, m);
    for (size_t i = 0, j = 0; i < n; i++)
        if (!v[i]->it.result)
            v[i]->it.result = sh && rc ? rc[j++] : TW_ENOMEM;
    tw__free(sh);
    tw__free(rc);
}

/* The cancels of a batch: one CANCEL call per key, pipelined; with
 * @cond (per cancel), each only if its payload begins with the expected
 * bytes. */
static void cancel_batch(struct rd *d, struct op_wait **v,
                         const struct tw__cond *cond, size_t n)
{
    struct call *calls = tw__malloc(n * sizeof *calls);
    tw__rc_cmd *cmds = tw__calloc(n, sizeof *cmds);
    int rc = calls && cmds ? 0 : TW_ENOMEM;
    int64_t now = rd_wall(d);
    for (size_t i = 0; !rc && i < n; i++) {
        tw__rd_call_init(d, &calls[i], S_CANCEL,
                         shard_of(d, v[i]->it.key, v[i]->it.key_len));
        call_arg(&calls[i], v[i]->it.key, v[i]->it.key_len);
        call_num(&calls[i], now);
        if (cond)
            call_arg(&calls[i], cond[i].expect, cond[i].expect_len);
    }
    if (!rc)
        tw__rd_run_calls(d, calls, cmds, n);
    uint64_t ok = 0;
    for (size_t i = 0; i < n; i++) {
        const redisReply *r = cmds ? cmds[i].reply : NULL;
        int e = rc ? rc : cmds[i].err;
        if (!e && (!r || r->type != REDIS_REPLY_INTEGER))
            e = TW_EIO;
        if (!e && r->integer == 0)
            e = TW_ENOENT;
        if (!e && r->integer < 0)
            e = TW_ESTALE;
        v[i]->it.result = e;
    }
    if (cmds)
        tw__rc_free_replies(cmds, n);
    if (!rc && d->wait_replicas)
        cancel_wait(d, v, calls, n);
    for (size_t i = 0; i < n; i++)
        ok += !v[i]->it.result;
    tw__free(calls);
    tw__free(cmds);
    pthread_mutex_lock(&d->mu);
    d->cancelled += ok;
    pthread_mutex_unlock(&d->mu);
}

/* Every request of the batch @list failed with @rc. */
static void op_fail(struct op_wait *list, int rc)
{
    for (struct tw__combine_req *r = &list->req; r; r = r->next) {
        struct op_wait *w = (struct op_wait *)r;
        w->it.result = rc;
        for (size_t i = 0; i < w->nmany; i++)
            w->many[i].result = rc;
    }
}

/* Run the batch @list: cancels together, then schedules together (the
 * one-per-call ones and the items of the schedule_many calls, in the
 * order they were queued), as one sched_run(). */
static void op_batch(struct rd *d, struct op_wait *list)
{
    size_t n = 0, ns = 0, nc = 0;
    for (struct tw__combine_req *r = &list->req; r; r = r->next)
        n += 1 + ((struct op_wait *)r)->nmany;
    tw_durable_item *items = tw__malloc(n * sizeof *items);
    struct op_wait **v = tw__malloc(n * sizeof *v);
    if (!items || !v) {
        op_fail(list, TW_ENOMEM);
        tw__free(items);
        tw__free(v);
        return;
    }
    for (struct tw__combine_req *r = &list->req; r; r = r->next) {
        struct op_wait *w = (struct op_wait *)r;
        if (w->kind == OP_SCHED)
            items[ns++] = w->it;
        else if (w->kind == OP_MANY)
            for (size_t i = 0; i < w->nmany; i++)
                items[ns++] = w->many[i];
        else
            v[nc++] = w;
    }
    if (nc)
        cancel_batch(d, v, NULL, nc);
    if (ns)
        sched_run(&d->base, items, NULL, ns);
    ns = 0;
    for (struct tw__combine_req *r = &list->req; r; r = r->next) {
        struct op_wait *w = (struct op_wait *)r;
        if (w->kind == OP_SCHED)
            w->it.result = items[ns++].result;
        else if (w->kind == OP_MANY)
            for (size_t i = 0; i < w->nmany; i++)
                w->many[i].result = items[ns++].result;
    }
    tw__free(items);
    tw__free(v);
}

/* A round of one master's combiner (op_mu[g] held, d->mu not): the
 * schedules and cancels queued for that master, from @first on, as one
 * batch, then each marked done, after which its caller may return
 * (so ->next is read first). */
static void op_round(struct tw__combine_req *first, void *ctx)
{
    op_batch(ctx, (struct op_wait *)first);
    for (struct tw__combine_req *r = first, *nx; r; r = nx) {
        nx = r->next;
        tw__combine_done(r);
    }
}

/* Queue @w with the calls for its key's master and return its result
 * once a batch has run it. Each master (group) has its own combiner, so
 * a batch waits only for its own master: calls for the other masters'
 * shards go on while one is stalled. A group read just before a
 * reshard moved the shard still reaches the right node (the client
 * routes by slot); only the batching is off until the map settles. */
static int op_run(struct rd *d, struct op_wait *w)
{
    uint32_t s = shard_of(d, w->it.key, w->it.key_len);
    pthread_mutex_lock(&d->mu);
    unsigned g = d->grp_of[s];
    pthread_mutex_unlock(&d->mu);
    tw__combine_run(&d->comb[g], &w->req);
    return w->it.result;
}

/* tw_durable_schedule_many. On one server (not a cluster: one master
 * holds every shard), through the combiner of group 0 like a one-per-call
 * schedule, so that the batches of threads calling at once become one
 * SCHED call per shard, not one per shard per batch: Redis's cost of a
 * script call (a few us, and a few more per command it runs) is paid once
 * for all of them. On a cluster, run at once: a batch spans every master,
 * and a combined round would make the calls for healthy masters wait for
 * a stalled one. */
static int rd_schedule_many(tw_durable *base, tw_durable_item *items, size_t n)
{
    struct rd *d = (struct rd *)base;
    if (d->nofire || !n || tw__rc_cluster(d->rc))
        return sched_run(base, items, NULL, n);
    struct op_wait w = {.kind = OP_MANY, .many = items, .nmany = n};
    tw__combine_run(&d->comb[0], &w.req);
    return tw__durable_first_error(items, n);
}

static int rd_schedule(tw_durable *base, const void *key, size_t key_len,
                       int64_t due_ms, const void *payload, size_t payload_len)
{
    struct op_wait w = {.kind = OP_SCHED,
                        .it = {key, key_len, due_ms, payload, payload_len, 0}};
    if (((struct rd *)base)->nofire)
        return TW_EINVAL;
    return op_run((struct rd *)base, &w);
}

static int rd_cancel(tw_durable *base, const void *key, size_t key_len)
{
    struct op_wait w = {.kind = OP_CANCEL, .it = {key, key_len, 0, NULL, 0, 0}};
    return op_run((struct rd *)base, &w);
}

/* tw_durable_cancel_many: the items as one batch of cancels (one pipelined
 * round trip per node), in order, so a key given twice finds itself gone
 * the second time. */
static int cancel_run(tw_durable *base, tw_durable_item *items,
                      const struct tw__cond *cond, size_t n)
{
    struct op_wait *w = tw__calloc(n, sizeof *w);
    struct op_wait **v = tw__malloc(n * sizeof *v);
    int rc = w && v ? 0 : TW_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        w[i].kind = OP_CANCEL;
        w[i].it =
            (tw_durable_item){.key = items[i].key, .key_len = items[i].key_len};
        v[i] = &w[i];
    }
    if (!rc)
        cancel_batch((struct rd *)base, v, cond, n);
    for (size_t i = 0; i < n; i++)
        items[i].result = rc ? rc : w[i].it.result;
    tw__free(w);
    tw__free(v);
    return tw__durable_first_error(items, n);
}

static int rd_cancel_many(tw_durable *base, tw_durable_item *items, size_t n)
{
    return cancel_run(base, items, NULL, n);
}

static int rd_cancel_if(tw_durable *base, tw_durable_item *items,
                        const struct tw__cond *cond, size_t n)
{
    return cancel_run(base, items, cond, n);
}

/* Per shard: ZCARD :d (pending), ZCOUNT :d 0 now (due, not claimed by
 * any node yet: backlog; claimed keys have negative scores), HLEN :q
 * (set aside) and ZCARD :x (dead letters). A key of the wrong type
 * answers with an error: 0. Any other error (a command refused after
 * open) fails the call, counted in stats.errors: never a 0 that is not
 * one. */
#define STAT_CMDS 4

static void stat_cmds(struct rd *d, struct call *calls, tw__rc_cmd *cmds,
                      const char *now, size_t now_len)
{
    static const char *const cmd[STAT_CMDS] = {"ZCARD", "ZCOUNT", "HLEN",
                                               "ZCARD"};
    static const int argc[STAT_CMDS] = {2, 4, 2, 2},
                     key[STAT_CMDS] = {0, 0, 4, 5};
    for (size_t i = 0; i < STAT_CMDS * (size_t)d->shards; i++) {
        struct shard_keys *k = &d->sk[i / STAT_CMDS];
        struct call *c = &calls[i];
        size_t j = i % STAT_CMDS;
        c->argv[0] = cmd[j];
        c->len[0] = strlen(c->argv[0]);
        c->argv[1] = k->name[key[j]];
        c->len[1] = k->len[key[j]];
        c->argv[2] = "0";
        c->len[2] = 1;
        c->argv[3] = now;
        c->len[3] = now_len;
        cmds[i] = (tw__rc_cmd){argc[j], c->argv, c->len, k->slot, NULL, 0};
    }
}

/* This node's claimed timers that are due and whose callback has not
 * started. mu held. */
static uint64_t local_backlog(struct rd *d, int64_t wall)
{
    uint64_t n = 0;
    for (struct rtimer *r = d->held; r; r = r->hnext)
        n += !r->fired && r->due_ms <= wall;
    return n;
}

static int rd_stats(tw_durable *base, tw_durable_stats *out)
{
    struct rd *d = (struct rd *)base;
    size_t n = STAT_CMDS * (size_t)d->shards;
    tw__rc_cmd *cmds = tw__calloc(n, sizeof *cmds);
    struct call *calls = tw__malloc(n * sizeof *calls);
    if (!cmds || !calls) {
        tw__free(cmds);
        tw__free(calls);
        return TW_ENOMEM;
    }
    int64_t wall = rd_wall(d);
    char now[24];
    int now_len = snprintf(now, sizeof now, "%lld", (long long)wall);
    stat_cmds(d, calls, cmds, now, (size_t)now_len);
    int rc = tw__rc_exec(d->rc, cmds, n);
    if (!rc)
        rc = tw__rd_read_errors(d, cmds, n);
    uint64_t sum[STAT_CMDS] = {0}; /* pending, backlog, quarantined, dead */
    for (size_t i = 0; i < n; i++)
        sum[i % STAT_CMDS] += reply_u64(cmds[i].reply);
    tw__rc_free_replies(cmds, n);
    tw__free(cmds);
    tw__free(calls);
    if (rc)
        return rc;
    pthread_mutex_lock(&d->mu);
    out->pending = sum[0];
    out->quarantined = sum[2];
    out->dead = sum[3];
    out->errors = atomic_load(&d->errors);
    tw__durable_counts_stats(&d->counts, out);
    out->backlog = sum[1] + local_backlog(d, wall);
    out->cancelled = d->cancelled;
    pthread_mutex_unlock(&d->mu);
    return 0;
}

static void rd_free(struct rd *d)
{
    tw__durable_exec_destroy(&d->exec);
    tw__own_close(d->own);
    while (d->held) {
        struct rtimer *r = d->held;
        tw__rd_rt_free_locked(d, r);
    }
    for (int g = 0; g < GROUPS_MAX; g++) {
        tw__free(d->grp[g].pend);
        pthread_cond_destroy(&d->grp[g].cv);
        pthread_cond_destroy(&d->grp[g].ccv);
    }
    tw__free(d->grp_of);
    tw__free(d->claim_idle);
    tw_wheel_destroy(d->wheel);
    tw__rc_close(d->rc);
    pthread_mutex_destroy(&d->mu);
    for (int g = 0; g < GROUPS_MAX; g++)
        pthread_mutex_destroy(&d->op_mu[g]);
    pthread_cond_destroy(&d->cv);
    pthread_cond_destroy(&d->claim_cv);
    tw__free(d->sk);
    tw__free(d);
}

static int rd_close(tw_durable *base)
{
    struct rd *d = (struct rd *)base;
    tw__rd_stop(d);
    /* Give the claims not fired back, so that no one waits for a lease. */
    int rc = 0;
    while (d->held) {
        struct call c[256];
        tw__rc_cmd cmds[256];
        struct rtimer *batch[256];
        size_t n = 0, nb = 0;
        for (struct rtimer *r = d->held; r && nb < 256; r = r->hnext) {
            batch[nb++] = r;
            if (r->token) {
                tw__rd_call_init(d, &c[n], S_RELEASE, r->shard);
                call_arg(&c[n], r->data, r->key_len);
                call_num(&c[n], (long long)r->token);
                n++;
            }
        }
        if (n) {
            int e = tw__rd_run_calls(d, c, cmds, n);
            if (!rc)
                rc = e;
            tw__rc_free_replies(cmds, n);
        }
        for (size_t i = 0; i < nb; i++) /* after their keys were sent */
            tw__rd_rt_free_locked(d, batch[i]);
    }
    tw__own_close(d->own); /* then the shards go to the next owners */
    d->own = NULL;
    rd_free(d);
    return rc;
}

struct tw__own *tw__durable_redis_own(struct tw_durable *d)
{
    return ((struct rd *)d)->own;
}

void tw__durable_redis_client_stats(struct tw_durable *d, tw__rc_stats *out)
{
    tw__rc_stats_get(((struct rd *)d)->rc, out);
}

static const struct tw_durable_ops rd_ops = {
    .schedule = rd_schedule,
    .schedule_many = rd_schedule_many,
    .cancel_many = rd_cancel_many,
    .cancel = rd_cancel,
    .close = rd_close,
    .stats = rd_stats,
    .get = tw__rd_get,
    .list = tw__rd_list,
    .scan = tw__rd_scan,
    .dead_op = tw__rd_dead_op,
    .restore = tw__rd_restore,
    .list_dead = tw__rd_list_dead,
    .touch = tw__rd_touch,
    .schedule_if = rd_schedule_if,
    .cancel_if = rd_cancel_if,
};
