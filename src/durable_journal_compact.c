/* SPDX-License-Identifier: MIT */
/*
 * src/durable_journal_compact.c - the journal backend's compaction.
 *
 * Only the oldest segment is ever deleted, so a CANCEL or DONE record
 * never outlives the SCHED records it ends. When the journal holds more
 * than twice its estimated live bytes plus one segment
 * (tw__journal_need_compact()), the store's thread copies the live SCHED
 * and DEAD records of the oldest segment to the end of the journal,
 * syncs, and deletes it (tw__journal_compact_oldest()); open does the
 * same to rewrite a repaired or format-1 journal.
 */
#define _GNU_SOURCE

#include "twheel/durable.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "durable_journal.h"
#include "common.h"

/* ------------------------------------------------------------------------ */
/* Compaction. */

bool tw__journal_need_compact(jstore *s)
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
    if (++c->batch % TW__JOURNAL_CHUNK == 0) { /* let callers in now and then */
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
                           tw__journal_attempts(r->attempt, n->fl & ENT_FIRES),
                           r->payload, r->payload_len, &seg, &off, &lsn);
    if (rc) {
        c->err = rc;
        return 1;
    }
    tw__journal_seg_live(s, n->seg, -1);
    tw__journal_seg_live(s, seg, +1);
    tw__journal_entry_record(n, seg, off);
    c->lsn = lsn;
    return 0;
}

/* Copy the oldest segment's live records forward and delete it (mutex
 * held; released while reading). */
int tw__journal_compact_oldest(jstore *s)
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
