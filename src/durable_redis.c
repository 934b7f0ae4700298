/* SPDX-License-Identifier: MIT */
/*
 * src/durable_redis.c - the Redis backend of twheel/durable.h.
 *
 * Data model. A key goes to shard fnv1a(key) % shards; shard s of
 * namespace ns keeps four keys with the hash tag {ns:s}, so they share one
 * cluster slot and one Lua script can change them atomically:
 *   {ns:s}:d  sorted set  key -> due ms (>= 0: waiting, not claimed), or
 *                         -T (claimed; T is the claim's token)
 *   {ns:s}:p  hash        key -> "due,attempt,payload"
 *   {ns:s}:s  string      the shard's last token T
 *   {ns:s}:v  string      the shard's version: moves whenever a key that
 *                         may be claimed is replaced, cancelled or
 *                         claimed again after its lease ran out
 * A pending key is in :d and :p, nowhere else. A claim's token is
 * T = max(last T + 1, expiry * 1024), where expiry is the lease's end in
 * ms (max(due, now) + lease): unique per claim within the shard, growing
 * with the clock, and floor(T / 1024) >= expiry; a lease ran out when
 * floor(T / 1024) <= now, i.e. when the score is in
 * [-(now * 1024 + 1023), 0). So the lease, the token and the fencing of a
 * claimed key are one score: claiming a key is one ZADD entry, checking
 * it one ZMSCORE entry, completing it one ZREM and one HDEL entry, with
 * no other per-key structure (earlier versions kept a lease set, token,
 * attempt and due-time hashes: 6 per-key writes per claim, 6 per
 * completion).
 *
 * Every change is one script (EVALSHA; EVAL once on NOSCRIPT, which loads
 * it on that node): SCHED, CANCEL, CLAIM, DONE, RELEASE. Scripts that take
 * many keys (SCHED, CLAIM, DONE) run a fixed number of variadic commands
 * per call, so Redis's per-call and per-command costs (a script call
 * about 4 us, each redis.call about 3 us more on the machine of
 * BENCHMARKS.md) are paid once per batch.
 *
 * Schedules. tw_durable_schedule_many groups its items by shard: one SCHED
 * call per shard (up to SCHED_CHUNK items), all calls pipelined, one round
 * trip per Redis node. tw_durable_schedule and tw_durable_cancel from many
 * threads are combined: the calls queued while a batch is in flight become
 * the next batch (op_run). SCHED moves :v when one of its keys existed
 * (HSET counts the new fields), CANCEL when it removed a key.
 *
 * Threads. A claimer thread runs CLAIM; a firer thread owns the firing
 * (the wheel itself is shared under mu: calls add the timers they claim).
 *
 * Claiming. The claimer runs CLAIM on every shard each horizon/4: one
 * range of :d, [-(now * 1024 + 1023), now + horizon], holds both the
 * leases that ran out (they go back to their due time with attempt + 1,
 * and :v moves) and the keys due within the horizon; those get a token
 * each and come back with their payloads and the shard's :v. SCHED and a
 * retry in DONE claim at once when the due time is within the horizon, so
 * a short timer does not wait for the next CLAIM. Claimed timers sit in
 * the node's own tw_wheel (1 ms ticks of the monotonic clock), each with
 * the :v at which it was known to be the node's.
 *
 * Firing. When the wheel says a timer is due within CHECK_AHEAD_MS (and
 * the wall clock agrees), the node asks Redis whether it is still its own:
 * one GET of :v per shard per batch (a batch starts at most every
 * CHECK_GAP_MS, at once while the firer is behind, and takes every timer
 * due in the next CHECK_AHEAD_MS, so the timers of several milliseconds
 * share one round trip, which is most of what a check costs Redis). If :v
 * is still the timer's version, nothing that could take it away has
 * happened since the node last knew it was its own. Otherwise its score is
 * read at once (ZMSCORE, one more round trip) and compared with -T; a
 * timer still ours takes the new version. A timer still ours waits in
 * d->ready until the wall clock reaches its due time (never early); only
 * then does the callback run; afterwards DONE (batched per shard, at most
 * DONE_DELAY_MS later, RETRY_DONE_MS for a retry) removes the timer, or
 * re-queues it for a retry, if it is still the node's: at once for the
 * whole batch of a shard when :v is still the version at which all of
 * them were known to be ours (one GET in the script), else when its
 * score is still -T (ZMSCORE). SCHED of an
 * existing key and CANCEL replace or delete the score (and move :v), so a
 * node holding the old claim drops it at the check. The one window left:
 * a replace or cancel that Redis executes after the check's reply and
 * before the callback returns does not stop that callback: the check is
 * sent at most CHECK_AHEAD_MS before the due time (or, late, right before
 * the callback), so a callback that starts on time starts at most
 * CHECK_AHEAD_MS plus one round trip after the check (two round trips
 * when :v had moved); DONE then sees another score and leaves the new
 * version alone.
 *
 * Failure. A node that dies leaves its claimed scores in :d; the first
 * CLAIM after they run out (by any node) gives the timers back. A node
 * that cannot reach Redis fires nothing it cannot check and retries every
 * RETRY_MS. close() gives unfired claims back at once (RELEASE). Tokens
 * and versions grow with the clock (max(last + 1, ms * 1024)), so a
 * master that lost its last writes in a failover does not repeat a value
 * a node saw before, unless the clocks disagree by more than the time
 * between the lost write and the next one.
 */
#define _GNU_SOURCE

#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "durable_backend.h"
#include "internal.h"
#include "redis_client.h"

#define NKEYS 4
#define CLAIM_MAX 1000
#define RETRY_MS 100
#define IDLE_WAIT_MS 50
#define DONE_DELAY_MS 500 /* longest wait of a completion for a batch */
#define RETRY_DONE_MS 100 /* the same for a retry (it waits for the reply) */
#ifndef CHECK_GAP_MS
#define CHECK_GAP_MS 4 /* shortest time between two claim checks */
#endif
#ifndef CHECK_AHEAD_MS
#define CHECK_AHEAD_MS 5 /* a timer is checked up to this long before due */
#endif
#define DONE_BATCH 1024

enum { S_SCHED, S_CANCEL, S_CLAIM, S_DONE, S_RELEASE, S_COUNT };
enum { CHK_VER = -1, CHK_SCORE = -2 }; /* the plain commands of a check */

/* KEYS: 1 d, 2 p, 3 s, 4 v. A claim's token T (see the top of the file)
 * is max(last + 1, expiry * 1024), and a new version of :v is max(last +
 * 1, now * 1024): both grow with the clock, so that a master that lost
 * its last writes in a failover does not hand out a value seen before.
 * Lua numbers are doubles: both stay exact integers below 2^53 (until
 * the year 2248). A value of :p is "due,attempt,payload"; the scripts
 * that give a lease back (CLAIM, DONE, RELEASE) read the due time and
 * attempt from it. */
