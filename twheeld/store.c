/* SPDX-License-Identifier: MIT */
/*
 * store.c - twheeld's jobs in twheel's durable store.
 *
 * Encoding. Every job is one durable timer: key "j<id>", payload the
 * whole job record (state, priority, TTR, delay and due time by the wall
 * clock, counters, tube name, body, the node holding it; see record.c
 * tbd_rec_encode()). A delayed
 * job's timer is due when the job is (with a store, the server keeps
 * nothing of a delayed job in memory but counts: the store holds it and
 * fires it); every other job's timer is due at a constant far in the
 * future (STORE_DUE, year 3000), so it never fires. The state of a job
 * lives in its payload: a reserved job is stored as it was before the
 * reserve (ready), which is what it becomes after a crash. Key "m" holds
 * a high-water mark of job ids, written before any INSERTED with an id
 * above the previous mark, so that ids are never reused after a restart
 * even when every job was deleted.
 *
 * Firing. When a delayed job's timer fires, store_fire() copies its key
 * and payload to a list the event loop takes (tbd_store_take_fired(),
 * woken through the eventfd) and asks the store to deliver it again in
 * FIRED_KEEP_MS: the timer stays in the store, and the job, now ready in
 * the server's memory, stays durable. Its payload still says "delayed"
 * with a due time in the past, which a restart reads as ready. If the
 * job is still in memory when the timer fires again, the event loop
 * ignores it; a job that changes state (reserve and release, bury,
 * delete) is rewritten or cancelled anyway. At start-up the store's scan
 * (tw_durable_scan(): on the journal one sequential read of its
 * segments) hands every key back whatever its due time.
 *
 * Writes. With -f 0 the event loop may queue writes to one writer thread,
 * which takes everything queued, writes runs of schedules with
 * tw_durable_schedule_many() and of cancels with tw_durable_cancel_many()
 * (in queue order: one job's writes keep their order) and hands the batch
 * back through an eventfd; one fdatasync covers everything that arrived,
 * from any connection, while the previous one ran.
 * But while the writer is idle, the event loop writes and syncs one loop
 * turn's writes itself (tbd_store_hold(), tbd_store_run_held()): every
 * connection's writes of one epoll_wait() share a batch, and the next
 * epoll_wait() finds the clients' next commands together: one epoll
 * wakeup a batch, where the writer cost two thread hand-offs a batch and
 * a wakeup for every few commands that trickled in meanwhile
 * (BENCHMARKS.md: less CPU a put). Commands that write nothing then wait
 * for the fdatasync (as every command does in beanstalkd), but not for
 * long: while such a sync runs the loop's thread lets go of the loop,
 * and a sync that takes long has a stand-in thread run the loop
 * meanwhile (the sync hook, standin.c): a slow or stalled disk holds the
 * writes' replies, never the commands that only read. The writes the
 * stand-in's turns take go to the writer thread, so a batch on the loop
 * has its own item arrays (litems; the writer's are witems). (The loop
 * once sent a second's writes to the writer after any batch over 10 ms,
 * so that readers would not wait for the next slow one; a disk whose
 * syncs only now and then take that long then cost a third of the puts
 * at 16 connections: 15.5k against 20.1k a second, alternating runs.)
 * With -f MS > 0 or -F a durable call returns once its record is written
 * to the kernel, with no fdatasync to wait for: the event loop then
 * writes the writes of one loop iteration itself, in one batch, and
 * replies when the batch returns (tbd_store_run_inline()).
 */
#define _GNU_SOURCE
#include "store_impl.h"

#include "server.h"

#include "twheel/durable.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#define STORE_DUE INT64_C(32503680000000) /* 3000-01-01 in Unix ms */
#define FIRED_KEEP_MS 0x3fffffff          /* about 12 days: a fired job stays */
#define CLAIM_MAX 64 /* claims with room; more are allocated */
/* The journal's segment size (the store's default: 64 MiB). A segment's
 * file doubles as it fills, so 37 MB of records (450,000 delayed jobs)
 * took a 64 MiB file; in 8 MiB segments, 38 MB. */
