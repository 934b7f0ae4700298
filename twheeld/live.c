/* SPDX-License-Identifier: MIT */
/*
 * live.c - twheeld: --redis: liveness records and the takeover of a dead
 * server's jobs.
 */
#define _GNU_SOURCE
#include "tbd.h"

/*
 * --redis: liveness. Each server keeps the record "n<node>" due LIVE_MS
 * ahead of now, rewritten every LIVE_RENEW_MS. When a server dies its
 * record fires LIVE_MS later on the owner of its shard, which takes over
 * the dead server's ready and buried jobs (takeover_start()); the store
 * delivers the record again every TBD_LIVE_RETRY_MS until the takeover
 * is done and cancels it. A server starting again waits until a takeover
 * of its jobs is over before it reads back the records that still name
 * it (tbd_live_wait()).
 */
#define LIVE_MS 10000
#define LIVE_GUARD_MS 2000 /* start-up: due this soon counts as run out */
#define LIVE_WAIT_MAX_MS (3 * LIVE_MS)
/* A fired liveness record due further ahead than this was not written by
 * a server renewing it (LIVE_MS ahead of its clock): removed. */
#define LIVE_AHEAD_MAX_MS (10 * LIVE_MS)

static size_t live_key(char *buf, size_t len, uint32_t node)
{
    return (size_t)snprintf(buf, len, "n%" PRIu32, node);
}

/* The payload of this server's liveness record due at @due. */
static unsigned char *live_payload(struct server *s, int64_t due)
{
    unsigned char *p = tbd_xmalloc(LIVE_LEN);
    tbd_live_encode(p, s->opt->node, due);
    return p;
}

static void live_renew(struct server *s)
{
    struct tbd_write *w = tbd_write_new(TBD_W_SCHED, NULL);
    w->key_len = live_key(w->key, sizeof(w->key), s->opt->node);
    w->due_ms = tbd_wall_ms() + LIVE_MS;
    w->payload = live_payload(s, w->due_ms);
    w->payload_len = LIVE_LEN;
    w->tag = tbd_mono_ms(); /* s->live_ok_at once it lands */
    tbd_store_submit(s->store, w);
}

void tbd_live_fn(tw_timer *tm, void *arg)
{
    struct server *s = arg;
    live_renew(s);
    tbd_delayed_sweep(s);
    tw_wheel_add(s->wheel, tm, tw_wheel_now(s->wheel) + LIVE_RENEW_MS);
}

/*
 * Start-up with --redis, before the jobs are read back: if this server's
 * previous liveness record ran out (or is about to), another server may
 * be taking its jobs over; wait until that takeover cancelled the record
 * (or until this server's own store fires it: no other server is
 * there), at most LIVE_WAIT_MAX_MS. Then write the record anew.
 */
void tbd_live_wait(struct server *s)
{
    char key[24];
    size_t kl = live_key(key, sizeof(key), s->opt->node);
    uint64_t t0 = tbd_mono_ms();
    bool said = false;
    for (;;) {
        unsigned char p[LIVE_LEN];
        size_t len = 0;
        int rc = tbd_store_get(s->store, key, kl, p, sizeof(p), &len);
        if (rc == TW_ENOENT)
            break;
        uint32_t node;
        int64_t due;
        if (rc == 0 &&
            !tbd_live_parse(key, kl, p, len, INT64_MAX, &node, &due)) {
            /* Not a record a takeover acts on (tbd_live_fired()). */
            tbd_unreadable(s, key, kl, "not a liveness record, written anew");
            break;
        }
        if (rc == 0 && due > tbd_wall_ms() + LIVE_GUARD_MS)
            break;
        if (tbd_store_fired_has(s->store, key, kl))
            break;
        if (tbd_mono_ms() - t0 > LIVE_WAIT_MAX_MS) {
            tbd_logv(s, 0,
                     "liveness record %s: no takeover finished in %d ms, "
                     "going on",
                     key, LIVE_WAIT_MAX_MS);
            break;
        }
        if (!said)
            tbd_logv(s, 0,
                     "liveness record %s ran out: waiting for the takeover "
                     "of this server's jobs",
                     key);
        said = true;
        usleep(100000);
    }
    int64_t due = tbd_wall_ms() + LIVE_MS;
    unsigned char *p = live_payload(s, due);
    uint64_t sent = tbd_mono_ms();
    int rc = tbd_store_put(s->store, key, kl, due, p, LIVE_LEN);
    if (rc != 0)
        tbd_logv(s, 0, "liveness record %s: %s", key, tw_strerror(rc));
    else
        s->live_ok_at = sent;
    free(p);
}

