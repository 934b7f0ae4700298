/* SPDX-License-Identifier: MIT */
/*
 * src/redis_client.c - see redis_client.h.
 *
 * Protocol and transport. hiredis does the protocol: its reply reader
 * (redisReaderFeed / redisReaderGetReply) and its command formatter
 * (redisFormatCommandArgv). The sockets are ours: TCP, a Unix socket, or
 * TCP under TLS with OpenSSL. Why: TLS is what managed and production
 * Redis servers ask for, and the hiredis of Debian 12 (0.14) has no TLS;
 * hiredis 1.x has it, in a separate library (hiredis_ssl) that many
 * distributions do not ship yet. Owning the I/O costs a few hundred lines
 * (connect with a timeout, read and write, the handshake) and gives one
 * path for every transport, our own error messages (a name that does not
 * resolve, a closed port, a certificate that is not trusted or does not
 * match the host name) and no dependency on the hiredis version beyond
 * its reader, which has been stable since 0.11. Sockets are blocking with
 * SO_RCVTIMEO/SO_SNDTIMEO (RC_IO_MS); a connect is non-blocking, bounded
 * by RC_CONNECT_MS.
 *
 * Connection set-up, on every connection (the first, those opened after a
 * MOVED or ASK to a new node, reconnects, a new master after a failover):
 * TLS handshake (server certificate verified against the CA file or
 * directory, else the system store; host name or IP address checked; SNI;
 * optional client certificate), then AUTH [user] password, SELECT db, and
 * under Sentinel a ROLE check; a TLS connection without any of those sends
 * PING, so that a server that refuses our certificate says so now, not at
 * the first command.
 *
 * Sentinel. The one data node is whichever master the sentinels name:
 * every (re)connection asks them (SENTINEL get-master-addr-by-name, first
 * answer wins), connects and checks ROLE; a READONLY reply (the master
 * was demoted) drops the connection, so the retry asks again.
 *
 * Batching. Each node has one connection, a queue of requests and a busy
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
 *
 * Secrets (passwords) live only in this struct, are wiped at close and
 * never go into a message: messages name a node by host:port (or its
 * socket path), never by the address string they came from.
 */
#define _GNU_SOURCE

#include "redis_client.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/read.h>
#ifdef TWHEEL_HAVE_TLS
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#endif

#include "clock.h"
#include "common.h"

#define RC_SLOTS 16384
#define RC_MAX_NODES TW__RC_NODES_MAX
#define RC_MAX_ROUNDS 16
#define RC_CONNECT_MS 500
#define RC_IO_MS 3000
#define RC_BACKOFF_MIN_MS 20
#define RC_BACKOFF_MAX_MS 1000
#define RC_HOST_MAX 256 /* host name, IP address or socket path, with NUL */
#define RC_MAX_SENTINELS 16
#define RC_ERR_MAX 320
#define RC_SENTINEL_CHECK_MS 1000

/* One open connection: a socket, its TLS session if any, and a reader. */
struct rc_conn {
    int fd;
#ifdef TWHEEL_HAVE_TLS
    SSL *ssl;
#endif
    redisReader *rd;
};

struct rc_req {
    tw__rc_cmd *cmd;
    bool asking;
    bool done;
    struct rc_req *next;
    bool unsent; /* a WAIT that could not cover the writes it follows */
};

struct rc_node {
    char host[RC_HOST_MAX]; /* a Unix socket's path when port is 0 */
    int port;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct rc_conn *conn; /* used only by the flusher (busy) */
    struct rc_req *head, **tail;
    bool busy;
    bool stale; /* under mu: drop the connection before the next use */
    uint64_t retry_at_ns;
    uint32_t backoff_ms;
    bool failed; /* the connection broke or could not be made */
    int err;     /* the code of the last failure (TW_ECONN, TW_EAUTH...) */
    uint64_t checked_ns; /* Sentinel: when the sentinels last confirmed it */
    uint64_t conn_cmds;  /* commands other than WAIT sent on this conn */
    char *obuf;          /* the flusher's output buffer */
    size_t ocap;
};

struct rc_addr {
    char host[RC_HOST_MAX];
    int port;
};

struct tw__rc {
    pthread_mutex_t map_mu;
    struct rc_node *nodes[RC_MAX_NODES];
    int nnodes;
    int16_t slot_node[RC_SLOTS];
    uint64_t last_refresh_ns;
    tw__rc_stats st; /* under map_mu */
    bool cluster;    /* CLUSTER SLOTS answered */

