/* SPDX-License-Identifier: MIT */
/*
 * store_impl.h - the state of twheeld's store (store.h), shared by the
 * files that implement it: store.c (the store, its writer thread, fired
 * jobs, claims) and store_query.c (the query thread). Not for the rest of
 * the server, which sees struct tbd_store only through store.h.
 */
#ifndef TWHEELD_STORE_IMPL_H
#define TWHEELD_STORE_IMPL_H

#include "store.h"

#include "twheel/durable.h"

#include <pthread.h>

#define BATCH_MAX 4096 /* writes per writer round */

struct tbd_store {
    tw_durable *d;
    bool inline_writes; /* -f MS > 0 or -F: writes on the caller's thread */
    int efd;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool stop;
    bool writer_idle; /* the writer waits on cv (under mu) */
    /* -f 0, journal: a loop turn's writes may run on the loop; held:
     * being gathered. Around such a sync, sync_hook(sync_arg, true /
     * false). */
    bool lone_ok, held;
    void (*sync_hook)(void *arg, bool begin);
    void *sync_arg;
    struct tbd_write *q_head, *q_tail;       /* queued */
    struct tbd_write *done_head, *done_tail; /* completed */
    uint64_t written, batches;
    /* Fired jobs and claims, under fmu (store_fire() runs on the store's
     * thread). */
    pthread_mutex_t fmu;
    struct tbd_fired *f_head; /* newest first */
    struct claim {
        char key[24];
        size_t len;
        bool hit; /* a delivery of it was dropped (completed) */
    } * claims;
    /* [claims_off, nclaims) in claim order; released ones have len 0
     * (cancels complete in order, so a release is mostly the first) */
    size_t claims_off, nclaims, claims_cap;
    /* Queries (tbd_store_query()) and their thread, under qmu. */
    pthread_t qthread;
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    bool stop_queries;
    struct tbd_query *qq_head, *qdone;
    /* The batches' arguments: the writer's, and the event loop's (its
     * writes on its own thread may run while the writer writes). */
    struct tbd_items {
        tw_durable_item items[BATCH_MAX];
        tw_durable_item_if items_if[BATCH_MAX];
    } witems, litems;
};

/* Makes the store's eventfd readable: something waits for the event loop
 * (any thread). */
void tbd_store_wake(struct tbd_store *s);

/* Stops the query thread after the query it runs (store_query.c); queued
 * ones are dropped with their owners' memory (the server is stopping). */
void tbd_store_stop_querier(struct tbd_store *s);

/* The query thread's body (store_query.c): pthread_create() it with the
 * store as its argument. */
void *tbd_store_querier(void *arg);

#endif
