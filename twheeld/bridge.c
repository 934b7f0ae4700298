/* SPDX-License-Identifier: MIT */
/*
 * bridge.c - twheeld: the store bridge: job records to the store, and their
 * completions.
 *
 * Durability (-b): a command that changes what a crash must see (put,
 * release, bury, kick, kick-job, delete) queues a write to the store and
 * its reply waits in the connection's output, in order, until the write
 * is back; replies after it wait too. The change itself is made in memory
 * at once, so other connections may see a job (reserve it) before its put
 * is durable; its INSERTED is never sent before.
 */
#define _GNU_SOURCE
#include "tbd.h"

struct tbd_write *tbd_write_new(int kind, struct conn *c)
{
    struct tbd_write *w = calloc(1, sizeof(*w));
    if (!w)
        abort();
    w->kind = kind;
    w->owner = c;
    return w;
}

/*
 * A new write token: never 0 and never the same twice in this process (a
 * bijective mix of a Weyl sequence), from a random start so that two
 * servers' tokens practically never meet.
 */
uint64_t tbd_new_token(struct server *s)
{
    for (;;) {
        uint64_t z = (s->token += UINT64_C(0x9E3779B97F4A7C15));
        z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
        z ^= z >> 31;
        if (z)
            return z;
    }
}

/*
 * --redis: makes @w conditional on the record of @j being the one this
 * server last wrote or read (its token), so that a server that lost the
 * job to a takeover (it was stopped, or cut off) cannot change it: the
 * write then fails with TW_ESTALE or TW_ENOENT (tbd_job_fenced()). The
 * first write of a new job is not conditional: its id is this server's
 * alone and no other server can have taken it before it exists (a record
 * found under its key is not a job's: overwritten). One read from a
 * record before version 3 (no token) must be there in any version.
 */
static void fence_job(struct tbd_write *w, const struct job *j)
{
    struct server *s = j->tube->srv;
    if (!s->opt->redis || (!j->token && !j->stored))
        return;
    w->cond = true;
    if (j->token) {
        unsigned char *q = w->expect;
        *q++ = REC_JOB;
        *q++ = REC_VERSION;
        tbd_put_u64(&q, j->token);
        w->expect_len = REC_FENCE_LEN;
    }
}

/* --redis: makes @w conditional on the record being still the @n bytes
 * at @p as read (its token; any version for a record before version 3). */
void tbd_fence_raw(struct server *s, struct tbd_write *w,
                   const unsigned char *p, size_t n)
{
    if (!s->opt->redis)
        return;
    w->cond = true;
    if (n >= REC_FENCE_LEN && p[0] == REC_JOB && p[1] >= 3) {
        memcpy(w->expect, p, REC_FENCE_LEN);
        w->expect_len = REC_FENCE_LEN;
    }
}

/* Queues the cancel of @j's record (fenced as tbd_job_write()). */
struct tbd_write *tbd_job_cancel_write(struct job *j, struct conn *c)
{
    struct tbd_write *w = tbd_write_new(TBD_W_CANCEL, c);
    w->key_len = (size_t)snprintf(w->key, sizeof(w->key), "j%" PRIu64, j->id);
    fence_job(w, j);
    return w;
}

/* Queues the record of @j (state as a crash should find it). */
struct tbd_write *tbd_job_write(struct job *j, int stored_state, struct conn *c)
{
    struct server *s = j->tube->srv;
    struct tbd_write *w = tbd_write_new(TBD_W_SCHED, c);
    w->key_len = (size_t)snprintf(w->key, sizeof(w->key), "j%" PRIu64, j->id);
    if (j->writes < UINT8_MAX)
        j->writes++;
    fence_job(w, j);
    j->token = tbd_new_token(s); /* the next write expects this one */
    struct rec r = {
        .state = stored_state,
        .pri = j->pri,
        .ttr = j->ttr_s,
        .delay = j->delay_s,
        .body_len = j->body_len,
        .cnt = {j->reserves, j->timeouts, j->releases, j->buries, j->kicks},
        .owner = s->opt->node,
        .token = j->token,
        .id = j->id,
        .due = j->due_wall,
        .created = j->created_wall,
        .tube = j->tube->name,
        .tube_len = j->tube->name_len,
        .body = (const unsigned char *)j->body};
    /* On the journal the compact record (version 4: a delayed job's
     * disk is mostly its record); on Redis version 3, whose write token
     * the fence expects. */
    size_t n = s->opt->redis ? tbd_rec_size(r.tube_len, r.body_len)
                             : tbd_rec_encode_compact(&r, NULL);
    unsigned char *p = tbd_xmalloc(n);
    if (s->opt->redis)
        tbd_rec_encode(&r, p);
    else
        tbd_rec_encode_compact(&r, p);
    w->payload = p;
    w->payload_len = n;
    return w;
}

