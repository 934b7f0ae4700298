/* SPDX-License-Identifier: MIT */
/*
 * src/repeated_internal.h - the seam under RepeatedTimer (src/repeated.c):
 * a RepeatedTimer runs on any scheduler with the tw_schedule()/tw_cancel()
 * contract. tw_repeated_create() uses a tw_service; the tests use a
 * virtual clock through tw__repeated_create_on(). Nothing here is public
 * API; names carry the tw__ prefix.
 */
#ifndef TWHEEL_REPEATED_INTERNAL_H
#define TWHEEL_REPEATED_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "twheel/repeated.h"

/* A scheduler. It must outlive the timers made on it (see repeated.h). */
typedef struct tw__sched {
    int (*schedule)(void *ctx, tw_task_fn fn, void *arg, uint64_t delay_ns,
                    tw_id *id);
    bool (*cancel)(void *ctx, tw_id id);
    void *ctx;
    /* Optional (NULL: schedule, then cancel): schedule and cancel @old in
     * one call, as tw__schedule_replace(). */
    int (*replace)(void *ctx, tw_task_fn fn, void *arg, uint64_t delay_ns,
                   tw_id old, bool *old_cancelled, tw_id *id);
} tw__sched;
/* tw_repeated_create() on @sched instead of a service. */
int tw__repeated_create_on(tw_repeated **out, const tw__sched *sched,
                           const tw_repeated_config *cfg);
/* The task function every RepeatedTimer schedules. */
void tw__repeated_task(tw_id id, void *arg);

#endif
