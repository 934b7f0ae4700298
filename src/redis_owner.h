/* SPDX-License-Identifier: MIT */
/*
 * src/redis_owner.h - fenced shard ownership for the Redis backend
 * (src/redis_owner.c says how it works). Internal.
 */
#ifndef TW_REDIS_OWNER_H
#define TW_REDIS_OWNER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "redis_client.h"

typedef struct tw__own tw__own;

/* The fence of a shard: "epoch:node", the value of its record :o. */
#define TW__OWN_FENCE_MAX 48

/* Start owning shards of namespace @ns (@shards shards, a shard record
 * lasting @lease_ms) over @rc: register in the membership set, then a
 * thread renews, acquires and releases. @on_gain(@arg) is called (no lock
 * held) after a round that gained a shard; a round in which
 * @healthy(@arg) (may be NULL) is false sends nothing, so that the node's
 * membership and records run out and its shards move; @on_errors(@arg,
 * cmds, n) (may be NULL; no lock held) gets every round's commands with
 * their replies, to count and tell the error replies. Returns 0 or
 * TW_ENOMEM. */
int tw__own_open(tw__own **out, tw__rc *rc, const char *ns, uint32_t shards,
                 uint32_t lease_ms, void (*on_gain)(void *),
                 bool (*healthy)(void *),
                 void (*on_errors)(void *, const tw__rc_cmd *, size_t),
                 void *arg);

/* Is @shard this node's, its lease still trusted on the local monotonic
 * clock? If so, its fence into @fence (TW__OWN_FENCE_MAX bytes, not
 * NUL-ended), *@len and *@epoch; any thread. */
bool tw__own_fence(tw__own *o, uint32_t shard, char *fence, size_t *len,
                   uint64_t *epoch);

/* The name of @shard's record key, "{ns:s}:o", and its length. */
const char *tw__own_key(const tw__own *o, uint32_t shard, size_t *len);

/* This node's id (16 hex digits, NUL-ended). */
const char *tw__own_node(const tw__own *o);

/* Stop the thread; then release every shard this node holds and leave
 * the membership set (a graceful leave). NULL: nothing. */
void tw__own_close(tw__own *o);

/* Rendezvous hashing: the weight of @node for @shard (the highest weight
 * among the live nodes owns the shard). */
uint64_t tw__own_weight(const char *node, size_t len, uint32_t shard);

/* Tests: the ownership of a Redis store (src/durable_redis.c), NULL when
 * it is off. */
struct tw_durable;
tw__own *tw__durable_redis_own(struct tw_durable *d);

#endif
