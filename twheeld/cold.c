/* SPDX-License-Identifier: MIT */
/*
 * cold.c - twheeld: delayed jobs in the store (-b, --redis), and store queries.
 */
#define _GNU_SOURCE
#include "tbd.h"

/* ---- delayed jobs in the store (-b, --redis) ---- */

/*
 * With a store, a delayed job is not in memory: its tube counts it
 * (ncold), the store holds its record with the job's due time and fires
 * it (store.c); tbd_fired_jobs() makes it ready here. A command that names a
 * delayed job reads it back from the store (tbd_cold_get()).
 */

/*
 * peek-delayed's memory of a tube's delayed jobs in the store: first[]
 * holds, sorted by (due, id), every one up to first_bound (first_known),
 * at most FIRST_MAX. Jobs that leave (fire, are deleted or kicked) stay
 * in it until peek-delayed meets them at its front, reads them back and
 * drops them; each one added (start-up scan, put, release) goes in if it
 * comes before the bound, which then moves down to the last one kept.
 * When first[] runs dry with a finite bound, the query thread refills it
 * (tbd_query_done()). FIRST_MAX * 16 bytes a tube with delayed jobs.
 */
#define FIRST_MAX 256

static bool hit_less(struct tbd_hit a, struct tbd_hit b)
{
    return a.due < b.due || (a.due == b.due && a.id < b.id);
}

void tbd_cold_add(struct tube *t, int64_t due, uint64_t id)
{
    struct tbd_hit h = {due, id};
    t->cold_adds++;
    if (!t->first_known || hit_less(t->first_bound, h))
        return;
    if (!t->first) {
        t->first = malloc(FIRST_MAX * sizeof(*t->first));
        if (!t->first) {
            t->first_known = false;
            return;
        }
    }
    uint32_t lo = 0, hi = t->nfirst;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (hit_less(t->first[mid], h))
            lo = mid + 1;
        else
            hi = mid;
    }
    bool full = t->nfirst == FIRST_MAX;
    if (full && lo == FIRST_MAX) {
        /* It comes after all of them and stays out: the bound moves down
         * to the last one. */
        t->first_bound = t->first[FIRST_MAX - 1];
        return;
    }
    if (full)
        t->nfirst--; /* the last one goes */
    memmove(&t->first[lo + 1], &t->first[lo],
            (t->nfirst - lo) * sizeof(*t->first));
    t->first[lo] = h;
    t->nfirst++;
    if (full)
        t->first_bound = t->first[FIRST_MAX - 1];
}

/* Writes @j (delayed by j->delay_s from now) to the store with its due
 * time, then frees it; @in_table: it is in the job table. */
void tbd_job_go_cold(struct conn *c, struct job *j, bool in_table,
                     const char *text)
{
    struct tube *t = j->tube;
    j->due_wall = tbd_wall_ms() + (int64_t)j->delay_s * 1000;
    struct tbd_write *w = tbd_job_write(j, J_DELAYED, c);
    w->due_ms = j->due_wall;
    w->cold = t;
    tbd_cold_add(t, j->due_wall, j->id);
    t->ncold++;
    g.counts[J_DELAYED]++;
    if (in_table)
        tbd_job_table_remove(j);
    tbd_job_release(j);
    tbd_submit(c, w, text);
}

/* @j, read back from the store (tbd_job_from_rec()), joins the jobs in
 * memory as ready; @counted: its tube counts it as delayed here. */
static void cold_ready(struct job *j, bool counted)
{
    struct tube *t = j->tube;
    if (counted && t->ncold) {
        t->ncold--;
        g.counts[J_DELAYED]--;
    }
    tbd_job_table_insert(j);
    tbd_job_make_ready(j);
}

/* True when this server issues job id @id (--node: its range). */
bool tbd_own_id(uint64_t id)
{
    return (id >> NODE_SHIFT) == g.opt->node;
}

