/* SPDX-License-Identifier: MIT */
/*
 * src/durable_journal.c - the journal backend of twheel/durable.h (a
 * journal in a directory with the core wheel as its index): a change
 * (schedule, cancel) applied to the key table and the wheel, and the
 * group commit of calls.
 *
 * The backend's files, in the order of a timer's life:
 *   durable_journal.c          this file: the design, changes and their
 *                              bookkeeping, the call combiner, stats
 *   durable_journal_fire.c     the store's thread: the wheel driven to the
 *                              wall clock, deliveries on the shared executor
 *   durable_journal_compact.c  old segments' live records copied forward
 *   durable_journal_query.c    get, list, scan, dead letters
 *   durable_journal_open.c     open (directory, lock, replay) and close
 *   durable_journal_damage.c   the open's reports of what it ignored
 * with struct jstore in durable_journal.h, the key table in key_table.c
 * and the journal's bytes in journal_format.c, journal_writer.c and
 * journal_reader.c.
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
 * Index: the key table (src/key_table.h) maps each key to its entry, a
 * tw_timer in the wheel (tick = Unix ms) that knows where the key's
 * record lives (segment, offset) and how many deliveries began since that
 * record was written (FIRE records after it; the attempt a delivery shows
 * is the record's attempt plus those): 52 bytes on LP64, then the key.
 * Payloads and due times stay on disk; the store's thread reads the
 * record back when the timer fires.
 *
 * Replay (journal_reader.c lists, reads and scans the segments;
 * durable_journal_open.c applies their records) goes in order: SCHED
 * makes or replaces the key's entry, CANCEL and DONE remove it, FIRE
 * counts a delivery that began, DEAD makes or replaces it as a dead
 * letter.
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

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "durable_journal.h"
#include "common.h"
#include "durable_hooks.h"

/* ------------------------------------------------------------------------ */
/* The ordered index of tw_durable_list(), once built. */

void tw__journal_index_drop(jstore *s)
{
    tw__dx_free(s->dx);
    s->dx = NULL;
    s->dx_building = false;
}

/* Entry @n leaves the key table (or is about to move). */
void tw__journal_index_out(jstore *s, struct tw__key_entry *n)
{
    if (s->dx)
        (void)tw__dx_erase(s->dx, tw_timer_expires(&n->tm), (uintptr_t)n);
}

/* Arm entry @n (in the key table) for @tick, in the wheel and the index. */
void tw__journal_rearm(jstore *s, struct tw__key_entry *n, uint64_t tick)
{
    tw__journal_index_out(s, n);
    tw_wheel_add(s->wheel, &n->tm, tick);
    if (s->dx && tw__dx_insert(s->dx, tick, (uintptr_t)n) != 0)
        tw__journal_index_drop(s);
}

/* The dead index, once built: entry @n enters it. */
void tw__journal_dead_in(jstore *s, struct tw__key_entry *n)
{
    if (s->dxd && tw__dx_insert(s->dxd, 0, (uintptr_t)n) != 0) {
        tw__dx_free(s->dxd); /* the next listing builds it again */
        s->dxd = NULL;
    }
}

/* Entry @n is not a dead letter any more (if it was). */
void tw__journal_dead_clear(jstore *s, struct tw__key_entry *n)
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
int tw__journal_to_dead(jstore *s, struct tw__key_entry *n, const jr_rec *rec,
                        uint32_t attempt)
{
    uint32_t seg, off;
    uint64_t lsn;
    int rc =
        tw__jr_append(&s->w, JR_DEAD, n->key, n->key_len, rec->due_ms, attempt,
                      rec->payload, rec->payload_len, &seg, &off, &lsn);
    if (rc)
        return rc;
    tw__journal_seg_live(s, n->seg, -1);
    tw__journal_seg_live(s, seg, +1);
    tw__journal_entry_record(n, seg, off);
    tw__journal_index_out(s, n);
    tw_wheel_cancel(s->wheel, &n->tm);
    n->fl |= ENT_DEAD;
    s->ndead++;
    tw__journal_dead_in(s, n);
    return 0;
}

/* Unlink the entry at @p from the table and the wheel; free it unless a
 * delivery still holds it (then it becomes an orphan). */
void tw__journal_entry_remove(jstore *s, struct tw__key_pos p)
{
    struct tw__key_entry *n = tw__key_take(&s->keys, p);
    tw__journal_index_out(s, n);
    tw__journal_dead_clear(s, n);
    tw__journal_seg_live(s, n->seg, -1);
    if (n->fl & ENT_FIRING) {
        n->fl |= ENT_ORPHAN;
    } else {
        tw_wheel_cancel(s->wheel, &n->tm);
        tw__key_entry_free(&s->keys, n);
    }
}

