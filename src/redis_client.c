/* SPDX-License-Identifier: MIT */
/*
 * src/redis_client.c - see redis_client.h: the command layer of the Redis
 * client (src/redis_client_impl.h says which file does what): open and
 * close, running commands (routing, redirects, retries).
 *
 * Open: the address parsed (src/redis_addr.c), the config's secrets
 * taken, the TLS context made (src/redis_tls.c), then the slot map loaded
 * from the first seed that answers (src/redis_topology.c), which also
 * proves that the credentials and the database work.
 *
 * Running commands (tw__rc_exec): each command goes to the node of its
 * slot, queued there with every other thread's (src/redis_batch.c); its
 * reply is then looked at, and in rounds (at most RC_MAX_ROUNDS) a MOVED
 * is retried on the named node (and the map refreshed), an ASK there once
 * after ASKING, and TRYAGAIN, CLUSTERDOWN, LOADING, MASTERDOWN, a READONLY
 * under Sentinel (the master was demoted: the node is marked stale, so
 * the sentinels are asked again) and a broken connection in a cluster or
 * under Sentinel (a replica may have been promoted) are retried after a
 * short pause, 10 ms more each round. Refused credentials stay refused.
 *
 * Failures are codes with a message (src/redis_error.c); secrets
 * (passwords) live only in the client and are wiped at close.
 */
#define _GNU_SOURCE

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "redis_client_impl.h"

void tw__rc_stats_get(tw__rc *c, tw__rc_stats *out)
{
    pthread_mutex_lock(&c->map_mu);
    *out = c->st;
    pthread_mutex_unlock(&c->map_mu);
}

void tw__rc_free_replies(tw__rc_cmd *cmds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (cmds[i].reply)
            freeReplyObject(cmds[i].reply);
}

/* ------------------------------------------------------------------------ */
/* Open and close. */

/* The address, the secrets and TLS of @o into @c. */
static int open_config(tw__rc *c, const tw__rc_opts *o)
{
    int rc = 0;
    if (!o->addr || !*o->addr)
        rc = tw__rc_bad(c, "redis: an empty address");
    if (!rc)
        rc = tw__rc_parse_addr(c, o->addr);
    if (!rc && c->nnodes == 0)
        rc = tw__rc_bad(c, "redis: no node in the address");
    if (!rc)
        rc = tw__rc_take(&c->user, o->user);
    if (!rc)
        rc = tw__rc_take(&c->password, o->password);
    if (!rc)
        rc = tw__rc_take(&c->s_user, o->sentinel_user);
    if (!rc)
        rc = tw__rc_take(&c->s_password, o->sentinel_password);
    if (!rc && c->user && !c->password)
        rc = tw__rc_bad(c, "redis: a user name without a password");
    if (!rc)
        rc = tw__rc_tls_setup(c, o);
    if (!rc)
        rc = tw__rc_take(&c->server_name, o->tls_server_name);
    return rc;
}

