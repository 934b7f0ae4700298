/* SPDX-License-Identifier: MIT */
/*
 * src/redis_scripts.c - the Lua scripts of the Redis backend, and the
 * data model in Redis that they keep. The other files of the backend send
 * them by id (src/redis_scripts.h): src/durable_redis.c SCHED, SCHED_IF and
 * CANCEL, src/redis_fire.c CLAIM, DONE and TOUCH, src/durable_redis.c's close
 * RELEASE, src/redis_query.c REARM, DDEL, RESTORE and the read-only GET,
 * LIST, DEAD and SCAN.
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
 *                         a member of :d without a value; "s:<key>" a
 *                         score of :d no script writes (below -2^53 or
 *                         above 2^63, +-inf: CLAIM makes the key a claim
 *                         that ran out, so it is delivered); "k:<c>" a whole
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
 * ms of Redis's clock (TIME in the script: R + max(due - now, 0) + lease,
 * R Redis's time, now the caller's wall clock): unique per claim within
 * the shard, growing with the clock, and floor(T / 1024) >= expiry; a
 * lease ran out when floor(T / 1024) <= R, i.e. when the score is in
 * [-(R * 1024 + 1023), 0). Only the master's clock judges a lease (a node
 * whose wall clock is stepped or skewed takes back no claim early; the
 * caller's clock only says how far ahead the due time is). Scripts that
 * call TIME and then write are replicated by their effects (the default
 * since Redis 5). So the lease, the token and the fencing of a
 * claimed key are one score: claiming a key is one ZADD entry, checking
 * it one ZMSCORE entry, completing it one ZREM and one HDEL entry, with
 * no other per-key structure (earlier versions kept a lease set, token,
 * attempt and due-time hashes: 6 per-key writes per claim, 6 per
 * completion).
 *
 * Every change is one script (EVALSHA; EVAL once on NOSCRIPT, which loads
 * it on that node): SCHED, CANCEL, CLAIM, DONE, RELEASE; SCHED_IF is
 * SCHED behind the conditions of tw_durable_schedule_if() (CANCEL takes
 * its condition as an optional argument). Scripts that take
 * many keys (SCHED, CLAIM, DONE) run a fixed number of variadic commands
 * per call, so Redis's per-call and per-command costs (a script call
 * about 4 us, each redis.call about 3 us more: "Round 5" of "Durable
 * timers on Redis" in bench/history/BENCHMARKS-notebook.md) are paid once
 * per batch.
 */
#include "redis_scripts.h"

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
    /* (the range checks only for 19 digits of due or 10 of attempt).  */     \
    "local mx,fl,tn,sm=math.max,math.floor,tonumber,string.match\n"             \
    "local function pv(s)\n"                                                   \
    " if type(s)~='string' then return nil end\n"                              \
    " local d,a=sm(s,'^(%-?%d+),(%d+),')\n"                                    \
    " if not d then return nil end\n"                                          \
    " local nd,na=#d,#a\n"                                                     \
    " if nd>18 or na>9 then\n"                                                 \
    "  local u=string.gsub(d,'^%-','')\n"                                      \
    "  if #u>19 or (#u==19 and u>(u==d and '9223372036854775807' or"           \
    "  '9223372036854775808')) or na>10 or tn(a)>4294967295 then\n"            \
    "   return nil\n"                                                          \
    "  end\n"                                                                  \
    " end\n"                                                                   \
    " return tn(d),tn(a),nd,na\n"                                              \
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
    /* Redis's clock (TIME) in ms: what judges the end of a lease. */ \
    "local function rnow()\n" \
    " local t=redis.call('TIME')\n" \
    " return tonumber(t[1])*1000+math.floor(tonumber(t[2])/1000)\n" \
    "end\n" \
    /* A :d score as an integer (floored; NaN, inf, absent: nil). */           \
    "local function sc(x)\n"                                                   \
    " local n=x and tn(x)\n"                                                   \
    " if n and n==n and n~=math.huge and n~=-math.huge then\n"                 \
    "  return fl(n)\n"                                                         \
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

/* SCHED's body as a function SB of its arguments (its parameter is named
 * ARGV, so the body reads as a script's): SCHED runs it on its ARGV,
 * SCHED_IF on the items whose conditions held. */
