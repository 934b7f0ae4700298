/* SPDX-License-Identifier: MIT */
/*
 * src/redis_client.c - see redis_client.h.
 *
 * Each node has one hiredis connection, a queue of requests and a busy
 * flag. A caller queues its requests on every node they route to, then for
 * each of those nodes either becomes the node's flusher (the node was idle:
 * it takes the whole queue, its own requests and everyone else's, writes
 * them in one go and reads every reply) or waits on the node's condition
 * variable until a flusher has answered its requests. So N threads calling
 * at once cost one round trip per node, not N.
 *
 * The slot map (16384 entries, each a node index) is read under map_mu and
 * replaced whole by a refresh (CLUSTER SLOTS). A server without cluster
 * support answers CLUSTER SLOTS with an error: then every slot is the seed.
 * Nodes are never freed before close, so a pointer to one stays valid.
 */
#define _GNU_SOURCE

#include "redis_client.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "internal.h"

#define RC_SLOTS 16384
#define RC_MAX_NODES 64
#define RC_MAX_ROUNDS 16
#define RC_CONNECT_MS 500
#define RC_IO_MS 3000
#define RC_BACKOFF_MIN_MS 20
#define RC_BACKOFF_MAX_MS 1000

struct rc_req {
    tw__rc_cmd *cmd;
    bool asking;
    bool done;
    struct rc_req *next;
};

struct rc_node {
    char host[128];
    int port;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    redisContext *ctx; /* used only by the flusher (busy) */
    struct rc_req *head, **tail;
    bool busy;
    uint64_t retry_at_ns;
    uint32_t backoff_ms;
    bool failed; /* the connection broke or could not be made */
};

struct tw__rc {
    pthread_mutex_t map_mu;
    struct rc_node *nodes[RC_MAX_NODES];
    int nnodes;
    int16_t slot_node[RC_SLOTS];
    uint64_t last_refresh_ns;
    tw__rc_stats st; /* under map_mu */
};

static uint64_t mono_ns(void)
{
    return tw__clock_ns(CLOCK_MONOTONIC);
}

static void sleep_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* CRC16-CCITT (XMODEM), polynomial 0x1021, as Redis Cluster uses. */
static uint16_t crc16(const unsigned char *p, size_t n)
{
    uint16_t crc = 0;
    for (size_t i = 0; i < n; i++) {
        crc ^= (uint16_t)(p[i] << 8);
        for (int b = 0; b < 8; b++)
            crc = (crc & 0x8000) ? (uint16_t)((crc << 1) ^ 0x1021)
                                 : (uint16_t)(crc << 1);
    }
    return crc;
}

int tw__rc_slot(const void *key, size_t len)
{
    const unsigned char *k = key;
    size_t s, e;
    for (s = 0; s < len && k[s] != '{'; s++)
        ;
    if (s < len) {
        for (e = s + 1; e < len && k[e] != '}'; e++)
            ;
        /* A tag is the text between the first '{' and the next '}', if
         * that text is not empty. */
        if (e < len && e > s + 1)
            return crc16(k + s + 1, e - s - 1) & (RC_SLOTS - 1);
    }
    return crc16(k, len) & (RC_SLOTS - 1);
}

/* Find or add a node; map_mu held. NULL when the table is full or out of
 * memory. */
static struct rc_node *node_get_locked(tw__rc *c, const char *host, int port)
{
    for (int i = 0; i < c->nnodes; i++)
        if (c->nodes[i]->port == port && !strcmp(c->nodes[i]->host, host))
            return c->nodes[i];
    if (c->nnodes == RC_MAX_NODES || strlen(host) >= sizeof c->nodes[0]->host)
        return NULL;
    struct rc_node *n = tw__calloc(1, sizeof *n);
    if (!n)
        return NULL;
    strcpy(n->host, host);
    n->port = port;
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->cv, NULL);
    n->tail = &n->head;
    c->nodes[c->nnodes++] = n;
    return n;
}

static int node_index(tw__rc *c, const struct rc_node *n)
{
    for (int i = 0; i < c->nnodes; i++)
        if (c->nodes[i] == n)
            return i;
    return -1;
}

