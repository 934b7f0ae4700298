/* SPDX-License-Identifier: MIT */
/*
 * src/exec_pool.c - executor threads and their queue (src/exec_pool.h).
 *
 * One mutex guards the queue; an executor pops the oldest job, asks take()
 * (still under the mutex) whether to run it, wakes another executor if
 * more jobs wait, and runs the job without the mutex. The pool never looks
 * inside a job: what a job is and when it may run is take()'s business.
 */
#define _POSIX_C_SOURCE 200809L

#include "exec_pool.h"

#include "common.h"

int tw__exec_init(struct exec_pool *p, uint32_t nthreads, tw__exec_take_fn take,
                  tw__exec_run_fn run, void *ctx)
{
    p->threads = NULL;
    if (nthreads != 0) {
        p->threads = tw__calloc(nthreads, sizeof(pthread_t));
        if (p->threads == NULL)
            return TW_ENOMEM;
    }
    if (pthread_mutex_init(&p->mu, NULL) != 0)
        goto fail;
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        goto fail;
    }
    p->head = NULL;
    p->tailp = &p->head;
    p->quit = false;
    p->nthreads = nthreads;
    p->started = 0;
    p->take = take;
    p->run = run;
    p->ctx = ctx;
    return 0;
fail:
    tw__free(p->threads);
    p->threads = NULL;
    return TW_ENOMEM;
}

void tw__exec_destroy(struct exec_pool *p)
{
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    tw__free(p->threads);
}

/* Take @job out of the queue. Context: under mu. */
static void unlink_job(struct exec_pool *p, tw_timer *job)
{
    tw_timer *next = job->tw__next;
    *job->tw__pprev = next;
    if (next != NULL)
        next->tw__pprev = job->tw__pprev;
    else
        p->tailp = job->tw__pprev;
    job->tw__pprev = NULL;
}

static void *executor_main(void *arg)
{
    struct exec_pool *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        tw_timer *job = p->head;
        if (job == NULL) {
            if (p->quit)
                break;
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        unlink_job(p, job);
        bool run = p->take(job, p->ctx);
        if (p->head != NULL)
            pthread_cond_signal(&p->cv); /* more for another executor */
        if (!run)
            continue;
        pthread_mutex_unlock(&p->mu);
        p->run(job, p->ctx);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

int tw__exec_start(struct exec_pool *p)
{
    int rc = 0;
    while (p->started < p->nthreads && rc == 0) {
        rc = pthread_create(&p->threads[p->started], NULL, executor_main, p);
        if (rc == 0)
            p->started++;
    }
    if (rc != 0)
        tw__exec_stop(p);
    return rc;
}

void tw__exec_stop(struct exec_pool *p)
{
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t i = 0; i < p->started; i++)
        pthread_join(p->threads[i], NULL);
    p->started = 0;
    p->quit = false;
}

void tw__exec_push(struct exec_pool *p, tw_timer *first)
{
    /* The links are set under the lock: tw__exec_remove() reads them
     * there. */
    pthread_mutex_lock(&p->mu);
    tw_timer **pp = p->tailp;
    *pp = first;
    for (tw_timer *t = first; t != NULL; t = t->tw__next) {
        t->tw__pprev = pp;
        pp = &t->tw__next;
    }
    p->tailp = pp;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

bool tw__exec_remove(struct exec_pool *p, tw_timer *job,
                     bool (*still)(tw_timer *job, void *arg), void *arg)
{
    pthread_mutex_lock(&p->mu);
    bool queued = still(job, arg) && job->tw__pprev != NULL;
    if (queued)
        unlink_job(p, job);
    pthread_mutex_unlock(&p->mu);
    return queued;
}
