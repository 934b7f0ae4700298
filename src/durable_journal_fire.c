/* SPDX-License-Identifier: MIT */
/*
 * src/durable_journal_fire.c - the journal backend's thread and its
 * deliveries (the design is at the top of src/durable_journal.c).
 *
 * A round of the store's thread (store_main()): advance the wheel to the
 * wall clock (never back), so tw__journal_on_due() gathers the due entries in
 * due[]; deliver them in chunks of up to TW__JOURNAL_CHUNK (deliver_chunk():
 * read each record back, append and sync the FIRE records, hand the
 * deliveries to the shared executor of src/durable_exec.h, which runs
 * their callbacks on this thread or on executor_threads of their own);
 * compact old segments while the journal is too large; with SYNC_INTERVAL,
 * ask the sync thread (sync_main()) for the interval's fdatasync;
 * writeback; then sleep until the wheel's next expiry, at most
 * WALL_CHECK_MS. A delivery's run (run_delivery(), on the executor)
 * checks under the mutex that no cancel or replace came in since
 * (begin_delivery()), runs the callback without the mutex, and records
 * the outcome (complete(): DONE, a retry's SCHED, or DEAD).
 */
#define _GNU_SOURCE

#include "twheel/durable.h"

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "durable_journal.h"
#include "common.h"
#include "durable_hooks.h"

#define WALL_CHECK_MS 250
#define CHUNK_BYTES (4u << 20)
#define RETRY_IO_MS 1000

/* ------------------------------------------------------------------------ */
/* Firing. */

/* The store whose thread is in store_main()'s tw_wheel_advance(): entries'
 * arg slots hold the key table's links, so tw__journal_on_due() finds its store
 * here. */
static _Thread_local jstore *advancing;

void tw__journal_on_due(tw_timer *t, void *arg)
{
    (void)arg; /* tw__key_link(), not ours to use here */
    jstore *s = advancing;
    struct tw__key_entry *n = TW_CONTAINER_OF(t, struct tw__key_entry, tm);
    if (s->ndue == s->due_cap) {
        size_t nc = s->due_cap ? s->due_cap * 2 : 256;
        struct tw__key_entry **nd = tw__realloc(s->due, nc * sizeof *nd);
        if (!nd) { /* try again in a moment */
            tw__journal_rearm(
                s, n, tw__journal_tick(tw__journal_wall(s)) + RETRY_IO_MS);
            return;
        }
        s->due = nd;
        s->due_cap = nc;
    }
    n->fl |= ENT_FIRING;
    s->due[s->ndue++] = n;
    s->counts.backlog++;
}

/* Read entry @n's SCHED record back (mutex held). NULL on failure. */
struct delivery *tw__journal_read_record(jstore *s, struct tw__key_entry *n)
{
    jr_seg *g = tw__jr_seg(&s->w, n->seg);
    size_t size = g ? tw__jr_rec_size_at(g, n->off) : 0;
    if (!size)
        return NULL;
    struct delivery *dl = tw__malloc(sizeof *dl + size);
    if (!dl)
        return NULL;
    if (!tw__jr_read_rec(g, n->off, dl->raw, size, &dl->rec) ||
        (dl->rec.type != JR_SCHED && dl->rec.type != JR_DEAD)) {
        tw__free(dl);
        return NULL;
    }
    dl->entry = n;
    return dl;
}

/* After the callback returned @r (mutex held). Frees @dl. */
static void complete(jstore *s, struct delivery *dl, int r)
{
    struct tw__key_entry *n = dl->entry;
    tw__durable_counts_end(&s->counts, r);
    int next = tw__retry_next(&s->retry, dl->attempt, r);
    if (n->fl & ENT_ORPHAN) {
        tw__key_entry_free(&s->keys, n);
    } else if (next == TW__RETRY_DEAD) {
        n->fl &= (uint16_t)~ENT_FIRING;
        /* On failure it stays pending: delivered again a little later,
         * past max_attempts it comes back here before its callback. */
        if (tw__journal_to_dead(s, n, &dl->rec, dl->attempt) != 0)
            tw__journal_rearm(
                s, n, tw__journal_tick(tw__journal_wall(s)) + RETRY_IO_MS);
    } else if (next > 0) {
        int64_t due = tw__journal_wall(s) + next;
        uint32_t seg, off;
        uint64_t lsn;
        n->fl &= (uint16_t)~ENT_FIRING;
        if (tw__jr_append(&s->w, JR_SCHED, n->key, n->key_len, due, dl->attempt,
                          dl->rec.payload, dl->rec.payload_len, &seg, &off,
                          &lsn) == 0) {
            tw__journal_seg_live(s, n->seg, -1);
            tw__journal_seg_live(s, seg, +1);
            tw__journal_entry_record(n, seg, off);
        }
        /* On failure the old record and its FIRE records stay: after a
         * crash it is delivered again with a higher attempt. */
        tw__journal_rearm(s, n, tw__journal_tick(due));
        tw__journal_kick_if_earlier(s, due);
    } else {
        uint32_t seg, off;
        uint64_t lsn;
        /* Not waited for: a DONE lost in a crash means one more delivery. */
        (void)tw__jr_append(&s->w, JR_DONE, n->key, n->key_len, 0, 0, NULL, 0,
                            &seg, &off, &lsn);
        n->fl &= (uint16_t)~ENT_FIRING;
        tw__journal_entry_remove(s, tw__key_find(&s->keys, n->key, n->key_len));
    }
    tw__free(dl);
}

