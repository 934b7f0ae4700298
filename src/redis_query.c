/* SPDX-License-Identifier: MIT */
/*
 * src/redis_query.c - the Redis backend's look-ups and listings:
 * tw_durable_get(), tw_durable_list(), tw_durable_scan(),
 * tw_durable_list_dead(), and the dead-letter calls tw_durable_rearm() and
 * tw_durable_dead_delete().
 *
 * A look-up is one read-only script on the key's shard (GET, sent with
 * EVAL: Redis caches a script's compiled body by its digest). A listing
 * sends one script per shard, all pipelined (one round trip per Redis
 * node), each returning at most the page's size in (due, key) order (LIST)
 * or key order (DEAD); the replies are merged and sorted here, and the
 * page ends early ("more") when some shard returned a full page. A scan
 * walks every shard's :p by HSCAN, the shards with more in one pipelined
 * round trip at a time. The dead-letter calls are REARM and DDEL, with a
 * WAIT for the configured replicas. None of these touches the node's
 * claimed timers (src/redis_fire.c): they read what Redis holds.
 */
#define _GNU_SOURCE

#include <inttypes.h>
#include <stdlib.h>

#include "durable_redis_impl.h"

/* EVAL of @script on @shard's :d and :p (@keys "dp"; or the suffixes of
 * the keys it takes, in order: 2 or 3) with @argc arguments. */
static void eval_cmd(struct rd *d, tw__rc_cmd *cmd, const char **argv,
                     size_t *len, const char *script, size_t script_len,
                     uint32_t shard, int argc, const char *keys)
{
    int nk = (int)strlen(keys);
    argv[0] = "EVAL";
    len[0] = 4;
    argv[1] = script;
    len[1] = script_len;
    argv[2] = nk == 3 ? "3" : "2";
    len[2] = 1;
    for (int k = 0; k < nk; k++) {
        int i =
            (int)((const char *)memchr(tw__redis_key_suffix, keys[k], NKEYS) -
                  tw__redis_key_suffix);
        argv[3 + k] = d->sk[shard].name[i];
        len[3 + k] = d->sk[shard].len[i];
    }
    *cmd = (tw__rc_cmd){3 + nk + argc, argv, len, d->sk[shard].slot, NULL, 0};
}

int tw__rd_get(tw_durable *base, const void *key, size_t key_len,
               tw_durable_info *info, void *buf, size_t buf_len)
{
    struct rd *d = (struct rd *)base;
    const char *argv[7];
    size_t len[7];
    tw__rc_cmd cmd;
    eval_cmd(d, &cmd, argv, len, tw__redis_get_script,
             strlen(tw__redis_get_script), shard_of(d, key, key_len), 1, "dpx");
    argv[6] = key;
    len[6] = key_len;
    int rc = tw__rc_exec(d->rc, &cmd, 1);
    const redisReply *r = cmd.reply;
    struct pval v;
    if (!rc && r && r->type == REDIS_REPLY_NIL) {
        rc = TW_ENOENT;
    } else if (!rc && (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
                       r->element[0]->type != REDIS_REPLY_STRING ||
                       r->element[1]->type != REDIS_REPLY_STRING ||
                       !tw__rd_parse_val(r->element[1]->str, r->element[1]->len,
                                         &v))) {
        rc = TW_EIO; /* not what this library writes */
    } else if (!rc) {
        info->due_ms = v.due;
        info->attempt = v.attempt ? v.attempt : 1;
        info->state = v.due <= rd_wall(d) ? TW_DURABLE_DUE : TW_DURABLE_WAITING;
        if (r->element[0]->len == 4 && !memcmp(r->element[0]->str, "dead", 4))
            info->state = TW_DURABLE_DEAD; /* attempt: the attempts it had */
        info->payload_len = v.len;
        if (buf_len && v.len)
            memcpy(buf, v.payload, buf_len < v.len ? buf_len : v.len);
    }
    free_replies(&cmd, 1);
    return rc;
}

/* One listed timer while the shards' replies are merged. */
struct lent {
    uint64_t due;
    const redisReply *key;
};

static int lent_cmp(const void *a, const void *b)
{
    const struct lent *x = a, *y = b;
    if (x->due != y->due)
        return x->due < y->due ? -1 : 1;
    size_t n = x->key->len < y->key->len ? x->key->len : y->key->len;
    int c = memcmp(x->key->str, y->key->str, n);
    if (c)
        return c;
    return x->key->len < y->key->len ? -1 : x->key->len > y->key->len;
}

