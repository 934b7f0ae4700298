/* SPDX-License-Identifier: MIT */
/*
 * src/redis_eval.c - Lua script calls over the Redis client (see
 * redis_eval.h): the one place that loads scripts and turns a NOSCRIPT
 * into EVAL, for the backend's calls (src/redis_call.c) and for shard
 * ownership (src/redis_owner.c).
 *
 * Each script is loaded once (SCRIPT LOAD, on any node) at open and then
 * called by its digest (EVALSHA): the script's text crosses the wire once,
 * not on every call. A node that has not seen a script (another master
 * of a cluster, a restarted server, a replica promoted after a failover)
 * answers NOSCRIPT; the call is then sent again, with the other calls that
 * met the same, as EVAL of the text, which runs it and caches it on that
 * node, so later calls there find it by digest. Two passes at most: EVAL
 * never answers NOSCRIPT, the second pass is for a call that met a node
 * restarting between the two.
 *
 * Knows only the client (src/redis_client.h) and the caller's table of
 * scripts: nothing here depends on the backend's handle, so both the
 * backend and the ownership code call it without calling each other.
 */
#define _GNU_SOURCE

#include "redis_eval.h"

#include <stdbool.h>
#include <string.h>

#include "common.h"

int tw__eval_load(tw__rc *c, const char *const *src, size_t n, char (*sha)[41])
{
    for (size_t i = 0; i < n; i++) {
        const char *argv[3] = {"SCRIPT", "LOAD", src[i]};
        size_t len[3] = {6, 4, strlen(src[i])};
        tw__rc_cmd cmd = {3, argv, len, -1, NULL, 0};
        int rc = tw__rc_exec(c, &cmd, 1);
        if (!rc && (!cmd.reply || cmd.reply->type != REDIS_REPLY_STRING ||
                    cmd.reply->len != 40))
            rc = tw__rc_cmd_error(c, &cmd, "SCRIPT LOAD");
        if (!rc)
            memcpy(sha[i], cmd.reply->str, 41);
        if (cmd.reply)
            freeReplyObject(cmd.reply);
        if (rc)
            return rc;
    }
    return 0;
}

/* Whether @r is Redis's NOSCRIPT error (the node lacks the digest). */
static bool is_noscript(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && r->str &&
           !strncmp(r->str, "NOSCRIPT", 8);
}

/* A script call whose reply is NOSCRIPT: frees the reply and turns the
 * call into EVAL of Lua @src, to be run again; true. Any other reply:
 * false, nothing changed. */
static bool noscript_to_eval(tw__rc_cmd *cmd, const char *src)
{
    if (!is_noscript(cmd->reply))
        return false;
    freeReplyObject(cmd->reply);
    cmd->reply = NULL;
    const char **argv = (const char **)cmd->argv;
    size_t *len = (size_t *)cmd->argvlen;
    argv[0] = "EVAL";
    len[0] = 4;
    argv[1] = src;
    len[1] = strlen(src);
    return true;
}

/* One pass: the calls of @cmds answered NOSCRIPT (@again of them) sent
 * again as EVAL, in one pipelined batch. false: out of memory, nothing
 * sent. */
static bool eval_again(tw__rc *c, tw__rc_cmd *cmds, const int *script, size_t n,
                       const char *const *src, size_t again)
{
    tw__rc_cmd *sub = tw__calloc(again, sizeof *sub);
    size_t *idx = tw__calloc(again, sizeof *idx);
    if (!sub || !idx) {
        tw__free(sub);
        tw__free(idx);
        return false;
    }
    size_t j = 0;
    for (size_t i = 0; i < n; i++) {
        if (script[i] < 0 || !noscript_to_eval(&cmds[i], src[script[i]]))
            continue;
        sub[j] = cmds[i];
        idx[j++] = i;
    }
    tw__rc_exec(c, sub, again);
    for (size_t k = 0; k < again; k++)
        cmds[idx[k]] = sub[k];
    tw__free(sub);
    tw__free(idx);
    return true;
}

int tw__eval_run(tw__rc *c, tw__rc_cmd *cmds, const int *script, size_t n,
                 const char *const *src)
{
    int rc = tw__rc_exec(c, cmds, n);
    for (int pass = 0; pass < 2; pass++) {
        size_t again = 0;
        for (size_t i = 0; i < n; i++)
            if (script[i] >= 0 && is_noscript(cmds[i].reply))
                again++;
        if (!again)
            break;
        if (!eval_again(c, cmds, script, n, src, again))
            return TW_ENOMEM;
        rc = 0;
        for (size_t i = 0; i < n && !rc; i++)
            rc = cmds[i].err;
    }
    return rc;
}
