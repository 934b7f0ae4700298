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
    tw__rc_free_replies(&cmd, 1);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Listings: one script call per shard, pipelined; the pages of every
 * shard merged and sorted here. */

/* One listed timer or dead letter while the shards' replies are merged. */
struct lent {
    uint64_t due;
    const redisReply *key;
};

/* Byte order of two keys, as Redis orders members. */
static int key_cmp(const redisReply *x, const redisReply *y)
{
    size_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->str, y->str, n);
    if (c)
        return c;
    return x->len < y->len ? -1 : x->len > y->len;
}

/* (due, key) order: LIST's. */
static int lent_cmp(const void *a, const void *b)
{
    const struct lent *x = a, *y = b;
    if (x->due != y->due)
        return x->due < y->due ? -1 : 1;
    return key_cmp(x->key, y->key);
}

/* Key order: DEAD's. */
static int dent_cmp(const void *a, const void *b)
{
    const struct lent *x = a, *y = b;
    return key_cmp(x->key, y->key);
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

/* A DEAD entry's due time: the integer at the head of its value, or 0. */
static bool dead_entry_due(const redisReply *u, uint64_t *due)
{
    if (!list_due(u, due))
        *due = 0;
    return true;
}

/* A listing as sent to every shard: @script on the keys @keys ("dp",
 * "xp") with the @argc arguments @arg, returning at most @per (key, due)
 * pairs; @due reads a pair's due time (false: not a reply of ours), @cmp
 * orders the merged entries. */
struct page_req {
    const char *script, *keys;
    const char *const *arg;
    const size_t *arg_len;
    int argc;
    size_t per;
    bool (*due)(const redisReply *u, uint64_t *due);
    int (*cmp)(const void *a, const void *b);
};

/* The merged page: every shard's entries in @all (their keys point into
 * the replies in @cmds), sorted; @more when a shard may hold more than it
 * returned. */
struct page {
    tw__rc_cmd *cmds;
    const char **argv;
    size_t *len;
    size_t ns, total;
    struct lent *all;
    bool more;
};

static void page_free(struct page *pg)
{
    tw__free(pg->all);
    if (pg->cmds)
        tw__rc_free_replies(pg->cmds, pg->ns);
    tw__free(pg->cmds);
    tw__free(pg->argv);
    tw__free(pg->len);
}

/* Send @q's script to every shard, one round trip per node. */
static int page_send(struct rd *d, const struct page_req *q, struct page *pg)
{
    size_t ns = pg->ns, k = 3 + strlen(q->keys) + (size_t)q->argc;
    pg->cmds = tw__calloc(ns, sizeof *pg->cmds);
    pg->argv = tw__malloc(ns * k * sizeof *pg->argv);
    pg->len = tw__malloc(ns * k * sizeof *pg->len);
    if (!pg->cmds || !pg->argv || !pg->len)
        return TW_ENOMEM;
    for (size_t i = 0; i < ns; i++) {
        const char **a = pg->argv + k * i;
        size_t *l = pg->len + k * i;
        eval_cmd(d, &pg->cmds[i], a, l, q->script, strlen(q->script),
                 (uint32_t)i, q->argc, q->keys);
        memcpy(a + k - (size_t)q->argc, q->arg, (size_t)q->argc * sizeof *a);
        memcpy(l + k - (size_t)q->argc, q->arg_len,
               (size_t)q->argc * sizeof *l);
    }
    return tw__rc_exec(d->rc, pg->cmds, ns);
}

/* The entries of shard reply @r into @e; false when it is not a reply of
 * @q's script. */
static bool page_entries(const struct page_req *q, const redisReply *r,
                         struct lent *e)
{
    for (size_t i = 0; i < r->elements; i += 2) {
        const redisReply *k = r->element[i];
        if (k->type != REDIS_REPLY_STRING || !k->len ||
            k->len > TW_DURABLE_KEY_MAX || !q->due(r->element[i + 1], &e->due))
            return false;
        e->key = k;
        e++;
    }
    return true;
}

/* One page of a listing over every shard, merged and sorted into @pg
 * (page_free() it). */
static int page_read(struct rd *d, const struct page_req *q, struct page *pg)
{
    *pg = (struct page){.ns = d->shards};
    int rc = page_send(d, q, pg);
    for (size_t i = 0; i < pg->ns && !rc; i++) {
        const redisReply *r = pg->cmds[i].reply;
        if (!r || r->type != REDIS_REPLY_ARRAY || r->elements % 2 ||
            r->elements / 2 > q->per)
            rc = TW_EIO;
        else
            pg->total += r->elements / 2;
    }
    if (rc || !pg->total)
        return rc;
    pg->all = tw__malloc(pg->total * sizeof *pg->all);
    if (!pg->all)
        return TW_ENOMEM;
    for (size_t i = 0, k = 0; i < pg->ns; i++) {
        const redisReply *r = pg->cmds[i].reply;
        if (!page_entries(q, r, pg->all + k))
            return TW_EIO;
        k += r->elements / 2;
        pg->more |= r->elements / 2 == q->per;
    }
    qsort(pg->all, pg->total, sizeof *pg->all, q->cmp);
    return 0;
}

int tw__rd_list(tw_durable *base, const struct tw__list_req *q,
                tw_durable_entry *out, bool *end)
{
    struct rd *d = (struct rd *)base;
    char nums[3][24];
    size_t al[5];
    al[0] = (size_t)snprintf(nums[0], 24, "%" PRIu64, q->from);
    al[3] = (size_t)snprintf(nums[1], 24, "%" PRIu64, q->to);
    al[4] = (size_t)snprintf(nums[2], 24, "%zu", q->max);
    al[1] = q->key_len;
    al[2] = 1;
    const char *arg[5] = {nums[0], q->key_len ? (const char *)q->key : "",
                          q->after ? "1" : "0", nums[1], nums[2]};
    struct page_req req = {
        tw__redis_list_script, "dp", arg, al, 5, q->max, list_due, lent_cmp};
    struct page pg;
    int rc = page_read(d, &req, &pg);
    size_t n = 0, used = 0;
    if (!rc) {
        int64_t now = rd_wall(d);
        while (n < q->max && n < pg.total &&
               tw__list_put(q, &used, &out[n], pg.all[n].key->str,
                            pg.all[n].key->len, pg.all[n].due, now))
            n++;
        *end = n == pg.total && !pg.more;
    }
    page_free(&pg);
    return rc ? rc : (int)n;
}

int tw__rd_list_dead(tw_durable *base, const struct tw__list_req *q,
                     tw_durable_entry *out, bool *end)
{
    struct rd *d = (struct rd *)base;
    char num[24];
    size_t al[3] = {q->key_len, 1,
                    (size_t)snprintf(num, sizeof num, "%zu", q->max)};
    const char *arg[3] = {q->key_len ? (const char *)q->key : "",
                          q->after ? "1" : "0", num};
    struct page_req req = {tw__redis_dead_script, "xp",    arg, al, 3, q->max,
                           dead_entry_due,        dent_cmp};
    struct page pg;
    int rc = page_read(d, &req, &pg);
    size_t n = 0, used = 0;
    if (!rc) {
        while (n < q->max && n < pg.total &&
               tw__list_put(q, &used, &out[n], pg.all[n].key->str,
                            pg.all[n].key->len, 0, 0)) {
            out[n].due_ms = (int64_t)pg.all[n].due;
            out[n].state = TW_DURABLE_DEAD;
            n++;
        }
        *end = n == pg.total && !pg.more;
    }
    page_free(&pg);
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
    pthread_mutex_lock(&d->mu);
    claim_soon_locked(d, sh);
    pthread_mutex_unlock(&d->mu);
    if (!rc)
        rc = res == 1 ? 0 : res == 0 ? TW_ENOENT : TW_EIO;
    if (!rc && d->wait_replicas)
        tw__rd_wait_many(d, &sh, &rc, 1);
    return rc;
}

/* tw_durable_restore(): the value "due,attempt,payload" built here, the
 * key written by RESTORE if its shard does not hold it. */
int tw__rd_restore(tw_durable *base, const tw_durable_scanned *t)
{
    struct rd *d = (struct rd *)base;
    bool dead = t->state == TW_DURABLE_DEAD;
    uint32_t sh = shard_of(d, t->key, t->key_len);
    char head[48];
    int hn = snprintf(head, sizeof head, "%lld,%u,", (long long)t->due_ms,
                      dead || t->attempt ? t->attempt : 1u);
    char *val = tw__malloc((size_t)hn + t->payload_len + 1);
    if (!val)
        return TW_ENOMEM;
    memcpy(val, head, (size_t)hn);
    if (t->payload_len)
        memcpy(val + hn, t->payload, t->payload_len);
    struct call c;
    tw__rd_call_init(d, &c, S_RESTORE, sh);
    call_arg(&c, t->key, t->key_len);
    call_num(&c, t->due_ms);
    call_arg(&c, val, (size_t)hn + t->payload_len);
    call_arg(&c, dead ? "1" : "0", 1);
    long long res = 0;
    int rc = tw__rd_call_int(d, &c, &res);
    tw__free(val);
    pthread_mutex_lock(&d->mu);
    claim_soon_locked(d, sh);
    pthread_mutex_unlock(&d->mu);
    if (!rc)
        rc = res == 1 ? 0 : TW_EEXIST;
    if (!rc && d->wait_replicas)
        tw__rd_wait_many(d, &sh, &rc, 1);
    return rc;
}

struct scan {
    tw__rc_cmd *cmds;
    const char **argv;
    size_t *len;
    char (*cur)[24]; /* per shard: its HSCAN cursor */
    uint32_t *shard; /* the shards with more, [0, active) */
    size_t active;
    long count; /* entries handed to the callback */
};

/* Hand the entries of one SCAN reply to @fn: 0, the callback's stop (1)
 * or error, or TW_EIO for a reply that is not SCAN's. */
static int scan_reply(const redisReply *r, int64_t now, tw_durable_scan_fn fn,
                      void *arg, long *count)
{
    if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
        r->element[0]->type != REDIS_REPLY_STRING || r->element[0]->len >= 24 ||
        r->element[1]->type != REDIS_REPLY_ARRAY || r->element[1]->elements % 3)
        return TW_EIO;
    const redisReply *f = r->element[1];
    for (size_t j = 0; j < f->elements; j += 3) {
        const redisReply *k = f->element[j], *v = f->element[j + 1];
        bool dead = f->element[j + 2]->type == REDIS_REPLY_INTEGER &&
                    f->element[j + 2]->integer == 1;
        struct pval pv;
        if (k->type != REDIS_REPLY_STRING || !k->len ||
            k->len > TW_DURABLE_KEY_MAX || v->type != REDIS_REPLY_STRING ||
            !tw__rd_parse_val(v->str, v->len, &pv))
            continue;
        tw_durable_scanned t = {.key = k->str,
                                .key_len = k->len,
                                .payload = pv.payload,
                                .payload_len = pv.len,
                                .due_ms = pv.due,
                                .attempt = pv.attempt ? pv.attempt : 1,
                                .state = dead            ? TW_DURABLE_DEAD
                                         : pv.due <= now ? TW_DURABLE_DUE
                                                         : TW_DURABLE_WAITING};
        (*count)++;
        int x = fn(arg, &t);
        if (x)
            return x < 0 ? x : 1;
    }
    return 0;
}

