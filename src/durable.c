/* SPDX-License-Identifier: MIT */
/*
 * src/durable.c - twheel/durable.h: the public calls, and the journal
 * backend (a journal in a directory with the core wheel as its index).
 *
 * Design
 * ------
 * One mutex orders everything: a call appends its record
 * (journal_writer.c) and changes the in-memory index in the same critical
 * section, so the journal's order is the order of the changes; then it
 * waits for group commit. A schedule is a batch of one: a batch stages
 * its records, writes them with one pwrite() per SCHED_GROUP, applies them
 * to the index in order, and waits once.
 *
 * Index: a hash table of keys (chained) to entries. An entry is a tw_timer in
 * the wheel (tick = Unix ms) whose arg slot is the hash link, where its
 * schedule record lives (segment, offset), how many deliveries began
 * since that record was written (FIRE records after it; the attempt a
 * delivery shows is the record's attempt plus those), the key's length and
 * flags: 52 bytes on LP64, then the key, in 8-byte size classes. Payloads and
 * due times stay on disk; the store's thread reads the record back when the
 * timer fires.
 *
 * Replay (journal_reader.c lists, reads and scans the segments; this file
 * applies their records) goes in order: SCHED makes or replaces the key's
 * entry, CANCEL and DONE remove it, FIRE counts a delivery that began, DEAD
 * makes or replaces it as a dead letter.
 *
 * With a retry policy (max_attempts) a crash must count against the
 * timer whose callback was running, not against every timer of its chunk
 * whose callback had not started yet: then each delivery's FIRE record is
 * written just before its own callback starts (under the mutex, in
 * begin_delivery()), and not synced: a kill -9 keeps it (it is in the
 * kernel), a crash of the machine may lose the count of the last
 * attempts.
 *
 * Retry policy and dead letters: after a callback, tw__retry_next()
 * (src/durable_dead.c) says done, again in n ms, or dead. A delivery whose
 * attempt (the record's plus its FIRE records) would pass max_attempts,
 * i.e. the earlier ones crashed, goes dead before its callback runs. Dead
 * is a DEAD record, the SCHED record's body (due time of the last
 * delivery, attempts made, payload) under another type: the entry stays
 * in the key table, out of the wheel, until a schedule replaces it, a
 * rearm writes a SCHED record for it, or a delete a CANCEL record.
 * Compaction copies DEAD records forward as it copies SCHED records.
 *
 * Firing: the store's thread advances the wheel to the wall clock; due
 * entries are marked FIRING, their records read, FIRE records appended and
 * synced (so a redelivery after a crash shows attempt + 1), then the
 * callbacks run on the shared executor (src/durable_exec.h): on that
 * thread, or on executor_threads of their own. After a callback, a
 * DONE record (or a new SCHED for a retry) is appended if the entry is still
 * the key's current version; a key replaced or cancelled meanwhile left its
 * old entry ORPHAN, which is just freed. A cancel or replace marks the entry
 * ORPHAN under the mutex, and a callback starts only after a look at that
 * mark under the same mutex (begin_delivery()), so once a cancel or replace
 * has returned, no delivery of the old version whose callback had not
 * started will start; only one already running is not stopped. DONE records are
 * not waited for: a crash before they are durable means a repeat delivery,
 * which the contract allows.
 *
 * Time: the thread sleeps on CLOCK_MONOTONIC for at most WALL_CHECK_MS
 * between readings of the wall clock. The wheel never goes back: after the
 * wall clock steps back by S, timers keep their Unix due times and fire
 * when the wall clock reaches them again; a timer scheduled during such a
 * step for a due time the wheel has already passed fires at once (early by
 * at most S). A step forward fires everything the wall clock now says is
 * due, within WALL_CHECK_MS.
 *
 * Compaction: only the oldest segment is ever deleted, so a CANCEL or DONE
 * record never outlives the SCHED records it ends. When the journal holds
 * more than twice its estimated live bytes plus one segment, the store's
 * thread copies the live SCHED records of the oldest segment to the end of
 * the journal, syncs, and deletes it.
 */
#define _GNU_SOURCE

#include "twheel/durable.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "durable_backend.h"
#include "durable_exec.h"
#include "durable_index.h"
#include "internal.h"
#include "journal.h"
#include "key_table.h"

#define WALL_CHECK_MS 250
#define CHUNK 256
#define CHUNK_BYTES (4u << 20)
#define RETRY_IO_MS 1000

/* An entry's fl: bits 0-12 count the FIRE records after the entry's SCHED
 * record (deliveries begun since it was written; saturating), bits 13 to
 * 15 are flags. ENT_DEAD: a dead letter, whose record is a DEAD record; it
 * is in the key table (and the dead index once built) but never in the
 * wheel or the ordered index of pending timers. */
#define ENT_FIRES 0x1fffu
#define ENT_DEAD 0x2000u
#define ENT_FIRING 0x4000u
#define ENT_ORPHAN 0x8000u

struct delivery {
    struct tw__durable_job job; /* first: the executor's link */
    struct tw__key_entry *entry;
    uint32_t attempt; /* this delivery's: deliveries begun, itself included */
    jr_rec rec;       /* points into raw */
    unsigned char raw[];
};

typedef struct jstore {
    struct tw_durable base;
    pthread_mutex_t mu;
    jr_writer w;
    tw_wheel *wheel;
    struct tw__key_table keys; /* src/key_table.h */
    tw_durable_fire_fn fire;
    void *fire_arg;
    int64_t (*wall_ms)(void *);
    uint64_t (*mono_ns)(void *);
    void *clock_arg;
    bool fake_mono;
    int dirfd, lockfd;

    pthread_t thr;
    pthread_cond_t cv; /* CLOCK_MONOTONIC */
    bool stop, kicked;
    int64_t wake_at;
    uint64_t round_req, round_done;
    pthread_cond_t round_cv;
    struct tw__key_entry **due;
    size_t ndue, due_cap, due_pos;

    /* Runs the callbacks (src/durable_exec.h): on this store's thread,
     * or on executor_threads of their own. */
    struct tw__durable_exec exec;

    uint64_t cancelled, recovered, recovery_us;
    uint64_t sync_every_ns, next_sync; /* SYNC_INTERVAL, monotonic ns */
    /* Flat combining of schedule calls: queued (newest first), the
     * holder of mu applying them, a futex word bumped when it lets go. */
    _Atomic(struct sreq *) pend;
    atomic_bool combining;
    jr_futex apply_seq;
    /* fired, retried, lateness, running; backlog: entries due (in due[] or
     * the executor's queue) whose callback has not begun. */
    struct tw__durable_counts counts;
    /* tw_durable_list()'s ordered index (src/durable_index.c): NULL until
     * its first call builds it; from then on every entry in the key table
     * is in it at tw_timer_expires() of its timer (rearm(), entry_remove()).
     * If keeping it up to date runs out of memory it is dropped, and the
     * next listing builds it again. */
    tw__dx *dx;
    /* While @dx is being built (index_step()): keys whose hash modulo
     * @dx_mod is below @dx_pos have been visited. */
    bool dx_building;
    size_t dx_mod, dx_pos;
    /* tw_durable_scan() calls running: compaction waits for them (it
     * would move records a scan has not read yet behind its position). */
    unsigned scanning;
    /* The dead letters in key order (all at tick 0) for
     * tw_durable_list_dead(): NULL until its first call, as dx. */
    tw__dx *dxd;
    uint64_t ndead;         /* entries with ENT_DEAD */
    struct tw__retry retry; /* cfg's policy */
    /* TW_DURABLE_READONLY: no lock, no writes, no threads; NOFIRE (or
     * READONLY): no store thread or executors, so nothing is delivered. */
    bool readonly, nofire;
} jstore;

/* ------------------------------------------------------------------------ */
/* Clocks. */

static int64_t real_wall_ms(void *arg)
{
    (void)arg;
    return (int64_t)(tw__clock_ns(CLOCK_REALTIME) / 1000000u);
}

static uint64_t real_mono_ns(void *arg)
{
    (void)arg;
    return tw__clock_ns(CLOCK_MONOTONIC);
}

static int64_t wall(jstore *s)
{
    return s->wall_ms(s->clock_arg);
}

static uint64_t tick_of(int64_t ms)
{
    return ms < 0 ? 0 : (uint64_t)ms;
}

/* ------------------------------------------------------------------------ */
/* Key entries. */

static void on_due(tw_timer *t, void *arg);

/* @n's current version is the SCHED record at @seg/@off, whose attempt
 * counts every delivery begun so far (none since it). */
static void entry_record(struct tw__key_entry *n, uint32_t seg, uint32_t off)
{
    n->seg = seg;
    n->off = off;
    n->fl &= (uint16_t)~ENT_FIRES;
}

/* One more delivery of @n began (its FIRE record is written). */
static void fires_add(struct tw__key_entry *n)
{
    if ((n->fl & ENT_FIRES) != ENT_FIRES)
        n->fl++;
}

/* A record's attempt plus @fires deliveries begun after it (saturating). */
static uint32_t attempt_sum(uint32_t rec, unsigned fires)
{
    return rec > UINT32_MAX - fires ? UINT32_MAX : rec + fires;
}

static void seg_live(jstore *s, uint32_t no, int delta)
{
    jr_seg *g = tw__jr_seg(&s->w, no);
    if (g)
        g->live += (uint64_t)(int64_t)delta;
}

/* ------------------------------------------------------------------------ */
/* The ordered index of tw_durable_list(), once built. */

static void index_drop(jstore *s)
{
    tw__dx_free(s->dx);
    s->dx = NULL;
    s->dx_building = false;
}

/* Entry @n leaves the key table (or is about to move). */
static void index_out(jstore *s, struct tw__key_entry *n)
{
    if (s->dx)
        (void)tw__dx_erase(s->dx, tw_timer_expires(&n->tm), (uintptr_t)n);
}

/* Arm entry @n (in the key table) for @tick, in the wheel and the index. */
static void rearm(jstore *s, struct tw__key_entry *n, uint64_t tick)
{
    index_out(s, n);
    tw_wheel_add(s->wheel, &n->tm, tick);
    if (s->dx && tw__dx_insert(s->dx, tick, (uintptr_t)n) != 0)
        index_drop(s);
}