/* A due time as LIST returns it: an integer, or a score in a double's
 * text form; clamped to [0, INT64_MAX]. False if it is neither. */
static bool list_due(const redisReply *u, uint64_t *due)
{
    if (u->type != REDIS_REPLY_STRING || !u->len || u->len > 40)
        return false;
    char b[48], *end;
    memcpy(b, u->str, u->len);
    b[u->len] = '\0';
    double v = strtod(b, &end);
    if (end != b + u->len || v != v)
        return false;
    long long i = strtoll(b, &end, 10);
    if (end == b + u->len) /* an integer: exact */
        *due = i < 0 ? 0 : (uint64_t)i;
    else
        *due = v <= 0                       ? 0
               : v >= 9223372036854775807.0 ? INT64_MAX
                                            : (uint64_t)v;
    return true;
}

/* The entries of one shard's LIST reply into @e; how many, or -1 when the
 * reply is not a LIST reply. */
static long list_reply(const redisReply *r, struct lent *e)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements % 2)
        return -1;
    for (size_t i = 0; i < r->elements; i += 2) {
        const redisReply *k = r->element[i];
        uint64_t due;
        if (k->type != REDIS_REPLY_STRING || !k->len ||
            k->len > TW_DURABLE_KEY_MAX || !list_due(r->element[i + 1], &due))
            return -1;
        e[i / 2] = (struct lent){due, k};
    }
    return (long)(r->elements / 2);
}

/* What a listing of @ns shards allocated (each may be NULL). */
static void list_free(void *all, tw__rc_cmd *cmds, size_t ns, const char **argv,
                      size_t *len)
{
    tw__free(all);
    if (cmds)
        free_replies(cmds, ns);
    tw__free(cmds);
    tw__free(argv);
    tw__free(len);
}

int tw__rd_list(tw_durable *base, const struct tw__list_req *q,
                tw_durable_entry *out, bool *end)
{
    struct rd *d = (struct rd *)base;
    size_t ns = d->shards, per = q->max;
    tw__rc_cmd *cmds = tw__calloc(ns, sizeof *cmds);
    const char **argv = tw__malloc(ns * 10 * sizeof *argv);
    size_t *len = tw__malloc(ns * 10 * sizeof *len);
    char nums[3][24];
    size_t nl[3];
    nl[0] = (size_t)snprintf(nums[0], 24, "%" PRIu64, q->from);
    nl[1] = (size_t)snprintf(nums[1], 24, "%" PRIu64, q->to);
    nl[2] = (size_t)snprintf(nums[2], 24, "%zu", per);
    struct lent *all = NULL;
    int rc = cmds && argv && len ? 0 : TW_ENOMEM;
    for (size_t i = 0; i < ns && !rc; i++) {
        const char **a = argv + 10 * i;
        size_t *l = len + 10 * i;
        eval_cmd(d, &cmds[i], a, l, tw__redis_list_script,
                 strlen(tw__redis_list_script), (uint32_t)i, 5, "dp");
        a[5] = nums[0];
        l[5] = nl[0];
        a[6] = q->key_len ? (const char *)q->key : "";
        l[6] = q->key_len;
        a[7] = q->after ? "1" : "0";
        l[7] = 1;
        a[8] = nums[1];
        l[8] = nl[1];
        a[9] = nums[2];
        l[9] = nl[2];
    }
    if (!rc)
        rc = tw__rc_exec(d->rc, cmds, ns);
    size_t total = 0;
    bool more = false; /* some shard may hold more than it returned */
    for (size_t i = 0; i < ns && !rc; i++) {
        const redisReply *r = cmds[i].reply;
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements / 2 > per)
            rc = TW_EIO;
        else
            total += r->elements / 2;
    }
    if (!rc && total)
        all = tw__malloc(total * sizeof *all);
    if (!rc && total && !all)
        rc = TW_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < ns && !rc && all; i++) { /* none: all is NULL */
        long got = list_reply(cmds[i].reply, all + k);
        if (got < 0)
            rc = TW_EIO;
        else
            k += (size_t)got;
        more |= got == (long)per;
    }
    size_t n = 0, used = 0;
    if (!rc) {
        if (total)
            qsort(all, total, sizeof *all, lent_cmp);
        int64_t now = rd_wall(d);
        while (n < q->max && n < total &&
               tw__list_put(q, &used, &out[n], all[n].key->str, all[n].key->len,
                            all[n].due, now))
            n++;
        *end = n == total && !more;
    }
    list_free(all, cmds, ns, argv, len);
    return rc ? rc : (int)n;
}

