/* SPDX-License-Identifier: MIT */
/*
 * src/durable_redis.c - the Redis backend of twheel/durable.h: open,
 * schedule and cancel (with the combiner of one-per-call operations),
 * stats, close, and the script calls every part sends.
 *
 * The backend in files, in the order a timer goes through them:
 *   src/redis_scripts.[ch]    the Lua scripts and the data model they keep
 *                             in Redis (a shard's keys, tokens, versions,
 *                             dead letters, quarantine)
 *   src/durable_redis.c       this file: open, schedule/cancel, stats,
 *                             close; running scripts (EVALSHA, NOSCRIPT)
 *   src/redis_owner.[ch]      fenced shard ownership
 *                             (cfg.redis_shard_lease_ms)
 *   src/redis_fire.c          claiming, checking, firing, completing
 *   src/redis_query.c         get, list, scan, dead letters
 *   src/durable_redis_impl.h  struct rd and what the files share
 *   src/redis_client.[ch]     the connections (hiredis protocol, cluster
 *                             routing, Sentinel, TLS)
 *
 * Schedules. tw_durable_schedule_many groups its items by shard: one SCHED
 * call per shard (up to SCHED_CHUNK items), all calls pipelined, one round
 * trip per Redis node. tw_durable_schedule and tw_durable_cancel from many
 * threads are combined (src/durable_combine.h): the calls queued while a
 * batch is in flight become the next batch (op_run()). SCHED moves :v when one
 * of its keys existed (HSET counts the new fields), CANCEL when it removed a
 * key.
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

/* ------------------------------------------------------------------------ */
/* Script calls. */

/* A script call's first 3 + NKEYS arguments: EVALSHA, the digest, NKEYS
 * and the shard's keys. */
void tw__rd_script_head(const struct rd *d, const char **av, size_t *al,
                        int script, uint32_t shard)
{
    av[0] = "EVALSHA";
    al[0] = 7;
    av[1] = d->sha[script];
    al[1] = 40;
    av[2] = "6"; /* NKEYS */
    al[2] = 1;
    for (int i = 0; i < NKEYS; i++) {
        av[3 + i] = d->sk[shard].name[i];
        al[3 + i] = d->sk[shard].len[i];
    }
}

void tw__rd_call_init(struct rd *d, struct call *c, int script, uint32_t shard)
{
    c->script = script;
    c->shard = shard;
    c->nnum = 0;
    tw__rd_script_head(d, c->argv, c->len, script, shard);
    c->argc = 3 + NKEYS;
}

/* Fence @c (right after tw__rd_call_init) by its shard's ownership record:
 * false when the shard is not this node's (see FENCE). */
bool tw__rd_call_fence(struct rd *d, struct call *c)
{
    size_t fl, kl;
    if (!tw__own_fence(d->own, c->shard, c->fence, &fl, &c->epoch))
        return false;
    const char *key = tw__own_key(d->own, c->shard, &kl);
    c->argv[2] = "7"; /* NKEYS + 1 */
    call_arg(c, key, kl);
    call_arg(c, c->fence, fl);
    return true;
}

/* Write the numbers @v as decimal strings into @num, @argv and @len. */
void tw__rd_put_nums(const char **argv, size_t *len, char (*num)[24],
                     const long long *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        len[i] = (size_t)snprintf(num[i], 24, "%lld", v[i]);
        argv[i] = num[i];
    }
}

/* Run @n commands pipelined; @script[i] is the script of cmds[i] (its
 * argv[0..1] are EVALSHA and the digest, and its argv array is the
 * caller's, writable) or -1 for a plain command. Returns 0 or the first
 * transport error. A node that lost its script cache (restart, failover)
 * gets EVAL, which loads the script there again. */