/* A delivery's callback is about to run (mutex held, and held since the
 * caller last looked at the entry): it leaves the backlog, and how late it
 * starts is counted. Returns false, with @dl freed, if a cancel or replace
 * of its key was applied since the delivery began: those run under the
 * same mutex, so once one has returned 0 this is where every delivery of
 * the old version that has not started yet stops. */
static bool begin_delivery(jstore *s, struct delivery *dl)
{
    s->counts.backlog--;
    if (dl->entry->fl & ENT_ORPHAN) {
        tw__key_entry_free(&s->keys, dl->entry);
        tw__free(dl);
        return false;
    }
    if (s->retry.max_attempts) {
        /* This callback's own FIRE record, written (not synced) as it
         * starts. Without it (a write error) the attempt is not counted;
         * the delivery happens all the same. */
        uint32_t seg, off;
        uint64_t lsn;
        if (tw__jr_append(&s->w, JR_FIRE, dl->entry->key, dl->entry->key_len, 0,
                          0, NULL, 0, &seg, &off, &lsn) == 0)
            tw__journal_fires_add(dl->entry);
    }
    tw__durable_counts_begin(
        &s->counts, tw__durable_late_us(tw__journal_wall(s), dl->rec.due_ms));
    return true;
}

static int run_callback(jstore *s, struct delivery *dl)
{
    tw_durable_timer t = {
        .key = dl->rec.key,
        .key_len = dl->rec.key_len,
        .payload = dl->rec.payload_len ? dl->rec.payload : NULL,
        .payload_len = dl->rec.payload_len,
        .due_ms = dl->rec.due_ms,
        .attempt = dl->attempt,
    };
    return tw__durable_fire(&s->base, s->fire, &t, s->fire_arg);
}

/* Read due entry @n's record and append its FIRE record (*@lsn: its end).
 * On I/O trouble or no memory the entry goes back into the wheel to be
 * tried again later, and NULL is returned. */
static struct delivery *start_delivery(jstore *s, struct tw__key_entry *n,
                                       uint64_t *lsn)
{
    struct delivery *dl = tw__journal_read_record(s, n);
    uint32_t seg, off;
    unsigned fires = n->fl & ENT_FIRES;
    if (dl && !tw__retry_may(&s->retry, tw__journal_attempts(dl->rec.attempt,
                                                             fires + 1u))) {
        /* The deliveries before crashed (each left a FIRE record): the
         * policy's attempts are used up. */
        s->counts.backlog--;
        n->fl &= (uint16_t)~ENT_FIRING;
        if (tw__journal_to_dead(s, n, &dl->rec,
                                tw__journal_attempts(dl->rec.attempt, fires)))
            tw__journal_rearm(s, n, tw_wheel_now(s->wheel) + RETRY_IO_MS);
        tw__free(dl);
        return NULL;
    }
    /* With a retry policy the FIRE record waits for the callback
     * (begin_delivery()): see the top of src/durable_journal.c. */
    bool per_callback = s->retry.max_attempts != 0;
    if (dl && !per_callback &&
        tw__jr_append(&s->w, JR_FIRE, n->key, n->key_len, 0, 0, NULL, 0, &seg,
                      &off, lsn) != 0) {
        tw__free(dl);
        dl = NULL;
    }
    if (!dl) {
        s->counts.backlog--;
        n->fl &= (uint16_t)~ENT_FIRING;
        tw__journal_rearm(s, n, tw_wheel_now(s->wheel) + RETRY_IO_MS);
        return NULL;
    }
    if (!per_callback)
        tw__journal_fires_add(n);
    dl->attempt = tw__journal_attempts(dl->rec.attempt,
                                       (n->fl & ENT_FIRES) + per_callback);
    return dl;
}