/* One round trip: SCAN on every shard that has more; the shards whose
 * cursor came back "0" are done. */
static int scan_round(struct rd *d, struct scan *s, tw_durable_scan_fn fn,
                      void *arg)
{
    for (size_t i = 0; i < s->active; i++) {
        uint32_t sh = s->shard[i];
        eval_cmd(d, &s->cmds[i], s->argv + 6 * i, s->len + 6 * i,
                 tw__redis_scan_script, strlen(tw__redis_scan_script), sh, 1,
                 "px");
        s->argv[6 * i + 5] = s->cur[sh];
        s->len[6 * i + 5] = strlen(s->cur[sh]);
    }
    int rc = tw__rc_exec(d->rc, s->cmds, s->active);
    int64_t now = rd_wall(d);
    size_t still = 0;
    for (size_t i = 0; i < s->active && !rc; i++) {
        const redisReply *r = s->cmds[i].reply;
        rc = scan_reply(r, now, fn, arg, &s->count);
        if (rc == TW_EIO)
            break;
        uint32_t sh = s->shard[i];
        memcpy(s->cur[sh], r->element[0]->str, r->element[0]->len);
        s->cur[sh][r->element[0]->len] = '\0';
        if (strcmp(s->cur[sh], "0") != 0)
            s->shard[still++] = sh;
    }
    tw__rc_free_replies(s->cmds, s->active);
    memset(s->cmds, 0, s->active * sizeof *s->cmds);
    s->active = still;
    return rc;
}