static const char *const scripts[S_COUNT] = {
    /* SCHED ARGV: claim_until now lease, then (key due value)... where
     * value is "due,1,payload". A key given twice keeps its last item.
     * Returns {} or, when some items were claimed at once (due within the
     * horizon), the shard's version, then (item, token) pairs. A constant
     * number of commands per call, however many items: the per-call cost
     * of a script and of each command it runs is paid once per batch.
     * ZADD replaces a claimed or waiting key's score, so an older claim's
     * token is gone with it; if any key existed (HSET counts the new
     * ones), :v moves. */
    "local untl,now,lease=tonumber(ARGV[1]),tonumber(ARGV[2]),"
    "tonumber(ARGV[3])\n"
    "local m=(#ARGV-3)/3\n"
    "local seen,pv,fz,nk,nd,nj={},{},{},{},{},{}\n"
    "for j=m,1,-1 do\n"
    " local i=3*j+1\n"
    " local k,due=ARGV[i],tonumber(ARGV[i+1])\n"
    " if not seen[k] then\n"
    "  seen[k]=true\n"
    "  pv[#pv+1]=k\n"
    "  pv[#pv+1]=ARGV[i+2]\n"
    "  if due<=untl then\n"
    "   nk[#nk+1]=k\n"
    "   nd[#nd+1]=due\n"
    "   nj[#nj+1]=j\n"
    "  else\n"
    "   fz[#fz+1]=ARGV[i+1]\n"
    "   fz[#fz+1]=k\n"
    "  end\n"
    " end\n"
    "end\n"
    "local old=#pv/2-redis.call('HSET',KEYS[2],unpack(pv))>0\n"
    "if #fz>0 then redis.call('ZADD',KEYS[1],unpack(fz)) end\n"
    "if #nk==0 and not old then return {} end\n"
    "local c=redis.call('MGET',KEYS[3],KEYS[4])\n"
    "local t,v=tonumber(c[1]) or 0,tonumber(c[2]) or 0\n"
    "if old then\n"
    " v=math.max(v+1,now*1024)\n"
    " redis.call('SET',KEYS[4],v)\n"
    "end\n"
    "if #nk==0 then return {} end\n"
    "local nz,out={},{v}\n"
    "for i=1,#nk do\n"
    " t=math.max(t+1,(math.max(nd[i],now)+lease)*1024)\n"
    " nz[2*i-1]=-t\n"
    " nz[2*i]=nk[i]\n"
    " out[2*i]=nj[i]\n"
    " out[2*i+1]=t\n"
    "end\n"
    "redis.call('SET',KEYS[3],t)\n"
    "redis.call('ZADD',KEYS[1],unpack(nz))\n"
    "return out\n",
    /* CANCEL ARGV: key now. :v moves. */
    "local k=ARGV[1]\n"
    "if redis.call('ZREM',KEYS[1],k)==0 then return 0 end\n"
    "redis.call('HDEL',KEYS[2],k)\n"
    "redis.call('SET',KEYS[4],math.max((tonumber(redis.call('GET',KEYS[4]))"
    " or 0)+1,tonumber(ARGV[2])*1024))\n"
    "return 1\n",
    /* CLAIM ARGV: now until lease max. One range of :d holds both the
     * leases that ran out (score in [-(now * 1024 + 1023), 0): they go
     * back to their due time with attempt + 1, and :v moves) and the keys
     * due before until (score in [0, until]); the latter are claimed: a
     * few commands per call, however many keys. Returns {} or: 1 if the
     * range was full (more may follow), else 0; the shard's version; then
     * (key token value) triples. */
    "local now,untl,lease,max=tonumber(ARGV[1]),tonumber(ARGV[2]),"
    "tonumber(ARGV[3]),tonumber(ARGV[4])\n"
    "local ks=redis.call('ZRANGEBYSCORE',KEYS[1],-(now*1024+1023),untl,"
    "'WITHSCORES','LIMIT',0,max)\n"
    "local n=#ks/2\n"
    "if n==0 then return {} end\n"
    "local c=redis.call('MGET',KEYS[3],KEYS[4])\n"
    "local t,v=tonumber(c[1]) or 0,tonumber(c[2]) or 0\n"
    "local keys,za,fz,out,m,ex={},{},{},{n==max and 1 or 0,0},0,false\n"
    "for i=1,n do\n"
    " local k,due=ks[2*i-1],tonumber(ks[2*i])\n"
    " if due<0 then\n"
    "  ex=true\n"
    "  local s=redis.call('HGET',KEYS[2],k)\n"
    "  if s then\n"
    "   local a=string.find(s,',',1,true)\n"
    "   local b=string.find(s,',',a+1,true)\n"
    "   redis.call('HSET',KEYS[2],k,string.sub(s,1,a)..string.format('%d',"
    "tonumber(string.sub(s,a+1,b-1))+1)..string.sub(s,b))\n"
    "   due=math.max(tonumber(string.sub(s,1,a-1)),0)\n"
    "  else\n"
    "   redis.call('ZREM',KEYS[1],k)\n"
    "   due=nil\n"
    "  end\n"
    " end\n"
    " if due and due>untl then\n"
    "  fz[#fz+1]=due\n"
    "  fz[#fz+1]=k\n"
    " elseif due then\n"
    "  m=m+1\n"
    "  t=math.max(t+1,(math.max(due,now)+lease)*1024)\n"
    "  keys[m]=k\n"
    "  za[2*m-1]=-t\n"
    "  za[2*m]=k\n"
    "  out[3*m]=k\n"
    "  out[3*m+1]=t\n"
    " end\n"
    "end\n"
    "if ex then\n"
    " v=math.max(v+1,now*1024)\n"
    " redis.call('SET',KEYS[4],v)\n"
    "end\n"
    "out[2]=v\n"
    "if #fz>0 then redis.call('ZADD',KEYS[1],unpack(fz)) end\n"
    "if m==0 then return out end\n"
    "redis.call('SET',KEYS[3],t)\n"
    "redis.call('ZADD',KEYS[1],unpack(za))\n"
    "local pl=redis.call('HMGET',KEYS[2],unpack(keys))\n"
    "for i=1,m do out[3*i+2]=pl[i] end\n"
    "return out\n",
    /* DONE ARGV: now claim_until lease n ver, then n keys, their n
     * tokens, then (i retry_ms) for the keys i (1..n) to deliver again.
     * ver: the version at which every key was known to be the node's, or
     * "": if :v is still ver, every key is still ours (nothing that takes
     * a claim away happened since), else each score is compared with its
     * token.
     * Returns per key: -1 not ours, 0 done (or retry left in :d), or the token
     * of the retry's new claim; then, if a retry was claimed again, the shard's
     * version. Completed keys are removed with one command per structure,
     * straight from ARGV when every key is done. */
    "local now,untl,lease,n=tonumber(ARGV[1]),tonumber(ARGV[2]),"
    "tonumber(ARGV[3]),tonumber(ARGV[4])\n"
    "local out,all,rt={},true,{}\n"
    "if ARGV[5]~='' and (tonumber(redis.call('GET',KEYS[4])) or 0)=="
    "tonumber(ARGV[5]) then\n"
    " for i=1,n do out[i]=0 end\n"
    "else\n"
    " local cur=redis.call('ZMSCORE',KEYS[1],unpack(ARGV,6,5+n))\n"
    " for i=1,n do\n"
    "  if cur[i] and -tonumber(cur[i])==tonumber(ARGV[5+n+i]) then\n"
    "   out[i]=0\n"
    "  else\n"
    "   out[i]=-1\n"
    "   all=false\n"
    "  end\n"
    " end\n"
    "end\n"
    "local t\n"
    "for j=6+2*n,#ARGV,2 do\n"
    " local i=tonumber(ARGV[j])\n"
    " local k=ARGV[5+i]\n"
    " local s=out[i]==0 and redis.call('HGET',KEYS[2],k)\n"
    " if s then\n"
    "  all=false\n"
    "  rt[i]=true\n"
    "  local a=string.find(s,',',1,true)\n"
    "  local b=string.find(s,',',a+1,true)\n"
    "  local due=now+tonumber(ARGV[j+1])\n"
    "  redis.call('HSET',KEYS[2],k,string.format('%d,%d',due,"
    "tonumber(string.sub(s,a+1,b-1))+1)..string.sub(s,b))\n"
    "  if due<=untl then\n"
    "   if not t then t=tonumber(redis.call('GET',KEYS[3])) or 0 end\n"
    "   t=math.max(t+1,(due+lease)*1024)\n"
    "   redis.call('SET',KEYS[3],t)\n"
    "   redis.call('ZADD',KEYS[1],-t,k)\n"
    "   out[i]=t\n"
    "  else\n"
    "   redis.call('ZADD',KEYS[1],due,k)\n"
    "  end\n"
    " end\n"
    "end\n"
    "if t then out[n+1]=tonumber(redis.call('GET',KEYS[4])) or 0 end\n"
    "if all then\n"
    " redis.call('ZREM',KEYS[1],unpack(ARGV,6,5+n))\n"
    " redis.call('HDEL',KEYS[2],unpack(ARGV,6,5+n))\n"
    " return out\n"
    "end\n"
    "local fin={}\n"
    "for i=1,n do\n"
    " if out[i]==0 and not rt[i] then fin[#fin+1]=ARGV[5+i] end\n"
    "end\n"
    "if #fin>0 then\n"
    " redis.call('ZREM',KEYS[1],unpack(fin))\n"
    " redis.call('HDEL',KEYS[2],unpack(fin))\n"
    "end\n"
    "return out\n",
    /* RELEASE ARGV: key token. Only the holder gives a key back, so :v
     * stays. */
    "local k=ARGV[1]\n"
    "local s=redis.call('ZSCORE',KEYS[1],k)\n"
    "if not s or -tonumber(s)~=tonumber(ARGV[2]) then return 0 end\n"
    "local v=redis.call('HGET',KEYS[2],k)\n"
    "if not v then redis.call('ZREM',KEYS[1],k) return 0 end\n"
    "local a=string.find(v,',',1,true)\n"
    "redis.call('ZADD',KEYS[1],math.max(tonumber(string.sub(v,1,a-1)),0),k)\n"
    "return 1\n",
};

static const char key_suffix[NKEYS] = {'d', 'p', 's', 'v'};

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
    uint64_t ver; /* :v of its shard when it was last known to be ours */
    bool full;    /* :v moved since: the next check reads its score */
    size_t key_len, payload_len;
    char data[];
};

/* A callback's result waiting for its DONE (firer thread only). */
struct done {
    struct rtimer *r;
    int res;
};

struct shard_keys {
    char name[NKEYS][96];
    size_t len[NKEYS];
    int slot;
};

struct rd {
    struct tw_durable base;
    tw__rc *rc;
    uint32_t shards, horizon_ms, lease_ms, wait_replicas, wait_timeout_ms;
    tw_durable_fire_fn fire;
    void *fire_arg;
    int64_t (*wall_fn)(void *);
    uint64_t (*mono_fn)(void *);
    void *clock_arg;
    char sha[S_COUNT][41];
    struct shard_keys *sk;

    pthread_mutex_t op_mu; /* the combiner of one-per-call operations */
    struct op_wait *op_head, **op_tail;
    bool op_busy;