/* A fired record of job @id that this server must not serve: one in
 * its own range of ids that it has not issued yet (a job of another
 * server cannot have it; served, it would meet the job this server
 * issues with that id). */
static bool fired_squats(uint64_t id)
{
    return tbd_own_id(id) && id >= g.next_id;
}

/* The jobs the store fired: ready now (buried if they were, taken over
 * from a dead server), unless already in memory. A record that is not a
 * job record of its key is left in the store (logged, counted). */
void tbd_fired_jobs(void)
{
    if (!g.store)
        return;
    for (struct tbd_fired *f = tbd_store_take_fired(g.store), *nx; f; f = nx) {
        nx = f->next;
        uint64_t id = tbd_key_id(f->key, f->key_len);
        struct rec r;
        bool ok = false;
        if (f->key_len && f->key[0] == 'n') {
            tbd_live_fired(f->key, f->key_len, f->payload, f->payload_len);
            ok = true;
        } else if (id && tbd_job_find(id)) {
            ok = true; /* in memory already */
        } else if (id && tbd_rec_parse(f->payload, f->payload_len, &r) &&
                   r.id == id && !fired_squats(id)) {
            ok = true;
            struct job *j = tbd_job_from_rec(&r, true);
            if (j) {
                if (r.state == J_BURIED) {
                    /* Taken over from a dead server: buried here. */
                    tbd_job_table_insert(j);
                    tbd_job_make_buried(j);
                } else {
                    cold_ready(j,
                               r.state == J_DELAYED && r.owner == g.opt->node);
                }
                /* Redis: from now on this server holds it (another may
                 * have taken the put), and the record must not fire on
                 * another server again. */
                if (g.opt->redis)
                    tbd_submit(NULL, tbd_job_write(j, j->state, NULL), NULL);
            } else
                tbd_logv(0, "job %" PRIu64 ": out of memory, left in the store",
                         id);
        }
        if (!ok) {
            tbd_unreadable(f->key, f->key_len,
                           "fired, not a job record of its key: left in the "
                           "store");
        }
        free(f);
    }
}

/*
 * A delayed job of this server that the store holds and memory does not,
 * read back (not in the job table, state J_DELAYED, its body loaded,
 * deadline set); NULL if there is none with @id. Free it with
 * tbd_job_free_cold() unless it joins memory (cold_ready()).
 */
struct job *tbd_cold_get(uint64_t id)
{
    if (!g.store)
        return NULL;
    char key[24];
    size_t kl = (size_t)snprintf(key, sizeof(key), "j%" PRIu64, id);
    size_t cap = REC_HEAD + TBD_TUBE_NAME_MAX + g.opt->max_job_size + 4;
    size_t len = 0;
    unsigned char *p = malloc(cap);
    struct rec r;
    int64_t now = tbd_wall_ms();
    struct job *j = NULL;
    if (p && tbd_store_get(g.store, key, kl, p, cap, &len) == 0 && len <= cap &&
        tbd_rec_parse(p, len, &r) && r.id == id && r.owner == g.opt->node &&
        r.state == J_DELAYED && r.due > now)
        j = tbd_job_from_rec(&r, true);
    free(p);
    if (j)
        j->deadline = tw_wheel_now(g.wheel) + (uint64_t)(j->due_wall - now);
    return j;
}

void tbd_job_free_cold(struct job *j)
{
    struct tube *t = j->tube;
    tbd_job_release(j);
    tbd_tube_maybe_free(t);
}

/* The job @id in memory, or read back from the store into memory when
 * it is delayed there: then ready, timed, and *@warmed set. */
struct job *tbd_job_find_warm(uint64_t id, bool *warmed)
{
    *warmed = false;
    struct job *j = tbd_job_find(id);
    if (j || !g.store)
        return j;
    tbd_fired_jobs();
    j = tbd_job_find(id);
    if (j)
        return j;
    j = tbd_cold_get(id);
    if (j) {
        j->timed = true;
        cold_ready(j, true);
        *warmed = true;
    }
    return j;
}

