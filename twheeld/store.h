/* SPDX-License-Identifier: MIT */
/*
 * store.h - twheeld's jobs in twheel's durable store (see store.c).
 */
#ifndef TWHEELD_STORE_H
#define TWHEELD_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tbd_store;

/* --redis: the store's shard lease (cfg.redis_shard_lease_ms). */
#define TBD_SHARD_LEASE_MS 5000

#define TBD_W_SCHED 1  /* write key := payload */
#define TBD_W_CANCEL 2 /* remove key */

/* One write, queued by the event loop and handed back once it is done. */
struct tbd_write {
    struct tbd_write *next;
    int kind;     /* TBD_W_* */
    int result;   /* out: 0 or a TW_E* code */
    char key[24]; /* "j<id>" or "m" */
    size_t key_len;
    int64_t due_ms; /* TBD_W_SCHED: when the store fires it; 0 = never */
    void *payload;  /* malloc'd, freed by the owner */
    size_t payload_len;
    void *owner;  /* the event loop's: who waits for it */
    uint64_t tag; /* the event loop's */
    bool delayed; /* the event loop's: a delayed job's record */
    bool unclaim; /* the event loop's: tbd_store_unclaim() its key once done */
    bool keep_reply;   /* the event loop's: its reply stands even if it fails */
    uint8_t reserving; /* the event loop's: a reserve's lease (RSV_*) */
    /* A conditional write (--redis: a server's writes are fenced): it
     * applies only if the key is pending and its payload begins with the
     * expect_len bytes of expect (expect_len 0: any version), or with
     * expect_absent only if the key is not pending; else result is
     * TW_ESTALE or TW_ENOENT and nothing changed (tw_durable_schedule_if,
     * tw_durable_cancel_if). */
    bool cond;
    bool expect_absent;
    unsigned char expect[16];
    size_t expect_len;
};

/* A job the store fired (its delay ran out), handed to the event loop. */
struct tbd_fired {
    struct tbd_fired *next;
    size_t key_len, payload_len;
    char key[24];
    unsigned char payload[]; /* payload_len bytes */
};

/*
 * tbd_store_open - open the journal in @opt->dir, or with no dir the Redis
 * namespace @opt->redis_ns (NULL: the library's default) at @opt->redis,
 * with @opt->redis_user and _password when set. @opt->fsync_ms (the
 * journal): 0 = fdatasync before each acknowledgement (group commit),
 * > 0 = at most that many ms between a write and its fdatasync, < 0 =
 * never. On Redis writes always go through the writer thread (a write
 * is a round trip). Returns 0 or a TW_E* code with a message in @err.
 */
struct tbd_options;
int tbd_store_open(struct tbd_store **out, const struct tbd_options *opt,
                   char *err, size_t err_len);

/*
 * tbd_store_recover - call @fn once for every key the store holds, with
 * its due time and payload. Returns the number of keys, or a negative TW_E*
 * code (TW_EINVAL when this library cannot list its keys).
 */
long tbd_store_recover(struct tbd_store *s,
                       void (*fn)(void *arg, const char *key, size_t key_len,
                                  int64_t due_ms, const void *p, size_t n),
                       void *arg);

/* A liveness record that fired is delivered again this often until it is
 * cancelled (a takeover that did not finish is done again). */
#define TBD_LIVE_RETRY_MS 10000

/* True when the fired jobs not yet taken include @key. */
bool tbd_store_fired_has(struct tbd_store *s, const char *key, size_t key_len);

/* Writes @key := @p now, on the caller's thread (start-up only: it passes
 * the writer's queue). Returns 0 or a TW_E* code. */
int tbd_store_put(struct tbd_store *s, const char *key, size_t key_len,
                  int64_t due_ms, const void *p, size_t n);

/* The due time of a record that never fires (year 3000, Unix ms). */
int64_t tbd_store_never(void);

/*
 * tbd_store_get - the payload of @key into @buf (@len bytes), its full
 * length into *@plen. Returns 0, TW_ENOENT or another TW_E* code. Any
 * thread; on the event loop it waits for the store's lock (a batch being
 * written, not an fdatasync).
 */
int tbd_store_get(struct tbd_store *s, const char *key, size_t key_len,
                  void *buf, size_t len, size_t *plen);

/* The store's own metrics (tw_durable_metrics()) into @buf, as
 * snprintf(); negative TW_E* on error. */
long tbd_store_metrics(struct tbd_store *s, char *buf, size_t len);

/* How many keys the store holds (0 if it cannot tell). */
uint64_t tbd_store_keys(struct tbd_store *s);