int tw__rc_open(tw__rc **out, const tw__rc_opts *o)
{
    if (!out || !o)
        return TW_EINVAL;
    tw__rc *c = tw__calloc(1, sizeof *c);
    if (!c)
        return TW_ENOMEM;
    pthread_mutex_init(&c->map_mu, NULL);
    int rc = open_config(c, o);
    if (!rc)
        rc = tw__rc_refresh(c);
    if (!rc && c->cluster && c->db)
        rc = tw__rc_bad(c, "redis: a Redis Cluster has database 0 only: drop "
                           "the database from the address");
    if (rc) {
        if (rc == TW_ENOMEM && !c->err[0])
            snprintf(c->err, sizeof c->err, "redis: out of memory");
        if (o->errbuf && o->errbuf_len)
            snprintf(o->errbuf, o->errbuf_len, "%s", c->err);
        tw__rc_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

static void wipe(char *s)
{
    if (s) {
        explicit_bzero(s, strlen(s));
        tw__free(s);
    }
}

void tw__rc_close(tw__rc *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->nnodes; i++) {
        struct rc_node *n = c->nodes[i];
        tw__rc_conn_close(n->conn);
        tw__free(n->obuf);
        pthread_mutex_destroy(&n->mu);
        pthread_cond_destroy(&n->cv);
        tw__free(n);
    }
    tw__rc_tls_free(c);
    wipe(c->user);
    wipe(c->password);
    wipe(c->s_user);
    wipe(c->s_password);
    wipe(c->server_name);
    pthread_mutex_destroy(&c->map_mu);
    tw__free(c);
}

/* ------------------------------------------------------------------------ */
/* Running commands. */

static bool starts(const redisReply *r, const char *p)
{
    return r && r->type == REDIS_REPLY_ERROR && r->str &&
           !strncmp(r->str, p, strlen(p));
}

/* One tw__rc_exec call: per command its request, its node, whether it is
 * still to do. */
struct exec {
    tw__rc *c;
    tw__rc_cmd *cmds;
    size_t n;
    struct rc_req *reqs;
    struct rc_node **target, **used;
    bool *todo;
    struct flight *fl;
};

struct exec_wait {
    struct exec *x;
    struct rc_node *node;
};

static bool exec_done(void *arg)
{
    struct exec_wait *w = arg;
    struct exec *x = w->x;
    for (size_t i = 0; i < x->n; i++)
        if (x->todo[i] && x->target[i] == w->node && !x->reqs[i].done)
            return false;
    return true;
}

static void exec_free(struct exec *x)
{
    tw__free(x->reqs);
    tw__free(x->target);
    tw__free(x->todo);
    tw__free(x->used);
    tw__free(x->fl);
}

static int exec_alloc(struct exec *x)
{
    size_t n = x->n;
    x->reqs = tw__malloc(n * sizeof *x->reqs);
    x->target = tw__calloc(n, sizeof *x->target);
    x->todo = tw__malloc(n * sizeof *x->todo);
    x->used = tw__malloc(n * sizeof *x->used);
    x->fl = tw__malloc(n * sizeof *x->fl);
    if (!x->reqs || !x->target || !x->todo || !x->used || !x->fl) {
        exec_free(x);
        return TW_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        x->todo[i] = true;
        x->cmds[i].reply = NULL;
        x->cmds[i].err = 0;
        x->reqs[i].asking = false;
    }
    return 0;
}

/* Route every command still to do (by the slot map unless a redirect
 * named its node) and queue it on its node. Returns the nodes used. */
static size_t exec_queue(struct exec *x)
{
    tw__rc *c = x->c;
    size_t nused = 0;
    pthread_mutex_lock(&c->map_mu);
    for (size_t i = 0; i < x->n; i++)
        if (x->todo[i] && !x->target[i])
            x->target[i] =
                c->nodes[c->slot_node[x->cmds[i].slot < 0 ? 0
                                                          : x->cmds[i].slot]];
    pthread_mutex_unlock(&c->map_mu);
    for (size_t i = 0; i < x->n; i++) {
        if (!x->todo[i])
            continue;
        struct rc_node *nd = x->target[i];
        x->reqs[i] =
            (struct rc_req){&x->cmds[i], x->reqs[i].asking, false, NULL, false};
        pthread_mutex_lock(&nd->mu);
        *nd->tail = &x->reqs[i];
        nd->tail = &x->reqs[i].next;
        pthread_mutex_unlock(&nd->mu);
        size_t u;
        for (u = 0; u < nused && x->used[u] != nd; u++)
            ;
        if (u == nused)
            x->used[nused++] = nd;
    }
    return nused;
}

/* Run every queued command: write to each idle node, read, then wait for
 * (or flush) whatever other threads' flushers hold. */
static void exec_serve(struct exec *x, size_t nused)
{
    tw__rc_nodes_start(x->c, x->used, nused, x->fl);
    for (size_t u = 0; u < nused; u++) {
        struct exec_wait w = {x, x->used[u]};
        tw__rc_node_serve(x->c, x->used[u], exec_done, &w);
    }
}

struct exec_next {
    bool again, refresh, pause;
};

/* A MOVED or ASK reply: retry on the named node. */
static bool exec_redirect(struct exec *x, size_t i, struct exec_next *nx)
{
    redisReply *r = x->cmds[i].reply;
    bool moved = starts(r, "MOVED "), ask = starts(r, "ASK ");
    struct rc_node *t =
        moved || ask ? tw__rc_redirect_target(x->c, r->str) : NULL;
    if (!t)
        return false;
    freeReplyObject(r);
    x->cmds[i].reply = NULL;
    x->target[i] = t;
    x->reqs[i].asking = ask;
    nx->again = true;
    nx->refresh |= moved;
    pthread_mutex_lock(&x->c->map_mu);
    if (moved)
        x->c->st.moved++;
    else
        x->c->st.ask++;
    pthread_mutex_unlock(&x->c->map_mu);
    return true;
}

/* Look at command @i's reply: redirects and retryable states are to do
 * again (round @round); anything else is its answer. */
static void exec_check(struct exec *x, size_t i, int round,
                       struct exec_next *nx)
{
    redisReply *r = x->cmds[i].reply;
    bool last = round + 1 >= RC_MAX_ROUNDS;
    x->reqs[i].asking = false;
    if (x->cmds[i].err) {
        /* Connection down: in a cluster the slot may have moved to a
         * promoted replica, under Sentinel the master may have; look
         * again before giving up. Refused credentials stay refused. */
        nx->refresh = x->c->cluster;
        x->todo[i] = !last && x->cmds[i].err == TW_ECONN &&
                     (x->c->nnodes > 1 || x->c->sentinel);
        if (x->todo[i]) {
            x->target[i] = NULL;
            nx->pause = nx->again = true;
        }
        return;
    }
    if (exec_redirect(x, i, nx))
        return;
    if (!last && x->c->sentinel && starts(r, "READONLY")) {
        /* The master was demoted: ask the sentinels again. */
        struct rc_node *nd = x->target[i];
        pthread_mutex_lock(&nd->mu);
        nd->stale = true;
        pthread_mutex_unlock(&nd->mu);
        freeReplyObject(r);
        x->cmds[i].reply = NULL;
        x->target[i] = NULL;
        nx->again = nx->pause = true;
        return;
    }
    if (!last && (starts(r, "TRYAGAIN") || starts(r, "CLUSTERDOWN") ||
                  starts(r, "LOADING") || starts(r, "MASTERDOWN"))) {
        freeReplyObject(r);
        x->cmds[i].reply = NULL;
        x->target[i] = NULL;
        nx->again = nx->pause = true;
        return;
    }
    x->todo[i] = false;
}

/* A pause before a retry round, so a failover or a load can end. */
static void rc_sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int tw__rc_exec(tw__rc *c, tw__rc_cmd *cmds, size_t n)
{
    if (n == 0)
        return 0;
    struct exec x = {.c = c, .cmds = cmds, .n = n};
    if (exec_alloc(&x))
        return TW_ENOMEM;
    for (int round = 0; round < RC_MAX_ROUNDS; round++) {
        size_t nused = exec_queue(&x);
        if (nused == 0)
            break;
        exec_serve(&x, nused);
        struct exec_next nx = {false, false, false};
        for (size_t i = 0; i < n; i++)
            if (x.todo[i])
                exec_check(&x, i, round, &nx);
        if (nx.refresh)
            tw__rc_refresh_if_stale(c);
        if (!nx.again)
            break;
        if (nx.pause)
            rc_sleep_ms(10u * (unsigned)(round + 1));
    }
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        if (x.todo[i] && !cmds[i].err && !cmds[i].reply)
            cmds[i].err = TW_ECONN;
        if (!rc && cmds[i].err)
            rc = cmds[i].err;
    }
    exec_free(&x);
    return rc;
}
