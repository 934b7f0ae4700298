/* SPDX-License-Identifier: MIT */
/*
 * src/durable_exec.h - the delivery path every durable backend shares: one
 * executor for callbacks (cfg.executor_threads, on src/exec_pool.c) and
 * the delivery counters behind tw_durable_stats (src/durable_exec.c); below
 * them the rest of the shared layer: tw__durable_fire() and the mark of
 * the store whose callback a thread runs, the retry policy
 * (src/durable_dead.c), the default clocks and open's messages. The call
 * combiner is in src/durable_combine.h.
 *
 * How a backend delivers a due timer
 * ----------------------------------
 * 1. It embeds a struct tw__durable_job in what it keeps per delivery,
 *    gathers the deliveries of one round in a struct tw__durable_jobs
 *    (tw__durable_jobs_add()) and hands them over with
 *    tw__durable_exec_submit(), holding none of its own locks: with
 *    executor_threads == 0 the jobs run right there, on the caller's
 *    thread, in order, before submit returns; otherwise they are queued
 *    (FIFO) for the executor threads and submit returns at once.
 * 2. On whichever thread, the executor calls the run() given to
 *    tw__durable_exec_init() once per job, with no lock held. run() is
 *    the backend's: it decides under its own lock whether the delivery
 *    still stands (a cancel may have come in meanwhile), counts its start
 *    with tw__durable_counts_begin(), calls the user's callback through
 *    tw__durable_fire() without its lock, then counts the result with
 *    tw__durable_counts_end() and records the completion. The job belongs
 *    to run() from then on (free it there).
 * 3. A test hook or a flush that must see every callback of a round
 *    return calls tw__durable_exec_wait_idle(): it returns once every job
 *    submitted before has run (or was dropped).
 * 4. Close: the backend first stops whatever submits (its firing
 *    threads), then calls tw__durable_exec_stop(): jobs still queued are
 *    not run but handed to drop() (the timer stays pending in the store
 *    and is delivered again after the next open: at least once), jobs
 *    running finish, and the threads are joined. Then
 *    tw__durable_exec_destroy().
 * 5. TW_EDEADLK: tw__durable_fire() marks the thread as running a
 *    callback of that store (tw__durable_running), on an executor thread
 *    as on the backend's own; tw_durable_close() called from inside the
 *    callback sees the mark and returns TW_EDEADLK instead of waiting in
 *    tw__durable_exec_stop() for the very callback that called it. Once
 *    close has begun, the public calls refuse changes with TW_ESHUTDOWN
 *    before they reach the backend (src/durable.c), so a callback still
 *    running during close cannot schedule into a store being freed.
 *
 * Locks: the executor's mutexes come after the backend's in lock order.
 * submit, wait_idle and stop are called with no backend lock held
 * (inline, submit runs run(), which takes the backend's lock). The
 * tw__durable_counts_* functions take no lock: the backend's lock guards
 * its struct tw__durable_counts. drop() runs under the executor's queue
 * lock and must take no other.
 *
 * The interface is stable: a backend changes nothing here to use it.
 */
#ifndef TWHEEL_DURABLE_EXEC_H
#define TWHEEL_DURABLE_EXEC_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "exec_pool.h"
#include "twheel/durable.h"

/* One delivery as the executor sees it: a link, nothing more. */
struct tw__durable_job {
    tw_timer link; /* exec_pool's links while queued; not a timer */
};

/* The jobs of one round, in submission order. */
struct tw__durable_jobs {
    tw_timer *head, **tail;
    size_t n;
};

static inline void tw__durable_jobs_init(struct tw__durable_jobs *l)
{
    l->head = NULL;
    l->tail = &l->head;
    l->n = 0;
}

static inline void tw__durable_jobs_add(struct tw__durable_jobs *l,
                                        struct tw__durable_job *j)
{
    j->link.tw__next = NULL;
    *l->tail = &j->link;
    l->tail = &j->link.tw__next;
    l->n++;
}

/* Runs one job (no lock held); @ctx as given to tw__durable_exec_init(). */
typedef void (*tw__durable_run_fn)(struct tw__durable_job *job, void *ctx);
/* Frees a job that close left unrun (called under the executor's lock:
 * free it, nothing more). */
typedef void (*tw__durable_drop_fn)(struct tw__durable_job *job, void *ctx);

struct tw__durable_exec {
    struct exec_pool pool; /* unused (no threads) when inline */
    tw__durable_run_fn run;
    tw__durable_drop_fn drop;
    void *ctx;
    pthread_mutex_t mu;
    pthread_cond_t idle; /* pending reached 0 */
    uint64_t pending;    /* submitted, not yet run or dropped; under mu */
    atomic_bool dropping;
    bool ready, started;
};