#define SCHED_BODY                                                             \
    "local function SB(ARGV)\n"                                                \
    "local untl,now,lease=tonumber(ARGV[1]),tonumber(ARGV[2]),"                \
    "tonumber(ARGV[3])\n"                                                      \
    "local m=(#ARGV-3)/3\n"                                                    \
    "local seen,hv,fz,nk,nd,nj,ks={},{},{},{},{},{},{}\n"                      \
    "for j=m,1,-1 do\n"                                                        \
    " local i=3*j+1\n"                                                         \
    " local k,due=ARGV[i],tonumber(ARGV[i+1])\n"                               \
    " if not seen[k] then\n"                                                   \
    "  seen[k]=true\n"                                                         \
    "  ks[#ks+1]=k\n"                                                          \
    "  hv[#hv+1]=k\n"                                                          \
    "  hv[#hv+1]=ARGV[i+2]\n"                                                  \
    "  if due<=untl then\n"                                                    \
    "   nk[#nk+1]=k\n"                                                         \
    "   nd[#nd+1]=due\n"                                                       \
    "   nj[#nj+1]=j\n"                                                         \
    "  else\n"                                                                 \
    "   fz[#fz+1]=ARGV[i+1]\n"                                                 \
    "   fz[#fz+1]=k\n"                                                         \
    "  end\n"                                                                  \
    " end\n"                                                                   \
    "end\n"                                                                    \
    "local t,v,vb=0,0,false\n"                                                 \
    "if #nk>0 then t=cnt(S,'s') end\n"                                         \
    "local old=#hv/2-redis.call('HSET',P,unpack(hv))>0\n"                      \
    "redis.call('ZREM',X,unpack(ks))\n"                                        \
    "if old then v,vb=cnt(V,'v') end\n"                                        \
    "if #fz>0 then redis.call('ZADD',D,unpack(fz)) end\n"                      \
    "if #nk==0 and not old then return {} end\n"                               \
    "if old then\n"                                                            \
    " v=math.max(v+1,now*1024)\n"                                              \
    " redis.call('SET',V,v)\n"                                                 \
    "elseif #nk>0 then\n"                                                      \
    " v,vb=cnt(V,'v')\n"                                                       \
    " if vb then\n"                                                            \
    "  v=math.max(1,now*1024)\n"                                               \
    "  redis.call('SET',V,v)\n"                                                \
    " end\n"                                                                   \
    "end\n"                                                                    \
    "if #nk==0 then return {} end\n"                                           \
    "local nz,out,rn={},{v},rnow()\n"                                          \
    "for i=1,#nk do\n"                                                         \
    " t=math.max(t+1,(rn+math.max(nd[i]-now,0)+lease)*1024)\n"                 \
    " nz[2*i-1]=-t\n"                                                          \
    " nz[2*i]=nk[i]\n"                                                         \
    " out[2*i]=nj[i]\n"                                                        \
    " out[2*i+1]=t\n"                                                          \
    "end\n"                                                                    \
    "redis.call('SET',S,t)\n"                                                  \
    "redis.call('ZADD',D,unpack(nz))\n"                                        \
    "return out\n"                                                             \
    "end\n"

/* SCHED_IF's conditions: ARGV claim_until now lease, then (key due value
 * cond)... with cond "a" (the key must not be pending) or "=" followed by
 * the bytes its pending value's payload must begin with. The items are
 * checked in order, each against the shard as the items before it left
 * it (cur: the key's value, or false when not pending); those that hold
 * go to SB, the others get their code. Returns {codes, SB's reply with
 * its item numbers mapped back}; code per item 0 applied, 1 stale, 2 not
 * pending. A value that cannot be read is stale (CLAIM sets it aside). */
#define SCHED_IF_BODY                                                          \
    SCHED_BODY                                                                 \
    "local A,st,cur,map={ARGV[1],ARGV[2],ARGV[3]},{},{},{}\n"                  \
    "for j=1,(#ARGV-3)/4 do\n"                                                 \
    " local i=4*j\n"                                                           \
    " local k,c=ARGV[i],ARGV[i+3]\n"                                           \
    " local s=cur[k]\n"                                                        \
    " if s==nil then\n"                                                        \
    "  s=redis.call('ZSCORE',D,k) and (redis.call('HGET',P,k) or '') or "      \
    "false\n"                                                                  \
    " end\n"                                                                   \
    " local r=0\n"                                                             \
    " if c=='a' then\n"                                                        \
    "  if s then r=1 end\n"                                                    \
    " elseif not s then r=2\n"                                                 \
    " elseif #c>1 then\n"                                                      \
    "  local d,a,nd,na=pv(s)\n"                                                \
    "  if not d or string.sub(s,nd+na+3,nd+na+1+#c)~=string.sub(c,2) then\n"   \
    "   r=1\n"                                                                 \
    "  end\n"                                                                  \
    " end\n"                                                                   \
    " st[j]=r\n"                                                               \
    " if r==0 then\n"                                                          \
    "  cur[k]=ARGV[i+2]\n"                                                     \
    "  A[#A+1]=k\n"                                                            \
    "  A[#A+1]=ARGV[i+1]\n"                                                    \
    "  A[#A+1]=ARGV[i+2]\n"                                                    \
    "  map[#map+1]=j\n"                                                        \
    " else\n"                                                                  \
    "  cur[k]=s\n"                                                             \
    " end\n"                                                                   \
    "end\n"                                                                    \
    "if #map==0 then return {st,{}} end\n"                                     \
    "local out=SB(A)\n"                                                        \
    "for e=2,#out,2 do out[e]=map[out[e]] end\n"                               \
    "return {st,out}\n"

