/* SPDX-License-Identifier: MIT */
/*
 * src/redis_owner.c - fenced shard ownership for the Redis backend
 * (cfg.redis_shard_lease_ms > 0; src/durable_redis.c opens it,
 * src/redis_call.c fences the backend's calls with it, src/redis_fire.c
 * claims under it). Its scripts are loaded and run by src/redis_eval.c,
 * as the backend's are.
 *
 * Without it every node claims every shard: N nodes cost Redis N times
 * the claims of one, whether anything is due or not. With it each shard
 * has one owner at a time, and only the owner claims its due timers.
 *
 * Keys (namespace ns, shard s):
 *   {ns:S}:m  sorted set  node id -> the end of its membership (ms of
 *                         Redis's clock): the live nodes, as one master
 *                         sees them; S is the lowest shard that master
 *                         serves (below)
 *   {ns:s}:o  string      the shard's record "E:node", with an expiry
 *                         (PX) of the shard lease, set by Redis: only the
 *                         master's clock judges it
 *   {ns:s}:e  string      the shard's last epoch E (never expires)
 * :o and :e share the shard's hash tag, so the shard's own scripts
 * (src/redis_scripts.c) read :o in the same atomic step as its timers.
 *
 * Epochs. A new record takes E = max(last E + 1, now_ms * 1024) (now from
 * Redis's TIME): E only grows, and a master that lost its last writes in a
 * failover still does not hand out an E seen before, unless the clocks
 * disagree by more than the time between the lost write and the next one
 * (the same rule as the tokens of src/redis_scripts.c).
 *
 * Fencing. The fence of a shard is the value of its record, "E:node". A
 * script that depends on ownership (CLAIM) is given :o as an extra key and
 * the fence as an extra first argument, and does nothing (error FENCED)
 * unless :o still holds exactly that value: a node whose record expired
 * (it stalled, or lost Redis), or was taken over, is refused.
 *
 * Trust. A node trusts a record until send + lease - margin on its own
 * monotonic clock, where send is when the request that created or renewed
 * it was sent (the record cannot have expired before then) and margin is
 * lease / 5; after that it claims nothing for the shard until a renewal
 * answers. A node stopped (SIGSTOP, a long pause) therefore stops by
 * itself, and its scripts are refused by the fence when it resumes.
 *
 * Masters. In a Redis Cluster the shards live on several masters. The
 * shards one master serves (the client's slot map, tw__rc_slot_node) form
 * a group, and each group has its own round thread that talks to that
 * master only, so a master that stalls or fails holds only its own
 * shards: the renewals on the other masters go on (a supervisor thread
 * reads the map every round period and starts a thread for a master that
 * has none; a shard stays in one round at a time, so a shard that moved
 * while its old master's round still waits is renewed again only after
 * that round gave up). Membership is kept per master too, in the group's
 * key {ns:S}:m (S: the group's lowest shard, so every node that reads
 * the same map names the same key, which lives on that master): a node
 * is live for a master's shards while it beats on that master, and the
 * shards of a master are spread over the nodes live there. A master that
 * stalls therefore stops only its own membership and renewals; when it
 * fails over, its replica has the set (up to the writes it lost, which
 * the next beats put back) and the group's key is read there. Nodes whose
 * maps disagree for a moment (a reshard, a failover) may name different
 * keys for a master: each then spreads the shards over the nodes of its
 * key, which may pick other owners for a while; the records still allow
 * one owner per shard, and the views agree again once the maps do.
 *
 * Rounds. A group's thread runs a round every lease / 8: one script
 * refreshes the node's membership on the group's key (expiry: now +
 * lease) and returns the live nodes (no answer: the round sends nothing
 * more, and the trust runs out by itself); each of the group's shards
 * goes to the live node of the highest weight tw__own_weight(node,
 * shard) (rendezvous hashing: a join or leave moves only the shards whose
 * best node changed, about 1/N of them). Then, pipelined, for each shard
 * this node should own and does not (or last renewed lease / 4 ago): ACQ
 * (take it when it has no record, renew it when the record is still this
 * node's fence); for each shard it holds and should not: REL (delete the
 * record if it is still its fence). A shard whose record another node
 * holds is tried again the next round.
 *
 * A node whose callback threads (the firer, or every executor thread) are
 * all held by callbacks for half a lease (the healthy hook, own_healthy()
 * in src/durable_redis.c) sends nothing in its rounds: its membership and
 * records run out and its shards move, as a dead node's would; it takes
 * them again when it is healthy.
 *
 * Hand-over. On a graceful close (tw__own_close) the node releases every
 * record and leaves every membership set it beats, after the backend has
 * sent its last completions (src/redis_fire.c) and given back its unfired
 * claims (rd_close() in src/durable_redis.c), so the next owner takes the
 * shard within a round. On a crash the record expires after the lease and
 * the membership after the lease too; the next owner takes the shard at
 * its first round after that. The timers a node claimed keep their own
 * per-timer claims (src/redis_scripts.c), so a hand-over neither doubles
 * nor drops them.
 *
 * Errors. An error reply to a round's script (a permission taken away
 * after open: NOPERM, or "can't run this command" inside a script) is
 * handled as no answer (the trust runs out by itself) and handed to the
 * store's on_errors hook, which counts it in stats.errors and tells
 * cfg.on_error (src/redis_errors.c): never a silent stall.
 *
 * Costs. Per round: one membership script per node and master, and one
 * ACQ per shard the node owns every second round (renewal), so a fleet
 * renews each shard once per lease / 4 whatever its size. Threads: one
 * per master (master_rounds_thread()), and the supervisor
 * (supervisor_thread()).
 */