/* One delivery on the executor (src/durable_exec.h): no lock held. */
static void run_delivery(struct tw__durable_job *job, void *ctx)
{
    jstore *s = ctx;
    struct delivery *dl = (struct delivery *)job;
    pthread_mutex_lock(&s->mu);
    if (begin_delivery(s, dl)) {
        pthread_mutex_unlock(&s->mu);
        int r = run_callback(s, dl);
        pthread_mutex_lock(&s->mu);
        complete(s, dl, r);
    }
    pthread_mutex_unlock(&s->mu);
}

/* Close left @job queued: its entry stays pending in the journal. */
static void drop_delivery(struct tw__durable_job *job, void *ctx)
{
    (void)ctx;
    tw__free(job);
}

/* Deliver up to TW__JOURNAL_CHUNK due entries (mutex held; released while the
 * executor takes them: inline, their callbacks run before this returns). */
static void deliver_chunk(jstore *s)
{
    struct tw__durable_jobs jobs;
    tw__durable_jobs_init(&jobs);
    uint64_t lsn = 0;
    size_t bytes = 0; /* payloads read under the mutex in this chunk */
    while (s->due_pos < s->ndue && jobs.n < TW__JOURNAL_CHUNK &&
           bytes < CHUNK_BYTES) {
        struct tw__key_entry *n = s->due[s->due_pos++];
        if (n->fl & ENT_ORPHAN) {
            s->counts.backlog--;
            tw__key_entry_free(&s->keys, n);
            continue;
        }
        struct delivery *dl = start_delivery(s, n, &lsn);
        if (!dl)
            continue;
        bytes += dl->rec.size;
        tw__durable_jobs_add(&jobs, &dl->job);
    }
    if (s->due_pos == s->ndue)
        s->ndue = s->due_pos = 0;
    if (!jobs.n)
        return;
    /* The FIRE records are durable before any callback runs; if that fails
     * the deliveries still happen (at least once holds; only the attempt a
     * repeat after a crash shows may be lower). */
    (void)tw__jr_wait(&s->w, lsn);
    pthread_mutex_unlock(&s->mu);
    tw__durable_exec_submit(&s->exec, &jobs);
    pthread_mutex_lock(&s->mu);
}

/* ------------------------------------------------------------------------ */
/* The store's thread. */

/* With the real clocks: the monotonic time (ns) at which the wall clock
 * reaches Unix ms @tick. A sleep of whole ms from the round's reading of
 * the wall clock, truncated to ms, wakes up to a millisecond after the
 * tick (half a millisecond late on average, every delivery). */
static uint64_t mono_at_tick(jstore *s, uint64_t tick)
{
    struct timespec rt;
    uint64_t m = s->mono_ns(s->clock_arg);
    clock_gettime(CLOCK_REALTIME, &rt);
    int64_t left = (int64_t)tick * 1000000 -
                   ((int64_t)rt.tv_sec * 1000000000 + rt.tv_nsec);
    return m + (left > 0 ? (uint64_t)left : 0);
}

/* Sleep until the wheel's next expiry or WALL_CHECK_MS after the round
 * began: at wall time @now, monotonic time @mono0 (read first, so that a
 * clock that moved after either reading makes the sleep shorter, never
 * longer: a round's callbacks may take long, and an injected clock only
 * moves when a test moves it). */