    pthread_mutex_t mu;
    pthread_cond_t cv, claim_cv;
    tw_wheel *wheel;      /* ticks: monotonic ms; under mu */
    struct rtimer *due;   /* filled by the wheel's callbacks */
    struct rtimer *held;  /* every rtimer alive */
    struct rtimer *ready; /* checked, waiting for their due time (firer) */
    bool stop;
    pthread_t thr, claimer;
    uint64_t next_check; /* no claim check before (real monotonic ms) */
    uint64_t fired, retried, cancelled;
    uint64_t late_hist[TW_LATE_BUCKETS];
    struct done *pend; /* callbacks done, DONE not yet sent (firer) */
    size_t npend, cap_pend;
    uint64_t pend_due; /* mono ms: send the completions by then */
};

static const struct tw_durable_ops rd_ops;

/* ------------------------------------------------------------------------ */
/* Clocks. */

static int64_t rd_wall(struct rd *d)
{
    if (d->wall_fn)
        return d->wall_fn(d->clock_arg);
    return (int64_t)(tw__clock_ns(CLOCK_REALTIME) / 1000000u);
}

/* The monotonic clock in ms, never the hook's: for pacing I/O. */
static uint64_t real_mono_ms(void)
{
    return tw__clock_ns(CLOCK_MONOTONIC) / 1000000u;
}

/* The wall clock in us (the hook's ms when one is set). */
static int64_t rd_wall_us(struct rd *d)
{
    if (d->wall_fn)
        return d->wall_fn(d->clock_arg) * 1000;
    return (int64_t)(tw__clock_ns(CLOCK_REALTIME) / 1000u);
}

static uint64_t rd_mono_ms(struct rd *d)
{
    if (d->mono_fn)
        return d->mono_fn(d->clock_arg) / 1000000u;
    return real_mono_ms();
}

/* ------------------------------------------------------------------------ */
/* Script calls. */

#define CALL_ARGS 16
struct call {
    const char *argv[CALL_ARGS];
    size_t len[CALL_ARGS];
    char num[6][24];
    int argc, nnum, script;
    uint32_t shard;
};

/* A script call's first 3 + NKEYS arguments: EVALSHA, the digest, NKEYS
 * and the shard's keys. */
static void script_head(const struct rd *d, const char **av, size_t *al,
                        int script, uint32_t shard)
{
    av[0] = "EVALSHA";
    al[0] = 7;
    av[1] = d->sha[script];
    al[1] = 40;
    av[2] = "4";
    al[2] = 1;
    for (int i = 0; i < NKEYS; i++) {
        av[3 + i] = d->sk[shard].name[i];
        al[3 + i] = d->sk[shard].len[i];
    }
}

static void call_init(struct rd *d, struct call *c, int script, uint32_t shard)
{
    c->script = script;
    c->shard = shard;
    c->nnum = 0;
    script_head(d, c->argv, c->len, script, shard);
    c->argc = 3 + NKEYS;
}

static void call_arg(struct call *c, const void *p, size_t n)
{
    c->argv[c->argc] = n ? p : "";
    c->len[c->argc++] = n;
}

static void call_num(struct call *c, long long v)
{
    char *b = c->num[c->nnum++];
    int n = snprintf(b, 24, "%lld", v);
    call_arg(c, b, (size_t)n);
}

/* Write the numbers @v as decimal strings into @num, @argv and @len. */
static void put_nums(const char **argv, size_t *len, char (*num)[24],
                     const long long *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        len[i] = (size_t)snprintf(num[i], 24, "%lld", v[i]);
        argv[i] = num[i];
    }
}

static bool is_noscript(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && r->str &&
           !strncmp(r->str, "NOSCRIPT", 8);
}

/* Run @n commands pipelined; @script[i] is the script of cmds[i] (its
 * argv[0..1] are EVALSHA and the digest, and its argv array is the
 * caller's, writable) or -1 for a plain command. Returns 0 or the first
 * transport error. A node that lost its script cache (restart, failover)
 * gets EVAL, which loads the script there again. */
static int run_cmds(struct rd *d, tw__rc_cmd *cmds, const int *script, size_t n)
{
    int rc = tw__rc_exec(d->rc, cmds, n);
    for (int pass = 0; pass < 2; pass++) {
        size_t again = 0;
        for (size_t i = 0; i < n; i++)
            if (script[i] >= 0 && is_noscript(cmds[i].reply))
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
            if (script[i] < 0 || !is_noscript(cmds[i].reply))
                continue;
            freeReplyObject(cmds[i].reply);
            cmds[i].reply = NULL;
            const char **argv = (const char **)cmds[i].argv;
            size_t *len = (size_t *)cmds[i].argvlen;
            argv[0] = "EVAL";
            len[0] = 4;
            argv[1] = scripts[script[i]];
            len[1] = strlen(scripts[script[i]]);
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

/* run_cmds for fixed-size script calls. */
static int run_calls(struct rd *d, struct call *calls, tw__rc_cmd *cmds,
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
    int rc = run_cmds(d, cmds, script, n);
    tw__free(script);
    return rc;
}

static void free_replies(tw__rc_cmd *cmds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (cmds[i].reply)
            freeReplyObject(cmds[i].reply);
}

/* WAIT for the configured replicas after the writes to each shard
 * @shard[0..n): one WAIT per entry, all pipelined, so one round trip per
 * node (a node's first WAIT covers everything written before it, and the
 * others then return at once). @rc[i]: 0, TW_EIO (fewer replicas in
 * time), TW_ECONN or TW_ENOMEM. */
static void wait_many(struct rd *d, const uint32_t *shard, int *rc, size_t n)
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
        free_replies(cmds, n);
    tw__free(cmds);
}

/* ------------------------------------------------------------------------ */
/* Local timers. */

static uint32_t shard_of(const struct rd *d, const void *key, size_t len)
{
    const unsigned char *p = key;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++)
        h = (h ^ p[i]) * 1099511628211ull;
    return (uint32_t)(h % d->shards);
}

static void on_wheel(tw_timer *t, void *arg)
{
    struct rtimer *r = arg;
    (void)t;
    r->next = r->d->due;
    r->d->due = r;
}

static struct rtimer *rt_new(struct rd *d, uint32_t shard, const void *key,
                             size_t key_len, const void *payload,
                             size_t payload_len, int64_t due, uint64_t token,
                             uint32_t attempt)
{
    struct rtimer *r = tw__malloc(sizeof *r + key_len + payload_len + 1);
    if (!r)
        return NULL;
    tw_timer_init(&r->tm, on_wheel, r);
    r->d = d;
    r->shard = shard;
    r->attempt = attempt ? attempt : 1; /* absent in Redis = 1 */
    r->due_ms = due;
    r->token = token;
    r->ver = 0;
    r->full = false;
    r->key_len = key_len;
    r->payload_len = payload_len;
    memcpy(r->data, key, key_len);
    if (payload_len)
        memcpy(r->data + key_len, payload, payload_len);
    r->next = NULL;
    r->hpprev = NULL;
    r->fired = false;
    return r;
}

/* Put @r into the wheel at its due time; mu held. */
static void rt_arm_locked(struct rd *d, struct rtimer *r, int64_t wall,
                          uint64_t mono)
{
    if (!r->hpprev) {
        r->hnext = d->held;
        if (d->held)
            d->held->hpprev = &r->hnext;
        d->held = r;
        r->hpprev = &d->held;
    }
    int64_t delta = r->due_ms - CHECK_AHEAD_MS - wall;
    uint64_t tick = mono + (delta > 0 ? (uint64_t)delta : 0);
    if (tick < tw_wheel_now(d->wheel))
        tick = tw_wheel_now(d->wheel);
    tw_wheel_add(d->wheel, &r->tm, tick);
}

static void rt_free_locked(struct rd *d, struct rtimer *r)
{
    (void)d;
    if (r->hpprev) {
        *r->hpprev = r->hnext;
        if (r->hnext)
            r->hnext->hpprev = r->hpprev;
    }
    tw__free(r);
}

static uint64_t reply_u64(const redisReply *r)
{
    if (!r)
        return 0;
    if (r->type == REDIS_REPLY_INTEGER)
        return r->integer > 0 ? (uint64_t)r->integer : 0;
    if (r->type == REDIS_REPLY_STRING && r->str)
        return strtoull(r->str, NULL, 10);
    return 0;
}

/* A value of :p, "due,attempt,payload". */
struct pval {
    int64_t due;
    uint32_t attempt;
    const char *payload;
    size_t len;
};

static bool parse_val(const char *s, size_t n, struct pval *v)
{
    const char *c1 = memchr(s, ',', n);
    const char *c2 = c1 ? memchr(c1 + 1, ',', n - (size_t)(c1 + 1 - s)) : NULL;
    if (!c2)
        return false;
    v->due = strtoll(s, NULL, 10);
    v->attempt = (uint32_t)strtoul(c1 + 1, NULL, 10);
    v->payload = c2 + 1;
    v->len = n - (size_t)(c2 + 1 - s);
    return true;
}

/* ------------------------------------------------------------------------ */
/* The node's thread: claim, fire, complete. */