/* ------------------------------------------------------------------------ */
/* Dead letters (see src/redis_scripts.c). */

int tw__rd_dead_op(tw_durable *base, const void *key, size_t key_len,
                   int64_t due_ms, bool del)
{
    struct rd *d = (struct rd *)base;
    uint32_t sh = shard_of(d, key, key_len);
    struct call c;
    tw__rd_call_init(d, &c, del ? S_DDEL : S_REARM, sh);
    call_arg(&c, key, key_len);
    if (!del)
        call_num(&c, due_ms);
    long long res = 0;
    int rc = tw__rd_call_int(d, &c, &res);
    if (!rc)
        rc = res == 1 ? 0 : res == 0 ? TW_ENOENT : TW_EIO;
    if (!rc && d->wait_replicas)
        tw__rd_wait_many(d, &sh, &rc, 1);
    return rc;
}

/* A dead letter of a DEAD reply while the shards' replies are merged. */
struct dent {
    const redisReply *key, *due;
};

static int dent_cmp(const void *a, const void *b)
{
    const struct dent *x = a, *y = b;
    size_t n = x->key->len < y->key->len ? x->key->len : y->key->len;
    int c = memcmp(x->key->str, y->key->str, n);
    if (c)
        return c;
    return x->key->len < y->key->len ? -1 : x->key->len > y->key->len;
}

int tw__rd_list_dead(tw_durable *base, const struct tw__list_req *q,
                     tw_durable_entry *out, bool *end)
{
    struct rd *d = (struct rd *)base;
    size_t ns = d->shards, per = q->max, total = 0;
    tw__rc_cmd *cmds = tw__calloc(ns, sizeof *cmds);
    const char **argv = tw__malloc(ns * 8 * sizeof *argv);
    size_t *len = tw__malloc(ns * 8 * sizeof *len);
    char num[24];
    size_t numlen = (size_t)snprintf(num, sizeof num, "%zu", per);
    int rc = cmds && argv && len ? 0 : TW_ENOMEM;
    for (size_t i = 0; i < ns && !rc; i++) {
        const char **a = argv + 8 * i;
        size_t *l = len + 8 * i;
        eval_cmd(d, &cmds[i], a, l, tw__redis_dead_script,
                 strlen(tw__redis_dead_script), (uint32_t)i, 3, "xp");
        a[5] = q->key_len ? (const char *)q->key : "";
        l[5] = q->key_len;
        a[6] = q->after ? "1" : "0";
        l[6] = 1;
        a[7] = num;
        l[7] = numlen;
    }
    if (!rc)
        rc = tw__rc_exec(d->rc, cmds, ns);
    for (size_t i = 0; i < ns && !rc; i++) {
        const redisReply *r = cmds[i].reply;
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements % 2 ||
            r->elements / 2 > per)
            rc = TW_EIO;
        else
            total += r->elements / 2;
    }
    struct dent *all = !rc && total ? tw__malloc(total * sizeof *all) : NULL;
    if (!rc && total && !all)
        rc = TW_ENOMEM;
    bool more = false; /* some shard may hold more than it returned */
    size_t k = 0;
    for (size_t i = 0; i < ns && !rc && all; i++) {
        const redisReply *r = cmds[i].reply;
        for (size_t j = 0; j < r->elements && !rc; j += 2) {
            const redisReply *key = r->element[j];
            if (key->type != REDIS_REPLY_STRING || !key->len ||
                key->len > TW_DURABLE_KEY_MAX)
                rc = TW_EIO;
            all[k++] = (struct dent){key, r->element[j + 1]};
        }
        more |= r->elements / 2 == per;
    }
    size_t n = 0, used = 0;
    if (!rc) {
        if (total)
            qsort(all, total, sizeof *all, dent_cmp);
        while (n < q->max && n < total &&
               tw__list_put(q, &used, &out[n], all[n].key->str, all[n].key->len,
                            0, 0)) {
            uint64_t due = 0;
            out[n].due_ms = list_due(all[n].due, &due) ? (int64_t)due : 0;
            out[n].state = TW_DURABLE_DEAD;
            n++;
        }
        *end = n == total && !more;
    }
    list_free(all, cmds, ns, argv, len);
    return rc ? rc : (int)n;
}

