/* SPDX-License-Identifier: MIT */
/*
 * src/redis_batch.c - the Redis client's per-node queues and flushers
 * (src/redis_client_impl.h says which file does what).
 *
 * Batching. Each node has one connection, a queue of requests and a busy
 * flag. A caller queues its requests on every node they route to, then for
 * each of those nodes either becomes the node's flusher (the node was idle:
 * it takes the whole queue, its own requests and everyone else's, writes
 * them in one go and reads every reply) or waits on the node's condition
 * variable until a flusher has answered its requests. So N threads calling
 * at once cost one round trip per node, not N. A caller that starts
 * flights on several idle nodes writes to all of them before it reads
 * any (struct flight).
 *
 * WAIT counts the replicas that have this connection's writes: a WAIT
 * that would be the first command of a new connection is failed
 * (TW_ECONN) instead of sent, so that a write is never acknowledged by a
 * WAIT that did not cover it.
 *
 * Locks: a node's mu guards its queue, busy and the requests' done flags;
 * its connection and output buffer belong to the flusher while busy.
 * SIGPIPE is blocked in the flusher's thread while it writes.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "common.h"
#include "redis_client_impl.h"

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

/* Append @len bytes to @n's output buffer at @*at. false: out of memory. */
static bool obuf_put(struct rc_node *n, size_t *at, const char *p, size_t len)
{
    if (*at + len > n->ocap) {
        size_t cap = n->ocap ? n->ocap : 4096;
        while (cap < *at + len)
            cap *= 2;
        char *b = tw__realloc(n->obuf, cap);
        if (!b)
            return false;
        n->obuf = b;
        n->ocap = cap;
    }
    memcpy(n->obuf + *at, p, len);
    *at += len;
    return true;
}

/* The batch's commands, formatted into the node's output buffer; its
 * length into *@at. false: out of memory. */
static bool flight_format(struct flight *f, size_t *at)
{
    static const char asking[] = "*1\r\n$6\r\nASKING\r\n";
    struct rc_node *n = f->n;
    bool ok = true;
    for (struct rc_req *r = f->b; r && ok; r = r->next) {
        /* WAIT as the first command of a new connection would count none
         * of the writes sent on the one that broke (and answer at once):
         * it is failed instead (see the top of the file). */
        bool wait = r->cmd->argc >= 1 && r->cmd->argvlen[0] == 4 &&
                    !strncasecmp(r->cmd->argv[0], "WAIT", 4);
        r->unsent = wait && n->conn_cmds == 0;
        if (r->unsent)
            continue;
        n->conn_cmds += !wait;
        if (r->asking)
            ok = obuf_put(n, at, asking, sizeof asking - 1);
        char *cmd;
        int len = redisFormatCommandArgv(&cmd, r->cmd->argc, r->cmd->argv,
                                         r->cmd->argvlen);
        ok = ok && len >= 0 && obuf_put(n, at, cmd, (size_t)len);
        if (len >= 0)
            redisFreeCommand(cmd);
    }
    return ok;
}

/* Connect if needed and write the batch in one go; SIGPIPE blocked by the
 * caller (OpenSSL writes with write()). */
static void flight_write(tw__rc *c, struct flight *f)
{
    struct rc_node *n = f->n;
    bool was = n->conn != NULL;
    f->up = tw__rc_node_up(c, n);
    f->reconnected = f->up && !was && n->failed;
    if (!f->up)
        return;
    n->failed = false;
    size_t at = 0;
    bool ok = flight_format(f, &at);
    char why[200];
    if (!ok)
        snprintf(why, sizeof why, "out of memory");
    if (!ok || tw__rc_conn_write(n->conn, n->obuf, at, why, sizeof why)) {
        f->up = false;
        tw__rc_node_fail(c, n, why);
    }
}

/* Read the batch's replies; a request left without one gets the node's
 * failure code (TW_ECONN: it may or may not have run). */
static void flight_read(tw__rc *c, struct flight *f)
{
    struct rc_req *r = f->b;
    char why[200];
    for (; r && f->up; r = r->next) {
        redisReply *rep;
        if (r->unsent) {
            r->cmd->reply = NULL;
            r->cmd->err = TW_ECONN;
            continue;
        }
        if (r->asking) {
            if (tw__rc_conn_get(f->n->conn, &rep, why, sizeof why))
                break;
            freeReplyObject(rep);
        }
        if (tw__rc_conn_get(f->n->conn, &rep, why, sizeof why))
            break;
        r->cmd->reply = rep;
        r->cmd->err = 0;
    }
    if (r && f->up)
        tw__rc_node_fail(c, f->n, why);
    for (; r; r = r->next) {
        r->cmd->reply = NULL;
        r->cmd->err = f->n->err ? f->n->err : TW_ECONN;
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
        flight_write(c, &f[i]);
    for (size_t i = 0; i < n; i++)
        flight_read(c, &f[i]);
    pipe_unblock(&g);
    for (size_t i = 0; i < n; i++)
        flight_end(c, &f[i]);
}

/* Until @done(@arg) says every request of ours queued on @n is answered:
 * flush the node's queue when it is idle, otherwise wait for the flusher. */
void tw__rc_node_serve(tw__rc *c, struct rc_node *n, bool (*done)(void *),
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
 * ours); tw__rc_node_serve() finishes the rest. */
void tw__rc_nodes_start(tw__rc *c, struct rc_node **used, size_t nused,
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
void tw__rc_run_one(tw__rc *c, struct rc_node *n, tw__rc_cmd *cmd)
{
    struct rc_req r = {cmd, false, false, NULL, false};
    pthread_mutex_lock(&n->mu);
    *n->tail = &r;
    n->tail = &r.next;
    pthread_mutex_unlock(&n->mu);
    tw__rc_node_serve(c, n, one_done, &r);
}