/* The dead index, once built: entry @n enters it. */
static void dead_in(jstore *s, struct tw__key_entry *n)
{
    if (s->dxd && tw__dx_insert(s->dxd, 0, (uintptr_t)n) != 0) {
        tw__dx_free(s->dxd); /* the next listing builds it again */
        s->dxd = NULL;
    }
}

/* Entry @n is not a dead letter any more (if it was). */
static void dead_clear(jstore *s, struct tw__key_entry *n)
{
    if (!(n->fl & ENT_DEAD))
        return;
    if (s->dxd)
        (void)tw__dx_erase(s->dxd, 0, (uintptr_t)n);
    n->fl &= (uint16_t)~ENT_DEAD;
    s->ndead--;
}

/* Make entry @n (in the key table, neither in the wheel's hands nor being
 * delivered) a dead letter: a DEAD record with @rec's due time and
 * payload and @attempt attempts made. Not waited for, as DONE is not: a
 * crash before it is durable brings the timer back, and the policy sends
 * it here again. Returns 0 or the append's error (nothing changed). Mutex
 * held. */
static int to_dead(jstore *s, struct tw__key_entry *n, const jr_rec *rec,
                   uint32_t attempt)
{
    uint32_t seg, off;
    uint64_t lsn;
    int rc =
        tw__jr_append(&s->w, JR_DEAD, n->key, n->key_len, rec->due_ms, attempt,
                      rec->payload, rec->payload_len, &seg, &off, &lsn);
    if (rc)
        return rc;
    seg_live(s, n->seg, -1);
    seg_live(s, seg, +1);
    entry_record(n, seg, off);
    index_out(s, n);
    tw_wheel_cancel(s->wheel, &n->tm);
    n->fl |= ENT_DEAD;
    s->ndead++;
    dead_in(s, n);
    return 0;
}

/* Unlink the entry at @p from the table and the wheel; free it unless a
 * delivery still holds it (then it becomes an orphan). */
static void entry_remove(jstore *s, struct tw__key_pos p)
{
    struct tw__key_entry *n = tw__key_take(&s->keys, p);
    index_out(s, n);
    dead_clear(s, n);
    seg_live(s, n->seg, -1);
    if (n->fl & ENT_FIRING) {
        n->fl |= ENT_ORPHAN;
    } else {
        tw_wheel_cancel(s->wheel, &n->tm);
        tw__key_entry_free(&s->keys, n);
    }
}

/* ------------------------------------------------------------------------ */
/* Schedule and cancel. */

static void kick_if_earlier(jstore *s, int64_t due)
{
    if (due < s->wake_at) {
        s->kicked = true;
        pthread_cond_signal(&s->cv);
    }
}

/* One item of a schedule batch while its group of records is staged. */
struct staged_item {
    struct tw__key_entry *fresh; /* the entry its key gets, if it needs a new
                            one (a cancel: the entry it ends) */
    uint32_t seg, off;           /* where its record goes */
    bool staged;
};

/* Items staged before their records are written with one pwrite(). */
#define SCHED_GROUP 64
/* Rounds of queued calls one combiner applies before it lets go. */
#define COMBINE_ROUNDS 4

/* A tw_durable_schedule_many() or tw_durable_cancel_many() call queued
 * for the combiner. */
struct sreq {
    struct sreq *next;
    tw_durable_item *items;
    size_t n;
    bool cancel;  /* the items are cancels */
    uint64_t lsn; /* the end of its records once applied; 0: none */
    atomic_bool done;
};

/* An entry for @it's key if it needs one: the key is new, or its entry is
 * being delivered (that entry becomes an orphan). */
static int sched_prepare(jstore *s, const tw_durable_item *it,
                         struct tw__key_entry **fresh)
{
    struct tw__key_entry *old =
        tw__key_at(&s->keys, tw__key_find(&s->keys, it->key, it->key_len));
    *fresh = NULL;
    if (old && !(old->fl & ENT_FIRING))
        return 0;
    if (!old) {
        int rc = tw__key_reserve(&s->keys);
        if (rc)
            return rc;
    }
    *fresh = tw__key_entry_new(&s->keys, it->key, it->key_len, on_due);
    return *fresh ? 0 : TW_ENOMEM;
}

/* Point @it's key at its record, written at @seg/@off. @fresh is non-NULL
 * whenever the key has no entry or one being delivered: sched_prepare()
 * made it, and only the same batch's earlier items changed the index since
 * (they add and replace, never remove or start a delivery). */
static void sched_apply(jstore *s, const tw_durable_item *it,
                        struct tw__key_entry *fresh, uint32_t seg, uint32_t off)
{
    struct tw__key_pos p = tw__key_find(&s->keys, it->key, it->key_len);
    struct tw__key_entry *n = tw__key_at(&s->keys, p);
    if (n && !(n->fl & ENT_FIRING)) {
        if (fresh) /* an earlier item of the batch made the entry */
            tw__key_entry_free(&s->keys, fresh);
        seg_live(s, n->seg, -1);
        dead_clear(s, n); /* a dead letter is replaced as well */
    } else {
        if (n) /* being delivered: it becomes an orphan */
            entry_remove(s, p);
        tw__key_insert(&s->keys, p, fresh);
        n = fresh;
    }
    entry_record(n, seg, off); /* its attempt is 0 */
    seg_live(s, seg, +1);
    rearm(s, n, tick_of(it->due_ms));
    kick_if_earlier(s, it->due_ms);
}

/* Write the records staged for items[0 .. @n) (their states in @st) and
 * apply them (schedules, or cancels that take their keys out), or give
 * them the write's error. Raises *@lsn on success. */
static void commit_group(jstore *s, tw_durable_item *items,
                         struct staged_item *st, size_t n, bool cancel,
                         uint64_t *lsn)
{
    uint64_t end;
    int rc = tw__jr_flush(&s->w, &end);
    for (size_t i = 0; i < n; i++) {
        if (!st[i].staged)
            continue;
        if (rc) {
            items[i].result = rc;
            if (!cancel && st[i].fresh)
                tw__key_entry_free(&s->keys, st[i].fresh);
        } else if (cancel) {
            entry_remove(
                s, tw__key_find(&s->keys, items[i].key, items[i].key_len));
            s->cancelled++;
        } else {
            sched_apply(s, &items[i], st[i].fresh, st[i].seg, st[i].off);
        }
    }
    if (!rc && end > *lsn)
        *lsn = end;
}

/* Stage @it's SCHED record (state in @e); TW_EAGAIN: commit first. */
static int sched_stage(jstore *s, tw_durable_item *it, struct staged_item *e)
{
    e->staged = false;
    int rc = sched_prepare(s, it, &e->fresh);
    if (rc)
        return rc;
    rc = tw__jr_stage(&s->w, JR_SCHED, it->key, it->key_len, it->due_ms, 0,
                      it->payload, it->payload_len, &e->seg, &e->off);
    if (rc) {
        if (e->fresh)
            tw__key_entry_free(&s->keys, e->fresh);
        return rc;
    }
    e->staged = true;
    return 0;
}

/* Start loading the key table's buckets of @n items (at most
 * SCHED_GROUP), then their first and second entries: a large table misses the
 * cache on nearly every lookup, and the misses of a group overlap this way
 * instead of coming one after the other. */
static void prefetch_keys(jstore *s, const tw_durable_item *items, size_t n)
{
    if (n < 2 || s->keys.nbuckets < 4096) /* nothing to overlap, or cached */
        return;
    for (size_t i = 0; i < n; i++)
        __builtin_prefetch(
            tw__key_bucket(&s->keys, tw__key_hash(s->keys.seed, items[i].key,
                                                  items[i].key_len)));
    struct tw__key_entry *first[SCHED_GROUP];
    for (size_t i = 0; i < n; i++) {
        first[i] = tw__key_entry_of(
            &s->keys,
            *tw__key_bucket(&s->keys, tw__key_hash(s->keys.seed, items[i].key,
                                                   items[i].key_len)));
        if (first[i])
            __builtin_prefetch(first[i]);
    }
    /* A bucket holds up to two keys: its second entry too. */
    for (size_t i = 0; i < n; i++)
        if (first[i] && tw__key_link(first[i]))
            __builtin_prefetch(
                tw__key_entry_of(&s->keys, tw__key_link(first[i])));
}

/* The same for the keys of @n (<= RECS_AHEAD) records, @stride bytes
 * apart from @r: replay and scan look up one record's key after the
 * other, each a miss in a large table unless asked for ahead. */
#define RECS_AHEAD 16
static void prefetch_recs(jstore *s, const jr_rec *r, size_t n, size_t stride)
{
    if (s->keys.nbuckets < 4096)
        return;
    tw__key_handle *b[RECS_AHEAD];
    for (size_t i = 0; i < n; i++) {
        const jr_rec *x = (const jr_rec *)((const char *)r + i * stride);
        b[i] = tw__key_bucket(&s->keys,
                              tw__key_hash(s->keys.seed, x->key, x->key_len));
        __builtin_prefetch(b[i]);
    }
    for (size_t i = 0; i < n; i++) {
        struct tw__key_entry *first = tw__key_entry_of(&s->keys, *b[i]);
        if (first)
            __builtin_prefetch(first);
    }
}

/* Stage @it's CANCEL record, the @k-th of its group (state in @st[k]; the
 * entry it ends in st[k].fresh); TW_EAGAIN: commit first. A key the group
 * already cancels is gone (TW_ENOENT), as if the calls had been made one
 * after the other. */
static int cancel_stage(jstore *s, tw_durable_item *it, struct staged_item *st,
                        size_t k)
{
    st[k].staged = false;
    struct tw__key_entry *nd =
        tw__key_at(&s->keys, tw__key_find(&s->keys, it->key, it->key_len));
    for (size_t j = 0; nd && j < k; j++)
        if (st[j].staged && st[j].fresh == nd)
            nd = NULL;
    if (!nd || (nd->fl & ENT_DEAD)) /* a dead letter is not pending */
        return TW_ENOENT;
    int rc = tw__jr_stage(&s->w, JR_CANCEL, it->key, it->key_len, 0, 0, NULL, 0,
                          &st[k].seg, &st[k].off);
    st[k].staged = rc == 0;
    st[k].fresh = nd;
    return rc;
}