static bool conn_up(struct rc_node *n)
{
    if (n->ctx && !n->ctx->err)
        return true;
    if (n->ctx) {
        redisFree(n->ctx);
        n->ctx = NULL;
    }
    if (mono_ns() < n->retry_at_ns)
        return false;
    struct timeval tv = {0, RC_CONNECT_MS * 1000};
    redisContext *ctx = redisConnectWithTimeout(n->host, n->port, tv);
    if (ctx && !ctx->err) {
        struct timeval io = {RC_IO_MS / 1000, (RC_IO_MS % 1000) * 1000};
        redisSetTimeout(ctx, io);
        n->ctx = ctx;
        n->backoff_ms = 0;
        return true;
    }
    if (ctx)
        redisFree(ctx);
    n->failed = true;
    n->backoff_ms = n->backoff_ms ? n->backoff_ms * 2 : RC_BACKOFF_MIN_MS;
    if (n->backoff_ms > RC_BACKOFF_MAX_MS)
        n->backoff_ms = RC_BACKOFF_MAX_MS;
    n->retry_at_ns = mono_ns() + (uint64_t)n->backoff_ms * 1000000u;
    return false;
}

static void conn_fail(struct rc_node *n)
{
    n->failed = true;
    redisFree(n->ctx);
    n->ctx = NULL;
    n->backoff_ms = RC_BACKOFF_MIN_MS;
    n->retry_at_ns = mono_ns() + (uint64_t)n->backoff_ms * 1000000u;
}

/* hiredis writes with write(): a server that went away would raise
 * SIGPIPE, whose default kills the process. Block it in this thread while
 * we write, and swallow one raised meanwhile (unless one was already
 * pending for another reason). */
struct pipe_guard {
    sigset_t old;
    bool was_pending;
};

static void pipe_block(struct pipe_guard *g)
{
    sigset_t set, pend;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigpending(&pend);
    g->was_pending = sigismember(&pend, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &set, &g->old);
}

static void pipe_unblock(struct pipe_guard *g)
{
    sigset_t set, pend;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigpending(&pend);
    if (!g->was_pending && sigismember(&pend, SIGPIPE) == 1) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, &g->old, NULL);
}

/* A batch in flight on one node: taken from the node's queue by its
 * flusher, written, then read. Several can be in flight at once (one
 * caller writes to every node before reading any), so a call touching
 * many nodes costs one round trip, not one per node. */
struct flight {
    struct rc_node *n;
    struct rc_req *b;
    size_t cnt;
    bool up;
    int reconnected;
};

/* Take @n's queue when the node is idle; n->mu held. */
static bool flight_take(struct rc_node *n, struct flight *f)
{
    if (n->busy || !n->head)
        return false;
    *f = (struct flight){n, n->head, 0, false, 0};
    n->head = NULL;
    n->tail = &n->head;
    n->busy = true;
    for (struct rc_req *r = f->b; r; r = r->next)
        f->cnt++;
    return true;
}

/* Connect if needed and write the batch; SIGPIPE blocked by the caller. */
static void flight_write(struct flight *f)
{
    struct rc_node *n = f->n;
    bool was = n->ctx != NULL;
    f->up = conn_up(n);
    f->reconnected = f->up && !was && n->failed;
    if (!f->up)
        return;
    n->failed = false;
    for (struct rc_req *r = f->b; r; r = r->next) {
        if (r->asking)
            redisAppendCommand(n->ctx, "ASKING");
        redisAppendCommandArgv(n->ctx, r->cmd->argc, r->cmd->argv,
                               r->cmd->argvlen);
    }
    int wdone = 0;
    while (!wdone)
        if (redisBufferWrite(n->ctx, &wdone) != REDIS_OK) {
            f->up = false;
            conn_fail(n);
            return;
        }
}

static bool get_reply(struct rc_node *n, void **rep)
{
    *rep = NULL;
    return redisGetReply(n->ctx, rep) == REDIS_OK;
}

/* Read the batch's replies; a request left without one gets TW_ECONN. */
static void flight_read(struct flight *f)
{
    struct rc_req *r = f->b;
    for (; r && f->up; r = r->next) {
        void *rep;
        if (r->asking) {
            if (!get_reply(f->n, &rep))
                break;
            freeReplyObject(rep);
        }
        if (!get_reply(f->n, &rep))
            break;
        r->cmd->reply = rep;
        r->cmd->err = 0;
    }
    if (r && f->up)
        conn_fail(f->n);
    for (; r; r = r->next) {
        r->cmd->reply = NULL;
        r->cmd->err = TW_ECONN;
    }
}

