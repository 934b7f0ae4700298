/* SPDX-License-Identifier: MIT */
/*
 * src/redis_connect.c - a node's connection in the Redis client
 * (src/redis_client_impl.h says which file does what): set it up, ask the
 * sentinels where the master is, drop it when it breaks and wait before
 * the next try.
 *
 * Set-up, on every connection (the first, those opened after a MOVED or
 * ASK to a new node, reconnects, a new master after a failover): the
 * socket (src/redis_net.c), the TLS handshake (src/redis_tls.c), then
 * AUTH [user] password, SELECT db, and under Sentinel a ROLE check; a TLS
 * connection without any of those sends PING, so that a server that
 * refuses our certificate says so now, not at the first command.
 *
 * Sentinel. The one data node is whichever master the sentinels name:
 * every (re)connection asks them (SENTINEL get-master-addr-by-name, first
 * answer wins), connects and checks ROLE; a connection in use is checked
 * again once a second (RC_SENTINEL_CHECK_MS). A READONLY reply (the
 * master was demoted) marks the node stale (src/redis_client.c), so the
 * next use asks again.
 *
 * Back-off. A node whose connection broke or could not be made is tried
 * again after 20 ms, doubling up to 1 s; until then its commands fail at
 * once with its last failure's code.
 *
 * Context: tw__rc_node_up() and tw__rc_node_fail() are called by the
 * node's flusher only (src/redis_batch.c), which owns n->conn.
 */
#define _GNU_SOURCE

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common.h"
#include "redis_client_impl.h"

