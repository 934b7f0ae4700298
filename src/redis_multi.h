/* SPDX-License-Identifier: MIT */
/*
 * src/redis_multi.h - script calls of the Redis backend: EVALSHA, EVAL on
 * NOSCRIPT, and many shards' calls of one script merged into one call on
 * a server that is not a cluster (src/redis_multi.c says how). Internal.
 */
#ifndef TWHEEL_REDIS_MULTI_H
#define TWHEEL_REDIS_MULTI_H

#include <stdbool.h>
#include <stddef.h>

#include "redis_client.h"

/* A family of scripts, by id 0..count-1: their texts, the texts of their
 * multi-shard forms (NULL: none, never merged) and those forms' digests
 * (SCRIPT LOAD at open; an unloaded one is loaded by EVAL on NOSCRIPT).
 * off: a merged call was refused as a whole while separate calls were
 * answered; no call is merged from then on (atomic). */
struct tw__rm {
    const char *const *src;
    const char *const *msrc;
    char (*msha)[41];
    int count;
    bool off;
};

/* The multi-shard form of a one-shard script's text @S (a string literal
 * that uses KEYS and ARGV and returns its reply): the same text run once
 * per part, as the function one(KEYS, ARGV). KEYS: every part's keys, one
 * part after the other; ARGV: per part, its number of keys, its number of
 * arguments, then its arguments. Returns one element per part: what the
 * one-shard script returns for it, or an error element when it fails (the
 * other parts are unaffected). */
#define TW__RM_FORM(S)                                                         \
    "local function one(KEYS,ARGV)\n" S "end\n"                                \
    "local out,ki,ai,n={},0,1,#ARGV\n"                                         \
    "while ai<=n do\n"                                                         \
    " local nk,na=tonumber(ARGV[ai]),tonumber(ARGV[ai+1])\n"                   \
    " if not nk or not na or nk<0 or na<0 or ki+nk>#KEYS or ai+1+na>n then\n"  \
    "  return redis.error_reply('ERR malformed multi-shard call')\n"           \
    " end\n"                                                                   \
    " local k,a={},{}\n"                                                       \
    " for i=1,nk do k[i]=KEYS[ki+i] end\n"                                     \
    " for i=1,na do a[i]=ARGV[ai+1+i] end\n"                                   \
    " ki,ai=ki+nk,ai+2+na\n"                                                   \
    " local ok,r=pcall(one,k,a)\n"                                             \
    " if not ok then\n"                                                        \
    "  r={err=type(r)=='table' and r.err or tostring(r)}\n"                    \
    " end\n"                                                                   \
    " if r==nil then r=false end\n"                                            \
    " out[#out+1]=r\n"                                                         \
    "end\n"                                                                    \
    "return out\n"

/* Run @n commands pipelined over @rc; @script[i] is the id in @m of
 * cmds[i]'s script (its argv[0..1] are EVALSHA and the digest, argv[2]
 * its number of keys, and its argv array is the caller's, writable) or -1
 * for a plain command. A node that lost its script cache gets EVAL. On a
 * server that is not a cluster, consecutive calls of one script with a
 * multi-shard form go as one call, whose parts' replies are put where
 * the separate calls' would be. Returns 0 or the first transport
 * error. */
int tw__rm_exec(tw__rc *rc, struct tw__rm *m, tw__rc_cmd *cmds,
                const int *script, size_t n);

/* Has @m stopped merging calls? */
bool tw__rm_off(struct tw__rm *m);

#ifdef TW_TEST_HOOKS
/* Tests: send every merged call malformed, so that Redis refuses it as
 * a whole. */
extern bool tw__rd_multi_break;
#endif

#endif
