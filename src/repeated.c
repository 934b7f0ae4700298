/* SPDX-License-Identifier: MIT */
/*
 * src/repeated.c - RepeatedTimer (twheel/repeated.h) on a tw_service.
 *
 * Each timer is a small state machine under its own mutex:
 *
 *   stopped    no new run may be scheduled (set by stop and destroy)
 *   destroyed  the owner gave the handle up
 *   invoking   on_trigger is running (at most one run at a time)
 *   pending    the id of the one service task that may start the next run,
 *              0 if none
 *   refs       1 for the owner (until destroy) + 1 for every service task
 *              that may still call us: scheduled and neither cancelled
 *              successfully, nor finished, nor handed back by stop
 *
 * A task whose id is no longer `pending` is stale: it was cancelled after
 * the service had already taken it to run. It only drops its reference.
 * Whoever drops the last reference runs on_destroy and frees the timer, so
 * on_destroy is the last thing that touches it, exactly once, and never
 * while a run is in progress.
 *
 * While on_trigger runs, nothing is scheduled: when it returns the next run
 * is scheduled (fixed delay) unless the timer was stopped meanwhile. So a
 * restart or reset from inside on_trigger needs no special case. That
 * re-arm takes over the running task's own pending slot (its task was
 * scheduled with tw__schedule_replace(), which keeps the slot while it
 * runs), so max_pending can never break the chain of runs. A re-arm that
 * fails all the same (TW_ENOMEM) is retried a few times, then counted
 * (tw_repeated_rearm_failures()); the timer stays started, and the next
 * start, restart or reset arms it. It never stops by itself.
 *
 * Lock order: a timer's mutex, then whatever the scheduler takes inside
 * tw_schedule()/tw_cancel(), which never wait for a task to finish.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "repeated_internal.h"
#include "service_internal.h"
#include "twheel/repeated.h"

struct tw_repeated {
    pthread_mutex_t mu;
    tw__sched sched;
    tw_repeated_config cfg; /* cfg.name points into name[] below */
    tw_id pending;
    _Atomic uint64_t failures; /* re-arms after a run that failed */
    uint32_t refs;
    bool stopped, destroyed, invoking;
    char name[]; /* NUL-terminated copy of the configured name */
};

/* Adapters from tw__sched to a tw_service. */
static int svc_schedule(void *ctx, tw_task_fn fn, void *arg, uint64_t delay,
                        tw_id *id)
{
    return tw_schedule(ctx, fn, arg, delay, id);
}

static bool svc_cancel(void *ctx, tw_id id)
{
    return tw_cancel(ctx, id);
}

static int svc_replace(void *ctx, tw_task_fn fn, void *arg, uint64_t delay,
                       tw_id old, bool *old_cancelled, tw_id *id)
{
    return tw__schedule_replace(ctx, fn, arg, delay, old, old_cancelled, id);
}

int tw__repeated_create_on(tw_repeated **out, const tw__sched *sched,
                           const tw_repeated_config *cfg)
{
    const char *name;
    size_t len;
    tw_repeated *rt;

    if (out == NULL || sched == NULL || sched->schedule == NULL ||
        sched->cancel == NULL || cfg == NULL || cfg->on_trigger == NULL ||
        cfg->timeout_ns == 0)
        return TW_EINVAL;
    name = cfg->name != NULL ? cfg->name : "";
    len = strlen(name);
    rt = tw__calloc(1, sizeof *rt + len + 1);
    if (rt == NULL)
        return TW_ENOMEM;
    if (pthread_mutex_init(&rt->mu, NULL) != 0) {
        tw__free(rt);
        return TW_ENOMEM;
    }
    memcpy(rt->name, name, len + 1);
    rt->sched = *sched;
    rt->cfg = *cfg;
    rt->cfg.name = rt->name;
    rt->refs = 1;
    rt->stopped = true;
    *out = rt;
    return 0;
}

int tw_repeated_create_sized(tw_repeated **out, tw_service *s,
                             const tw_repeated_config *cfg, size_t cfg_size)
{
    tw_repeated_config c;
    if (cfg == NULL)
        return (tw_repeated_create)(out, s, NULL);
    int rc = tw__config_copy(&c, sizeof c, cfg, cfg_size);
    return rc != 0 ? rc : (tw_repeated_create)(out, s, &c);
}

