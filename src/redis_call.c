/* SPDX-License-Identifier: MIT */
/*
 * src/redis_call.c - the Redis backend's script calls, shared by its
 * files (src/durable_redis.c, src/redis_fire.c, src/redis_query.c; see
 * src/durable_redis.c for which does what): a call of one of the
 * scripts of src/redis_scripts.c on one shard (struct call: EVALSHA, the
 * digest, the shard's keys, its ownership fence when the shard must be
 * this node's), run pipelined with the others of a batch; WAIT for
 * replicas after writes; reading a timer's value; one allocation for a
 * batch's arrays.
 *
 * Layers: the calls are built here from the handle (struct rd, the
 * digests loaded at open, the shard's key names) and run by
 * src/redis_eval.c, the one place that turns a NOSCRIPT into EVAL, which
 * shard ownership (src/redis_owner.c) uses too; the fence is read from
 * src/redis_owner.c. Nothing here calls back into the files that use
 * it, so the backend's files call one another in one direction only
 * (docs/architecture.md draws the graph).
 *
 * Any thread, with none of the backend's locks needed: these read only
 * what open set (the digests, the key names, the WAIT settings) and, for
 * a fence, the ownership's state under its own lock.
 */
#define _GNU_SOURCE

#include <stdlib.h>

#include "durable_redis_impl.h"
#include "redis_eval.h"

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
 * gets EVAL, which loads the script there again (src/redis_eval.c). */
int tw__rd_run_cmds(struct rd *d, tw__rc_cmd *cmds, const int *script, size_t n)
{
    return tw__eval_run(d->rc, cmds, script, n, tw__redis_scripts);
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