#define SEGMENT_BYTES (UINT64_C(8) << 20)

void tbd_store_wake(struct tbd_store *s)
{
    uint64_t one = 1;
    ssize_t r = write(s->efd, &one, sizeof(one));
    (void)r; /* eventfd: fails only when the counter would overflow */
}

/* True when @key is claimed; the claim is marked hit (a delivery of the
 * key is about to be dropped, which completes its record). */
static bool claimed(struct tbd_store *s, const void *key, size_t len)
{
    for (size_t i = s->claims_off; i < s->nclaims; i++) {
        if (s->claims[i].len == len && !memcmp(s->claims[i].key, key, len)) {
            s->claims[i].hit = true;
            return true;
        }
    }
    return false;
}

/* A delayed job is due: hand it to the event loop, keep it in the store
 * (see the top of this file). */
static int store_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    struct tbd_store *s = arg;
    if (t->key_len >= sizeof(((struct tbd_fired *)0)->key))
        return FIRED_KEEP_MS; /* not a key of ours */
    pthread_mutex_lock(&s->fmu);
    if (claimed(s, t->key, t->key_len)) {
        /* Its delete is under way: done. */
        pthread_mutex_unlock(&s->fmu);
        return 0;
    }
    struct tbd_fired *f = malloc(sizeof(*f) + t->payload_len);
    if (!f) {
        pthread_mutex_unlock(&s->fmu);
        return 1000; /* again in a second */
    }
    f->key_len = t->key_len;
    memcpy(f->key, t->key, t->key_len);
    f->payload_len = t->payload_len;
    memcpy(f->payload, t->payload, t->payload_len);
    f->next = s->f_head; /* newest first; tbd_store_take_fired() turns it */
    s->f_head = f;
    /* One wake for a run of fired jobs: while the list is not empty the
     * event loop has one coming (it takes the whole list after reading
     * the eventfd). */
    if (!f->next)
        tbd_store_wake(s);
    pthread_mutex_unlock(&s->fmu);
    /* A server's liveness record (live.c): again soon, until the
     * takeover it starts cancels it. */
    return t->key_len && ((const char *)t->key)[0] == 'n' ? TBD_LIVE_RETRY_MS
                                                          : FIRED_KEEP_MS;
}

bool tbd_store_fired_has(struct tbd_store *s, const char *key, size_t key_len)
{
    bool has = false;
    pthread_mutex_lock(&s->fmu);
    for (const struct tbd_fired *f = s->f_head; f && !has; f = f->next)
        has = f->key_len == key_len && !memcmp(f->key, key, key_len);
    pthread_mutex_unlock(&s->fmu);
    return has;
}

int tbd_store_put(struct tbd_store *s, const char *key, size_t key_len,
                  int64_t due_ms, const void *p, size_t n)
{
    return tw_durable_schedule(s->d, key, key_len, due_ms, p, n);
}

/* Writes the conditional run [first, first + n) of one kind. */
static void write_run_if(struct tbd_store *s, struct tbd_items *it,
                         struct tbd_write *first, size_t n)
{
    struct tbd_write *w = first;
    for (size_t i = 0; i < n; i++, w = w->next) {
        it->items_if[i] = (tw_durable_item_if){
            .key = w->key,
            .key_len = w->key_len,
            .due_ms = w->due_ms ? w->due_ms : STORE_DUE,
            .payload = w->payload,
            .payload_len = w->payload_len,
            .expect = w->expect_absent ? NULL : w->expect,
            .expect_len = w->expect_absent ? 0 : w->expect_len};
    }
    if (first->kind == TBD_W_SCHED)
        tw_durable_schedule_many_if(s->d, it->items_if, n);
    else
        tw_durable_cancel_many_if(s->d, it->items_if, n);
    w = first;
    for (size_t i = 0; i < n; i++, w = w->next)
        w->result = it->items_if[i].result; /* ENOENT: the event loop's */
}