int tw__rd_run_cmds(struct rd *d, tw__rc_cmd *cmds, const int *script, size_t n)
{
    int rc = tw__rc_exec(d->rc, cmds, n);
    for (int pass = 0; pass < 2; pass++) {
        size_t again = 0;
        for (size_t i = 0; i < n; i++)
            if (script[i] >= 0 && tw__rc_is_noscript(cmds[i].reply))
                again++;
        if (!again)
            break;
        tw__rc_cmd *sub = tw__calloc(again, sizeof *sub);
        size_t *idx = tw__calloc(again, sizeof *idx);
        if (!sub || !idx) {
            tw__free(sub);
            tw__free(idx);
            return TW_ENOMEM;
        }
        size_t j = 0;
        for (size_t i = 0; i < n; i++) {
            if (script[i] < 0 || !tw__rc_noscript_to_eval(
                                     &cmds[i], tw__redis_scripts[script[i]]))
                continue;
            sub[j] = cmds[i];
            idx[j++] = i;
        }
        tw__rc_exec(d->rc, sub, again);
        rc = 0;
        for (size_t k = 0; k < again; k++)
            cmds[idx[k]] = sub[k];
        for (size_t i = 0; i < n && !rc; i++)
            rc = cmds[i].err;
        tw__free(sub);
        tw__free(idx);
    }
    return rc;
}

/* tw__rd_run_cmds for fixed-size script calls. */
int tw__rd_run_calls(struct rd *d, struct call *calls, tw__rc_cmd *cmds,
                     size_t n)
{
    int *script = tw__malloc((n ? n : 1) * sizeof *script);
    if (!script)
        return TW_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        cmds[i].argc = calls[i].argc;
        cmds[i].argv = calls[i].argv;
        cmds[i].argvlen = calls[i].len;
        cmds[i].slot = d->sk[calls[i].shard].slot;
        cmds[i].reply = NULL;
        script[i] = calls[i].script;
    }
    int rc = tw__rd_run_cmds(d, cmds, script, n);
    tw__free(script);
    return rc;
}

/* WAIT for the configured replicas after the writes to each shard
 * @shard[0..n): one WAIT per entry, all pipelined, so one round trip per
 * node (a node's first WAIT covers everything written before it, and the
 * others then return at once). @rc[i]: 0, TW_EIO (fewer replicas in
 * time), TW_ECONN or TW_ENOMEM. */
void tw__rd_wait_many(struct rd *d, const uint32_t *shard, int *rc, size_t n)
{
    char a[2][24];
    const char *argv[3] = {"WAIT", a[0], a[1]};
    size_t len[3] = {4, 0, 0};
    len[1] = (size_t)snprintf(a[0], 24, "%u", d->wait_replicas);
    len[2] = (size_t)snprintf(a[1], 24, "%u", d->wait_timeout_ms);
    tw__rc_cmd *cmds = tw__calloc(n ? n : 1, sizeof *cmds);
    for (size_t i = 0; i < n && cmds; i++)
        cmds[i] = (tw__rc_cmd){3, argv, len, d->sk[shard[i]].slot, NULL, 0};
    if (cmds)
        tw__rc_exec(d->rc, cmds, n);
    for (size_t i = 0; i < n; i++) {
        const redisReply *r = cmds ? cmds[i].reply : NULL;
        rc[i] = cmds ? cmds[i].err : TW_ENOMEM;
        if (!rc[i] && (!r || r->type != REDIS_REPLY_INTEGER ||
                       r->integer < (long long)d->wait_replicas))
            rc[i] = TW_EIO;
    }
    if (cmds)
        tw__rc_free_replies(cmds, n);
    tw__free(cmds);
}

/* One zeroed allocation for the arrays of @parts: each part's pointer
 * (*parts[i].out) is set to room for its count elements of its size,
 * aligned for any type. Returns the block (tw__free() frees every
 * array), or NULL when out of memory. */
void *tw__rd_alloc_parts(const struct tw__rd_part *parts, size_t n)
{
    const size_t align = _Alignof(max_align_t);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        size_t bytes;
        if (__builtin_mul_overflow(parts[i].count, parts[i].size, &bytes) ||
            __builtin_add_overflow(total, bytes + align - 1, &total))
            return NULL;
        total -= total % align;
    }
    char *block = tw__calloc(1, total ? total : 1);
    if (!block)
        return NULL;
    for (size_t i = 0, at = 0; i < n; i++) {
        void *p = block + at;
        memcpy(parts[i].out, &p, sizeof p);
        at += parts[i].count * parts[i].size + align - 1;
        at -= at % align;
    }
    return block;
}

/* One script call on @shard; its integer reply into *@out. */
int tw__rd_call_int(struct rd *d, struct call *c, long long *out)
{
    tw__rc_cmd cmd;
    int rc = tw__rd_run_calls(d, c, &cmd, 1);
    const redisReply *r = cmd.reply;
    if (!rc && (!r || r->type != REDIS_REPLY_INTEGER))
        rc = TW_EIO;
    if (!rc)
        *out = r->integer;
    tw__rc_free_replies(&cmd, 1);
    return rc;
}

