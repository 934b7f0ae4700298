/* SPDX-License-Identifier: MIT */
/*
 * src/redis_fire.c - the Redis backend's claiming and firing: the node's
 * own wheel of claimed timers (the claimers that fill it are in
 * src/redis_claim.c), the groups' workers that
 * check claims and send completions, and the firer that starts the
 * callbacks. The design in order:
 *
 * Threads. The shards are grouped by the Redis master that holds them
 * (CLUSTER SLOTS, read again every TOPOLOGY_MS by the topology thread);
 * each group has a claimer thread (CLAIM) and a worker thread (checks and
 * completions), each talking to its master only, so that a master that
 * stalls holds only its own shards. One firer thread advances the wheel,
 * hands the due timers to their groups' workers and delivers those found
 * still the node's through the durable layer's executor
 * (src/durable_exec.h): their callbacks run on the firer itself when
 * cfg.executor_threads is 0, else on the executor's threads, and each
 * delivery's claim is judged again when its callback is about to start
 * (fire_job()). The wheel is shared under mu: a schedule adds the timers
 * it claims at once.
 *
 * Claiming. The claimer runs CLAIM on every shard each horizon/4 (an
 * idle shard, without ownership, in fewer rounds: src/redis_claim.c): one
 * range of :d, [-(R * 1024 + 1023), now + horizon] (R: Redis's TIME,
 * which alone judges the end of a lease), holds both the leases that ran
 * out (they go back to their due time with attempt + 1,
 * and :v moves) and the keys due within the horizon; those get a token
 * each and come back with their payloads and the shard's :v. SCHED and a
 * retry in DONE claim at once when the due time is within the horizon, so
 * a short timer does not wait for the next CLAIM. A round goes to Redis
 * in round trips of about CLAIM_CHUNK_KEYS keys (src/redis_claim.c): the
 * checks share the node's connection, and Redis runs one client's
 * pipeline before it serves another, so a check waits for one chunk, not
 * for the round. Claimed timers sit in
 * the node's own tw_wheel (1 ms ticks of the monotonic clock), each with
 * the :v at which it was known to be the node's. A claimed key that does
 * not hash to the shard it was found in (a copy an operator or a bug
 * made) is set aside and removed instead (src/redis_errors.c).
 *
 * Firing. When the wheel says a timer is due within CHECK_AHEAD_MS (and
 * the wall clock agrees), the node asks Redis whether it is still its own:
 * one GET of :v per shard per batch, or on one server (not a cluster) one
 * MGET of the :v of every shard in the batch (a batch starts at most every
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

#include <stdlib.h>

#include "durable_redis_impl.h"

#define RETRY_MS 100
#define IDLE_WAIT_MS 50
#define DONE_DELAY_MS 500 /* longest wait of a completion for a batch */
#define RETRY_DONE_MS 100 /* the same for a retry (it waits for the reply) */
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
#define TOPOLOGY_MS 1000 /* how often the masters of the shards are read */
/* The plain commands of a check: a GET of one shard's :v, a ZMSCORE of
 * its :d, or one MGET of the :v of every shard in the round (one server,
 * not a cluster). */
enum { CHK_VER = -1, CHK_SCORE = -2, CHK_MVER = -3 };

static void on_wheel(tw_timer *t, void *arg)
{
    struct rtimer *r = arg;
    (void)t;
    r->next = r->d->due;
    r->d->due = r;
}