#define _GNU_SOURCE

#include "redis_owner.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "common.h"
#include "redis_eval.h"

enum { O_BEAT, O_ACQ, O_REL, O_COUNT };

/* BEAT KEYS: m. ARGV: node ttl_ms. Returns the live nodes. The key lasts
 * two ttls after the last beat (a key that no group names any more goes
 * by itself). A key of the wrong type is removed (it would stop every
 * node from seeing the others), and so is an entry that claims to live
 * longer than two ttls (no node writes one; it would win shards it never
 * takes). */
static const char beat_script[] =
    "local ty=redis.call('TYPE',KEYS[1])\n"
    "ty=type(ty)=='table' and ty.ok or ty\n"
    "if ty~='zset' and ty~='none' then redis.call('DEL',KEYS[1]) end\n"
    "local t=redis.call('TIME')\n"
    "local now=tonumber(t[1])*1000+math.floor(tonumber(t[2])/1000)\n"
    "redis.call('ZREMRANGEBYSCORE',KEYS[1],'-inf',now)\n"
    "redis.call('ZREMRANGEBYSCORE',KEYS[1],'('..(now+2*tonumber(ARGV[2])),"
    "'+inf')\n"
    "redis.call('ZADD',KEYS[1],now+tonumber(ARGV[2]),ARGV[1])\n"
    "redis.call('PEXPIRE',KEYS[1],2*tonumber(ARGV[2]))\n"
    "return redis.call('ZRANGE',KEYS[1],0,-1)\n";

/* ACQ KEYS: o e. ARGV: node lease_ms fence ("" when the node holds none).
 * Returns {1, fence} when the shard is the node's (renewed, or taken
 * because it had no record), {0, the holder's record} otherwise. A value
 * of the wrong type, or a record that is not "digits:16 hex digits" or
 * has no expiry (no node writes one: it would hold the shard forever),
 * is removed; an :e that is not a number counts as 0 (the clock still
 * makes the new epoch larger). */
static const char acq_script[] =
    "local function get(k)\n"
    " local v=redis.pcall('GET',k)\n"
    " if type(v)=='table' and v.err then redis.call('DEL',k) return false end\n"
    " return v\n"
    "end\n"
    "local o=get(KEYS[1])\n"
    "if o and o==ARGV[3] then\n"
    " redis.call('PEXPIRE',KEYS[1],ARGV[2])\n"
    " return {1,o}\n"
    "end\n"
    "if o and (not string.match(o,'^%d+:%x+$') or #o>48 or"
    " redis.call('PTTL',KEYS[1])<0) then\n"
    " redis.call('DEL',KEYS[1])\n"
    " o=false\n"
    "end\n"
    "if o then return {0,o} end\n"
    "local t=redis.call('TIME')\n"
    "local ms=tonumber(t[1])*1000+math.floor(tonumber(t[2])/1000)\n"
    "local l=tonumber(get(KEYS[2]))\n"
    "if not l or l~=l or l<0 or l>=9007199254740992 then l=0 end\n"
    "local e=string.format('%d',math.max(math.floor(l)+1,ms*1024))\n"
    "local f=e..':'..ARGV[1]\n"
    "redis.call('SET',KEYS[2],e)\n"
    "redis.call('SET',KEYS[1],f,'PX',ARGV[2])\n"
    "return {1,f}\n";