/* Count the batch, mark its requests answered and free the node. */
static void flight_end(tw__rc *c, struct flight *f)
{
    pthread_mutex_lock(&c->map_mu);
    c->st.batches++;
    c->st.commands += f->cnt;
    c->st.reconnects += (uint64_t)f->reconnected;
    pthread_mutex_unlock(&c->map_mu);
    pthread_mutex_lock(&f->n->mu);
    for (struct rc_req *r = f->b; r;) {
        struct rc_req *next = r->next;
        r->done = true; /* after this, r may be gone */
        r = next;
    }
    f->n->busy = false;
    pthread_cond_broadcast(&f->n->cv);
    pthread_mutex_unlock(&f->n->mu);
}

/* Write every flight, then read every flight. */
static void flights_run(tw__rc *c, struct flight *f, size_t n)
{
    struct pipe_guard g;
    pipe_block(&g);
    for (size_t i = 0; i < n; i++)
        flight_write(&f[i]);
    for (size_t i = 0; i < n; i++)
        flight_read(&f[i]);
    pipe_unblock(&g);
    for (size_t i = 0; i < n; i++)
        flight_end(c, &f[i]);
}

/* Until @done(@arg) says every request of ours queued on @n is answered:
 * flush the node's queue when it is idle, otherwise wait for the flusher. */
static void node_serve(tw__rc *c, struct rc_node *n, bool (*done)(void *),
                       void *arg)
{
    pthread_mutex_lock(&n->mu);
    while (!done(arg)) {
        struct flight f;
        if (!flight_take(n, &f)) {
            pthread_cond_wait(&n->cv, &n->mu);
            continue;
        }
        pthread_mutex_unlock(&n->mu);
        flights_run(c, &f, 1);
        pthread_mutex_lock(&n->mu);
    }
    pthread_mutex_unlock(&n->mu);
}

/* Start a flight on each idle node of @used (its queue holds requests of
 * ours); node_serve finishes the rest. */
static void nodes_start(tw__rc *c, struct rc_node **used, size_t nused,
                        struct flight *f)
{
    size_t nf = 0;
    for (size_t u = 0; u < nused; u++) {
        pthread_mutex_lock(&used[u]->mu);
        nf += flight_take(used[u], &f[nf]);
        pthread_mutex_unlock(&used[u]->mu);
    }
    if (nf)
        flights_run(c, f, nf);
}

static bool one_done(void *arg)
{
    return ((struct rc_req *)arg)->done;
}

/* Send one command to one node (refresh, probes). */
static void run_one(tw__rc *c, struct rc_node *n, tw__rc_cmd *cmd)
{
    struct rc_req r = {cmd, false, false, NULL};
    pthread_mutex_lock(&n->mu);
    *n->tail = &r;
    n->tail = &r.next;
    pthread_mutex_unlock(&n->mu);
    node_serve(c, n, one_done, &r);
}

/* Load the slot map from any reachable node. 0 or TW_ECONN. */
static int refresh(tw__rc *c)
{
    static const char *argv[] = {"CLUSTER", "SLOTS"};
    static const size_t lens[] = {7, 5};
    pthread_mutex_lock(&c->map_mu);
    int nn = c->nnodes;
    struct rc_node *list[RC_MAX_NODES];
    memcpy(list, c->nodes, sizeof(list[0]) * (size_t)nn);
    pthread_mutex_unlock(&c->map_mu);
    for (int i = 0; i < nn; i++) {
        tw__rc_cmd cmd = {2, argv, lens, -1, NULL, 0};
        run_one(c, list[i], &cmd);
        redisReply *rep = cmd.reply;
        if (cmd.err || !rep)
            continue;
        pthread_mutex_lock(&c->map_mu);
        if (rep->type == REDIS_REPLY_ERROR) {
            /* Not a cluster: this node serves every slot. */
            int16_t idx = (int16_t)node_index(c, list[i]);
            for (int s = 0; s < RC_SLOTS; s++)
                c->slot_node[s] = idx;
        } else if (rep->type == REDIS_REPLY_ARRAY) {
            for (size_t e = 0; e < rep->elements; e++) {
                redisReply *r = rep->element[e];
                if (r->type != REDIS_REPLY_ARRAY || r->elements < 3 ||
                    r->element[2]->type != REDIS_REPLY_ARRAY ||
                    r->element[2]->elements < 2)
                    continue;
                redisReply *m = r->element[2];
                const char *host = m->element[0]->str && m->element[0]->str[0]
                                       ? m->element[0]->str
                                       : list[i]->host;
                struct rc_node *node =
                    node_get_locked(c, host, (int)m->element[1]->integer);
                if (!node)
                    continue;
                int16_t idx = (int16_t)node_index(c, node);
                for (long long s = r->element[0]->integer;
                     s <= r->element[1]->integer && s < RC_SLOTS; s++)
                    if (s >= 0)
                        c->slot_node[s] = idx;
            }
        }
        c->st.refreshes++;
        c->last_refresh_ns = mono_ns();
        pthread_mutex_unlock(&c->map_mu);
        freeReplyObject(rep);
        return 0;
    }
    return TW_ECONN;
}