/* snprintf for messages that may be cut short (on purpose). */
__attribute__((format(printf, 3, 4))) static void say(char *buf, size_t len,
                                                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

/* Under Sentinel: whether ROLE's reply @rep says master. */
static bool role_is_master(const redisReply *rep)
{
    return rep->type == REDIS_REPLY_ARRAY && rep->elements &&
           rep->element[0]->type == REDIS_REPLY_STRING &&
           !strcmp(rep->element[0]->str, "master");
}

/* A set-up command that must not fail: its error reply is the code
 * (tw__rc_reply_code(..., @other)) and Redis's text in @why. */
static int setup_call(struct rc_conn *k, int argc, const char **argv, int other,
                      const char *hint, char *why, size_t wlen)
{
    redisReply *rep = NULL;
    int rc = tw__rc_conn_call(k, argc, argv, &rep, why, wlen);
    if (!rc && rep->type == REDIS_REPLY_ERROR) {
        rc = tw__rc_reply_code(rep->str, other);
        snprintf(why, wlen, "%s: %.200s%s", argv[0], rep->str,
                 hint && strstr(rep->str, "cluster") ? hint : "");
    } else if (!rc && argc == 1 && !strcmp(argv[0], "ROLE") &&
               !role_is_master(rep)) {
        /* Under Sentinel: only the master takes writes. */
        rc = TW_ECONN;
        snprintf(why, wlen,
                 "named master by the sentinels but not a master (a "
                 "failover may be under way)");
    }
    if (rep)
        freeReplyObject(rep);
    return rc;
}

/* AUTH, SELECT, ROLE, or PING on a new connection @k (see the top of the
 * file). */
static int conn_setup(tw__rc *c, struct rc_conn *k, bool tls, bool sentinel,
                      char *why, size_t wlen)
{
    int rc = 0;
    bool said = false;
    const char *user = sentinel ? c->s_user : c->user;
    const char *pass = sentinel ? c->s_password : c->password;
    if (pass) {
        const char *argv[3] = {"AUTH", user ? user : pass, pass};
        rc = setup_call(k, user ? 3 : 2, argv, TW_EAUTH, NULL, why, wlen);
        said = true;
    }
    if (!rc && c->db && !sentinel) {
        char db[16];
        snprintf(db, sizeof db, "%d", c->db);
        const char *argv[2] = {"SELECT", db};
        rc = setup_call(k, 2, argv, TW_EINVAL,
                        " (a Redis Cluster has database 0 only: drop the "
                        "database from the address)",
                        why, wlen);
        said = true;
    }
    if (!rc && c->sentinel && !sentinel) {
        const char *argv[1] = {"ROLE"};
        rc = setup_call(k, 1, argv, TW_EIO, NULL, why, wlen);
        said = true;
    }
    if (!rc && tls && !said) {
        /* A server that refuses our certificate (TLS 1.3 says so after
         * the handshake) must fail here, not at the first command. */
        const char *argv[1] = {"PING"};
        rc = setup_call(k, 1, argv, TW_EIO, NULL, why, wlen);
    }
    return rc;
}

/* Open and set up a connection to a data node (or, @sentinel, to a
 * sentinel): TLS, AUTH, SELECT, ROLE. 0 with *@out, or a code and @why. */
static int conn_open(tw__rc *c, const char *host, int port, bool sentinel,
                     struct rc_conn **out, char *why, size_t wlen)
{
    struct rc_conn *k = tw__calloc(1, sizeof *k);
    if (!k || !(k->rd = redisReaderCreate())) {
        tw__free(k);
        snprintf(why, wlen, "out of memory");
        return TW_ENOMEM;
    }
    k->fd = -1;
    int rc = tw__rc_sock_open(host, port, &k->fd, why, wlen);
    if (!rc) {
        struct timeval tv = {RC_IO_MS / 1000, (RC_IO_MS % 1000) * 1000};
        setsockopt(k->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(k->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    bool tls = c->tls && port != 0 && !sentinel;
#ifdef TWHEEL_HAVE_TLS
    if (!rc && tls)
        rc = tw__rc_tls_start(c, k, host, why, wlen);
#endif
    if (!rc)
        rc = conn_setup(c, k, tls, sentinel, why, wlen);
    if (rc) {
        tw__rc_conn_close(k);
        return rc;
    }
    *out = k;
    return 0;
}

/* Ask the sentinel @s for the master's address. 0, or a code with @w. */
static int sentinel_ask_one(tw__rc *c, const struct rc_addr *s, char *host,
                            int *port, char *w, size_t wl)
{
    struct rc_conn *k;
    int r = conn_open(c, s->host, s->port, true, &k, w, wl);
    if (r)
        return r;
    const char *argv[3] = {"SENTINEL", "get-master-addr-by-name", c->master};
    redisReply *rep = NULL;
    r = tw__rc_conn_call(k, 3, argv, &rep, w, wl);
    if (!r && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
        rep->element[0]->type == REDIS_REPLY_STRING &&
        rep->element[1]->type == REDIS_REPLY_STRING &&
        rep->element[0]->len < RC_HOST_MAX) {
        long p = strtol(rep->element[1]->str, NULL, 10);
        if (p > 0 && p <= 65535) {
            strcpy(host, rep->element[0]->str);
            *port = (int)p;
            freeReplyObject(rep);
            tw__rc_conn_close(k);
            return 0;
        }
    }
    if (!r && rep->type == REDIS_REPLY_ERROR) {
        r = tw__rc_reply_code(rep->str, TW_EIO);
        snprintf(w, wl, "SENTINEL: %.150s", rep->str);
    } else if (!r) {
        r = TW_ECONN;
        snprintf(w, wl, "knows no master named \"%.100s\"", c->master);
    }
    if (rep)
        freeReplyObject(rep);
    tw__rc_conn_close(k);
    return r;
}

/* The master's address from the first sentinel that knows it. 0, or a
 * code with @why naming the last sentinel's failure. */
static int sentinel_ask(tw__rc *c, char *host, int *port, char *why,
                        size_t wlen)
{
    int rc = TW_ECONN;
    snprintf(why, wlen, "no sentinel");
    for (int i = 0; i < c->nsentinels; i++) {
        struct rc_addr *s = &c->sentinels[i];
        char w[200];
        int r = sentinel_ask_one(c, s, host, port, w, sizeof w);
        if (!r)
            return 0;
        char a[RC_HOST_MAX + 16];
        tw__rc_addr_str(s->host, s->port, a, sizeof a);
        say(why, wlen, "sentinel %s: %s", a, w);
        rc = r;
    }
    return rc;
}

/* Whether @n's connection must be dropped: marked stale, or (under
 * Sentinel, once a second) the sentinels name another master. */
static bool conn_stale(tw__rc *c, struct rc_node *n)
{
    pthread_mutex_lock(&n->mu);
    bool stale = n->stale;
    n->stale = false;
    pthread_mutex_unlock(&n->mu);
    uint64_t now = rc_mono_ns();
    if (n->conn && !stale && c->sentinel &&
        now - n->checked_ns > RC_SENTINEL_CHECK_MS * 1000000ull) {
        /* A forced failover leaves the old master a master (without
         * replicas) until the sentinels reconfigure it, up to ~10 s
         * later: ask them once a second whether it is still the one. */
        char host[RC_HOST_MAX], why[200];
        int port;
        n->checked_ns = now;
        int rc = sentinel_ask(c, host, &port, why, sizeof why);
        if (rc)
            /* No sentinel answers: keep the master we have, and do not
             * pay the connect timeouts on every flight; ask again in 10 s. */
            n->checked_ns = now + 9000 * 1000000ull;
        else if (port != n->port || strcmp(host, n->host))
            stale = true;
    }
    return stale;
}

/* Under Sentinel: move @n to the master the sentinels name now. 0, or a
 * code (recorded) with @why. */
static int sentinel_follow(tw__rc *c, struct rc_node *n, char *why, size_t wlen)
{
    char host[RC_HOST_MAX];
    int port;
    int rc = sentinel_ask(c, host, &port, why, wlen);
    if (rc) {
        tw__rc_seterr(c, rc, "redis-sentinel master \"%s\": %s", c->master,
                      why);
    } else if (port != n->port || strcmp(host, n->host)) {
        pthread_mutex_lock(&c->map_mu);
        strcpy(n->host, host);
        n->port = port;
        pthread_mutex_unlock(&c->map_mu);
    }
    return rc;
}

/* @n could not connect (code @rc): wait longer before the next try. */
static void node_backoff(struct rc_node *n, int rc)
{
    n->failed = true;
    n->err = rc;
    n->backoff_ms = n->backoff_ms ? n->backoff_ms * 2 : RC_BACKOFF_MIN_MS;
    if (n->backoff_ms > RC_BACKOFF_MAX_MS)
        n->backoff_ms = RC_BACKOFF_MAX_MS;
    n->retry_at_ns = rc_mono_ns() + (uint64_t)n->backoff_ms * 1000000u;
}

/* A connection for the flusher of @n: the one it has, or a new one
 * (asking the sentinels first under Sentinel) unless back-off says wait. */
bool tw__rc_node_up(tw__rc *c, struct rc_node *n)
{
    bool stale = conn_stale(c, n);
    if (n->conn && !stale)
        return true;
    if (n->conn) {
        tw__rc_conn_close(n->conn);
        n->conn = NULL;
        n->failed = true;
    }
    if (rc_mono_ns() < n->retry_at_ns)
        return false;
    char why[RC_ERR_MAX - 64];
    int rc = c->sentinel ? sentinel_follow(c, n, why, sizeof why) : 0;
    if (!rc) {
        rc = conn_open(c, n->host, n->port, false, &n->conn, why, sizeof why);
        if (!rc) {
            n->conn_cmds = 0;
            n->checked_ns = rc_mono_ns();
            n->backoff_ms = 0;
            n->err = 0;
            return true;
        }
        char a[RC_HOST_MAX + 16];
        tw__rc_addr_str(n->host, n->port, a, sizeof a);
        tw__rc_seterr(c, rc, "redis %s: %s", a, why);
    }
    node_backoff(n, rc);
    return false;
}

/* The connection of @n broke (@why): drop it, retry after a pause. */
void tw__rc_node_fail(tw__rc *c, struct rc_node *n, const char *why)
{
    char a[RC_HOST_MAX + 16];
    tw__rc_addr_str(n->host, n->port, a, sizeof a);
    tw__rc_seterr(c, TW_ECONN, "redis %s: %s", a, why);
    n->failed = true;
    n->err = TW_ECONN;
    tw__rc_conn_close(n->conn);
    n->conn = NULL;
    n->backoff_ms = RC_BACKOFF_MIN_MS;
    n->retry_at_ns = rc_mono_ns() + (uint64_t)n->backoff_ms * 1000000u;
}
