/* SPDX-License-Identifier: MIT */
/*
 * src/redis_checks.c - what an open of the Redis backend checks before
 * the store is used (src/durable_redis.c opens, and says which file does
 * what): that the user reaches the namespace's keys, the namespace's
 * record (its format and shard count, written by the first open), the
 * type of every key of the namespace (reported through cfg.on_damage),
 * and that the user may run every command the store will send.
 *
 * Each check is one pipelined round trip per node, run once at open by
 * the opening thread, before any other thread of the store exists; a
 * failure is a code with a message (cfg.errbuf) naming what was refused
 * or found, never a secret. Nothing here changes a timer: the checks
 * write only the namespace's record (once, by the first writing open)
 * and scratch keys of their own ({ns:probe}:k, :h and :z, see probes[]).
 */
#define _GNU_SOURCE

#include <stdlib.h>

#include "durable_redis_impl.h"

/* Can this user reach the namespace's keys? A GET of shard 0's version
 * key: an ACL user without the key pattern fails now, with NOPERM and
 * TW_EAUTH, rather than at its first schedule. Other errors (a value of
 * another type) are left to the scripts. */
int tw__rd_probe_keys(struct rd *d)
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
int tw__rd_meta(struct rd *d, const char *ns, bool ro, bool adopt, char *eb,
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
int tw__rd_type_scan(struct rd *d, const tw_durable_config *cfg)
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
int tw__rd_probe_perms(struct rd *d, const char *ns)
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
