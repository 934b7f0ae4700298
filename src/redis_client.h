/* SPDX-License-Identifier: MIT */
/*
 * src/redis_client.h - a small Redis / Redis Cluster / Sentinel client for
 * the durable Redis backend: hiredis's reply reader and command formatter
 * over our own sockets, plain or TLS (OpenSSL). Internal; names carry the
 * tw__rc prefix.
 *
 * Calls from many threads are batched: a thread that finds a node's
 * connection idle sends every command queued for that node in one write and
 * reads their replies in one pass (one round trip), while the others wait
 * for their replies. Cluster routing: CRC16 key slots and CLUSTER SLOTS;
 * MOVED refreshes the map and retries, ASK retries once on the named node
 * after ASKING. A node whose connection fails is retried with back-off;
 * until then its commands fail with TW_ECONN at once. The client's files
 * (network, TLS, addresses, connections, topology, queues, commands) are
 * listed in src/redis_client_impl.h.
 */
#ifndef TWHEEL_REDIS_CLIENT_H
#define TWHEEL_REDIS_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <hiredis/hiredis.h>

typedef struct tw__rc tw__rc;

/* One command. The caller fills argc/argv/argvlen and slot (the key's slot,
 * or -1 for "any node"); tw__rc_exec fills reply (free with
 * freeReplyObject) and err (0, or TW_ECONN when no reply came: the command
 * may or may not have run). A Redis error reply is err 0 and a reply of
 * type REDIS_REPLY_ERROR. */
typedef struct tw__rc_cmd {
    int argc;
    const char **argv;
    const size_t *argvlen;
    int slot;
    redisReply *reply;
    int err;
} tw__rc_cmd;

/* The slot of a key (hash tags honoured). */
int tw__rc_slot(const void *key, size_t len);

/* The most nodes a client knows (masters, replicas that were promoted). */
#define TW__RC_NODES_MAX 64

/* The node that serves @slot in the current slot map: an index below
 * TW__RC_NODES_MAX, the same for every slot of one node for the life of
 * the client (a promoted replica is another node). */
int tw__rc_slot_node(tw__rc *c, int slot);

/* What tw__rc_open needs: the address (cfg.redis: "host:port[,...]" or a
 * URL), the secrets and TLS files of tw_durable_config (NULL = unset), and
 * where to say why an open failed. */
typedef struct tw__rc_opts {
    const char *addr;
    const char *user, *password;
    const char *sentinel_user, *sentinel_password;
    const char *tls_ca_file, *tls_ca_dir, *tls_cert_file, *tls_key_file;
    const char *tls_server_name;
    char *errbuf;
    size_t errbuf_len;
} tw__rc_opts;

/* Connect to the first reachable seed (or the master the sentinels name),
 * authenticate, select the database and load the slot map. 0, TW_EINVAL
 * (bad address or TLS files), TW_ECONN, TW_EAUTH, TW_EIO or TW_ENOMEM; on
 * failure o->errbuf says why, with the address and never a secret. */
int tw__rc_open(tw__rc **out, const tw__rc_opts *o);
void tw__rc_close(tw__rc *c);

/* A command's failure as a code, with a message for tw__rc_last_error:
 * "redis ADDR: WHAT: <Redis's text>" for an error reply (TW_EAUTH for
 * NOAUTH, WRONGPASS and NOPERM, TW_EIO for any other), or the connection's
 * last failure for an err. */
int tw__rc_cmd_error(tw__rc *c, const tw__rc_cmd *cmd, const char *what);

/* Whether @c talks to a Redis Cluster (CLUSTER SLOTS answered): the keys
 * of one command must then share a slot. Otherwise one server holds every
 * slot, and a command may name keys of any slots. */
bool tw__rc_cluster(tw__rc *c);

/* Free the replies of @n commands (NULL ones skipped). */
void tw__rc_free_replies(tw__rc_cmd *cmds, size_t n);

/* The last failure's message (NUL-ended, truncated to @len). */
void tw__rc_last_error(tw__rc *c, char *buf, size_t len);

/* Run @n commands, pipelined per node and batched with other threads'.
 * Returns 0 when every command has a reply, else the first err. */
int tw__rc_exec(tw__rc *c, tw__rc_cmd *cmds, size_t n);

/* Counters for tests: round trips (batches written), redirects followed,
 * map refreshes, reconnects. */
typedef struct tw__rc_stats {
    uint64_t batches, commands, moved, ask, refreshes, reconnects;
} tw__rc_stats;
void tw__rc_stats_get(tw__rc *c, tw__rc_stats *out);

/* Test hook (src/durable_redis.c): the client counters of a Redis-backed
 * store. */
struct tw_durable;
void tw__durable_redis_client_stats(struct tw_durable *d, tw__rc_stats *out);

#endif