    /* Set at open, read-only afterwards. */
    bool tls;
    int db;
    char *user, *password;     /* data nodes' AUTH (NULL: none) */
    char *s_user, *s_password; /* sentinels' AUTH */
    char *server_name;         /* TLS: name to send and check */
    bool sentinel;             /* node 0 is the master of @master */
    char master[128];
    struct rc_addr sentinels[RC_MAX_SENTINELS];
    int nsentinels;
#ifdef TWHEEL_HAVE_TLS
    SSL_CTX *ssl_ctx;
#endif

    char err[RC_ERR_MAX]; /* the last failure's message, under map_mu */
    int err_code;
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

/* ------------------------------------------------------------------------ */
/* Messages. */

/* Record the last failure: @code and a message (never a secret). */
static void rc_seterr(tw__rc *c, int code, const char *fmt, ...)
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

/* snprintf for messages that may be cut short (on purpose). */
__attribute__((format(printf, 3, 4))) static void say(char *buf, size_t len,
                                                      const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, len, fmt, ap);
    va_end(ap);
}

/* A node's name in messages: host:port, [v6]:port or unix:path. */
static void addr_str(const char *host, int port, char *buf, size_t len)
{
    if (port == 0)
        snprintf(buf, len, "unix:%s", host);
    else if (strchr(host, ':'))
        snprintf(buf, len, "[%s]:%d", host, port);
    else
        snprintf(buf, len, "%s:%d", host, port);
}

/* The code of a Redis error reply: credentials and rights are TW_EAUTH
 * (NOAUTH, WRONGPASS, NOPERM, and the "invalid password" of servers
 * before ACLs), anything else @other. */
static int reply_code(const char *text, int other)
{
    static const char *auth[] = {"NOAUTH", "WRONGPASS", "NOPERM",
                                 "ERR invalid password"};
    for (size_t i = 0; i < sizeof auth / sizeof auth[0]; i++)
        if (!strncmp(text, auth[i], strlen(auth[i])))
            return TW_EAUTH;
    return other;
}

static void io_why(int e, const char *op, char *why, size_t wlen)
{
    char b[128];
    if (e == EAGAIN || e == EWOULDBLOCK)
        snprintf(why, wlen, "no reply within %d ms", RC_IO_MS);
    else
        snprintf(why, wlen, "%s: %s", op, strerror_r(e, b, sizeof b));
}

/* ------------------------------------------------------------------------ */
/* Connections: socket, TLS, reader. */

static void conn_close(struct rc_conn *k)
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

/* A connected socket to @host:@port (@port 0: the Unix socket @host).
 * 0, or TW_ECONN with @why: a name that does not resolve, a refused
 * connection and a timeout each say so. */
static int sock_open(const char *host, int port, int *fdp, char *why,
                     size_t wlen)
{
    char b[128];
    if (port == 0) {
        struct sockaddr_un sun = {.sun_family = AF_UNIX};
        if (strlen(host) >= sizeof sun.sun_path) {
            snprintf(why, wlen, "socket path too long");
            return TW_EINVAL;
        }
        strcpy(sun.sun_path, host);
        int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int e = fd < 0 ? errno
                       : connect_timed(fd, (struct sockaddr *)&sun, sizeof sun);
        if (e) {
            if (fd >= 0)
                close(fd);
            snprintf(why, wlen, "cannot connect: %s",
                     strerror_r(e, b, sizeof b));
            return TW_ECONN;
        }
        *fdp = fd;
        return 0;
    }
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
    int e = 0;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
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
            freeaddrinfo(res);
            *fdp = fd;
            return 0;
        }
        close(fd);
    }
    freeaddrinfo(res);
    if (e == ECONNREFUSED)
        snprintf(why, wlen, "connection refused (nothing listens there)");
    else if (e == ETIMEDOUT)
        snprintf(why, wlen, "no answer to connect within %d ms", RC_CONNECT_MS);
    else
        snprintf(why, wlen, "cannot connect: %s", strerror_r(e, b, sizeof b));
    return TW_ECONN;
}

#ifdef TWHEEL_HAVE_TLS
/* Why a TLS call failed, from OpenSSL's error queue and errno. */
static void tls_why(SSL *ssl, int r, const char *op, char *why, size_t wlen)
{
    int e = SSL_get_error(ssl, r);
    unsigned long q = ERR_peek_error();
    if (e == SSL_ERROR_ZERO_RETURN) {
        snprintf(why, wlen, "the server closed the TLS connection");
    } else if (q) {
        char b[200];
        ERR_error_string_n(q, b, sizeof b);
        const char *reason = ERR_reason_error_string(q);
        reason = reason ? reason : b;
        snprintf(why, wlen, "TLS %s failed: %s%s", op, reason,
                 strstr(reason, "certificate required")
                     ? " (the server asks for a client certificate)"
                     : "");
    } else if (e == SSL_ERROR_SYSCALL && errno && errno != EAGAIN) {
        io_why(errno, op, why, wlen);
    } else if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE ||
               errno == EAGAIN) {
        snprintf(why, wlen, "TLS %s: no answer within %d ms%s", op, RC_IO_MS,
                 strcmp(op, "handshake") ? "" : " (not a TLS port?)");
    } else {
        snprintf(why, wlen, "TLS %s failed: the server closed the connection",
                 op);
    }
}

