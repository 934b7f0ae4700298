/* SPDX-License-Identifier: MIT */
/*
 * src/exec_pool.h - a pool of executor threads with one FIFO queue of jobs.
 *
 * A job is a tw_timer that the caller owns; the pool links it through
 * tw__next and tw__pprev while it waits (tw__pprev points at whatever
 * points at the job, NULL once an executor took it), and knows nothing
 * else about it. The caller passes two callbacks: take() runs on the
 * executor under the pool's mutex right after the job left the queue and
 * says whether to run it; run() runs it, without the mutex. So a job that
 * take() accepts has left the caller's "waiting" state before anybody can
 * see it outside the queue, and a caller that removes a job with
 * tw__exec_remove() never races an executor.
 */
#ifndef TWHEEL_EXEC_POOL_H
#define TWHEEL_EXEC_POOL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "twheel/wheel.h"

/* Called under the pool's mutex with a job just unlinked: true to run it. */
typedef bool (*tw__exec_take_fn)(tw_timer *job, void *ctx);
/* Runs a job take() accepted; the pool's mutex is not held. */
typedef void (*tw__exec_run_fn)(tw_timer *job, void *ctx);

struct exec_pool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    tw_timer *head, **tailp; /* the queue, under mu */
    bool quit;               /* under mu */
    uint32_t nthreads;
    uint32_t started; /* threads running */
    pthread_t *threads;
    tw__exec_take_fn take;
    tw__exec_run_fn run;
    void *ctx;
};

/* Set up a pool of @nthreads (0: a queue nobody serves), not started.
 * Returns 0 or TW_ENOMEM with nothing left. */
int tw__exec_init(struct exec_pool *p, uint32_t nthreads, tw__exec_take_fn take,
                  tw__exec_run_fn run, void *ctx);
/* Free what tw__exec_init() made. The threads must be stopped. */
void tw__exec_destroy(struct exec_pool *p);
/* Start the threads. Returns 0, or a pthread_create() error number with
 * no thread left running. */
int tw__exec_start(struct exec_pool *p);
/* Let the threads finish the queue, then join them; startable again. */
void tw__exec_stop(struct exec_pool *p);
/* Append the chain of jobs that starts at @first (linked through
 * tw__next, NULL-terminated) and wake an executor. */
void tw__exec_push(struct exec_pool *p, tw_timer *first);
/* Under the pool's mutex: if @still(@job, @arg) says the job is still the
 * caller's waiting job and it is in the queue, unlink it. Returns whether
 * it was unlinked (the caller then owns it). @still is asked first: the
 * links of a job that is no longer waiting may be anybody's. */
bool tw__exec_remove(struct exec_pool *p, tw_timer *job,
                     bool (*still)(tw_timer *job, void *arg), void *arg);

#endif