struct rtimer *tw__rd_rt_new(struct rd *d, uint32_t shard, const void *key,
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
void tw__rd_rt_arm_locked(struct rd *d, struct rtimer *r, int64_t wall,
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

void tw__rd_rt_free_locked(struct rd *d, struct rtimer *r)
{
    (void)d;
    if (r->hpprev) {
        *r->hpprev = r->hnext;
        if (r->hnext)
            r->hnext->hpprev = r->hpprev;
    }
    tw__free(r);
}

/* ------------------------------------------------------------------------ */
/* The node's thread: claim, fire, complete. */

enum { FR_DONE, FR_VER, FR_SCORE, FR_KINDS }; /* a shard's commands */

/* What a round holds for one shard. */
struct fr_shard {
    uint32_t cmd[FR_KINDS];  /* its DONE, GET of :v, ZMSCORE: command + 1 */
    uint32_t keys[FR_KINDS]; /* the completions or timers of each */
    uint32_t ret;            /* its completions that retry or go dead */
    bool dmix;               /* its completions have different versions */
    uint64_t dver;           /* else the version of all of them */
    uint32_t mpos;           /* its :v's element in the round's MGET */
};

/* One command of a round: element j of its reply is timer or completion
 * owner[base + j]; keys of them, fill placed so far. */
struct fr_cmd {
    size_t base, keys, fill;
};

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
    size_t nver;              /* of the due timers, those checked by :v */
    bool one;                 /* one server: every :v in one MGET */
    struct fr_shard *sh;      /* per shard */
    struct fr_cmd *cm;        /* per command */
    tw__rc_cmd *cmds;         /* per command, as the client takes them */
    int *script;              /* per command: S_DONE, CHK_VER or CHK_SCORE */
    size_t ncmd, ai, ni, acc; /* commands, arguments, numbers, keys used */
    const char **argv;
    size_t *len;
    char (*num)[24];
    size_t *owner;
    void *block;  /* every array above but pend, in one allocation */
    int64_t wall; /* the "now" the DONE calls were given */
};

static void fr_free(struct fround *f)
{
    tw__free(f->pend);
    tw__free(f->block);
}

#define DONE_FIXED                                                             \
    (3 + NKEYS + 5) /* EVALSHA sha 6 keys.. now untl lease n ver */

static size_t min_size(size_t a, size_t b)
{
    return a < b ? a : b;
}

/* Allocate the round's arrays at once, sized for the worst case of its n
 * timers and np completions: at most one DONE per shard with completions,
 * two checks per shard with timers; then count the keys per shard. False
 * when out of memory. */
static bool fr_alloc(struct fround *f, struct rtimer *list)
{
    size_t S = f->d->shards;
    for (struct rtimer *r = list; r; r = r->next)
        f->n++;
    size_t ndone = min_size(S, f->np), nchk = min_size(2 * S, f->n);
    size_t ncmd = ndone + nchk + 1;
    size_t nargs = f->n + 4 * f->np + 2 * nchk + DONE_FIXED * ndone + 1;
    struct tw__rd_part parts[] = {
        {&f->sh, S, sizeof *f->sh},
        {&f->v, f->n + 1, sizeof *f->v},
        {&f->cm, ncmd, sizeof *f->cm},
        {&f->cmds, ncmd, sizeof *f->cmds},
        {&f->script, ncmd, sizeof *f->script},
        {&f->argv, nargs, sizeof *f->argv},
        {&f->len, nargs, sizeof *f->len},
        {&f->num, 3 * f->np + 5 * ndone + 1, sizeof *f->num},
        {&f->owner, f->n + f->np + 1, sizeof *f->owner},
    };
    f->block = tw__rd_alloc_parts(parts, sizeof parts / sizeof parts[0]);
    if (!f->block)
        return false;
    size_t k = 0;
    for (struct rtimer *r = list; r; r = r->next) {
        f->v[k++] = r;
        f->sh[r->shard].keys[r->full ? FR_SCORE : FR_VER]++;
        f->nver += !r->full;
    }
    for (size_t i = 0; i < f->np; i++) {
        struct rtimer *r = f->pend[i].r;
        struct fr_shard *sh = &f->sh[r->shard];
        if (sh->keys[FR_DONE]++ == 0)
            sh->dver = r->ver;
        if (r->full || r->ver != sh->dver)
            sh->dmix = true;
        sh->ret += f->pend[i].res != 0; /* a retry, or dead (-1) */
    }
    return true;
}

/* Start @shard's command of @kind, of @argc0 fixed arguments, with room
 * for its keys of @per arguments each and @extra more. */
static tw__rc_cmd *fr_cmd(struct fround *f, uint32_t shard, int script,
                          int kind, size_t per, size_t argc0, size_t extra)
{
    size_t c = f->ncmd++, keys = f->sh[shard].keys[kind];
    tw__rc_cmd *cmd = &f->cmds[c];
    f->sh[shard].cmd[kind] = (uint32_t)f->ncmd;
    f->cm[c].base = f->acc;
    f->cm[c].keys = keys;
    f->acc += keys;
    f->script[c] = script;
    cmd->argv = &f->argv[f->ai];
    cmd->argvlen = &f->len[f->ai];
    cmd->slot = f->d->sk[shard].slot;
    cmd->argc = (int)argc0;
    f->ai += argc0 + per * keys + extra;
    return cmd;
}

/* On one server (no cluster), one MGET of the :v of every shard with
 * timers to check by version, in place of a GET per shard: the per-command
 * cost of Redis is paid once per round, not once per shard. */
static void fr_mget(struct fround *f)
{
    struct rd *d = f->d;
    size_t c = f->ncmd++;
    tw__rc_cmd *cmd = &f->cmds[c];
    const char **av = &f->argv[f->ai];
    size_t *al = &f->len[f->ai];
    f->cm[c].base = f->acc;
    f->cm[c].keys = f->nver;
    f->acc += f->nver;
    f->script[c] = CHK_MVER;
    av[0] = "MGET";
    al[0] = 4;
    int argc = 1;
    for (size_t i = 0; i < f->n; i++) {
        struct fr_shard *sh = &f->sh[f->v[i]->shard];
        if (f->v[i]->full || sh->cmd[FR_VER])
            continue;
        if (argc == 1)
            cmd->slot = d->sk[f->v[i]->shard].slot;
        sh->cmd[FR_VER] = (uint32_t)c + 1;
        sh->mpos = (uint32_t)argc - 1;
        av[argc] = d->sk[f->v[i]->shard].name[3];
        al[argc++] = d->sk[f->v[i]->shard].len[3];
    }
    cmd->argv = av;
    cmd->argvlen = al;
    cmd->argc = argc;
    f->ai += (size_t)argc;
}

/* The DONE command of each shard with completions (first: they free
 * leases), then the check commands of each shard with due timers: a GET
 * of its version :v for the timers known to be ours at some version, a
 * ZMSCORE of the keys of those whose version has moved since. */
static void fr_heads(struct fround *f)
{
    struct rd *d = f->d;
    for (size_t i = 0; i < f->np; i++) {
        uint32_t s = f->pend[i].r->shard;
        struct fr_shard *sh = &f->sh[s];
        if (sh->cmd[FR_DONE])
            continue;
        tw__rc_cmd *c =
            fr_cmd(f, s, S_DONE, FR_DONE, 2, DONE_FIXED, 2u * sh->ret);
        const char **av = (const char **)c->argv;
        size_t *al = (size_t *)c->argvlen;
        tw__rd_script_head(d, av, al, S_DONE, s);
        long long a5[5] = {f->wall, sat_add(f->wall, d->horizon_ms),
                           d->lease_ms, sh->keys[FR_DONE], (long long)sh->dver};
        tw__rd_put_nums(av + 3 + NKEYS, al + 3 + NKEYS, f->num + f->ni, a5, 5);
        f->ni += 5;
        if (sh->dmix)
            al[3 + NKEYS + 4] = 0; /* "": compare each key's score */
        c->argc += 2 * (int)sh->keys[FR_DONE]; /* retries follow */
    }
    if (f->one && f->nver)
        fr_mget(f);
    for (size_t i = 0; i < f->n; i++) {
        uint32_t s = f->v[i]->shard;
        bool z = f->v[i]->full;
        if (f->sh[s].cmd[z ? FR_SCORE : FR_VER])
            continue;
        tw__rc_cmd *c = z ? fr_cmd(f, s, CHK_SCORE, FR_SCORE, 1, 2, 0)
                          : fr_cmd(f, s, CHK_VER, FR_VER, 0, 2, 0);
        const char **av = (const char **)c->argv;
        size_t *al = (size_t *)c->argvlen;
        av[0] = z ? "ZMSCORE" : "GET";
        al[0] = z ? 7 : 3;
        av[1] = d->sk[s].name[z ? 0 : 3];
        al[1] = d->sk[s].len[z ? 0 : 3];
    }
}

/* Lay out the completions (the keys, then their tokens, then an
 * (index retry_ms) pair per retry) and the due timers' keys, remembering
 * whose reply element is whose. */
static void fr_fill(struct fround *f)
{
    for (size_t i = 0; i < f->np; i++) {
        struct done *p = &f->pend[i];
        size_t c = f->sh[p->r->shard].cmd[FR_DONE] - 1;
        size_t j = f->cm[c].fill++, m = f->cm[c].keys;
        tw__rc_cmd *cmd = &f->cmds[c];
        const char **av = (const char **)cmd->argv + DONE_FIXED;
        size_t *al = (size_t *)cmd->argvlen + DONE_FIXED;
        av[j] = p->r->data;
        al[j] = p->r->key_len;
        long long tok = (long long)p->r->token;
        tw__rd_put_nums(av + m + j, al + m + j, f->num + f->ni++, &tok, 1);
        f->owner[f->cm[c].base + j] = i;
        if (p->res != 0) {
            long long two[2] = {(long long)j + 1, p->res};
            tw__rd_put_nums((const char **)cmd->argv + cmd->argc,
                            (size_t *)cmd->argvlen + cmd->argc, f->num + f->ni,
                            two, 2);
            f->ni += 2;
            cmd->argc += 2;
        }
    }
    for (size_t i = 0; i < f->n; i++) {
        struct rtimer *r = f->v[i];
        size_t c = f->sh[r->shard].cmd[r->full ? FR_SCORE : FR_VER] - 1;
        tw__rc_cmd *cmd = &f->cmds[c];
        f->owner[f->cm[c].base + f->cm[c].fill++] = i;
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
        size_t m = f->cm[c].keys;
        uint64_t ver =
            rep && rep->type == REDIS_REPLY_ARRAY && rep->elements > m
                ? reply_u64(rep->element[m])
                : 0;
        for (size_t j = 0; j < m; j++) {
            struct done *p = &f->pend[f->owner[f->cm[c].base + j]];
            long long res = -1;
            if (rep && rep->type == REDIS_REPLY_ARRAY && j < rep->elements &&
                rep->element[j]->type == REDIS_REPLY_INTEGER)
                res = rep->element[j]->integer;
            if (p->res > 0) /* a retry may wait in :d */
                claim_soon_locked(d, p->r->shard);
            if (p->res > 0 && res > 0) {
                p->r->token = (uint64_t)res;
                p->r->ver = ver;
                p->r->full = false;
                p->r->attempt++;
                p->r->due_ms = sat_add(f->wall, p->res);
                p->r->fired = false;
                tw__rd_rt_arm_locked(d, p->r, wall, mono);
            } else {
                tw__rd_rt_free_locked(d, p->r);
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

/* The version that a GET of :v (or an MGET's element) answered: a nil is
 * 0 (no version yet). False when it proves nothing (an error reply, a
 * value that is not a number in [0, 2^53)): the scores are read. A :v of
 * the wrong type is an error to GET but a nil to MGET; the next script on
 * the shard sets it aside (src/redis_scripts.c). */
static bool ver_reply(const redisReply *e, double *ver)
{
    *ver = 0;
    if (e->type == REDIS_REPLY_NIL)
        return true;
    if (e->type != REDIS_REPLY_STRING)
        return false;
    char *end;
    *ver = strtod(e->str, &end);
    return end != e->str && !*end && *ver >= 0 && *ver < 0x1p53;
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
        bool z = f->script[c] == CHK_SCORE, m = f->script[c] == CHK_MVER;
        bool ans = rep && (z || m ? rep->type == REDIS_REPLY_ARRAY
                                  : rep->type == REDIS_REPLY_STRING ||
                                        rep->type == REDIS_REPLY_NIL ||
                                        rep->type == REDIS_REPLY_ERROR);
        if (ans && m && rep->elements != (size_t)f->cmds[c].argc - 1)
            ans = false;
        if (m && rep && rep->type == REDIS_REPLY_ERROR)
            d->no_mget = true; /* e.g. NOPERM: a GET per shard from now */
        for (size_t j = 0; j < f->cm[c].keys; j++) {
            size_t i = f->owner[f->cm[c].base + j];
            struct rtimer *r = f->v[i];
            redisReply *e = NULL;
            if (ans && z)
                e = j < rep->elements ? rep->element[j] : NULL;
            else if (ans)
                e = m ? rep->element[f->sh[r->shard].mpos] : rep;
            double ver = 0;
            bool vok = !z && e && ver_reply(e, &ver);
            if (!e) {
                tw_wheel_add(d->wheel, &r->tm, mono + RETRY_MS);
            } else if (vok && (double)r->ver == ver) {
                ready_or_ok(f, i, wall);
            } else if (!z) {
                r->full = true;
                r->ver = vok ? (uint64_t)ver : 0;
                tw_wheel_add(d->wheel, &r->tm, mono);
                d->next_check = 0;
            } else if (e->type == REDIS_REPLY_STRING &&
                       strtod(e->str, NULL) == -(double)r->token) {
                r->full = false;
                ready_or_ok(f, i, wall);
            } else {
                tw__rd_rt_free_locked(d, r);
            }
        }
    }
}

/* Keep a callback's result for the next DONE batch (no room: the lease
 * brings the timer back). mu held. */
void tw__rd_pend_add(struct rd *d, struct rtimer *r, int res)
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
        tw__rd_rt_free_locked(d, r);
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
        tw__rd_pend_add(d, r, RD_DEAD_UNRUN);
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
    d->cb_start = rd_mono_ms(d);
    tw__durable_counts_begin(&d->counts, late > 0 ? (uint64_t)late : 0);
    pthread_mutex_unlock(&d->mu);
    rd_cur = r;
    int res = tw__durable_fire(&d->base, d->fire, &t, d->fire_arg);
    rd_cur = NULL;
    pthread_mutex_lock(&d->mu);
    tw__durable_counts_end(&d->counts, res);
    if (!d->counts.running)
        d->cb_start = 0;
    tw__rd_pend_add(d, r, tw__retry_next(&d->retry, att, res));
    pthread_mutex_unlock(&d->mu);
}

/* Check @r again: its answer is too old to be trusted. mu held. */
static void recheck_locked(struct rd *d, struct rtimer *r)
{
    tw_wheel_add(d->wheel, &r->tm, tw_wheel_now(d->wheel));
    d->next_check = 0;
    pthread_cond_signal(&d->cv); /* from an executor thread: wake the firer */
}

/* A delivery as the executor runs it (src/durable_exec.h): on the firer
 * thread when executor_threads is 0, else on an executor thread, maybe
 * long after the firer took it. Either way its claim is judged when its
 * callback is about to start: a claim that may have run out is dropped
 * (the shard's owner delivers it), an answer older than CHECK_MAX_AGE_MS
 * is checked again; only then does the callback run. */
static void fire_job(struct tw__durable_job *job, void *ctx)
{
    struct rd *d = ctx;
    struct rtimer *r = TW_CONTAINER_OF(job, struct rtimer, job);
    if (r->dl && rd_mono_ms(d) >= r->dl) {
        /* Its claim may have run out: the shard's owner delivers it. */
        pthread_mutex_lock(&d->mu);
        tw__rd_rt_free_locked(d, r);
        pthread_mutex_unlock(&d->mu);
        return;
    }
    if (real_mono_ms() - r->chk_at > CHECK_MAX_AGE_MS) {
        pthread_mutex_lock(&d->mu);
        recheck_locked(d, r);
        pthread_mutex_unlock(&d->mu);
        return;
    }
    fire_one(d, r);
}

/* A delivery that close left queued: nothing to do here. Its timer stays
 * in d->held, whose claims close gives back (RELEASE), so the timer is
 * delivered again at once by whoever claims it next (at least once). */
static void drop_job(struct tw__durable_job *job, void *ctx)
{
    (void)job;
    (void)ctx;
}

/* Deliver the checked timers of d->ready that are due now (never early)
 * through the executor (fire_job()), each only if its check was sent at
 * most CHECK_MAX_AGE_MS before its callback starts (else it is checked
 * again); returns the earliest due time of those left, or INT64_MAX. mu
 * held (released around the submission, which runs the callbacks when
 * executor_threads is 0). */
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
    struct tw__durable_jobs jobs;
    tw__durable_jobs_init(&jobs);
    for (struct rtimer *r = go; r; r = r->next)
        tw__durable_jobs_add(&jobs, &r->job);
    pthread_mutex_unlock(&d->mu);
    tw__durable_exec_submit(&d->exec, &jobs);
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
            tw__rd_pend_add(d, f.pend[i].r, f.pend[i].res);
        pthread_mutex_unlock(&d->mu);
        fr_free(&f);
        return;
    }
    f.wall = rd_wall(d);
    bool one = !tw__rc_cluster(d->rc);
    pthread_mutex_lock(&d->mu);
    f.one = one && !d->no_mget;
    pthread_mutex_unlock(&d->mu);
    fr_heads(&f);
    fr_fill(&f);
    f.sent = real_mono_ms();
    tw__rd_run_cmds(d, f.cmds, f.script, f.ncmd);
    tw__rd_bg_errors(d, g, f.cmds, f.script, -1, f.ncmd);
    int64_t wall = rd_wall(d);
    uint64_t mono = rd_mono_ms(d);
    pthread_mutex_lock(&d->mu);
    fr_completions(&f, wall, mono);
    fr_checks(&f, wall, mono);
    pthread_cond_signal(&d->cv);
    pthread_mutex_unlock(&d->mu);
    tw__rc_free_replies(f.cmds, f.ncmd);
    fr_free(&f);
}

static void *rd_group(void *arg);

/* Start the threads of every group a shard is in (mu held). The shards
 * of a group whose threads cannot be started move to group 0 (tw__rd_start
 * fails the open if group 0's cannot). */
static void grp_start_locked(struct rd *d)
{
    for (uint32_t s = 0; s < d->shards; s++) {
        struct grp *g = &d->grp[d->grp_of[s]];
        if (g->started)
            continue;
        g->started = !pthread_create(&g->thr, NULL, rd_group, g);
        if (g->started &&
            pthread_create(&g->cthr, NULL, tw__rd_group_claim, g)) {
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
        tw__rd_grp_refresh(d);
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
 * one was already a check gap overdue. mu held. */
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
        if (sat_add(r->due_ms, d->check_gap_ms) < wall)
            *behind = true;
        r->next = *to;
        *to = r;
    }
    bool any = early != NULL;
    for (struct rtimer *r = early, *next; r; r = next) {
        next = r->next;
        tw__rd_rt_arm_locked(d, r, wall, now);
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
 * still ours. A batch of checks starts at most every d->check_gap_ms
 * (cfg.redis_check_gap_ms, else CHECK_GAP_MS) (at
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
            d->next_check = real + (behind ? 0 : d->check_gap_ms);
            dispatch_locked(d, list);
            continue;
        }
        rd_sleep(d, now, early, next_ready);
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

int tw__rd_touch(tw_durable *base, const void *key, size_t key_len)
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
    tw__rd_call_init(d, &c, S_TOUCH, r->shard);
    call_arg(&c, key, key_len);
    call_num(&c, tok);
    call_num(&c, rd_wall(d));
    call_num(&c, d->lease_ms);
    long long t = 0;
    int rc = tw__rd_call_int(d, &c, &t);
    if (!rc && t <= 0)
        rc = TW_ENOENT;
    if (!rc) { /* its DONE, after the callback, is fenced by the new token */
        pthread_mutex_lock(&d->mu);
        r->token = (uint64_t)t;
        pthread_mutex_unlock(&d->mu);
    }
    return rc;
}

/* Group the shards by master, start the groups' threads, the topology
 * thread and the firer. */
int tw__rd_start(struct rd *d)
{
    bool ok =
        !tw__durable_exec_init(&d->exec, d->nexec, fire_job, drop_job, d) &&
        !tw__durable_exec_start(&d->exec);
    if (ok)
        tw__rd_grp_refresh(d);
    pthread_mutex_lock(&d->mu);
    if (ok)
        grp_start_locked(d);
    for (uint32_t s = 0; s < d->shards; s++)
        ok = ok && d->grp[d->grp_of[s]].started;
    pthread_mutex_unlock(&d->mu);
    if (ok)
        d->claimer_on = !pthread_create(&d->claimer, NULL, rd_claimer, d);
    if (ok && d->claimer_on)
        d->thr_on = !pthread_create(&d->thr, NULL, rd_main, d);
    if (!ok || !d->claimer_on || !d->thr_on) {
        tw__rd_stop(d);
        return TW_ENOMEM;
    }
    return 0;
}

/* Stop the firer and the topology thread, then the executor (the
 * deliveries still queued are dropped, the callbacks running finish),
 * then the groups' threads (the last callbacks give them completions to
 * send). */
void tw__rd_stop(struct rd *d)
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
    tw__durable_exec_stop(&d->exec);
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