/* The TLS handshake on @k: SNI, the certificate checked against the
 * trusted CAs and against the host name (or IP address). */
static int tls_start(tw__rc *c, struct rc_conn *k, const char *host, char *why,
                     size_t wlen)
{
    SSL *ssl = SSL_new(c->ssl_ctx);
    if (!ssl) {
        snprintf(why, wlen, "out of memory (TLS)");
        return TW_ENOMEM;
    }
    k->ssl = ssl;
    SSL_set_fd(ssl, k->fd);
    const char *name = c->server_name ? c->server_name : host;
    unsigned char ip[16];
    if (inet_pton(AF_INET, name, ip) == 1 ||
        inet_pton(AF_INET6, name, ip) == 1) {
        X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name);
    } else {
        SSL_set_tlsext_host_name(ssl, name);
        SSL_set1_host(ssl, name);
    }
    ERR_clear_error();
    int r = SSL_connect(ssl);
    if (r == 1)
        return 0;
    long v = SSL_get_verify_result(ssl);
    if (v == X509_V_ERR_HOSTNAME_MISMATCH ||
        v == X509_V_ERR_IP_ADDRESS_MISMATCH)
        snprintf(why, wlen,
                 "TLS: the server's certificate does not match the host "
                 "name \"%s\"",
                 name);
    else if (v != X509_V_OK)
        snprintf(why, wlen, "TLS: the server's certificate is not trusted (%s)",
                 X509_verify_cert_error_string(v));
    else
        tls_why(ssl, r, "handshake", why, wlen);
    return TW_ECONN;
}
#endif