const char *const tw__redis_scripts[S_COUNT] = {
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
    PRELUDE SCHED_BODY "return SB(ARGV)\n" EPILOGUE,
    /* CANCEL ARGV: key now [expect]. :v moves. With expect (a
     * conditional cancel), only if the pending value's payload begins
     * with it: else -1 (stale), nothing changed; a value that cannot be
     * read is stale (CLAIM sets it aside), unless expect is empty. */
    PRELUDE
    "local k=ARGV[1]\n"
    "local v=cnt(V,'v')\n"
    "if ARGV[3] and #ARGV[3]>0 and redis.call('ZSCORE',D,k) then\n"
    " local s=redis.call('HGET',P,k) or ''\n"
    " local d,a,nd,na=pv(s)\n"
    " if not d or string.sub(s,nd+na+3,nd+na+2+#ARGV[3])~=ARGV[3] then\n"
    "  return -1\n"
    " end\n"
    "end\n"
    "if redis.call('ZREM',D,k)==0 then return 0 end\n"
    "redis.call('HDEL',P,k)\n"
    "redis.call('SET',V,math.max(v+1,tonumber(ARGV[2])*1024))\n"
    "return 1\n" EPILOGUE,
    /* CLAIM ARGV: now until lease max scan [next] (scan 1: look for damaged
     * scores first, every DAMAGE_SCAN_ROUNDS-th round). Two ranges of :d: the
     * leases that ran out (score in [-(R * 1024 + 1023), 0), read with their
     * scores: they go back to their due time with attempt + 1, and :v moves),
     * then the keys due before until (score in [0, until], read without their
     * scores, which Redis would format as doubles at about 0.5 us a key:
     * a waiting key's score is max(its value's due, 0)); the latter are
     * claimed: a few commands per call, however many keys. A key whose value is
     * not a valid "due,attempt,payload" (or that has none) is set aside.
     * Returns {} or: 1 if the range was full (more may follow), else 0;
     * the shard's version; then (key token value) triples. With next 1,
     * a shard with no key to claim answers {score} of its first waiting
     * key past until, if it has one (src/redis_fire.c leaves it out of
     * the next rounds). */
    PRELUDE "local now,untl,lease,max=tonumber(ARGV[1]),tonumber(ARGV[2]),"
            "tonumber(ARGV[3]),tonumber(ARGV[4])\n"
            "local rn=rnow()\n"
            /* Scores no script writes (below -2^53: no token is that
             * large; above 2^63: no due time is), -inf and +inf
             * included, would hold their keys forever: each is set aside
             * as s:<key> and its key becomes a claim that ran out (-1),
             * so the ranges below give it back with attempt + 1. */
            "local bad={}\n"
            "if ARGV[5]=='1' then\n"
            "for _,r in ipairs({{'-inf','(-9007199254740992'},"
            "{'(9223372036854775808','+inf'}}) do\n"
            " local b=redis.call('ZRANGEBYSCORE',D,r[1],r[2],'WITHSCORES',"
            "'LIMIT',0,max)\n"
            " for i=1,#b,2 do\n"
            "  q('s:'..b[i],b[i+1])\n"
            "  bad[#bad+1]=-1\n"
            "  bad[#bad+1]=b[i]\n"
            " end\n"
            "end\n"
            "end\n"
            "if #bad>0 then redis.call('ZADD',D,unpack(bad)) end\n"
            "local ks=redis.call('ZRANGEBYSCORE',D,-(rn*1024+1023),'(0',"
            "'WITHSCORES','LIMIT',0,max)\n"
            "local ne,names=#ks/2,{}\n"
            "for i=1,ne do names[i]=ks[2*i-1] end\n"
            "if ne<max then\n"
            " local w=redis.call('ZRANGEBYSCORE',D,0,untl,'LIMIT',0,max-ne)\n"
            " for i=1,#w do names[ne+i]=w[i] end\n"
            "end\n"
            "local n=#names\n"
            "if n==0 then\n"
            " if ARGV[6]=='1' then\n"
            "  local nx=redis.call('ZRANGEBYSCORE',D,'('..ARGV[2],'+inf',"
            "'WITHSCORES','LIMIT',0,1)\n"
            "  if nx[2] then return {nx[2]} end\n"
            " end\n"
            " return {}\n"
            "end\n"
            "local vals=redis.call('HMGET',P,unpack(names))\n"
            "local t=cnt(S,'s')\n"
            "local v,ex=cnt(V,'v')\n"
            "local za,fz,out,m,bd,bp={},{},{n==max and 1 or 0,0},0,{},{}\n"
            "for i=1,n do\n"
            " local k,s=names[i],vals[i]\n"
            " local d,a,nd,na=pv(s)\n"
            " local due\n"
            " if i<=ne then due=sc(ks[2*i]) elseif d then due=mx(d,0) end\n"
            " if not d or not due then\n"
            "  if s then\n"
            "   q('p:'..k,s)\n"
            "   bp[#bp+1]=k\n"
            "  else\n"
            "   q('d:'..k,i<=ne and ks[2*i] or redis.call('ZSCORE',D,k))\n"
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
            "  t=mx(t+1,(rn+mx(due-now,0)+lease)*1024)\n"
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
            "local re,rn=false\n"
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
            "   rn=rn or rnow()\n"
            "   t=math.max(t+1,(rn+tonumber(ARGV[j+1])+lease)*1024)\n"
            "   redis.call('ZADD',D,-t,k)\n"
            "   out[i]=t\n"
            "   re=true\n"
            "  else\n"
            "   redis.call('ZADD',D,due,k)\n"
            "  end\n"
            " end\n"
            "end\n"
            "if re then\n"
            " out[n+1]=v\n"
            " redis.call('SET',S,t)\n"
            "end\n"
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
            "local t=math.max(cnt(S,'s')+1,(rnow()+tonumber(ARGV[4]))*1024)\n"
            "redis.call('SET',S,t)\n"
            "redis.call('ZADD',D,-t,k)\n"
            "return t\n" EPILOGUE,
    /* SCHED_IF: SCHED of the items whose conditions hold (SCHED_IF_BODY
     * above). */
    PRELUDE SCHED_IF_BODY EPILOGUE,
    /* RESTORE ARGV: key due value dead. A key the shard does not hold,
     * pending or dead, is written unclaimed: value into :p, the key into
     * :x (dead "1") or into :d at max(due, 0), where a node claims it as
     * any other. 0 if the key is held already (in :d or :x; a value in
     * :p without either is a leftover and is replaced). Only commands of
     * the smallest ACL (docs/guide/redis.md). */
    PRELUDE "local k=ARGV[1]\n"
            "if redis.call('ZSCORE',D,k) or redis.call('ZSCORE',X,k) then "
            "return 0 end\n"
            "redis.call('HSET',P,k,ARGV[3])\n"
            "if ARGV[4]=='1' then redis.call('ZADD',X,0,k)\n"
            "else redis.call('ZADD',D,tonumber(ARGV[2])<0 and 0 or ARGV[2],k) "
            "end\n"
            "return 1\n" EPILOGUE,
};

