/* SPDX-License-Identifier: MIT */
/*
 * src/redis_addr.c - the Redis client's addresses (src/redis_client_impl.h
 * says which file does what): cfg.redis parsed into the seed nodes, the
 * sentinels, the master's name, the database, the user and the password,
 * and the config fields that override the URL's parts.
 *
 * Forms: "host:port[,host:port...]" (seeds, no scheme), redis://,
 * rediss:// (TLS), unix:///path, and
 * redis-sentinel://host[:26379][,...]/master[/db]; a host is a name, an
 * IPv4 address or a bracketed IPv6 one ([::1]:6379); "user:password@"
 * before the hosts, percent-decoded; "/db" or "?db=N" after them.
 *
 * Secrets: a password found here is copied into the client (wiped at
 * close), and messages quote the host part only, never the text before
 * '@'. A node is named in messages by host:port, [v6]:port or unix:path
 * (tw__rc_addr_str()). Called at open only, by the thread that opens.
 */
#define _GNU_SOURCE

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "redis_client_impl.h"

/* A config field overrides the URL's part. */
int tw__rc_take(char **dst, const char *field)
{
    if (!field)
        return 0;
    if (*dst) {
        explicit_bzero(*dst, strlen(*dst));
        tw__free(*dst);
    }
    size_t n = strlen(field);
    *dst = n ? tw__malloc(n + 1) : NULL;
    if (n && !*dst)
        return TW_ENOMEM;
    if (n)
        memcpy(*dst, field, n + 1);
    return 0;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9')
        return ch - '0';
    if (ch >= 'a' && ch <= 'f')
        return ch - 'a' + 10;
    if (ch >= 'A' && ch <= 'F')
        return ch - 'A' + 10;
    return -1;
}

/* @p[0..n) with %XX decoded, as a new string; NULL when empty or out of
 * memory (*@nomem says which). */
static char *pct_dup(const char *p, size_t n, bool *nomem)
{
    if (n == 0)
        return NULL;
    char *s = tw__malloc(n + 1), *o = s;
    if (!s) {
        *nomem = true;
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        int hi = i + 2 < n ? hexval(p[i + 1]) : -1;
        int lo = i + 2 < n ? hexval(p[i + 2]) : -1;
        if (p[i] == '%' && hi >= 0 && lo >= 0) {
            *o++ = (char)(hi * 16 + lo);
            i += 2;
        } else {
            *o++ = p[i];
        }
    }
    *o = 0;
    return s;
}

/* The port after the host of @p[0..n) (@port: its text, or NULL for
 * @defport) into a->port. */
static int parse_port(tw__rc *c, const char *p, size_t n, const char *port,
                      int defport, struct rc_addr *a)
{
    if (!port && !defport)
        return tw__rc_bad(c, "redis: no port in \"%.*s\"", (int)n, p);
    a->port = defport;
    if (port) {
        char *end;
        long v = strtol(port, &end, 10);
        if (!*port || *end || v <= 0 || v > 65535)
            return tw__rc_bad(c, "redis: bad port in \"%.*s\"", (int)n, p);
        a->port = (int)v;
    }
    return 0;
}

/* "host[:port]" or "[v6addr][:port]" of @p[0..n); @defport 0 = the port
 * is required. */
static int parse_hostport(tw__rc *c, const char *p, size_t n, int defport,
                          struct rc_addr *a)
{
    char tok[RC_HOST_MAX];
    if (n == 0)
        return tw__rc_bad(c, "redis: an empty host in the address");
    if (n >= sizeof tok)
        return tw__rc_bad(c, "redis: a host name longer than %d bytes",
                          RC_HOST_MAX - 1);
    memcpy(tok, p, n);
    tok[n] = 0;
    char *host = tok, *port = NULL;
    if (tok[0] == '[') {
        char *e = strchr(tok, ']');
        if (!e || (e[1] && e[1] != ':'))
            return tw__rc_bad(c, "redis: bad IPv6 address in \"%.*s\"", (int)n,
                              p);
        *e = 0;
        host = tok + 1;
        port = e[1] ? e + 2 : NULL;
    } else {
        char *col = strrchr(tok, ':');
        if (col && strchr(tok, ':') != col)
            return tw__rc_bad(c,
                              "redis: an IPv6 address needs brackets "
                              "([::1]:6379) in \"%.*s\"",
                              (int)n, p);
        if (col) {
            *col = 0;
            port = col + 1;
        }
    }
    if (!*host)
        return tw__rc_bad(c, "redis: no host in \"%.*s\"", (int)n, p);
    int rc = parse_port(c, p, n, port, defport, a);
    if (!rc)
        strcpy(a->host, host);
    return rc;
}

/* A comma-separated list of hosts into the seed nodes (or, @sentinels,
 * the sentinels). */
static int parse_hosts(tw__rc *c, const char *p, size_t n, int defport,
                       bool sentinels)
{
    const char *end = p + n;
    while (p <= end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *e = comma ? comma : end;
        struct rc_addr a;
        int rc = parse_hostport(c, p, (size_t)(e - p), defport, &a);
        if (rc)
            return rc;
        if (sentinels) {
            if (c->nsentinels == RC_MAX_SENTINELS)
                return tw__rc_bad(c, "redis: more than %d sentinels",
                                  RC_MAX_SENTINELS);
            c->sentinels[c->nsentinels++] = a;
        } else if (!tw__rc_node_get_locked(c, a.host, a.port)) {
            return c->nnodes == RC_MAX_NODES
                       ? tw__rc_bad(c, "redis: more than %d nodes",
                                    RC_MAX_NODES)
                       : TW_ENOMEM;
        }
        p = e + 1;
    }
    return 0;
}

