/* SPDX-License-Identifier: MIT */
/*
 * src/durable_journal.h - the journal backend's store (struct jstore) and
 * what its files share; the design is at the top of src/durable_journal.c.
 * Every function here runs with the store's mutex held unless it says
 * otherwise.
 */
#ifndef TWHEEL_DURABLE_JOURNAL_H
#define TWHEEL_DURABLE_JOURNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "durable_backend.h"
#include "durable_combine.h"
#include "durable_exec.h"
#include "durable_index.h"
#include "futex.h"
#include "journal.h"
#include "key_table.h"

/* Due entries a round of the store's thread delivers at once; records
 * compaction copies between two looks at waiting callers. */
#define TW__JOURNAL_CHUNK 256
/* Records whose keys replay and scan ask for ahead. */
#define RECS_AHEAD 16

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
    /* SYNC_INTERVAL: the interval's fdatasync runs on a thread of its own
     * (sync_thr), asked by the store's thread (sync_req, sync_done, under
     * mu; sync_cv both ways), so that due timers never wait for it. */
    pthread_t sync_thr;
    bool sync_thr_on;
    uint64_t sync_req, sync_done;
    pthread_cond_t sync_cv;
    /* Flat combining of schedule and cancel calls (src/durable_combine.h),
     * applied under mu. */
    struct tw__combiner combiner;
    uint64_t combined_lsn; /* the end of the combiner's rounds' records */
    /* fired, retried, lateness, running; backlog: entries due (in due[] or
     * the executor's queue) whose callback has not begun. */
    struct tw__durable_counts counts;
    /* tw_durable_list()'s ordered index (src/durable_index.c): NULL until
     * its first call builds it; from then on every entry in the key table
     * is in it at tw_timer_expires() of its timer (tw__journal_rearm(),
     * tw__journal_entry_remove()).
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

/* Wall-clock ms of the store's clock. */
static inline int64_t tw__journal_wall(const jstore *s)
{
    return s->wall_ms(s->clock_arg);
}

/* The wheel's tick of Unix ms @ms (before 1970: 0). */
static inline uint64_t tw__journal_tick(int64_t ms)
{
    return ms < 0 ? 0 : (uint64_t)ms;
}

/* @n's current version is the SCHED record at @seg/@off, whose attempt
 * counts every delivery begun so far (none since it). */
static inline void tw__journal_entry_record(struct tw__key_entry *n,
                                            uint32_t seg, uint32_t off)
{
    n->seg = seg;
    n->off = off;
    n->fl &= (uint16_t)~ENT_FIRES;
}

/* One more delivery of @n began (its FIRE record is written). */
static inline void tw__journal_fires_add(struct tw__key_entry *n)
{
    if ((n->fl & ENT_FIRES) != ENT_FIRES)
        n->fl++;
}

/* A record's attempt plus @fires deliveries begun after it (saturating). */
static inline uint32_t tw__journal_attempts(uint32_t rec, unsigned fires)
{
    return rec > UINT32_MAX - fires ? UINT32_MAX : rec + fires;
}

/* Segment @no holds @delta more live records. */
static inline void tw__journal_seg_live(jstore *s, uint32_t no, int delta)
{
    jr_seg *g = tw__jr_seg(&s->w, no);
    if (g)
        g->live += (uint64_t)(int64_t)delta;
}

/* durable_journal.c: changes of the key table, the wheel and the indexes,
 * and the calls that make them. */
void tw__journal_index_drop(jstore *s);
void tw__journal_index_out(jstore *s, struct tw__key_entry *n);
void tw__journal_rearm(jstore *s, struct tw__key_entry *n, uint64_t tick);
void tw__journal_dead_clear(jstore *s, struct tw__key_entry *n);
void tw__journal_dead_in(jstore *s, struct tw__key_entry *n);
int tw__journal_to_dead(jstore *s, struct tw__key_entry *n, const jr_rec *rec,
                        uint32_t attempt);
void tw__journal_entry_remove(jstore *s, struct tw__key_pos p);
void tw__journal_kick_if_earlier(jstore *s, int64_t due);
void tw__journal_prefetch_records(jstore *s, const jr_rec *r, size_t n,
                                  size_t stride);
int tw__journal_schedule(tw_durable *d, const void *key, size_t key_len,
                         int64_t due_ms, const void *payload,
                         size_t payload_len);
int tw__journal_cancel(tw_durable *d, const void *key, size_t key_len);
int tw__journal_schedule_many(tw_durable *d, tw_durable_item *items, size_t n);
int tw__journal_cancel_many(tw_durable *d, tw_durable_item *items, size_t n);
int tw__journal_schedule_if(tw_durable *d, tw_durable_item *items,
                            const struct tw__cond *cond, size_t n);
int tw__journal_cancel_if(tw_durable *d, tw_durable_item *items,
                          const struct tw__cond *cond, size_t n);
int tw__journal_stats(tw_durable *d, tw_durable_stats *out);
/* Set up the store's call combiner (at open). */
void tw__journal_combiner_init(jstore *s);

/* durable_journal_fire.c: the store's thread and deliveries. */
/* The wheel's callback of every entry (only within the store's thread's
 * advance). */
void tw__journal_on_due(tw_timer *t, void *arg);
/* Read entry @n's SCHED or DEAD record back; NULL on failure. */
struct delivery *tw__journal_read_record(jstore *s, struct tw__key_entry *n);
/* Start the executor and the store's thread (mutex not held); on failure
 * none is left running. */
int tw__journal_start_threads(jstore *s, uint32_t nexec);
/* Join the store's thread (s->stop set), then stop the executor (mutex
 * not held). */
void tw__journal_stop_threads(jstore *s);

/* durable_journal_damage.c: cfg.on_damage's reports (twheel/durable.h).
 * Report bytes [@from, @to) of segment @segment (@p: the whole file as
 * read) as @kind, then each record whose header can be read in them;
 * @trim: leave out the zeros at their end (a torn tail, a bad segment).
 * Nothing when cfg.on_damage is NULL or no bytes are left. */
void tw__journal_report_bytes(const tw_durable_config *cfg, uint32_t kind,
                              uint32_t segment, const unsigned char *p,
                              size_t from, size_t to, bool trim);
/* Report @count segments missing from @first on. */
void tw__journal_report_missing(const tw_durable_config *cfg, uint32_t first,
                                uint32_t count);

/* durable_journal_compact.c */
bool tw__journal_need_compact(jstore *s);
/* Copy the oldest segment's live records forward and delete it (mutex
 * held; released while reading). */
int tw__journal_compact_oldest(jstore *s);

/* durable_journal_query.c: the ops of twheel/durable.h's look-ups. */
int tw__journal_get(tw_durable *d, const void *key, size_t key_len,
                    tw_durable_info *info, void *buf, size_t buf_len);
int tw__journal_list(tw_durable *d, const struct tw__list_req *q,
                     tw_durable_entry *out, bool *end);
long tw__journal_scan(tw_durable *d, tw_durable_scan_fn fn, void *arg);
int tw__journal_dead_op(tw_durable *d, const void *key, size_t key_len,
                        int64_t due_ms, bool del);
int tw__journal_list_dead(tw_durable *d, const struct tw__list_req *q,
                          tw_durable_entry *out, bool *end);
int tw__journal_touch(tw_durable *d, const void *key, size_t key_len);
int tw__journal_restore(tw_durable *d, const tw_durable_scanned *t);

#endif