/* CLAIM on every shard. Returns true when some shard had more. */
static bool claim_all(struct rd *d)
{
    size_t n = d->shards;
    struct call *calls = tw__malloc(n * sizeof *calls);
    tw__rc_cmd *cmds = tw__calloc(n, sizeof *cmds);
    bool more = false;
    if (!calls || !cmds)
        goto out;
    int64_t now = rd_wall(d);
    for (uint32_t s = 0; s < n; s++) {
        call_init(d, &calls[s], S_CLAIM, s);
        call_num(&calls[s], now);
        call_num(&calls[s], now + d->horizon_ms);
        call_num(&calls[s], d->lease_ms);
        call_num(&calls[s], CLAIM_MAX);
    }
    run_calls(d, calls, cmds, n);
    int64_t wall = rd_wall(d);
    uint64_t mono = rd_mono_ms(d);
    pthread_mutex_lock(&d->mu);
    for (uint32_t s = 0; s < n; s++) {
        redisReply *r = cmds[s].reply;
        if (!r || r->type != REDIS_REPLY_ARRAY || !r->elements)
            continue;
        if (reply_u64(r->element[0]))
            more = true;
        uint64_t ver = r->elements > 1 ? reply_u64(r->element[1]) : 0;
        for (size_t i = 2; i + 3 <= r->elements; i += 3) {
            redisReply **e = r->element + i;
            struct pval v;
            if (e[0]->type != REDIS_REPLY_STRING ||
                e[2]->type != REDIS_REPLY_STRING ||
                !parse_val(e[2]->str, e[2]->len, &v))
                continue;
            struct rtimer *t = rt_new(d, s, e[0]->str, e[0]->len, v.payload,
                                      v.len, v.due, reply_u64(e[1]), v.attempt);
            if (!t) /* the lease expires and the timer comes back */
                continue;
            t->ver = ver;
            rt_arm_locked(d, t, wall, mono);
        }
    }
    pthread_mutex_unlock(&d->mu);
out:
    if (cmds)
        free_replies(cmds, n);
    tw__free(calls);
    tw__free(cmds);
    return more;
}

/* One fire round: a round trip carrying the DONE calls of the completions
 * waiting in d->pend (one script call per shard) and the claim check of
 * the due timers (one HMGET of :t per shard); then the callbacks of the
 * timers still ours. Completions are sent in batches, at most
 * DONE_DELAY_MS after their callback returned. Firer thread. */
struct fround {
    struct rd *d;
    struct rtimer **v;        /* the due timers */
    size_t n, np;             /* due timers; completions d->pend[0..np) sent */
    uint32_t *chk, *chz, *dn; /* per shard: its GET of :v, ZMSCORE and
                                 DONE command + 1 */
    uint32_t *cnt_chk, *cnt_z, *cnt_dn, *cnt_ret; /* per shard: keys, ... */
    uint64_t *dver; /* per shard: the version of all its completions */
    bool *dmix;     /* per shard: they have different versions */
    tw__rc_cmd *cmds;
    int *script;
    size_t ncmd, ai, ni, acc; /* commands, arguments, numbers, keys used */
    const char **argv;
    size_t *len;
    char (*num)[24];
    size_t *owner, *base; /* element j of command c's reply is timer or
                             completion owner[base[c] + j] */
    size_t *keys, *fill;  /* per command: its keys, the ones placed */
    bool *ok;             /* per due timer: still ours, fire it */
    int64_t wall;         /* the "now" the DONE calls were given */
};

static void fr_free(struct fround *f)
{
    void *v[] = {f->v,     f->chk,    f->dn,    f->cnt_chk, f->cnt_dn,
                 f->cmds,  f->script, f->argv,  f->len,     f->num,
                 f->owner, f->base,   f->ok,    f->cnt_ret, f->keys,
                 f->fill,  f->chz,    f->cnt_z, f->dver,    f->dmix};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        tw__free(v[i]);
}

#define DONE_FIXED                                                             \
    (3 + NKEYS + 5) /* EVALSHA sha 4 keys.. now untl lease n ver */

/* Count the keys per shard and allocate; false when out of memory. */
static bool fr_alloc(struct fround *f, struct rtimer *list)
{
    struct rd *d = f->d;
    uint32_t S = d->shards;
    for (struct rtimer *r = list; r; r = r->next)
        f->n++;
    f->chk = tw__calloc(S, sizeof *f->chk);
    f->chz = tw__calloc(S, sizeof *f->chz);
    f->dn = tw__calloc(S, sizeof *f->dn);
    f->cnt_chk = tw__calloc(S, sizeof *f->cnt_chk);
    f->cnt_z = tw__calloc(S, sizeof *f->cnt_z);
    f->cnt_dn = tw__calloc(S, sizeof *f->cnt_dn);
    f->cnt_ret = tw__calloc(S, sizeof *f->cnt_ret);
    f->dver = tw__calloc(S, sizeof *f->dver);
    f->dmix = tw__calloc(S, sizeof *f->dmix);
    f->v = tw__malloc((f->n ? f->n : 1) * sizeof *f->v);
    if (!f->chk || !f->chz || !f->dn || !f->cnt_chk || !f->cnt_z ||
        !f->cnt_dn || !f->cnt_ret || !f->dver || !f->dmix || !f->v)
        return false;
    size_t k = 0, nargs = f->n + 4 * f->np;
    for (struct rtimer *r = list; r; r = r->next) {
        f->v[k++] = r;
        if ((r->full ? f->cnt_z : f->cnt_chk)[r->shard]++ == 0)
            nargs += 2;
    }
    for (size_t i = 0; i < f->np; i++) {
        struct rtimer *r = d->pend[i].r;
        uint32_t sh = r->shard;
        if (f->cnt_dn[sh]++ == 0) {
            nargs += DONE_FIXED;
            f->dver[sh] = r->ver;
        }
        if (r->full || r->ver != f->dver[sh])
            f->dmix[sh] = true;
        f->cnt_ret[sh] += d->pend[i].res > 0;
    }
    f->cmds = tw__calloc(3u * S, sizeof *f->cmds);
    f->script = tw__malloc(3u * S * sizeof *f->script);
    f->base = tw__calloc(3u * S, sizeof *f->base);
    f->keys = tw__calloc(3u * S, sizeof *f->keys);
    f->fill = tw__calloc(3u * S, sizeof *f->fill);
    f->argv = tw__malloc((nargs ? nargs : 1) * sizeof *f->argv);
    f->len = tw__malloc((nargs ? nargs : 1) * sizeof *f->len);
    f->num = tw__malloc((3 * f->np + 5 * S + 1) * sizeof *f->num);
    f->owner = tw__malloc((f->n + f->np + 1) * sizeof *f->owner);
    f->ok = tw__calloc(f->n ? f->n : 1, sizeof *f->ok);
    return f->cmds && f->script && f->base && f->keys && f->fill && f->argv &&
           f->len && f->num && f->owner && f->ok;
}

/* Start a command of @argc0 fixed arguments for @shard, with room for
 * @keys keys of @per arguments each and @extra more. */
static tw__rc_cmd *fr_cmd(struct fround *f, uint32_t shard, int script,
                          uint32_t *index, const uint32_t *keys, size_t per,
                          size_t argc0, size_t extra)
{
    size_t c = f->ncmd++;
    tw__rc_cmd *cmd = &f->cmds[c];
    index[shard] = (uint32_t)f->ncmd;
    f->base[c] = f->acc;
    f->keys[c] = keys[shard];
    f->acc += keys[shard];
    f->script[c] = script;
    cmd->argv = &f->argv[f->ai];
    cmd->argvlen = &f->len[f->ai];
    cmd->slot = f->d->sk[shard].slot;
    cmd->argc = (int)argc0;
    f->ai += argc0 + per * keys[shard] + extra;
    return cmd;
}

/* The DONE command of each shard with completions (first: they free
 * leases), then the check commands of each shard with due timers: a GET
 * of its version :v for the timers known to be ours at some version, a
 * ZMSCORE of the keys of those whose version has moved since. */
static void fr_heads(struct fround *f)
{
    struct rd *d = f->d;
    for (size_t i = 0; i < f->np; i++) {
        uint32_t sh = d->pend[i].r->shard;
        if (f->dn[sh])
            continue;
        tw__rc_cmd *c = fr_cmd(f, sh, S_DONE, f->dn, f->cnt_dn, 2, DONE_FIXED,
                               2u * f->cnt_ret[sh]);
        const char **av = (const char **)c->argv;
        size_t *al = (size_t *)c->argvlen;
        script_head(d, av, al, S_DONE, sh);
        long long a5[5] = {f->wall, f->wall + d->horizon_ms, d->lease_ms,
                           f->cnt_dn[sh], (long long)f->dver[sh]};
        put_nums(av + 3 + NKEYS, al + 3 + NKEYS, f->num + f->ni, a5, 5);
        f->ni += 5;
        if (f->dmix[sh])
            al[3 + NKEYS + 4] = 0;         /* "": compare each key's score */
        c->argc += 2 * (int)f->cnt_dn[sh]; /* retries follow */
    }
    for (size_t i = 0; i < f->n; i++) {
        uint32_t sh = f->v[i]->shard;
        bool z = f->v[i]->full;
        if ((z ? f->chz : f->chk)[sh])
            continue;
        tw__rc_cmd *c = z ? fr_cmd(f, sh, CHK_SCORE, f->chz, f->cnt_z, 1, 2, 0)
                          : fr_cmd(f, sh, CHK_VER, f->chk, f->cnt_chk, 0, 2, 0);
        const char **av = (const char **)c->argv;
        size_t *al = (size_t *)c->argvlen;
        av[0] = z ? "ZMSCORE" : "GET";
        al[0] = z ? 7 : 3;
        av[1] = d->sk[sh].name[z ? 0 : 3];
        al[1] = d->sk[sh].len[z ? 0 : 3];
    }
}