/*
 * peek-delayed and kick of delayed jobs with a store: a query on the
 * store's thread (tbd_store_query(): one scan of the store, off the event
 * loop) finds the ids of the tube's delayed jobs due first; their reply
 * waits, in order, in the connection's output meanwhile (tbd_query_done()).
 */
/* On the query thread: a delayed job of this server in tube q->tube. */
static bool query_match(const struct tbd_query *q, const void *payload,
                        size_t n, int64_t *due, uint64_t *id)
{
    struct rec r;
    if (!tbd_rec_parse(payload, n, &r) || r.state != J_DELAYED ||
        r.due <= q->now || r.owner != q->node || r.tube_len != q->tube_len ||
        memcmp(r.tube, q->tube, r.tube_len) != 0)
        return false;
    *due = r.due;
    *id = r.id;
    return true;
}

static void cold_query(struct conn *c, struct tube *t, int kind, size_t want,
                       struct out *o)
{
    struct tbd_query *q = calloc(1, sizeof(*q));
    if (!q)
        abort();
    q->match = query_match;
    memcpy(q->tube, t->name, t->name_len);
    q->tube_len = t->name_len;
    q->node = g.opt->node;
    q->now = tbd_wall_ms();
    q->want = want;
    q->kind = kind;
    q->gen = t->cold_adds;
    q->owner = c;
    q->tag = (uint64_t)(uintptr_t)o;
    c->pending_writes++;
    tbd_store_query(g.store, q);
}

/* A reply of up to @cap bytes whose text comes later (tbd_query_done()). */
static struct out *reply_later(struct conn *c, size_t cap)
{
    struct out *o = tbd_out_new(cap);
    o->len = 0;
    o->ready = false;
    tbd_out_link(c, o);
    return o;
}

static void out_fill(struct conn *c, struct out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->data, o->cap, fmt, ap);
    va_end(ap);
    o->len = n < 0 ? 0 : (size_t)n < o->cap ? (size_t)n : o->cap - 1;
    c->out_bytes += o->len;
}

/* peek-delayed with a store. */
void tbd_cold_peek(struct conn *c)
{
    struct tube *t = c->use;
    if (!t->ncold) {
        tbd_reply(c, "NOT_FOUND\r\n");
        return;
    }
    tbd_fired_jobs();
    while (t->nfirst) {
        struct tbd_hit h = t->first[0];
        struct job *j = tbd_job_find(h.id) ? NULL : tbd_cold_get(h.id);
        if (j && j->tube == t && j->due_wall == h.due) {
            tbd_cmd_peek_reply(c, j);
            tbd_job_free_cold(j);
            return;
        }
        if (j)
            tbd_job_free_cold(j);
        memmove(&t->first[0], &t->first[1],
                --t->nfirst * sizeof(*t->first)); /* it left */
    }
    if (t->first_known && t->first_bound.due == INT64_MAX) {
        tbd_reply(c, "NOT_FOUND\r\n"); /* first[] held all of them */
        return;
    }
    t->first_known = false;
    cold_query(c, t, Q_PEEK, FIRST_MAX,
               reply_later(c, 64 + (size_t)g.opt->max_job_size));
}

/* kick @bound with a store and no buried job in @t: its delayed jobs,
 * those due first first. */
void tbd_cold_kick(struct conn *c, struct tube *t, uint32_t bound)
{
    if (!t->ncold || !bound) {
        tbd_reply(c, "KICKED 0\r\n");
        return;
    }
    cold_query(c, t, Q_KICK, bound < t->ncold ? bound : t->ncold,
               reply_later(c, 32));
}

