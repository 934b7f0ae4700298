/* SPDX-License-Identifier: MIT */
/*
 * twheel/repeated.h - a RepeatedTimer on a tw_service, in the manner of
 * SOFAJRaft's (election, vote, step-down and snapshot timers).
 *
 * A RepeatedTimer calls on_trigger again and again, each run scheduled
 * timeout_ns after the previous run returned (fixed delay), so runs never
 * overlap. An optional adjust_timeout hook picks the delay before every
 * scheduling (a randomized election timeout, for example).
 *
 * Thread safety: every function may be called from any thread at the same
 * time, on_trigger included, except that tw_repeated_destroy() ends the
 * caller's use of the handle: no call may follow it or race with it on the
 * same timer. Each timer has its own mutex; on_trigger runs without it held
 * (on the service's timer or executor thread, or on the caller's thread for
 * tw_repeated_run_once_now()); adjust_timeout runs with it held and must not
 * call tw_repeated_* on the same timer.
 *
 * Lifetime: the timer's memory belongs to twheel. tw_repeated_destroy()
 * stops it and returns at once; on_destroy then runs exactly once, after any
 * run in progress has returned, as the last call that touches the timer,
 * so it may free arg.
 *
 * The service must outlive its timers: destroy every RepeatedTimer before
 * tw_service_stop(), or give the tasks tw_service_stop() hands back to
 * tw_repeated_unprocessed(); a RepeatedTimer task that the service drops
 * (stop with a NULL callback, tw_service_destroy) keeps its timer's memory,
 * and its on_destroy, from ever being released.
 */
#ifndef TWHEEL_REPEATED_H
#define TWHEEL_REPEATED_H

#include <stdbool.h>
#include <stdint.h>

#include "twheel/base.h" /* TW_VERSION_*, TW_E*, tw_strerror() */
#include "twheel/service.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tw_repeated tw_repeated;

/* on_trigger and on_destroy: @arg is tw_repeated_config.arg. */
typedef void (*tw_repeated_fn)(tw_repeated *rt, void *arg);

/*
 * Returns the delay in ns before the next run, given the configured
 * @timeout_ns. 0 is taken as 1 ns; the service clamps what would overflow
 * to "never".
 */
typedef uint64_t (*tw_adjust_fn)(tw_repeated *rt, uint64_t timeout_ns,
                                 void *arg);

/* What a RepeatedTimer runs, and how often. */
typedef struct tw_repeated_config {
    const char *name;            /* copied; NULL = "" */
    uint64_t timeout_ns;         /* > 0 */
    tw_repeated_fn on_trigger;   /* required */
    tw_adjust_fn adjust_timeout; /* NULL = use timeout_ns as it is */
    tw_repeated_fn on_destroy;   /* NULL = none */
    void *arg;                   /* passed to the three callbacks */
} tw_repeated_config;

/**
 * tw_repeated_create - make a stopped RepeatedTimer.
 * @out: receives the timer; left as it was on failure.
 * @s: the service it schedules on; must outlive the timer.
 * @cfg: what it runs and how often.
 *
 * Context: any thread.
 * Return: 0, TW_EINVAL (NULL @out, @s or @cfg, no on_trigger, zero
 * timeout) or TW_ENOMEM.
 */
TW_EXTERN int tw_repeated_create(tw_repeated **out, tw_service *s,
                                 const tw_repeated_config *cfg);

/**
 * tw_repeated_create_sized - tw_repeated_create() for a config struct of a
 * given size.
 * @out: as tw_repeated_create().
 * @s: as tw_repeated_create().
 * @cfg: as tw_repeated_create().
 * @cfg_size: the size of *@cfg as the caller's header declares it.
 *
 * The plain name is a macro passing sizeof(tw_repeated_config). Same rules
 * as tw_service_create_sized().
 *
 * Context: any thread.
 * Return: as tw_repeated_create().
 */
TW_EXTERN int tw_repeated_create_sized(tw_repeated **out, tw_service *s,
                                       const tw_repeated_config *cfg,
                                       size_t cfg_size);
/* tw_repeated_create() as a call of the sized form with this header's size. */
#define tw_repeated_create(out, s, cfg)                                        \
    tw_repeated_create_sized((out), (s), (cfg), sizeof(tw_repeated_config))

/**
 * tw_repeated_start - schedule the first run, a timeout from now.
 * @rt: the timer.
 *
 * A no-op (returning 0) if the timer is started already and has a run
 * scheduled; a started timer whose re-arm failed (see
 * tw_repeated_rearm_failures()) is armed again.
 *
 * Context: any thread, on_trigger included.
 * Return: 0, TW_EINVAL (NULL), TW_ESHUTDOWN (destroyed, or the service is
 * stopped) or another tw_schedule() error; on error the timer stays
 * stopped.
 */
TW_EXTERN int tw_repeated_start(tw_repeated *rt);