/* Write all of @p. 0, or -1 with @why. */
static int conn_write(struct rc_conn *k, const char *p, size_t n, char *why,
                      size_t wlen)
{
    while (n) {
        ssize_t w;
#ifdef TWHEEL_HAVE_TLS
        if (k->ssl) {
            ERR_clear_error();
            int r = SSL_write(k->ssl, p, n > (1u << 30) ? 1 << 30 : (int)n);
            if (r <= 0) {
                tls_why(k->ssl, r, "write", why, wlen);
                /* A server that refused us after the handshake (TLS 1.3:
                 * no or a bad client certificate) sent an alert before it
                 * closed: its reason says more than the reset. */
                char b[64];
                ERR_clear_error();
                int rr = SSL_read(k->ssl, b, sizeof b);
                if (rr <= 0 && ERR_peek_error())
                    tls_why(k->ssl, rr, "write", why, wlen);
                return -1;
            }
            w = r;
        } else
#endif
        {
            w = send(k->fd, p, n, MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0) {
                io_why(errno, "write", why, wlen);
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
    if (k->ssl) {
        ERR_clear_error();
        int r = SSL_read(k->ssl, p, (int)n);
        if (r <= 0)
            tls_why(k->ssl, r, "read", why, wlen);
        return r <= 0 ? -1 : r;
    }
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
            io_why(errno, "read", why, wlen);
        return -1;
    }
}

/* The next reply on @k. 0, or -1 with @why (connection or protocol). */
static int conn_get(struct rc_conn *k, redisReply **out, char *why, size_t wlen)
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

/* One command on a connection being set up. 0 with *@rep, or a code. */
static int conn_call(struct rc_conn *k, int argc, const char **argv,
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
    int rc = conn_write(k, cmd, (size_t)len, why, wlen);
    redisFreeCommand(cmd);
    if (rc || conn_get(k, rep, why, wlen))
        return TW_ECONN;
    return 0;
}

/* A set-up command that must not fail: its error reply is the code
 * (reply_code(..., @other)) and Redis's text in @why. */
static int setup_call(struct rc_conn *k, int argc, const char **argv, int other,
                      const char *hint, char *why, size_t wlen)
{
    redisReply *rep = NULL;
    int rc = conn_call(k, argc, argv, &rep, why, wlen);
    if (!rc && rep->type == REDIS_REPLY_ERROR) {
        rc = reply_code(rep->str, other);
        snprintf(why, wlen, "%s: %.200s%s", argv[0], rep->str,
                 hint && strstr(rep->str, "cluster") ? hint : "");
    } else if (!rc && argc == 1 && !strcmp(argv[0], "ROLE")) {
        /* Under Sentinel: only the master takes writes. */
        bool master = rep->type == REDIS_REPLY_ARRAY && rep->elements &&
                      rep->element[0]->type == REDIS_REPLY_STRING &&
                      !strcmp(rep->element[0]->str, "master");
        if (!master) {
            rc = TW_ECONN;
            snprintf(why, wlen,
                     "named master by the sentinels but not a master (a "
                     "failover may be under way)");
        }
    }
    if (rep)
        freeReplyObject(rep);
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
    int rc = sock_open(host, port, &k->fd, why, wlen);
    if (!rc) {
        struct timeval tv = {RC_IO_MS / 1000, (RC_IO_MS % 1000) * 1000};
        setsockopt(k->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(k->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    }
    bool tls = c->tls && port != 0 && !sentinel, said = false;
#ifdef TWHEEL_HAVE_TLS
    if (!rc && tls)
        rc = tls_start(c, k, host, why, wlen);
#endif
    const char *user = sentinel ? c->s_user : c->user;
    const char *pass = sentinel ? c->s_password : c->password;
    if (!rc && pass) {
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
    if (rc) {
        conn_close(k);
        return rc;
    }
    *out = k;
    return 0;
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
        struct rc_conn *k;
        int r = conn_open(c, s->host, s->port, true, &k, w, sizeof w);
        if (!r) {
            const char *argv[3] = {"SENTINEL", "get-master-addr-by-name",
                                   c->master};
            redisReply *rep = NULL;
            r = conn_call(k, 3, argv, &rep, w, sizeof w);
            if (!r && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
                rep->element[0]->type == REDIS_REPLY_STRING &&
                rep->element[1]->type == REDIS_REPLY_STRING &&
                rep->element[0]->len < RC_HOST_MAX) {
                long p = strtol(rep->element[1]->str, NULL, 10);
                if (p > 0 && p <= 65535) {
                    strcpy(host, rep->element[0]->str);
                    *port = (int)p;
                    freeReplyObject(rep);
                    conn_close(k);
                    return 0;
                }
            }
            if (!r && rep->type == REDIS_REPLY_ERROR) {
                r = reply_code(rep->str, TW_EIO);
                snprintf(w, sizeof w, "SENTINEL: %.150s", rep->str);
            } else if (!r) {
                r = TW_ECONN;
                snprintf(w, sizeof w, "knows no master named \"%.100s\"",
                         c->master);
            }
            if (rep)
                freeReplyObject(rep);
            conn_close(k);
        }
        char a[RC_HOST_MAX + 16];
        addr_str(s->host, s->port, a, sizeof a);
        say(why, wlen, "sentinel %s: %s", a, w);
        rc = r;
    }
    return rc;
}

/* A connection for the flusher of @n: the one it has, or a new one
 * (asking the sentinels first under Sentinel) unless back-off says wait. */
static bool conn_up(tw__rc *c, struct rc_node *n)
{
    pthread_mutex_lock(&n->mu);
    bool stale = n->stale;
    n->stale = false;
    pthread_mutex_unlock(&n->mu);
    uint64_t now = mono_ns();
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
    if (n->conn && !stale)
        return true;
    if (n->conn) {
        conn_close(n->conn);
        n->conn = NULL;
        n->failed = true;
    }
    if (mono_ns() < n->retry_at_ns)
        return false;
    char why[RC_ERR_MAX - 64];
    int rc = 0;
    if (c->sentinel) {
        char host[RC_HOST_MAX];
        int port;
        rc = sentinel_ask(c, host, &port, why, sizeof why);
        if (rc)
            rc_seterr(c, rc, "redis-sentinel master \"%s\": %s", c->master,
                      why);
        else if (port != n->port || strcmp(host, n->host)) {
            pthread_mutex_lock(&c->map_mu);
            strcpy(n->host, host);
            n->port = port;
            pthread_mutex_unlock(&c->map_mu);
        }
    }
    if (!rc) {
        rc = conn_open(c, n->host, n->port, false, &n->conn, why, sizeof why);
        if (!rc) {
            n->conn_cmds = 0;
            n->checked_ns = mono_ns();
            n->backoff_ms = 0;
            n->err = 0;
            return true;
        }
        char a[RC_HOST_MAX + 16];
        addr_str(n->host, n->port, a, sizeof a);
        rc_seterr(c, rc, "redis %s: %s", a, why);
    }
    n->failed = true;
    n->err = rc;
    n->backoff_ms = n->backoff_ms ? n->backoff_ms * 2 : RC_BACKOFF_MIN_MS;
    if (n->backoff_ms > RC_BACKOFF_MAX_MS)
        n->backoff_ms = RC_BACKOFF_MAX_MS;
    n->retry_at_ns = mono_ns() + (uint64_t)n->backoff_ms * 1000000u;
    return false;
}

/* The connection of @n broke (@why): drop it, retry after a pause. */
static void conn_fail(tw__rc *c, struct rc_node *n, const char *why)
{
    char a[RC_HOST_MAX + 16];
    addr_str(n->host, n->port, a, sizeof a);
    rc_seterr(c, TW_ECONN, "redis %s: %s", a, why);
    n->failed = true;
    n->err = TW_ECONN;
    conn_close(n->conn);
    n->conn = NULL;
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

/* Connect if needed and write the batch in one go; SIGPIPE blocked by the
 * caller (OpenSSL writes with write()). */
static void flight_write(tw__rc *c, struct flight *f)
{
    static const char asking[] = "*1\r\n$6\r\nASKING\r\n";
    struct rc_node *n = f->n;
    bool was = n->conn != NULL;
    f->up = conn_up(c, n);
    f->reconnected = f->up && !was && n->failed;
    if (!f->up)
        return;
    n->failed = false;
    size_t at = 0;
    bool ok = true;
    for (struct rc_req *r = f->b; r && ok; r = r->next) {
        /* WAIT counts the replicas that have this connection's writes. As
         * the first command of a new connection it would count none of the
         * writes sent on the one that broke (and answer at once): it is
         * failed instead, so that a write is never acknowledged by a WAIT
         * that did not cover it. */
        bool wait = r->cmd->argc >= 1 && r->cmd->argvlen[0] == 4 &&
                    !strncasecmp(r->cmd->argv[0], "WAIT", 4);
        r->unsent = wait && n->conn_cmds == 0;
        if (r->unsent)
            continue;
        n->conn_cmds += !wait;
        if (r->asking)
            ok = obuf_put(n, &at, asking, sizeof asking - 1);
        char *cmd;
        int len = redisFormatCommandArgv(&cmd, r->cmd->argc, r->cmd->argv,
                                         r->cmd->argvlen);
        ok = ok && len >= 0 && obuf_put(n, &at, cmd, (size_t)len);
        if (len >= 0)
            redisFreeCommand(cmd);
    }
    char why[200];
    if (!ok)
        snprintf(why, sizeof why, "out of memory");
    if (!ok || conn_write(n->conn, n->obuf, at, why, sizeof why)) {
        f->up = false;
        conn_fail(c, n, why);
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
            if (conn_get(f->n->conn, &rep, why, sizeof why))
                break;
            freeReplyObject(rep);
        }
        if (conn_get(f->n->conn, &rep, why, sizeof why))
            break;
        r->cmd->reply = rep;
        r->cmd->err = 0;
    }
    if (r && f->up)
        conn_fail(c, f->n, why);
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
    struct rc_req r = {cmd, false, false, NULL, false};
    pthread_mutex_lock(&n->mu);
    *n->tail = &r;
    n->tail = &r.next;
    pthread_mutex_unlock(&n->mu);
    node_serve(c, n, one_done, &r);
}

bool tw__rc_is_noscript(const redisReply *r)
{
    return r && r->type == REDIS_REPLY_ERROR && r->str &&
           !strncmp(r->str, "NOSCRIPT", 8);
}

bool tw__rc_noscript_to_eval(tw__rc_cmd *cmd, const char *src)
{
    if (!tw__rc_is_noscript(cmd->reply))
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

void tw__rc_free_replies(tw__rc_cmd *cmds, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (cmds[i].reply)
            freeReplyObject(cmds[i].reply);
}

static int node_error(tw__rc *c, const struct rc_node *n, const tw__rc_cmd *cmd,
                      const char *what);

/* Load the slot map from any reachable node. 0, or the last node's
 * failure code (its message recorded). */
static int refresh(tw__rc *c)
{
    static const char *argv[] = {"CLUSTER", "SLOTS"};
    static const size_t lens[] = {7, 5};
    pthread_mutex_lock(&c->map_mu);
    int nn = c->nnodes;
    struct rc_node *list[RC_MAX_NODES];
    memcpy(list, c->nodes, sizeof(list[0]) * (size_t)nn);
    pthread_mutex_unlock(&c->map_mu);
    int rc = TW_ECONN;
    for (int i = 0; i < nn; i++) {
        tw__rc_cmd cmd = {2, argv, lens, -1, NULL, 0};
        run_one(c, list[i], &cmd);
        redisReply *rep = cmd.reply;
        if (cmd.err || !rep) {
            rc = cmd.err ? cmd.err : TW_ECONN;
            continue;
        }
        if (rep->type == REDIS_REPLY_ERROR &&
            !strstr(rep->str, "cluster support disabled")) {
            /* NOAUTH, NOPERM, LOADING...: not an answer. */
            rc = node_error(c, list[i], &cmd, "CLUSTER SLOTS");
            freeReplyObject(rep);
            continue;
        }
        pthread_mutex_lock(&c->map_mu);
        if (rep->type == REDIS_REPLY_ERROR) {
            /* Not a cluster: this node serves every slot. */
            int16_t idx = (int16_t)node_index(c, list[i]);
            for (int s = 0; s < RC_SLOTS; s++)
                c->slot_node[s] = idx;
        } else if (rep->type == REDIS_REPLY_ARRAY) {
            c->cluster = true;
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
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Addresses: "host:port[,...]" and URLs. Messages quote the host part
 * only: a password never reaches them. */

static int bad(tw__rc *c, const char *fmt, ...)
{
    char buf[RC_ERR_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    rc_seterr(c, TW_EINVAL, "%s", buf);
    return TW_EINVAL;
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

/* "host[:port]" or "[v6addr][:port]" of @p[0..n); @defport 0 = the port
 * is required. */
static int parse_hostport(tw__rc *c, const char *p, size_t n, int defport,
                          struct rc_addr *a)
{
    char tok[RC_HOST_MAX];
    if (n == 0)
        return bad(c, "redis: an empty host in the address");
    if (n >= sizeof tok)
        return bad(c, "redis: a host name longer than %d bytes",
                   RC_HOST_MAX - 1);
    memcpy(tok, p, n);
    tok[n] = 0;
    char *host = tok, *port = NULL;
    if (tok[0] == '[') {
        char *e = strchr(tok, ']');
        if (!e || (e[1] && e[1] != ':'))
            return bad(c, "redis: bad IPv6 address in \"%.*s\"", (int)n, p);
        *e = 0;
        host = tok + 1;
        port = e[1] ? e + 2 : NULL;
    } else {
        char *col = strrchr(tok, ':');
        if (col && strchr(tok, ':') != col)
            return bad(c,
                       "redis: an IPv6 address needs brackets ([::1]:6379) "
                       "in \"%.*s\"",
                       (int)n, p);
        if (col) {
            *col = 0;
            port = col + 1;
        }
    }
    if (!*host)
        return bad(c, "redis: no host in \"%.*s\"", (int)n, p);
    if (!port && !defport)
        return bad(c, "redis: no port in \"%.*s\"", (int)n, p);
    a->port = defport;
    if (port) {
        char *end;
        long v = strtol(port, &end, 10);
        if (!*port || *end || v <= 0 || v > 65535)
            return bad(c, "redis: bad port in \"%.*s\"", (int)n, p);
        a->port = (int)v;
    }
    strcpy(a->host, host);
    return 0;
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
                return bad(c, "redis: more than %d sentinels",
                           RC_MAX_SENTINELS);
            c->sentinels[c->nsentinels++] = a;
        } else if (!node_get_locked(c, a.host, a.port)) {
            return c->nnodes == RC_MAX_NODES
                       ? bad(c, "redis: more than %d nodes", RC_MAX_NODES)
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
        return bad(c, "redis: bad database \"%.*s\" (a number is expected)",
                   (int)(n < 40 ? n : 40), p);
    memcpy(buf, p, n);
    buf[n] = 0;
    long v = strtol(buf, NULL, 10);
    if (v > 2147483647L)
        return bad(c, "redis: database %s out of range", buf);
    c->db = (int)v;
    return 0;
}

/* redis://, rediss://, unix://, redis-sentinel://, or host:port[,...]. */
static int parse_addr(tw__rc *c, const char *s)
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
        return bad(c,
                   "redis: unknown scheme \"%.*s\" (redis://, rediss://, "
                   "unix://, redis-sentinel://)",
                   (int)(sl < 20 ? sl : 20), s);
    const char *p = sep + 3;
    const char *q = strchr(p, '?');
    const char *end = q ? q : p + strlen(p);
    const char *at = memrchr(p, '@', (size_t)(end - p));
    if (at) {
        const char *colon = memchr(p, ':', (size_t)(at - p));
        bool nomem = false;
        c->user = pct_dup(p, (size_t)((colon ? colon : at) - p), &nomem);
        if (colon)
            c->password = pct_dup(colon + 1, (size_t)(at - colon - 1), &nomem);
        if (nomem)
            return TW_ENOMEM;
        p = at + 1;
    }
    int rc;
    if (unix_) {
        if (*p != '/')
            return bad(c, "redis: unix:// needs an absolute socket path "
                          "(unix:///run/redis.sock)");
        struct rc_addr a;
        if ((size_t)(end - p) >= sizeof a.host)
            return bad(c, "redis: socket path too long");
        memcpy(a.host, p, (size_t)(end - p));
        a.host[end - p] = 0;
        rc = node_get_locked(c, a.host, 0) ? 0 : TW_ENOMEM;
    } else {
        const char *slash = memchr(p, '/', (size_t)(end - p));
        const char *hend = slash ? slash : end;
        rc = parse_hosts(c, p, (size_t)(hend - p), c->sentinel ? 26379 : 6379,
                         c->sentinel);
        if (!rc && c->sentinel) {
            const char *m = slash ? slash + 1 : end;
            const char *me = memchr(m, '/', (size_t)(end - m));
            me = me ? me : end;
            if (me == m || (size_t)(me - m) >= sizeof c->master)
                return bad(c, "redis: redis-sentinel:// needs the master's "
                              "name (redis-sentinel://host:26379/mymaster)");
            memcpy(c->master, m, (size_t)(me - m));
            c->master[me - m] = 0;
            if (me < end)
                rc = parse_db(c, me + 1, (size_t)(end - me - 1));
            /* The one data node, wherever the sentinels say it is. */
            if (!rc && !node_get_locked(c, "", -1))
                rc = TW_ENOMEM;
        } else if (!rc && slash && slash + 1 < end) {
            rc = parse_db(c, slash + 1, (size_t)(end - slash - 1));
        }
    }
    if (!rc && q) {
        if (strncmp(q + 1, "db=", 3))
            return bad(c, "redis: unknown option \"%.20s\" (only ?db=N)",
                       q + 1);
        rc = parse_db(c, q + 4, strlen(q + 4));
    }
    return rc;
}

/* A config field overrides the URL's part. */
static int take(char **dst, const char *field)
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

/* The TLS context: trusted CAs, client certificate, TLS 1.2 or later. */
static int tls_setup(tw__rc *c, const tw__rc_opts *o)
{
    bool files = o->tls_ca_file || o->tls_ca_dir || o->tls_cert_file ||
                 o->tls_key_file || o->tls_server_name;
    if (!c->tls)
        return files ? bad(c, "redis: TLS files are set but the address is "
                              "not rediss://")
                     : 0;
#ifndef TWHEEL_HAVE_TLS
    return bad(c, "redis: rediss:// needs TLS, and this build of twheel "
                  "has none (OpenSSL was not found)");
#else
    SSL_CTX *x = SSL_CTX_new(TLS_client_method());
    if (!x)
        return TW_ENOMEM;
    c->ssl_ctx = x;
    SSL_CTX_set_min_proto_version(x, TLS1_2_VERSION);
    SSL_CTX_set_verify(x, SSL_VERIFY_PEER, NULL);
    char b[200];
    ERR_clear_error();
    if (o->tls_ca_file || o->tls_ca_dir) {
        if (SSL_CTX_load_verify_locations(x, o->tls_ca_file, o->tls_ca_dir) !=
            1) {
            ERR_error_string_n(ERR_get_error(), b, sizeof b);
            return bad(c, "redis TLS: cannot load the CAs of \"%s\": %s",
                       o->tls_ca_file ? o->tls_ca_file : o->tls_ca_dir, b);
        }
    } else if (SSL_CTX_set_default_verify_paths(x) != 1) {
        return bad(c, "redis TLS: cannot load the system's CAs");
    }
    if (!o->tls_cert_file != !o->tls_key_file)
        return bad(c, "redis TLS: a client certificate needs both "
                      "redis_tls_cert_file and redis_tls_key_file");
    if (o->tls_cert_file) {
        if (SSL_CTX_use_certificate_chain_file(x, o->tls_cert_file) != 1) {
            ERR_error_string_n(ERR_get_error(), b, sizeof b);
            return bad(c, "redis TLS: cannot load the certificate \"%s\": %s",
                       o->tls_cert_file, b);
        }
        if (SSL_CTX_use_PrivateKey_file(x, o->tls_key_file, SSL_FILETYPE_PEM) !=
                1 ||
            SSL_CTX_check_private_key(x) != 1) {
            ERR_error_string_n(ERR_get_error(), b, sizeof b);
            return bad(c, "redis TLS: cannot use the key \"%s\": %s",
                       o->tls_key_file, b);
        }
    }
    ERR_clear_error();
    return take(&c->server_name, o->tls_server_name);
#endif
}

int tw__rc_open(tw__rc **out, const tw__rc_opts *o)
{
    if (!out || !o)
        return TW_EINVAL;
    tw__rc *c = tw__calloc(1, sizeof *c);
    if (!c)
        return TW_ENOMEM;
    pthread_mutex_init(&c->map_mu, NULL);
    int rc = 0;
    if (!o->addr || !*o->addr)
        rc = bad(c, "redis: an empty address");
    if (!rc)
        rc = parse_addr(c, o->addr);
    if (!rc && c->nnodes == 0)
        rc = bad(c, "redis: no node in the address");
    if (!rc)
        rc = take(&c->user, o->user);
    if (!rc)
        rc = take(&c->password, o->password);
    if (!rc)
        rc = take(&c->s_user, o->sentinel_user);
    if (!rc)
        rc = take(&c->s_password, o->sentinel_password);
    if (!rc && c->user && !c->password)
        rc = bad(c, "redis: a user name without a password");
    if (!rc)
        rc = tls_setup(c, o);
    if (!rc)
        rc = refresh(c);
    if (!rc && c->cluster && c->db)
        rc = bad(c, "redis: a Redis Cluster has database 0 only: drop the "
                    "database from the address");
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
        conn_close(n->conn);
        tw__free(n->obuf);
        pthread_mutex_destroy(&n->mu);
        pthread_cond_destroy(&n->cv);
        tw__free(n);
    }
#ifdef TWHEEL_HAVE_TLS
    if (c->ssl_ctx)
        SSL_CTX_free(c->ssl_ctx);
#endif
    wipe(c->user);
    wipe(c->password);
    wipe(c->s_user);
    wipe(c->s_password);
    wipe(c->server_name);
    pthread_mutex_destroy(&c->map_mu);
    tw__free(c);
}

int tw__rc_slot_node(tw__rc *c, int slot)
{
    pthread_mutex_lock(&c->map_mu);
    int n = c->slot_node[slot < 0 || slot >= RC_SLOTS ? 0 : slot];
    pthread_mutex_unlock(&c->map_mu);
    return n;
}

int tw__rc_cmd_error(tw__rc *c, const tw__rc_cmd *cmd, const char *what)
{
    /* The node that serves the command's slot now: the one that answered,
     * unless the map changed since. */
    pthread_mutex_lock(&c->map_mu);
    const struct rc_node *n =
        c->nodes[c->slot_node[cmd->slot < 0 ? 0 : cmd->slot]];
    pthread_mutex_unlock(&c->map_mu);
    return node_error(c, n, cmd, what);
}

int tw__rc_script_load(tw__rc *c, const char *src, char sha[41])
{
    const char *argv[3] = {"SCRIPT", "LOAD", src};
    size_t len[3] = {6, 4, strlen(src)};
    tw__rc_cmd cmd = {3, argv, len, -1, NULL, 0};
    int rc = tw__rc_exec(c, &cmd, 1);
    if (!rc && (!cmd.reply || cmd.reply->type != REDIS_REPLY_STRING ||
                cmd.reply->len != 40))
        rc = tw__rc_cmd_error(c, &cmd, "SCRIPT LOAD");
    if (!rc)
        memcpy(sha, cmd.reply->str, 41);
    if (cmd.reply)
        freeReplyObject(cmd.reply);
    return rc;
}

static int node_error(tw__rc *c, const struct rc_node *n, const tw__rc_cmd *cmd,
                      const char *what)
{
    if (cmd->err || !cmd->reply)
        return cmd->err ? cmd->err : TW_ECONN; /* message already recorded */
    char a[RC_HOST_MAX + 16];
    addr_str(n->host, n->port, a, sizeof a);
    const redisReply *r = cmd->reply;
    if (r->type != REDIS_REPLY_ERROR) {
        rc_seterr(c, TW_EIO, "redis %s: %s: unexpected reply (type %d)", a,
                  what, r->type);
        return TW_EIO;
    }
    int code = reply_code(r->str, TW_EIO);
    rc_seterr(c, code, "redis %s: %s: %.200s", a, what, r->str);
    return code;
}

void tw__rc_last_error(tw__rc *c, char *buf, size_t len)
{
    if (!buf || !len)
        return;
    pthread_mutex_lock(&c->map_mu);
    snprintf(buf, len, "%s", c->err);
    pthread_mutex_unlock(&c->map_mu);
}

bool tw__rc_cluster(tw__rc *c)
{
    pthread_mutex_lock(&c->map_mu);
    bool r = c->cluster;
    pthread_mutex_unlock(&c->map_mu);
    return r;
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