/* Lay out the completions (the keys, then their tokens, then an
 * (index retry_ms) pair per retry) and the due timers' keys, remembering
 * whose reply element is whose. */
static void fr_fill(struct fround *f)
{
    struct rd *d = f->d;
    for (size_t i = 0; i < f->np; i++) {
        struct done *p = &d->pend[i];
        size_t c = f->dn[p->r->shard] - 1, j = f->fill[c]++, m = f->keys[c];
        tw__rc_cmd *cmd = &f->cmds[c];
        const char **av = (const char **)cmd->argv + DONE_FIXED;
        size_t *al = (size_t *)cmd->argvlen + DONE_FIXED;
        av[j] = p->r->data;
        al[j] = p->r->key_len;
        long long tok = (long long)p->r->token;
        put_nums(av + m + j, al + m + j, f->num + f->ni++, &tok, 1);
        f->owner[f->base[c] + j] = i;
        if (p->res > 0) {
            long long two[2] = {(long long)j + 1, p->res};
            put_nums((const char **)cmd->argv + cmd->argc,
                     (size_t *)cmd->argvlen + cmd->argc, f->num + f->ni, two,
                     2);
            f->ni += 2;
            cmd->argc += 2;
        }
    }
    for (size_t i = 0; i < f->n; i++) {
        struct rtimer *r = f->v[i];
        size_t c = (r->full ? f->chz : f->chk)[r->shard] - 1;
        tw__rc_cmd *cmd = &f->cmds[c];
        f->owner[f->base[c] + f->fill[c]++] = i;
        if (r->full) {
            ((const char **)cmd->argv)[cmd->argc] = r->data;
            ((size_t *)cmd->argvlen)[cmd->argc] = r->key_len;
            cmd->argc++;
        }
    }
}

/* The DONE replies: free each completed timer, or keep a retry this node
 * claimed again. No reply: the lease runs out and another delivery
 * follows (at least once). mu held. */
static void fr_completions(struct fround *f, int64_t wall, uint64_t mono)
{
    struct rd *d = f->d;
    for (size_t c = 0; c < f->ncmd; c++) {
        if (f->script[c] < 0)
            continue;
        redisReply *rep = f->cmds[c].reply;
        size_t m = f->keys[c];
        uint64_t ver =
            rep && rep->type == REDIS_REPLY_ARRAY && rep->elements > m
                ? reply_u64(rep->element[m])
                : 0;
        for (size_t j = 0; j < m; j++) {
            struct done *p = &d->pend[f->owner[f->base[c] + j]];
            long long res = -1;
            if (rep && rep->type == REDIS_REPLY_ARRAY && j < rep->elements &&
                rep->element[j]->type == REDIS_REPLY_INTEGER)
                res = rep->element[j]->integer;
            if (p->res > 0 && res > 0) {
                p->r->token = (uint64_t)res;
                p->r->ver = ver;
                p->r->full = false;
                p->r->attempt++;
                p->r->due_ms = f->wall + p->res;
                p->r->fired = false;
                rt_arm_locked(d, p->r, wall, mono);
            } else {
                rt_free_locked(d, p->r);
            }
        }
    }
    if (f->np) {
        memmove(d->pend, d->pend + f->np, (d->npend - f->np) * sizeof *d->pend);
        d->npend -= f->np;
    }
}

/* A timer still ours: fire it now if due, else keep it in d->ready
 * until its due time (it was checked up to CHECK_AHEAD_MS early). mu
 * held. */
static void ready_or_ok(struct fround *f, size_t i, int64_t wall)
{
    struct rtimer *r = f->v[i];
    if (r->due_ms <= wall) {
        f->ok[i] = true;
        return;
    }
    r->next = f->d->ready;
    f->d->ready = r;
}

/* The check replies. A GET of :v: a timer known to be ours at that
 * version is fired; one known at an older version (:v moved: some key
 * of the shard was replaced, cancelled or claimed again) has its score
 * read at once (ZMSCORE, the next round). A ZMSCORE: a timer whose score
 * is still its token is fired; one replaced, cancelled or claimed again
 * is dropped. A timer without an answer is tried again in RETRY_MS. mu
 * held. */
static void fr_checks(struct fround *f, int64_t wall, uint64_t mono)
{
    struct rd *d = f->d;
    for (size_t c = 0; c < f->ncmd; c++) {
        if (f->script[c] >= 0)
            continue;
        redisReply *rep = f->cmds[c].reply;
        bool z = f->script[c] == CHK_SCORE;
        bool ans = rep && (z ? rep->type == REDIS_REPLY_ARRAY
                             : rep->type == REDIS_REPLY_STRING ||
                                   rep->type == REDIS_REPLY_NIL);
        double ver = ans && !z && rep->type == REDIS_REPLY_STRING
                         ? strtod(rep->str, NULL)
                         : 0;
        for (size_t j = 0; j < f->keys[c]; j++) {
            size_t i = f->owner[f->base[c] + j];
            struct rtimer *r = f->v[i];
            redisReply *e =
                ans && z && j < rep->elements ? rep->element[j] : NULL;
            if (!ans || (z && !e)) {
                tw_wheel_add(d->wheel, &r->tm, mono + RETRY_MS);
            } else if (!z && (double)r->ver == ver) {
                ready_or_ok(f, i, wall);
            } else if (!z) {
                r->full = true;
                r->ver = (uint64_t)ver;
                tw_wheel_add(d->wheel, &r->tm, mono);
                d->next_check = 0;
            } else if (e->type == REDIS_REPLY_STRING &&
                       strtod(e->str, NULL) == -(double)r->token) {
                r->full = false;
                ready_or_ok(f, i, wall);
            } else {
                rt_free_locked(d, r);
            }
        }
    }
}

/* Keep a callback's result for the next DONE batch (no room: the lease
 * brings the timer back). mu held. */
static void pend_add(struct rd *d, struct rtimer *r, int res)
{
    if (d->npend == d->cap_pend) {
        size_t cap = d->cap_pend ? 2 * d->cap_pend : 256;
        struct done *np2 = tw__realloc(d->pend, cap * sizeof *np2);
        if (np2) {
            d->pend = np2;
            d->cap_pend = cap;
        }
    }
    if (d->npend < d->cap_pend) {
        uint64_t now = rd_mono_ms(d);
        if (!d->npend)
            d->pend_due = now + DONE_DELAY_MS;
        if (res > 0 && d->pend_due > now + RETRY_DONE_MS)
            d->pend_due = now + RETRY_DONE_MS;
        d->pend[d->npend++] = (struct done){r, res};
    } else {
        rt_free_locked(d, r);
    }
}

/* Run the callback of a checked timer; count it, its lateness. */
static void fire_one(struct rd *d, struct rtimer *r)
{
    tw_durable_timer t = {
        r->data,        r->key_len, r->data + r->key_len,
        r->payload_len, r->due_ms,  r->attempt ? r->attempt : 1};
    int64_t late = rd_wall_us(d) - r->due_ms * 1000;
    pthread_mutex_lock(&d->mu);
    r->fired = true;
    d->late_hist[tw__late_bucket(late > 0 ? (uint64_t)late : 0)]++;
    pthread_mutex_unlock(&d->mu);
    int res = tw__durable_fire(&d->base, d->fire, &t, d->fire_arg);
    pthread_mutex_lock(&d->mu);
    if (res > 0)
        d->retried++;
    else
        d->fired++;
    pend_add(d, r, res);
    pthread_mutex_unlock(&d->mu);
}

/* Run the callback of every timer still ours and due. */
static void fr_fire(struct fround *f)
{
    for (size_t i = 0; i < f->n; i++)
        if (f->ok[i])
            fire_one(f->d, f->v[i]);
}

/* Fire the checked timers of d->ready that are due now (never early);
 * returns the earliest due time of those left, or INT64_MAX. mu held
 * (released around the callbacks). */
static int64_t fire_ready(struct rd *d)
{
    int64_t wall = rd_wall(d), next = INT64_MAX;
    struct rtimer *go = NULL, **pp = &d->ready;
    while (*pp) {
        struct rtimer *r = *pp;
        if (r->due_ms <= wall) {
            *pp = r->next;
            r->next = go;
            go = r;
        } else {
            if (r->due_ms < next)
                next = r->due_ms;
            pp = &r->next;
        }
    }
    pthread_mutex_unlock(&d->mu);
    for (struct rtimer *r = go, *n2; r; r = n2) {
        n2 = r->next;
        fire_one(d, r);
    }
    pthread_mutex_lock(&d->mu);
    return next;
}