/* Writes the run [first, first + n) of one kind; results into each. */
static void write_run(struct tbd_store *s, struct tbd_items *it,
                      struct tbd_write *first, size_t n)
{
    if (first->cond) {
        write_run_if(s, it, first, n);
        return;
    }
    struct tbd_write *w = first;
    for (size_t i = 0; i < n; i++, w = w->next) {
        it->items[i] =
            (tw_durable_item){.key = w->key,
                              .key_len = w->key_len,
                              .due_ms = w->due_ms ? w->due_ms : STORE_DUE,
                              .payload = w->payload,
                              .payload_len = w->payload_len};
    }
    if (first->kind == TBD_W_SCHED)
        tw_durable_schedule_many(s->d, it->items, n);
    else
        tw_durable_cancel_many(s->d, it->items, n);
    w = first;
    for (size_t i = 0; i < n; i++, w = w->next) {
        w->result = it->items[i].result;
        /* Deleting a job that was never written is not an error. */
        if (w->kind == TBD_W_CANCEL && w->result == TW_ENOENT)
            w->result = 0;
    }
}

/* The writes in the list @head. */
static size_t count_writes(const struct tbd_write *head)
{
    size_t n = 0;
    for (; head; head = head->next)
        n++;
    return n;
}

/* Writes the list @head, runs of one kind at a time, in order. */
static void write_batch(struct tbd_store *s, struct tbd_items *it,
                        struct tbd_write *head)
{
    for (struct tbd_write *run = head; run;) {
        size_t k = 1;
        struct tbd_write *e = run;
        while (e->next && e->next->kind == run->kind &&
               e->next->cond == run->cond && k < BATCH_MAX) {
            e = e->next;
            k++;
        }
        struct tbd_write *after = e->next;
        write_run(s, it, run, k);
        run = after;
    }
}

static void *writer(void *arg)
{
    struct tbd_store *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->q_head && !s->stop) {
            s->writer_idle = true;
            pthread_cond_wait(&s->cv, &s->mu);
            s->writer_idle = false;
        }
        if (!s->q_head)
            break;
        /* Take up to BATCH_MAX writes. */
        struct tbd_write *head = s->q_head, *last = head;
        size_t n = 1;
        while (last->next && n < BATCH_MAX) {
            last = last->next;
            n++;
        }
        s->q_head = last->next;
        if (!s->q_head)
            s->q_tail = NULL;
        last->next = NULL;
        pthread_mutex_unlock(&s->mu);

        write_batch(s, &s->witems, head);

        pthread_mutex_lock(&s->mu);
        s->written += n;
        s->batches++;
        if (s->done_tail)
            s->done_tail->next = head;
        else
            s->done_head = head;
        s->done_tail = last;
        if (!s->q_head) {
            /* The event loop takes the batch without waiting for the
             * mutex: it is free before the wake. */
            pthread_mutex_unlock(&s->mu);
            tbd_store_wake(s);
            pthread_mutex_lock(&s->mu);
        } else {
            tbd_store_wake(s);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Frees @s, its store closed (or never opened) and its threads gone. */
static void store_free(struct tbd_store *s)
{
    close(s->efd);
    for (struct tbd_fired *f = s->f_head, *nx; f; f = nx) {
        nx = f->next;
        free(f);
    }
    free(s->claims);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->fmu);
    pthread_mutex_destroy(&s->qmu);
    pthread_cond_destroy(&s->qcv);
    free(s);
}

/* The store's configuration from @opt; its fsync interval into
 * *@fsync_ms (0 on Redis: the writer thread, a write is a round trip). */