/* Kicks what query @q found; the reply @o waits for the last write. */
static void query_kick(struct conn *c, struct tbd_query *q, struct out *o)
{
    uint32_t k = 0;
    struct tbd_write *last = NULL;
    for (size_t i = 0; i < q->n; i++) {
        if (tbd_job_find(q->hits[i].id))
            continue; /* fired meanwhile: ready already */
        struct job *j = tbd_cold_get(q->hits[i].id);
        if (!j)
            continue; /* deleted or kicked meanwhile */
        j->timed = true;
        cold_ready(j, true);
        j->kicks++;
        k++;
        /* Each write but the last goes at once; the reply waits for the
         * last, and writes complete in order. */
        if (last)
            tbd_submit(c, last, NULL);
        last = tbd_job_write(j, J_READY, c);
    }
    out_fill(c, o, "KICKED %u\r\n", k);
    if (last) {
        last->tag = (uint64_t)(uintptr_t)o;
        c->pending_writes++;
        tbd_store_submit(g.store, last);
    } else {
        o->ready = true;
    }
}

/* The queries the store answered. */
/* A peek query's answer: first[] of its tube from it (unless a delayed
 * job was added since the scan), then the first of it still delayed.
 * Returns false when it should be asked again. */
static bool query_peek(struct conn *c, struct tbd_query *q, struct out *o)
{
    struct tube *t = tbd_tube_find(q->tube, q->tube_len);
    if (t && t->cold_adds == q->gen && !t->first_known &&
        (t->first || (t->first = malloc(FIRST_MAX * sizeof(*t->first))))) {
        memcpy(t->first, q->hits, q->n * sizeof(*q->hits));
        t->nfirst = (uint32_t)q->n;
        t->first_known = true;
        t->first_bound = q->n < FIRST_MAX
                             ? (struct tbd_hit){INT64_MAX, UINT64_MAX}
                             : q->hits[q->n - 1];
    }
    for (size_t i = 0; t && i < q->n; i++) {
        if (tbd_job_find(q->hits[i].id))
            continue; /* fired meanwhile */
        struct job *j = tbd_cold_get(q->hits[i].id);
        if (!j)
            continue; /* deleted or kicked meanwhile */
        bool ok = j->tube == t && j->due_wall == q->hits[i].due;
        if (ok) {
            out_fill(c, o, "FOUND %" PRIu64 " %u\r\n", j->id, j->body_len);
            memcpy(o->data + o->len, j->body, (size_t)j->body_len + 2);
            o->len += (size_t)j->body_len + 2;
            c->out_bytes += (size_t)j->body_len + 2;
        }
        tbd_job_free_cold(j);
        if (ok)
            return true;
    }
    /* None of them is delayed any more: more may follow if the answer
     * was full. */
    if (t && t->ncold && q->n == q->want)
        return false;
    out_fill(c, o, "NOT_FOUND\r\n");
    return true;
}

/* The queries the store answered. */
void tbd_query_done(struct tbd_query *q)
{
    for (struct tbd_query *nx; q; q = nx) {
        nx = q->next;
        if (q->kind == Q_TAKE) {
            tbd_takeover_done(q);
            free(q->nodes);
            free(q->hits);
            free(q);
            continue;
        }
        struct conn *c = q->owner;
        struct out *o = (struct out *)(uintptr_t)q->tag;
        c->pending_writes--;
        if (q->result != 0)
            tbd_logv(0, "cannot read the delayed jobs back: %s",
                     tw_strerror(q->result));
        if (!c->closed) {
            tbd_fired_jobs();
            if (q->kind == Q_KICK) {
                query_kick(c, q, o);
            } else if (q->result != 0) {
                out_fill(c, o, "INTERNAL_ERROR\r\n");
                o->ready = true;
            } else if (query_peek(c, q, o)) {
                o->ready = true;
            } else {
                cold_query(c, tbd_tube_find(q->tube, q->tube_len), Q_PEEK,
                           FIRST_MAX, o);
            }
            tbd_conn_pump(c);
        }
        free(q->hits);
        free(q);
    }
}