/*
 * Sends @w to the store with @text as the reply it holds back; without a
 * store the reply goes at once.
 */
void tbd_submit(struct server *s, struct conn *c, struct tbd_write *w,
                const char *text)
{
    if (!s->store) {
        free(w->payload);
        free(w);
        if (text)
            tbd_reply(c, text);
        return;
    }
    if (text)
        w->tag = (uint64_t)(uintptr_t)tbd_reply_held(c, text);
    if (c)
        c->pending_writes++;
    tbd_store_submit(s->store, w);
}

void tbd_store_job(struct conn *c, struct job *j, const char *text)
{
    struct server *s = j->tube->srv;
    if (!s->store) {
        tbd_reply(c, text);
        return;
    }
    int st = j->state == J_RESERVED ? J_READY : j->state;
    tbd_submit(s, c, tbd_job_write(j, st, c), text);
}

/* The store key of this server's high-water mark of ids: "m", or with
 * --node N > 0 "m<N>" (each server its own). */
size_t tbd_mark_key(struct server *s, char *buf, size_t len)
{
    if (s->opt->node == 0)
        return (size_t)snprintf(buf, len, "m");
    return (size_t)snprintf(buf, len, "m%" PRIu32, s->opt->node);
}

/* Issues the next job id; raises the stored high-water mark first. */
uint64_t tbd_next_job_id(struct server *s)
{
    uint64_t id = s->next_id++;
    if (id > s->id_mark && s->store) {
        s->id_mark = id + ID_BLOCK;
        struct tbd_write *w = tbd_write_new(TBD_W_SCHED, NULL);
        w->key_len = tbd_mark_key(s, w->key, sizeof(w->key));
        unsigned char *p = tbd_xmalloc(MARK_LEN);
        tbd_mark_encode(p, s->id_mark);
        w->payload = p;
        w->payload_len = MARK_LEN;
        tbd_store_submit(s->store, w);
    }
    return id;
}

/*
 * A record read back from the store that is not what this server writes
 * (whoever wrote it): counted, and logged with its key (its first 32
 * bytes, bytes outside printable ASCII as '?'), at most UNREADABLE_LOGS
 * a minute, so that a flood of them cannot flood the log.
 */
#define UNREADABLE_LOGS 10
void tbd_unreadable(struct server *s, const char *key, size_t key_len,
                    const char *what)
{
    static uint64_t minute, logged, quiet;
    uint64_t now = tbd_mono_ms() / 60000;
    s->unreadable++;
    if (now != minute) {
        if (quiet)
            tbd_logv(s, 0,
                     "%" PRIu64 " more unreadable store records not logged "
                     "(twheeld_store_unreadable_total)",
                     quiet);
        minute = now;
        logged = quiet = 0;
    }
    if (logged >= UNREADABLE_LOGS) {
        quiet++;
        return;
    }
    logged++;
    char k[33];
    size_t n = key_len < 32 ? key_len : 32;
    for (size_t i = 0; i < n; i++)
        k[i] = key[i] >= 0x20 && key[i] < 0x7f ? key[i] : '?';
    k[n] = '\0';
    tbd_logv(s, 0, "store record %s: %s", k, what);
}

/* A job (in no table, list or state count) from @r, its body with it
 * when @body; NULL when out of memory. */
