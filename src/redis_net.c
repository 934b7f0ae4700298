/* SPDX-License-Identifier: MIT */
/*
 * src/redis_net.c - the Redis client's sockets (src/redis_client_impl.h
 * says which file does what): a connected socket to a host name, an IP
 * address or a Unix socket, reads and writes, and the replies.
 *
 * hiredis does the protocol: its reply reader (redisReaderFeed /
 * redisReaderGetReply) and its command formatter (redisFormatCommandArgv).
 * The sockets are ours: TCP, a Unix socket, or TCP under TLS
 * (src/redis_tls.c). Why: TLS is what managed and production Redis
 * servers ask for, and the hiredis of Debian 12 (0.14) has no TLS;
 * hiredis 1.x has it, in a separate library (hiredis_ssl) that many
 * distributions do not ship yet. Owning the I/O costs a few hundred lines
 * (connect with a timeout, read and write, the handshake) and gives one
 * path for every transport, our own error messages (a name that does not
 * resolve, a closed port, a certificate that is not trusted or does not
 * match the host name) and no dependency on the hiredis version beyond
 * its reader, which has been stable since 0.11.
 *
 * Sockets are blocking with SO_RCVTIMEO/SO_SNDTIMEO (RC_IO_MS, set by
 * src/redis_connect.c); a connect is non-blocking, bounded by
 * RC_CONNECT_MS. Every function here works on one connection and is
 * called by one thread at a time (a node's flusher, or the thread that
 * sets a connection up).
 */
#define _GNU_SOURCE

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common.h"
#include "redis_client_impl.h"

void tw__rc_conn_close(struct rc_conn *k)
{
    if (!k)
        return;
#ifdef TWHEEL_HAVE_TLS
    if (k->ssl)
        SSL_free(k->ssl); /* no close_notify: it could block on a dead peer */
#endif
    if (k->fd >= 0)
        close(k->fd);
    if (k->rd)
        redisReaderFree(k->rd);
    tw__free(k);
}

/* connect() bounded by RC_CONNECT_MS. 0 or an errno. */
static int connect_timed(int fd, const struct sockaddr *sa, socklen_t len)
{
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl | O_NONBLOCK);
    int e = 0;
    if (connect(fd, sa, len) < 0) {
        e = errno;
        if (e == EINPROGRESS) {
            struct pollfd p = {fd, POLLOUT, 0};
            int r;
            do
                r = poll(&p, 1, RC_CONNECT_MS);
            while (r < 0 && errno == EINTR);
            socklen_t el = sizeof e;
            if (r == 0)
                e = ETIMEDOUT;
            else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
                e = errno;
        }
    }
    fcntl(fd, F_SETFL, fl);
    return e;
}

/* A connected socket to the Unix socket @path. */
static int sock_open_unix(const char *path, int *fdp, char *why, size_t wlen)
{
    char b[128];
    struct sockaddr_un sun = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sun.sun_path) {
        snprintf(why, wlen, "socket path too long");
        return TW_EINVAL;
    }
    strcpy(sun.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int e =
        fd < 0 ? errno : connect_timed(fd, (struct sockaddr *)&sun, sizeof sun);
    if (e) {
        if (fd >= 0)
            close(fd);
        snprintf(why, wlen, "cannot connect: %s", strerror_r(e, b, sizeof b));
        return TW_ECONN;
    }
    *fdp = fd;
    return 0;
}

/* A connected TCP socket to the first address of @res that answers; 0,
 * or the errno of the last try. */
static int sock_connect_any(const struct addrinfo *res, int *fdp)
{
    int e = 0;
    for (const struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
                        ai->ai_protocol);
        if (fd < 0) {
            e = errno;
            continue;
        }
        e = connect_timed(fd, ai->ai_addr, ai->ai_addrlen);
        if (!e) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
            *fdp = fd;
            return 0;
        }
        close(fd);
    }
    return e;
}

/* A connected socket to @host:@port (@port 0: the Unix socket @host).
 * 0, or TW_ECONN with @why: a name that does not resolve, a refused
 * connection and a timeout each say so. */