/* tw_durable_scan(): HSCAN of every shard's :p, the shards that have more
 * in one pipelined round trip at a time, by a read-only script that also
 * says which keys are dead letters (in :x). Values that are not what this
 * library writes are skipped (a CLAIM sets them aside). */
long tw__rd_scan(tw_durable *base, tw_durable_scan_fn fn, void *arg)
{
    struct rd *d = (struct rd *)base;
    size_t ns = d->shards;
    tw__rc_cmd *cmds = tw__calloc(ns, sizeof *cmds);
    const char **argv = tw__malloc(ns * 6 * sizeof *argv);
    size_t *len = tw__malloc(ns * 6 * sizeof *len);
    char(*cur)[24] = tw__calloc(ns, sizeof *cur);
    uint32_t *shard = tw__malloc(ns * sizeof *shard);
    long count = 0;
    int rc = cmds && argv && len && cur && shard ? 0 : TW_ENOMEM;
    size_t active = ns;
    for (size_t i = 0; i < ns && !rc; i++) {
        cur[i][0] = '0';
        shard[i] = (uint32_t)i;
    }
    while (!rc && active) {
        for (size_t i = 0; i < active; i++) {
            const char **a = argv + 6 * i;
            size_t *l = len + 6 * i, sh = shard[i];
            a[0] = "EVAL";
            l[0] = 4;
            a[1] = tw__redis_scan_script;
            l[1] = strlen(tw__redis_scan_script);
            a[2] = "2";
            l[2] = 1;
            a[3] = d->sk[sh].name[1]; /* :p */
            l[3] = d->sk[sh].len[1];
            a[4] = d->sk[sh].name[5]; /* :x */
            l[4] = d->sk[sh].len[5];
            a[5] = cur[sh];
            l[5] = strlen(cur[sh]);
            cmds[i] = (tw__rc_cmd){6, a, l, d->sk[sh].slot, NULL, 0};
        }
        rc = tw__rc_exec(d->rc, cmds, active);
        int64_t now = rd_wall(d);
        size_t still = 0;
        for (size_t i = 0; i < active && !rc; i++) {
            const redisReply *r = cmds[i].reply;
            if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
                r->element[0]->type != REDIS_REPLY_STRING ||
                r->element[0]->len >= sizeof cur[0] ||
                r->element[1]->type != REDIS_REPLY_ARRAY ||
                r->element[1]->elements % 3) {
                rc = TW_EIO;
                break;
            }
            const redisReply *f = r->element[1];
            for (size_t j = 0; j < f->elements && !rc; j += 3) {
                const redisReply *k = f->element[j], *v = f->element[j + 1];
                bool dead = f->element[j + 2]->type == REDIS_REPLY_INTEGER &&
                            f->element[j + 2]->integer == 1;
                struct pval pv;
                if (k->type != REDIS_REPLY_STRING || !k->len ||
                    k->len > TW_DURABLE_KEY_MAX ||
                    v->type != REDIS_REPLY_STRING ||
                    !tw__rd_parse_val(v->str, v->len, &pv))
                    continue;
                tw_durable_scanned t = {.key = k->str,
                                        .key_len = k->len,
                                        .payload = pv.payload,
                                        .payload_len = pv.len,
                                        .due_ms = pv.due,
                                        .attempt = pv.attempt ? pv.attempt : 1,
                                        .state = dead ? TW_DURABLE_DEAD
                                                 : pv.due <= now
                                                     ? TW_DURABLE_DUE
                                                     : TW_DURABLE_WAITING};
                count++;
                int x = fn(arg, &t);
                if (x)
                    rc = x < 0 ? x : 1;
            }
            size_t sh = shard[i];
            memcpy(cur[sh], r->element[0]->str, r->element[0]->len);
            cur[sh][r->element[0]->len] = '\0';
            if (strcmp(cur[sh], "0") != 0)
                shard[still++] = (uint32_t)sh;
        }
        free_replies(cmds, active);
        memset(cmds, 0, active * sizeof *cmds);
        active = still;
    }
    tw__free(cmds);
    tw__free(argv);
    tw__free(len);
    tw__free(cur);
    tw__free(shard);
    if (rc == 1)
        return count;
    return rc ? rc : count;
}
