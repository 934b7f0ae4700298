/* SPDX-License-Identifier: MIT */
/*
 * standin.c - twheeld -f 0 on the journal: the event loop's stand-in
 * while the loop's own thread is stuck in a slow fdatasync.
 *
 * With -f 0 the loop writes and syncs each turn's writes itself, on its
 * own thread (store.c: one epoll wakeup a batch, no thread hand-off),
 * and a command that writes nothing waits meanwhile for that fdatasync.
 * A disk that stalls (seconds: a SAN hiccup, a dying device) would then
 * stop every command, `stats` and /metrics included, for as long as it
 * stalls. So the loop is a baton, loop_mu, held by whichever thread runs
 * the loop: the loop's thread lets go of it for its fdatasync and for
 * its other store calls that may wait for the store's lock, which a
 * segment change holds for its fsync (tbd_store_sync_hook(): no system
 * call when uncontended), and a second thread, the stand-in, watches.
 * Once such a call has run STANDIN_NS, the stand-in takes the baton and runs
 * the loop's turns (tbd_turn()) until the sync returns: it serves every
 * connection, and the writes its turns take go to the store's writer thread
 * (the journal's group commit lets them wait for the next fdatasync). It takes
 * no completions (tbd_store_ack()): the loop's thread, back from its sync,
 * takes them after its own batch, so that replies and job states follow
 * the order of the writes. Its own store calls (a peek at a body the
 * store holds, /metrics) may still wait for the store's lock; stats
 * never takes it. The loop's thread wakes the stand-in out of
 * epoll_wait() when its sync returns (an eventfd; the stand-in's turns
 * never sleep over STANDIN_POLL_MS either) and takes the baton back at
 * the end of that turn.
 *
 * The stand-in sleeps without a timeout while no sync runs on the loop
 * for a second; while they do, it wakes every STANDIN_NS to look. The
 * flags the threads share without a lock (since: when the loop's sync
 * began; idle, active: what the stand-in does) are sequentially
 * consistent atomics, each written before the other is read, so that at
 * least one of the two threads sees the other's (no lost wakeup).
 */
#define _GNU_SOURCE
#include "tbd.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/eventfd.h>

#define STANDIN_NS UINT64_C(10000000)        /* a sync this slow: stand in */
#define STANDIN_BUSY_NS UINT64_C(1000000000) /* watch this long after one */

struct standin {
    pthread_t th;
    pthread_mutex_t loop_mu; /* the baton: whoever runs the loop holds it */
    pthread_mutex_t mu;      /* the stand-in's sleep */
    pthread_cond_t cv;
    bool stop;              /* under mu */
    uint64_t busy_until;    /* the stand-in's: watch until (ns) */
    _Atomic uint64_t since; /* when the loop's sync began (ns), or 0 */
    atomic_bool idle;       /* the stand-in sleeps without a timeout */
    atomic_bool active;     /* the stand-in runs the loop's turns */
    int efd;                /* wakes the stand-in's epoll_wait() */
};

/* The store's sync hook, around the loop's fdatasync and its other
 * calls that may wait for the store's lock (store.c lock_wait()), on
 * the thread that holds the baton (which it lets go of meanwhile). */
static void sync_hook(void *arg, bool begin)
{
    struct server *s = arg;
    struct standin *w = s->standin;
    if (pthread_equal(pthread_self(), w->th))
        return; /* the stand-in's own call: no one to stand in for it */
    if (begin) {
        atomic_store(&w->since, tbd_mono_ns());
        if (atomic_load(&w->idle)) {
            pthread_mutex_lock(&w->mu);
            pthread_cond_signal(&w->cv);
            pthread_mutex_unlock(&w->mu);
        }
        pthread_mutex_unlock(&w->loop_mu);
        return;
    }
    atomic_store(&w->since, 0);
    if (atomic_load(&w->active)) {
        uint64_t one = 1;
        ssize_t r = write(w->efd, &one, sizeof(one));
        (void)r; /* fails only when the counter would overflow */
    }
    pthread_mutex_lock(&w->loop_mu);
}