const char tw__redis_key_suffix[NKEYS] = {'d', 'p', 's', 'v', 'q', 'x'};

/* ------------------------------------------------------------------------ */
/* Look-up and listing: read-only scripts, sent with EVAL (Redis caches a
 * script's compiled body by its digest), one per shard
 * (src/redis_query.c). */

/* GET KEYS: d p x; ARGV: key. nil, or {score, value of :p}; the score of
 * a dead letter is "dead". */
const char tw__redis_get_script[] =
    "local s=redis.call('ZSCORE',KEYS[1],ARGV[1])\n"
    "if not s and redis.call('ZSCORE',KEYS[3],ARGV[1]) then s='dead' end\n"
    "if not s then return false end\n"
    "return {s,redis.call('HGET',KEYS[2],ARGV[1]) or ''}\n";

/* DEAD KEYS: x p; ARGV: key after max. The shard's first max dead
 * letters after key (after = 1) or from the first, in key order:
 * {key, due, ...}, due the integer text at the head of its value, or
 * "0" when the value does not begin with one. */
const char tw__redis_dead_script[] =
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
const char tw__redis_list_script[] =
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

/* SCAN KEYS: p x; ARGV: cursor. {cursor, {key, value, dead 0/1, ...}}. */
#define SCAN_COUNT "1000"
const char tw__redis_scan_script[] =
    "local r=redis.call('HSCAN',KEYS[1],ARGV[1],'COUNT'," SCAN_COUNT ")\n"
    "local out={}\n"
    "for i=1,#r[2],2 do\n"
    " out[#out+1]=r[2][i]\n"
    " out[#out+1]=r[2][i+1]\n"
    " out[#out+1]=redis.call('ZSCORE',KEYS[2],r[2][i]) and 1 or 0\n"
    "end\n"
    "return {r[1],out}\n";
