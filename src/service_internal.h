/* SPDX-License-Identifier: MIT */
/*
 * src/service_internal.h - what the timer service offers the library's
 * other sources (src/repeated.c) and the tests, beyond twheel/service.h:
 * test hooks and tw__schedule_replace(). Nothing here is public API;
 * names carry the tw__ prefix. The service's own state is
 * src/service_impl.h.
 */
#ifndef TWHEEL_SERVICE_INTERNAL_H
#define TWHEEL_SERVICE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "twheel/service.h"

/* Service test hooks (src/service.c; the hook variables there too).
 * tw__service_kick: an injected spurious wake-up of the timer thread (counted
 * in stats.wakeups). tw__service_node_size: bytes of one pending task's record.
 */
struct tw_service;
void tw__service_kick(struct tw_service *s);
/* Wait until the timer thread has run a whole round that began after this
 * call (it has read the clock and its queues since) and no task is
 * dispatched or running. The service must be started. */
void tw__service_sync(struct tw_service *s);
size_t tw__service_node_size(void);
/* Threads inside tw_cancel_wait() on @s (registered to be woken). */
uint32_t tw__service_waiters(struct tw_service *s);
/* Producers @s has made (each has its own stack, count and magazine), and
 * how many of them some thread owns now. */
uint32_t tw__service_producers(struct tw_service *s, uint32_t *owned);
#ifdef TW_TEST_HOOKS
/* Writable test hooks, only in the test build of the library (the tests
 * link twheel_test, compiled with TW_TEST_HOOKS; the installed libraries
 * have no such symbols). NULL unless a test sets them.
 * tw__service_run_hook: tw_service_run() calls it after it has looked the
 * job up and before it accepts the job (a test makes a second call for the
 * same job there).
 * tw__service_started_hook: called on the running thread when a task has
 * become RUNNING, before its pending slot (one-shot) is released and
 * before its function runs. */
extern void (*tw__service_run_hook)(struct tw_service *s, uint64_t job);
extern void (*tw__service_started_hook)(struct tw_service *s, uint64_t id);
/* tw__service_xpop_hook: an executor of the built-in pool has unlinked
 * task @id from its queue and still holds the queue's lock (the task is
 * not RUNNING yet). tw__service_xdrop_hook: a cancel of a DISPATCHED task
 * @id holds the queue's lock and has read the task's state, before it
 * looks at the queue links. */
extern void (*tw__service_xpop_hook)(struct tw_service *s, uint64_t id);
extern void (*tw__service_xdrop_hook)(struct tw_service *s, uint64_t id);
/* tw__service_accepted_hook: an executor (the built-in pool's, or a
 * caller's through tw_service_run()) has accepted job @id: the task is
 * RUNNING and the run is about to begin. */
extern void (*tw__service_accepted_hook)(struct tw_service *s, uint64_t id);
/* tw__service_reserved_hook: a tw_schedule() by a producer (a thread with
 * its own count, stack and magazine) has counted its task as pending and
 * has not yet pushed it. tw__service_pushed_hook: it has pushed it and not
 * yet checked whether the service is stopping. */
extern void (*tw__service_reserved_hook)(struct tw_service *s);
extern void (*tw__service_pushed_hook)(struct tw_service *s);
/* tw__service_drained_hook: the timer thread has taken this round's cancel
 * bits and has not yet advanced its wheel. */
extern void (*tw__service_drained_hook)(struct tw_service *s);
/* tw__service_sum_hook: tw_service_pending() has read the releases and not
 * yet the reservations. */
extern void (*tw__service_sum_hook)(struct tw_service *s);
/* tw__service_lazy_hook: the timer thread has taken task @id, scheduled
 * with TW_SERVICE_LAZY_CLOCK, off a submission stack and set its deadline
 * from @now, its reading of the service's relative time in ns (read for
 * this node or for an earlier one), before it adds the task to the wheel
 * and takes the next submission. */
extern void (*tw__service_lazy_hook)(struct tw_service *s, uint64_t id,
                                     uint64_t now);
/* tw__service_ring_hook: the timer thread (or stop) has found task @id
 * waiting in a producer's ring slot, before it tries to take it (@taken
 * false), and again once it has taken it and not yet moved the task's
 * state word on (@taken true). */
extern void (*tw__service_ring_hook)(struct tw_service *s, uint64_t id,
                                     bool taken);
/* tw__service_cancel_ring_hook: a cancel of task @id by a thread other
 * than its ring's owner has read the task's state word (in a ring) and
 * not yet the producer's ring. */
extern void (*tw__service_cancel_ring_hook)(struct tw_service *s, uint64_t id);
#endif
/* tw_schedule() of a one-shot task that keeps its pending slot while it
 * runs and takes over the slot of task @old (0: none; @old must be a task
 * of this function) as the call's last step: by cancelling @old
 * (*@old_cancelled says whether that cancel won), or, when @old is
 * running, by releasing its slot in its place; so at max_pending the new
 * task takes over the old one's slot, even from inside @old's run. If @old
 * is gone the call is a plain tw_schedule(). On failure nothing changed:
 * @old is not cancelled. */
int tw__schedule_replace(struct tw_service *s, tw_task_fn fn, void *arg,
                         uint64_t delay_ns, tw_id old, bool *old_cancelled,
                         tw_id *id);

#endif