/* tw_durable_scan(): HSCAN of every shard's :p, the shards that have more
 * in one pipelined round trip at a time, by a read-only script that also
 * says which keys are dead letters (in :x). Values that are not what this
 * library writes are skipped (a CLAIM sets them aside). */
long tw__rd_scan(tw_durable *base, tw_durable_scan_fn fn, void *arg)
{
    struct rd *d = (struct rd *)base;
    size_t ns = d->shards;
    struct scan s = {.active = ns};
    s.cmds = tw__calloc(ns, sizeof *s.cmds);
    s.argv = tw__malloc(ns * 6 * sizeof *s.argv);
    s.len = tw__malloc(ns * 6 * sizeof *s.len);
    s.cur = tw__calloc(ns, sizeof *s.cur);
    s.shard = tw__malloc(ns * sizeof *s.shard);
    int rc = s.cmds && s.argv && s.len && s.cur && s.shard ? 0 : TW_ENOMEM;
    for (size_t i = 0; i < ns && !rc; i++) {
        s.cur[i][0] = '0';
        s.shard[i] = (uint32_t)i;
    }
    while (!rc && s.active)
        rc = scan_round(d, &s, fn, arg);
    tw__free(s.cmds);
    tw__free(s.argv);
    tw__free(s.len);
    tw__free(s.cur);
    tw__free(s.shard);
    if (rc == 1)
        return s.count;
    return rc ? rc : s.count;
}