/* REL KEYS: o. ARGV: fence. Deletes the record if it is still the
 * fence. */
static const char rel_script[] =
    "local v=redis.pcall('GET',KEYS[1])\n"
    "if v==ARGV[1] then redis.call('DEL',KEYS[1]) return 1 end\n"
    "return 0\n";

static const char *const own_scripts[O_COUNT] = {beat_script, acq_script,
                                                 rel_script};

struct oshard {
    char key[96], ekey[96];
    size_t klen, elen;
    int slot;
    int grp;   /* the master group (tw__rc_slot_node) whose thread runs it */
    bool busy; /* in a group's round now: no other group sends for it */
    bool owned;
    char fence[TW__OWN_FENCE_MAX];
    size_t flen;
    uint64_t epoch;
    uint64_t trust_until; /* monotonic ms */
    uint64_t renewed;     /* monotonic ms: the last renewal was sent */
};

/* A master group: the shards one master serves, and the thread that runs
 * their rounds. */
struct ogrp {
    tw__own *o;
    int idx;
    bool on; /* the thread runs (set once) */
    pthread_t thr;
    char mkey[96]; /* the membership key it beat last ("" none), its own */
    size_t mlen;
    int mslot;
};

struct tw__own {
    tw__rc *rc;
    uint32_t shards, lease_ms;
    char node[17];
    char ns[72];
    char sha[O_COUNT][41];
    struct oshard *s; /* under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop, thr_on;
    pthread_t thr; /* the supervisor: groups, and their threads */
    struct ogrp grp[TW__RC_NODES_MAX];
    void (*on_gain)(void *);
    bool (*healthy)(void *);
    void (*on_errors)(void *, const tw__rc_cmd *, size_t);
    void *arg;
};

/* The error replies of a round's commands @cmds[0..n), to the store. */
static void own_errors(tw__own *o, const tw__rc_cmd *cmds, size_t n)
{
    if (o->on_errors)
        o->on_errors(o->arg, cmds, n);
}

static uint64_t mono_ms(void)
{
    return tw__clock_ns(CLOCK_MONOTONIC) / 1000000u;
}

static uint64_t fnv(const void *p, size_t n, uint64_t h)
{
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ c[i]) * 1099511628211ull;
    return h;
}

