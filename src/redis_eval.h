/* SPDX-License-Identifier: MIT */
/*
 * src/redis_eval.h - Lua script calls over the Redis client, for every
 * part of the Redis backend that sends scripts (the backend's calls,
 * src/redis_call.c, and shard ownership, src/redis_owner.c): load a
 * table of scripts, then run pipelined EVALSHA calls that fall back to
 * EVAL on a node that lacks a script. src/redis_eval.c says how.
 * Internal. Any thread, as tw__rc_exec.
 */
#ifndef TWHEEL_REDIS_EVAL_H
#define TWHEEL_REDIS_EVAL_H

#include <stddef.h>

#include "redis_client.h"

/* SCRIPT LOAD of each of the @n Lua sources @src on any node; their
 * digests (40 hex digits and a NUL) into @sha[0..n). Other nodes learn a
 * script by EVAL on their first NOSCRIPT: the digest is the same
 * everywhere. 0, or as tw__rc_cmd_error() for the first that failed. */
int tw__eval_load(tw__rc *c, const char *const *src, size_t n, char (*sha)[41]);

/* Run @n commands pipelined. @script[i] >= 0: cmds[i] is a call of the
 * script @src[script[i]] (argv[0..1] EVALSHA and its digest, the argv
 * and argvlen arrays the caller's and writable); -1: a plain command. A
 * script call answered NOSCRIPT (the node restarted or failed over and
 * lost its script cache) is sent again as EVAL of its source, which loads
 * it there. Returns 0, or the first command's transport error
 * (TW_ECONN...), or TW_ENOMEM; the replies are the caller's to free. */
int tw__eval_run(tw__rc *c, tw__rc_cmd *cmds, const int *script, size_t n,
                 const char *const *src);

#endif