/*
 * --redis, before the event loop takes any event: when no liveness
 * renewal has landed for FENCE_MS (this server was stopped, starved or cut
 * off from Redis), its record may have run out and another server may
 * have taken its jobs over (and served, deleted them). What memory holds
 * cannot be trusted any more: this server forgets every job, waits as at
 * start-up until a takeover of its jobs is over (tbd_live_wait()) and
 * reads back the jobs whose records still name it. Its own writes made
 * meanwhile are fenced (bridge.c): none can undo the other's.
 */
#define FENCE_MS (LIVE_MS - LIVE_GUARD_MS)
void tbd_live_check(struct server *s)
{
    uint64_t now = tbd_mono_ms();
    if (!s->opt->redis || !s->store || now - s->live_ok_at < FENCE_MS)
        return;
    tbd_logv(s, 0,
             "no liveness renewal landed for %" PRIu64
             " ms: this server's jobs may be another's now; reading them "
             "back",
             now - s->live_ok_at);
    tbd_forget_jobs(s);
    tbd_live_wait(s);
    int rc = tbd_recover_all(s, "redis");
    if (rc != 0) {
        /* Served from memory: nothing (it holds no job); again in
         * FENCE_MS. */
        tbd_logv(s, 0, "cannot read the jobs back: %s", tw_strerror(rc));
        s->live_ok_at = tbd_mono_ms();
    }
}

/*
 * Takeover (--redis): the ready and buried jobs of a dead server (its
 * liveness record fired here), and those whose record was about to fire
 * anyway (reserved there, or fired there and not yet rewritten).
 */
#define TAKE_MAX 65536 /* ids per query; more: another query */

/* True when the sorted @set of @n nodes holds @node. */
static bool nodes_have(const uint32_t *set, size_t n, uint32_t node)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (set[mid] == node)
            return true;
        if (set[mid] < node)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

/* On the query thread: a job that a server of q->nodes holds, not
 * delayed. */
static bool take_match(const struct tbd_query *q, const void *payload, size_t n,
                       int64_t *due, uint64_t *id)
{
    struct rec r;
    if (!tbd_rec_parse(payload, n, &r) ||
        !nodes_have(q->nodes, q->nnodes, r.owner) ||
        (r.state == J_DELAYED && r.due > q->now))
        return false;
    *due = 0;
    *id = r.id;
    return true;
}

/* Sends the takeover query of the nodes that wait, unless one is out:
 * one scan of the store for every dead node at once, however many
 * liveness records fired together. */
static void takeover_next(struct server *s)
{
    if (s->take_q || s->ntake_wait == 0)
        return;
    struct tbd_query *q = calloc(1, sizeof(*q));
    if (!q)
        abort();
    q->match = take_match;
    q->nodes = s->take_wait;
    q->nnodes = s->ntake_wait;
    s->take_wait = NULL;
    s->ntake_wait = s->take_wait_cap = 0;
    q->now = tbd_wall_ms();
    q->want = TAKE_MAX;
    s->take_q = q;
    /* One line a query, however many records fired. */
    if (q->nnodes == 1)
        tbd_logv(s, 0, "node %" PRIu32 " is dead: taking over its jobs",
                 q->nodes[0]);
    else
        tbd_logv(s, 0,
                 "%zu nodes are dead (%" PRIu32 " to %" PRIu32
                 "): taking over their jobs",
                 q->nnodes, q->nodes[0], q->nodes[q->nnodes - 1]);
    tbd_store_query(s->store, q);
}

/* Takes over the jobs of @node: it joins the next takeover query, unless
 * this one or the next covers it already. */
static void takeover_start(struct server *s, uint32_t node)
{
    if ((s->take_q && nodes_have(s->take_q->nodes, s->take_q->nnodes, node)) ||
        nodes_have(s->take_wait, s->ntake_wait, node)) {
        takeover_next(s);
        return;
    }
    if (s->ntake_wait == s->take_wait_cap) {
        size_t ncap = s->take_wait_cap ? 2 * s->take_wait_cap : 16;
        s->take_wait = realloc(s->take_wait, ncap * sizeof(*s->take_wait));
        if (!s->take_wait)
            abort();
        s->take_wait_cap = ncap;
    }
    size_t i = s->ntake_wait;
    while (i > 0 && s->take_wait[i - 1] > node) {
        s->take_wait[i] = s->take_wait[i - 1];
        i--;
    }
    s->take_wait[i] = node;
    s->ntake_wait++;
    takeover_next(s);
}

/*
 * A liveness record fired here: another server's, it is dead. One that
 * is not a record a server wrote (tbd_live_parse()) is removed, logged and
 * counted: a takeover is never started from it, and it does not fire
 * again every TBD_LIVE_RETRY_MS.
 */