static tw_durable_config store_config(const struct tbd_options *opt,
                                      int *fsync_ms)
{
    /* Segments of SEGMENT_BYTES: the newest one's file doubles as it
     * fills, so the disk holds up to a segment beyond the records. */
    tw_durable_config cfg = {.dir = opt->dir, .segment_bytes = SEGMENT_BYTES};
    *fsync_ms = opt->fsync_ms;
    if (!opt->dir) {
        cfg.redis = opt->redis;
        cfg.redis_namespace = opt->redis_ns;
        cfg.redis_user = opt->redis_user;
        cfg.redis_password = opt->redis_password;
        /* Each shard of the namespace has one owner among the live
         * servers; a dead server's shards (and the jobs due in them)
         * move to the others after this (docs/guide/twheeld.md). */
        cfg.redis_shard_lease_ms = TBD_SHARD_LEASE_MS;
        *fsync_ms = 0;
    } else if (*fsync_ms == 0) {
        cfg.sync = TW_DURABLE_SYNC_GROUP;
    } else if (*fsync_ms > 0) {
        cfg.sync = TW_DURABLE_SYNC_INTERVAL;
        cfg.sync_interval_ms = (uint32_t)*fsync_ms;
    } else {
        cfg.sync = TW_DURABLE_SYNC_NONE;
    }
    return cfg;
}

int tbd_store_open(struct tbd_store **out, const struct tbd_options *opt,
                   char *err, size_t err_len)
{
    int fsync_ms;
    struct tbd_store *s = calloc(1, sizeof(*s));
    if (!s)
        return TW_ENOMEM;
    tw_durable_config cfg = store_config(opt, &fsync_ms);
    cfg.fire = store_fire;
    cfg.fire_arg = s;
    cfg.errbuf = err;
    cfg.errbuf_len = err_len;
    /* The store may fire as soon as it is open: all of this first. */
    s->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (s->efd < 0) {
        free(s);
        return -errno;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_init(&s->fmu, NULL);
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->qcv, NULL);
    int rc = tw_durable_open(&s->d, &cfg);
    if (rc == 0 &&
        pthread_create(&s->qthread, NULL, tbd_store_querier, s) != 0) {
        tw_durable_close(s->d);
        rc = TW_ENOMEM;
        if (err && err_len)
            snprintf(err, err_len, "cannot start the query thread");
    }
    if (rc != 0) {
        store_free(s);
        return rc;
    }
    /* Without an fdatasync to wait for, a write is a write(2): cheaper
     * on the event loop's thread, batched per loop iteration, than a
     * hand-off to another thread and back. */
    s->inline_writes = fsync_ms != 0;
    s->lone_ok = !s->inline_writes && opt->dir;
    if (s->inline_writes) {
        *out = s;
        return 0;
    }
    if (pthread_create(&s->thread, NULL, writer, s) != 0) {
        tbd_store_stop_querier(s);
        tw_durable_close(s->d);
        store_free(s);
        if (err && err_len)
            snprintf(err, err_len, "cannot start the writer thread");
        return TW_ENOMEM;
    }
    *out = s;
    return 0;
}

struct recover_fn {
    void (*fn)(void *arg, const char *key, size_t key_len, int64_t due_ms,
               const void *p, size_t n);
    void *arg;
};

static int recover_one(void *arg, const tw_durable_scanned *t)
{
    struct recover_fn *r = arg;
    r->fn(r->arg, t->key, t->key_len, t->due_ms, t->payload, t->payload_len);
    return 0;
}

int64_t tbd_store_never(void)
{
    return STORE_DUE;
}

long tbd_store_recover(struct tbd_store *s,
                       void (*fn)(void *arg, const char *key, size_t key_len,
                                  int64_t due_ms, const void *p, size_t n),
                       void *arg)
{
    struct recover_fn r = {fn, arg};
    return tw_durable_scan(s->d, recover_one, &r);
}

/* Around a call of the event loop's that may wait for the store's lock
 * (which a batch being written holds, and a segment being made holds
 * for its fsync): the sync hook, so that a stand-in serves the loop if
 * that takes long (standin.c). */
static void lock_wait(struct tbd_store *s, bool begin)
{
    if (s->sync_hook)
        s->sync_hook(s->sync_arg, begin);
}