/**
 * tw_repeated_stop - cancel the pending run.
 * @rt: the timer, or NULL (a no-op).
 *
 * No new run starts until the next tw_repeated_start() or
 * tw_repeated_restart(). A run in progress finishes and does not
 * reschedule. A no-op if stopped.
 *
 * Context: any thread, on_trigger included. Does not wait.
 */
TW_EXTERN void tw_repeated_stop(tw_repeated *rt);

/**
 * tw_repeated_restart - start the timer and reschedule its next run a
 * timeout from now, whether or not it was running.
 * @rt: the timer.
 *
 * Context: any thread, on_trigger included (then the next run is scheduled
 * when on_trigger returns, as always).
 * Return: as tw_repeated_start(); on error nothing changed.
 */
TW_EXTERN int tw_repeated_restart(tw_repeated *rt);

/**
 * tw_repeated_reset - set the timeout and, if started, push the next run a
 * timeout from now.
 * @rt: the timer.
 * @timeout_ns: the new timeout; 0 keeps the current one.
 *
 * Called on every heartbeat, it keeps an election timer from firing. A
 * stopped timer only takes the new timeout. The new run replaces the
 * pending one in a single service call, so a reset (or restart) works on a
 * service that is exactly at max_pending.
 *
 * Context: any thread, on_trigger included.
 * Return: 0, TW_EINVAL (NULL), TW_ESHUTDOWN (destroyed) or a tw_schedule()
 * error (nothing changed).
 */
TW_EXTERN int tw_repeated_reset(tw_repeated *rt, uint64_t timeout_ns);

/**
 * tw_repeated_run_once_now - run on_trigger now on the calling thread.
 * @rt: the timer.
 *
 * Cancels the pending run, runs on_trigger, then, if the timer is started,
 * schedules the next run a timeout after it returned. Works on a stopped
 * timer too (one run, no rescheduling).
 *
 * Context: any thread, but not from the timer's own on_trigger (TW_EBUSY).
 * Return: 0; TW_EINVAL (NULL); TW_ESHUTDOWN (destroyed); TW_EBUSY if a run
 * is in progress (runs never overlap: nothing was done); or a tw_schedule()
 * error for the rescheduling (the run took place; the failure is counted
 * as in tw_repeated_rearm_failures() and the timer has no run scheduled
 * until the next start, restart or reset).
 */
TW_EXTERN int tw_repeated_run_once_now(tw_repeated *rt);

/**
 * tw_repeated_destroy - stop the timer and give it up.
 * @rt: the timer, or NULL (a no-op). Must not be used after this call.
 *
 * on_destroy runs exactly once: before this returns when no run is in
 * progress, otherwise on the running thread after on_trigger returns. A
 * run that the service had already started but that had not yet reached
 * on_trigger counts as in progress: it skips on_trigger and runs
 * on_destroy on its thread, shortly after this returns.
 *
 * Context: any thread, on_trigger of this timer included (its on_destroy
 * then runs after on_trigger returns).
 */
TW_EXTERN void tw_repeated_destroy(tw_repeated *rt);

/**
 * tw_repeated_rearm_failures - how many times scheduling the next run
 * after a run failed.
 * @rt: the timer, or NULL.
 *
 * After a run the next one is scheduled in the slot the run's own task
 * held, so max_pending cannot make it fail; a failure (TW_ENOMEM when the
 * service's record pool must grow and memory is out, or TW_EAGAIN from
 * tw_repeated_run_once_now() on a service at max_pending) is retried a few
 * times, then counted here. The timer never stops by itself: it stays
 * started with no run scheduled, and the next tw_repeated_start(),
 * tw_repeated_restart() or tw_repeated_reset() arms it. A stopped service
 * (TW_ESHUTDOWN) stops the timer and is not counted.
 *
 * Context: any thread.
 * Return: the count; 0 for NULL.
 */
TW_EXTERN uint64_t tw_repeated_rearm_failures(const tw_repeated *rt);

/* tw_repeated_name - the name given at creation (never NULL). */
TW_EXTERN const char *tw_repeated_name(const tw_repeated *rt);

/**
 * tw_repeated_unprocessed - a tw_unprocessed_fn for tw_service_stop().
 * @id: the task handed back.
 * @fn: its function.
 * @arg: its argument.
 * @ctx: unused.
 *
 * A task of a RepeatedTimer (tw_repeated_owns(@fn)) is taken back: its
 * timer becomes stopped and is destroyed as usual. Other tasks are
 * ignored: a caller with tasks of its own calls this from its own callback
 * for the tasks tw_repeated_owns().
 *
 * Context: as the callback of tw_service_stop().
 */
TW_EXTERN void tw_repeated_unprocessed(tw_id id, tw_task_fn fn, void *arg,
                                       void *ctx);

/* tw_repeated_owns - true if @fn is the task function of RepeatedTimers. */
TW_EXTERN bool tw_repeated_owns(tw_task_fn fn);

#ifdef __cplusplus
}
#endif
#endif /* TWHEEL_REPEATED_H */