/* The decimal digits at @s (at least one, up to a comma) as a magnitude
 * at most @max; the end in *@end. False if there is none or it is
 * larger. */
static bool parse_digits(const char *s, const char *lim, uint64_t max,
                         uint64_t *out, const char **end)
{
    uint64_t x = 0;
    const char *p = s;
    for (; p < lim && *p >= '0' && *p <= '9'; p++)
        if (__builtin_mul_overflow(x, 10u, &x) ||
            __builtin_add_overflow(x, (uint64_t)(*p - '0'), &x) || x > max)
            return false;
    *out = x;
    *end = p;
    return p > s && p < lim && *p == ',';
}

/* Exactly what the scripts' pv() accepts: "-?digits,digits,payload"
 * with the due time in int64 and the attempt in uint32. */
bool tw__rd_parse_val(const char *s, size_t n, struct pval *v)
{
    const char *lim = s + n, *p = s;
    bool neg = n && *p == '-';
    uint64_t due, att;
    p += neg;
    if (!parse_digits(p, lim, (uint64_t)INT64_MAX + neg, &due, &p) ||
        !parse_digits(p + 1, lim, UINT32_MAX, &att, &p))
        return false;
    v->due = neg ? (int64_t)(0 - due) : (int64_t)due;
    v->attempt = (uint32_t)att;
    v->payload = p + 1;
    v->len = n - (size_t)(p + 1 - s);
    return true;
}

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
    if (!d->grp_of) {
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

/* SCRIPT LOAD once on any node; other nodes learn each script by EVAL on
 * their first NOSCRIPT. The digest is the same everywhere. */
static int rd_load_scripts(struct rd *d)
{
    for (int i = 0; i < S_COUNT; i++) {
        int rc = tw__rc_script_load(d->rc, tw__redis_scripts[i], d->sha[i]);
        if (rc)
            return rc;
    }
    return 0;
}

/* Can this user reach the namespace's keys? A GET of shard 0's version
 * key: an ACL user without the key pattern fails now, with NOPERM and
 * TW_EAUTH, rather than at its first schedule. Other errors (a value of
 * another type) are left to the scripts. */
static int rd_probe_keys(struct rd *d)
{
    const char *argv[2] = {"GET", d->sk[0].name[NKEYS - 1]};
    size_t len[2] = {3, d->sk[0].len[NKEYS - 1]};
    tw__rc_cmd cmd = {2, argv, len, d->sk[0].slot, NULL, 0};
    int rc = tw__rc_exec(d->rc, &cmd, 1);
    if (!rc && cmd.reply->type == REDIS_REPLY_ERROR &&
        !strncmp(cmd.reply->str, "NOPERM", 6))
        rc = tw__rc_cmd_error(d->rc, &cmd, "GET of a key of the namespace");
    tw__rc_free_replies(&cmd, 1);
    return rc;
}

/* The namespace's record {ns:meta}: "twheel-redis format F shards N",
 * written by the first open that finds none (a namespace made before
 * the record existed is adopted by the count of its first open since);
 * a read-only or no-fire open only reads it. An open with cfg.shards 0
 * takes the recorded count (64 when there is none); any other count must
 * be the recorded one. GET and SET inside EVAL, so
 * that two first opens agree on one record: the smallest ACL covers it. */
#define META_FORMAT 1
static const char meta_script[] = "local v=redis.call('GET',KEYS[1])\n"
                                  "if v then return v end\n"
                                  "if ARGV[2]=='1' then return false end\n"
                                  "redis.call('SET',KEYS[1],ARGV[1])\n"
                                  "return ARGV[1]\n";

static int meta_refuse(char *eb, size_t el, const char *key, const char *why)
{
    if (eb && el)
        snprintf(eb, el, "redis namespace record %s: %s", key, why);
    return TW_EINVAL;
}

/* Check @rec, the record's text, against this open's shard count; with
 * @adopt (cfg.shards 0) take its count. */
static int meta_judge(struct rd *d, const char *rec, const char *key,
                      bool adopt, char *eb, size_t el)
{
    unsigned f, n;
    int end = 0;
    char why[160];
    if (sscanf(rec, "twheel-redis format %u shards %u%n", &f, &n, &end) != 2 ||
        rec[end] || !n || n > 1u << 20)
        return meta_refuse(eb, el, key,
                           "not \"twheel-redis format F shards N\" (damaged: "
                           "fix or delete it by hand)");
    if (f > META_FORMAT) {
        snprintf(why, sizeof why, "format %u is newer than this twheel's (%u)",
                 f, META_FORMAT);
        return meta_refuse(eb, el, key, why);
    }
    if (adopt) {
        d->shards = n;
        return 0;
    }
    if (n == d->shards)
        return 0;
    snprintf(why, sizeof why,
             "the namespace has %u shards, this open asked for %u "
             "(cfg.shards, twheel --shards)",
             n, d->shards);
    return meta_refuse(eb, el, key, why);
}

/* Read (or write, on a writing open that finds none) the record and
 * judge it. */
static int rd_meta(struct rd *d, const char *ns, bool ro, bool adopt, char *eb,
                   size_t el)
{
    char key[80], rec[80];
    int kl = snprintf(key, sizeof key, "{%s:meta}", ns);
    int rl = snprintf(rec, sizeof rec, "twheel-redis format %d shards %u",
                      META_FORMAT, d->shards);
    const char *argv[6] = {"EVAL", meta_script, "1", key, rec, ro ? "1" : "0"};
    size_t len[6] = {4, sizeof meta_script - 1, 1, (size_t)kl, (size_t)rl, 1};
    tw__rc_cmd cmd = {6, argv, len, tw__rc_slot(key, (size_t)kl), NULL, 0};
    int rc = tw__rc_exec(d->rc, &cmd, 1);
    const redisReply *r = cmd.reply;
    if (!rc && r->type == REDIS_REPLY_ERROR)
        rc = tw__rc_cmd_error(d->rc, &cmd, "the namespace record");
    else if (!rc && r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_NIL)
        rc = TW_EIO;
    if (rc) {
        tw__rc_last_error(d->rc, eb, el);
    } else if (r->type == REDIS_REPLY_STRING) {
        char got[80];
        snprintf(got, sizeof got, "%.*s", (int)r->len, r->str);
        rc = meta_judge(d, got, key, adopt, eb, el);
    }
    tw__rc_free_replies(&cmd, 1);
    return rc;
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

/* The type Redis names @t as the struct's static text (what
 * tw_durable_damage.record points at). */
static const char *type_name(const char *t)
{
    static const char *const known[] = {"string", "list", "set",
                                        "zset",   "hash", "stream"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
        if (!strcmp(t, known[i]))
            return known[i];
    return "other";
}

/* One report per key of the namespace of the wrong type, through
 * cfg.on_damage (TW_DURABLE_DAMAGE_REDIS_KEY): one TYPE per key, all
 * pipelined, only when the caller asked for reports. The scripts set
 * such a key aside at their next write; until then a read-only reader
 * (twheel redis ls) cannot read that shard, and says which key it is. */
static int rd_type_scan(struct rd *d, const tw_durable_config *cfg)
{
    static const char *const want[NKEYS] = {"zset",   "hash", "string",
                                            "string", "hash", "zset"};
    size_t n = (size_t)d->shards * NKEYS;
    tw__rc_cmd *cmds = tw__calloc(n, sizeof *cmds);
    const char **argv = tw__calloc(n * 2, sizeof *argv);
    size_t *len = tw__calloc(n * 2, sizeof *len);
    int rc = cmds && argv && len ? 0 : TW_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++) {
        const struct shard_keys *k = &d->sk[i / NKEYS];
        argv[2 * i] = "TYPE", len[2 * i] = 4;
        argv[2 * i + 1] = k->name[i % NKEYS];
        len[2 * i + 1] = k->len[i % NKEYS];
        cmds[i] = (tw__rc_cmd){2, argv + 2 * i, len + 2 * i, k->slot, NULL, 0};
    }
    if (!rc)
        rc = tw__rc_exec(d->rc, cmds, n);
    for (size_t i = 0; !rc && i < n; i++) {
        const redisReply *r = cmds[i].reply;
        if (r->type != REDIS_REPLY_STATUS || !strcmp(r->str, want[i % NKEYS]) ||
            !strcmp(r->str, "none"))
            continue;
        tw_durable_damage dm = {.kind = TW_DURABLE_DAMAGE_REDIS_KEY,
                                .segment = (uint32_t)(i / NKEYS),
                                .records = 1,
                                .key = argv[2 * i + 1],
                                .key_len = len[2 * i + 1],
                                .record = type_name(r->str)};
        cfg->on_damage(cfg->on_damage_arg, &dm);
    }
    if (cmds)
        tw__rc_free_replies(cmds, n);
    tw__free(cmds);
    tw__free(argv);
    tw__free(len);
    return rc;
}

/* The commands a claiming and firing store sends, directly or from its
 * scripts, each as one probe on the scratch keys {ns:probe}:k (a
 * string), :h (a hash) and :z (a sorted set), in an order that leaves
 * nothing behind but :k, which expires. "?" marks the optional ones:
 * WAIT with cfg.wait_replicas, PEXPIRE, PTTL and ZREMRANGEBYSCORE with
 * ownership. A reply other than NOPERM (NOSCRIPT, WRONGTYPE, a cluster
 * that is disabled) means the command may run. */
static const char *const probes[][6] = {
    {"GET", "k"},
    {"SET", "k", "1", "PX", "10000"},
    {"DUMP", "k"},
    {"TYPE", "k"},
    {"TIME"},
    {"?o", "PEXPIRE", "k", "10000"},
    {"?o", "PTTL", "k"},
    {"HSET", "h", "f", "v"},
    {"HGET", "h", "f"},
    {"HMGET", "h", "f"},
    {"HLEN", "h"},
    {"HSCAN", "h", "0"},
    {"HDEL", "h", "f"},
    {"ZADD", "z", "0", "m"},
    {"ZRANGE", "z", "0", "0"},
    {"ZRANGEBYSCORE", "z", "0", "0"},
    {"ZRANGEBYLEX", "z", "-", "+"},
    {"ZSCORE", "z", "m"},
    {"ZMSCORE", "z", "m"},
    {"ZCARD", "z"},
    {"ZCOUNT", "z", "0", "0"},
    {"?o", "ZREMRANGEBYSCORE", "z", "1", "0"},
    {"ZREM", "z", "m"},
    {"EVAL", "return 1", "0"},
    {"EVALSHA", "0000000000000000000000000000000000000000", "0"},
    {"CLUSTER", "SLOTS"},
    {"?w", "WAIT", "0", "0"},
    {"DEL", "k"},
};

/* Fill @c with probe @p (its scratch key, if any, named from @key,
 * "{ns:probe}:", into @names); false if the probe does not apply. */
static bool probe_fill(struct rd *d, const char *const *p, const char *key,
                       char (*names)[96], tw__rc_cmd *c, const char **argv,
                       size_t *len)
{
    if (p[0][0] == '?') {
        if ((p[0][1] == 'o' && !d->shard_lease_ms) ||
            (p[0][1] == 'w' && !d->wait_replicas))
            return false;
        p++;
    }
    int argc = 0;
    c->slot = -1;
    for (; argc < 5 && p[argc]; argc++) {
        argv[argc] = p[argc];
        static const char kinds[] = "khz"; /* names[0], [1], [2] */
        const char *k =
            argc == 1 && p[1][0] && !p[1][1] ? strchr(kinds, p[1][0]) : NULL;
        if (k) {
            char *name = names[k - kinds];
            snprintf(name, 96, "%s%c", key, *k);
            argv[1] = name;
            c->slot = tw__rc_slot(name, strlen(name));
        }
        len[argc] = strlen(argv[argc]);
    }
    c->argc = argc;
    c->argv = argv;
    c->argvlen = len;
    return true;
}

/* Can this user run every command the store will send? One probe per
 * command (probes[] above), all pipelined; the first refused (NOPERM)
 * fails the open with TW_EAUTH, naming it. ACL DRYRUN would need a
 * permission an application user seldom has; a probe needs only the
 * command itself. */
static int rd_probe_perms(struct rd *d, const char *ns)
{
    enum { NP = sizeof probes / sizeof probes[0] };
    char key[80], names[3][96];
    const char *argv[NP][5];
    size_t len[NP][5];
    tw__rc_cmd cmds[NP];
    size_t n = 0;
    snprintf(key, sizeof key, "{%s:probe}:", ns);
    for (size_t i = 0; i < NP; i++)
        if (probe_fill(d, probes[i], key, names, &cmds[n], argv[n], len[n]))
            n++;
    int rc = tw__rc_exec(d->rc, cmds, n);
    for (size_t i = 0; i < n && !rc; i++) {
        const redisReply *r = cmds[i].reply;
        char what[40];
        snprintf(what, sizeof what, "%s%s", cmds[i].argv[0],
                 strcmp(cmds[i].argv[0], "CLUSTER") ? "" : " SLOTS");
        if (r->type == REDIS_REPLY_ERROR && !strncmp(r->str, "NOPERM", 6))
            rc = tw__rc_cmd_error(d->rc, &cmds[i], what);
    }
    tw__rc_free_replies(cmds, n);
    return rc;
}

/* rd_probe_perms() after open, for src/redis_errors.c. */
int tw__rd_probe_perms(struct rd *d, const char *ns)
{
    return rd_probe_perms(d, ns);
}

/* The per-shard arrays again after a read-only open took the record's
 * shard count. */
static int rd_reshape(struct rd *d, const char *ns)
{
    tw__free(d->sk);
    tw__free(d->grp_of);
    d->sk = NULL;
    d->grp_of = tw__calloc(d->shards, 1);
    return d->grp_of ? rd_keys(d, ns) : TW_ENOMEM;
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
    rc = rd_load_scripts(d);
    if (!rc)
        rc = rd_probe_keys(d);
    if (rc) {
        tw__rc_last_error(d->rc, cfg->errbuf, cfg->errbuf_len);
        return rc;
    }
    bool ro = cfg->flags & (TW_DURABLE_READONLY | TW_DURABLE_NOFIRE);
    bool adopt = !cfg->shards;
    uint32_t asked = d->shards;
    rc = rd_meta(d, ns, ro, adopt, cfg->errbuf, cfg->errbuf_len);
    if (!rc && d->shards != asked)
        rc = rd_reshape(d, ns);
    if (!rc && cfg->on_damage)
        rc = rd_type_scan(d, cfg);
    if (!rc && !ro && (rc = rd_probe_perms(d, ns)))
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
                          cfg->redis_shard_lease_ms, own_gain, own_healthy, d);
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

static int rd_schedule_many(tw_durable *base, tw_durable_item *items, size_t n)
{
    return sched_run(base, items, NULL, n);
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
 * the schedules as one rd_schedule_many, the cancels as one pipelined
 * round trip; the others sleep until their call is answered, and the
 * calls queued meanwhile make the next batch. */

enum { OP_SCHED, OP_CANCEL };

struct op_wait {
    struct tw__combine_req req; /* first: the combiner's */
    int kind;
    tw_durable_item it; /* a cancel uses key and key_len */
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

/* Run the batch @list: schedules together, cancels together. */
static void op_batch(struct rd *d, struct op_wait *list)
{
    size_t n = 0, ns = 0, nc = 0;
    for (struct tw__combine_req *r = &list->req; r; r = r->next)
        n++;
    tw_durable_item *items = tw__malloc(n * sizeof *items);
    struct op_wait **v = tw__malloc(n * sizeof *v);
    if (!items || !v) {
        for (struct tw__combine_req *r = &list->req; r; r = r->next)
            ((struct op_wait *)r)->it.result = TW_ENOMEM;
        tw__free(items);
        tw__free(v);
        return;
    }
    for (struct tw__combine_req *r = &list->req; r; r = r->next) {
        struct op_wait *w = (struct op_wait *)r;
        if (w->kind == OP_SCHED)
            items[ns++] = w->it;
        else
            v[nc++] = w;
    }
    if (nc)
        cancel_batch(d, v, NULL, nc);
    if (ns)
        rd_schedule_many(&d->base, items, ns);
    ns = 0;
    for (struct tw__combine_req *r = &list->req; r; r = r->next) {
        struct op_wait *w = (struct op_wait *)r;
        if (w->kind == OP_SCHED)
            w->it.result = items[ns++].result;
    }
    tw__free(items);
    tw__free(v);
}

/* The combiner's round (op_mu held, d->mu not): the calls from @first on
 * as one batch, then each marked done, after which its caller may return
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
 * answers with an error: 0. */
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
