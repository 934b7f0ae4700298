/* SPDX-License-Identifier: MIT */
/*
 * src/durable_combine.c - the durable layer's call combiner (flat
 * combining; src/durable_combine.h says how a backend uses it).
 *
 * A caller pushes its request on a lock-free stack (newest first) and then
 * loops: if it gets the combiner's mutex it combines, reversing each batch
 * it takes into arrival order and handing it to apply(), for at most
 * TW__COMBINE_ROUNDS rounds; if another thread holds the mutex as combiner
 * it sleeps on the futex word seq, which every combiner bumps as it lets
 * go (after settle(), if the backend has one); if the mutex is held for
 * something else (the journal's store lock) it waits for the mutex. Its
 * request being done ends the loop either way: done is stored with
 * release order after apply() set the result, so the caller reads the
 * result once it sees done.
 */
#include "durable_combine.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

/* Apply every call queued so far, in arrival order (mu held), a few
 * rounds while more arrive; returns how many. */
static unsigned combine(struct tw__combiner *c)
{
    unsigned served = 0;
    atomic_store(&c->combining, true);
    for (int round = 0; round < TW__COMBINE_ROUNDS; round++) {
        struct tw__combine_req *r = atomic_exchange(&c->pend, NULL);
        struct tw__combine_req *fifo = NULL;
        if (!r)
            break;
        while (r) {
            struct tw__combine_req *nx = r->next;
            r->next = fifo;
            fifo = r;
            r = nx;
            served++;
        }
        c->apply(fifo, c->ctx);
    }
    atomic_store(&c->combining, false);
    return served;
}

/* A caller that finds the mutex taken by a combiner sleeps on seq instead
 * of queueing for the mutex; when no combiner runs it takes the mutex. */
void tw__combine_run(struct tw__combiner *c, struct tw__combine_req *r)
{
    atomic_init(&r->done, false);
    r->next = atomic_load(&c->pend);
    while (!atomic_compare_exchange_weak(&c->pend, &r->next, r))
        ;
    while (!atomic_load_explicit(&r->done, memory_order_acquire)) {
        unsigned seq = atomic_load(&c->seq.word);
        bool locked = pthread_mutex_trylock(c->mu) == 0;
        if (!locked && !atomic_load(&c->combining)) {
            pthread_mutex_lock(c->mu);
            locked = true;
        }
        if (locked) {
            unsigned served = 0;
            if (!atomic_load_explicit(&r->done, memory_order_acquire))
                served = combine(c);
            uint64_t token = c->after ? c->after(c->ctx) : 0;
            pthread_mutex_unlock(c->mu);
            if (c->settle && served) {
                /* A caller queued after the last round saw combining set
                 * and sleeps: it combines now, not after the settle. One
                 * that queues later finds the mutex free. */
                if (atomic_load(&c->pend))
                    tw__futex_bump(&c->seq);
                c->settle(c->ctx, token, served);
            }
            /* Callers that queued meanwhile try again; those served
             * return. */
            tw__futex_bump(&c->seq);
            return;
        }
        tw__futex_wait(&c->seq, seq);
    }
}
