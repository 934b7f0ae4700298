/* SPDX-License-Identifier: MIT */
/*
 * src/redis_multi.c - script calls of the Redis backend (src/durable_redis.c
 * and src/redis_owner.c send theirs here): EVALSHA, with EVAL where a node
 * answers NOSCRIPT (a restart or failover emptied its script cache; EVAL
 * loads the script there again).
 *
 * Many shards in one call. On a server that is not a cluster, a run of
 * consecutive calls of one script that has a multi-shard form (one call
 * per shard: the SCHED calls of a batch, a claim round's CLAIMs, a flush's
 * DONEs, an ownership round's renewals) goes as one call of that form
 * (TW__RM_FORM in src/redis_multi.h). Redis then pays its cost per script
 * call (the call, its arguments and reply, a wake-up) once per round
 * instead of once per shard. Each shard's part runs the one-shard script
 * on the same keys and arguments, fenced the same way, and gets its own
 * reply in the place of the separate call's, so the callers see what
 * separate calls would have answered; a part that fails is an error
 * element, and the other parts are unaffected. A merged call that fails
 * as a whole (other than NOSCRIPT) is sent again as separate calls; if
 * one of those is answered, the server does not take the merged form (a
 * proxy that wants one slot per call, say) and no call is merged any
 * more. In a cluster a script's keys must share a slot: separate calls,
 * always.
 */
#include "redis_multi.h"

#include <stdio.h>
#include <string.h>

#include "internal.h"

#ifdef TW_TEST_HOOKS
bool tw__rd_multi_break;
#endif

bool tw__rm_off(struct tw__rm *m)
{
    return __atomic_load_n(&m->off, __ATOMIC_RELAXED);
}

/* The text of script @id of @m: one of its count, or count + s for the
 * multi-shard form of script s. */
static const char *script_src(const struct tw__rm *m, int id)
{
    return id < m->count ? m->src[id] : m->msrc[id - m->count];
}

/* tw__rm_exec without merging: every command as it is. */
static int run_plain(tw__rc *rc, const struct tw__rm *m, tw__rc_cmd *cmds,
                     const int *script, size_t n)
{
    int err = tw__rc_exec(rc, cmds, n);
    for (int pass = 0; pass < 2; pass++) {
        size_t again = 0;
        for (size_t i = 0; i < n; i++)
            if (script[i] >= 0 && tw__rc_is_noscript(cmds[i].reply))
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
            if (script[i] < 0 ||
                !tw__rc_noscript_to_eval(&cmds[i], script_src(m, script[i])))
                continue;
            sub[j] = cmds[i];
            idx[j++] = i;
        }
        tw__rc_exec(rc, sub, again);
        err = 0;
        for (size_t k = 0; k < again; k++)
            cmds[idx[k]] = sub[k];
        for (size_t i = 0; i < n && !err; i++)
            err = cmds[i].err;
        tw__free(sub);
        tw__free(idx);
    }
    return err;
}

/* A part's number of keys: argv[2] of a script call. */
static size_t call_nkeys(const tw__rc_cmd *c)
{
    size_t k = 0;
    for (size_t i = 0; i < c->argvlen[2]; i++)
        k = k * 10 + (size_t)(c->argv[2][i] - '0');
    return k;
}

/* A run of cmds[first .. first + n) of @script, merged into one call. */
struct mrun {
    size_t first, n;
    int script;
};

/* The runs of commands worth merging (two calls or more) into @runs
 * (room for n / 2); how many. */
static size_t find_runs(const struct tw__rm *m, const int *script, size_t n,
                        struct mrun *runs)
{
    size_t k = 0;
    for (size_t i = 0, j; i < n; i = j) {
        for (j = i + 1; j < n && script[j] == script[i]; j++)
            ;
        if (j - i >= 2 && script[i] >= 0 && script[i] < m->count &&
            m->msrc[script[i]])
            runs[k++] = (struct mrun){i, j - i, script[i]};
    }
    return k;
}

static void put_num(const char **av, size_t *al, char *buf, size_t v)
{
    *al = (size_t)snprintf(buf, 24, "%zu", v);
    *av = buf;
}

/* Build the merged call of run @r into @out, its arguments in @av, @al
 * (room for 3 + the parts' arguments + 2 per part) and @num (1 + 2 per
 * part). */
