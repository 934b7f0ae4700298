/* SPDX-License-Identifier: MIT */
/*
 * src/durable_journal_query.c - the journal backend's look-ups: get,
 * list (on the ordered index of src/durable_index.c, built step by step
 * on the first listing), scan (the segments read without the lock) and
 * the dead letters (rearm, delete, list, touch).
 */
#define _GNU_SOURCE

#include "twheel/durable.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "durable_journal.h"
#include "common.h"
#include "durable_hooks.h"

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
 * date like a built one (tw__journal_rearm(), tw__journal_index_out()), so a
 * key changed before the walk reaches it is in already and the walk skips it
 * (tw__dx_has()). The walk goes by classes of hash modulo @dx_mod, the size of
 * the smaller table when it began: both tables' sizes stay multiples of it as
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
                        tw__journal_index_drop(s);
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
    bool due = (n->fl & ENT_FIRING) ||
               tw_timer_expires(&n->tm) <= tw__journal_tick(now);
    return due ? TW_DURABLE_DUE : TW_DURABLE_WAITING;
}

int tw__journal_get(tw_durable *d, const void *key, size_t key_len,
                    tw_durable_info *info, void *buf, size_t buf_len)
{
    jstore *s = (jstore *)d;
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    struct tw__key_entry *n =
        tw__key_at(&s->keys, tw__key_find(&s->keys, key, key_len));
    struct delivery *dl = n ? tw__journal_read_record(s, n) : NULL;
    if (!n) {
        rc = TW_ENOENT;
    } else if (!dl) {
        rc = TW_EIO;
    } else {
        /* The next delivery counts one more than those begun so far. */
        info->attempt =
            tw__journal_attempts(dl->rec.attempt, (n->fl & ENT_FIRES) + 1u);
        info->due_ms = dl->rec.due_ms;
        info->state = entry_state(n, tw__journal_wall(s));
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

int tw__journal_list(tw_durable *d, const struct tw__list_req *q,
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
        int64_t now = tw__journal_wall(s);
        while (n < q->max) {
            uint64_t tick;
            uintptr_t h;
            if (!tw__dx_next(&it, &tick, &h) || tick >= q->to) {
                *end = true;
                break;
            }
            const struct tw__key_entry *e = (const struct tw__key_entry *)h;
            if (!tw__list_put(q, &used, &out[n], e->key, e->key_len, tick, now))
                break;
            if (e->fl & ENT_FIRING)
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
    int64_t now = tw__journal_wall(s);
    for (size_t i = 0; i < c->nhits; i++) {
        struct scan_hit *h = &c->hits[i];
        if (i % RECS_AHEAD == 0)
            tw__journal_prefetch_records(
                s, &h->rec,
                c->nhits - i < RECS_AHEAD ? c->nhits - i : RECS_AHEAD,
                sizeof *h);
        struct tw__key_entry *n = tw__key_at(
            &s->keys, tw__key_find(&s->keys, h->rec.key, h->rec.key_len));
        h->live = n && n->seg == c->no && n->off == h->rec.off;
        if (h->live && (n->fl & ENT_DEAD)) { /* as tw_durable_get() says */
            h->attempt = h->rec.attempt;
            h->state = TW_DURABLE_DEAD;
        } else if (h->live) {
            h->attempt =
                tw__journal_attempts(h->rec.attempt, (n->fl & ENT_FIRES) + 1u);
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

long tw__journal_scan(tw_durable *d, tw_durable_scan_fn fn, void *arg)
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
/* Dead letters (see the top of src/durable_journal.c). */

int tw__journal_dead_op(tw_durable *d, const void *key, size_t key_len,
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
            tw__journal_entry_remove(s, p);
    } else {
        /* A SCHED record of its payload with attempt 0: the next delivery
         * is attempt 1, and the policy starts over. */
        struct delivery *dl = tw__journal_read_record(s, n);
        rc = dl ? tw__jr_append(&s->w, JR_SCHED, key, key_len, due_ms, 0,
                                dl->rec.payload, dl->rec.payload_len, &seg,
                                &off, &lsn)
                : TW_EIO;
        if (!rc) {
            tw__journal_seg_live(s, n->seg, -1);
            tw__journal_seg_live(s, seg, +1);
            tw__journal_dead_clear(s, n);
            tw__journal_entry_record(n, seg, off);
            tw__journal_rearm(s, n, tw__journal_tick(due_ms));
            tw__journal_kick_if_earlier(s, due_ms);
        }
        tw__free(dl);
    }
    if (rc) {
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    return tw__jr_wait_unlock(&s->w, lsn);
}

/* A new entry for @t's key, its record written: a SCHED record with the
 * attempts made before (the next delivery is t->attempt), or a DEAD one
 * with the attempts it had. */
int tw__journal_restore(tw_durable *d, const tw_durable_scanned *t)
{
    jstore *s = (jstore *)d;
    bool dead = t->state == TW_DURABLE_DEAD;
    uint32_t made = dead ? t->attempt : t->attempt ? t->attempt - 1 : 0;
    uint32_t seg, off;
    uint64_t lsn;
    struct tw__key_entry *n = NULL;
    pthread_mutex_lock(&s->mu);
    int rc = tw__key_reserve(&s->keys);
    struct tw__key_pos p = tw__key_find(&s->keys, t->key, t->key_len);
    if (!rc && tw__key_at(&s->keys, p))
        rc = TW_EEXIST;
    if (!rc && !(n = tw__key_entry_new(&s->keys, t->key, t->key_len,
                                       tw__journal_on_due)))
        rc = TW_ENOMEM;
    if (!rc)
        rc = tw__jr_append(&s->w, dead ? JR_DEAD : JR_SCHED, t->key, t->key_len,
                           t->due_ms, made, t->payload, t->payload_len, &seg,
                           &off, &lsn);
    if (rc) {
        if (n)
            tw__key_entry_free(&s->keys, n);
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    tw__key_insert(&s->keys, p, n);
    tw__journal_entry_record(n, seg, off);
    tw__journal_seg_live(s, seg, +1);
    if (dead) {
        n->fl |= ENT_DEAD;
        s->ndead++;
        tw__journal_dead_in(s, n);
    } else {
        tw__journal_rearm(s, n, tw__journal_tick(t->due_ms));
        tw__journal_kick_if_earlier(s, t->due_ms);
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

int tw__journal_list_dead(tw_durable *d, const struct tw__list_req *q,
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
            const struct tw__key_entry *e = (const struct tw__key_entry *)h;
            if (!tw__list_put(q, &used, &out[n], e->key, e->key_len, 0, 0))
                break;
            out[n].due_ms = dead_due(s, e);
            out[n].state = TW_DURABLE_DEAD;
            n++;
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc ? rc : (int)n;
}

/* No lease to renew: whether a delivery of @key is under way. */
int tw__journal_touch(tw_durable *d, const void *key, size_t key_len)
{
    jstore *s = (jstore *)d;
    pthread_mutex_lock(&s->mu);
    const struct tw__key_entry *n =
        tw__key_at(&s->keys, tw__key_find(&s->keys, key, key_len));
    int rc = n && (n->fl & ENT_FIRING) ? 0 : TW_ENOENT;
    pthread_mutex_unlock(&s->mu);
    return rc;
}
