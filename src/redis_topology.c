/* SPDX-License-Identifier: MIT */
/*
 * src/redis_topology.c - the Redis client's cluster topology
 * (src/redis_client_impl.h says which file does what): a key's slot, the
 * node table, the slot map and its refresh, redirect targets.
 *
 * Slots. CRC16-CCITT (XMODEM) of the key, or of its hash tag (the text
 * between the first '{' and the next '}', when not empty), modulo 16384,
 * as Redis Cluster computes them.
 *
 * The slot map (16384 entries, each a node index) is read under map_mu and
 * replaced whole by a refresh (CLUSTER SLOTS, from the first node that
 * answers). A server without cluster support answers CLUSTER SLOTS with an
 * error: then every slot is that node's. A MOVED reply refreshes the map
 * (at most once per 20 ms: one refresh per storm of MOVED, not one per
 * command); MOVED and ASK name their node, which joins the table.
 *
 * Nodes are added (seeds, CLUSTER SLOTS, redirects) and never freed before
 * close, so a pointer to one, or its index, stays valid for the client's
 * life; a promoted replica is another node. Any thread.
 */
#define _GNU_SOURCE

#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "redis_client_impl.h"

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
struct rc_node *tw__rc_node_get_locked(tw__rc *c, const char *host, int port)
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

/* CLUSTER SLOTS' reply @rep from node @from into the slot map; map_mu
 * held. */
static void map_cluster_slots(tw__rc *c, const redisReply *rep,
                              const struct rc_node *from)
{
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
                               : from->host;
        struct rc_node *node =
            tw__rc_node_get_locked(c, host, (int)m->element[1]->integer);
        if (!node)
            continue;
        int16_t idx = (int16_t)node_index(c, node);
        for (long long s = r->element[0]->integer;
             s <= r->element[1]->integer && s < RC_SLOTS; s++)
            if (s >= 0)
                c->slot_node[s] = idx;
    }
}

/* Node @from answered CLUSTER SLOTS with @rep (an array, or the error of
 * a server without cluster support): the new map. */
static void map_replace(tw__rc *c, const redisReply *rep,
                        const struct rc_node *from)
{
    pthread_mutex_lock(&c->map_mu);
    if (rep->type == REDIS_REPLY_ERROR) {
        /* Not a cluster: this node serves every slot. */
        int16_t idx = (int16_t)node_index(c, from);
        for (int s = 0; s < RC_SLOTS; s++)
            c->slot_node[s] = idx;
    } else if (rep->type == REDIS_REPLY_ARRAY) {
        map_cluster_slots(c, rep, from);
    }
    c->st.refreshes++;
    c->last_refresh_ns = rc_mono_ns();
    pthread_mutex_unlock(&c->map_mu);
}

/* Load the slot map from any reachable node. 0, or the last node's
 * failure code (its message recorded). */
int tw__rc_refresh(tw__rc *c)
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
        tw__rc_run_one(c, list[i], &cmd);
        redisReply *rep = cmd.reply;
        if (cmd.err || !rep) {
            rc = cmd.err ? cmd.err : TW_ECONN;
            continue;
        }
        if (rep->type == REDIS_REPLY_ERROR &&
            !strstr(rep->str, "cluster support disabled")) {
            /* NOAUTH, NOPERM, LOADING...: not an answer. */
            rc = tw__rc_node_error(c, list[i], &cmd, "CLUSTER SLOTS");
            freeReplyObject(rep);
            continue;
        }
        map_replace(c, rep, list[i]);
        freeReplyObject(rep);
        return 0;
    }
    return rc;
}

/* A refresh per MOVED storm, not per command. */
void tw__rc_refresh_if_stale(tw__rc *c)
{
    uint64_t now = rc_mono_ns();
    pthread_mutex_lock(&c->map_mu);
    bool stale = now - c->last_refresh_ns > 20000000u;
    pthread_mutex_unlock(&c->map_mu);
    if (stale)
        tw__rc_refresh(c);
}

/* "MOVED 3999 127.0.0.1:6381" / "ASK ...": the target node, or NULL. */
struct rc_node *tw__rc_redirect_target(tw__rc *c, const char *msg)
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
    struct rc_node *n = tw__rc_node_get_locked(c, host, atoi(colon + 1));
    pthread_mutex_unlock(&c->map_mu);
    return n;
}

int tw__rc_slot_node(tw__rc *c, int slot)
{
    pthread_mutex_lock(&c->map_mu);
    int n = c->slot_node[slot < 0 || slot >= RC_SLOTS ? 0 : slot];
    pthread_mutex_unlock(&c->map_mu);
    return n;
}

bool tw__rc_cluster(tw__rc *c)
{
    pthread_mutex_lock(&c->map_mu);
    bool r = c->cluster;
    pthread_mutex_unlock(&c->map_mu);
    return r;
}