/* ------------------------------------------------------------------------ */
/* Schedule and cancel. */

void tw__journal_kick_if_earlier(jstore *s, int64_t due)
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

/* A tw_durable_schedule_many() or tw_durable_cancel_many() call queued
 * for the combiner. */
struct sreq {
    struct tw__combine_req req; /* first: the combiner's */
    tw_durable_item *items;
    const struct tw__cond *cond; /* per item, or NULL: unconditional */
    size_t n;
    bool cancel;  /* the items are cancels */
    uint64_t lsn; /* the end of its records once applied; 0: none */
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
    *fresh =
        tw__key_entry_new(&s->keys, it->key, it->key_len, tw__journal_on_due);
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
        tw__journal_seg_live(s, n->seg, -1);
        tw__journal_dead_clear(s, n); /* a dead letter is replaced as well */
    } else {
        if (n) /* being delivered: it becomes an orphan */
            tw__journal_entry_remove(s, p);
        tw__key_insert(&s->keys, p, fresh);
        n = fresh;
    }
    tw__journal_entry_record(n, seg, off); /* its attempt is 0 */
    tw__journal_seg_live(s, seg, +1);
    tw__journal_rearm(s, n, tw__journal_tick(it->due_ms));
    tw__journal_kick_if_earlier(s, it->due_ms);
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
            tw__journal_entry_remove(
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
void tw__journal_prefetch_records(jstore *s, const jr_rec *r, size_t n,
                                  size_t stride)
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
    struct tw__key_entry *e =
        tw__key_at(&s->keys, tw__key_find(&s->keys, it->key, it->key_len));
    for (size_t j = 0; e && j < k; j++)
        if (st[j].staged && st[j].fresh == e)
            e = NULL;
    if (!e || (e->fl & ENT_DEAD)) /* a dead letter is not pending */
        return TW_ENOENT;
    int rc = tw__jr_stage(&s->w, JR_CANCEL, it->key, it->key_len, 0, 0, NULL, 0,
                          &st[k].seg, &st[k].off);
    st[k].staged = rc == 0;
    st[k].fresh = e;
    return rc;
}

/* Whether an item of the group staged in @st[0 .. @k) (the items from
 * @items) has @it's key. */
static bool group_has_key(const tw_durable_item *items,
                          const struct staged_item *st, size_t k,
                          const tw_durable_item *it)
{
    for (size_t j = 0; j < k; j++)
        if (st[j].staged && items[j].key_len == it->key_len &&
            !memcmp(items[j].key, it->key, it->key_len))
            return true;
    return false;
}

/* Condition @c of a conditional write against @it's key as the index
 * has it: 0, TW_ESTALE, TW_ENOENT; TW_EIO when the key's record cannot be
 * read back (checksum included), TW_ENOMEM. Mutex held, so no write of
 * the key comes between this look and the write that follows it. */
static int cond_eval(jstore *s, const tw_durable_item *it,
                     const struct tw__cond *c)
{
    struct tw__key_entry *e =
        tw__key_at(&s->keys, tw__key_find(&s->keys, it->key, it->key_len));
    bool pending = e && !(e->fl & ENT_DEAD);
    if (!pending || !c->expect || !c->expect_len)
        return tw__cond_check(c, pending, NULL, 0);
    jr_seg *g = tw__jr_seg(&s->w, e->seg);
    size_t size = g ? tw__jr_rec_size_at(g, e->off) : 0;
    if (!size)
        return TW_EIO;
    unsigned char *raw = tw__malloc(size);
    if (!raw)
        return TW_ENOMEM;
    jr_rec rec;
    int rc = tw__jr_read_rec(g, e->off, raw, size, &rec) && rec.type == JR_SCHED
                 ? tw__cond_check(c, true, rec.payload, rec.payload_len)
                 : TW_EIO;
    tw__free(raw);
    return rc;
}

/* Stage item @i of @items, the (@i - @from)-th of its group; TW_EAGAIN:
 * commit the group first. A conditional item is checked against the
 * index, so one whose key an earlier item of the group changes (staged,
 * not yet applied) waits for that group's commit. */
static int stage_item(jstore *s, tw_durable_item *items,
                      const struct tw__cond *cond, struct staged_item *st,
                      size_t from, size_t i, bool cancel)
{
    size_t k = i - from;
    st[k].staged = false;
    if (cond) {
        if (group_has_key(items + from, st, k, &items[i]))
            return TW_EAGAIN;
        int rc = cond_eval(s, &items[i], &cond[i]);
        if (rc)
            return rc;
    }
    return cancel ? cancel_stage(s, &items[i], st, k)
                  : sched_stage(s, &items[i], &st[k]);
}