struct job *tbd_job_from_rec(struct server *s, const struct rec *r, bool body)
{
    struct tube *t = tbd_tube_get(s, r->tube, r->tube_len);
    struct job *j = t ? tbd_job_alloc() : NULL;
    char *b = body && j ? malloc((size_t)r->body_len + 2) : NULL;
    if (!j || (body && !b)) {
        if (j)
            tbd_job_release(s, j);
        if (t)
            tbd_tube_maybe_free(t);
        return NULL;
    }
    j->id = r->id;
    j->pri = r->pri;
    j->ttr_s = r->ttr ? r->ttr : 1;
    j->delay_s = r->delay;
    j->due_wall = r->due;
    j->created_wall = r->created;
    j->reserves = r->cnt[0];
    j->timeouts = r->cnt[1];
    j->releases = r->cnt[2];
    j->buries = r->cnt[3];
    j->kicks = r->cnt[4];
    j->body_len = r->body_len;
    j->stored = true;
    j->token = r->token;
    j->state = (uint8_t)r->state;
    if (b) {
        memcpy(b, r->body, r->body_len);
        memcpy(b + r->body_len, "\r\n", 2);
        j->body = b;
        s->bodies++;
    }
    j->tube = t;
    tw_timer_init(&j->timer, tbd_job_timer_fn, j);
    return j;
}

/* True when @w was refused because the record is no longer the one this
 * server last wrote (fence_job()): another version, or gone (another
 * server took the job and deleted it). */
static bool write_fenced(const struct tbd_write *w)
{
    return w->cond && (w->result == TW_ESTALE || w->result == TW_ENOENT);
}

/* A job record @w came back from the store. */
static void job_written(struct server *s, struct tbd_write *w)
{
    uint64_t id = tbd_key_id(w->key, w->key_len);
    if (write_fenced(w)) {
        tbd_job_fenced(s, id);
        return;
    }
    struct job *j = tbd_job_find(s, id);
    if (!j)
        return; /* deleted meanwhile */
    if (w->result != 0 && w->cond) {
        /* It may or may not have landed: later writes of it expect any
         * version (the token is unknown). */
        j->token = 0;
        j->stored = true;
    }
    if (j->writes > 0 && j->writes < UINT8_MAX)
        j->writes--;
    j->stored |= w->result == 0;
    /* Undated, and no later write (which may date it) under way. */
    if (w->result == 0 && w->due_ms == 0 && j->writes == 0)
        j->timed = false;
    if (w->delayed)
        tbd_job_cool(j, w->result == 0);
    else
        tbd_job_evict(j);
}

/* The held reply @o of @c's write @w: ready, and if @w failed NOT_FOUND
 * when it was fenced (the job is another server's), else, but for a reply
 * that stands whatever happens, INTERNAL_ERROR. */
static void reply_done(struct conn *c, struct out *o, const struct tbd_write *w)
{
    o->ready = true;
    if (w->result == 0 || (w->keep_reply && !write_fenced(w)))
        return;
    const char *e = write_fenced(w) ? "NOT_FOUND\r\n" : "INTERNAL_ERROR\r\n";
    size_t el = strlen(e);
    if (o->cap < el) /* cap is at least 32 (reply_held) */
        abort();
    c->out_bytes -= o->len;
    memcpy(o->data, e, el);
    o->len = el;
    c->out_bytes += o->len;
}

void tbd_store_completions(struct server *s, struct tbd_write *w)
{
    while (w) {
        struct tbd_write *nx = w->next;
        struct conn *c = w->owner;
        if (w->result != 0)
            tbd_logv(s, write_fenced(w) ? 1 : 0, "store write %.*s failed: %s",
                     (int)w->key_len, w->key, tw_strerror(w->result));
        /* A conditional cancel that finds the record gone because this
         * delete's claim dropped a delivery of it (which completed it)
         * did what it had to. */
        bool hit =
            w->unclaim && tbd_store_unclaim(s->store, w->key, w->key_len);
        if (w->kind == TBD_W_CANCEL && w->result == TW_ENOENT && hit)
            w->result = 0;
        if (w->key[0] == 'j' && (w->kind == TBD_W_SCHED || write_fenced(w)))
            job_written(s, w);
        if (w->key[0] == 'n' && w->result == 0 && w->tag > s->live_ok_at)
            s->live_ok_at = w->tag; /* a liveness renewal landed */
        if (c) {
            struct out *o = (struct out *)(uintptr_t)w->tag;
            if (o && w->reserving)
                tbd_lease_done(c, o, w, write_fenced(w));
            else if (o)
                reply_done(c, o, w);
            c->pending_writes--;
            if (!c->closed)
                tbd_conn_pump(c);
        }
        free(w->payload);
        free(w);
        w = nx;
    }
}