int tw__rc_sock_open(const char *host, int port, int *fdp, char *why,
                     size_t wlen)
{
    char b[128];
    if (port == 0)
        return sock_open_unix(host, fdp, why, wlen);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM},
                    *res;
    char ps[8];
    snprintf(ps, sizeof ps, "%d", port);
    int g = getaddrinfo(host, ps, &hints, &res);
    if (g) {
        snprintf(why, wlen, "the host name does not resolve (%s)",
                 g == EAI_SYSTEM ? strerror_r(errno, b, sizeof b)
                                 : gai_strerror(g));
        return TW_ECONN;
    }
    int e = sock_connect_any(res, fdp);
    freeaddrinfo(res);
    if (!e)
        return 0;
    if (e == ECONNREFUSED)
        snprintf(why, wlen, "connection refused (nothing listens there)");
    else if (e == ETIMEDOUT)
        snprintf(why, wlen, "no answer to connect within %d ms", RC_CONNECT_MS);
    else
        snprintf(why, wlen, "cannot connect: %s", strerror_r(e, b, sizeof b));
    return TW_ECONN;
}

/* Write all of @p. 0, or -1 with @why. */
int tw__rc_conn_write(struct rc_conn *k, const char *p, size_t n, char *why,
                      size_t wlen)
{
    while (n) {
        ssize_t w;
#ifdef TWHEEL_HAVE_TLS
        if (k->ssl) {
            w = tw__rc_tls_write(k, p, n, why, wlen);
            if (w < 0)
                return -1;
        } else
#endif
        {
            w = send(k->fd, p, n, MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0) {
                tw__rc_io_why(errno, "write", why, wlen);
                return -1;
            }
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Read what is there (at least one byte). The count, or -1 with @why. */
static ssize_t conn_read(struct rc_conn *k, char *p, size_t n, char *why,
                         size_t wlen)
{
#ifdef TWHEEL_HAVE_TLS
    if (k->ssl)
        return tw__rc_tls_read(k, p, n, why, wlen);
#endif
    for (;;) {
        ssize_t r = recv(k->fd, p, n, 0);
        if (r > 0)
            return r;
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0)
            snprintf(why, wlen, "the server closed the connection");
        else
            tw__rc_io_why(errno, "read", why, wlen);
        return -1;
    }
}

/* The next reply on @k. 0, or -1 with @why (connection or protocol). */
int tw__rc_conn_get(struct rc_conn *k, redisReply **out, char *why, size_t wlen)
{
    for (;;) {
        void *r = NULL;
        if (redisReaderGetReply(k->rd, &r) != REDIS_OK) {
            snprintf(why, wlen, "protocol error: %s", k->rd->errstr);
            return -1;
        }
        if (r) {
            *out = r;
            return 0;
        }
        char buf[16384];
        ssize_t n = conn_read(k, buf, sizeof buf, why, wlen);
        if (n < 0)
            return -1;
        if (redisReaderFeed(k->rd, buf, (size_t)n) != REDIS_OK) {
            snprintf(why, wlen, "protocol error: %s", k->rd->errstr);
            return -1;
        }
    }
}

/* One command (at most 4 arguments) on a connection being set up. 0 with
 * *@rep, or a code. */
int tw__rc_conn_call(struct rc_conn *k, int argc, const char **argv,
                     redisReply **rep, char *why, size_t wlen)
{
    size_t lens[4];
    for (int i = 0; i < argc; i++)
        lens[i] = strlen(argv[i]);
    char *cmd;
    int len = redisFormatCommandArgv(&cmd, argc, argv, lens);
    if (len < 0) {
        snprintf(why, wlen, "out of memory");
        return TW_ENOMEM;
    }
    int rc = tw__rc_conn_write(k, cmd, (size_t)len, why, wlen);
    redisFreeCommand(cmd);
    if (rc || tw__rc_conn_get(k, rep, why, wlen))
        return TW_ECONN;
    return 0;
}