int tw__rc_open(tw__rc **out, const char *seeds)
{
    if (!out || !seeds || !*seeds)
        return TW_EINVAL;
    tw__rc *c = tw__calloc(1, sizeof *c);
    if (!c)
        return TW_ENOMEM;
    pthread_mutex_init(&c->map_mu, NULL);
    for (int s = 0; s < RC_SLOTS; s++)
        c->slot_node[s] = 0;
    int rc = 0;
    const char *p = seeds;
    while (*p && !rc) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char buf[160];
        const char *colon = memrchr(p, ':', len);
        if (!colon || len >= sizeof buf || colon == p) {
            rc = TW_EINVAL;
            break;
        }
        memcpy(buf, p, len);
        buf[len] = 0;
        buf[colon - p] = 0;
        char *ep;
        long port = strtol(buf + (colon - p) + 1, &ep, 10);
        if (*ep || port <= 0 || port > 65535) {
            rc = TW_EINVAL;
            break;
        }
        if (!node_get_locked(c, buf, (int)port))
            rc = TW_ENOMEM;
        p = end ? end + 1 : p + len;
    }
    if (!rc && c->nnodes == 0)
        rc = TW_EINVAL;
    if (!rc)
        rc = refresh(c);
    if (rc) {
        tw__rc_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void tw__rc_close(tw__rc *c)
{
    if (!c)
        return;
    for (int i = 0; i < c->nnodes; i++) {
        struct rc_node *n = c->nodes[i];
        if (n->ctx)
            redisFree(n->ctx);
        pthread_mutex_destroy(&n->mu);
        pthread_cond_destroy(&n->cv);
        tw__free(n);
    }
    pthread_mutex_destroy(&c->map_mu);
    tw__free(c);
}

void tw__rc_stats_get(tw__rc *c, tw__rc_stats *out)
{
    pthread_mutex_lock(&c->map_mu);
    *out = c->st;
    pthread_mutex_unlock(&c->map_mu);
}

/* "MOVED 3999 127.0.0.1:6381" / "ASK ...": the target node, or NULL. */
static struct rc_node *redirect_target(tw__rc *c, const char *msg)
{
    const char *sp = strchr(msg, ' ');
    sp = sp ? strchr(sp + 1, ' ') : NULL;
    if (!sp)
        return NULL;
    const char *addr = sp + 1;
    const char *colon = strrchr(addr, ':');
    if (!colon || (size_t)(colon - addr) >= 128)
        return NULL;
    char host[128];
    memcpy(host, addr, (size_t)(colon - addr));
    host[colon - addr] = 0;
    pthread_mutex_lock(&c->map_mu);
    struct rc_node *n = node_get_locked(c, host, atoi(colon + 1));
    pthread_mutex_unlock(&c->map_mu);
    return n;
}

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
            (struct rc_req){&x->cmds[i], x->reqs[i].asking, false, NULL};
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
    nodes_start(x->c, x->used, nused, x->fl);
    for (size_t u = 0; u < nused; u++) {
        struct exec_wait w = {x, x->used[u]};
        node_serve(x->c, x->used[u], exec_done, &w);
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
    struct rc_node *t = moved || ask ? redirect_target(x->c, r->str) : NULL;
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
         * promoted replica; look again before giving up. */
        nx->refresh = true;
        x->todo[i] = !last && x->c->nnodes > 1;
        if (x->todo[i]) {
            x->target[i] = NULL;
            nx->pause = nx->again = true;
        }
        return;
    }
    if (exec_redirect(x, i, nx))
        return;
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

/* A refresh per MOVED storm, not per command. */
static void refresh_if_stale(tw__rc *c)
{
    uint64_t now = mono_ns();
    pthread_mutex_lock(&c->map_mu);
    bool stale = now - c->last_refresh_ns > 20000000u;
    pthread_mutex_unlock(&c->map_mu);
    if (stale)
        refresh(c);
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
            refresh_if_stale(c);
        if (!nx.again)
            break;
        if (nx.pause)
            sleep_ms(10u * (unsigned)(round + 1));
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