uint64_t tw__own_weight(const char *node, size_t len, uint32_t shard)
{
    /* splitmix64's finalizer over the node's hash and the shard. */
    uint64_t z = fnv(node, len, 1469598103934665603ull) ^
                 ((uint64_t)shard + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

const char *tw__own_key(const tw__own *o, uint32_t shard, size_t *len)
{
    *len = o->s[shard].klen;
    return o->s[shard].key;
}

const char *tw__own_node(const tw__own *o)
{
    return o->node;
}

bool tw__own_fence(tw__own *o, uint32_t shard, char *fence, size_t *len,
                   uint64_t *epoch)
{
    bool ok;
    uint64_t now = mono_ms();
    pthread_mutex_lock(&o->mu);
    struct oshard *s = &o->s[shard];
    ok = s->owned && now < s->trust_until;
    if (ok) {
        memcpy(fence, s->fence, s->flen);
        *len = s->flen;
        *epoch = s->epoch;
    }
    pthread_mutex_unlock(&o->mu);
    return ok;
}

/* The membership script on key @mk (@ml bytes, slot @slot); the live
 * nodes into *@live (strings owned by *@rep, free with freeReplyObject),
 * this node always among them. 0 when the master did not answer. */
static size_t beat(tw__own *o, const char *mk, size_t ml, int slot,
                   redisReply **rep, const char ***live)
{
    char ttl[24];
    const char *av[6] = {"EVALSHA", o->sha[O_BEAT], "1", mk, o->node, ttl};
    size_t al[6] = {7, 40, 1, ml, 16, 0};
    al[5] = (size_t)snprintf(ttl, sizeof ttl, "%u", o->lease_ms);
    tw__rc_cmd cmd = {6, av, al, slot, NULL, 0};
    int which = O_BEAT;
    tw__eval_run(o->rc, &cmd, &which, 1, own_scripts);
    own_errors(o, &cmd, 1);
    *rep = cmd.reply;
    *live = NULL;
    redisReply *r = cmd.reply;
    if (!r || r->type != REDIS_REPLY_ARRAY)
        return 0;
    *live = tw__malloc((r->elements + 1) * sizeof **live);
    if (!*live)
        return 0;
    size_t m = 0;
    bool self = false;
    for (size_t i = 0; i < r->elements; i++) {
        /* Only ids this code writes: 16 hex digits. */
        if (r->element[i]->type != REDIS_REPLY_STRING ||
            r->element[i]->len != 16 ||
            strspn(r->element[i]->str, "0123456789abcdef") != 16)
            continue;
        (*live)[m++] = r->element[i]->str;
        self = self || !strcmp(r->element[i]->str, o->node);
    }
    if (!self) /* it was just added: only a damaged reply lacks it */
        (*live)[m++] = o->node;
    return m;
}

/* The live node of the highest weight for @shard. */
static const char *best(const char **live, size_t n, uint32_t shard)
{
    const char *b = NULL;
    uint64_t bw = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t w = tw__own_weight(live[i], strlen(live[i]), shard);
        if (!b || w > bw || (w == bw && strcmp(live[i], b) > 0)) {
            b = live[i];
            bw = w;
        }
    }
    return b;
}

/* An epoch from a fence "E:node". */
static uint64_t fence_epoch(const char *f, size_t n)
{
    uint64_t e = 0;
    for (size_t i = 0; i < n && f[i] >= '0' && f[i] <= '9'; i++)
        e = e * 10 + (uint64_t)(f[i] - '0');
    return e;
}

/* The buffers of one ownership round: per shard of the group, its ACQ or
 * REL call (at most 8 arguments), the shard it is for, and a copy of the
 * fence it sends. */
struct oround {
    tw__rc_cmd *cmds;
    const char **av;
    size_t *al;
    int *which;
    uint32_t *sh;  /* the group's shards taken for this round (busy) */
    uint32_t *csh; /* the shard of each call */
    char (*fb)[TW__OWN_FENCE_MAX];
    size_t nsh, n;
};

static void round_free(struct oround *r)
{
    tw__free(r->cmds);
    tw__free(r->av);
    tw__free(r->al);
    tw__free(r->which);
    tw__free(r->sh);
    tw__free(r->csh);
    tw__free(r->fb);
}

static bool round_alloc(struct oround *r, size_t S)
{
    size_t m = S ? S : 1;
    *r = (struct oround){0};
    r->cmds = tw__calloc(m, sizeof *r->cmds);
    r->av = tw__malloc(8 * m * sizeof *r->av);
    r->al = tw__malloc(8 * m * sizeof *r->al);
    r->which = tw__malloc(m * sizeof *r->which);
    r->sh = tw__malloc(m * sizeof *r->sh);
    r->csh = tw__malloc(m * sizeof *r->csh);
    r->fb = tw__malloc(m * sizeof *r->fb);
    return r->cmds && r->av && r->al && r->which && r->sh && r->csh && r->fb;
}

/* Take group @g's shards that are not in another group's round (the map
 * moved while that one waits for its master) into @r, marked busy. The
 * group's lowest shard (it names the membership key), or -1 when the
 * group has none. */
static int round_take_shards(tw__own *o, struct ogrp *g, struct oround *r)
{
    int low = -1;
    pthread_mutex_lock(&o->mu);
    for (uint32_t s = 0; s < o->shards; s++) {
        struct oshard *x = &o->s[s];
        if (x->grp != g->idx)
            continue;
        if (low < 0)
            low = (int)s;
        if (!x->busy) {
            x->busy = true;
            r->sh[r->nsh++] = s;
        }
    }
    pthread_mutex_unlock(&o->mu);
    return low;
}

static void round_release_shards(tw__own *o, struct oround *r)
{
    pthread_mutex_lock(&o->mu);
    for (size_t i = 0; i < r->nsh; i++)
        o->s[r->sh[i]].busy = false;
    pthread_mutex_unlock(&o->mu);
}

/* The next call of @r: @argc arguments @v, @vl for shard @s. */
static void round_add(struct oround *r, uint32_t s, int which, int argc,
                      const char *const *v, const size_t *vl, int slot)
{
    const char **a = r->av + 8 * r->n;
    size_t *l = r->al + 8 * r->n;
    memcpy(a, v, (size_t)argc * sizeof *a);
    memcpy(l, vl, (size_t)argc * sizeof *l);
    r->cmds[r->n] = (tw__rc_cmd){argc, a, l, slot, NULL, 0};
    r->which[r->n] = which;
    r->csh[r->n++] = s;
}

/* The calls of the round: ACQ for each shard this node should own and
 * does not (or last renewed lease / 4 ago), REL for each it holds and
 * should not; @live[0..nl) are the group's live nodes, @now the
 * monotonic ms. mu held. */
static void round_plan_locked(tw__own *o, struct oround *r, const char **live,
                              size_t nl, uint64_t now, const char *lease,
                              size_t ll)
{
    for (size_t i = 0; i < r->nsh; i++) {
        uint32_t s = r->sh[i];
        struct oshard *x = &o->s[s];
        bool mine = !strcmp(best(live, nl, s), o->node);
        char *fb = r->fb[r->n];
        if (mine && (!x->owned || now - x->renewed >= o->lease_ms / 4)) {
            memcpy(fb, x->fence, x->flen);
            const char *v[8] = {"EVALSHA", o->sha[O_ACQ], "2",   x->key,
                                x->ekey,   o->node,       lease, fb};
            size_t vl[8] = {7,       40, 1,  x->klen,
                            x->elen, 16, ll, x->owned ? x->flen : 0};
            round_add(r, s, O_ACQ, 8, v, vl, x->slot);
        } else if (!mine && x->owned) {
            /* Stop trusting it now; the record goes after. */
            x->owned = false;
            memcpy(fb, x->fence, x->flen);
            const char *v[5] = {"EVALSHA", o->sha[O_REL], "1", x->key, fb};
            size_t vl[5] = {7, 40, 1, x->klen, x->flen};
            round_add(r, s, O_REL, 5, v, vl, x->slot);
        }
    }
}

/* The ACQ replies of @r: a shard taken or renewed is trusted until
 * @sent + lease - margin. True if a shard was gained. */
static bool round_apply(tw__own *o, struct oround *r, uint64_t sent)
{
    uint64_t margin = o->lease_ms / 5;
    bool gained = false;
    pthread_mutex_lock(&o->mu);
    for (size_t i = 0; i < r->n; i++) {
        redisReply *rep = r->cmds[i].reply;
        struct oshard *x = &o->s[r->csh[i]];
        if (r->which[i] != O_ACQ || !rep || rep->type != REDIS_REPLY_ARRAY ||
            rep->elements != 2 ||
            rep->element[0]->type != REDIS_REPLY_INTEGER ||
            rep->element[1]->type != REDIS_REPLY_STRING)
            continue; /* no answer: the trust runs out by itself */
        redisReply *f = rep->element[1];
        if (rep->element[0]->integer != 1 || f->len > TW__OWN_FENCE_MAX) {
            x->owned = false;
            continue;
        }
        gained = gained || !x->owned;
        x->owned = true;
        memcpy(x->fence, f->str, f->len);
        x->flen = f->len;
        x->epoch = fence_epoch(f->str, f->len);
        x->renewed = sent;
        x->trust_until = sent + o->lease_ms - margin;
    }
    pthread_mutex_unlock(&o->mu);
    return gained;
}

/* Beat on group @g's membership key, then acquire and release the shards
 * of @r (taken, busy) by the live nodes it returns. True if a shard was
 * gained. */
static bool round_beat_and_balance(tw__own *o, struct ogrp *g, struct oround *r,
                                   int low)
{
    redisReply *brep = NULL;
    const char **live = NULL;
    g->mlen =
        (size_t)snprintf(g->mkey, sizeof g->mkey, "{%s:%d}:m", o->ns, low);
    g->mslot = o->s[low].slot;
    size_t nl = beat(o, g->mkey, g->mlen, g->mslot, &brep, &live);
    bool gained = false;
    if (nl) { /* no answer: the trust runs out by itself */
        char lease[24];
        size_t ll = (size_t)snprintf(lease, sizeof lease, "%u", o->lease_ms);
        uint64_t now = mono_ms();
        pthread_mutex_lock(&o->mu);
        round_plan_locked(o, r, live, nl, now, lease, ll);
        pthread_mutex_unlock(&o->mu);
        uint64_t sent = mono_ms();
        tw__eval_run(o->rc, r->cmds, r->which, r->n, own_scripts);
        own_errors(o, r->cmds, r->n);
        gained = round_apply(o, r, sent);
        tw__rc_free_replies(r->cmds, r->n);
    }
    if (brep)
        freeReplyObject(brep);
    tw__free(live);
    return gained;
}

/* One ownership round of master group @g (see the top of the file): its
 * membership beat, then ACQ and REL for its shards. True if a shard was
 * gained. */
static bool ownership_round(tw__own *o, struct ogrp *g)
{
    if (o->healthy && !o->healthy(o->arg))
        return false; /* let membership and records run out */
    struct oround r;
    bool gained = false;
    if (round_alloc(&r, o->shards)) {
        int low = round_take_shards(o, g, &r);
        if (low >= 0) {
            gained = round_beat_and_balance(o, g, &r, low);
            round_release_shards(o, &r);
        }
    }
    round_free(&r);
    return gained;
}

/* Wait one round period, or until close; false when closing. mu held. */
static bool wait_period(tw__own *o)
{
    uint64_t period = o->lease_ms / 8 ? o->lease_ms / 8 : 1;
    if (o->stop)
        return false;
    struct timespec ts;
    tw__mono_after(&ts, period * 1000000u);
    pthread_cond_timedwait(&o->cv, &o->mu, &ts);
    return !o->stop;
}

/* A master group's thread: its ownership rounds, one a period, until
 * close. */
static void *master_rounds_thread(void *arg)
{
    struct ogrp *g = arg;
    tw__own *o = g->o;
    pthread_mutex_lock(&o->mu);
    while (!o->stop) {
        pthread_mutex_unlock(&o->mu);
        bool gained = ownership_round(o, g);
        if (gained && o->on_gain)
            o->on_gain(o->arg);
        pthread_mutex_lock(&o->mu);
        if (!wait_period(o))
            break;
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

/* Which master serves each shard now (the client's slot map, kept
 * current by its redirects and reconnects); @used[i]: some shard is in
 * group i. */
static void map_groups(tw__own *o, bool *used)
{
    memset(used, 0, TW__RC_NODES_MAX * sizeof *used);
    for (uint32_t s = 0; s < o->shards; s++) {
        int gi = tw__rc_slot_node(o->rc, o->s[s].slot);
        if (gi < 0 || gi >= TW__RC_NODES_MAX)
            gi = 0;
        used[gi] = true;
        pthread_mutex_lock(&o->mu);
        o->s[s].grp = gi;
        pthread_mutex_unlock(&o->mu);
    }
}

/* The supervisor: every period, the groups again, and a thread for each
 * group that has none (a thread whose master no longer serves a shard
 * idles until close). */
static void *supervisor_thread(void *arg)
{
    tw__own *o = arg;
    bool used[TW__RC_NODES_MAX];
    pthread_mutex_lock(&o->mu);
    while (!o->stop) {
        pthread_mutex_unlock(&o->mu);
        map_groups(o, used);
        pthread_mutex_lock(&o->mu);
        for (int i = 0; i < TW__RC_NODES_MAX && !o->stop; i++)
            if (used[i] && !o->grp[i].on)
                o->grp[i].on = !pthread_create(
                    &o->grp[i].thr, NULL, master_rounds_thread, &o->grp[i]);
        if (!wait_period(o))
            break;
    }
    pthread_mutex_unlock(&o->mu);
    return NULL;
}

/* A random node id: 16 hex digits. */
static void node_id(char out[17])
{
    uint64_t x = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&x, sizeof x, 1, f) != 1)
        x = tw__clock_ns(CLOCK_REALTIME) ^ ((uint64_t)getpid() << 32);
    if (f)
        fclose(f);
    snprintf(out, 17, "%016llx", (unsigned long long)x);
}

int tw__own_open(tw__own **out, tw__rc *rc, const char *ns, uint32_t shards,
                 uint32_t lease_ms, void (*on_gain)(void *),
                 bool (*healthy)(void *),
                 void (*on_errors)(void *, const tw__rc_cmd *, size_t),
                 void *arg)
{
    tw__own *o = tw__calloc(1, sizeof *o);
    if (!o)
        return TW_ENOMEM;
    o->s = tw__calloc(shards ? shards : 1, sizeof *o->s);
    if (!o->s) {
        tw__free(o);
        return TW_ENOMEM;
    }
    o->rc = rc;
    o->shards = shards;
    o->lease_ms = lease_ms;
    o->on_gain = on_gain;
    o->healthy = healthy;
    o->on_errors = on_errors;
    o->arg = arg;
    node_id(o->node);
    snprintf(o->ns, sizeof o->ns, "%s", ns);
    for (int i = 0; i < TW__RC_NODES_MAX; i++) {
        o->grp[i].o = o;
        o->grp[i].idx = i;
    }
    for (uint32_t s = 0; s < shards; s++) {
        struct oshard *x = &o->s[s];
        x->klen = (size_t)snprintf(x->key, sizeof x->key, "{%s:%u}:o", ns, s);
        x->elen = (size_t)snprintf(x->ekey, sizeof x->ekey, "{%s:%u}:e", ns, s);
        x->slot = tw__rc_slot(x->key, x->klen);
    }
    pthread_mutex_init(&o->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&o->cv, &ca);
    pthread_condattr_destroy(&ca);
    int e = tw__eval_load(o->rc, own_scripts, O_COUNT, o->sha);
    if (!e) {
        /* Own what it can before the first claim. */
        bool used[TW__RC_NODES_MAX];
        map_groups(o, used);
        for (int i = 0; i < TW__RC_NODES_MAX; i++)
            if (used[i])
                ownership_round(o, &o->grp[i]);
        o->thr_on = !pthread_create(&o->thr, NULL, supervisor_thread, o);
        if (!o->thr_on)
            e = TW_ENOMEM;
    }
    if (e) {
        tw__own_close(o);
        return e;
    }
    *out = o;
    return 0;
}

void tw__own_close(tw__own *o)
{
    if (!o)
        return;
    pthread_mutex_lock(&o->mu);
    o->stop = true;
    pthread_cond_broadcast(&o->cv);
    pthread_mutex_unlock(&o->mu);
    if (o->thr_on)
        pthread_join(o->thr, NULL);
    for (int i = 0; i < TW__RC_NODES_MAX; i++)
        if (o->grp[i].on)
            pthread_join(o->grp[i].thr, NULL);
    /* Release every record still this node's, and leave every membership
     * set it beat. */
    size_t S = o->shards, n = 0, M = TW__RC_NODES_MAX;
    tw__rc_cmd *cmds = tw__calloc(S + M, sizeof *cmds);
    const char **av = tw__malloc(5 * (S + M) * sizeof *av);
    size_t *al = tw__malloc(5 * (S + M) * sizeof *al);
    int *which = tw__malloc((S + M) * sizeof *which);
    if (cmds && av && al && which && o->sha[O_REL][0]) {
        for (uint32_t s = 0; s < S; s++) {
            struct oshard *x = &o->s[s];
            if (!x->owned)
                continue;
            x->owned = false;
            const char **a = av + 5 * n;
            size_t *l = al + 5 * n;
            const char *v[5] = {"EVALSHA", o->sha[O_REL], "1", x->key,
                                x->fence};
            size_t vl[5] = {7, 40, 1, x->klen, x->flen};
            memcpy(a, v, sizeof v);
            memcpy(l, vl, sizeof vl);
            cmds[n] = (tw__rc_cmd){5, a, l, x->slot, NULL, 0};
            which[n++] = O_REL;
        }
        for (size_t i = 0; i < M; i++) {
            struct ogrp *g = &o->grp[i];
            if (!g->mlen)
                continue;
            const char **a = av + 5 * n;
            size_t *l = al + 5 * n;
            const char *v[3] = {"ZREM", g->mkey, o->node};
            size_t vl[3] = {4, g->mlen, 16};
            memcpy(a, v, sizeof v);
            memcpy(l, vl, sizeof vl);
            cmds[n] = (tw__rc_cmd){3, a, l, g->mslot, NULL, 0};
            which[n++] = -1;
        }
        tw__eval_run(o->rc, cmds, which, n, own_scripts);
        tw__rc_free_replies(cmds, n);
    }
    tw__free(cmds);
    tw__free(av);
    tw__free(al);
    tw__free(which);
    pthread_cond_destroy(&o->cv);
    pthread_mutex_destroy(&o->mu);
    tw__free(o->s);
    tw__free(o);
}