/* Stage, write and apply one call's items (mutex held), schedules or
 * cancels: their records go out in groups of SCHED_GROUP (one pwrite
 * each, fewer when a segment fills); *@lsn becomes the end of the last
 * one written (0: none). */
static void apply_items(jstore *s, tw_durable_item *items, size_t n,
                        bool cancel, uint64_t *lsn)
{
    struct staged_item st[SCHED_GROUP];
    size_t from = 0;
    for (size_t i = 0; i < n;) {
        if (i - from == SCHED_GROUP) {
            commit_group(s, items + from, st, i - from, cancel, lsn);
            from = i;
        }
        if (i == from)
            prefetch_keys(s, items + i,
                          n - i < SCHED_GROUP ? n - i : SCHED_GROUP);
        int rc = cancel ? cancel_stage(s, &items[i], st, i - from)
                        : sched_stage(s, &items[i], &st[i - from]);
        if (rc == TW_EAGAIN) { /* a flush makes room; then stage again */
            commit_group(s, items + from, st, i - from, cancel, lsn);
            from = i;
            continue;
        }
        items[i].result = rc;
        i++;
    }
    commit_group(s, items + from, st, n - from, cancel, lsn);
}

/* Apply every call queued so far, in arrival order (mutex held), a few
 * rounds while more arrive; each is marked done once applied, and its
 * caller may return at once, so nothing of it is touched after that. */
static void combine(jstore *s)
{
    atomic_store(&s->combining, true);
    for (int round = 0; round < COMBINE_ROUNDS; round++) {
        struct sreq *r = atomic_exchange(&s->pend, NULL), *fifo = NULL;
        if (!r)
            break;
        while (r) {
            struct sreq *nx = r->next;
            r->next = fifo;
            fifo = r;
            r = nx;
        }
        for (r = fifo; r;) {
            struct sreq *nx = r->next;
            apply_items(s, r->items, r->n, r->cancel, &r->lsn);
            atomic_store_explicit(&r->done, true, memory_order_release);
            r = nx;
        }
    }
    atomic_store(&s->combining, false);
}

/* Wait until a combiner (perhaps this caller) has applied @me. A caller
 * that finds the mutex taken by a combiner sleeps on apply_seq instead of
 * queueing for the mutex; when no combiner runs it takes the mutex. */
static void wait_applied(jstore *s, struct sreq *me)
{
    while (!atomic_load_explicit(&me->done, memory_order_acquire)) {
        unsigned seq = atomic_load(&s->apply_seq.word);
        bool locked = pthread_mutex_trylock(&s->mu) == 0;
        if (!locked && !atomic_load(&s->combining)) {
            pthread_mutex_lock(&s->mu);
            locked = true;
        }
        if (locked) {
            if (!atomic_load_explicit(&me->done, memory_order_acquire))
                combine(s);
            if (tw__jr_wb_wanted(&s->w) && !s->kicked) {
                s->kicked = true; /* the store's thread starts writeback */
                pthread_cond_signal(&s->cv);
            }
            pthread_mutex_unlock(&s->mu);
            /* Callers that queued meanwhile try again. */
            tw__futex_bump(&s->apply_seq);
            return;
        }
        tw__futex_wait(&s->apply_seq, seq);
    }
}

/* Group commit of a batch: the call is queued, applied by whichever
 * caller holds the mutex (flat combining: one lock hand-off for many
 * calls, schedules and cancels in arrival order), then one wait covers its
 * records. */
static int j_submit(jstore *s, tw_durable_item *items, size_t n, bool cancel)
{
    struct sreq me = {.items = items, .n = n, .cancel = cancel};
    me.next = atomic_load(&s->pend);
    while (!atomic_compare_exchange_weak(&s->pend, &me.next, &me))
        ;
    wait_applied(s, &me);
    int rc = me.lsn ? tw__jr_wait_nolock(&s->w, me.lsn) : 0;
    for (size_t i = 0; i < n; i++)
        if (!items[i].result)
            items[i].result = rc;
    return tw__durable_first_error(items, n);
}

static int j_schedule_many(tw_durable *d, tw_durable_item *items, size_t n)
{
    return j_submit((jstore *)d, items, n, false);
}

static int j_cancel_many(tw_durable *d, tw_durable_item *items, size_t n)
{
    return j_submit((jstore *)d, items, n, true);
}

static int j_schedule(tw_durable *d, const void *key, size_t key_len,
                      int64_t due_ms, const void *payload, size_t payload_len)
{
    tw_durable_item it = {.key = key,
                          .key_len = key_len,
                          .due_ms = due_ms,
                          .payload = payload,
                          .payload_len = payload_len};
    return j_schedule_many(d, &it, 1);
}

static int j_cancel(tw_durable *d, const void *key, size_t key_len)
{
    tw_durable_item it = {.key = key, .key_len = key_len};
    return j_cancel_many(d, &it, 1);
}

