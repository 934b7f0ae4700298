/* SPDX-License-Identifier: MIT */
/*
 * store_query.c - twheeld's questions about the delayed jobs the store
 * holds (struct tbd_query in store.h), answered on a thread of their own:
 * one tw_durable_scan() each (on the journal a sequential read of its
 * segments, without the store's lock), the @want earliest matches kept
 * by (due, id), so that the event loop never waits for a scan. Queued
 * and answered in order; answers come back through the store's eventfd.
 */
#define _GNU_SOURCE
#include "store_impl.h"

#include <stdint.h>
#include <stdlib.h>

void tbd_store_stop_querier(struct tbd_store *s)
{
    pthread_mutex_lock(&s->qmu);
    s->stop_queries = true;
    struct tbd_query *q = s->qq_head;
    s->qq_head = NULL;
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    pthread_join(s->qthread, NULL);
    for (struct tbd_query *nx; q; q = nx) {
        nx = q->next;
        free(q->nodes);
        free(q);
    }
    for (struct tbd_query *nx; s->qdone; s->qdone = nx) {
        nx = s->qdone->next;
        free(s->qdone->nodes);
        free(s->qdone->hits);
        free(s->qdone);
    }
}

struct qscan {
    struct tbd_query *q;
    struct tbd_hit *hits;
    size_t n, cap;
};

static int qhit_cmp(const void *a, const void *b)
{
    const struct tbd_hit *x = a, *y = b;
    if (x->due != y->due)
        return x->due < y->due ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static int query_one(void *arg, const tw_durable_scanned *t)
{
    struct qscan *qs = arg;
    struct tbd_hit h;
    if (!qs->q->match(qs->q, t->payload, t->payload_len, &h.due, &h.id))
        return 0;
    /* Keep the @want earliest: sort and cut once 4 * @want are held, so
     * a scan holds O(@want) of them (kick of many: up to all). */
    size_t keep = qs->q->want;
    if (qs->n == qs->cap && keep <= SIZE_MAX / 4 && qs->n >= 4 * keep) {
        qsort(qs->hits, qs->n, sizeof(*qs->hits), qhit_cmp);
        qs->n = keep;
    }
    if (qs->n == qs->cap) {
        size_t ncap = qs->cap ? qs->cap * 2 : 64;
        struct tbd_hit *nh = realloc(qs->hits, ncap * sizeof(*nh));
        if (!nh)
            return TW_ENOMEM;
        qs->hits = nh;
        qs->cap = ncap;
    }
    qs->hits[qs->n++] = h;
    return 0;
}

static void run_query(struct tbd_store *s, struct tbd_query *q)
{
    struct qscan qs = {.q = q};
    long rc = tw_durable_scan(s->d, query_one, &qs);
    q->result = rc < 0 ? (int)rc : 0;
    q->hits = NULL;
    q->n = 0;
    if (rc >= 0 && qs.n) {
        qsort(qs.hits, qs.n, sizeof(*qs.hits), qhit_cmp);
        q->n = qs.n < q->want ? qs.n : q->want;
        q->hits = qs.hits; /* the tail past n is not read */
    } else {
        free(qs.hits);
    }
}

/* Appends @q to the list at @head (queries are few: a walk). */
static void query_append(struct tbd_query **head, struct tbd_query *q)
{
    q->next = NULL;
    while (*head)
        head = &(*head)->next;
    *head = q;
}

/* The query thread: answers the queued queries one at a time, in order,
 * until tbd_store_stop_querier(). */
void *tbd_store_querier(void *arg)
{
    struct tbd_store *s = arg;
    pthread_mutex_lock(&s->qmu);
    while (!s->stop_queries) {
        struct tbd_query *q = s->qq_head;
        if (!q) {
            pthread_cond_wait(&s->qcv, &s->qmu);
            continue;
        }
        s->qq_head = q->next;
        pthread_mutex_unlock(&s->qmu);
        run_query(s, q);
        pthread_mutex_lock(&s->qmu);
        query_append(&s->qdone, q);
        tbd_store_wake(s);
    }
    pthread_mutex_unlock(&s->qmu);
    return NULL;
}

void tbd_store_query(struct tbd_store *s, struct tbd_query *q)
{
    pthread_mutex_lock(&s->qmu);
    query_append(&s->qq_head, q);
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
}

struct tbd_query *tbd_store_take_queries(struct tbd_store *s)
{
    pthread_mutex_lock(&s->qmu);
    struct tbd_query *h = s->qdone;
    s->qdone = NULL;
    pthread_mutex_unlock(&s->qmu);
    return h;
}
