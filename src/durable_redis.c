/* SPDX-License-Identifier: MIT */
/*
 * src/durable_redis.c - the Redis backend of twheel/durable.h.
 *
 * Data model. A key goes to shard fnv1a(key) % shards; shard s of
 * namespace ns keeps six keys with the hash tag {ns:s}, so they share one
 * cluster slot and one Lua script can change them atomically:
 *   {ns:s}:d  sorted set  key -> due ms (>= 0: waiting, not claimed), or
 *                         -T (claimed; T is the claim's token)
 *   {ns:s}:p  hash        key -> "due,attempt,payload"
 *   {ns:s}:s  string      the shard's last token T
 *   {ns:s}:v  string      the shard's version: moves whenever a key that
 *                         may be claimed is replaced, cancelled or
 *                         claimed again after its lease ran out
 *   {ns:s}:q  hash        quarantine: what a script could not read, set
 *                         aside (field -> the raw bytes): "p:<key>" a value
 *                         of :p that is not "due,attempt,payload" (due in
 *                         int64, attempt in uint32); "d:<key>" the score of
 *                         a member of :d without a value; "k:<c>" a whole
 *                         key :c of the wrong type (its DUMP) or an :s or
 *                         :v that is not an integer in [0, 2^53). What is
 *                         set aside is removed; the rest of the shard goes
 *                         on. HLEN is counted in stats.quarantined.
 *   {ns:s}:x  sorted set  the dead letters: key -> 0 (all one score, so
 *                         ZRANGEBYLEX lists them in key order); a dead
 *                         key's value stays in :p ("due,attempt,payload":
 *                         its last due time and the attempts it had).
 * A pending key is in :d and :p, nowhere else; a dead one in :x and :p.
 *
 * Dead letters. The firer applies the retry policy (src/durable_dead.c)
 * to each result: a timer to give up on goes in DONE as a retry of -1 ms,
 * which DONE, if the key is still the node's, moves from :d to :x. A
 * delivery whose attempt already passes max_attempts (the lease of each
 * one before ran out: its node died in the callback, and CLAIM counted
 * the attempt) goes the same way without its callback. REARM puts a dead
 * key back into :d (attempt 1), DDEL deletes it, SCHED of it replaces it
 * (ZREM :x). CANCEL, CLAIM and RELEASE read :d only, so a dead key is
 * neither cancelled nor claimed. TOUCH renews a running claim: a new
 * token whose lease ends lease_ms from now, if the score is still -T of
 * the caller's claim. A claim's token is
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
 * Due times. Any int64: a due time the wall clock has reached fires at
 * once (INT64_MIN included) and one it has not stays pending (INT64_MAX
 * in practice forever), as in the journal. The value keeps the due time
 * exactly; the score of a waiting key is max(due, 0) (a negative score is
 * a claim), a double, exact below 2^53. Tokens and versions need the wall
 * clock below 2^53 / 1024 ms (the year 2248). Local arithmetic on due
 * times saturates (sat_add).
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
#include "redis_owner.h"

#define NKEYS 6
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
/* A check's answer is trusted for this long after the check was sent: a
 * timer whose callback cannot start by then (its answer came late, or
 * callbacks ahead of it ran long) is checked again. This bounds the window
 * in which a replace or cancel that returned does not stop a callback. */
#ifndef CHECK_MAX_AGE_MS
#define CHECK_MAX_AGE_MS 200
#endif
#define GROUPS_MAX 16    /* worker threads: one per master, at most */
#define TOPOLOGY_MS 1000 /* how often the masters of the shards are read */

enum {
    S_SCHED,
    S_CANCEL,
    S_CLAIM,
    S_DONE,
    S_RELEASE,
    S_REARM,
    S_DDEL,
    S_TOUCH,
    S_COUNT
};
enum { CHK_VER = -1, CHK_SCORE = -2 }; /* the plain commands of a check */

/* KEYS: 1 d, 2 p, 3 s, 4 v, 5 q, 6 x. A claim's token T (see the top of the
 * file) is max(last + 1, expiry * 1024), and a new version of :v is
 * max(last + 1, now * 1024): both grow with the clock, so that a master
 * that lost its last writes in a failover does not hand out a value seen
 * before. Lua numbers are doubles: both stay exact integers below 2^53
 * (until the year 2248). A value of :p is "due,attempt,payload"; the
 * scripts that give a lease back (CLAIM, DONE, RELEASE) read the due time
 * and attempt from it.
 *
 * Every value a script reads may be anything (an operator, a bug, an
 * older version): PRELUDE's helpers check each one, and what cannot be
 * used is set aside into the quarantine hash :q (see the top of the file)
 * and removed, so that the rest of the shard goes on. Each script's body
 * is a function M run under pcall: a command that fails (a key of the
 * wrong type) makes EPILOGUE set aside every key of the wrong type and
 * run M once more. M reads before it writes, so a failed first run wrote
 * nothing that a second run would do twice (SCHED's HSET, at most). */
#define PRELUDE                                                                \
    FENCE                                                                      \
    "local D,P,S,V,Q,X=KEYS[1],KEYS[2],KEYS[3],KEYS[4],KEYS[5],KEYS[6]\n"      \
    "local function q(f,x) redis.call('HSET',Q,f,x) end\n"                     \
    /* A value of :p: due, attempt, #due, #attempt; nil if it is not    */     \
    /* "-?digits,digits," within int64 and uint32 (as parse_val reads) */      \
    "local function pv(s)\n"                                                   \
    " if type(s)~='string' then return nil end\n"                              \
    " local d,a=string.match(s,'^(%-?%d+),(%d+),')\n"                          \
    " if not d then return nil end\n"                                          \
    " local u=string.gsub(d,'^%-','')\n"                                       \
    " if #u>19 or (#u==19 and u>(u==d and '9223372036854775807' or"            \
    " '9223372036854775808')) or #a>10 or tonumber(a)>4294967295 then\n"       \
    "  return nil\n"                                                           \
    " end\n"                                                                   \
    " return tonumber(d),tonumber(a),#d,#a\n"                                  \
    "end\n"                                                                    \
    /* s with its attempt set to a (saturated at 2^32 - 1). */                 \
    "local function att(s,a,nd,na)\n"                                          \
    " return string.sub(s,1,nd+1)..string.format('%d',math.min(a,4294967295))" \
    "..string.sub(s,nd+na+2)\n"                                                \
    "end\n"                                                                    \
    /* :s or :v: an integer in [0, 2^53), else set aside: 0, true. */          \
    "local function cnt(k,c)\n"                                                \
    " local x=redis.call('GET',k)\n"                                           \
    " if not x then return 0 end\n"                                            \
    " local n=tonumber(x)\n"                                                   \
    " if n and n>=0 and n<9007199254740992 and n==math.floor(n) then"          \
    " return n end\n"                                                          \
    " q('k:'..c,x)\n"                                                          \
    " redis.call('DEL',k)\n"                                                   \
    " return 0,true\n"                                                         \
    "end\n"                                                                    \
    /* A :d score as an integer (floored; NaN, inf, absent: nil). */           \
    "local function sc(x)\n"                                                   \
    " local n=x and tonumber(x)\n"                                             \
    " if n and n==n and n~=math.huge and n~=-math.huge then\n"                 \
    "  return math.floor(n)\n"                                                 \
    " end\n"                                                                   \
    "end\n"                                                                    \
    "local function M()\n"
