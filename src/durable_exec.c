/* SPDX-License-Identifier: MIT */
/*
 * src/durable_exec.c - the delivery path every durable backend shares
 * (src/durable_exec.h says how a backend uses it): the executor that runs
 * a round's deliveries inline or on cfg.executor_threads threads, and the
 * delivery counters behind tw_durable_stats.
 *
 * The executor is a thin layer on src/exec_pool.c. What it adds is the
 * count of jobs submitted and not yet run or dropped (pending, under its
 * own mutex), so that tw__durable_exec_wait_idle() can wait for a round's
 * callbacks to return, and the close rule: once tw__durable_exec_stop()
 * has set dropping, exec_take() hands every job still queued to the
 * backend's drop() instead of running it (the timer stays pending in the
 * store: at least once). With no threads the pool starts none and
 * submit runs the jobs itself, in order, with no lock of its own held.
 *
 * The counters take no lock: the backend's lock guards them. Lateness is
 * counted in microseconds from wall-clock milliseconds, saturated both
 * ways, into the TW_LATE_BUCKETS histogram the service uses as well.
 */
#include "durable_exec.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "common.h"

static bool exec_take(tw_timer *job, void *ctx)
{
    struct tw__durable_exec *x = ctx;
    if (!atomic_load_explicit(&x->dropping, memory_order_acquire))
        return true;
    x->drop((struct tw__durable_job *)job, x->ctx);
    pthread_mutex_lock(&x->mu);
    if (--x->pending == 0)
        pthread_cond_broadcast(&x->idle);
    pthread_mutex_unlock(&x->mu);
    return false;
}

static void exec_run(tw_timer *job, void *ctx)
{
    struct tw__durable_exec *x = ctx;
    x->run((struct tw__durable_job *)job, x->ctx);
    pthread_mutex_lock(&x->mu);
    if (--x->pending == 0)
        pthread_cond_broadcast(&x->idle);
    pthread_mutex_unlock(&x->mu);
}

int tw__durable_exec_init(struct tw__durable_exec *x, uint32_t nthreads,
                          tw__durable_run_fn run, tw__durable_drop_fn drop,
                          void *ctx)
{
    x->run = run;
    x->drop = drop;
    x->ctx = ctx;
    x->pending = 0;
    x->started = false;
    atomic_init(&x->dropping, false);
    if (tw__exec_init(&x->pool, nthreads, exec_take, exec_run, x) != 0)
        return TW_ENOMEM;
    if (pthread_mutex_init(&x->mu, NULL) != 0)
        goto fail_pool;
    if (pthread_cond_init(&x->idle, NULL) != 0)
        goto fail_mu;
    x->ready = true;
    return 0;
fail_mu:
    pthread_mutex_destroy(&x->mu);
fail_pool:
    tw__exec_destroy(&x->pool);
    return TW_ENOMEM;
}

int tw__durable_exec_start(struct tw__durable_exec *x)
{
    if (tw__exec_start(&x->pool) != 0)
        return TW_ENOMEM;
    x->started = true;
    return 0;
}

void tw__durable_exec_submit(struct tw__durable_exec *x,
                             struct tw__durable_jobs *l)
{
    tw_timer *first = l->head;
    size_t n = l->n;
    tw__durable_jobs_init(l);
    if (!first)
        return;
    if (!tw__durable_exec_threaded(x)) {
        while (first) {
            tw_timer *job = first;
            first = job->tw__next; /* run() may free the job */
            x->run((struct tw__durable_job *)job, x->ctx);
        }
        return;
    }
    /* Counted before the push: tw__durable_exec_wait_idle() never misses
     * a job. */
    pthread_mutex_lock(&x->mu);
    x->pending += n;
    pthread_mutex_unlock(&x->mu);
    tw__exec_push(&x->pool, first);
}

void tw__durable_exec_wait_idle(struct tw__durable_exec *x)
{
    pthread_mutex_lock(&x->mu);
    while (x->pending)
        pthread_cond_wait(&x->idle, &x->mu);
    pthread_mutex_unlock(&x->mu);
}

void tw__durable_exec_stop(struct tw__durable_exec *x)
{
    if (!x->started)
        return;
    atomic_store_explicit(&x->dropping, true, memory_order_release);
    tw__exec_stop(&x->pool);
    x->started = false;
}

void tw__durable_exec_destroy(struct tw__durable_exec *x)
{
    if (!x->ready)
        return;
    pthread_cond_destroy(&x->idle);
    pthread_mutex_destroy(&x->mu);
    tw__exec_destroy(&x->pool);
    x->ready = false;
}

uint64_t tw__durable_late_us(int64_t now_ms, int64_t due_ms)
{
    int64_t late_ms; /* due_ms may be anywhere in int64: saturate */
    if (__builtin_sub_overflow(now_ms, due_ms, &late_ms))
        late_ms = INT64_MAX;
    return late_ms > 0 && late_ms < INT64_MAX / 1000 ? (uint64_t)late_ms * 1000u
           : late_ms > 0                             ? UINT64_MAX
                                                     : 0;
}

void tw__durable_counts_begin(struct tw__durable_counts *c, uint64_t late_us)
{
    c->late_hist[tw__late_bucket(late_us)]++;
    c->late_sum_us = late_us > UINT64_MAX - c->late_sum_us
                         ? UINT64_MAX
                         : c->late_sum_us + late_us;
    c->running++;
}

void tw__durable_counts_end(struct tw__durable_counts *c, int r)
{
    c->running--;
    if (r > 0 || r == TW_DURABLE_FIRE_RETRY)
        c->retried++;
    else
        c->fired++;
}

void tw__durable_counts_stats(const struct tw__durable_counts *c,
                              tw_durable_stats *out)
{
    out->fired = c->fired;
    out->retried = c->retried;
    out->backlog = c->backlog;
    out->running = c->running;
    out->late_sum_us = c->late_sum_us;
    memcpy(out->late_hist, c->late_hist, sizeof out->late_hist);
}