int tbd_store_get(struct tbd_store *s, const char *key, size_t key_len,
                  void *buf, size_t len, size_t *plen)
{
    tw_durable_info in;
    lock_wait(s, true);
    int rc = tw_durable_get(s->d, key, key_len, &in, buf, len);
    lock_wait(s, false);
    if (rc == 0)
        *plen = in.payload_len;
    return rc;
}

long tbd_store_metrics(struct tbd_store *s, char *buf, size_t len)
{
    lock_wait(s, true);
    long n = tw_durable_metrics(s->d, NULL, 0, buf, len);
    lock_wait(s, false);
    return n;
}

uint64_t tbd_store_keys(struct tbd_store *s)
{
    tw_durable_stats st;
    lock_wait(s, true);
    int rc = tw_durable_stats_get(s->d, &st);
    lock_wait(s, false);
    return rc == 0 ? st.pending : 0;
}

bool tbd_store_pending_inline(struct tbd_store *s)
{
    return s->inline_writes && s->q_head != NULL;
}

struct tbd_write *tbd_store_run_inline(struct tbd_store *s)
{
    struct tbd_write *head = s->q_head;
    s->q_head = s->q_tail = NULL;
    if (head) {
        write_batch(s, &s->litems, head);
        s->written += count_writes(head);
        s->batches++;
    }
    return head;
}

void tbd_store_submit(struct tbd_store *s, struct tbd_write *w)
{
    w->next = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->q_tail)
        s->q_tail->next = w;
    else
        s->q_head = w;
    s->q_tail = w;
    bool idle = s->writer_idle && !s->held;
    pthread_mutex_unlock(&s->mu);
    /* After the unlock: a writer woken while the mutex is held would
     * only sleep again on it (two more futex calls a write). */
    if (idle)
        pthread_cond_signal(&s->cv);
}

void tbd_store_hold(struct tbd_store *s)
{
    if (s->inline_writes || !s->lone_ok)
        return;
    s->held = true; /* read by submit on this thread only */
}

void tbd_store_sync_hook(struct tbd_store *s, void (*fn)(void *, bool),
                         void *arg)
{
    s->sync_hook = fn;
    s->sync_arg = arg;
}

/* Appends the list @b to the list @a; the whole list. */
static struct tbd_write *concat(struct tbd_write *a, struct tbd_write *b)
{
    if (!a)
        return b;
    struct tbd_write *t = a;
    while (t->next)
        t = t->next;
    t->next = b;
    return a;
}

/* The held writes @head, written and synced on this thread (the writer
 * is idle), between the sync hook's two calls; @done: earlier
 * completions not yet taken. The completions in order: @done, @head,
 * then whatever the writer finished meanwhile (writes submitted while
 * this thread synced: the sync hook's stand-in, standin.c). */
static struct tbd_write *run_here(struct tbd_store *s, struct tbd_write *head,
                                  struct tbd_write *done)
{
    lock_wait(s, true);
    write_batch(s, &s->litems, head);
    lock_wait(s, false);
    size_t n = count_writes(head);
    pthread_mutex_lock(&s->mu);
    s->written += n;
    s->batches++;
    struct tbd_write *after = s->done_head;
    s->done_head = s->done_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    return concat(done, concat(head, after));
}

struct tbd_write *tbd_store_run_held(struct tbd_store *s)
{
    if (!s->held)
        return NULL;
    s->held = false;
    pthread_mutex_lock(&s->mu);
    if (!s->q_head || !s->writer_idle) { /* nothing, or the writer's */
        bool wake_writer = s->q_head && s->writer_idle;
        pthread_mutex_unlock(&s->mu);
        if (wake_writer)
            pthread_cond_signal(&s->cv);
        return NULL;
    }
    /* The writer sleeps and nothing else submits (this is the event
     * loop's thread): write here. */
    struct tbd_write *head = s->q_head, *done = s->done_head;
    s->q_head = s->q_tail = NULL;
    s->done_head = s->done_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    return run_here(s, head, done);
}