static void wait_round(jstore *s, int64_t now, uint64_t mono0)
{
    uint64_t next = tw_wheel_next_expiry(s->wheel);
    uint64_t tnow = tw__journal_tick(now);
    uint64_t ms = WALL_CHECK_MS;
    if (next <= tnow)
        ms = 0;
    else if (next - tnow < ms)
        ms = next - tnow;
    if (s->w.sync_mode == TW_DURABLE_SYNC_INTERVAL) {
        uint64_t left = s->next_sync > mono0
                            ? (s->next_sync - mono0 + 999999u) / 1000000u
                            : 0;
        if (left < ms)
            ms = left;
    }
    s->wake_at = now + (int64_t)ms;
    if (ms == 0 || s->kicked || s->stop || s->round_req != s->round_done)
        return;
    uint64_t until = mono0 + ms * 1000000u;
    if (ms == next - tnow && s->wall_ms == tw__durable_real_wall_ms)
        until = mono_at_tick(s, next);
    while (!s->kicked && !s->stop && s->round_req == s->round_done) {
        uint64_t m = s->mono_ns(s->clock_arg);
        if (m >= until)
            break;
        /* An injected clock is polled every millisecond of real time. */
        uint64_t wait = s->fake_mono ? 1000000u : until - m;
        struct timespec ts;
        tw__mono_after(&ts, wait);
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
}

/* SYNC_INTERVAL: fdatasync what was written, once every sync_every_ns
 * (monotonic @mono), on the sync thread: an fdatasync of a second's
 * writes can take tens of milliseconds, and timers due meanwhile would
 * wait for it on this thread. A failure is tried again at the next
 * interval. */
static void interval_sync(jstore *s, uint64_t mono)
{
    if (s->w.sync_mode != TW_DURABLE_SYNC_INTERVAL || mono < s->next_sync)
        return;
    s->next_sync = mono + s->sync_every_ns;
    if (!s->sync_thr_on) {
        (void)tw__jr_sync_all(&s->w);
        return;
    }
    s->sync_req++;
    pthread_cond_broadcast(&s->sync_cv);
}

/* The sync thread: one tw__jr_sync_all() per request (mutex held, but
 * released during the fdatasync). */
static void *sync_main(void *arg)
{
    jstore *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        if (s->sync_done == s->sync_req) {
            pthread_cond_wait(&s->sync_cv, &s->mu);
            continue;
        }
        uint64_t req = s->sync_req;
        (void)tw__jr_sync_all(&s->w);
        s->sync_done = req;
        pthread_cond_broadcast(&s->sync_cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* tw__durable_sync()'s round: the syncs it asked for have ended too. */
static void sync_wait_idle(jstore *s)
{
    while (s->sync_done != s->sync_req && !s->stop)
        pthread_cond_wait(&s->sync_cv, &s->mu);
}

static void *store_main(void *arg)
{
    jstore *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        uint64_t req = s->round_req;
        s->kicked = false;
        uint64_t mono0 = s->mono_ns(s->clock_arg);
        int64_t now = tw__journal_wall(s);
        /* Never backwards: after a step back, what is already due still
         * runs (see the top of src/durable_journal.c). */
        uint64_t t = tw__journal_tick(now);
        advancing = s;
        tw_wheel_advance(
            s->wheel, t > tw_wheel_now(s->wheel) ? t : tw_wheel_now(s->wheel));
        advancing = NULL;
        while (s->due_pos < s->ndue && !s->stop)
            deliver_chunk(s);
        for (int k = 0; k < 8 && tw__journal_need_compact(s); k++)
            if (tw__journal_compact_oldest(s) != 0)
                break;
        interval_sync(s, mono0);
        if (tw__jr_wb_wanted(&s->w)) {
            pthread_mutex_unlock(&s->mu);
            tw__jr_writeback(&s->w);
            pthread_mutex_lock(&s->mu);
        }
        if (s->round_req != s->round_done && !s->stop &&
            tw__durable_exec_threaded(&s->exec)) {
            /* tw__durable_sync(): this round's callbacks return first. */
            pthread_mutex_unlock(&s->mu);
            tw__durable_exec_wait_idle(&s->exec);
            pthread_mutex_lock(&s->mu);
        }
        if (s->round_req != s->round_done)
            sync_wait_idle(s);
        s->round_done = req;
        pthread_cond_broadcast(&s->round_cv);
        wait_round(s, now, mono0);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Test hook: returns once the store's thread has run a whole round that
 * began after this call and every callback it started has returned. */
void tw__durable_sync(tw_durable *d)
{
    jstore *s = (jstore *)d;
    pthread_mutex_lock(&s->mu);
    uint64_t req = ++s->round_req;
    s->kicked = true;
    pthread_cond_signal(&s->cv);
    while (s->round_done < req)
        pthread_cond_wait(&s->round_cv, &s->mu);
    pthread_mutex_unlock(&s->mu);
}

/* Stop the sync thread, if it runs. */
static void stop_sync_thread(jstore *s)
{
    if (!s->sync_thr_on)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->sync_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->sync_thr, NULL);
    s->sync_thr_on = false;
}

/* Start the executors and the store's thread; on failure none is left
 * running. */
int tw__journal_start_threads(jstore *s, uint32_t nexec)
{
    int rc =
        tw__durable_exec_init(&s->exec, nexec, run_delivery, drop_delivery, s);
    if (!rc)
        rc = tw__durable_exec_start(&s->exec);
    if (!rc && s->w.sync_mode == TW_DURABLE_SYNC_INTERVAL) {
        if (pthread_create(&s->sync_thr, NULL, sync_main, s) != 0)
            rc = TW_ENOMEM;
        s->sync_thr_on = rc == 0;
    }
    if (!rc && pthread_create(&s->thr, NULL, store_main, s) != 0) {
        rc = TW_ENOMEM;
        stop_sync_thread(s);
    }
    if (rc)
        tw__durable_exec_stop(&s->exec);
    return rc;
}

void tw__journal_stop_threads(jstore *s)
{
    pthread_join(s->thr, NULL);
    stop_sync_thread(s);
    /* A delivery still queued is dropped (delivered after reopen). */
    tw__durable_exec_stop(&s->exec);
}