void tbd_live_fired(struct server *s, const char *key, size_t key_len,
                    const unsigned char *p, size_t n)
{
    if (!s->opt->redis)
        return;
    uint32_t node;
    int64_t due;
    if (!tbd_live_parse(key, key_len, p, n, tbd_wall_ms() + LIVE_AHEAD_MAX_MS,
                        &node, &due)) {
        tbd_unreadable(s, key, key_len,
                       "fired, not a liveness record: removed");
        struct tbd_write *w = tbd_write_new(TBD_W_CANCEL, NULL);
        memcpy(w->key, key, key_len);
        w->key_len = key_len;
        tbd_store_submit(s->store, w);
        return;
    }
    if (node == s->opt->node) {
        /* This server's own, fired here: it was late renewing it. */
        tbd_logv(s, 0, "own liveness record ran out: renewed");
        live_renew(s);
        return;
    }
    takeover_start(s, node);
}

/* Keeps in q->nodes the nodes still dead: not back meanwhile (their
 * record renewed), nor taken over by another server (their record
 * gone). Returns how many. */
static size_t takeover_still_dead(struct server *s, struct tbd_query *q)
{
    size_t ndead = 0;
    for (size_t i = 0; i < q->nnodes; i++) {
        char lk[24];
        unsigned char lp[LIVE_LEN];
        size_t lkl = live_key(lk, sizeof(lk), q->nodes[i]), ll = 0;
        uint32_t node;
        int64_t due;
        if (tbd_store_get(s->store, lk, lkl, lp, sizeof(lp), &ll) == 0 &&
            tbd_live_parse(lk, lkl, lp, ll, tbd_wall_ms(), &node, &due))
            q->nodes[ndead++] = q->nodes[i]; /* still sorted */
    }
    q->nnodes = ndead;
    return ndead;
}

/* Rewrites the record of job @hit_id (read into @p, of @cap bytes)
 * naming this server, due now, on the condition that it is still the
 * record read; 1 if it did, 0 if the record is gone or changed since the
 * scan. */
static size_t takeover_move(struct server *s, struct tbd_query *q,
                            uint64_t hit_id, unsigned char *p, size_t cap)
{
    struct tbd_write *w = tbd_write_new(TBD_W_SCHED, NULL);
    w->key_len = (size_t)snprintf(w->key, sizeof(w->key), "j%" PRIu64, hit_id);
    size_t len = 0;
    int64_t due;
    uint64_t id;
    struct rec r;
    if (tbd_store_get(s->store, w->key, w->key_len, p, cap, &len) != 0 ||
        len > cap || !take_match(q, p, len, &due, &id) || id != hit_id ||
        !tbd_rec_parse(p, len, &r)) {
        free(w); /* gone or changed since the scan */
        return 0;
    }
    tbd_fence_raw(s, w, p, len);
    if (r.state == J_DELAYED) /* fired there: ready */
        r.state = J_READY;
    r.owner = s->opt->node;
    r.token = tbd_new_token(s);
    w->payload_len = tbd_rec_size(r.tube_len, r.body_len);
    w->payload = tbd_xmalloc(w->payload_len);
    tbd_rec_encode(&r, w->payload);
    w->due_ms = tbd_wall_ms();
    tbd_store_submit(s->store, w);
    return 1;
}

/*
 * The answer of takeover_start(): each job still named by the dead
 * server's record is rewritten naming this server and due now, so that
 * the owner of its shard fires it and takes it (tbd_fired_jobs(): ready
 * stays ready, buried stays buried). Then the liveness record goes.
 */
void tbd_takeover_done(struct server *s, struct tbd_query *q)
{
    s->take_q = NULL;
    if (q->result != 0) {
        /* Their liveness records fire again (TBD_LIVE_RETRY_MS). */
        tbd_logv(s, 0, "takeover of %zu nodes: %s (again later)", q->nnodes,
                 tw_strerror(q->result));
        takeover_next(s);
        return;
    }
    size_t ndead = takeover_still_dead(s, q);
    size_t cap = tbd_rec_size(TBD_TUBE_NAME_MAX, s->opt->max_job_size);
    unsigned char *p = tbd_xmalloc(cap);
    size_t moved = 0;
    for (size_t i = 0; i < q->n && ndead > 0; i++)
        moved += takeover_move(s, q, q->hits[i].id, p, cap);
    free(p);
    if (ndead == 1)
        tbd_logv(s, 0, "node %" PRIu32 ": %zu jobs handed over", q->nodes[0],
                 moved);
    else if (ndead > 1)
        tbd_logv(s, 0, "%zu dead nodes: %zu jobs handed over", ndead, moved);
    for (size_t i = 0; i < ndead; i++) {
        if (q->n == q->want) {
            takeover_start(s, q->nodes[i]); /* more of theirs: again */
            continue;
        }
        struct tbd_write *w = tbd_write_new(TBD_W_CANCEL, NULL);
        w->key_len = live_key(w->key, sizeof(w->key), q->nodes[i]);
        tbd_store_submit(s->store, w);
    }
    takeover_next(s);
}