/* Put the due timers back for RETRY_MS (out of memory). */
static void fr_later(struct rd *d, struct rtimer *list)
{
    uint64_t mono = rd_mono_ms(d);
    pthread_mutex_lock(&d->mu);
    for (struct rtimer *r = list, *next; r; r = next) {
        next = r->next;
        tw_wheel_add(d->wheel, &r->tm, mono + RETRY_MS);
    }
    pthread_mutex_unlock(&d->mu);
}

static void fire_batch(struct rd *d, struct rtimer *list, bool flush)
{
    struct fround f = {.d = d, .np = flush ? d->npend : 0};
    if (!fr_alloc(&f, list)) {
        fr_later(d, list); /* completions stay pending */
        fr_free(&f);
        return;
    }
    f.wall = rd_wall(d);
    fr_heads(&f);
    fr_fill(&f);
    run_cmds(d, f.cmds, f.script, f.ncmd);
    int64_t wall = rd_wall(d);
    uint64_t mono = rd_mono_ms(d);
    pthread_mutex_lock(&d->mu);
    fr_completions(&f, wall, mono);
    fr_checks(&f, wall, mono);
    pthread_mutex_unlock(&d->mu);
    free_replies(f.cmds, f.ncmd);
    fr_fire(&f);
    fr_free(&f);
}

/* The claimer: CLAIM every horizon/4 (at once again when a shard had more
 * than CLAIM_MAX due), on its own thread so that firing never waits for a
 * claim round trip. */