int(tw_repeated_create)(tw_repeated **out, tw_service *s,
                        const tw_repeated_config *cfg)
{
    tw__sched sched = {svc_schedule, svc_cancel, s, svc_replace};

    if (s == NULL)
        return TW_EINVAL;
    return tw__repeated_create_on(out, &sched, cfg);
}

/* The last reference is gone: nothing else can reach @rt. */
static void finish(tw_repeated *rt)
{
    if (rt->cfg.on_destroy != NULL)
        rt->cfg.on_destroy(rt, rt->cfg.arg);
    pthread_mutex_destroy(&rt->mu);
    tw__free(rt);
}

/*
 * Drop one reference and release the mutex; the last reference finishes
 * the timer (after the unlock: on_destroy runs without the mutex held).
 */
static void unref_unlock(tw_repeated *rt)
{
    bool last = --rt->refs == 0;

    pthread_mutex_unlock(&rt->mu);
    if (last)
        finish(rt);
}

/*
 * Cancel the pending task, if any. If the cancel fails the service has
 * already taken the task to run: it will find itself stale and drop its
 * reference then.
 */
static void cancel_pending_locked(tw_repeated *rt)
{
    if (rt->pending == 0)
        return;
    if (rt->sched.cancel(rt->sched.ctx, rt->pending))
        rt->refs--; /* never the last: the caller holds another reference */
    rt->pending = 0;
}

/*
 * Schedule the next run a timeout from now, replacing the pending one. The
 * old task is cancelled only once the new one is accepted, so a failure
 * changes nothing; with sched.replace both happen in one call, and on a
 * service at max_pending the new task takes over the old one's slot.
 * While on_trigger runs this does nothing: the end of the run schedules.
 */
static int schedule_locked(tw_repeated *rt, tw_id own)
{
    uint64_t delay = rt->cfg.timeout_ns;
    tw_id id = 0;
    int err;

    if (rt->invoking)
        return 0;
    if (rt->cfg.adjust_timeout != NULL)
        delay = rt->cfg.adjust_timeout(rt, delay, rt->cfg.arg);
    if (delay == 0)
        delay = 1;
    if (rt->sched.replace != NULL) {
        /* Replace the pending task, or else take over the slot of the
         * running task @own (0: none) that re-arms us. */
        bool cancelled = false;
        err = rt->sched.replace(rt->sched.ctx, tw__repeated_task, rt, delay,
                                rt->pending != 0 ? rt->pending : own,
                                &cancelled, &id);
        if (err != 0)
            return err;
        if (cancelled && rt->pending != 0)
            rt->refs--; /* as in cancel_pending_locked() */
        rt->pending = 0;
    } else {
        err = rt->sched.schedule(rt->sched.ctx, tw__repeated_task, rt, delay,
                                 &id);
        if (err != 0)
            return err;
        cancel_pending_locked(rt);
    }
    rt->pending = id;
    rt->refs++;
    return 0;
}

/* Re-arm attempts after a run before the failure is counted. */
#define REARM_TRIES 4

/*
 * Run on_trigger with the mutex released, then schedule the next run unless
 * stopped. @own is the id of the service task that runs us (0 for
 * tw_repeated_run_once_now()). Called and returns with the mutex held and
 * rt->invoking set. Returns the scheduling error, or 0. A failed re-arm is
 * retried, then counted; the timer stays started without a pending run
 * (the next start, restart or reset arms it), except after TW_ESHUTDOWN:
 * the service is stopped, and so is the timer.
 */
static int invoke_locked(tw_repeated *rt, tw_id own)
{
    int err = 0;

    pthread_mutex_unlock(&rt->mu);
    rt->cfg.on_trigger(rt, rt->cfg.arg);
    pthread_mutex_lock(&rt->mu);
    rt->invoking = false;
    for (int i = 0; i < REARM_TRIES && !rt->stopped; i++) {
        err = schedule_locked(rt, own);
        if (err == 0 || err == TW_ESHUTDOWN)
            break;
        sched_yield();
    }
    if (err == TW_ESHUTDOWN)
        rt->stopped = true;
    else if (err != 0)
        atomic_fetch_add_explicit(&rt->failures, 1, memory_order_relaxed);
    return err;
}