#define EPILOGUE                                                               \
    "end\n"                                                                    \
    "local ok,r=pcall(M)\n"                                                    \
    "if ok then return r end\n"                                                \
    "local w,any={'zset','hash','string','string','hash','zset'},false\n"      \
    "for _,i in ipairs({5,1,2,3,4,6}) do\n"                                    \
    " local t=redis.call('TYPE',KEYS[i])\n"                                    \
    " t=type(t)=='table' and t.ok or t\n"                                      \
    " if t~='none' and t~=w[i] then\n"                                         \
    "  local x=redis.call('DUMP',KEYS[i])\n"                                   \
    "  redis.call('DEL',KEYS[i])\n"                                            \
    "  q('k:'..string.sub(KEYS[i],-1),x)\n"                                    \
    "  any=true\n"                                                             \
    " end\n"                                                                   \
    "end\n"                                                                    \
    "if any then return M() end\n"                                             \
    "error(r)\n"

/* A script given one key more than NKEYS, the shard's ownership record
 * :o, takes a
 * fence as an extra first argument and does nothing (error FENCED) unless
 * :o still holds it (src/redis_owner.c): a node that lost the shard is
 * refused. */
#define FENCE                                                                  \
    "if #KEYS>6 and redis.call('GET',KEYS[7])~=table.remove(ARGV,1) then\n"    \
    " return redis.error_reply('FENCED')\n"                                    \
    "end\n"

static const char *const scripts[S_COUNT] = {
    /* SCHED ARGV: claim_until now lease, then (key due value)... where
     * value is "due,1,payload". A key given twice keeps its last item.
     * Returns {} or, when some items were claimed at once (due within the
     * horizon), the shard's version, then (item, token) pairs. A constant
     * number of commands per call, however many items: the per-call cost
     * of a script and of each command it runs is paid once per batch.
     * ZADD replaces a claimed or waiting key's score, so an older claim's
     * token is gone with it; if any key existed (HSET counts the new
     * ones), :v moves. A due time below 0 waits with score 0 (a negative
     * score is a claim); the value keeps the due time as given. */
    PRELUDE "local untl,now,lease=tonumber(ARGV[1]),tonumber(ARGV[2]),"
            "tonumber(ARGV[3])\n"
            "local m=(#ARGV-3)/3\n"
            "local seen,hv,fz,nk,nd,nj,ks={},{},{},{},{},{},{}\n"
            "for j=m,1,-1 do\n"
            " local i=3*j+1\n"
            " local k,due=ARGV[i],tonumber(ARGV[i+1])\n"
            " if not seen[k] then\n"
            "  seen[k]=true\n"
            "  ks[#ks+1]=k\n"
            "  hv[#hv+1]=k\n"
            "  hv[#hv+1]=ARGV[i+2]\n"
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
            "local t,v,vb=0,0,false\n"
            "if #nk>0 then t=cnt(S,'s') end\n"
            "local old=#hv/2-redis.call('HSET',P,unpack(hv))>0\n"
            "redis.call('ZREM',X,unpack(ks))\n"
            "if old then v,vb=cnt(V,'v') end\n"
            "if #fz>0 then redis.call('ZADD',D,unpack(fz)) end\n"
            "if #nk==0 and not old then return {} end\n"
            "if old then\n"
            " v=math.max(v+1,now*1024)\n"
            " redis.call('SET',V,v)\n"
            "elseif #nk>0 then\n"
            " v,vb=cnt(V,'v')\n"
            " if vb then\n"
            "  v=math.max(1,now*1024)\n"
            "  redis.call('SET',V,v)\n"
            " end\n"
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
            "redis.call('SET',S,t)\n"
            "redis.call('ZADD',D,unpack(nz))\n"
            "return out\n" EPILOGUE,
    /* CANCEL ARGV: key now. :v moves. */
    PRELUDE "local k=ARGV[1]\n"
            "local v=cnt(V,'v')\n"
            "if redis.call('ZREM',D,k)==0 then return 0 end\n"
            "redis.call('HDEL',P,k)\n"
            "redis.call('SET',V,math.max(v+1,tonumber(ARGV[2])*1024))\n"
            "return 1\n" EPILOGUE,
    /* CLAIM ARGV: now until lease max. One range of :d holds both the
     * leases that ran out (score in [-(now * 1024 + 1023), 0): they go
     * back to their due time with attempt + 1, and :v moves) and the keys
     * due before until (score in [0, until]); the latter are claimed: a
     * few commands per call, however many keys. A key whose value is not
     * a valid "due,attempt,payload" (or that has none) is set aside.
     * Returns {} or: 1 if the range was full (more may follow), else 0;
     * the shard's version; then (key token value) triples. */
    PRELUDE
    "local now,untl,lease,max=tonumber(ARGV[1]),tonumber(ARGV[2]),"
    "tonumber(ARGV[3]),tonumber(ARGV[4])\n"
    "local ks=redis.call('ZRANGEBYSCORE',D,-(now*1024+1023),untl,"
    "'WITHSCORES','LIMIT',0,max)\n"
    "local n=#ks/2\n"
    "if n==0 then return {} end\n"
    "local names={}\n"
    "for i=1,n do names[i]=ks[2*i-1] end\n"
    "local vals=redis.call('HMGET',P,unpack(names))\n"
    "local t=cnt(S,'s')\n"
    "local v,ex=cnt(V,'v')\n"
    "local keys,za,fz,out,m,bd,bp={},{},{},{n==max and 1 or 0,0},0,{},{}\n"
    "for i=1,n do\n"
    " local k,due,s=names[i],sc(ks[2*i]),vals[i]\n"
    " local d,a,nd,na=pv(s)\n"
    " if not d or not due then\n"
    "  if s then\n"
    "   q('p:'..k,s)\n"
    "   bp[#bp+1]=k\n"
    "  else\n"
    "   q('d:'..k,ks[2*i])\n"
    "  end\n"
    "  bd[#bd+1]=k\n"
    "  due=nil\n"
    " elseif due<0 then\n"
    "  ex=true\n"
    "  s=att(s,a+1,nd,na)\n"
    "  vals[i]=s\n"
    "  redis.call('HSET',P,k,s)\n"
    "  due=math.max(d,0)\n"
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
    "  out[3*m+2]=vals[i]\n"
    " end\n"
    "end\n"
    "if #bd>0 then redis.call('ZREM',D,unpack(bd)) end\n"
    "if #bp>0 then redis.call('HDEL',P,unpack(bp)) end\n"
    "if ex then\n"
    " v=math.max(v+1,now*1024)\n"
    " redis.call('SET',V,v)\n"
    "end\n"
    "out[2]=v\n"
    "if #fz>0 then redis.call('ZADD',D,unpack(fz)) end\n"
    "if m==0 then return out end\n"
    "redis.call('SET',S,t)\n"
    "redis.call('ZADD',D,unpack(za))\n"
    "return out\n" EPILOGUE,
    /* DONE ARGV: now claim_until lease n ver, then n keys, their n
     * tokens, then (i retry_ms) for the keys i (1..n) to deliver again
     * (retry_ms -1: to the dead letters :x instead; -2: the same, with
     * its attempt one less: that delivery did not run).
     * ver: the version at which every key was known to be the node's, or
     * "": if :v is still ver, every key is still ours (nothing that takes
     * a claim away happened since), else each score is compared with its
     * token.
     * Returns per key: -1 not ours, 0 done (or retry left in :d), or the token
     * of the retry's new claim; then, if a retry was claimed again, the shard's
     * version. Completed keys are removed with one command per structure,
     * straight from ARGV when every key is done. A retry whose value is not
     * valid any more is set aside (and is not ours). */
    PRELUDE "local now,untl,lease,n=tonumber(ARGV[1]),tonumber(ARGV[2]),"
            "tonumber(ARGV[3]),tonumber(ARGV[4])\n"
            "local out,all,rt={},true,{}\n"
            "local t,v=0,0\n"
            "if #ARGV>5+2*n then t=cnt(S,'s') end\n"
            "if ARGV[5]~='' or #ARGV>5+2*n then v=cnt(V,'v') end\n"
            "if ARGV[5]~='' and v==tonumber(ARGV[5]) then\n"
            " for i=1,n do out[i]=0 end\n"
            "else\n"
            " local cur=redis.call('ZMSCORE',D,unpack(ARGV,6,5+n))\n"
            " for i=1,n do\n"
            "  local c=sc(cur[i])\n"
            "  if c and -c==tonumber(ARGV[5+n+i]) then\n"
            "   out[i]=0\n"
            "  else\n"
            "   out[i]=-1\n"
            "   all=false\n"
            "  end\n"
            " end\n"
            "end\n"
            "local re=false\n"
            "for j=6+2*n,#ARGV,2 do\n"
            " local i=tonumber(ARGV[j])\n"
            " local k=ARGV[5+i]\n"
            " local s=out[i]==0 and redis.call('HGET',P,k)\n"
            " local d,a,nd,na=pv(s)\n"
            " if s and not d then\n"
            "  all=false\n"
            "  q('p:'..k,s)\n"
            "  redis.call('HDEL',P,k)\n"
            "  redis.call('ZREM',D,k)\n"
            "  out[i]=-1\n"
            " elseif s and tonumber(ARGV[j+1])<0 then\n"
            "  all=false\n"
            "  rt[i]=true\n"
            "  if ARGV[j+1]=='-2' and a>0 then\n"
            "   redis.call('HSET',P,k,att(s,a-1,nd,na))\n"
            "  end\n"
            "  redis.call('ZREM',D,k)\n"
            "  redis.call('ZADD',X,0,k)\n"
            " elseif s then\n"
            "  all=false\n"
            "  rt[i]=true\n"
            "  local due=now+tonumber(ARGV[j+1])\n"
            "  redis.call('HSET',P,k,string.format('%d',due)..att(s,a+1,nd,na)"
            ":sub(nd+1))\n"
            "  if due<=untl then\n"
            "   t=math.max(t+1,(due+lease)*1024)\n"
            "   redis.call('SET',S,t)\n"
            "   redis.call('ZADD',D,-t,k)\n"
            "   out[i]=t\n"
            "   re=true\n"
            "  else\n"
            "   redis.call('ZADD',D,due,k)\n"
            "  end\n"
            " end\n"
            "end\n"
            "if re then out[n+1]=v end\n"
            "if all then\n"
            " redis.call('ZREM',D,unpack(ARGV,6,5+n))\n"
            " redis.call('HDEL',P,unpack(ARGV,6,5+n))\n"
            " return out\n"
            "end\n"
            "local fin={}\n"
            "for i=1,n do\n"
            " if out[i]==0 and not rt[i] then fin[#fin+1]=ARGV[5+i] end\n"
            "end\n"
            "if #fin>0 then\n"
            " redis.call('ZREM',D,unpack(fin))\n"
            " redis.call('HDEL',P,unpack(fin))\n"
            "end\n"
            "return out\n" EPILOGUE,
    /* RELEASE ARGV: key token. Only the holder gives a key back, so :v
     * stays. */
    PRELUDE "local k=ARGV[1]\n"
            "local c=sc(redis.call('ZSCORE',D,k))\n"
            "if not c or -c~=tonumber(ARGV[2]) then return 0 end\n"
            "local s=redis.call('HGET',P,k)\n"
            "local d=pv(s)\n"
            "if not d then\n"
            " if s then q('p:'..k,s) else q('d:'..k,tostring(c)) end\n"
            " redis.call('HDEL',P,k)\n"
            " redis.call('ZREM',D,k)\n"
            " return 0\n"
            "end\n"
            "redis.call('ZADD',D,math.max(d,0),k)\n"
            "return 1\n" EPILOGUE,
    /* REARM ARGV: key due. A dead key back into :d at due with attempt 1.
     * 0: not dead; -1: its value could not be read (set aside). */
    PRELUDE "local k=ARGV[1]\n"
            "if not redis.call('ZSCORE',X,k) then return 0 end\n"
            "local s=redis.call('HGET',P,k)\n"
            "local d,a,nd,na=pv(s)\n"
            "redis.call('ZREM',X,k)\n"
            "if not d then\n"
            " if s then\n"
            "  q('p:'..k,s)\n"
            "  redis.call('HDEL',P,k)\n"
            " end\n"
            " return -1\n"
            "end\n"
            "redis.call('HSET',P,k,ARGV[2]..',1,'..string.sub(s,nd+na+3))\n"
            "redis.call('ZADD',D,tonumber(ARGV[2])<0 and 0 or ARGV[2],k)\n"
            "return 1\n" EPILOGUE,
    /* DDEL ARGV: key. 1 if a dead key was deleted, else 0. */
    PRELUDE "local k=ARGV[1]\n"
            "if redis.call('ZREM',X,k)==0 then return 0 end\n"
            "redis.call('HDEL',P,k)\n"
            "return 1\n" EPILOGUE,
    /* TOUCH ARGV: key token now lease. The claim -token renewed: a new
     * token with the lease ending lease ms from now; 0 if the score is
     * not -token any more (the claim was taken away). */
    PRELUDE "local k=ARGV[1]\n"
            "local c=sc(redis.call('ZSCORE',D,k))\n"
            "if not c or -c~=tonumber(ARGV[2]) then return 0 end\n"
            "local t=math.max(cnt(S,'s')+1,"
            "(tonumber(ARGV[3])+tonumber(ARGV[4]))*1024)\n"
            "redis.call('SET',S,t)\n"
            "redis.call('ZADD',D,-t,k)\n"
            "return t\n" EPILOGUE,
};