/* True when writes run on the event loop (-f MS > 0, -F) and some wait. */
bool tbd_store_pending_inline(struct tbd_store *s);

/* Inline mode: write everything queued, now, on this thread; returns the
 * completed writes, oldest first. */
struct tbd_write *tbd_store_run_inline(struct tbd_store *s);

/* -f 0 on the journal, before the events of one loop iteration: the
 * writes submitted until tbd_store_run_held() are held from the writer
 * thread, to be written on the loop in one batch (store.c: why). */
void tbd_store_hold(struct tbd_store *s);

/* After tbd_store_hold(): if the writer thread is idle, write the held
 * writes on this thread, synced (the reply still follows the fdatasync),
 * and return the completed writes, earlier completions not yet taken
 * first; else hand them to the writer and return NULL. */
struct tbd_write *tbd_store_run_held(struct tbd_store *s);

/* @fn(@arg, true) just before tbd_store_run_held() writes and syncs on
 * the event loop's thread, @fn(@arg, false) just after, and the same
 * around the calls that may wait for the store's lock (get, metrics,
 * keys, counts) (standin.c: the loop's stand-in while they are slow). */
void tbd_store_sync_hook(struct tbd_store *s, void (*fn)(void *arg, bool begin),
                         void *arg);

/* Reads the eventfd and leaves the completions for a later
 * tbd_store_take() (or tbd_store_run_held()): what the stand-in does,
 * which must not reply before the writes the loop's thread syncs. */
void tbd_store_ack(struct tbd_store *s);

/* Queue @w (event loop thread). Its completion comes back in order. */
void tbd_store_submit(struct tbd_store *s, struct tbd_write *w);

/* An eventfd that becomes readable when completions are waiting. */
int tbd_store_fd(const struct tbd_store *s);

/* Take the completed writes, oldest first (event loop thread). */
struct tbd_write *tbd_store_take(struct tbd_store *s);

/* The jobs the store fired since the last call, oldest first (event loop
 * thread; free() each). The eventfd becomes readable when there are. */
struct tbd_fired *tbd_store_take_fired(struct tbd_store *s);

/* While @key is claimed, a delivery of it is dropped (completed, not
 * handed over): for a delete whose cancel is under way. Claim before
 * taking the fired jobs, so that none of @key slips in between. Unclaim
 * says whether a delivery was dropped meanwhile (its record completed:
 * a conditional cancel then finds it gone, and that is its own doing). */
void tbd_store_claim(struct tbd_store *s, const char *key, size_t key_len);
bool tbd_store_unclaim(struct tbd_store *s, const char *key, size_t key_len);

/* A delayed job in a query's answer. */
struct tbd_hit {
    int64_t due; /* Unix ms */
    uint64_t id;
};

/*
 * A question about the delayed jobs the store holds, answered on the
 * store's query thread by one tw_durable_scan() (on the journal one
 * sequential read, without the store's lock), so the event loop never
 * waits for it: the @want records that @match accepts with the earliest
 * (due, id), earliest first.
 */
struct tbd_query {
    struct tbd_query *next;
    /* in */
    bool (*match)(const struct tbd_query *q, const void *payload, size_t n,
                  int64_t *due, uint64_t *id); /* on the query thread */
    char tube[256];
    size_t tube_len;
    uint32_t node;
    uint32_t *nodes; /* sorted, nnodes of them; malloc'd, freed with @q */
    size_t nnodes;
    int64_t now; /* Unix ms */
    size_t want;
    void *owner;  /* the event loop's: who waits for it */
    uint64_t tag; /* the event loop's */
    int kind;     /* the event loop's */
    uint64_t gen; /* the event loop's */
    /* out */
    int result;           /* 0 or a TW_E* code */
    struct tbd_hit *hits; /* n of them, malloc'd (free() them) */
    size_t n;
};

/* Queue @q (event loop thread); it comes back through the eventfd. */
void tbd_store_query(struct tbd_store *s, struct tbd_query *q);

/* The answered queries, oldest first (event loop thread). */
struct tbd_query *tbd_store_take_queries(struct tbd_store *s);

/* Counters for stats: records written, batches, journal bytes (not
 * with @journal_bytes NULL: then the store's lock is not waited for). */
void tbd_store_counts(struct tbd_store *s, uint64_t *written, uint64_t *batches,
                      uint64_t *journal_bytes);

/* Stop the writer after the queued writes and close the store. */
void tbd_store_close(struct tbd_store *s);

#endif