void tw__repeated_task(tw_id id, void *arg)
{
    tw_repeated *rt = arg;

    pthread_mutex_lock(&rt->mu);
    /*
     * Not pending means cancelled after the service took it: stale. A
     * pending task implies a started timer: stop clears `pending`.
     */
    if (id == rt->pending) {
        rt->pending = 0;
        rt->invoking = true;
        invoke_locked(rt, id);
    }
    unref_unlock(rt);
}

int tw_repeated_start(tw_repeated *rt)
{
    int err = 0;

    if (rt == NULL)
        return TW_EINVAL;
    pthread_mutex_lock(&rt->mu);
    if (rt->destroyed) {
        err = TW_ESHUTDOWN;
    } else if (rt->stopped || (rt->pending == 0 && !rt->invoking)) {
        /* Stopped, or started with no run armed (a failed re-arm). While
         * invoking, the end of the run schedules. */
        err = rt->invoking ? 0 : schedule_locked(rt, 0);
        if (err == 0)
            rt->stopped = false;
    }
    pthread_mutex_unlock(&rt->mu);
    return err;
}

void tw_repeated_stop(tw_repeated *rt)
{
    if (rt == NULL)
        return;
    pthread_mutex_lock(&rt->mu);
    rt->stopped = true;
    cancel_pending_locked(rt);
    pthread_mutex_unlock(&rt->mu);
}

int tw_repeated_restart(tw_repeated *rt)
{
    int err;

    if (rt == NULL)
        return TW_EINVAL;
    pthread_mutex_lock(&rt->mu);
    err = rt->destroyed ? TW_ESHUTDOWN : schedule_locked(rt, 0);
    if (err == 0)
        rt->stopped = false;
    pthread_mutex_unlock(&rt->mu);
    return err;
}

int tw_repeated_reset(tw_repeated *rt, uint64_t timeout_ns)
{
    uint64_t old;
    int err = 0;

    if (rt == NULL)
        return TW_EINVAL;
    pthread_mutex_lock(&rt->mu);
    old = rt->cfg.timeout_ns;
    if (rt->destroyed) {
        err = TW_ESHUTDOWN;
    } else {
        if (timeout_ns != 0)
            rt->cfg.timeout_ns = timeout_ns;
        if (!rt->stopped)
            err = schedule_locked(rt, 0);
        if (err != 0)
            rt->cfg.timeout_ns = old;
    }
    pthread_mutex_unlock(&rt->mu);
    return err;
}

int tw_repeated_run_once_now(tw_repeated *rt)
{
    int err;

    if (rt == NULL)
        return TW_EINVAL;
    pthread_mutex_lock(&rt->mu);
    if (rt->destroyed) {
        err = TW_ESHUTDOWN;
    } else if (rt->invoking) {
        err = TW_EBUSY;
    } else {
        cancel_pending_locked(rt);
        rt->invoking = true;
        rt->refs++; /* a destroy from another thread must wait for us */
        err = invoke_locked(rt, 0);
        unref_unlock(rt);
        return err;
    }
    pthread_mutex_unlock(&rt->mu);
    return err;
}

void tw_repeated_destroy(tw_repeated *rt)
{
    if (rt == NULL)
        return;
    pthread_mutex_lock(&rt->mu);
    rt->destroyed = true;
    rt->stopped = true;
    cancel_pending_locked(rt);
    unref_unlock(rt);
}

uint64_t tw_repeated_rearm_failures(const tw_repeated *rt)
{
    return rt != NULL ? atomic_load_explicit(&((tw_repeated *)rt)->failures,
                                             memory_order_relaxed)
                      : 0;
}

const char *tw_repeated_name(const tw_repeated *rt)
{
    return rt != NULL ? rt->name : "";
}

bool tw_repeated_owns(tw_task_fn fn)
{
    return fn == tw__repeated_task;
}

void tw_repeated_unprocessed(tw_id id, tw_task_fn fn, void *arg, void *ctx)
{
    tw_repeated *rt = arg;

    (void)ctx;
    if (fn != tw__repeated_task || rt == NULL)
        return;
    pthread_mutex_lock(&rt->mu);
    if (id == rt->pending) {
        rt->pending = 0;
        rt->stopped = true;
    }
    unref_unlock(rt);
}