static const char key_suffix[NKEYS] = {'d', 'p', 's', 'v', 'q', 'x'};

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
 * only its own group's thread (see the top of the file). */
struct grp {
    struct rd *d;
    pthread_t thr, cthr; /* checks and completions; claims */
    bool started, quit;  /* quit: stop its worker alone */
    pthread_cond_t cv, ccv;
    struct rtimer *todo; /* due timers to check, from the firer (mu) */
    struct done *pend;   /* callbacks done, DONE not yet sent (mu) */
    size_t npend, cap_pend;
    uint64_t pend_due; /* mono ms: send the completions by then */
};

struct shard_keys {
    char name[NKEYS][96];
    size_t len[NKEYS];
    int slot;
};

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

    pthread_mutex_t op_mu; /* the combiner of one-per-call operations */
    struct op_wait *op_head, **op_tail;
    bool op_busy;

    pthread_mutex_t mu;
    pthread_cond_t cv, claim_cv; /* the firer's, the topology thread's */
    tw_wheel *wheel;             /* ticks: monotonic ms; under mu */
    struct rtimer *due;          /* filled by the wheel's callbacks */
    struct rtimer *held;         /* every rtimer alive */
    struct rtimer *ready; /* checked, waiting for their due time (firer) */
    bool stop, gstop;     /* stop the firer and topology; then the groups */
    bool thr_on, claimer_on;
    pthread_t thr, claimer;
    struct grp grp[GROUPS_MAX];
    uint8_t *grp_of;               /* per shard: its group (mu) */
    char grp_name[GROUPS_MAX][64]; /* "host:port" of each group's master */
    uint32_t ngrp;
    uint64_t next_check; /* no claim check before (real monotonic ms) */
    uint64_t fired, retried, cancelled;
    uint64_t late_hist[TW_LATE_BUCKETS];
    uint64_t callbacks; /* callbacks running now (stats.running); under mu */
    uint64_t cb_start;  /* rd_mono_ms when the running callback began, or
                           0; under mu */
    uint32_t shard_lease_ms; /* cfg.redis_shard_lease_ms */
    uint64_t late_sum_us;    /* stats.late_sum_us; under mu */
    struct tw__retry retry;  /* cfg's retry policy */
    /* TW_DURABLE_NOFIRE: no threads, nothing claimed or delivered; a
     * schedule is refused (SCHED claims what is due soon at once). */
    bool nofire;
};

static const struct tw_durable_ops rd_ops;