void tbd_store_ack(struct tbd_store *s)
{
    uint64_t v;
    ssize_t r = read(s->efd, &v, sizeof(v));
    (void)r; /* EAGAIN when already drained: nothing to do */
}

int tbd_store_fd(const struct tbd_store *s)
{
    return s->efd;
}

struct tbd_write *tbd_store_take(struct tbd_store *s)
{
    tbd_store_ack(s);
    pthread_mutex_lock(&s->mu);
    struct tbd_write *h = s->done_head;
    s->done_head = s->done_tail = NULL;
    pthread_mutex_unlock(&s->mu);
    return h;
}

struct tbd_fired *tbd_store_take_fired(struct tbd_store *s)
{
    pthread_mutex_lock(&s->fmu);
    struct tbd_fired *f = s->f_head, *h = NULL;
    s->f_head = NULL;
    pthread_mutex_unlock(&s->fmu);
    while (f) { /* oldest first */
        struct tbd_fired *nx = f->next;
        f->next = h;
        h = f;
        f = nx;
    }
    return h;
}

void tbd_store_claim(struct tbd_store *s, const char *key, size_t key_len)
{
    pthread_mutex_lock(&s->fmu);
    if (s->nclaims == s->claims_cap && s->claims_off > 0) {
        memmove(s->claims, s->claims + s->claims_off,
                (s->nclaims - s->claims_off) * sizeof(*s->claims));
        s->nclaims -= s->claims_off;
        s->claims_off = 0;
    }
    if (s->nclaims == s->claims_cap) {
        size_t ncap = s->claims_cap ? s->claims_cap * 2 : CLAIM_MAX;
        struct claim *nc = realloc(s->claims, ncap * sizeof(*nc));
        if (!nc) {
            fputs("twheeld: out of memory\n", stderr);
            abort();
        }
        s->claims = nc;
        s->claims_cap = ncap;
    }
    memcpy(s->claims[s->nclaims].key, key, key_len);
    s->claims[s->nclaims].hit = false;
    s->claims[s->nclaims++].len = key_len;
    pthread_mutex_unlock(&s->fmu);
}

bool tbd_store_unclaim(struct tbd_store *s, const char *key, size_t key_len)
{
    bool hit = false;
    pthread_mutex_lock(&s->fmu);
    for (size_t i = s->claims_off; i < s->nclaims; i++) {
        if (s->claims[i].len == key_len &&
            !memcmp(s->claims[i].key, key, key_len)) {
            s->claims[i].len = 0;
            hit = s->claims[i].hit;
            break;
        }
    }
    while (s->claims_off < s->nclaims && s->claims[s->claims_off].len == 0)
        s->claims_off++;
    if (s->claims_off == s->nclaims)
        s->claims_off = s->nclaims = 0;
    pthread_mutex_unlock(&s->fmu);
    return hit;
}

void tbd_store_counts(struct tbd_store *s, uint64_t *written, uint64_t *batches,
                      uint64_t *journal_bytes)
{
    pthread_mutex_lock(&s->mu);
    *written = s->written;
    *batches = s->batches;
    pthread_mutex_unlock(&s->mu);
    tw_durable_stats st;
    if (!journal_bytes)
        return;
    *journal_bytes = 0;
    lock_wait(s, true);
    if (tw_durable_stats_get(s->d, &st) == 0)
        *journal_bytes = st.journal_bytes;
    lock_wait(s, false);
}

void tbd_store_close(struct tbd_store *s)
{
    if (!s)
        return;
    /* Whatever is still queued is written; its replies are never sent. */
    struct tbd_write *left;
    if (s->inline_writes) {
        left = tbd_store_run_inline(s);
    } else {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_signal(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
        left = s->done_head; /* written after the event loop's last take */
        s->done_head = s->done_tail = NULL;
    }
    for (struct tbd_write *nx; left; left = nx) {
        nx = left->next;
        free(left->payload);
        free(left);
    }
    tbd_store_stop_querier(s);
    tw_durable_close(s->d);
    store_free(s);
}