static void *rd_claimer(void *arg)
{
    struct rd *d = arg;
    uint64_t period = d->horizon_ms / 4 ? d->horizon_ms / 4 : 1;
    pthread_mutex_lock(&d->mu);
    while (!d->stop) {
        pthread_mutex_unlock(&d->mu);
        bool more = claim_all(d);
        pthread_mutex_lock(&d->mu);
        if (more || d->stop)
            continue;
        struct timespec ts;
        tw__mono_after(&ts, (uint64_t)period * 1000000u);
        pthread_cond_timedwait(&d->claim_cv, &d->mu, &ts);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* Take the due timers out of the wheel into *@list; a timer the wheel
 * thinks due but the wall clock does not (it stepped back) goes back in:
 * never fired early. Returns true if there was such a timer; *@behind:
 * one was already CHECK_GAP_MS overdue. mu held. */
static bool take_due(struct rd *d, uint64_t now, struct rtimer **list,
                     bool *behind)
{
    tw_wheel_advance(d->wheel, now);
    struct rtimer *early = NULL;
    int64_t wall = rd_wall(d);
    while (d->due) {
        struct rtimer *r = d->due;
        d->due = r->next;
        struct rtimer **to = r->due_ms > wall + CHECK_AHEAD_MS ? &early : list;
        if (r->due_ms + CHECK_GAP_MS < wall)
            *behind = true;
        r->next = *to;
        *to = r;
    }
    bool any = early != NULL;
    for (struct rtimer *r = early, *next; r; r = next) {
        next = r->next;
        rt_arm_locked(d, r, wall, now);
    }
    return any;
}

/* Completions waiting long enough, or many enough, to be sent. */
static bool done_due(const struct rd *d, uint64_t now)
{
    return d->npend && (d->npend >= DONE_BATCH || now >= d->pend_due);
}

static void cv_wait_ms(struct rd *d, uint64_t wait);

/* @wait ms, or less if the first checked timer (due at @ready, wall ms,
 * or INT64_MAX) is due sooner. */
static uint64_t cap_ready(struct rd *d, int64_t ready, uint64_t wait)
{
    if (ready == INT64_MAX)
        return wait;
    int64_t wall = rd_wall(d);
    uint64_t w = ready > wall ? (uint64_t)(ready - wall) : 0;
    return wait < w ? wait : w;
}

/* Sleep until the next due timer, the completions' deadline, the first
 * checked timer's due time (@ready, wall ms), a signal, or IDLE_WAIT_MS.
 * mu held. */
static void rd_sleep(struct rd *d, uint64_t now, bool early, int64_t ready)
{
    uint64_t until = tw_wheel_next_expiry(d->wheel);
    if (d->npend && until > d->pend_due)
        until = d->pend_due;
    uint64_t wait = until > now ? until - now : 0;
    if (wait > IDLE_WAIT_MS)
        wait = IDLE_WAIT_MS;
    if (early && wait > 1)
        wait = 1;
    cv_wait_ms(d, cap_ready(d, ready, wait));
}

/* Wait on the firer's cv for @wait ms of the real clock. mu held. */
static void cv_wait_ms(struct rd *d, uint64_t wait)
{
    if (!wait)
        return;
    struct timespec ts;
    tw__mono_after(&ts, (uint64_t)wait * 1000000u);
    pthread_cond_timedwait(&d->cv, &d->mu, &ts);
}

/* The firer: advance the wheel, check, fire, complete. A check round trip
 * starts at most every CHECK_GAP_MS (at once when the last one took a
 * timer already late), so that timers due close together share one (a
 * round trip costs Redis far more than a key). */
static void *rd_main(void *arg)
{
    struct rd *d = arg;
    pthread_mutex_lock(&d->mu);
    while (!d->stop) {
        int64_t next_ready = d->ready ? fire_ready(d) : INT64_MAX;
        uint64_t now = rd_mono_ms(d), real = real_mono_ms();
        if (real < d->next_check && !done_due(d, now)) {
            cv_wait_ms(d, cap_ready(d, next_ready, d->next_check - real));
            continue;
        }
        struct rtimer *list = NULL;
        bool behind = false;
        bool early = take_due(d, now, &list, &behind);
        if (list || done_due(d, now)) {
            bool flush = done_due(d, now);
            if (list) /* no gap while behind: no sleep with timers late */
                d->next_check = real + (behind ? 0 : CHECK_GAP_MS);
            pthread_mutex_unlock(&d->mu);
            fire_batch(d, list, flush);
            pthread_mutex_lock(&d->mu);
            continue;
        }
        rd_sleep(d, now, early, next_ready);
    }
    pthread_mutex_unlock(&d->mu);
    if (d->npend) /* the last completions */
        fire_batch(d, NULL, true);
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Calls. */

/* Schedules: the items grouped by shard, one SCHED call per shard (at most
 * SCHED_CHUNK items each), all of them pipelined: one round trip per node.
 * A shard's calls go in item order on one connection, so a key given twice
 * ends with its last item. */

#define SCHED_CHUNK 1000
#define VAL_HEAD 24                 /* "due,1," at most */
#define SCHED_FIXED (3 + NKEYS + 3) /* EVALSHA sha 3 keys.. 3 numbers */

struct sbatch {
    struct rd *d;
    tw_durable_item *it;
    size_t n, ncmd;
    int64_t now;
    struct rtimer **rt;  /* per item: its local timer if due in the horizon */
    size_t *cmd, *pos;   /* per item: its command, its triple in it */
    size_t *cnt, *arg0;  /* per command: items, first argument */
    size_t *ibase, *who; /* per command its first slot in who: its items */
    long long *tok;      /* per item: the token of its claim, or 0 */
    uint32_t *cshard;    /* per command: its shard */
    size_t *cur;         /* per shard: its open command + 1, or 0 */
    tw__rc_cmd *cmds;
    int *script;
    const char **argv;
    size_t *len;
    char (*num)[24]; /* per item its due, then 3 per command */
    char *vals;      /* per item its value in :p, "due,1,payload" */
};

static void sb_free(struct sbatch *b)
{
    if (b->rt)
        for (size_t i = 0; i < b->n; i++)
            tw__free(b->rt[i]);
    void *v[] = {b->rt,     b->cmd,  b->pos,    b->cnt,  b->arg0, b->cur,
                 b->cshard, b->cmds, b->script, b->argv, b->len,  b->num,
                 b->ibase,  b->who,  b->tok,    b->vals};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        tw__free(v[i]);
}

/* Allocate the per-item and per-command arrays (at most one command per
 * item) and the local timers of the items due within the horizon; an item
 * whose timer cannot be allocated fails with TW_ENOMEM and is not sent. */
static int sb_alloc(struct sbatch *b)
{
    size_t n = b->n;
    b->rt = tw__calloc(n, sizeof *b->rt);
    b->cmd = tw__malloc(n * sizeof *b->cmd);
    b->pos = tw__malloc(n * sizeof *b->pos);
    b->cnt = tw__malloc(n * sizeof *b->cnt);
    b->arg0 = tw__malloc(n * sizeof *b->arg0);
    b->cshard = tw__malloc(n * sizeof *b->cshard);
    b->cur = tw__calloc(b->d->shards, sizeof *b->cur);
    b->cmds = tw__calloc(n, sizeof *b->cmds);
    b->script = tw__malloc(n * sizeof *b->script);
    b->num = tw__malloc(4 * n * sizeof *b->num);
    b->ibase = tw__malloc(n * sizeof *b->ibase);
    b->who = tw__malloc(n * sizeof *b->who);
    b->tok = tw__calloc(n, sizeof *b->tok);
    size_t vbytes = 1;
    for (size_t i = 0; i < n; i++)
        vbytes += VAL_HEAD + b->it[i].payload_len;
    b->vals = tw__malloc(vbytes);
    if (!b->rt || !b->cmd || !b->pos || !b->cnt || !b->arg0 || !b->cshard ||
        !b->cur || !b->cmds || !b->script || !b->num || !b->ibase || !b->who ||
        !b->tok || !b->vals)
        return TW_ENOMEM;
    int64_t until = b->now + b->d->horizon_ms;
    for (size_t i = 0; i < n; i++) {
        tw_durable_item *it = &b->it[i];
        it->result = 0;
        if (it->due_ms > until)
            continue;
        b->rt[i] =
            rt_new(b->d, shard_of(b->d, it->key, it->key_len), it->key,
                   it->key_len, it->payload, it->payload_len, it->due_ms, 0, 1);
        if (!b->rt[i])
            it->result = TW_ENOMEM;
    }
    return 0;
}

/* Give each item to its shard's open command (a new one when the shard has
 * none or it is full), then lay out every command's arguments. */
static int sb_plan(struct sbatch *b)
{
    size_t nargs = 0;
    for (size_t i = 0; i < b->n; i++) {
        tw_durable_item *it = &b->it[i];
        if (it->result)
            continue;
        uint32_t sh = shard_of(b->d, it->key, it->key_len);
        size_t c = b->cur[sh];
        if (!c || b->cnt[c - 1] == SCHED_CHUNK) {
            c = b->cur[sh] = ++b->ncmd;
            b->cnt[c - 1] = 0;
            b->cshard[c - 1] = sh;
        }
        b->cmd[i] = c - 1;
        b->pos[i] = b->cnt[c - 1]++;
    }
    for (size_t c = 0, ni = 0; c < b->ncmd; c++) {
        b->arg0[c] = nargs;
        nargs += SCHED_FIXED + 3 * b->cnt[c];
        b->ibase[c] = ni;
        ni += b->cnt[c];
    }
    for (size_t i = 0; i < b->n; i++)
        if (!b->it[i].result)
            b->who[b->ibase[b->cmd[i]] + b->pos[i]] = i;
    b->argv = tw__malloc((nargs ? nargs : 1) * sizeof *b->argv);
    b->len = tw__malloc((nargs ? nargs : 1) * sizeof *b->len);
    return b->argv && b->len ? 0 : TW_ENOMEM;
}

/* Fill every command: the script call's head, then one triple per item. */
static void sb_fill(struct sbatch *b)
{
    struct rd *d = b->d;
    long long head[3] = {b->now + d->horizon_ms, b->now, d->lease_ms};
    for (size_t c = 0; c < b->ncmd; c++) {
        const char **av = b->argv + b->arg0[c];
        size_t *al = b->len + b->arg0[c];
        struct shard_keys *k = &d->sk[b->cshard[c]];
        script_head(d, av, al, S_SCHED, b->cshard[c]);
        put_nums(av + 3 + NKEYS, al + 3 + NKEYS, b->num + b->n + 3 * c, head,
                 3);
        b->cmds[c] = (tw__rc_cmd){
            (int)(SCHED_FIXED + 3 * b->cnt[c]), av, al, k->slot, NULL, 0};
        b->script[c] = S_SCHED;
    }
    char *v = b->vals;
    for (size_t i = 0; i < b->n; i++) {
        tw_durable_item *it = &b->it[i];
        if (it->result)
            continue;
        size_t at = b->arg0[b->cmd[i]] + SCHED_FIXED + 3 * b->pos[i];
        long long due = it->due_ms;
        b->argv[at] = it->key;
        b->len[at] = it->key_len;
        put_nums(b->argv + at + 1, b->len + at + 1, b->num + i, &due, 1);
        size_t h = b->len[at + 1];
        memcpy(v, b->argv[at + 1], h);
        memcpy(v + h, ",1,", 3);
        if (it->payload_len)
            memcpy(v + h + 3, it->payload, it->payload_len);
        b->argv[at + 2] = v;
        b->len[at + 2] = h + 3 + it->payload_len;
        v += b->len[at + 2];
    }
}

/* Read command @c's reply, the shard's version and (item, token) pairs,
 * into b->tok and b->ver of its items; a command with no reply, or not
 * SCHED's, fails its items. */
static void sb_reply(struct sbatch *b, size_t c)
{
    const redisReply *r = b->cmds[c].reply;
    int err = b->cmds[c].err;
    if (!err && (!r || r->type != REDIS_REPLY_ARRAY ||
                 (r->elements && r->elements % 2 == 0)))
        err = TW_EIO;
    uint64_t ver = !err && r->elements ? reply_u64(r->element[0]) : 0;
    for (size_t e = 1; !err && e < r->elements; e += 2) {
        const redisReply *j = r->element[e], *t = r->element[e + 1];
        if (j->type != REDIS_REPLY_INTEGER || t->type != REDIS_REPLY_INTEGER ||
            j->integer < 1 || (size_t)j->integer > b->cnt[c])
            err = TW_EIO;
        else {
            size_t i = b->who[b->ibase[c] + (size_t)j->integer - 1];
            b->tok[i] = t->integer;
            if (b->rt[i])
                b->rt[i]->ver = ver;
        }
    }
    for (size_t p = 0; err && p < b->cnt[c]; p++)
        b->it[b->who[b->ibase[c] + p]].result = err;
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
        if (!b->it[i].result && b->tok[i] > 0 && b->rt[i]) {
            b->rt[i]->token = (uint64_t)b->tok[i];
            rt_arm_locked(d, b->rt[i], wall, mono);
            b->rt[i] = NULL;
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
        wait_many(b->d, b->cshard, rc, b->ncmd);
    for (size_t i = 0; i < b->n; i++)
        if (!b->it[i].result)
            b->it[i].result = rc ? rc[b->cmd[i]] : TW_ENOMEM;
    tw__free(rc);
}

static int rd_schedule_many(tw_durable *base, tw_durable_item *items, size_t n)
{
    struct sbatch b = {.d = (struct rd *)base, .it = items, .n = n};
    b.now = rd_wall(b.d);
    int rc = sb_alloc(&b);
    if (!rc)
        rc = sb_plan(&b);
    if (rc) {
        for (size_t i = 0; i < n; i++)
            items[i].result = rc;
        sb_free(&b);
        return rc;
    }
    sb_fill(&b);
    run_cmds(b.d, b.cmds, b.script, b.ncmd);
    sb_results(&b);
    for (size_t c = 0; c < b.ncmd; c++)
        if (b.cmds[c].reply)
            freeReplyObject(b.cmds[c].reply);
    sb_wait(&b);
    sb_free(&b);
    return tw__durable_first_error(items, n);
}

/* ------------------------------------------------------------------------ */
/* One-per-call schedules and cancels from many threads: combined. A caller
 * queues its call; when no batch is in flight it takes the whole queue (its
 * own call and every other thread's) and runs it as one batch: the
 * schedules as one rd_schedule_many, the cancels as one pipelined round
 * trip. Meanwhile the others sleep on their own condition variable until
 * their call is answered, or until they are at the head of the queue when
 * the batch in flight ends (then they run the next batch). */

enum { OP_SCHED, OP_CANCEL };
#define OP_ROUNDS 4 /* batches a caller runs in a row, its own included */

struct op_wait {
    int kind;
    tw_durable_item it; /* a cancel uses key and key_len */
    pthread_cond_t cv;
    bool done;
    struct op_wait *next;
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
        wait_many(d, sh, rc, m);
    for (size_t i = 0, j = 0; i < n; i++)
        if (!v[i]->it.result)
            v[i]->it.result = sh && rc ? rc[j++] : TW_ENOMEM;
    tw__free(sh);
    tw__free(rc);
}

/* The cancels of a batch: one CANCEL call per key, pipelined. */
static void cancel_batch(struct rd *d, struct op_wait **v, size_t n)
{
    struct call *calls = tw__malloc(n * sizeof *calls);
    tw__rc_cmd *cmds = tw__calloc(n, sizeof *cmds);
    int rc = calls && cmds ? 0 : TW_ENOMEM;
    int64_t now = rd_wall(d);
    for (size_t i = 0; !rc && i < n; i++) {
        call_init(d, &calls[i], S_CANCEL,
                  shard_of(d, v[i]->it.key, v[i]->it.key_len));
        call_arg(&calls[i], v[i]->it.key, v[i]->it.key_len);
        call_num(&calls[i], now);
    }
    if (!rc)
        run_calls(d, calls, cmds, n);
    uint64_t ok = 0;
    for (size_t i = 0; i < n; i++) {
        const redisReply *r = cmds ? cmds[i].reply : NULL;
        int e = rc ? rc : cmds[i].err;
        if (!e && (!r || r->type != REDIS_REPLY_INTEGER))
            e = TW_EIO;
        if (!e && r->integer == 0)
            e = TW_ENOENT;
        v[i]->it.result = e;
    }
    if (cmds)
        free_replies(cmds, n);
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
    for (struct op_wait *w = list; w; w = w->next)
        n++;
    tw_durable_item *items = tw__malloc(n * sizeof *items);
    struct op_wait **v = tw__malloc(n * sizeof *v);
    if (!items || !v) {
        for (struct op_wait *w = list; w; w = w->next)
            w->it.result = TW_ENOMEM;
        tw__free(items);
        tw__free(v);
        return;
    }
    for (struct op_wait *w = list; w; w = w->next)
        if (w->kind == OP_SCHED)
            items[ns++] = w->it;
        else
            v[nc++] = w;
    if (nc)
        cancel_batch(d, v, nc);
    if (ns)
        rd_schedule_many(&d->base, items, ns);
    ns = 0;
    for (struct op_wait *w = list; w; w = w->next)
        if (w->kind == OP_SCHED)
            w->it.result = items[ns++].result;
    tw__free(items);
    tw__free(v);
}

/* Queue @w and wait for its result, running batches when none is in
 * flight; a caller that ran a batch runs the next ones too (at most
 * OP_ROUNDS in all) while more are queued, saving a wake-up per batch. */
static int op_run(struct rd *d, struct op_wait *w)
{
    pthread_cond_init(&w->cv, NULL);
    w->done = false;
    w->next = NULL;
    pthread_mutex_lock(&d->op_mu);
    *d->op_tail = w;
    d->op_tail = &w->next;
    for (int rounds = 0;;) {
        if (w->done &&
            (!rounds || rounds >= OP_ROUNDS || !d->op_head || d->op_busy))
            break;
        if (d->op_busy) {
            pthread_cond_wait(&w->cv, &d->op_mu);
            continue;
        }
        struct op_wait *list = d->op_head;
        d->op_head = NULL;
        d->op_tail = &d->op_head;
        d->op_busy = true;
        pthread_mutex_unlock(&d->op_mu);
        op_batch(d, list);
        rounds++;
        pthread_mutex_lock(&d->op_mu);
        for (struct op_wait *x = list, *next; x; x = next) {
            next = x->next; /* x may be gone once done is seen */
            x->done = true;
            if (x != w)
                pthread_cond_signal(&x->cv);
        }
        d->op_busy = false;
    }
    /* Whoever is at the head now runs the next batch. */
    if (d->op_head && !d->op_busy)
        pthread_cond_signal(&d->op_head->cv);
    pthread_mutex_unlock(&d->op_mu);
    pthread_cond_destroy(&w->cv);
    return w->it.result;
}

static int rd_schedule(tw_durable *base, const void *key, size_t key_len,
                       int64_t due_ms, const void *payload, size_t payload_len)
{
    struct op_wait w = {.kind = OP_SCHED,
                        .it = {key, key_len, due_ms, payload, payload_len, 0}};
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
static int rd_cancel_many(tw_durable *base, tw_durable_item *items, size_t n)
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
        cancel_batch((struct rd *)base, v, n);
    for (size_t i = 0; i < n; i++)
        items[i].result = rc ? rc : w[i].it.result;
    tw__free(w);
    tw__free(v);
    return tw__durable_first_error(items, n);
}

/* Per shard: ZCARD :d (pending) and ZCOUNT :d 0 now (due, not claimed by
 * any node yet: backlog; claimed keys have negative scores). */
#define STAT_CMDS 2

static void stat_cmds(struct rd *d, struct call *calls, tw__rc_cmd *cmds,
                      const char *now, size_t now_len)
{
    for (size_t i = 0; i < STAT_CMDS * (size_t)d->shards; i++) {
        struct shard_keys *k = &d->sk[i / STAT_CMDS];
        struct call *c = &calls[i];
        c->argv[0] = i % STAT_CMDS == 1 ? "ZCOUNT" : "ZCARD";
        c->len[0] = strlen(c->argv[0]);
        c->argv[1] = k->name[0];
        c->len[1] = k->len[0];
        c->argv[2] = "0";
        c->len[2] = 1;
        c->argv[3] = now;
        c->len[3] = now_len;
        cmds[i] = (tw__rc_cmd){
            i % STAT_CMDS == 1 ? 4 : 2, c->argv, c->len, k->slot, NULL, 0};
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
    uint64_t pending = 0, backlog = 0;
    for (size_t i = 0; i < n; i++)
        *(i % STAT_CMDS == 1 ? &backlog : &pending) += reply_u64(cmds[i].reply);
    free_replies(cmds, n);
    tw__free(cmds);
    tw__free(calls);
    if (rc)
        return rc;
    pthread_mutex_lock(&d->mu);
    out->pending = pending;
    out->backlog = backlog + local_backlog(d, wall);
    out->fired = d->fired;
    out->retried = d->retried;
    out->cancelled = d->cancelled;
    memcpy(out->late_hist, d->late_hist, sizeof out->late_hist);
    pthread_mutex_unlock(&d->mu);
    return 0;
}

static void rd_free(struct rd *d)
{
    while (d->held) {
        struct rtimer *r = d->held;
        rt_free_locked(d, r);
    }
    tw__free(d->pend);
    tw_wheel_destroy(d->wheel);
    tw__rc_close(d->rc);
    pthread_mutex_destroy(&d->mu);
    pthread_mutex_destroy(&d->op_mu);
    pthread_cond_destroy(&d->cv);
    pthread_cond_destroy(&d->claim_cv);
    tw__free(d->sk);
    tw__free(d);
}

static int rd_close(tw_durable *base)
{
    struct rd *d = (struct rd *)base;
    pthread_mutex_lock(&d->mu);
    d->stop = true;
    pthread_cond_signal(&d->cv);
    pthread_cond_signal(&d->claim_cv);
    pthread_mutex_unlock(&d->mu);
    pthread_join(d->thr, NULL);
    pthread_join(d->claimer, NULL);
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
                call_init(d, &c[n], S_RELEASE, r->shard);
                call_arg(&c[n], r->data, r->key_len);
                call_num(&c[n], (long long)r->token);
                n++;
            }
        }
        if (n) {
            int e = run_calls(d, c, cmds, n);
            if (!rc)
                rc = e;
            free_replies(cmds, n);
        }
        for (size_t i = 0; i < nb; i++) /* after their keys were sent */
            rt_free_locked(d, batch[i]);
    }
    rd_free(d);
    return rc;
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
};

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
    d->wait_replicas = cfg->wait_replicas;
    d->wait_timeout_ms = cfg->wait_timeout_ms ? cfg->wait_timeout_ms : 1000;
    d->fire = cfg->fire;
    d->fire_arg = cfg->fire_arg;
    d->wall_fn = cfg->wall_ms;
    d->mono_fn = cfg->mono_ns;
    d->clock_arg = cfg->clock_arg;
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->op_mu, NULL);
    d->op_tail = &d->op_head;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&d->cv, &ca);
    pthread_cond_init(&d->claim_cv, &ca);
    pthread_condattr_destroy(&ca);
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
                                 "{%s:%u}:%c", ns, s, key_suffix[k]);
        d->sk[s].slot = tw__rc_slot(d->sk[s].name[0], d->sk[s].len[0]);
    }
    return 0;
}