static int j_stats(tw_durable *d, tw_durable_stats *out)
{
    jstore *s = (jstore *)d;
    pthread_mutex_lock(&s->mu);
    memset(out, 0, sizeof *out);
    out->pending = s->keys.count - s->ndead;
    out->dead = s->ndead;
    out->cancelled = s->cancelled;
    for (size_t i = 0; i < s->w.nseg; i++)
        out->journal_bytes += s->w.segs[i].size;
    out->segments = s->w.nseg;
    out->recovered = s->recovered;
    out->recovery_us = s->recovery_us;
    out->syncs = s->w.syncs;
    tw__durable_counts_stats(&s->counts, out);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Firing. */

/* The store whose thread is in store_main()'s tw_wheel_advance(): entries'
 * arg slots hold the key table's links, so on_due() finds its store
 * here. */
static _Thread_local jstore *advancing;

static void on_due(tw_timer *t, void *arg)
{
    (void)arg; /* tw__key_link(), not ours to use here */
    jstore *s = advancing;
    struct tw__key_entry *n = TW_CONTAINER_OF(t, struct tw__key_entry, tm);
    if (s->ndue == s->due_cap) {
        size_t nc = s->due_cap ? s->due_cap * 2 : 256;
        struct tw__key_entry **nd = tw__realloc(s->due, nc * sizeof *nd);
        if (!nd) { /* try again in a moment */
            rearm(s, n, tick_of(wall(s)) + RETRY_IO_MS);
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
static struct delivery *read_record(jstore *s, struct tw__key_entry *n)
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
        if (to_dead(s, n, &dl->rec, dl->attempt) != 0)
            rearm(s, n, tick_of(wall(s)) + RETRY_IO_MS);
    } else if (next > 0) {
        int64_t due = wall(s) + next;
        uint32_t seg, off;
        uint64_t lsn;
        n->fl &= (uint16_t)~ENT_FIRING;
        if (tw__jr_append(&s->w, JR_SCHED, n->key, n->key_len, due, dl->attempt,
                          dl->rec.payload, dl->rec.payload_len, &seg, &off,
                          &lsn) == 0) {
            seg_live(s, n->seg, -1);
            seg_live(s, seg, +1);
            entry_record(n, seg, off);
        }
        /* On failure the old record and its FIRE records stay: after a
         * crash it is delivered again with a higher attempt. */
        rearm(s, n, tick_of(due));
        kick_if_earlier(s, due);
    } else {
        uint32_t seg, off;
        uint64_t lsn;
        /* Not waited for: a DONE lost in a crash means one more delivery. */
        (void)tw__jr_append(&s->w, JR_DONE, n->key, n->key_len, 0, 0, NULL, 0,
                            &seg, &off, &lsn);
        n->fl &= (uint16_t)~ENT_FIRING;
        entry_remove(s, tw__key_find(&s->keys, n->key, n->key_len));
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
            fires_add(dl->entry);
    }
    tw__durable_counts_begin(&s->counts,
                             tw__durable_late_us(wall(s), dl->rec.due_ms));
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
    struct delivery *dl = read_record(s, n);
    uint32_t seg, off;
    unsigned fires = n->fl & ENT_FIRES;
    if (dl &&
        !tw__retry_may(&s->retry, attempt_sum(dl->rec.attempt, fires + 1u))) {
        /* The deliveries before crashed (each left a FIRE record): the
         * policy's attempts are used up. */
        s->counts.backlog--;
        n->fl &= (uint16_t)~ENT_FIRING;
        if (to_dead(s, n, &dl->rec, attempt_sum(dl->rec.attempt, fires)))
            rearm(s, n, tw_wheel_now(s->wheel) + RETRY_IO_MS);
        tw__free(dl);
        return NULL;
    }
    /* With a retry policy the FIRE record waits for the callback
     * (begin_delivery()): see the top of the file. */
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
        rearm(s, n, tw_wheel_now(s->wheel) + RETRY_IO_MS);
        return NULL;
    }
    if (!per_callback)
        fires_add(n);
    dl->attempt =
        attempt_sum(dl->rec.attempt, (n->fl & ENT_FIRES) + per_callback);
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

/* Deliver up to CHUNK due entries (mutex held; released while the executor
 * takes them: inline, their callbacks run before this returns). */
static void deliver_chunk(jstore *s)
{
    struct tw__durable_jobs jobs;
    tw__durable_jobs_init(&jobs);
    uint64_t lsn = 0;
    size_t bytes = 0; /* payloads read under the mutex in this chunk */
    while (s->due_pos < s->ndue && jobs.n < CHUNK && bytes < CHUNK_BYTES) {
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
/* Look-up and listing. */

static void index_key(void *ctx, uintptr_t h, const unsigned char **key,
                      size_t *len)
{
    (void)ctx;
    const struct tw__key_entry *n = (const struct tw__key_entry *)h;
    *key = n->key;
    *len = n->key_len;
}

/* Build an ordered index into *@x from the key table (mutex held): every
 * entry of the table's chains, the old table's unmoved buckets included,
 * that is a dead letter (@dead: at tick 0, so in key order) or pending
 * (!@dead: at its tick). On failure *@x stays NULL. */
static int table_index(jstore *s, tw__dx **x, bool dead)
{
    *x = tw__dx_new(index_key, s, s->keys.seed);
    if (!*x)
        return TW_ENOMEM;
    for (int t = 0; t < 2; t++) {
        const uint32_t *b = t ? s->keys.old : s->keys.buckets;
        size_t from = t ? s->keys.moved : 0,
               to = t ? s->keys.nold : s->keys.nbuckets;
        for (size_t i = from; b && i < to; i++)
            for (struct tw__key_entry *n = tw__key_entry_of(&s->keys, b[i]); n;
                 n = tw__key_entry_of(&s->keys, tw__key_link(n)))
                if (!(n->fl & ENT_DEAD) == !dead &&
                    tw__dx_insert(*x, dead ? 0 : tw_timer_expires(&n->tm),
                                  (uintptr_t)n) != 0) {
                    tw__dx_free(*x);
                    *x = NULL;
                    return TW_ENOMEM;
                }
    }
    return 0;
}

/*
 * The ordered index is built in steps (mutex held for each; listings
 * let go of it between steps, so schedules and firing go on while a
 * large index is built). From the first step on, the index is kept up to
 * date like a built one (rearm(), index_out()), so a key changed before
 * the walk reaches it is in already and the walk skips it (tw__dx_has()).
 * The walk goes by classes of hash modulo @dx_mod, the size of the
 * smaller table when it began: both tables' sizes stay multiples of it as
 * the table grows, so a key's class never changes and every key that was
 * in the table when the walk began is in the buckets of its class,
 * whichever table holds it.
 */
#define INDEX_STEP_BUCKETS 512u

#ifdef TW_TEST_HOOKS
void (*tw__durable_index_hook)(struct tw_durable *d);
#endif

static int index_add(jstore *s, struct tw__key_entry *n)
{
    if (n->fl & ENT_DEAD) /* dead letters are in dxd, not here */
        return 0;
    uint64_t t = tw_timer_expires(&n->tm);
    if (tw__dx_has(s->dx, t, (uintptr_t)n))
        return 0;
    return tw__dx_insert(s->dx, t, (uintptr_t)n);
}

/* One step of the walk; 0 (dx_building cleared when done) or TW_ENOMEM
 * (the index dropped). */
static int index_step(jstore *s)
{
    if (!s->dx) {
        s->dx = tw__dx_new(index_key, s, s->keys.seed);
        if (!s->dx)
            return TW_ENOMEM;
        s->dx_building = true;
        s->dx_mod = s->keys.old ? s->keys.nold : s->keys.nbuckets;
        s->dx_pos = 0;
    }
    if (s->keys.nbuckets < s->dx_mod) { /* never shrinks once open; if it did */
        s->dx_mod = s->keys.nbuckets;
        s->dx_pos = 0; /* again: index_add() skips what is in */
    }
    size_t per = s->keys.nbuckets / s->dx_mod +
                 (s->keys.old ? s->keys.nold / s->dx_mod : 0);
    size_t classes = INDEX_STEP_BUCKETS / per ? INDEX_STEP_BUCKETS / per : 1;
    for (; classes && s->dx_pos < s->dx_mod; classes--, s->dx_pos++)
        for (int t = 0; t < 2; t++) {
            const uint32_t *b = t ? s->keys.old : s->keys.buckets;
            size_t nb = t ? s->keys.nold : s->keys.nbuckets;
            for (size_t i = s->dx_pos; b && i < nb; i += s->dx_mod)
                for (struct tw__key_entry *n = tw__key_entry_of(&s->keys, b[i]);
                     n; n = tw__key_entry_of(&s->keys, tw__key_link(n)))
                    if (index_add(s, n) != 0) {
                        index_drop(s);
                        return TW_ENOMEM;
                    }
        }
    if (s->dx_pos == s->dx_mod)
        s->dx_building = false;
    return 0;
}

/* WAITING or DUE: due by the wall clock, or its delivery has begun. */
static uint32_t entry_state(const struct tw__key_entry *n, int64_t now)
{
    bool due = (n->fl & ENT_FIRING) || tw_timer_expires(&n->tm) <= tick_of(now);
    return due ? TW_DURABLE_DUE : TW_DURABLE_WAITING;
}

static int j_get(tw_durable *d, const void *key, size_t key_len,
                 tw_durable_info *info, void *buf, size_t buf_len)
{
    jstore *s = (jstore *)d;
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    struct tw__key_entry *n =
        tw__key_at(&s->keys, tw__key_find(&s->keys, key, key_len));
    struct delivery *dl = n ? read_record(s, n) : NULL;
    if (!n) {
        rc = TW_ENOENT;
    } else if (!dl) {
        rc = TW_EIO;
    } else {
        /* The next delivery counts one more than those begun so far. */
        info->attempt = attempt_sum(dl->rec.attempt, (n->fl & ENT_FIRES) + 1u);
        info->due_ms = dl->rec.due_ms;
        info->state = entry_state(n, wall(s));
        if (n->fl & ENT_DEAD) { /* the attempts it had */
            info->attempt = dl->rec.attempt;
            info->state = TW_DURABLE_DEAD;
        }
        info->payload_len = dl->rec.payload_len;
        if (buf_len && dl->rec.payload_len)
            memcpy(buf, dl->rec.payload,
                   buf_len < dl->rec.payload_len ? buf_len
                                                 : dl->rec.payload_len);
    }
    pthread_mutex_unlock(&s->mu);
    tw__free(dl);
    return rc;
}

/* Let go of the store's lock after holding it since @t0 (monotonic ns),
 * and leave it free at least that long: a loop of listings (or of the
 * index build's steps) would take it again at once, before a thread woken
 * by the unlock (the store's, about to fire) can run and take it, and
 * firing would wait behind page after page. So a listing loop holds the
 * lock at most about half of the time, and a waiter gets it within one
 * page. */
static void list_unlock(jstore *s, uint64_t t0)
{
    uint64_t held = tw__clock_ns(CLOCK_MONOTONIC) - t0;
    pthread_mutex_unlock(&s->mu);
    if (held < 20000) { /* short: a yield is enough */
        sched_yield();
        return;
    }
    if (held > 10000000)
        held = 10000000;
    struct timespec ts = {0, (long)held};
    nanosleep(&ts, NULL);
}

static int j_list(tw_durable *d, const struct tw__list_req *q,
                  tw_durable_entry *out, bool *end)
{
    jstore *s = (jstore *)d;
    size_t used = 0, n = 0;
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    uint64_t t0 = tw__clock_ns(CLOCK_MONOTONIC);
    while (!rc && (!s->dx || s->dx_building)) {
        rc = index_step(s);
        if (!rc && s->dx_building) {
            /* Let schedules and the store's thread in between steps. */
            list_unlock(s, t0);
#ifdef TW_TEST_HOOKS
            if (tw__durable_index_hook)
                tw__durable_index_hook(d);
#endif
            pthread_mutex_lock(&s->mu);
            t0 = tw__clock_ns(CLOCK_MONOTONIC);
            if (atomic_load(&s->base.closing))
                rc = TW_ESHUTDOWN;
        }
    }
    if (!rc) {
        tw__dx_iter it;
        tw__dx_seek(&it, s->dx, q->from, q->key, q->key_len, q->after);
        int64_t now = wall(s);
        while (n < q->max) {
            uint64_t tick;
            uintptr_t h;
            if (!tw__dx_next(&it, &tick, &h) || tick >= q->to) {
                *end = true;
                break;
            }
            const struct tw__key_entry *dn = (const struct tw__key_entry *)h;
            if (!tw__list_put(q, &used, &out[n], dn->key, dn->key_len, tick,
                              now))
                break;
            if (dn->fl & ENT_FIRING)
                out[n].state = TW_DURABLE_DUE;
            n++;
        }
    }
    list_unlock(s, t0);
    return rc ? rc : (int)n;
}

/* tw_durable_scan(): the segments are read in blocks without the lock
 * (records are never changed once written, and a dup() of the segment's
 * descriptor keeps even a deleted file readable); under the lock, once a
 * block, each SCHED record is looked up: it is handed over when its key's
 * entry still points at it (the key's current version). The scan ends at
 * the journal's end as it was when the call began. */
#define SCAN_BLOCK (1u << 20)
#define SCAN_HITS 4096u

struct scan_hit {
    jr_rec rec;
    uint32_t attempt, state;
    bool live;
};

struct scan_ctx {
    jstore *s;
    tw_durable_scan_fn fn;
    void *arg;
    uint32_t no; /* the segment being read */
    struct scan_hit *hits;
    size_t nhits;
    long count;
    int stop; /* non-zero: what the scan returns */
};

/* Check the hits under the lock, then hand the live ones to the caller. */
static void scan_flush(struct scan_ctx *c)
{
    jstore *s = c->s;
    pthread_mutex_lock(&s->mu);
    int64_t now = wall(s);
    for (size_t i = 0; i < c->nhits; i++) {
        struct scan_hit *h = &c->hits[i];
        if (i % RECS_AHEAD == 0)
            prefetch_recs(s, &h->rec,
                          c->nhits - i < RECS_AHEAD ? c->nhits - i : RECS_AHEAD,
                          sizeof *h);
        struct tw__key_entry *n = tw__key_at(
            &s->keys, tw__key_find(&s->keys, h->rec.key, h->rec.key_len));
        h->live = n && n->seg == c->no && n->off == h->rec.off;
        if (h->live && (n->fl & ENT_DEAD)) { /* as tw_durable_get() says */
            h->attempt = h->rec.attempt;
            h->state = TW_DURABLE_DEAD;
        } else if (h->live) {
            h->attempt = attempt_sum(h->rec.attempt, (n->fl & ENT_FIRES) + 1u);
            h->state = entry_state(n, now);
        }
    }
    pthread_mutex_unlock(&s->mu);
    for (size_t i = 0; i < c->nhits && !c->stop; i++) {
        const struct scan_hit *h = &c->hits[i];
        if (!h->live)
            continue;
        tw_durable_scanned t = {.key = h->rec.key,
                                .key_len = h->rec.key_len,
                                .payload = h->rec.payload,
                                .payload_len = h->rec.payload_len,
                                .due_ms = h->rec.due_ms,
                                .attempt = h->attempt,
                                .state = h->state};
        c->count++;
        int r = c->fn(c->arg, &t);
        if (r)
            c->stop = r < 0 ? r : 1;
    }
    c->nhits = 0;
}

/* tw__jr_read_blocks()'s callbacks: the SCHED and DEAD records of a block
 * are gathered, then checked and handed out before the next block is
 * read. */
static void scan_rec(void *arg, const jr_rec *r)
{
    struct scan_ctx *c = arg;
    if (r->type == JR_SCHED || r->type == JR_DEAD) {
        c->hits[c->nhits++] = (struct scan_hit){.rec = *r};
        if (c->nhits == SCAN_HITS)
            scan_flush(c);
    }
}

static int scan_block_end(void *arg)
{
    struct scan_ctx *c = arg;
    scan_flush(c);
    return c->stop;
}

static long j_scan(tw_durable *d, tw_durable_scan_fn fn, void *arg)
{
    jstore *s = (jstore *)d;
    size_t cap = SCAN_BLOCK + JR_REC_HDR + JR_MAX_BODY; /* any record fits */
    struct scan_ctx c = {.s = s, .fn = fn, .arg = arg};
    unsigned char *buf = tw__malloc(cap);
    c.hits = tw__malloc(SCAN_HITS * sizeof *c.hits);
    if (!buf || !c.hits) {
        tw__free(buf);
        tw__free(c.hits);
        return TW_ENOMEM;
    }
    pthread_mutex_lock(&s->mu);
    s->scanning++;
    uint32_t next = 0, end_no = 0;
    uint64_t end_off = 0;
    if (s->w.nseg) {
        next = s->w.segs[0].no;
        end_no = s->w.segs[s->w.nseg - 1].no;
        end_off = s->w.segs[s->w.nseg - 1].size;
    }
    size_t nseg = s->w.nseg;
    pthread_mutex_unlock(&s->mu);
    int rc = 0;
    while (nseg && !rc && !c.stop) {
        pthread_mutex_lock(&s->mu);
        const jr_seg *g = NULL;
        for (size_t i = 0; i < s->w.nseg && !g; i++)
            if (s->w.segs[i].no >= next && s->w.segs[i].no <= end_no)
                g = &s->w.segs[i];
        int fd = g ? fcntl(g->fd, F_DUPFD_CLOEXEC, 0) : -1;
        uint32_t seed = g ? g->seed : 0;
        uint64_t size = g ? (g->no == end_no ? end_off : g->size) : 0;
        c.no = g ? g->no : 0;
        pthread_mutex_unlock(&s->mu);
        if (!g)
            break;
        if (fd < 0) {
            rc = TW_EIO;
            break;
        }
        rc = tw__jr_read_blocks(fd, seed, JR_SEG_HDR, size, buf, cap, scan_rec,
                                scan_block_end, &c);
        close(fd);
        if (c.no == end_no)
            break;
        next = c.no + 1;
    }
    pthread_mutex_lock(&s->mu);
    s->scanning--;
    pthread_mutex_unlock(&s->mu);
    tw__free(buf);
    tw__free(c.hits);
    if (rc)
        return rc;
    return c.stop < 0 ? c.stop : c.count;
}

/* ------------------------------------------------------------------------ */
/* Dead letters (see the top of the file). */

static int j_dead_op(tw_durable *d, const void *key, size_t key_len,
                     int64_t due_ms, bool del)
{
    jstore *s = (jstore *)d;
    uint32_t seg, off;
    uint64_t lsn;
    int rc;
    pthread_mutex_lock(&s->mu);
    struct tw__key_pos p = tw__key_find(&s->keys, key, key_len);
    struct tw__key_entry *n = tw__key_at(&s->keys, p);
    if (!n || !(n->fl & ENT_DEAD)) {
        rc = TW_ENOENT;
    } else if (del) {
        rc = tw__jr_append(&s->w, JR_CANCEL, key, key_len, 0, 0, NULL, 0, &seg,
                           &off, &lsn);
        if (!rc)
            entry_remove(s, p);
    } else {
        /* A SCHED record of its payload with attempt 0: the next delivery
         * is attempt 1, and the policy starts over. */
        struct delivery *dl = read_record(s, n);
        rc = dl ? tw__jr_append(&s->w, JR_SCHED, key, key_len, due_ms, 0,
                                dl->rec.payload, dl->rec.payload_len, &seg,
                                &off, &lsn)
                : TW_EIO;
        if (!rc) {
            seg_live(s, n->seg, -1);
            seg_live(s, seg, +1);
            dead_clear(s, n);
            entry_record(n, seg, off);
            rearm(s, n, tick_of(due_ms));
            kick_if_earlier(s, due_ms);
        }
        tw__free(dl);
    }
    if (rc) {
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    return tw__jr_wait_unlock(&s->w, lsn);
}

/* The due time kept in dead entry @n's record (its header and the first
 * field of its body; the record was checked when it was replayed or
 * written), 0 if it cannot be read or lies before 1970. */
static int64_t dead_due(jstore *s, const struct tw__key_entry *n)
{
    jr_seg *g = tw__jr_seg(&s->w, n->seg);
    int64_t v = 0;
    if (!g || !tw__jr_due_at(g, n->off, &v))
        return 0;
    return v > 0 ? v : 0;
}

static int j_list_dead(tw_durable *d, const struct tw__list_req *q,
                       tw_durable_entry *out, bool *end)
{
    jstore *s = (jstore *)d;
    size_t used = 0, n = 0;
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    if (!s->dxd)
        rc = table_index(s, &s->dxd, true);
    if (!rc) {
        tw__dx_iter it;
        tw__dx_seek(&it, s->dxd, 0, q->key, q->key_len, q->after);
        while (n < q->max) {
            uint64_t tick;
            uintptr_t h;
            if (!tw__dx_next(&it, &tick, &h)) {
                *end = true;
                break;
            }
            const struct tw__key_entry *dn = (const struct tw__key_entry *)h;
            if (!tw__list_put(q, &used, &out[n], dn->key, dn->key_len, 0, 0))
                break;
            out[n].due_ms = dead_due(s, dn);
            out[n].state = TW_DURABLE_DEAD;
            n++;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc ? rc : (int)n;
}

/* No lease to renew: whether a delivery of @key is under way. */
static int j_touch(tw_durable *d, const void *key, size_t key_len)
{
    jstore *s = (jstore *)d;
    pthread_mutex_lock(&s->mu);
    const struct tw__key_entry *n =
        tw__key_at(&s->keys, tw__key_find(&s->keys, key, key_len));
    int rc = n && (n->fl & ENT_FIRING) ? 0 : TW_ENOENT;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Compaction. */

static bool need_compact(jstore *s)
{
    jr_writer *w = &s->w;
    if (w->nseg < 2 || atomic_load(&w->inflight) || s->scanning)
        return false;
    if (w->segs[0].live == 0)
        return true;
    double total = 0, live = 0;
    for (size_t i = 0; i < w->nseg; i++) {
        jr_seg *g = &w->segs[i];
        total += (double)g->size;
        if (g->records)
            live += (double)g->size * (double)g->live / (double)g->records;
    }
    return total > 2 * live + (double)w->segment_bytes;
}

struct compact_ctx {
    jstore *s;
    uint32_t no;
    uint64_t lsn;
    int err;
    unsigned batch;
};

static int compact_one(void *arg, const jr_rec *r)
{
    struct compact_ctx *c = arg;
    jstore *s = c->s;
    if (r->type != JR_SCHED && r->type != JR_DEAD)
        return 0;
    if (++c->batch % CHUNK == 0) { /* let callers in now and then */
        pthread_mutex_unlock(&s->mu);
        pthread_mutex_lock(&s->mu);
    }
    struct tw__key_entry *n =
        tw__key_at(&s->keys, tw__key_find(&s->keys, r->key, r->key_len));
    if (!n || n->seg != c->no || n->off != r->off)
        return 0;
    uint32_t seg, off;
    uint64_t lsn;
    int rc = tw__jr_append(&s->w, r->type, r->key, r->key_len, r->due_ms,
                           attempt_sum(r->attempt, n->fl & ENT_FIRES),
                           r->payload, r->payload_len, &seg, &off, &lsn);
    if (rc) {
        c->err = rc;
        return 1;
    }
    seg_live(s, n->seg, -1);
    seg_live(s, seg, +1);
    entry_record(n, seg, off);
    c->lsn = lsn;
    return 0;
}

/* Copy the oldest segment's live records forward and delete it (mutex
 * held; released while reading). */
static int compact_oldest(jstore *s)
{
    jr_seg g = s->w.segs[0];
    struct compact_ctx c = {.s = s, .no = g.no};
    if (g.live) {
        unsigned char *buf = tw__malloc(g.size);
        if (!buf)
            return TW_ENOMEM;
        pthread_mutex_unlock(&s->mu);
        ssize_t got = pread(g.fd, buf, g.size, 0);
        pthread_mutex_lock(&s->mu);
        if (got != (ssize_t)g.size) {
            tw__free(buf);
            return TW_EIO;
        }
        size_t end;
        tw__jr_scan(buf, g.size, g.seed, false, true, compact_one, &c, &end);
        tw__free(buf);
        if (c.err)
            return c.err;
        if (c.lsn) {
            /* Durable before the old copies go, even when calls are
             * acknowledged before their fdatasync. */
            int rc = s->w.sync_mode == TW_DURABLE_SYNC_INTERVAL
                         ? tw__jr_sync_all(&s->w)
                         : tw__jr_wait(&s->w, c.lsn);
            if (rc)
                return rc;
        }
        if (s->w.segs[0].no != g.no || s->w.segs[0].live != 0)
            return TW_EAGAIN;
    }
    return tw__jr_drop_oldest(&s->w);
}

/* ------------------------------------------------------------------------ */
/* The store's thread. */

/* Sleep until the wheel's next expiry or WALL_CHECK_MS after the round
 * began: at wall time @now, monotonic time @mono0 (read first, so that a
 * clock that moved after either reading makes the sleep shorter, never
 * longer: a round's callbacks may take long, and an injected clock only
 * moves when a test moves it). */
static void wait_round(jstore *s, int64_t now, uint64_t mono0)
{
    uint64_t next = tw_wheel_next_expiry(s->wheel);
    uint64_t tnow = tick_of(now);
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
 * (monotonic @mono). A failure is tried again at the next interval. */
static void interval_sync(jstore *s, uint64_t mono)
{
    if (s->w.sync_mode != TW_DURABLE_SYNC_INTERVAL || mono < s->next_sync)
        return;
    s->next_sync = mono + s->sync_every_ns;
    (void)tw__jr_sync_all(&s->w);
}

static void *store_main(void *arg)
{
    jstore *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->stop) {
        uint64_t req = s->round_req;
        s->kicked = false;
        uint64_t mono0 = s->mono_ns(s->clock_arg);
        int64_t now = wall(s);
        /* Never backwards: after a step back, what is already due still
         * runs (see the top of the file). */
        uint64_t t = tick_of(now);
        advancing = s;
        tw_wheel_advance(
            s->wheel, t > tw_wheel_now(s->wheel) ? t : tw_wheel_now(s->wheel));
        advancing = NULL;
        while (s->due_pos < s->ndue && !s->stop)
            deliver_chunk(s);
        for (int k = 0; k < 8 && need_compact(s); k++)
            if (compact_oldest(s) != 0)
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

size_t tw__durable_entry_size(size_t key_len)
{
    return tw__key_entry_size(key_len);
}

void tw__durable_table(struct tw_durable *d, size_t *nbuckets, size_t *nold)
{
    jstore *s = (jstore *)d;
    pthread_mutex_lock(&s->mu);
    *nbuckets = s->keys.nbuckets;
    *nold = s->keys.nold;
    pthread_mutex_unlock(&s->mu);
}

/* ------------------------------------------------------------------------ */
/* Close. */

static void free_all(jstore *s)
{
    tw__durable_exec_destroy(&s->exec);
    tw__key_table_free(&s->keys); /* and every entry */
    tw__free(s->due);
    tw__dx_free(s->dx);
    tw__dx_free(s->dxd);
    tw_wheel_destroy(s->wheel);
    tw__jr_close(&s->w);
    if (s->lockfd >= 0)
        close(s->lockfd); /* releases the flock */
    if (s->dirfd >= 0)
        close(s->dirfd);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->round_cv);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->w.sync_mu);
    tw__free(s);
}

static int j_close(tw_durable *d)
{
    jstore *s = (jstore *)d;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_cond_broadcast(&s->round_cv);
    pthread_mutex_unlock(&s->mu);
    if (!s->nofire) {
        pthread_join(s->thr, NULL);
        /* A delivery still queued is dropped (delivered after reopen). */
        tw__durable_exec_stop(&s->exec);
    }
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    jr_seg *cur = s->w.nseg ? &s->w.segs[s->w.nseg - 1] : NULL;
    if (cur && s->w.synced < s->w.written && fdatasync(cur->fd) != 0)
        rc = TW_EIO;
    pthread_mutex_unlock(&s->mu);
    free_all(s);
    return rc;
}

static const struct tw_durable_ops journal_ops = {
    .schedule = j_schedule,
    .cancel = j_cancel,
    .close = j_close,
    .stats = j_stats,
    .get = j_get,
    .list = j_list,
    .scan = j_scan,
    .schedule_many = j_schedule_many,
    .cancel_many = j_cancel_many,
    .dead_op = j_dead_op,
    .list_dead = j_list_dead,
    .touch = j_touch,
};

/* ------------------------------------------------------------------------ */
/* Open and replay. */

static void errmsg(const tw_durable_config *cfg, const char *fmt, ...)
{
    if (!cfg->errbuf || !cfg->errbuf_len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cfg->errbuf, cfg->errbuf_len, fmt, ap);
    va_end(ap);
}

/* errno @e of @what on @path: its code, and a message with the cause
 * (the code's own words, or the system's for an I/O error). */
static int os_error(const tw_durable_config *cfg, int e, const char *what,
                    const char *path)
{
    char why[128];
    int rc = tw__jr_errno(e);
    errmsg(cfg, "%s %s: %s", what, path,
           rc == TW_EIO ? strerror_r(e, why, sizeof why) : tw_strerror(rc));
    return rc;
}

struct replay_ctx {
    jstore *s;
    uint32_t no;
    uint64_t sched;
    jr_rec batch[RECS_AHEAD]; /* records read, not yet applied */
    size_t nbatch;
};

static int replay_apply(struct replay_ctx *c, const jr_rec *r)
{
    jstore *s = c->s;
    if ((r->type == JR_SCHED || r->type == JR_DEAD) &&
        tw__key_reserve(&s->keys) != 0)
        return TW_ENOMEM;
    struct tw__key_pos p = tw__key_find(&s->keys, r->key, r->key_len);
    struct tw__key_entry *n = tw__key_at(&s->keys, p);
    switch (r->type) {
    case JR_SCHED:
    case JR_DEAD:
        c->sched++;
        if (!n) {
            n = tw__key_entry_new(&s->keys, r->key, r->key_len, on_due);
            if (!n)
                return TW_ENOMEM;
            tw__key_insert(&s->keys, p, n);
        }
        dead_clear(s, n);
        entry_record(n, c->no, r->off);
        if (r->type == JR_SCHED) {
            tw_wheel_add(s->wheel, &n->tm, tick_of(r->due_ms));
        } else {
            tw_wheel_cancel(s->wheel, &n->tm);
            n->fl |= ENT_DEAD;
            s->ndead++;
        }
        break;
    case JR_FIRE:
        if (n)
            fires_add(n);
        break;
    default: /* CANCEL, DONE */
        if (n) {
            dead_clear(s, n);
            tw__key_take(&s->keys, p);
            tw_wheel_cancel(s->wheel, &n->tm);
            tw__key_entry_free(&s->keys, n);
        }
        break;
    }
    return 0;
}

/* Apply the records batched so far, in order, their keys asked for
 * ahead. */
static int replay_flush(struct replay_ctx *c)
{
    prefetch_recs(c->s, c->batch, c->nbatch, sizeof c->batch[0]);
    int rc = 0;
    for (size_t i = 0; i < c->nbatch && !rc; i++)
        rc = replay_apply(c, &c->batch[i]);
    c->nbatch = 0;
    return rc;
}

/* tw__jr_scan()'s callback: records point into the segment's buffer,
 * which outlives the scan, so they are applied RECS_AHEAD at a time. */
static int replay_one(void *arg, const jr_rec *r)
{
    struct replay_ctx *c = arg;
    c->batch[c->nbatch++] = *r;
    return c->nbatch == RECS_AHEAD ? replay_flush(c) : 0;
}

/* Size the key table once from the segments' sizes (the newest's
 * allocated size, a little more than its records): at 128 bytes a record and
 * two keys a bucket it rarely has to grow during the replay, and each growth
 * would touch every entry again. A guess: too small costs a growth, too large
 * one rehash at the end (fit_table()). */
static void presize_table(jstore *s, const uint32_t *nos, size_t cnt)
{
    uint64_t old_bytes = 0;
    for (size_t i = 0; i < cnt; i++) {
        char name[JR_SEG_NAME_MAX];
        struct stat st;
        tw__jr_seg_name(name, nos[i]);
        if (fstatat(s->dirfd, name, &st, 0) == 0)
            old_bytes += (uint64_t)st.st_size;
    }
    size_t want = s->keys.nbuckets;
    while (want < old_bytes / 256 && want < ((size_t)1 << 40))
        want *= 2;
    if (want > s->keys.nbuckets)
        (void)tw__key_resize(&s->keys, want);
}

/* After the replay: a table sized for records that turned out dead (or
 * replaced) is cut to one to two keys a bucket; nothing changes if that
 * fails. */
static void fit_table(jstore *s)
{
    tw__key_grow_finish(&s->keys);
    size_t want = s->keys.nbuckets;
    while (want > 1024 && s->keys.count < want)
        want /= 2;
    if (want < s->keys.nbuckets)
        (void)tw__key_resize(&s->keys, want);
}

/* A segment whose header is bad: 1 if it was deleted (a crash while the
 * newest segment was being made: it is preallocated before its header is
 * written and synced, and gets records only after that, so nothing but
 * zeros follow; or any, with TW_DURABLE_REPAIR), else TW_EIO. */
static int bad_header(jstore *s, const tw_durable_config *cfg, jr_seg_file *f,
                      bool *damaged)
{
    bool empty = f->last && tw__jr_all_zero(f->buf, JR_SEG_HDR, f->size);
    if (!empty && !(cfg->flags & TW_DURABLE_REPAIR)) {
        errmsg(cfg, "%s/%s offset 0: bad segment header", cfg->dir, f->name);
        return TW_EIO;
    }
    close(f->fd);
    f->fd = -1;
    if (!s->readonly)
        unlinkat(s->dirfd, f->name, 0);
    fsync(s->dirfd);
    *damaged |= !empty;
    return 1;
}

/* Replay segment @f into the index and keep it. */
static int replay_segment(jstore *s, const tw_durable_config *cfg,
                          jr_seg_file *f, bool *damaged)
{
    int rc = tw__jr_read_segment(s->dirfd, s->readonly, f);
    if (rc)
        return rc;
    unsigned version = tw__jr_seg_hdr_ok(f->buf, f->size, f->no, &f->seed);
    if (!version)
        return bad_header(s, cfg, f, damaged);
    f->legacy |= version == JR_VERSION_1;
    f->version = version;
    struct replay_ctx c = {.s = s, .no = f->no};
    size_t end = f->size;
    rc = tw__jr_scan(f->buf, f->size, f->seed, f->last,
                     cfg->flags & TW_DURABLE_REPAIR, replay_one, &c, &end);
    int frc = replay_flush(&c); /* the records before any damage */
    if (rc >= 0 && frc)
        rc = frc;
    if (rc == TW_EIO)
        errmsg(cfg, "%s/%s offset %zu: corrupt record", cfg->dir, f->name, end);
    if (rc < 0)
        return rc;
    *damaged |= rc == 1;
    rc = s->readonly ? 0 : tw__jr_clear_tail(f, end);
    return rc ? rc : tw__jr_adopt(&s->w, f, end, c.sched);
}

/* After the replay: live counts per segment, the writer's position, and a
 * fresh segment if there was none or damage was repaired. */
static int replay_done(jstore *s, const tw_durable_config *cfg, bool damaged)
{
    for (size_t i = 0; i < s->keys.nbuckets; i++)
        for (struct tw__key_entry *n =
                 tw__key_entry_of(&s->keys, s->keys.buckets[i]);
             n; n = tw__key_entry_of(&s->keys, tw__key_link(n)))
            seg_live(s, n->seg, +1);
    if (s->readonly)
        return 0; /* nothing is written: no new segment */
    if (s->w.nseg) {
        jr_seg *cur = &s->w.segs[s->w.nseg - 1];
        s->w.written = JR_LSN(cur->no, cur->size);
        s->w.synced = s->w.written;
        if (!damaged)
            tw__jr_publish(&s->w);
    }
    if (s->w.nseg == 0 || damaged) {
        uint32_t no = s->w.nseg ? s->w.segs[s->w.nseg - 1].no + 1 : 1;
        int rc = tw__jr_new_segment(&s->w, no);
        if (rc)
            errmsg(cfg, "cannot make %s/%010u.twj: %s", cfg->dir, no,
                   tw_strerror(rc));
        return rc;
    }
    return 0;
}

/* Check that the oldest segment the store must have (MANIFEST, else 1) is
 * there, and delete the older ones, left by a deletion that a crash
 * interrupted (the manifest is written first); *@first: the index in
 * @nos of the oldest segment to replay. TW_DURABLE_REPAIR opens whatever
 * is there. A format-1 journal without a manifest may have deleted its
 * oldest segments: nothing can be checked. */
static int first_segment(jstore *s, const tw_durable_config *cfg,
                         const uint32_t *nos, size_t cnt, size_t *first)
{
    bool repair = cfg->flags & TW_DURABLE_REPAIR;
    uint32_t oldest = 1;
    int rc = tw__jr_manifest_read(s->dirfd, &oldest);
    bool manifest = rc == 0;
    if (rc == TW_EIO && !repair) {
        errmsg(cfg, "%s/MANIFEST: damaged", cfg->dir);
        return TW_EIO;
    }
    if (rc)
        oldest = 1;
    size_t i = 0;
    for (; manifest && i < cnt && nos[i] < oldest; i++) {
        char name[JR_SEG_NAME_MAX];
        tw__jr_seg_name(name, nos[i]);
        if (unlinkat(s->dirfd, name, 0) != 0)
            return TW_EIO;
        (void)fsync(s->dirfd);
    }
    *first = i;
    bool gone = i < cnt ? nos[i] > oldest : manifest;
    if (gone && repair) {
        /* What is there is the journal from now on. */
        if (i < cnt)
            return tw__jr_manifest_write(s->dirfd, nos[i]);
        if (unlinkat(s->dirfd, "MANIFEST", 0) != 0 && errno != ENOENT)
            return TW_EIO;
        return 0;
    }
    if (gone && (manifest || tw__jr_seg_version(s->dirfd, nos[i]) != 1)) {
        errmsg(cfg,
               "%s/%010u.twj is missing: the journal begins at segment "
               "%u%s",
               cfg->dir, oldest, oldest,
               i < cnt ? "" : " and no segment is left");
        return TW_EIO;
    }
    return 0;
}

static int replay(jstore *s, const tw_durable_config *cfg, bool *damaged)
{
    uint32_t *nos = NULL;
    size_t cnt = 0;
    int rc = tw__jr_list_segments(s->dirfd, &nos, &cnt);
    if (rc)
        return rc;
    size_t i = 0;
    rc = first_segment(s, cfg, nos, cnt, &i);
    if (rc) {
        tw__free(nos);
        return rc;
    }
    if (i < cnt) /* (nos is NULL when there is no segment) */
        presize_table(s, nos + i, cnt - i);
    jr_seg_file f = {.fd = -1};
    for (size_t i0 = i; i < cnt && rc == 0; i++) {
        f.no = nos[i];
        f.last = i + 1 == cnt;
        if (i > i0 && nos[i] != nos[i - 1] + 1 &&
            !(cfg->flags & TW_DURABLE_REPAIR)) {
            tw__jr_seg_name(f.name, f.no);
            errmsg(cfg, "%s/%s: segment %u is missing", cfg->dir, f.name,
                   nos[i - 1] + 1);
            rc = TW_EIO;
            break;
        }
        rc = replay_segment(s, cfg, &f, damaged);
        if (f.fd >= 0)
            close(f.fd);
        f.fd = -1;
        if (rc == 1) /* a bad header, deleted */
            rc = 0;
    }
    tw__free(f.buf);
    tw__free(nos);
    /* A format-1 journal is rewritten in format 2 as after a repair: a
     * new segment, everything older copied forward and deleted. */
    *damaged |= f.legacy;
    if (!rc)
        fit_table(s);
    return rc ? rc : replay_done(s, cfg, *damaged);
}
/* fsync the directory that holds @path (its first @len bytes name it). */
static void sync_parent(const char *path, size_t len)
{
    char parent[4096];
    while (len > 0 && path[len - 1] != '/')
        len--;
    if (len + 2 > sizeof parent)
        return;
    memcpy(parent, path, len);
    strcpy(parent + len, ".");
    int fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* mkdir -p @cfg->dir; each directory made is made durable in its
 * parent. On failure the message names the directory that could not be
 * made and why. */
static int make_dirs(const tw_durable_config *cfg)
{
    char path[4096];
    size_t n = strlen(cfg->dir);
    if (n >= sizeof path) {
        errmsg(cfg, "dir: longer than %zu bytes", sizeof path - 1);
        return TW_EINVAL;
    }
    memcpy(path, cfg->dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != 0)
            continue;
        char c = path[i];
        path[i] = 0;
        if (mkdir(path, 0755) == 0) {
            sync_parent(path, i);
        } else if (errno != EEXIST) {
            int e = errno;
            if (e != ENOTDIR)
                return os_error(cfg, e, "cannot make the directory", path);
            /* Name the file in the way: the parent of what was made. */
            while (i > 0 && path[i - 1] == '/')
                i--;
            while (i > 0 && path[i - 1] != '/')
                i--;
            while (i > 1 && path[i - 1] == '/')
                i--;
            path[i] = 0;
            errmsg(cfg, "cannot make the directory %s: %s is not a directory",
                   cfg->dir, path);
            return TW_ENOTDIR;
        }
        path[i] = c;
    }
    return 0;
}

/* Fill a new store's fields from @cfg and make its locks (nothing can
 * fail). */
static void init_store(jstore *s, const tw_durable_config *cfg,
                       uint64_t seg_bytes)
{
    s->base.ops = &journal_ops;
    s->dirfd = s->lockfd = -1;
    s->fire = cfg->fire;
    tw__retry_init(&s->retry, cfg);
    s->fire_arg = cfg->fire_arg;
    s->wall_ms = cfg->wall_ms ? cfg->wall_ms : real_wall_ms;
    s->mono_ns = cfg->mono_ns ? cfg->mono_ns : real_mono_ns;
    s->fake_mono = cfg->mono_ns != NULL;
    s->clock_arg = cfg->clock_arg;
    s->wake_at = INT64_MAX;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->w.sync_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&s->round_cv, NULL);
    s->w.mu = &s->mu;
    s->w.sync_mode = cfg->sync;
    s->sync_every_ns =
        (uint64_t)(cfg->sync_interval_ms ? cfg->sync_interval_ms : 1000) *
        1000000u;
    s->w.segment_bytes = seg_bytes;
}

/* Make and open the directory and take its lock. */
static int lock_dir(jstore *s, const tw_durable_config *cfg)
{
    if (s->readonly) { /* the directory as it is: no lock, nothing made */
        s->dirfd = open(cfg->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        s->w.dirfd = s->dirfd;
        if (s->dirfd >= 0)
            return 0;
        if (errno != ENOENT)
            return os_error(cfg, errno, "cannot open the directory", cfg->dir);
        errmsg(cfg, "%s: no such directory", cfg->dir);
        return TW_ENOENT;
    }
    int rc = make_dirs(cfg);
    if (rc)
        return rc;
    s->dirfd = open(cfg->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s->dirfd < 0)
        return os_error(cfg, errno, "cannot open the directory", cfg->dir);
    s->w.dirfd = s->dirfd;
    /* The lock is on the directory itself, which cannot be deleted or
     * replaced from under an open store as a file in it can. LOCK is
     * locked as well, for a process of an older version (which locks
     * only LOCK) on the same directory. */
    int rc2 = 0;
    if (flock(s->dirfd, LOCK_EX | LOCK_NB) != 0)
        rc2 = errno == EWOULDBLOCK ? TW_EBUSY : TW_EIO;
    if (!rc2) {
        s->lockfd =
            openat(s->dirfd, "LOCK", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (s->lockfd < 0) {
            char lock[4096];
            snprintf(lock, sizeof lock, "%s/LOCK", cfg->dir);
            return os_error(cfg, errno, "cannot open or create", lock);
        }
        if (flock(s->lockfd, LOCK_EX | LOCK_NB) != 0)
            rc2 = errno == EWOULDBLOCK ? TW_EBUSY : TW_EIO;
    }
    if (rc2 == TW_EBUSY)
        errmsg(cfg, "%s: open in another process or handle", cfg->dir);
    return rc2;
}

/* Replay the journal; after a repair, rewrite everything live so the
 * damage is gone: every segment older than the one replay() began is
 * copied forward. */
static int recover(jstore *s, const tw_durable_config *cfg)
{
    bool damaged = false;
    pthread_mutex_lock(&s->mu);
    int rc = replay(s, cfg, &damaged);
    if (rc == 0 && damaged && !s->readonly) {
        uint32_t fresh = s->w.segs[s->w.nseg - 1].no;
        while (rc == 0 && s->w.segs[0].no < fresh)
            rc = compact_oldest(s);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* Start the executors and the store's thread; on failure none is left
 * running. */
static int start_threads(jstore *s, uint32_t nexec)
{
    int rc =
        tw__durable_exec_init(&s->exec, nexec, run_delivery, drop_delivery, s);
    if (!rc)
        rc = tw__durable_exec_start(&s->exec);
    if (!rc && pthread_create(&s->thr, NULL, store_main, s) != 0)
        rc = TW_ENOMEM;
    if (rc)
        tw__durable_exec_stop(&s->exec);
    return rc;
}

static int j_open(tw_durable **out, const tw_durable_config *cfg)
{
    uint64_t seg_bytes =
        cfg->segment_bytes ? cfg->segment_bytes : UINT64_C(64) << 20;
    if (cfg->sync > TW_DURABLE_SYNC_INTERVAL) {
        errmsg(cfg, "sync: %u is not a TW_DURABLE_SYNC_* mode", cfg->sync);
        return TW_EINVAL;
    }
    if (seg_bytes < 4096 || seg_bytes > (UINT64_C(1) << 31)) {
        errmsg(cfg, "segment_bytes: 4096 <= n <= 2147483648 (0: 64 MiB)");
        return TW_EINVAL;
    }
    if (cfg->executor_threads > 1024) {
        errmsg(cfg, "executor_threads: n <= 1024");
        return TW_EINVAL;
    }
    jstore *s = tw__calloc(1, sizeof *s);
    if (!s)
        return TW_ENOMEM;
    uint64_t t0 = real_mono_ns(NULL);
    init_store(s, cfg, seg_bytes);
    s->readonly = cfg->flags & TW_DURABLE_READONLY;
    s->base.readonly = s->readonly;
    s->nofire = s->readonly || (cfg->flags & TW_DURABLE_NOFIRE);
    int rc = TW_ENOMEM;
    if (tw__key_table_init(&s->keys, 1024, t0 ^ (uint64_t)(uintptr_t)s) == 0 &&
        tw_wheel_create(&s->wheel, NULL, tick_of(wall(s))) == 0)
        rc = lock_dir(s, cfg);
    if (!rc)
        rc = recover(s, cfg);
    if (!rc) {
        s->recovered = s->keys.count - s->ndead;
        s->recovery_us = (real_mono_ns(NULL) - t0) / 1000;
        rc = s->nofire ? 0 : start_threads(s, cfg->executor_threads);
    }
    if (rc) {
        free_all(s);
        return rc;
    }
    *out = &s->base;
    return 0;
}
/* ------------------------------------------------------------------------ */
/* The shared delivery path (src/durable_exec.h). */

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

/* ------------------------------------------------------------------------ */
/* Public calls. */

#ifndef TWHEEL_HAVE_REDIS
/* Without the Redis backend built in, asking for it is a bad config. */
int tw__durable_redis_open(tw_durable **out, const tw_durable_config *cfg)
{
    (void)out;
    (void)cfg;
    return TW_EINVAL;
}
#endif

int tw_durable_open_sized(tw_durable **out, const tw_durable_config *cfg,
                          size_t cfg_size)
{
    tw_durable_config c;
    if (cfg == NULL)
        return TW_EINVAL;
    int rc = tw__config_copy(&c, sizeof c, cfg, cfg_size);
    if (rc != 0) {
        /* Only a struct larger than ours fails, so @cfg holds errbuf. */
        errmsg(cfg,
               "config: a field of a newer twheel is set (this library "
               "knows %zu of the struct's %zu bytes)",
               sizeof c, cfg_size);
        return rc;
    }
    return (tw_durable_open)(out, &c);
}

/* The fields every backend shares, and which backend: TW_EINVAL with a
 * message naming the field, or 0. */
static int check_config(tw_durable **out, const tw_durable_config *cfg)
{
    if (!out) {
        errmsg(cfg, "out: NULL");
        return TW_EINVAL;
    }
    if (!cfg->fire) {
        errmsg(cfg, "fire: a callback is required");
        return TW_EINVAL;
    }
    if (cfg->redis && cfg->dir) {
        errmsg(cfg, "dir and redis: set one (dir: a journal in that "
                    "directory; redis: the Redis backend)");
        return TW_EINVAL;
    }
    if (!cfg->redis && (!cfg->dir || !cfg->dir[0])) {
        errmsg(cfg, "dir: required (the journal's directory), or redis");
        return TW_EINVAL;
    }
    if (cfg->retry_jitter_pct > 100) {
        errmsg(cfg, "retry_jitter_pct: 0 .. 100");
        return TW_EINVAL;
    }
    if (cfg->redis && cfg->shards > (1u << 20)) {
        errmsg(cfg, "shards: 0 < n <= 1048576 (0: 64)");
        return TW_EINVAL;
    }
    return 0;
}

int(tw_durable_open)(tw_durable **out, const tw_durable_config *cfg)
{
    if (!cfg)
        return TW_EINVAL;
    if (cfg->errbuf && cfg->errbuf_len)
        cfg->errbuf[0] = 0;
    int rc = check_config(out, cfg);
    if (!rc)
        rc = cfg->redis ? tw__durable_redis_open(out, cfg) : j_open(out, cfg);
    /* Every failure says something, if only the code's meaning. Never
     * cfg->redis itself: a URL may hold a password. */
    if (rc && cfg->errbuf && cfg->errbuf_len && !cfg->errbuf[0])
        errmsg(cfg, "%s: %s", cfg->redis ? "redis" : cfg->dir, tw_strerror(rc));
    return rc;
}

static bool key_ok(const void *key, size_t key_len)
{
    return key && key_len >= 1 && key_len <= TW_DURABLE_KEY_MAX;
}

/* Once close has begun (a callback calling in while close waits for it),
 * every change is refused, whatever the backend. */
static bool closing(tw_durable *d)
{
    return atomic_load_explicit(&d->closing, memory_order_acquire);
}

int tw_durable_schedule(tw_durable *d, const void *key, size_t key_len,
                        int64_t due_ms, const void *payload, size_t payload_len)
{
    if (!d || !key_ok(key, key_len) || payload_len > TW_DURABLE_PAYLOAD_MAX ||
        (payload_len && !payload))
        return TW_EINVAL;
    if (closing(d))
        return TW_ESHUTDOWN;
    if (d->readonly)
        return TW_EROFS;
    return d->ops->schedule(d, key, key_len, due_ms, payload, payload_len);
}

int tw_durable_cancel(tw_durable *d, const void *key, size_t key_len)
{
    if (!d || !key_ok(key, key_len))
        return TW_EINVAL;
    if (closing(d))
        return TW_ESHUTDOWN;
    if (d->readonly)
        return TW_EROFS;
    return d->ops->cancel(d, key, key_len);
}

_Thread_local tw_durable *tw__durable_running;

int tw_durable_close(tw_durable *d)
{
    if (!d)
        return 0;
    if (d == tw__durable_running)
        return TW_EDEADLK; /* it would wait for this very callback */
    atomic_store_explicit(&d->closing, true, memory_order_release);
    return d->ops->close(d);
}

static bool item_ok(const tw_durable_item *it)
{
    return key_ok(it->key, it->key_len) &&
           it->payload_len <= TW_DURABLE_PAYLOAD_MAX &&
           (!it->payload_len || it->payload);
}

/* Set each item's result to 0, TW_EINVAL (a cancel reads only the key)
 * or, once @d is closing, TW_ESHUTDOWN; returns how many are still 0. */
static size_t check_items(tw_durable *d, tw_durable_item *items, size_t n,
                          bool cancel)
{
    int refuse = closing(d) ? TW_ESHUTDOWN : d->readonly ? TW_EROFS : 0;
    size_t valid = 0;
    for (size_t i = 0; i < n; i++) {
        bool ok = cancel ? key_ok(items[i].key, items[i].key_len)
                         : item_ok(&items[i]);
        items[i].result = ok ? refuse : TW_EINVAL;
        valid += ok && !refuse;
    }
    return valid;
}

int tw_durable_schedule_many(tw_durable *d, tw_durable_item *items, size_t n)
{
    if (!n)
        return 0;
    if (!d || !items)
        return TW_EINVAL;
    if (check_items(d, items, n, false) == n && d->ops->schedule_many)
        return d->ops->schedule_many(d, items, n);
    for (size_t i = 0; i < n; i++) {
        tw_durable_item *it = &items[i];
        if (!it->result)
            it->result = d->ops->schedule(d, it->key, it->key_len, it->due_ms,
                                          it->payload, it->payload_len);
    }
    return tw__durable_first_error(items, n);
}

int tw_durable_cancel_many(tw_durable *d, tw_durable_item *items, size_t n)
{
    if (!n)
        return 0;
    if (!d || !items)
        return TW_EINVAL;
    if (check_items(d, items, n, true) == n && d->ops->cancel_many)
        return d->ops->cancel_many(d, items, n);
    for (size_t i = 0; i < n; i++)
        if (!items[i].result)
            items[i].result = d->ops->cancel(d, items[i].key, items[i].key_len);
    return tw__durable_first_error(items, n);
}

int tw_durable_stats_get_sized(tw_durable *d, tw_durable_stats *out,
                               size_t out_size)
{
    if (!d || !out || out_size < offsetof(tw_durable_stats, backlog))
        return TW_EINVAL;
    tw_durable_stats full;
    memset(&full, 0, sizeof full);
    int rc = d->ops->stats(d, &full);
    if (rc == 0) {
        memset(out, 0, out_size);
        memcpy(out, &full, out_size < sizeof full ? out_size : sizeof full);
    }
    return rc;
}

int(tw_durable_stats_get)(tw_durable *d, tw_durable_stats *out)
{
    return tw_durable_stats_get_sized(d, out, sizeof(tw_durable_stats));
}
