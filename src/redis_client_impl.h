/* SPDX-License-Identifier: MIT */
/*
 * src/redis_client_impl.h - what the files of the Redis client share: the
 * client (struct tw__rc), its nodes, connections and queued requests, and
 * the functions one file calls in another. The client in files, each
 * calling only files listed above it (no file calls back into one that
 * calls it):
 *   src/redis_error.c     failures as codes and messages
 *   src/redis_tls.c       TLS with OpenSSL: the context (CAs, client
 *                         certificate), the handshake, TLS reads and writes
 *   src/redis_net.c       sockets: connect with a timeout, read, write,
 *                         hiredis's reader (replies) and formatter
 *   src/redis_connect.c   a node's connection: set-up (TLS, AUTH, SELECT,
 *                         ROLE), Sentinel's answer, back-off after failure
 *   src/redis_batch.c     per-node queues: a flusher writes every queued
 *                         request in one go and reads every reply
 *   src/redis_topology.c  cluster topology: key slots, the node table, the
 *                         slot map (CLUSTER SLOTS) and its refresh
 *   src/redis_addr.c      addresses and URLs: "host:port[,...]",
 *                         redis://, rediss://, unix://, redis-sentinel://
 *   src/redis_client.c    the command layer: open, close, run commands
 *                         (routing, redirects, retries)
 * Internal; names carry the tw__rc prefix.
 *
 * Locks: c->map_mu guards the node table, the slot map, the counters and
 * the last message; a node's mu guards its queue and flags, and its
 * connection is used by its flusher only (busy). Neither lock is taken
 * while the other is held.
 */
#ifndef TWHEEL_REDIS_CLIENT_IMPL_H
#define TWHEEL_REDIS_CLIENT_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include <hiredis/read.h>
#ifdef TWHEEL_HAVE_TLS
#include <openssl/ssl.h>
#endif

#include "clock.h"
#include "redis_client.h"

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

static inline uint64_t rc_mono_ns(void)
{
    return tw__clock_ns(CLOCK_MONOTONIC);
}

/* Sockets and the reply reader (src/redis_net.c). Each failure says why
 * in @why. */
int tw__rc_sock_open(const char *host, int port, int *fdp, char *why,
                     size_t wlen);
void tw__rc_conn_close(struct rc_conn *k);
int tw__rc_conn_write(struct rc_conn *k, const char *p, size_t n, char *why,
                      size_t wlen);
int tw__rc_conn_get(struct rc_conn *k, redisReply **out, char *why,
                    size_t wlen);
int tw__rc_conn_call(struct rc_conn *k, int argc, const char **argv,
                     redisReply **rep, char *why, size_t wlen);

/* TLS (src/redis_tls.c). */
int tw__rc_tls_setup(tw__rc *c, const tw__rc_opts *o);
void tw__rc_tls_free(tw__rc *c);
#ifdef TWHEEL_HAVE_TLS
int tw__rc_tls_start(tw__rc *c, struct rc_conn *k, const char *host, char *why,
                     size_t wlen);
ssize_t tw__rc_tls_write(struct rc_conn *k, const char *p, size_t n, char *why,
                         size_t wlen);
ssize_t tw__rc_tls_read(struct rc_conn *k, char *p, size_t n, char *why,
                        size_t wlen);
#endif

/* Addresses (src/redis_addr.c). */
int tw__rc_parse_addr(tw__rc *c, const char *s);
int tw__rc_take(char **dst, const char *field);

/* A node's connection (src/redis_connect.c). */
bool tw__rc_node_up(tw__rc *c, struct rc_node *n);
void tw__rc_node_fail(tw__rc *c, struct rc_node *n, const char *why);

/* The topology (src/redis_topology.c). map_mu held for the _locked one. */
struct rc_node *tw__rc_node_get_locked(tw__rc *c, const char *host, int port);
int tw__rc_refresh(tw__rc *c);
void tw__rc_refresh_if_stale(tw__rc *c);
struct rc_node *tw__rc_redirect_target(tw__rc *c, const char *msg);

/* Per-node queues (src/redis_batch.c). */
void tw__rc_node_serve(tw__rc *c, struct rc_node *n, bool (*done)(void *),
                       void *arg);
void tw__rc_nodes_start(tw__rc *c, struct rc_node **used, size_t nused,
                        struct flight *f);
void tw__rc_run_one(tw__rc *c, struct rc_node *n, tw__rc_cmd *cmd);

/* Codes and messages (src/redis_error.c). */
void tw__rc_addr_str(const char *host, int port, char *buf, size_t len);
void tw__rc_io_why(int e, const char *op, char *why, size_t wlen);
__attribute__((format(printf, 3, 4))) void tw__rc_seterr(tw__rc *c, int code,
                                                         const char *fmt, ...);
__attribute__((format(printf, 2, 3))) int tw__rc_bad(tw__rc *c, const char *fmt,
                                                     ...);
int tw__rc_reply_code(const char *text, int other);
int tw__rc_node_error(tw__rc *c, const struct rc_node *n, const tw__rc_cmd *cmd,
                      const char *what);

#endif