/* SCRIPT LOAD once on any node; other nodes learn each script by EVAL on
 * their first NOSCRIPT. The digest is the same everywhere. */
static int rd_load_scripts(struct rd *d)
{
    for (int i = 0; i < S_COUNT; i++) {
        const char *argv[3] = {"SCRIPT", "LOAD", scripts[i]};
        size_t len[3] = {6, 4, strlen(scripts[i])};
        tw__rc_cmd cmd = {3, argv, len, -1, NULL, 0};
        int rc = tw__rc_exec(d->rc, &cmd, 1);
        if (!rc && (!cmd.reply || cmd.reply->type != REDIS_REPLY_STRING ||
                    cmd.reply->len != 40))
            rc = tw__rc_cmd_error(d->rc, &cmd, "SCRIPT LOAD");
        if (!rc)
            memcpy(d->sha[i], cmd.reply->str, 41);
        free_replies(&cmd, 1);
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
    free_replies(&cmd, 1);
    return rc;
}

/* Start the claimer and the firer. */
static int rd_start(struct rd *d)
{
    if (pthread_create(&d->claimer, NULL, rd_claimer, d))
        return TW_ENOMEM;
    if (pthread_create(&d->thr, NULL, rd_main, d)) {
        pthread_mutex_lock(&d->mu);
        d->stop = true;
        pthread_cond_signal(&d->claim_cv);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->claimer, NULL);
        return TW_ENOMEM;
    }
    return 0;
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
    if (!rc) {
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
        rc = tw__rc_open(&d->rc, &o);
    }
    if (!rc) {
        rc = rd_load_scripts(d);
        if (!rc)
            rc = rd_probe_keys(d);
        if (rc)
            tw__rc_last_error(d->rc, cfg->errbuf, cfg->errbuf_len);
    }
    if (!rc)
        rc = rd_start(d);
    if (rc) {
        rd_free(d);
        return rc;
    }
    *out = &d->base;
    return 0;
}