/* Stage, write and apply one call's items (mutex held), schedules or
 * cancels, each conditional item only if its condition holds: their
 * records go out in groups of SCHED_GROUP (one pwrite each, fewer when a
 * segment fills); *@lsn becomes the end of the last one written (0:
 * none). */
static void apply_items(jstore *s, tw_durable_item *items,
                        const struct tw__cond *cond, size_t n, bool cancel,
                        uint64_t *lsn)
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
        int rc = stage_item(s, items, cond, st, from, i, cancel);
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

/* The combiner's round (src/durable_combine.h; mutex held): each call
 * applied in arrival order and marked done, so that its caller may
 * return at once and nothing of it is touched after that. */
static void apply_round(struct tw__combine_req *first, void *ctx)
{
    jstore *s = ctx;
    for (struct tw__combine_req *r = first, *nx; r; r = nx) {
        struct sreq *q = (struct sreq *)r;
        nx = r->next;
        apply_items(s, q->items, q->cond, q->n, q->cancel, &q->lsn);
        if (q->lsn > s->combined_lsn)
            s->combined_lsn = q->lsn;
        tw__combine_done(r);
    }
}

/* After the combiner's rounds (mutex held): the store's thread starts
 * writeback if the writer wants it. Returns the end of the rounds'
 * records (0: none) for settle_rounds(). */
static uint64_t after_rounds(void *ctx)
{
    jstore *s = ctx;
    if (tw__jr_wb_wanted(&s->w) && !s->kicked) {
        s->kicked = true;
        pthread_cond_signal(&s->cv);
    }
    uint64_t lsn = s->combined_lsn;
    s->combined_lsn = 0;
    return lsn;
}

/* On the combiner's thread, without the mutex, before it wakes the
 * callers it served: wait until the records of all @served calls (up to
 * @lsn) are durable, counted as @served callers in the group commit's
 * gather. The callers then find their outcome decided and return without
 * sleeping again (tw__jr_wait_nolock()). */
static void settle_rounds(void *ctx, uint64_t lsn, unsigned served)
{
    jstore *s = ctx;
    if (lsn)
        (void)tw__jr_wait_calls(&s->w, lsn, served);
}

void tw__journal_combiner_init(jstore *s)
{
    tw__combine_init(&s->combiner, &s->mu, apply_round, after_rounds, s);
    s->combiner.settle = settle_rounds;
}

/* Group commit of a batch: the call is queued, applied by whichever
 * caller holds the mutex (flat combining: one lock hand-off for many
 * calls, schedules and cancels in arrival order), and that caller waits
 * until the records of all the calls it applied are durable before it
 * wakes their callers; then the call's own wait finds its outcome. */
static int submit_call(jstore *s, tw_durable_item *items,
                       const struct tw__cond *cond, size_t n, bool cancel)
{
    struct sreq me = {.items = items, .cond = cond, .n = n, .cancel = cancel};
    tw__combine_run(&s->combiner, &me.req);
    int rc = me.lsn ? tw__jr_wait_nolock(&s->w, me.lsn) : 0;
    for (size_t i = 0; i < n; i++)
        if (!items[i].result)
            items[i].result = rc;
    return tw__durable_first_error(items, n);
}

int tw__journal_schedule_many(tw_durable *d, tw_durable_item *items, size_t n)
{
    return submit_call((jstore *)d, items, NULL, n, false);
}

int tw__journal_cancel_many(tw_durable *d, tw_durable_item *items, size_t n)
{
    return submit_call((jstore *)d, items, NULL, n, true);
}

int tw__journal_schedule_if(tw_durable *d, tw_durable_item *items,
                            const struct tw__cond *cond, size_t n)
{
    return submit_call((jstore *)d, items, cond, n, false);
}

int tw__journal_cancel_if(tw_durable *d, tw_durable_item *items,
                          const struct tw__cond *cond, size_t n)
{
    return submit_call((jstore *)d, items, cond, n, true);
}

int tw__journal_schedule(tw_durable *d, const void *key, size_t key_len,
                         int64_t due_ms, const void *payload,
                         size_t payload_len)
{
    tw_durable_item it = {.key = key,
                          .key_len = key_len,
                          .due_ms = due_ms,
                          .payload = payload,
                          .payload_len = payload_len};
    return tw__journal_schedule_many(d, &it, 1);
}

int tw__journal_cancel(tw_durable *d, const void *key, size_t key_len)
{
    tw_durable_item it = {.key = key, .key_len = key_len};
    return tw__journal_cancel_many(d, &it, 1);
}

int tw__journal_stats(tw_durable *d, tw_durable_stats *out)
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