/* True when the loop's thread has been in its sync STANDIN_NS. */
static bool stuck(struct standin *w)
{
    uint64_t since = atomic_load(&w->since);
    return since && tbd_mono_ns() - since >= STANDIN_NS;
}

/* Runs the loop's turns while its thread is stuck in its sync. */
static void stand_in(struct server *s, struct standin *w)
{
    pthread_mutex_lock(&w->loop_mu);
    atomic_store(&w->active, true);
    if (stuck(w)) {
        tbd_logv(s, 2, "the store's fdatasync is slow: serving meanwhile");
        s->standin_on = true;
        struct timespec ms = {0, 1000000};
        while (atomic_load(&w->since)) {
            if (s->running)
                tbd_turn(s);
            else /* stopping: the loop's thread ends it after its sync */
                nanosleep(&ms, NULL);
        }
        s->standin_on = false;
    }
    atomic_store(&w->active, false);
    pthread_mutex_unlock(&w->loop_mu);
}

/* Sleeps until the loop's sync may be stuck, or until stopped (mu held). */
static void watch_sleep(struct standin *w)
{
    uint64_t now = tbd_mono_ns(), since = atomic_load(&w->since);
    if (since)
        w->busy_until = now + STANDIN_BUSY_NS;
    if (since || now < w->busy_until) {
        uint64_t t = (since ? since : now) + STANDIN_NS;
        struct timespec ts = {.tv_sec = (time_t)(t / 1000000000u),
                              .tv_nsec = (long)(t % 1000000000u)};
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
        return;
    }
    atomic_store(&w->idle, true);
    if (!atomic_load(&w->since)) /* else a sync began meanwhile */
        pthread_cond_wait(&w->cv, &w->mu);
    atomic_store(&w->idle, false);
}

static void *watch(void *arg)
{
    struct server *s = arg;
    struct standin *w = s->standin;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        if (stuck(w)) {
            pthread_mutex_unlock(&w->mu);
            stand_in(s, w);
            pthread_mutex_lock(&w->mu);
            continue;
        }
        watch_sleep(w);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

void tbd_standin_woken(struct server *s)
{
    uint64_t v;
    ssize_t r = read(s->standin->efd, &v, sizeof(v));
    (void)r; /* EAGAIN when already drained */
}

bool tbd_standin_start(struct server *s, void *tag)
{
    struct standin *w = calloc(1, sizeof(*w));
    if (!w)
        return false;
    w->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    pthread_condattr_t ca; /* watch_sleep() waits by the monotonic clock */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&w->mu, NULL);
    pthread_mutex_init(&w->loop_mu, NULL);
    pthread_mutex_lock(&w->loop_mu); /* this thread runs the loop */
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = tag};
    s->standin = w;
    if (w->efd < 0 || epoll_ctl(s->ep, EPOLL_CTL_ADD, w->efd, &e) != 0 ||
        pthread_create(&w->th, NULL, watch, s) != 0) {
        s->standin = NULL;
        if (w->efd >= 0)
            close(w->efd);
        pthread_mutex_unlock(&w->loop_mu);
        pthread_mutex_destroy(&w->loop_mu);
        pthread_mutex_destroy(&w->mu);
        pthread_cond_destroy(&w->cv);
        free(w);
        return false;
    }
    tbd_store_sync_hook(s->store, sync_hook, s);
    return true;
}

void tbd_standin_stop(struct server *s)
{
    struct standin *w = s->standin;
    if (!w)
        return;
    tbd_store_sync_hook(s->store, NULL, NULL);
    pthread_mutex_lock(&w->mu);
    w->stop = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    /* A stand-in that found the last sync slow just as it returned waits
     * for the baton: it finds no sync then and lets go. */
    pthread_mutex_unlock(&w->loop_mu);
    pthread_join(w->th, NULL);
    pthread_mutex_destroy(&w->loop_mu);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
    epoll_ctl(s->ep, EPOLL_CTL_DEL, w->efd, NULL);
    close(w->efd);
    free(w);
    s->standin = NULL;
}
