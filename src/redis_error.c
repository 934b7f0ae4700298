/* SPDX-License-Identifier: MIT */
/*
 * src/redis_error.c - the Redis client's failures as codes and messages
 * (src/redis_client_impl.h says which file does what).
 *
 * Codes: TW_ECONN when no reply came (a name that does not resolve, a
 * refused or broken connection, a timeout: the command may or may not
 * have run), TW_EAUTH for refused credentials and rights (NOAUTH,
 * WRONGPASS, NOPERM, and the "invalid password" of servers before ACLs),
 * TW_EINVAL for a bad address or option, TW_EIO for any other error reply.
 *
 * Messages. The last failure's code and message are kept under map_mu
 * (tw__rc_last_error): a node is named by host:port, [v6]:port or its
 * socket path (tw__rc_addr_str), never by the address string it came
 * from, and a Redis error reply is quoted, cut at 200 bytes. Secrets
 * (passwords) live only in the client, are wiped at close and never go
 * into a message. Any thread.
 */
#define _GNU_SOURCE

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common.h"
#include "redis_client_impl.h"

/* A node's name in messages: host:port, [v6]:port or unix:path. */
void tw__rc_addr_str(const char *host, int port, char *buf, size_t len)
{
    if (port == 0)
        snprintf(buf, len, "unix:%s", host);
    else if (strchr(host, ':'))
        snprintf(buf, len, "[%s]:%d", host, port);
    else
        snprintf(buf, len, "%s:%d", host, port);
}

/* Why a read or write failed (errno @e, during @op). */
void tw__rc_io_why(int e, const char *op, char *why, size_t wlen)
{
    char b[128];
    if (e == EAGAIN || e == EWOULDBLOCK)
        snprintf(why, wlen, "no reply within %d ms", RC_IO_MS);
    else
        snprintf(why, wlen, "%s: %s", op, strerror_r(e, b, sizeof b));
}

/* Record the last failure: @code and a message (never a secret). */
void tw__rc_seterr(tw__rc *c, int code, const char *fmt, ...)
{
    char buf[RC_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&c->map_mu);
    memcpy(c->err, buf, sizeof buf);
    c->err_code = code;
    pthread_mutex_unlock(&c->map_mu);
}

/* A bad address or option: its message recorded; TW_EINVAL. */
int tw__rc_bad(tw__rc *c, const char *fmt, ...)
{
    char buf[RC_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    tw__rc_seterr(c, TW_EINVAL, "%s", buf);
    return TW_EINVAL;
}

/* The code of a Redis error reply: credentials and rights are TW_EAUTH
 * (NOAUTH, WRONGPASS, NOPERM, and the "invalid password" of servers
 * before ACLs), anything else @other. */
int tw__rc_reply_code(const char *text, int other)
{
    static const char *auth[] = {"NOAUTH", "WRONGPASS", "NOPERM",
                                 "ERR invalid password"};
    for (size_t i = 0; i < sizeof auth / sizeof auth[0]; i++)
        if (!strncmp(text, auth[i], strlen(auth[i])))
            return TW_EAUTH;
    return other;
}

/* @cmd's failure on node @n as a code, its message recorded. */
int tw__rc_node_error(tw__rc *c, const struct rc_node *n, const tw__rc_cmd *cmd,
                      const char *what)
{
    if (cmd->err || !cmd->reply)
        return cmd->err ? cmd->err : TW_ECONN; /* message already recorded */
    char a[RC_HOST_MAX + 16];
    tw__rc_addr_str(n->host, n->port, a, sizeof a);
    const redisReply *r = cmd->reply;
    if (r->type != REDIS_REPLY_ERROR) {
        tw__rc_seterr(c, TW_EIO, "redis %s: %s: unexpected reply (type %d)", a,
                      what, r->type);
        return TW_EIO;
    }
    int code = tw__rc_reply_code(r->str, TW_EIO);
    tw__rc_seterr(c, code, "redis %s: %s: %.200s", a, what, r->str);
    return code;
}

int tw__rc_cmd_error(tw__rc *c, const tw__rc_cmd *cmd, const char *what)
{
    /* The node that serves the command's slot now: the one that answered,
     * unless the map changed since. */
    pthread_mutex_lock(&c->map_mu);
    const struct rc_node *n =
        c->nodes[c->slot_node[cmd->slot < 0 ? 0 : cmd->slot]];
    pthread_mutex_unlock(&c->map_mu);
    return tw__rc_node_error(c, n, cmd, what);
}

void tw__rc_last_error(tw__rc *c, char *buf, size_t len)
{
    if (!buf || !len)
        return;
    pthread_mutex_lock(&c->map_mu);
    snprintf(buf, len, "%s", c->err);
    pthread_mutex_unlock(&c->map_mu);
}