static void merge_run(const struct tw__rm *m, const tw__rc_cmd *cmds,
                      const struct mrun *r, tw__rc_cmd *out, const char **av,
                      size_t *al, char (*num)[24])
{
    size_t nk = 0, a = 3;
    for (size_t j = 0; j < r->n; j++) {
        const tw__rc_cmd *c = &cmds[r->first + j];
        size_t k = call_nkeys(c);
        memcpy(av + a, c->argv + 3, k * sizeof *av);
        memcpy(al + a, c->argvlen + 3, k * sizeof *al);
        a += k;
        nk += k;
    }
    for (size_t j = 0; j < r->n; j++) {
        const tw__rc_cmd *c = &cmds[r->first + j];
        size_t k = call_nkeys(c), na = (size_t)c->argc - 3 - k;
        put_num(av + a, al + a, num[1 + 2 * j], k);
        put_num(av + a + 1, al + a + 1, num[2 + 2 * j], na);
#ifdef TW_TEST_HOOKS
        if (tw__rd_multi_break && !j)
            al[a] = 0; /* "": the script refuses the call */
#endif
        a += 2;
        memcpy(av + a, c->argv + 3 + k, na * sizeof *av);
        memcpy(al + a, c->argvlen + 3 + k, na * sizeof *al);
        a += na;
    }
    av[0] = "EVALSHA";
    al[0] = 7;
    av[1] = m->msha[r->script];
    al[1] = 40;
    put_num(av + 2, al + 2, num[0], nk);
    *out = (tw__rc_cmd){(int)a, av, al, cmds[r->first].slot, NULL, 0};
}

/* The parts' replies from merged call @mc of run @r; false when it has
 * none to give (an error as a whole, or a reply of another shape). */
static bool split_run(tw__rc_cmd *cmds, const struct mrun *r, tw__rc_cmd *mc)
{
    redisReply *rep = mc->reply;
    if (mc->err) {
        for (size_t j = 0; j < r->n; j++) {
            cmds[r->first + j].reply = NULL;
            cmds[r->first + j].err = mc->err;
        }
        return true;
    }
    if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != r->n)
        return false;
    for (size_t j = 0; j < r->n; j++) {
        cmds[r->first + j].reply = rep->element[j];
        cmds[r->first + j].err = 0;
        rep->element[j] = NULL;
    }
    return true;
}

/* A run whose merged call failed as a whole: its calls one by one. If
 * one of them is answered (not an error), the server does not take
 * merged calls: none from now on. */
static void run_apart(tw__rc *rc, struct tw__rm *m, tw__rc_cmd *cmds,
                      const int *script, const struct mrun *r)
{
    tw__rc_cmd *c = cmds + r->first;
    run_plain(rc, m, c, script + r->first, r->n);
    for (size_t j = 0; j < r->n; j++)
        if (c[j].reply && c[j].reply->type != REDIS_REPLY_ERROR) {
            __atomic_store_n(&m->off, true, __ATOMIC_RELAXED);
            break;
        }
}

int tw__rm_exec(tw__rc *rc, struct tw__rm *m, tw__rc_cmd *cmds,
                const int *script, size_t n)
{
    if (n < 2 || tw__rm_off(m) || tw__rc_cluster(rc))
        return run_plain(rc, m, cmds, script, n);
    struct mrun *runs = tw__malloc(n / 2 * sizeof *runs);
    size_t nr = runs ? find_runs(m, script, n, runs) : 0;
    size_t nout = n, nargs = 0, nnum = 0;
    for (size_t i = 0; i < nr; i++) {
        nout -= runs[i].n - 1;
        nargs += 3;
        nnum += 1 + 2 * runs[i].n;
        for (size_t j = 0; j < runs[i].n; j++)
            nargs += (size_t)cmds[runs[i].first + j].argc - 1;
    }
    tw__rc_cmd *out = nr ? tw__calloc(nout, sizeof *out) : NULL;
    int *oscript = nr ? tw__calloc(nout, sizeof *oscript) : NULL;
    size_t *from = nr ? tw__calloc(nout, sizeof *from) : NULL;
    const char **av = nr ? tw__calloc(nargs, sizeof *av) : NULL;
    size_t *al = nr ? tw__calloc(nargs, sizeof *al) : NULL;
    char(*num)[24] = nr ? tw__calloc(nnum, sizeof *num) : NULL;
    int err;
    if (!out || !oscript || !from || !av || !al || !num) {
        err = run_plain(rc, m, cmds, script, n); /* nothing to merge */
        goto done;
    }
    size_t k = 0, a = 0, u = 0;
    for (size_t i = 0, r = 0; i < n; k++) {
        from[k] = i;
        if (r < nr && runs[r].first == i) {
            merge_run(m, cmds, &runs[r], &out[k], av + a, al + a, num + u);
            oscript[k] = m->count + runs[r].script;
            a += (size_t)out[k].argc;
            u += 1 + 2 * runs[r].n;
            i += runs[r++].n;
        } else {
            out[k] = cmds[i];
            oscript[k] = script[i++];
        }
    }
    run_plain(rc, m, out, oscript, nout);
    for (size_t j = 0, r = 0; j < nout; j++) {
        if (r < nr && runs[r].first == from[j]) {
            if (!split_run(cmds, &runs[r], &out[j]))
                run_apart(rc, m, cmds, script, &runs[r]);
            if (out[j].reply)
                freeReplyObject(out[j].reply);
            r++;
        } else {
            cmds[from[j]] = out[j];
        }
    }
    err = 0;
    for (size_t i = 0; i < n && !err; i++)
        err = cmds[i].err;
done:
    tw__free(out);
    tw__free(oscript);
    tw__free(from);
    tw__free(av);
    tw__free(al);
    tw__free(num);
    tw__free(runs);
    return err;
}
