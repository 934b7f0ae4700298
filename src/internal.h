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

#ifdef TW_TEST_HOOKS
/* tw__fence_heavy_hook: tw__fence_heavy() (src/fence.h) is about to make
 * the other threads execute a full barrier. */
extern void (*tw__fence_heavy_hook)(void);
/* tw__durable_index_hook: a journal listing that builds the ordered index
 * has let go of the store's lock between two steps of the build. */
struct tw_durable;
extern void (*tw__durable_index_hook)(struct tw_durable *d);
#endif
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
