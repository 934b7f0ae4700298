/* SPDX-License-Identifier: MIT */
/*
 * src/redis_groups.c - which Redis master holds each shard of the Redis
 * backend: the shards of one master form a group, and each group has its
 * own claimer and its own worker (src/redis_fire.c), so that a master
 * that stalls holds only its own shards. Read from CLUSTER SLOTS at open
 * and then by the topology thread every TOPOLOGY_MS (src/redis_fire.c).
 *
 * Any thread; takes d->mu for the map. The round trip is made without
 * it.
 */
#define _GNU_SOURCE

#include <stdio.h>
#include <stdlib.h>

#include "durable_redis_impl.h"

/* Which master holds each shard (CLUSTER SLOTS): the shards of one master
 * form a group with its own thread. A server without cluster support, or
 * no answer, changes nothing (everything starts in group 0). Groups only
 * say which thread waits for which node: a stale map is never wrong, only
 * less independent. The topology thread, and open. */
void tw__rd_grp_refresh(struct rd *d)
{
    const char *argv[2] = {"CLUSTER", "SLOTS"};
    size_t len[2] = {7, 5};
    tw__rc_cmd cmd = {2, argv, len, -1, NULL, 0};
    uint8_t *of = tw__malloc(d->shards);
    if (!of || tw__rc_exec(d->rc, &cmd, 1) || !cmd.reply ||
        cmd.reply->type != REDIS_REPLY_ARRAY) {
        tw__rc_free_replies(&cmd, 1);
        tw__free(of);
        return;
    }
    redisReply *r = cmd.reply;
    pthread_mutex_lock(&d->mu);
    for (uint32_t s = 0; s < d->shards; s++) {
        of[s] = d->grp_of[s];
        int slot = d->sk[s].slot;
        for (size_t i = 0; i < r->elements; i++) {
            redisReply *e = r->element[i];
            if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
                e->element[0]->type != REDIS_REPLY_INTEGER ||
                e->element[1]->type != REDIS_REPLY_INTEGER ||
                e->element[2]->type != REDIS_REPLY_ARRAY ||
                e->element[2]->elements < 2 ||
                e->element[2]->element[0]->type != REDIS_REPLY_STRING ||
                e->element[2]->element[1]->type != REDIS_REPLY_INTEGER ||
                slot < e->element[0]->integer || slot > e->element[1]->integer)
                continue;
            char name[64];
            snprintf(name, sizeof name, "%s:%lld",
                     e->element[2]->element[0]->str,
                     e->element[2]->element[1]->integer);
            uint32_t g = 0;
            while (g < d->ngrp && strcmp(d->grp_name[g], name))
                g++;
            if (g == d->ngrp && d->ngrp < GROUPS_MAX)
                snprintf(d->grp_name[d->ngrp++], 64, "%s", name);
            of[s] = (uint8_t)(g < d->ngrp ? g : s % GROUPS_MAX);
            break;
        }
    }
    memcpy(d->grp_of, of, d->shards);
    pthread_mutex_unlock(&d->mu);
    tw__rc_free_replies(&cmd, 1);
    tw__free(of);
}