/* ------------------------------------------------------------------------ */
/* Clocks. Due times are any int64 (the whole range, as for the journal);
 * every sum with one saturates instead of overflowing. */

static int64_t sat_add(int64_t a, int64_t b)
{
    int64_t r;
    if (__builtin_add_overflow(a, b, &r))
        return b > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

/* @a - @b, saturated. */
static int64_t sat_sub(int64_t a, int64_t b)
{
    int64_t r;
    if (__builtin_sub_overflow(a, b, &r))
        return b < 0 ? INT64_MAX : INT64_MIN;
    return r;
}

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
    char fence[TW__OWN_FENCE_MAX]; /* call_fence */
    uint64_t epoch;
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
    av[2] = "6"; /* NKEYS */
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

/* Fence @c (right after call_init) by its shard's ownership record: false
 * when the shard is not this node's (see FENCE). */
static bool call_fence(struct rd *d, struct call *c)
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
    r->epoch = 0;
    r->dl = 0;
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
    int64_t delta = sat_sub(sat_sub(r->due_ms, CHECK_AHEAD_MS), wall);
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
static bool parse_val(const char *s, size_t n, struct pval *v)
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
/* The node's thread: claim, fire, complete. */

/* CLAIM on the shards of group @g. Returns true when some shard had
 * more. */
static bool claim_group(struct rd *d, struct grp *g)
{
    size_t n = 0;
    struct call *calls = tw__malloc(d->shards * sizeof *calls);
    tw__rc_cmd *cmds = tw__calloc(d->shards, sizeof *cmds);
    bool more = false;
    if (!calls || !cmds)
        goto out;
    int64_t now = rd_wall(d);
    pthread_mutex_lock(&d->mu);
    for (uint32_t s = 0; s < d->shards; s++)
        if (&d->grp[d->grp_of[s]] == g)
            calls[n++].shard = s;
    pthread_mutex_unlock(&d->mu);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t s = calls[i].shard;
        calls[m].shard = s;
        call_init(d, &calls[m], S_CLAIM, s);
        calls[m].epoch = 0;
        if (d->own && !call_fence(d, &calls[m]))
            continue; /* not this node's shard */
        struct call *c = &calls[m++];
        call_num(c, now);
        call_num(c, sat_add(now, d->horizon_ms));
        call_num(c, d->lease_ms);
        call_num(c, CLAIM_MAX);
    }
    n = m;
    uint64_t csent = rd_mono_ms(d);
    run_calls(d, calls, cmds, n);
    int64_t wall = rd_wall(d);
    uint64_t mono = rd_mono_ms(d);
    pthread_mutex_lock(&d->mu);
    for (size_t c = 0; c < n; c++) {
        uint32_t s = calls[c].shard;
        redisReply *r = cmds[c].reply;
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
            t->epoch = calls[c].epoch;
            if (t->epoch) /* the local image of its claim's end */
                t->dl = csent +
                        (uint64_t)(v.due > now ? sat_sub(v.due, now) : 0) +
                        d->lease_ms - d->lease_ms / 5;
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

/* Which master holds each shard (CLUSTER SLOTS): the shards of one master
 * form a group with its own thread. A server without cluster support, or
 * no answer, changes nothing (everything starts in group 0). Groups only
 * say which thread waits for which node: a stale map is never wrong, only
 * less independent. The topology thread, and open. */
static void grp_refresh(struct rd *d)
{
    const char *argv[2] = {"CLUSTER", "SLOTS"};
    size_t len[2] = {7, 5};
    tw__rc_cmd cmd = {2, argv, len, -1, NULL, 0};
    uint8_t *of = tw__malloc(d->shards);
    if (!of || tw__rc_exec(d->rc, &cmd, 1) || !cmd.reply ||
        cmd.reply->type != REDIS_REPLY_ARRAY) {
        free_replies(&cmd, 1);
        tw__free(of);
        return;
    }
    redisReply *r = cmd.reply;
    pthread_mutex_lock(&d->mu);
    for (uint32_t s = 0; s < d->shards; s++) {
        of[s] = d->grp_of[s];
        int slot = d->sk[s].slot;
        for (size_t i = 0; i < r->elements; i++) {
            redisReply *e = r->element[i];
            if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
                e->element[0]->type != REDIS_REPLY_INTEGER ||
                e->element[1]->type != REDIS_REPLY_INTEGER ||
                e->element[2]->type != REDIS_REPLY_ARRAY ||
                e->element[2]->elements < 2 ||
                e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
                e->element[2]->element[1]->type != REDIS_REPLY_INTEGER ||
                slot < e->element[0]->integer || slot > e->element[1]->integer)
                continue;
            char name[64];
            snprintf(name, sizeof name, "%s:%lld",
                     e->element[2]->element[0]->str,
                     e->element[2]->element[1]->integer);
            uint32_t g = 0;
            while (g < d->ngrp && strcmp(d->grp_name[g], name))
                g++;
            if (g == d->ngrp && d->ngrp < GROUPS_MAX)
                snprintf(d->grp_name[d->ngrp++], 64, "%s", name);
            of[s] = (uint8_t)(g < d->ngrp ? g : s % GROUPS_MAX);
            break;
        }
    }
    memcpy(d->grp_of, of, d->shards);
    pthread_mutex_unlock(&d->mu);
    free_replies(&cmd, 1);
    tw__free(of);
}

/* One fire round: a round trip carrying the DONE calls of the completions
 * waiting in d->pend (one script call per shard) and the claim check of
 * the due timers (per shard, a GET of its version key :v, or a ZMSCORE
 * of :d for timers whose round was full); then the callbacks of the
 * timers still ours. Completions are sent in batches, at most
 * DONE_DELAY_MS after their callback returned. Firer thread. */
struct fround {
    struct rd *d;
    struct grp *g;            /* the group whose shards these are */
    uint64_t sent;            /* real monotonic ms: the checks were sent */
    struct done *pend;        /* the completions sent, taken from g->pend */
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
    tw__free(f->pend);
    void *v[] = {f->v,     f->chk,    f->dn,    f->cnt_chk, f->cnt_dn,
                 f->cmds,  f->script, f->argv,  f->len,     f->num,
                 f->owner, f->base,   f->ok,    f->cnt_ret, f->keys,
                 f->fill,  f->chz,    f->cnt_z, f->dver,    f->dmix};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        tw__free(v[i]);
}

#define DONE_FIXED                                                             \
    (3 + NKEYS + 5) /* EVALSHA sha 6 keys.. now untl lease n ver */

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
        struct rtimer *r = f->pend[i].r;
        uint32_t sh = r->shard;
        if (f->cnt_dn[sh]++ == 0) {
            nargs += DONE_FIXED;
            f->dver[sh] = r->ver;
        }
        if (r->full || r->ver != f->dver[sh])
            f->dmix[sh] = true;
        f->cnt_ret[sh] += f->pend[i].res != 0; /* a retry, or dead (-1) */
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
        uint32_t sh = f->pend[i].r->shard;
        if (f->dn[sh])
            continue;
        tw__rc_cmd *c = fr_cmd(f, sh, S_DONE, f->dn, f->cnt_dn, 2, DONE_FIXED,
                               2u * f->cnt_ret[sh]);
        const char **av = (const char **)c->argv;
        size_t *al = (size_t *)c->argvlen;
        script_head(d, av, al, S_DONE, sh);
        long long a5[5] = {f->wall, sat_add(f->wall, d->horizon_ms),
                           d->lease_ms, f->cnt_dn[sh], (long long)f->dver[sh]};
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
    for (size_t i = 0; i < f->np; i++) {
        struct done *p = &f->pend[i];
        size_t c = f->dn[p->r->shard] - 1, j = f->fill[c]++, m = f->keys[c];
        tw__rc_cmd *cmd = &f->cmds[c];
        const char **av = (const char **)cmd->argv + DONE_FIXED;
        size_t *al = (size_t *)cmd->argvlen + DONE_FIXED;
        av[j] = p->r->data;
        al[j] = p->r->key_len;
        long long tok = (long long)p->r->token;
        put_nums(av + m + j, al + m + j, f->num + f->ni++, &tok, 1);
        f->owner[f->base[c] + j] = i;
        if (p->res != 0) {
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
            struct done *p = &f->pend[f->owner[f->base[c] + j]];
            long long res = -1;
            if (rep && rep->type == REDIS_REPLY_ARRAY && j < rep->elements &&
                rep->element[j]->type == REDIS_REPLY_INTEGER)
                res = rep->element[j]->integer;
            if (p->res > 0 && res > 0) {
                p->r->token = (uint64_t)res;
                p->r->ver = ver;
                p->r->full = false;
                p->r->attempt++;
                p->r->due_ms = sat_add(f->wall, p->res);
                p->r->fired = false;
                rt_arm_locked(d, p->r, wall, mono);
            } else {
                rt_free_locked(d, p->r);
            }
        }
    }
}

