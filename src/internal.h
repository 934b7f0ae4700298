/* SPDX-License-Identifier: MIT */
/*
 * src/internal.h - declarations shared by twheel's sources and its tests.
 * Nothing here is public API; names carry the tw__ prefix.
 */
#ifndef TWHEEL_INTERNAL_H
#define TWHEEL_INTERNAL_H

#include "twheel/repeated.h"
#include "twheel/wheel.h"

#include "common.h" /* tw__malloc & co, tw__config_copy */

/* A cache line of padding in a struct, so that the fields on either side do
 * not share one (the name tells the pads of one struct apart). */
#define PAD(n) char pad##n[64]

#if UINTPTR_MAX == UINT64_MAX
_Static_assert(sizeof(tw_timer) == 40, "a timer is 40 bytes on LP64");
#endif

/* The TW_LATE_BUCKETS bucket of a run that started @late_us microseconds
 * after its due time (see twheel/wheel.h). */
static inline unsigned tw__late_bucket(uint64_t late_us)
{
    unsigned b = late_us ? 64u - (unsigned)__builtin_clzll(late_us) : 0u;
    return b < TW_LATE_BUCKETS - 1 ? b : TW_LATE_BUCKETS - 1;
}

/* Core wheel invariant checkers: 0 when consistent, else the source line
 * of the first broken rule. tw__wheel_check is O(timers + occupied slots),
 * tw__wheel_check_full also scans every slot and bitmap word. */
int tw__wheel_check(const tw_wheel *w);
int tw__wheel_check_full(const tw_wheel *w);
/* Slots marked occupied whose lists are all empty: left so by
 * tw_wheel_cancel_inline() until tw_wheel_advance() visits them. */
size_t tw__wheel_stale_slots(const tw_wheel *w);

/* Make @w call @fire(t, @arg) for every timer it runs, instead of each
 * timer's own function: the wheel then never reads a timer's tw__fn, and
 * a user of the wheel (the service) may keep other data in its place.
 * Call before the first add. */
void tw__wheel_set_fire(tw_wheel *w, tw_timer_fn fire, void *arg);
/* tw_wheel_add() and tw_wheel_add_window() for such a wheel: @w and @t
 * valid (latest >= earliest), and @t's tw__fn is not read. */
int tw__wheel_add_any(tw_wheel *w, tw_timer *t, uint64_t expires);
int tw__wheel_add_window_any(tw_wheel *w, tw_timer *t, uint64_t earliest,
                             uint64_t latest);

/* Service test hooks (src/service.c). tw__service_kick: an injected
 * spurious wake-up of the timer thread (counted in stats.wakeups).
 * tw__service_node_size: bytes of one pending task's record. */
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
/* tw__fence_heavy_hook: tw__fence_heavy() (src/fence.h) is about to make
 * the other threads execute a full barrier. */
extern void (*tw__fence_heavy_hook)(void);
/* tw__durable_index_hook: a journal listing that builds the ordered index
 * has let go of the store's lock between two steps of the build. */
struct tw_durable;
extern void (*tw__durable_index_hook)(struct tw_durable *d);
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

/*
 * RepeatedTimer on any scheduler with the tw_schedule()/tw_cancel()
 * contract: tw_repeated_create() uses a tw_service; tests use a virtual
 * clock. The scheduler must outlive the timer (see repeated.h).
 */
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
int tw__repeated_create_on(tw_repeated **out, const tw__sched *sched,
                           const tw_repeated_config *cfg);
/* The task function every RepeatedTimer schedules. */
void tw__repeated_task(tw_id id, void *arg);

/* Durable store test hooks of the journal backend (tw__durable_sync in
 * src/durable_journal_fire.c, the others in src/durable_journal.c).
 * tw__durable_sync returns once the store's thread has run a whole round
 * that began after the call (read the wall clock, fired what is due,
 * compacted) and every callback it started has returned.
 * tw__durable_entry_size: bytes of one pending timer's record with a key of
 * @key_len bytes. tw__durable_table: the journal key table's bucket count and,
 * while it grows, the previous table's (else 0). */
struct tw_durable;
void tw__durable_sync(struct tw_durable *d);
size_t tw__durable_entry_size(size_t key_len);
void tw__durable_table(struct tw_durable *d, size_t *nbuckets, size_t *nold);

#endif