static int parse_db(tw__rc *c, const char *p, size_t n)
{
    char buf[16];
    if (n == 0 || n >= sizeof buf || strspn(p, "0123456789") < n)
        return tw__rc_bad(c,
                          "redis: bad database \"%.*s\" (a number is "
                          "expected)",
                          (int)(n < 40 ? n : 40), p);
    memcpy(buf, p, n);
    buf[n] = 0;
    long v = strtol(buf, NULL, 10);
    if (v > 2147483647L)
        return tw__rc_bad(c, "redis: database %s out of range", buf);
    c->db = (int)v;
    return 0;
}

/* "user:password@" at @p (before @end), if any: the user and password
 * taken, the hosts' start into *@p. */
static int parse_userinfo(tw__rc *c, const char **p, const char *end)
{
    const char *at = memrchr(*p, '@', (size_t)(end - *p));
    if (!at)
        return 0;
    const char *colon = memchr(*p, ':', (size_t)(at - *p));
    bool nomem = false;
    c->user = pct_dup(*p, (size_t)((colon ? colon : at) - *p), &nomem);
    if (colon)
        c->password = pct_dup(colon + 1, (size_t)(at - colon - 1), &nomem);
    if (nomem)
        return TW_ENOMEM;
    *p = at + 1;
    return 0;
}

/* unix:///path: the one node, a socket path. */
static int parse_unix(tw__rc *c, const char *p, const char *end)
{
    if (*p != '/')
        return tw__rc_bad(c, "redis: unix:// needs an absolute socket path "
                             "(unix:///run/redis.sock)");
    struct rc_addr a;
    if ((size_t)(end - p) >= sizeof a.host)
        return tw__rc_bad(c, "redis: socket path too long");
    memcpy(a.host, p, (size_t)(end - p));
    a.host[end - p] = 0;
    return tw__rc_node_get_locked(c, a.host, 0) ? 0 : TW_ENOMEM;
}

/* After redis-sentinel://'s hosts, at @m: "master[/db]", then the one
 * data node, wherever the sentinels say it is. */
static int parse_master(tw__rc *c, const char *m, const char *end)
{
    const char *me = memchr(m, '/', (size_t)(end - m));
    me = me ? me : end;
    if (me == m || (size_t)(me - m) >= sizeof c->master)
        return tw__rc_bad(c, "redis: redis-sentinel:// needs the master's "
                             "name (redis-sentinel://host:26379/mymaster)");
    memcpy(c->master, m, (size_t)(me - m));
    c->master[me - m] = 0;
    int rc = 0;
    if (me < end)
        rc = parse_db(c, me + 1, (size_t)(end - me - 1));
    if (!rc && !tw__rc_node_get_locked(c, "", -1))
        rc = TW_ENOMEM;
    return rc;
}

/* The hosts of a redis://, rediss:// or redis-sentinel:// URL from @p,
 * then the master's name or the database. */
static int parse_url_hosts(tw__rc *c, const char *p, const char *end)
{
    const char *slash = memchr(p, '/', (size_t)(end - p));
    const char *hend = slash ? slash : end;
    int rc = parse_hosts(c, p, (size_t)(hend - p), c->sentinel ? 26379 : 6379,
                         c->sentinel);
    if (!rc && c->sentinel)
        rc = parse_master(c, slash ? slash + 1 : end, end);
    else if (!rc && slash && slash + 1 < end)
        rc = parse_db(c, slash + 1, (size_t)(end - slash - 1));
    return rc;
}

/* redis://, rediss://, unix://, redis-sentinel://, or host:port[,...]. */
int tw__rc_parse_addr(tw__rc *c, const char *s)
{
    const char *sep = strstr(s, "://");
    if (!sep)
        return parse_hosts(c, s, strlen(s), 0, false);
    size_t sl = (size_t)(sep - s);
    bool unix_ = sl == 4 && !memcmp(s, "unix", 4);
    c->tls = sl == 6 && !memcmp(s, "rediss", 6);
    c->sentinel = sl == 14 && !memcmp(s, "redis-sentinel", 14);
    if (!unix_ && !c->tls && !c->sentinel &&
        !(sl == 5 && !memcmp(s, "redis", 5)))
        return tw__rc_bad(c,
                          "redis: unknown scheme \"%.*s\" (redis://, "
                          "rediss://, unix://, redis-sentinel://)",
                          (int)(sl < 20 ? sl : 20), s);
    const char *p = sep + 3;
    const char *q = strchr(p, '?');
    const char *end = q ? q : p + strlen(p);
    int rc = parse_userinfo(c, &p, end);
    if (rc)
        return rc;
    rc = unix_ ? parse_unix(c, p, end) : parse_url_hosts(c, p, end);
    if (!rc && q) {
        if (strncmp(q + 1, "db=", 3))
            return tw__rc_bad(c, "redis: unknown option \"%.20s\" (only ?db=N)",
                              q + 1);
        rc = parse_db(c, q + 4, strlen(q + 4));
    }
    return rc;
}