/* Set up an executor of @nthreads threads (0: jobs run inline in submit),
 * not started. Returns 0 or TW_ENOMEM with nothing left. A zeroed struct
 * that init failed on, or never saw, may be destroyed. */
int tw__durable_exec_init(struct tw__durable_exec *x, uint32_t nthreads,
                          tw__durable_run_fn run, tw__durable_drop_fn drop,
                          void *ctx);
/* Start the threads. Returns 0 or TW_ENOMEM with none left running. */
int tw__durable_exec_start(struct tw__durable_exec *x);
/* Run the jobs of @l (inline) or queue them (threads); @l is emptied.
 * Context: no backend lock held; not after tw__durable_exec_stop(). */
void tw__durable_exec_submit(struct tw__durable_exec *x,
                             struct tw__durable_jobs *l);
/* Whether jobs run on executor threads (executor_threads > 0). */
static inline bool tw__durable_exec_threaded(const struct tw__durable_exec *x)
{
    return x->pool.nthreads != 0;
}
/* Wait until every job submitted so far has run or been dropped. */
void tw__durable_exec_wait_idle(struct tw__durable_exec *x);
/* Close: drop the queued jobs, let the running ones finish, join. */
void tw__durable_exec_stop(struct tw__durable_exec *x);
/* Free what init made (threads stopped). */
void tw__durable_exec_destroy(struct tw__durable_exec *x);

/* The delivery counters of tw_durable_stats, under the backend's lock. */
struct tw__durable_counts {
    uint64_t fired, retried;
    uint64_t backlog; /* due, callback not begun (a backend may add more) */
    uint64_t running; /* callbacks running now */
    uint64_t late_sum_us;
    uint64_t late_hist[TW_LATE_BUCKETS];
};

/* How late in microseconds a callback starting at wall @now_ms is for a
 * timer due at @due_ms: 0 if not late, saturated at UINT64_MAX. */
uint64_t tw__durable_late_us(int64_t now_ms, int64_t due_ms);
/* A callback starts @late_us late: counted in the histogram and running. */
void tw__durable_counts_begin(struct tw__durable_counts *c, uint64_t late_us);
/* A callback returned @r: no longer running; fired, or retried when @r
 * asks for another delivery (r > 0 or TW_DURABLE_FIRE_RETRY). */
void tw__durable_counts_end(struct tw__durable_counts *c, int r);
/* Copy the counters into @out's fired, retried, backlog, running,
 * late_sum_us and late_hist. */
void tw__durable_counts_stats(const struct tw__durable_counts *c,
                              tw_durable_stats *out);

/* The store whose callback this thread is running, or NULL: close() of
 * that store from inside its own callback would wait for itself, and
 * returns TW_EDEADLK instead (src/durable.c). */
extern _Thread_local tw_durable *tw__durable_running;

/* Every backend calls its callbacks through this. */
static inline int tw__durable_fire(tw_durable *d, tw_durable_fire_fn fn,
                                   const tw_durable_timer *t, void *arg)
{
    tw_durable *outer = tw__durable_running;
    tw__durable_running = d;
    int res = fn(d, t, arg);
    tw__durable_running = outer;
    return res;
}

/* The first non-zero result of @items, or 0: what a schedule_many call
 * returns once every item's result is set. */
static inline int tw__durable_first_error(const tw_durable_item *items,
                                          size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (items[i].result)
            return items[i].result;
    return 0;
}

/* A store's retry policy (cfg.max_attempts, retry_*; src/durable_dead.c),
 * applied by both backends the same way. */
struct tw__retry {
    uint32_t max_attempts; /* 0: no limit */
    uint32_t base_ms, max_ms, jitter_pct;
};
#define TW__RETRY_DEAD (-1) /* tw__retry_next(): to the dead letters */

/* The policy of @cfg (checked by tw_durable_open()). */
void tw__retry_init(struct tw__retry *p, const tw_durable_config *cfg);
/* What follows a delivery of @attempt whose callback returned @r: 0 done,
 * n > 0 deliver again in n ms, or TW__RETRY_DEAD. */
int tw__retry_next(const struct tw__retry *p, uint32_t attempt, int r);
/* Whether a delivery of @attempt may run its callback at all: one past
 * max_attempts (the earlier ones crashed) goes to the dead letters. */
static inline bool tw__retry_may(const struct tw__retry *p, uint32_t attempt)
{
    return !p->max_attempts || attempt <= p->max_attempts;
}

/* The default clocks of cfg.wall_ms (CLOCK_REALTIME, ms) and cfg.mono_ns
 * (CLOCK_MONOTONIC, ns); @arg is unused. */
int64_t tw__durable_real_wall_ms(void *arg);
uint64_t tw__durable_real_mono_ns(void *arg);
/* Write a message into cfg->errbuf, if it has one. */
void tw__durable_errmsg(const tw_durable_config *cfg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
