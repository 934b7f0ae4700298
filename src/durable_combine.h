/* SPDX-License-Identifier: MIT */
/*
 * src/durable_combine.h - the call combiner of the durable layer: calls
 * made on many threads at once become batches (src/durable_combine.c).
 *
 * Flat combining: a caller pushes its request on a lock-free stack, then
 * either becomes the combiner (it got the combiner's mutex) or sleeps on
 * a futex word until its request is done. The combiner takes every
 * request queued so far, in arrival order, hands them to apply() as one
 * list, and does so again while more arrive (TW__COMBINE_ROUNDS rounds at
 * most), so one lock hand-off serves many calls, and a backend may turn a
 * round into one write or one round trip. A caller that finds the mutex
 * held but no combiner at work (the mutex is also the backend's store
 * lock, held for something else) waits for the mutex instead.
 *
 * How a backend uses it:
 *   - embed struct tw__combine_req in its request (what to do and where
 *     the result goes), and set up a struct tw__combiner once with
 *     tw__combine_init(): @mu is held while apply() runs (the journal
 *     passes its store mutex; a backend whose batches do I/O without its
 *     store lock, as the Redis backend's op_batch() does, passes a mutex
 *     of the combiner's own, d->op_mu[g] there: one combiner per master),
 *     apply(first, ctx) runs one round: the requests from @first on
 *     through ->next, oldest first; it sets each one's result and calls
 *     tw__combine_done() on it, after which the request may be gone (its
 *     caller returns), so it reads ->next first. after(ctx), if not NULL,
 *     runs once the rounds are over, @mu still held (the journal asks for
 *     writeback there), and returns a token for settle.
 *   - settle(ctx, token, served), if set, runs on the combiner's thread
 *     after it let go of @mu and before it wakes the callers it served
 *     (@served requests, its own included): the journal waits there until
 *     the records of them all are durable, so a caller that slept while
 *     another thread combined its call wakes once, when its call is done
 *     and durable, not once for each. Callers queued too late for the
 *     rounds are woken before settle, to combine meanwhile.
 *   - per call: tw__combine_run(c, &req) returns once apply() has done
 *     the request, on this thread or another; then read the result.
 *
 * Users: the journal (apply_round() in src/durable_journal.c, under its
 * store mutex) and the Redis backend (op_round() in src/durable_redis.c,
 * one pipelined batch per round, under a mutex of its own).
 */
#ifndef TWHEEL_DURABLE_COMBINE_H
#define TWHEEL_DURABLE_COMBINE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "futex.h"

/* Rounds of queued calls one combiner applies before it lets go. */
#define TW__COMBINE_ROUNDS 4

struct tw__combine_req {
    struct tw__combine_req *next; /* the round's list, oldest first */
    atomic_bool done;
};

struct tw__combiner {
    _Atomic(struct tw__combine_req *) pend; /* queued, newest first */
    atomic_bool combining;                  /* a combiner holds mu */
    jr_futex seq;                           /* bumped when one lets go */
    pthread_mutex_t *mu;
    void (*apply)(struct tw__combine_req *first, void *ctx);
    uint64_t (*after)(void *ctx);
    /* NULL, or set after tw__combine_init(): see the header's comment. */
    void (*settle)(void *ctx, uint64_t token, unsigned served);
    void *ctx;
};

static inline void tw__combine_init(struct tw__combiner *c, pthread_mutex_t *mu,
                                    void (*apply)(struct tw__combine_req *,
                                                  void *),
                                    uint64_t (*after)(void *), void *ctx)
{
    atomic_init(&c->pend, NULL);
    atomic_init(&c->combining, false);
    atomic_init(&c->seq.word, 0);
    atomic_init(&c->seq.sleepers, 0);
    c->mu = mu;
    c->apply = apply;
    c->after = after;
    c->settle = NULL;
    c->ctx = ctx;
}

/* @r is applied: its caller may return (and @r be gone) from now on. */
static inline void tw__combine_done(struct tw__combine_req *r)
{
    atomic_store_explicit(&r->done, true, memory_order_release);
}

/* Queue @r and return once apply() has done it. Context: @c's mutex not
 * held by the caller. */
void tw__combine_run(struct tw__combiner *c, struct tw__combine_req *r);

#endif