/* A timer still ours goes to d->ready, where the firer starts its
 * callback once it is due (it was checked up to CHECK_AHEAD_MS early) and
 * while its answer is younger than CHECK_MAX_AGE_MS. mu held. */
static void ready_or_ok(struct fround *f, size_t i, int64_t wall)
{
    struct rtimer *r = f->v[i];
    (void)wall;
    r->chk_at = f->sent;
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
                                   rep->type == REDIS_REPLY_NIL ||
                                   rep->type == REDIS_REPLY_ERROR);
        /* A :v that is not a number (or not a string) proves nothing:
         * the scores are read. */
        bool vbad = ans && !z && rep->type == REDIS_REPLY_ERROR;
        double ver = 0;
        if (ans && !z && rep->type == REDIS_REPLY_STRING) {
            char *end;
            ver = strtod(rep->str, &end);
            vbad = end == rep->str || *end || !(ver >= 0 && ver < 0x1p53);
        }
        for (size_t j = 0; j < f->keys[c]; j++) {
            size_t i = f->owner[f->base[c] + j];
            struct rtimer *r = f->v[i];
            redisReply *e =
                ans && z && j < rep->elements ? rep->element[j] : NULL;
            if (!ans || (z && !e)) {
                tw_wheel_add(d->wheel, &r->tm, mono + RETRY_MS);
            } else if (!z && !vbad && (double)r->ver == ver) {
                ready_or_ok(f, i, wall);
            } else if (!z) {
                r->full = true;
                r->ver = vbad ? 0 : (uint64_t)ver;
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
    struct grp *g = &d->grp[d->grp_of[r->shard]];
    if (g->npend == g->cap_pend) {
        size_t cap = g->cap_pend ? 2 * g->cap_pend : 256;
        struct done *np2 = tw__realloc(g->pend, cap * sizeof *np2);
        if (np2) {
            g->pend = np2;
            g->cap_pend = cap;
        }
    }
    if (g->npend < g->cap_pend) {
        uint64_t now = rd_mono_ms(d);
        if (!g->npend)
            g->pend_due = now + DONE_DELAY_MS;
        if (res > 0 && g->pend_due > now + RETRY_DONE_MS)
            g->pend_due = now + RETRY_DONE_MS;
        g->pend[g->npend++] = (struct done){r, res};
        if (g->npend == 1 || res > 0 || g->npend >= DONE_BATCH)
            pthread_cond_signal(&g->cv);
    } else {
        rt_free_locked(d, r);
    }
}

/* A struct done's result besides a retry's delay (> 0) and 0 (done): to
 * the dead letters after its callback ran (TW__RETRY_DEAD, -1), or
 * without it running (-2: its :p attempt, already counted up by CLAIM for
 * the delivery that will not happen, is taken back by one in DONE). */
#define RD_DEAD_UNRUN (-2)

/* The timer whose callback this thread runs (tw_durable_touch()). */
static _Thread_local struct rtimer *rd_cur;

/* Run the callback of a checked timer; count it, its lateness. */
static void fire_one(struct rd *d, struct rtimer *r)
{
    uint32_t att = r->attempt ? r->attempt : 1;
    if (!tw__retry_may(&d->retry, att)) {
        /* The deliveries before ran out of their leases (crashes): the
         * policy's attempts are used up. */
        pthread_mutex_lock(&d->mu);
        r->fired = true;
        pend_add(d, r, RD_DEAD_UNRUN);
        pthread_mutex_unlock(&d->mu);
        return;
    }
    tw_durable_timer t = {
        r->data,        r->key_len, r->data + r->key_len,
        r->payload_len, r->due_ms,  r->attempt ? r->attempt : 1,
        r->epoch,       r->token};
    int64_t due_us;
    if (__builtin_mul_overflow(r->due_ms, 1000, &due_us))
        due_us = r->due_ms < 0 ? INT64_MIN : INT64_MAX;
    int64_t late = sat_sub(rd_wall_us(d), due_us);
    pthread_mutex_lock(&d->mu);
    r->fired = true;
    d->callbacks++;
    d->cb_start = rd_mono_ms(d);
    uint64_t late_us = late > 0 ? (uint64_t)late : 0;
    d->late_sum_us = late_us > UINT64_MAX - d->late_sum_us
                         ? UINT64_MAX
                         : d->late_sum_us + late_us;
    d->late_hist[tw__late_bucket(late_us)]++;
    pthread_mutex_unlock(&d->mu);
    rd_cur = r;
    int res = tw__durable_fire(&d->base, d->fire, &t, d->fire_arg);
    rd_cur = NULL;
    pthread_mutex_lock(&d->mu);
    d->callbacks--;
    d->cb_start = 0;
    if (res > 0 || res == TW_DURABLE_FIRE_RETRY)
        d->retried++;
    else
        d->fired++;
    pend_add(d, r, tw__retry_next(&d->retry, att, res));
    pthread_mutex_unlock(&d->mu);
}

/* Check @r again: its answer is too old to be trusted. mu held. */
static void recheck_locked(struct rd *d, struct rtimer *r)
{
    tw_wheel_add(d->wheel, &r->tm, tw_wheel_now(d->wheel));
    d->next_check = 0;
}

/* Fire the checked timers of d->ready that are due now (never early),
 * each only if its check was sent at most CHECK_MAX_AGE_MS before its
 * callback starts (else it is checked again); returns the earliest due
 * time of those left, or INT64_MAX. mu held (released around the
 * callbacks). */
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
        if (r->dl && rd_mono_ms(d) >= r->dl) {
            /* Its claim may have run out: the shard's owner delivers it. */
            pthread_mutex_lock(&d->mu);
            rt_free_locked(d, r);
            pthread_mutex_unlock(&d->mu);
            continue;
        }
        if (real_mono_ms() - r->chk_at > CHECK_MAX_AGE_MS) {
            pthread_mutex_lock(&d->mu);
            recheck_locked(d, r);
            pthread_mutex_unlock(&d->mu);
            continue;
        }
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

/* One round trip for group @g (its worker thread): the completions
 * waiting in g->pend when @flush, and the checks of @list; the timers
 * still ours go to d->ready for the firer. */
static void fire_batch(struct rd *d, struct grp *g, struct rtimer *list,
                       bool flush)
{
    struct fround f = {.d = d, .g = g};
    pthread_mutex_lock(&d->mu);
    if (flush && g->npend &&
        (f.pend = tw__malloc(g->npend * sizeof *f.pend)) != NULL) {
        f.np = g->npend;
        memcpy(f.pend, g->pend, f.np * sizeof *f.pend);
        g->npend = 0;
    }
    pthread_mutex_unlock(&d->mu);
    if (!fr_alloc(&f, list)) {
        fr_later(d, list);
        pthread_mutex_lock(&d->mu); /* the completions stay pending */
        for (size_t i = 0; i < f.np; i++)
            pend_add(d, f.pend[i].r, f.pend[i].res);
        pthread_mutex_unlock(&d->mu);
        fr_free(&f);
        return;
    }
    f.wall = rd_wall(d);
    fr_heads(&f);
    fr_fill(&f);
    f.sent = real_mono_ms();
    run_cmds(d, f.cmds, f.script, f.ncmd);
    int64_t wall = rd_wall(d);
    uint64_t mono = rd_mono_ms(d);
    pthread_mutex_lock(&d->mu);
    fr_completions(&f, wall, mono);
    fr_checks(&f, wall, mono);
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
    free_replies(f.cmds, f.ncmd);
    fr_free(&f);
}

static void *rd_group(void *arg);
static void *rd_group_claim(void *arg);

/* Start the threads of every group a shard is in (mu held). The shards
 * of a group whose threads cannot be started move to group 0 (rd_start
 * fails the open if group 0's cannot). */
static void grp_start_locked(struct rd *d)
{
    for (uint32_t s = 0; s < d->shards; s++) {
        struct grp *g = &d->grp[d->grp_of[s]];
        if (g->started)
            continue;
        g->started = !pthread_create(&g->thr, NULL, rd_group, g);
        if (g->started && pthread_create(&g->cthr, NULL, rd_group_claim, g)) {
            g->quit = true; /* its worker runs alone: stop it */
            pthread_cond_signal(&g->cv);
            pthread_mutex_unlock(&d->mu);
            pthread_join(g->thr, NULL);
            pthread_mutex_lock(&d->mu);
            g->quit = false;
            g->started = false;
        }
        if (!g->started)
            d->grp_of[s] = 0;
    }
}

/* The topology thread: the masters of the shards every TOPOLOGY_MS (a
 * master that moved, or a failover, regroups the shards). Its round trip
 * may wait for a stalled node: nothing else waits for it. */
static void *rd_claimer(void *arg)
{
    struct rd *d = arg;
    pthread_mutex_lock(&d->mu);
    while (!d->stop) {
        struct timespec ts;
        tw__mono_after(&ts, (uint64_t)TOPOLOGY_MS * 1000000u);
        pthread_cond_timedwait(&d->claim_cv, &d->mu, &ts);
        if (d->stop)
            break;
        pthread_mutex_unlock(&d->mu);
        grp_refresh(d);
        pthread_mutex_lock(&d->mu);
        grp_start_locked(d);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* Completions of @g waiting long enough, or many enough, to be sent. mu
 * held. */
static bool done_due(const struct grp *g, uint64_t now)
{
    return g->npend && (g->npend >= DONE_BATCH || now >= g->pend_due);
}

/* A group's claimer: CLAIM on its shards every horizon/4 (at once again
 * when a shard had more than CLAIM_MAX due), on its own thread so that
 * checks never wait for a claim round trip. */
static void *rd_group_claim(void *arg)
{
    struct grp *g = arg;
    struct rd *d = g->d;
    uint64_t period = d->horizon_ms / 4 ? d->horizon_ms / 4 : 1;
    pthread_mutex_lock(&d->mu);
    while (!d->stop) {
        pthread_mutex_unlock(&d->mu);
        bool more = claim_group(d, g);
        pthread_mutex_lock(&d->mu);
        if (more || d->stop)
            continue;
        struct timespec ts;
        tw__mono_after(&ts, (uint64_t)period * 1000000u);
        pthread_cond_timedwait(&g->ccv, &d->mu, &ts);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

/* A group's worker: the checks the firer hands it and its completions,
 * one round trip at a time to its master only, so that a master that does
 * not answer holds only its own shards. */
static void *rd_group(void *arg)
{
    struct grp *g = arg;
    struct rd *d = g->d;
    pthread_mutex_lock(&d->mu);
    while (!d->gstop && !g->quit) {
        uint64_t mono = rd_mono_ms(d);
        bool flush = done_due(g, mono);
        struct rtimer *list = g->todo;
        if (!flush && !list) {
            uint64_t wait = IDLE_WAIT_MS;
            if (g->npend && g->pend_due > mono && g->pend_due - mono < wait)
                wait = g->pend_due - mono;
            struct timespec ts;
            tw__mono_after(&ts, wait * 1000000u);
            pthread_cond_timedwait(&g->cv, &d->mu, &ts);
            continue;
        }
        g->todo = NULL;
        pthread_mutex_unlock(&d->mu);
        fire_batch(d, g, list, flush);
        pthread_mutex_lock(&d->mu);
    }
    bool last = g->npend > 0;
    pthread_mutex_unlock(&d->mu);
    if (last) /* the last completions */
        fire_batch(d, g, NULL, true);
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
        struct rtimer **to =
            r->due_ms > sat_add(wall, CHECK_AHEAD_MS) ? &early : list;
        if (sat_add(r->due_ms, CHECK_GAP_MS) < wall)
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

static void cv_wait_ms(struct rd *d, uint64_t wait);

/* @wait ms, or less if the first checked timer (due at @ready, wall ms,
 * or INT64_MAX) is due sooner. */
static uint64_t cap_ready(struct rd *d, int64_t ready, uint64_t wait)
{
    if (ready == INT64_MAX)
        return wait;
    int64_t wall = rd_wall(d);
    uint64_t w = ready > wall ? (uint64_t)sat_sub(ready, wall) : 0;
    return wait < w ? wait : w;
}

/* Sleep until the next due timer, the first checked timer's due time
 * (@ready, wall ms), a signal, or IDLE_WAIT_MS. mu held. */
static void rd_sleep(struct rd *d, uint64_t now, bool early, int64_t ready)
{
    uint64_t until = tw_wheel_next_expiry(d->wheel);
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

/* Hand the due timers of @list to the workers of their groups. mu
 * held. */
static void dispatch_locked(struct rd *d, struct rtimer *list)
{
    for (struct rtimer *r = list, *next; r; r = next) {
        next = r->next;
        struct grp *g = &d->grp[d->grp_of[r->shard]];
        if (!g->todo)
            pthread_cond_signal(&g->cv);
        r->next = g->todo;
        g->todo = r;
    }
}

/* The firer: advance the wheel, hand the due timers to their groups'
 * workers to be checked, start the callbacks of the timers they found
 * still ours. A batch of checks starts at most every CHECK_GAP_MS (at
 * once when the last one took a timer already late), so that timers due
 * close together share one round trip (which costs Redis far more than a
 * key). */
static void *rd_main(void *arg)
{
    struct rd *d = arg;
    pthread_mutex_lock(&d->mu);
    while (!d->stop) {
        int64_t next_ready = d->ready ? fire_ready(d) : INT64_MAX;
        uint64_t now = rd_mono_ms(d), real = real_mono_ms();
        if (real < d->next_check) {
            cv_wait_ms(d, cap_ready(d, next_ready, d->next_check - real));
            continue;
        }
        struct rtimer *list = NULL;
        bool behind = false;
        bool early = take_due(d, now, &list, &behind);
        if (list) {
            /* No gap while behind: no sleep with timers late. */
            d->next_check = real + (behind ? 0 : CHECK_GAP_MS);
            dispatch_locked(d, list);
            continue;
        }
        rd_sleep(d, now, early, next_ready);
    }
    pthread_mutex_unlock(&d->mu);
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
#define SCHED_FIXED (3 + NKEYS + 3) /* EVALSHA sha 5 keys.. 3 numbers */

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
    int64_t until = sat_add(b->now, b->d->horizon_ms);
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
    long long head[3] = {sat_add(b->now, d->horizon_ms), b->now, d->lease_ms};
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
    if (((struct rd *)base)->nofire) {
        for (size_t i = 0; i < n; i++)
            items[i].result = TW_EINVAL;
        return n ? TW_EINVAL : 0;
    }
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
    free_replies(cmds, n);
    tw__free(cmds);
    tw__free(calls);
    if (rc)
        return rc;
    pthread_mutex_lock(&d->mu);
    out->pending = sum[0];
    out->backlog = sum[1] + local_backlog(d, wall);
    out->quarantined = sum[2];
    out->dead = sum[3];
    out->fired = d->fired;
    out->retried = d->retried;
    out->cancelled = d->cancelled;
    out->running = d->callbacks;
    out->late_sum_us = d->late_sum_us;
    memcpy(out->late_hist, d->late_hist, sizeof out->late_hist);
    pthread_mutex_unlock(&d->mu);
    return 0;
}

static void rd_free(struct rd *d)
{
    tw__own_close(d->own);
    while (d->held) {
        struct rtimer *r = d->held;
        rt_free_locked(d, r);
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
    pthread_mutex_destroy(&d->op_mu);
    pthread_cond_destroy(&d->cv);
    pthread_cond_destroy(&d->claim_cv);
    tw__free(d->sk);
    tw__free(d);
}

/* Stop the firer and the topology thread, then the groups' threads (the
 * firer's last callbacks give them completions to send). */
static void rd_stop(struct rd *d)
{
    pthread_mutex_lock(&d->mu);
    d->stop = true;
    pthread_cond_signal(&d->cv);
    pthread_cond_signal(&d->claim_cv);
    for (int g = 0; g < GROUPS_MAX; g++)
        pthread_cond_signal(&d->grp[g].ccv);
    pthread_mutex_unlock(&d->mu);
    if (d->thr_on)
        pthread_join(d->thr, NULL);
    if (d->claimer_on)
        pthread_join(d->claimer, NULL);
    pthread_mutex_lock(&d->mu);
    d->gstop = true;
    for (int g = 0; g < GROUPS_MAX; g++)
        pthread_cond_signal(&d->grp[g].cv);
    pthread_mutex_unlock(&d->mu);
    for (int g = 0; g < GROUPS_MAX; g++) {
        if (!d->grp[g].started)
            continue;
        pthread_join(d->grp[g].thr, NULL);
        pthread_join(d->grp[g].cthr, NULL);
        d->grp[g].started = false;
    }
}

static int rd_close(tw_durable *base)
{
    struct rd *d = (struct rd *)base;
    rd_stop(d);
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

/* ------------------------------------------------------------------------ */
/* Look-up and listing: read-only scripts, sent with EVAL (Redis caches a
 * script's compiled body by its digest), one per shard. */

/* GET KEYS: d p x; ARGV: key. nil, or {score, value of :p}; the score of
 * a dead letter is "dead". */
static const char get_script[] =
    "local s=redis.call('ZSCORE',KEYS[1],ARGV[1])\n"
    "if not s and redis.call('ZSCORE',KEYS[3],ARGV[1]) then s='dead' end\n"
    "if not s then return false end\n"
    "return {s,redis.call('HGET',KEYS[2],ARGV[1]) or ''}\n";

/* DEAD KEYS: x p; ARGV: key after max. The shard's first max dead
 * letters after key (after = 1) or from the first, in key order:
 * {key, due, ...}, due the integer text at the head of its value, or
 * "0" when the value does not begin with one. */
static const char dead_script[] =
    "local m=tonumber(ARGV[3])\n"
    "local r=redis.call('ZRANGEBYLEX',KEYS[1],"
    "ARGV[2]=='1' and '('..ARGV[1] or '-','+','LIMIT',0,m)\n"
    "if #r==0 then return {} end\n"
    "local v=redis.call('HMGET',KEYS[2],unpack(r))\n"
    "local out={}\n"
    "for i=1,#r do\n"
    " out[2*i-1]=r[i]\n"
    " out[2*i]=v[i] and string.match(v[i],'^(-?%d+),') or '0'\n"
    "end\n"
    "return out\n";

/* LIST KEYS: d p; ARGV: from key after to max. The shard's first max
 * timers with (due, key) after (from, key) (after = 1) or due >= from,
 * and due < to, in (due, key) order: {key, due, key, due, ...}, each
 * due as text (a waiting key's score as Redis writes it, a claimed key's
 * due time as its value holds it: a Lua number would not keep an int64
 * exact, and Redis would turn one past 2^63 into garbage). Waiting
 * keys are :d's non-negative scores, which a sorted set orders by (score,
 * member bytes): the start is a rank, found by ZCOUNT and, among the
 * members at the cursor's own score, a binary search by rank (O(log^2 n)).
 * Claimed keys (negative scores) keep their due time in :p: at most
 * 10,000 of them are read, 100 values at a time, and merged in.
 * Members are compared byte by byte, as Redis orders them (Lua's own
 * string order follows the locale). */
static const char list_script[] =
    "local from,key,aft,to,max=tonumber(ARGV[1]),ARGV[2],ARGV[3]=='1',"
    "tonumber(ARGV[4]),tonumber(ARGV[5])\n"
    "local z=KEYS[1]\n"
    "local function lt(a,b)\n"
    " for i=1,math.min(#a,#b) do\n"
    "  local x,y=string.byte(a,i),string.byte(b,i)\n"
    "  if x~=y then return x<y end\n"
    " end\n"
    " return #a<#b\n"
    "end\n"
    "local function past(d,k)\n"
    " if d~=from then return d>from end\n"
    " return not aft or lt(key,k)\n"
    "end\n"
    "local lo=redis.call('ZCOUNT',z,'-inf','('..ARGV[1])\n"
    "if aft then\n"
    " local hi=redis.call('ZCOUNT',z,'-inf',ARGV[1])\n"
    " while lo<hi do\n"
    "  local mid=math.floor((lo+hi)/2)\n"
    "  if lt(key,redis.call('ZRANGE',z,mid,mid)[1]) then hi=mid\n"
    "  else lo=mid+1 end\n"
    " end\n"
    "end\n"
    "local w=redis.call('ZRANGE',z,lo,lo+max-1,'WITHSCORES')\n"
    "local c=redis.call('ZRANGEBYSCORE',z,'-inf','(0','LIMIT',0,10000)\n"
    "local cl={}\n"
    "for i=1,#c,100 do\n"
    " local part={}\n"
    " for j=i,math.min(i+99,#c) do part[#part+1]=c[j] end\n"
    " local v=redis.call('HMGET',KEYS[2],unpack(part))\n"
    " for j=1,#part do\n"
    "  local t=v[j] and string.match(v[j],'^(-?%d+),')\n"
    "  local d=t and tonumber(t)\n"
    "  if d then\n"
    "   if d<0 then d,t=0,'0' end\n"
    "   if d<to and past(d,part[j]) then cl[#cl+1]={d,part[j],t} end\n"
    "  end\n"
    " end\n"
    "end\n"
    "table.sort(cl,function(a,b)\n"
    " if a[1]~=b[1] then return a[1]<b[1] end\n"
    " return lt(a[2],b[2])\n"
    "end)\n"
    "local out,i,j={},1,1\n"
    "while #out<2*max do\n"
    " local wd=w[2*i] and tonumber(w[2*i])\n"
    " if wd and wd>=to then wd=nil end\n"
    " local cd=cl[j]\n"
    " if not wd and not cd then break end\n"
    " if cd and (not wd or cd[1]<wd or (cd[1]==wd and lt(cd[2],w[2*i-1])))"
    " then\n"
    "  out[#out+1]=cd[2]\n"
    "  out[#out+1]=cd[3]\n"
    "  j=j+1\n"
    " else\n"
    "  out[#out+1]=w[2*i-1]\n"
    "  out[#out+1]=w[2*i]\n"
    "  i=i+1\n"
    " end\n"
    "end\n"
    "return out\n";

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
        int i = (int)((const char *)memchr(key_suffix, keys[k], NKEYS) -
                      key_suffix);
        argv[3 + k] = d->sk[shard].name[i];
        len[3 + k] = d->sk[shard].len[i];
    }
    *cmd = (tw__rc_cmd){3 + nk + argc, argv, len, d->sk[shard].slot, NULL, 0};
}

static int rd_get(tw_durable *base, const void *key, size_t key_len,
                  tw_durable_info *info, void *buf, size_t buf_len)
{
    struct rd *d = (struct rd *)base;
    const char *argv[7];
    size_t len[7];
    tw__rc_cmd cmd;
    eval_cmd(d, &cmd, argv, len, get_script, sizeof get_script - 1,
             shard_of(d, key, key_len), 1, "dpx");
    argv[6] = key;
    len[6] = key_len;
    int rc = tw__rc_exec(d->rc, &cmd, 1);
    const redisReply *r = cmd.reply;
    struct pval v;
    if (!rc && r && r->type == REDIS_REPLY_NIL) {
        rc = TW_ENOENT;
    } else if (!rc &&
               (!r || r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
                r->element[0]->type != REDIS_REPLY_STRING ||
                r->element[1]->type != REDIS_REPLY_STRING ||
                !parse_val(r->element[1]->str, r->element[1]->len, &v))) {
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

static int rd_list(tw_durable *base, const struct tw__list_req *q,
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
        eval_cmd(d, &cmds[i], a, l, list_script, sizeof list_script - 1,
                 (uint32_t)i, 5, "dp");
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
/* Dead letters and touch (see the top of the file). */

/* One script call on @shard; its integer reply into *@out. */
static int call_int(struct rd *d, struct call *c, long long *out)
{
    tw__rc_cmd cmd;
    int rc = run_calls(d, c, &cmd, 1);
    const redisReply *r = cmd.reply;
    if (!rc && (!r || r->type != REDIS_REPLY_INTEGER))
        rc = TW_EIO;
    if (!rc)
        *out = r->integer;
    free_replies(&cmd, 1);
    return rc;
}

static int rd_dead_op(tw_durable *base, const void *key, size_t key_len,
                      int64_t due_ms, bool del)
{
    struct rd *d = (struct rd *)base;
    uint32_t sh = shard_of(d, key, key_len);
    struct call c;
    call_init(d, &c, del ? S_DDEL : S_REARM, sh);
    call_arg(&c, key, key_len);
    if (!del)
        call_num(&c, due_ms);
    long long res = 0;
    int rc = call_int(d, &c, &res);
    if (!rc)
        rc = res == 1 ? 0 : res == 0 ? TW_ENOENT : TW_EIO;
    if (!rc && d->wait_replicas)
        wait_many(d, &sh, &rc, 1);
    return rc;
}

static int rd_touch(tw_durable *base, const void *key, size_t key_len)
{
    struct rd *d = (struct rd *)base;
    struct rtimer *r = rd_cur;
    if (!r || r->d != d || r->key_len != key_len ||
        memcmp(r->data, key, key_len))
        return TW_ENOENT;
    pthread_mutex_lock(&d->mu);
    long long tok = (long long)r->token;
    pthread_mutex_unlock(&d->mu);
    struct call c;
    call_init(d, &c, S_TOUCH, r->shard);
    call_arg(&c, key, key_len);
    call_num(&c, tok);
    call_num(&c, rd_wall(d));
    call_num(&c, d->lease_ms);
    long long t = 0;
    int rc = call_int(d, &c, &t);
    if (!rc && t <= 0)
        rc = TW_ENOENT;
    if (!rc) { /* its DONE, after the callback, is fenced by the new token */
        pthread_mutex_lock(&d->mu);
        r->token = (uint64_t)t;
        pthread_mutex_unlock(&d->mu);
    }
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

static int rd_list_dead(tw_durable *base, const struct tw__list_req *q,
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
        eval_cmd(d, &cmds[i], a, l, dead_script, sizeof dead_script - 1,
                 (uint32_t)i, 3, "xp");
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
 * library writes are skipped (a CLAIM sets them aside).
 * SCAN KEYS: p x; ARGV: cursor. {cursor, {key, value, dead 0/1, ...}}. */
#define SCAN_COUNT "1000"
static const char scan_script[] =
    "local r=redis.call('HSCAN',KEYS[1],ARGV[1],'COUNT'," SCAN_COUNT ")\n"
    "local out={}\n"
    "for i=1,#r[2],2 do\n"
    " out[#out+1]=r[2][i]\n"
    " out[#out+1]=r[2][i+1]\n"
    " out[#out+1]=redis.call('ZSCORE',KEYS[2],r[2][i]) and 1 or 0\n"
    "end\n"
    "return {r[1],out}\n";

static long rd_scan(tw_durable *base, tw_durable_scan_fn fn, void *arg)
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
            a[1] = scan_script;
            l[1] = sizeof scan_script - 1;
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
                    !parse_val(v->str, v->len, &pv))
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

static const struct tw_durable_ops rd_ops = {
    .schedule = rd_schedule,
    .schedule_many = rd_schedule_many,
    .cancel_many = rd_cancel_many,
    .cancel = rd_cancel,
    .close = rd_close,
    .stats = rd_stats,
    .get = rd_get,
    .list = rd_list,
    .scan = rd_scan,
    .dead_op = rd_dead_op,
    .list_dead = rd_list_dead,
    .touch = rd_touch,
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
    d->shard_lease_ms = cfg->redis_shard_lease_ms;
    if (cfg->redis_shard_lease_ms && cfg->redis_shard_lease_ms < d->lease_ms)
        d->lease_ms = cfg->redis_shard_lease_ms;
    d->wait_replicas = cfg->wait_replicas;
    d->wait_timeout_ms = cfg->wait_timeout_ms ? cfg->wait_timeout_ms : 1000;
    d->fire = cfg->fire;
    d->fire_arg = cfg->fire_arg;
    tw__retry_init(&d->retry, cfg);
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

/* Group the shards by master, start the groups' threads, the topology
 * thread and the firer. */
static int rd_start(struct rd *d)
{
    grp_refresh(d);
    pthread_mutex_lock(&d->mu);
    grp_start_locked(d);
    bool ok = true;
    for (uint32_t s = 0; s < d->shards; s++)
        ok = ok && d->grp[d->grp_of[s]].started;
    pthread_mutex_unlock(&d->mu);
    if (ok)
        d->claimer_on = !pthread_create(&d->claimer, NULL, rd_claimer, d);
    if (ok && d->claimer_on)
        d->thr_on = !pthread_create(&d->thr, NULL, rd_main, d);
    if (!ok || !d->claimer_on || !d->thr_on) {
        rd_stop(d);
        return TW_ENOMEM;
    }
    return 0;
}

/* Can this node deliver its shards' timers? Not while one callback has
 * held the firer for half a shard lease: the node then stops renewing its
 * ownership, so that the other nodes take its shards (and the claims that
 * run out), as they would take a silent node's. */
static bool own_healthy(void *arg)
{
    struct rd *d = arg;
    pthread_mutex_lock(&d->mu);
    uint64_t since = d->cb_start;
    pthread_mutex_unlock(&d->mu);
    return !since || rd_mono_ms(d) - since < d->shard_lease_ms / 2;
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
    d->base.readonly = cfg->flags & TW_DURABLE_READONLY;
    d->nofire = cfg->flags & TW_DURABLE_NOFIRE;
    if (!rc && !d->base.readonly && !d->nofire && cfg->redis_shard_lease_ms)
        rc = tw__own_open(&d->own, d->rc, ns, d->shards,
                          cfg->redis_shard_lease_ms, own_gain, own_healthy, d);
    if (!rc && !d->base.readonly && !d->nofire)
        rc = rd_start(d);
    if (rc) {
        rd_free(d);
        return rc;
    }
    *out = &d->base;
    return 0;
}
