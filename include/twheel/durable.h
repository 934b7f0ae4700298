/* SPDX-License-Identifier: MIT */
/*
 * twheel/durable.h - durable timers: a store of keyed timers that survives
 * a crash of its process.
 *
 * Three backends serve the same calls and the same callback:
 *   - the journal (default, cfg.redis == NULL): an append-only journal of
 *     segments in the directory cfg.dir, one process per directory, with an
 *     in-memory wheel as its index;
 *   - Redis (cfg.redis = "host:port[,host:port...]" or a URL:
 *     redis://[user[:password]@]host[:port][,host[:port]...][/db],
 *     rediss://... (TLS), unix:///path/redis.sock[?db=N],
 *     redis-sentinel://[user[:password]@]host[:port][,...]/master-name):
 *     one Redis server, a Redis Cluster or a Sentinel-managed master is the
 *     source of truth, and every process that opens the same namespace
 *     claims the timers due within a short horizon into its own wheel and
 *     fires them. See docs/guide/redis.md.
 *   - PostgreSQL (cfg.postgres, a libpq connection string or URL): the
 *     timers are rows of the schema "twheel" (installed by open), which
 *     any client may schedule into by SQL inside its own transaction;
 *     every process that opens the same namespace claims due rows and
 *     fires them. See docs/guide/postgres.md.
 *
 * Delivery is at least once: a callback may see the same timer again after
 * a crash (attempt > 1), and must tolerate it. A delivery that began and
 * neither completed nor asked for a retry (a crash inside the callback)
 * counts as an attempt on both backends: on the journal by its FIRE record
 * (up to 8,191 in a row; past that, attempt stops growing until the next
 * retry), on Redis by the claim's lease running out. So with
 * cfg.max_attempts a timer that crashes its process every time ends as a
 * dead letter (see "Retry policy and dead letters" below). What else a
 * crash costs: the journal writes FIRE records for a batch of due timers
 * and syncs them before the batch's callbacks run, so each timer of the
 * batch whose callback had not started counts an attempt too; with
 * cfg.max_attempts set it writes each FIRE record instead as its callback
 * starts (not synced: a crash of the machine may lose the count of the
 * last attempts), so only the running timer's count grows. On Redis every
 * timer the dead node had claimed (due within cfg.horizon_ms) counts an
 * attempt, started or not, and so does a completed one whose completion
 * had not reached Redis yet (completions wait up to 500 ms for a batch).
 * Nothing is delivered before its due time by the wall clock, except after the
 * wall clock steps back by S: a timer scheduled then for a time the store has
 * already passed fires at once, early by at most S (docs/guide/durable.md).
 *
 * Thread safety: tw_durable_schedule(), tw_durable_cancel(), their
 * batch and conditional forms (tw_durable_schedule_if() ...) and
 * tw_durable_stats_get() may be called from any thread, callbacks
 * included.
 * tw_durable_close() of a store from inside one of its own callbacks
 * returns TW_EDEADLK and does nothing. A callback that calls in while
 * close() waits for it gets TW_ESHUTDOWN, nothing changed, from every call
 * once close() has begun.
 *
 * This header is the contract; see docs/guide/durable.md for the
 * guarantees table and the journal format.
 */
#ifndef TWHEEL_DURABLE_H
#define TWHEEL_DURABLE_H

#include "twheel/base.h" /* TW_VERSION_*, TW_E*, tw_strerror() */
#include "twheel/wheel.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tw_durable tw_durable;
typedef struct tw_durable_damage tw_durable_damage;

#define TW_DURABLE_KEY_MAX 1024u               /* longest key, in bytes */
#define TW_DURABLE_PAYLOAD_MAX (1024u * 1024u) /* longest payload, bytes */

/* A timer as the fire callback sees it. Valid only during the callback. */
typedef struct tw_durable_timer {
    const void *key;     /* 1 .. TW_DURABLE_KEY_MAX bytes */
    size_t key_len;      /* bytes of key */
    const void *payload; /* 0 .. TW_DURABLE_PAYLOAD_MAX bytes */
    size_t payload_len;  /* bytes of payload */
    int64_t due_ms;      /* Unix time in ms (CLOCK_REALTIME) */
    uint32_t attempt;    /* 1 on the first delivery, 2 after one retry... */
    /* Fields below were added after 0.2.0: a fencing token for the
     * callback's own downstream writes. Redis: @token is the claim's token,
     * unique per claim and growing within the key's shard (a later claim
     * of any key of the shard has a larger one); @epoch is the
     * shard's ownership epoch when the timer was claimed by its shard's
     * owner (cfg.redis_shard_lease_ms), else 0. Journal: both 0. */
    uint64_t epoch; /* the owner's epoch at the claim, or 0 */
    uint64_t token; /* the claim's token (Redis), or 0 */
} tw_durable_timer;

/*
 * Called once the timer is due. Return 0: done, recorded as completed,
 * never delivered again. Return n > 0: deliver again in n ms (attempt + 1).
 * Return TW_DURABLE_FIRE_RETRY: deliver again after the store's backoff
 * (cfg.retry_ms ...). Return TW_DURABLE_FIRE_DEAD: move the timer to the
 * dead letters at once. Any other value < 0: done as well (a failure the
 * caller has handled). A retry (n > 0 or FIRE_RETRY) of a delivery whose
 * attempt is cfg.max_attempts moves the timer to the dead letters instead.
 */
typedef int (*tw_durable_fire_fn)(tw_durable *d, const tw_durable_timer *t,
                                  void *arg);

/* Results of a tw_durable_fire_fn beyond 0 and n > 0. Both lie far below
 * every TW_E* code, so a callback that returns an error code keeps its
 * meaning ("done"). */
#define TW_DURABLE_FIRE_RETRY (-0x40000000) /* again after the backoff */
#define TW_DURABLE_FIRE_DEAD (-0x40000001)  /* to the dead letters now */

/* cfg.sync */
#define TW_DURABLE_SYNC_GROUP 0u /* fdatasyncs shared by concurrent calls */
#define TW_DURABLE_SYNC_EACH 1u  /* one fdatasync per call */
#define TW_DURABLE_SYNC_NONE 2u  /* no fdatasync: a crash loses last writes */
/* Journal only: a call returns once its record is written to the kernel
 * (it survives kill -9 of the process); a thread of the store's fdatasyncs
 * in the background every cfg.sync_interval_ms. A crash of the machine (power,
 * kernel) loses up to that long of acknowledged calls, like Redis with
 * appendfsync everysec. */
#define TW_DURABLE_SYNC_INTERVAL 3u

/* cfg.flags */
#define TW_DURABLE_REPAIR                                                      \
    1u /* open a journal with corruption in its middle                         \
          by dropping the damaged records, or with a                           \
          segment missing */
/* Look without touching, for inspection tools (both backends): the
 * journal is read as it is (no lock taken, so a live store in another
 * process may hold the directory; nothing is written, created, truncated
 * or deleted; a record being appended meanwhile may be missed), Redis is
 * only read; nothing is ever delivered. tw_durable_get(), _list() and
 * _stats_get() work; every change returns TW_EROFS. With
 * TW_DURABLE_REPAIR: damaged records are skipped as a repair would,
 * but nothing is written (a dry run). A missing directory is TW_ENOENT. */
#define TW_DURABLE_READONLY 2u
/* Open (and replay, repair) without delivering anything: no store thread
 * or executors run, so no callback is called until close. For tools that
 * must change a store without firing it (a repair, a re-arm of a dead
 * letter). Journal: schedule and cancel still work. Redis: nothing is
 * claimed; cancel, tw_durable_rearm() and tw_durable_dead_delete() work,
 * tw_durable_schedule() and _schedule_many() return TW_EINVAL (a
 * schedule claims a timer due soon at once, and no one would fire it
 * before its lease ran out). */
#define TW_DURABLE_NOFIRE 4u

/* Where a store keeps its timers and how it delivers them. */
typedef struct tw_durable_config {
    const char *dir;           /* journal backend: required; made (with its
                                  parents) if missing */
    tw_durable_fire_fn fire;   /* required */
    void *fire_arg;            /* passed to fire */
    uint32_t sync;             /* TW_DURABLE_SYNC_* (0 = GROUP) */
    uint32_t group_commit_us;  /* unused by the journal since 0.2.0: a sync
                                  starts at once, and calls that arrive
                                  while it runs share the next one */
    uint32_t executor_threads; /* 0 = fire on the store's own thread */
    uint64_t segment_bytes;    /* 0 = 64 MiB: a segment's most bytes; its
                                  file starts at 64 KiB and doubles as it
                                  fills */

    /* Redis backend. NULL = the journal in @dir. */
    const char *redis;           /* "host:port[,host:port...]" seed nodes,
                                    or a URL (see the top of this file) */
    const char *redis_namespace; /* key prefix; NULL = "tw" */
    uint32_t shards;             /* 0 = the namespace's recorded count
                                    ({ns:meta}), or 64 for a new one;
                                    another count than the recorded one:
                                    TW_EINVAL at open */
    uint32_t horizon_ms;         /* 0 = 2000: how far ahead a node claims */
    uint32_t lease_ms;           /* 0 = 30000: a claim of a silent node is
                                    delivered by another node after this */
    uint32_t wait_replicas;      /* 0 = none: after each write, WAIT for this
                                    many replicas to acknowledge it */
    uint32_t wait_timeout_ms;    /* 0 = 1000: WAIT's timeout */

    uint32_t flags; /* TW_DURABLE_REPAIR, ... */

    /* Clocks, for tests: NULL = CLOCK_REALTIME in ms and CLOCK_MONOTONIC in
     * ns. Both take @clock_arg. */
    int64_t (*wall_ms)(void *clock_arg);
    uint64_t (*mono_ns)(void *clock_arg); /* monotonic clock, ns */
    void *clock_arg;                      /* passed to both clocks */

    /* Optional: on a failed open, a message saying why, NUL-ended: the
     * field of a TW_EINVAL, the file and the system's reason of a file
     * system error, for TW_EIO the segment file and the offset of the
     * damage (or the missing segment). Set to "" as an open begins. */
    char *errbuf;      /* NULL = no message */
    size_t errbuf_len; /* bytes at @errbuf */

    /* Fields below were added in 0.2.0 (zero = default). */
    uint32_t sync_interval_ms; /* TW_DURABLE_SYNC_INTERVAL: longest time
                                  between a write and its fdatasync;
                                  0 = 1000 */

    /* Fields below were added after 0.2.0 (zero = default): the Redis
     * backend's credentials and TLS files. A field that is set overrides
     * the same part of a cfg.redis URL. Secrets given here stay out of
     * the command line and the logs; no message or counter ever shows a
     * password. */
    const char *redis_user;              /* ACL user; NULL = the URL's, else the
                                            server's "default" user */
    const char *redis_password;          /* NULL = the URL's, else no AUTH */
    const char *redis_sentinel_user;     /* AUTH for the sentinels of a */
    const char *redis_sentinel_password; /* redis-sentinel:// address */
    const char *redis_tls_ca_file;       /* rediss://: PEM CAs to trust;
                                            NULL (and no ca_dir) = the
                                            system's store */
    const char *redis_tls_ca_dir;        /* a hashed directory of CAs */
    const char *redis_tls_cert_file;     /* client certificate chain (PEM)
                                            for servers that ask for one */
    const char *redis_tls_key_file;      /* its private key (PEM) */
    const char *redis_tls_server_name;   /* name sent (SNI) and checked in
                                            the server's certificate; NULL =
                                            each node's host */

    /* Fields below were added after 0.2.0 (zero = no limit, as before):
     * the retry policy, per store (for every process of a Redis namespace
     * give the same; the node that delivers a timer applies its own). */
    uint32_t max_attempts;     /* 0 = no limit; else the most deliveries a
                                  timer gets: a retry asked by the attempt
                                  max_attempts, or a delivery that would be
                                  attempt max_attempts + 1 (after crashes),
                                  moves it to the dead letters */
    uint32_t retry_ms;         /* TW_DURABLE_FIRE_RETRY's first delay;
                                  0 = 1000 */
    uint32_t retry_max_ms;     /* 0 (or <= retry_ms): every delay is
                                  retry_ms (fixed); else exponential:
                                  retry_ms * 2^(attempt - 1), at most this */
    uint32_t retry_jitter_pct; /* 0 .. 100: each delay is cut by a random
                                  part of up to this percent (spreads the
                                  retries of timers that failed together);
                                  more than 100 is TW_EINVAL */

    /* Redis: fenced shard ownership (docs/guide/redis.md). 0 = off: every
     * node claims every shard. > 0: each shard has one owner at a time,
     * chosen among the live nodes by rendezvous hashing and recorded in
     * Redis with an epoch; only the owner claims the shard's timers; its
     * record lasts this many ms (5000 is a good start) and a crashed
     * owner's shards move after it; claims then last min(lease_ms, this)
     * ms. Every node of a namespace should use the same value. */
    uint32_t redis_shard_lease_ms;

    /* Redis: the shortest time in ms between two claim checks of a node (a
     * check asks Redis, in one round trip, whether the timers due in the
     * next 5 ms are still the node's; docs/guide/redis.md). 0 = 4. Each
     * round trip costs Redis more than the work of the keys it carries, so
     * a longer gap lowers Redis CPU per fired timer and lets callbacks
     * start up to this much later than due; the window in which a replace
     * or cancel does not stop a callback stays as it is. 0 .. 1000; more
     * is TW_EINVAL. Ignored by the journal. */
    uint32_t redis_check_gap_ms;

    /* Field below was added after 0.2.0 (NULL = no reports): called
     * during the open of a journal, on the opening thread, once for each
     * thing the replay ignored or dropped (a torn tail; with
     * TW_DURABLE_REPAIR, damaged records, a segment with a bad header, a
     * missing segment), then once for each record those bytes held; see
     * tw_durable_damage below. Redis: once for each key of the namespace
     * of the wrong type (TW_DURABLE_DAMAGE_REDIS_KEY; one TYPE a key at
     * open, only when this is set). Never called after the open returns,
     * or for a store without such things. */
    void (*on_damage)(void *arg, const tw_durable_damage *dmg);
    void *on_damage_arg; /* passed to on_damage */

    /* Field below was added after 0.2.0 (NULL = no reports; the count in
     * tw_durable_stats.errors is kept either way). Redis: called from the
     * store's own threads when the server answers the store's background
     * work (claims, claim checks, completions) with an error instead of
     * doing it, for example NOPERM after a permission was taken away from
     * the user since open, or a script error: @code is TW_EAUTH (NOPERM,
     * NOAUTH, WRONGPASS) or TW_EIO, @msg names the node, the work and
     * Redis's text ("redis 10.0.0.1:6379: CLAIM: ... NOPERM ..."; never a
     * password), valid during the call; also (TW_EIO) damage only a
     * claim can see: a key found in a shard it does not hash to, set
     * aside (docs/guide/redis.md). At most one call a second per
     * store; the work is tried again (every 100 ms or at the next claim
     * round) and resumes, nothing lost, once the server does it again.
     * The calls made by the caller report their own errors. It must not
     * call back into the store or block. Never called by the journal. */
    void (*on_error)(void *arg, int code, const char *msg);
    void *on_error_arg; /* passed to on_error */

    /* Fields below were added after 0.2.0 too (NULL = not this backend): the
     * PostgreSQL backend (docs/guide/postgres.md), built when libpq was
     * found. A libpq connection string ("host=... dbname=...") or URL
     * (postgresql://user@host:port/db?sslmode=...); a password belongs in
     * ~/.pgpass or PGPASSWORD rather than here. Set neither dir nor
     * redis with it. */
    const char *postgres;
    const char *postgres_namespace; /* the ns column, 1 to 64 bytes;
                                       NULL = "tw" */
} tw_durable_config;

/*
 * What a journal's replay ignored or dropped, as cfg.on_damage is told
 * (a struct added after 0.2.0). A report of one of the four kinds of
 * bytes comes first, then one TW_DURABLE_DAMAGE_RECORD report for each
 * record whose header could be read in those bytes, in file order.
 * The headers are read without their checksum (which failed, or whose
 * record was cut): the key and type are what the bytes say, and the
 * damage may lie in the key itself. Valid during the call only.
 */
struct tw_durable_damage {
    uint32_t kind;      /* TW_DURABLE_DAMAGE_* */
    uint32_t segment;   /* the segment's number (its file: %010u.twj) */
    uint64_t offset;    /* where the bytes begin in that file */
    uint64_t bytes;     /* how many: to the last non-zero byte for a torn
                           tail or a bad segment (the rest is the file's
                           preallocated zeros); 0 for a missing segment */
    uint64_t records;   /* of a range: the records whose headers could be
                           read, walking from @offset (the walk stops at
                           the first header that cannot be read, so there
                           may have been more); of a record: 1; of
                           missing segments: how many, from @segment on */
    const void *key;    /* a record's key as its bytes read, NULL when it
                           lies past the end of the bytes */
    size_t key_len;     /* bytes of key */
    const char *record; /* a record's type: "schedule", "cancel", "done",
                           "fire" or "dead"; NULL for a range */
    int64_t due_ms;     /* a schedule or dead record's due time, as its
                           bytes read, else 0 */
};
/* tw_durable_damage.kind */
#define TW_DURABLE_DAMAGE_TAIL                                                 \
    1u /* the newest segment's torn tail: records after its last good one      \
          (a write a crash cut, or damage no later record vouches for),        \
          ignored, and cut off unless TW_DURABLE_READONLY */
#define TW_DURABLE_DAMAGE_SKIPPED                                              \
    2u /* TW_DURABLE_REPAIR: damaged records in the middle, dropped */
#define TW_DURABLE_DAMAGE_SEGMENT                                              \
    3u /* TW_DURABLE_REPAIR: a segment with a bad header, dropped whole */
#define TW_DURABLE_DAMAGE_MISSING                                              \
    4u /* TW_DURABLE_REPAIR: segment files missing (.records of them from      \
          .segment on), passed over */
#define TW_DURABLE_DAMAGE_RECORD                                               \
    5u /* one record in the bytes of the report before */
#define TW_DURABLE_DAMAGE_REDIS_KEY                                            \
    6u /* Redis: a key of the namespace of the wrong type (.key its name,      \
          .segment its shard, .record the type it has: "string", "hash",       \
          "list", "set", "zset", "stream" or "other"); the scripts set it      \
          aside at their next write to the shard */

/* A store's counters, from tw_durable_stats_get(). */
typedef struct tw_durable_stats {
    uint64_t pending;       /* timers scheduled and not yet done */
    uint64_t fired;         /* callbacks that returned 0 or < 0 */
    uint64_t retried;       /* callbacks that asked for a retry (> 0 or
                               TW_DURABLE_FIRE_RETRY) */
    uint64_t cancelled;     /* successful cancels (one per key) */
    uint64_t journal_bytes; /* bytes of all segments on disk */
    uint64_t segments;      /* segment files on disk */
    uint64_t recovered;     /* pending timers found by the last open */
    uint64_t recovery_us;   /* how long that replay took */
    uint64_t syncs;         /* fdatasync calls made (journal) */
    /* Fields below were added in 0.2.0; see tw_durable_stats_get_sized(). */
    uint64_t backlog; /* due timers whose delivery has not started yet */
    uint64_t late_hist[TW_LATE_BUCKETS]; /* deliveries by how late they
                                            started after due_ms (wheel.h) */
    /* Fields below were added after 0.2.0. */
    uint64_t quarantined; /* Redis: entries set aside in the namespace's
                             quarantine hashes (values that could not be
                             read; docs/guide/redis.md); PostgreSQL: rows
                             of twheel.quarantine (docs/guide/postgres.md);
                             journal: 0 */
    uint64_t running;     /* callbacks of this handle running now */
    uint64_t late_sum_us; /* sum of the lateness late_hist counts, in us */
    uint64_t dead;        /* timers in the dead letters now */
    uint64_t errors;      /* Redis: error replies to the store's background
                             work (claims, claim checks, completions): a
                             permission taken away after open, a script
                             error (cfg.on_error tells them); journal: 0 */
} tw_durable_stats;

/* One timer of tw_durable_schedule_many() (or one key of
 * tw_durable_cancel_many(), which reads only key and key_len). */
typedef struct tw_durable_item {
    const void *key;     /* as tw_durable_schedule()'s arguments */
    size_t key_len;      /* bytes of key */
    int64_t due_ms;      /* Unix time in ms */
    const void *payload; /* may be NULL when payload_len is 0 */
    size_t payload_len;  /* bytes of payload */
    int result; /* out: what tw_durable_schedule() would have returned */
} tw_durable_item;

/*
 * tw_durable_open - open (or create) a store and start firing its timers.
 * Every pending timer is back in the wheel before it returns; those whose
 * due time passed while no process had the store open fire at once, in due
 * order. Returns 0 or, with a message in cfg->errbuf saying why:
 * TW_EINVAL (bad @cfg, naming the field; nothing written; both @dir and
 * @redis set is TW_EINVAL too); TW_EBUSY (the directory is open in another
 * process or handle: the directory itself is locked, so deleting its LOCK
 * file does not let a second process in); TW_EIO (corruption in the
 * middle of the journal, unless TW_DURABLE_REPAIR, or a segment missing,
 * the oldest included, or another I/O error; for Redis, an error reply
 * other than the ones below); TW_ENOTDIR (@dir or one of its parents is a
 * file); TW_EACCES (permission denied); TW_EROFS (read-only file system);
 * TW_ENOSPC; TW_ECONN (Redis unreachable, or its TLS refused); TW_EAUTH
 * (Redis refused the password, the user, or a command or key the store
 * needs); TW_ENOMEM. On failure *@out is unchanged; for Redis the message
 * names the node and carries Redis's own error text, never a password.
 */
TW_EXTERN int tw_durable_open(tw_durable **out, const tw_durable_config *cfg);

/*
 * tw_durable_open_sized - tw_durable_open() for a config struct of
 * @cfg_size bytes; the plain name is a macro passing
 * sizeof(tw_durable_config), so a program built against an older header
 * (a shorter struct) works with a newer library: fields past @cfg_size
 * count as zero, their default. Bytes past the struct this library knows
 * must be zero, else TW_EINVAL.
 */
TW_EXTERN int tw_durable_open_sized(tw_durable **out,
                                    const tw_durable_config *cfg,
                                    size_t cfg_size);
/* tw_durable_open() as a call of the sized form with this header's size. */
#define tw_durable_open(out, cfg)                                              \
    tw_durable_open_sized((out), (cfg), sizeof(tw_durable_config))

/*
 * tw_durable_schedule - make @key fire at @due_ms with @payload. An existing
 * @key is replaced (new due time and payload). With SYNC_GROUP or SYNC_EACH
 * it returns 0 only once the change is on stable storage. Returns 0,
 * TW_EINVAL (NULL or oversized key or payload; nothing written), TW_EIO,
 * TW_ENOSPC, TW_ECONN, TW_ENOMEM or TW_ESHUTDOWN (closing).
 */
TW_EXTERN int tw_durable_schedule(tw_durable *d, const void *key,
                                  size_t key_len, int64_t due_ms,
                                  const void *payload, size_t payload_len);

/*
 * tw_durable_cancel - make @key never fire (again). Returns 0 once that is
 * durable; TW_ENOENT if @key is not pending (never scheduled, or done);
 * TW_EINVAL, TW_EIO, TW_ENOSPC, TW_ECONN or TW_ESHUTDOWN. Once it has
 * returned 0, no delivery of @key whose callback had not started will
 * start (journal: even one already due and queued behind other
 * callbacks). A delivery whose callback is already running is not
 * stopped: the call still returns 0 and the key is not delivered again.
 * The same holds for the old version after a tw_durable_schedule() that
 * replaces @key.
 *
 * Disk errors (journal): TW_EIO or TW_ENOSPC from a write means nothing
 * changed; from a failed fdatasync the change stays in memory and may or
 * may not survive a crash (as after a timeout).
 */
TW_EXTERN int tw_durable_cancel(tw_durable *d, const void *key, size_t key_len);

/*
 * tw_durable_close - stop firing, wait for running callbacks, make every
 * acknowledged change durable and free @d. Pending timers stay in the store
 * for the next open. Returns 0 or the first error met while flushing (the
 * handle is freed either way). NULL is accepted. From inside a callback of
 * @d: TW_EDEADLK, nothing done (@d stays open).
 */
TW_EXTERN int tw_durable_close(tw_durable *d);

/*
 * tw_durable_schedule_many - tw_durable_schedule() of @n items in one call,
 * sharing the store's round trips: one journal write per 64 items and one
 * fdatasync, or one pipelined Redis round trip per node. Each item's
 * outcome is in its @result; items are applied in order (a key given twice
 * ends with its last item), and the call is not atomic: a crash may keep
 * some items and not others, but every item whose @result is 0 is durable
 * when the call returns. Returns 0 if every item succeeded, else the first
 * item's error; TW_EINVAL (and nothing written) if @d or @items is NULL
 * with @n > 0.
 */
TW_EXTERN int tw_durable_schedule_many(tw_durable *d, tw_durable_item *items,
                                       size_t n);

/*
 * tw_durable_cancel_many - tw_durable_cancel() of @n keys in one call: only
 * each item's @key and @key_len are read, its outcome goes to @result (0,
 * TW_ENOENT, TW_EINVAL, ...). The journal writes the cancels of 64 items
 * with one write and makes them durable with one fdatasync; the Redis
 * backend sends them in one pipelined round trip per node. Items are
 * applied in order (a key given twice is TW_ENOENT the second time); not
 * atomic, as for tw_durable_schedule_many(). Returns 0 if every item
 * succeeded, else the first item's error; TW_EINVAL if @d or @items is
 * NULL with @n > 0.
 */
TW_EXTERN int tw_durable_cancel_many(tw_durable *d, tw_durable_item *items,
                                     size_t n);

/*
 * Conditional writes (fencing)
 * ----------------------------
 * A writer that may have been paused (SIGSTOP, a long GC, a partition)
 * while another took its work over must not write back a record it read
 * before the pause: that would undo the other's rewrite, or bring back a
 * timer the other deleted. The _if calls apply only when the key's stored
 * record is still the one the writer last saw: the caller puts a write
 * token at the start of each payload it writes (unique per write, never
 * reused: then the check is a version check without ABA) and passes the
 * token it last wrote or read as @expect.
 *
 * The condition, checked atomically with the write (journal: under the
 * store's lock, the record read back from disk; Redis: inside the one
 * script that writes):
 *   - @expect non-NULL: @key is pending and its stored payload begins
 *     with the @expect_len bytes at @expect (@expect_len 0: any pending
 *     version). A key that is not pending (never scheduled, cancelled,
 *     completed, or a dead letter) is TW_ENOENT; a pending key whose
 *     payload does not begin so (a shorter payload included) TW_ESTALE.
 *   - @expect NULL (@expect_len must be 0; schedules only): @key is not
 *     pending (create only if absent; a dead letter counts as absent and
 *     is replaced, as tw_durable_schedule() replaces it); else TW_ESTALE.
 * When the condition fails nothing is written or changed.
 * On Redis a failover that loses acknowledged writes (replication is
 * asynchronous; cfg.wait_replicas narrows the window) can lose the
 * version a writer last saw, as it can lose any write.
 *
 * "Pending" includes a timer whose delivery is under way (due, claimed,
 * its callback running): the condition compares with its stored payload
 * as for any other, and a write that applies replaces (or cancels) it as
 * tw_durable_schedule() (tw_durable_cancel()) would: the running callback
 * finishes, and its result (done, retry) is not recorded, so it never
 * erases or overwrites the new version. Once a delivery has completed
 * the key is not pending (TW_ENOENT); on Redis a completion reaches the
 * store up to 500 ms after its callback returned, and until then the key
 * still counts as pending (as for tw_durable_cancel()).
 */

/* One item of tw_durable_schedule_many_if() (or of
 * tw_durable_cancel_many_if(), which reads key, expect and their
 * lengths only). */
typedef struct tw_durable_item_if {
    const void *key;     /* as tw_durable_schedule()'s arguments */
    size_t key_len;      /* bytes of key */
    int64_t due_ms;      /* Unix time in ms */
    const void *payload; /* may be NULL when payload_len is 0 */
    size_t payload_len;  /* bytes of payload */
    const void *expect;  /* the stored payload's expected first bytes, or
                            NULL: the key must not be pending */
    size_t expect_len;   /* bytes at expect; 0 when expect is NULL */
    int result; /* out: what tw_durable_schedule_if() would have returned */
} tw_durable_item_if;

/*
 * tw_durable_schedule_if - tw_durable_schedule() of @key if the condition
 * of @expect holds (above): @expect non-NULL, @key is pending and its
 * payload begins with the @expect_len bytes at @expect; @expect NULL (and
 * @expect_len 0), @key is not pending.
 * Returns 0 once the new version is durable (as tw_durable_schedule());
 * TW_ESTALE (the stored record is another version, or with @expect NULL
 * the key is pending) or TW_ENOENT (@expect non-NULL and @key not
 * pending), nothing changed; TW_EINVAL (arguments as for
 * tw_durable_schedule(), or NULL @expect with @expect_len > 0, or
 * @expect_len > TW_DURABLE_PAYLOAD_MAX; nothing written); TW_EIO (journal:
 * also when the stored record could not be read back to compare),
 * TW_ENOSPC, TW_ECONN, TW_ENOMEM, TW_EROFS, TW_ESHUTDOWN.
 * Cost: journal: one read of the key's current record under the store's
 * lock (as tw_durable_get()) on top of a schedule; calls of several
 * threads are combined and share fdatasyncs as schedules are. Redis: one
 * script call, as a schedule.
 * Context: any thread, callbacks included.
 */
TW_EXTERN int tw_durable_schedule_if(tw_durable *d, const void *key,
                                     size_t key_len, const void *expect,
                                     size_t expect_len, int64_t due_ms,
                                     const void *payload, size_t payload_len);

/*
 * tw_durable_cancel_if - tw_durable_cancel() of @key if it is pending and
 * its stored payload begins with the @expect_len bytes at @expect
 * (@expect_len 0: any pending version, as tw_durable_cancel()).
 * Returns 0 once the cancel is durable; TW_ENOENT (@key not pending) or
 * TW_ESTALE (another version), nothing changed; TW_EINVAL (bad key, NULL
 * @expect: there is no "cancel if absent"); TW_EIO, TW_ENOSPC, TW_ECONN,
 * TW_ENOMEM, TW_EROFS, TW_ESHUTDOWN. What a cancel that applies stops is
 * as for tw_durable_cancel().
 * Context: any thread, callbacks included.
 */
TW_EXTERN int tw_durable_cancel_if(tw_durable *d, const void *key,
                                   size_t key_len, const void *expect,
                                   size_t expect_len);

/*
 * tw_durable_schedule_many_if - tw_durable_schedule_if() of @n items in
 * one call, with the round trips of tw_durable_schedule_many(). Items are
 * applied in order, each condition checked against the store as the items
 * before it left it: an item may expect the token an earlier item of the
 * same call wrote, and two items that expect the same version cannot both
 * apply (the second gets TW_ESTALE). Each item's outcome is in its
 * @result; not atomic as a whole (a crash may keep some applied items and
 * not others; every item whose @result is 0 is durable when the call
 * returns). Returns 0 if every item applied, else the first item's error;
 * TW_EINVAL if @d or @items is NULL with @n > 0.
 * Context: any thread, callbacks included.
 */
TW_EXTERN int tw_durable_schedule_many_if(tw_durable *d,
                                          tw_durable_item_if *items, size_t n);

/*
 * tw_durable_cancel_many_if - tw_durable_cancel_if() of @n items in one
 * call: only each item's key, expect and their lengths are read, the
 * outcome goes to @result. In order (a key given twice is TW_ENOENT the
 * second time), not atomic, returns as tw_durable_schedule_many_if().
 * Context: any thread, callbacks included.
 */
TW_EXTERN int tw_durable_cancel_many_if(tw_durable *d,
                                        tw_durable_item_if *items, size_t n);

/*
 * tw_durable_stats_get_sized - a snapshot of the counters into @out, a
 * struct of @out_size bytes: a caller built against an older header, with
 * a shorter struct, gets its fields and nothing past them. The plain name
 * is a macro passing sizeof(tw_durable_stats). 0 or TW_EINVAL; on Redis
 * also the error of its reads: TW_ECONN..., or TW_EAUTH when the user may
 * no longer run one of them (counted in errors: never a 0 read as a count).
 */
TW_EXTERN int tw_durable_stats_get_sized(tw_durable *d, tw_durable_stats *out,
                                         size_t out_size);
/* tw_durable_stats_get - tw_durable_stats_get_sized() for this header's
 * struct (the plain name is the macro below). */
TW_EXTERN int tw_durable_stats_get(tw_durable *d, tw_durable_stats *out);
/* tw_durable_stats_get() as a call of the sized form with this header's
 * size. */
#define tw_durable_stats_get(d, out)                                           \
    tw_durable_stats_get_sized((d), (out), sizeof(tw_durable_stats))

/*
 * Look-up and listing
 * -------------------
 * A timer's state, as tw_durable_get() and tw_durable_list() report it.
 * The store holds a key from its schedule until its delivery completes
 * (the callback returned 0 or < 0) or it is cancelled; in between it is
 * WAITING (its due time has not come by the store's wall clock) or DUE
 * (its due time has come: its delivery is queued, claimed by a node or
 * its callback is running). A timer whose callback asked for a retry is
 * WAITING again, with its new due time.
 */
#define TW_DURABLE_WAITING 1u /* its due time has not come */
#define TW_DURABLE_DUE 2u     /* due: queued, claimed or running */
#define TW_DURABLE_DEAD 3u    /* a dead letter (tw_durable_get() only) */

/* What tw_durable_get() tells of one timer. */
typedef struct tw_durable_info {
    int64_t due_ms;       /* its due time (Unix ms), as scheduled or retried */
    uint32_t attempt;     /* the attempt its next delivery shows (1 for a
                             timer never delivered); for a DUE timer it may
                             already be the delivery under way; for a DEAD
                             one, the attempts it had */
    uint32_t state;       /* TW_DURABLE_WAITING, _DUE or _DEAD */
    size_t payload_len;   /* the payload's full length, even when it did not
                             fit the caller's buffer */
    uint64_t reserved[2]; /* zero */
} tw_durable_info;

/*
 * tw_durable_get - look up @key: whether the store holds it, its due time,
 * attempt and state into *@info, and its payload into @buf.
 * @buf: up to @buf_len bytes of the payload are copied there (NULL with
 * @buf_len 0 asks for the info alone); info->payload_len is the full
 * length, so a caller whose buffer was short calls again with one of that
 * size (the payload may have changed in between: compare again). Nothing
 * is allocated for the caller.
 * A dead letter is found too (state TW_DURABLE_DEAD, due_ms the due time
 * of its last delivery).
 * Returns 0; TW_ENOENT when the store does not hold @key (never scheduled,
 * cancelled, or delivered and completed); TW_EINVAL (NULL @d or @info, bad
 * key, NULL @buf with @buf_len > 0); TW_ESHUTDOWN (closing); TW_EIO (the
 * journal's record could not be read back); TW_ECONN; TW_ENOMEM.
 * Journal: one read of the timer's record, under the store's lock. Redis:
 * one atomic script on the key's shard (one round trip).
 * Context: any thread, callbacks included.
 */
TW_EXTERN int tw_durable_get(tw_durable *d, const void *key, size_t key_len,
                             tw_durable_info *info, void *buf, size_t buf_len);

/*
 * Where a listing stands: plain data, so it can be kept, copied or written
 * to a file and used again with the same store after a reopen (or from
 * another process of a Redis namespace). Start with TW_DURABLE_CURSOR_INIT
 * (all zero). It holds the (due time, key) of the last entry returned;
 * the next call returns what comes after it.
 */
typedef struct tw_durable_cursor {
    int64_t due_ms;   /* of the last entry returned */
    uint32_t key_len; /* 0: nothing returned yet (start at from_ms) */
    uint32_t done;    /* set once a call reached the end of its range */
    unsigned char key[TW_DURABLE_KEY_MAX]; /* of the last entry returned */
} tw_durable_cursor;
/* A cursor at the start of a listing (all zero). */
#define TW_DURABLE_CURSOR_INIT                                                 \
    {                                                                          \
        0, 0, 0,                                                               \
        {                                                                      \
            0                                                                  \
        }                                                                      \
    }

/* One timer of a listing. */
typedef struct tw_durable_entry {
    const void *key;   /* into the caller's key buffer */
    size_t key_len;    /* bytes of key */
    int64_t due_ms;    /* the time the store will deliver it at (Unix ms; a
                          due time before 1970 lists as 0) */
    uint32_t state;    /* TW_DURABLE_WAITING or TW_DURABLE_DUE */
    uint32_t reserved; /* zero */
} tw_durable_entry;

/*
 * tw_durable_list - the next timers the store holds with a due time in
 * [@from_ms, @to_ms), in order of (due time, key bytes), after *@cur
 * (@to_ms INT64_MAX: no upper end; a due time of INT64_MAX is listed).
 * @cur: where the previous call stopped (TW_DURABLE_CURSOR_INIT to start);
 * advanced past the entries returned, and cur->done set when the range has
 * no more. @out: room for @max entries; their keys are copied into @keybuf
 * (@keybuf_len bytes; the call stops early rather than split a key, and
 * @keybuf_len >= TW_DURABLE_KEY_MAX always fits one).
 * Returns the number of entries written (0 .. @max; 0 with cur->done at
 * the end), or TW_EINVAL (NULL argument, @max 0, @keybuf_len too short
 * for the next key), TW_ESHUTDOWN, TW_ECONN or TW_ENOMEM, with *@cur
 * unchanged.
 *
 * What an iteration sees. Each call is one snapshot (journal: under the
 * store's lock; Redis: one atomic script per shard, the shards read one
 * after the other in one pipelined round trip). Across calls the cursor is
 * a position, not a snapshot: entries come in strictly increasing (due,
 * key) order, so a key is never returned twice at the same due time. A
 * timer that stays in the range at a (due, key) after the cursor is
 * returned exactly once; one scheduled (or moved) to a place the cursor
 * has passed is not; one moved ahead of the cursor is returned again at
 * its new place; one cancelled or completed before the cursor reaches it
 * is not returned.
 *
 * Cost. Journal: O(log n + @max) under the store's lock, after a first
 * call that builds an ordered index of the pending timers (O(n log n),
 * about 24 bytes a timer, kept up to date from then on at O(log n) per
 * change). Redis: one read-only script per shard, each O(log^2 n + @max +
 * c) where c is the shard's claimed timers (due within cfg.horizon_ms or
 * running), of which at most 10,000 per shard are read; no KEYS or SCAN.
 * Context: any thread, callbacks included.
 */
TW_EXTERN int tw_durable_list(tw_durable *d, int64_t from_ms, int64_t to_ms,
                              tw_durable_cursor *cur, tw_durable_entry *out,
                              size_t max, void *keybuf, size_t keybuf_len);

/* One timer as tw_durable_scan() hands it over: valid during the call. */
typedef struct tw_durable_scanned {
    const void *key;     /* key_len bytes */
    size_t key_len;      /* bytes of key */
    const void *payload; /* payload_len bytes */
    size_t payload_len;  /* bytes of payload */
    int64_t due_ms;      /* its due time (Unix ms), as scheduled or retried */
    uint32_t attempt;    /* as tw_durable_get() reports it */
    uint32_t state;      /* TW_DURABLE_WAITING, _DUE or _DEAD */
} tw_durable_scanned;

/* Called by tw_durable_scan() for each timer: return 0 to go on, anything
 * else to stop the scan. */
typedef int (*tw_durable_scan_fn)(void *arg, const tw_durable_scanned *t);

/*
 * tw_durable_scan - hand every timer the store holds, with its payload,
 * to @fn, in no particular order: what a program does at start-up to read
 * its state back (tw_durable_list() plus one tw_durable_get() a key does
 * the same in due order, at many times the cost). Dead letters are handed
 * over too, with state TW_DURABLE_DEAD and the attempts they had, as
 * tw_durable_get() reports them.
 * @fn runs on the calling thread without any lock of the store held, so
 * it may call the store (schedule, cancel, get...).
 * Returns the number of timers handed to @fn; when @fn returns non-zero
 * the scan stops and returns that value if it is negative, else the count
 * so far (the stopping timer included). Errors: TW_EINVAL (NULL @d or
 * @fn), TW_ESHUTDOWN, TW_EIO (a journal record could not be read back),
 * TW_ECONN, TW_ENOMEM; @fn may have been called before an error.
 *
 * What a scan sees. A timer the store holds, unchanged, from the start of
 * the call to its end is handed over exactly once (journal) or at least
 * once (Redis: HSCAN may repeat an entry while its hash is resized).
 * One scheduled, replaced, retried, cancelled or completed during the call
 * is handed over at most once (journal: its version before the change, if
 * the scan read it first) or, on Redis, as HSCAN finds it.
 *
 * Cost. Journal: one sequential read of the journal's segments in 1 MiB
 * blocks, without the store's lock; the lock is taken once a block, to
 * see which of its records are the keys' current versions (one hash
 * look-up a record); compaction waits while a scan runs. Memory: one
 * block. Redis: HSCAN of each shard's payload hash, 1,000 entries a
 * round trip.
 * Context: any thread, callbacks included.
 */
TW_EXTERN long tw_durable_scan(tw_durable *d, tw_durable_scan_fn fn, void *arg);

/*
 * Retry policy and dead letters
 * -----------------------------
 * A timer is delivered until its callback completes it, or until the
 * retry policy of cfg (max_attempts, retry_ms, retry_max_ms,
 * retry_jitter_pct) gives up: then it becomes a dead letter. So does a
 * timer whose callback returns TW_DURABLE_FIRE_DEAD. A dead letter keeps
 * its key, payload, the due time of its last delivery and its attempts;
 * it is never delivered, is durable as a pending timer is (it survives
 * close, reopen and kill -9), is counted in stats.dead, found by
 * tw_durable_get() (state TW_DURABLE_DEAD) and listed by
 * tw_durable_list_dead(), until tw_durable_rearm() makes it pending again
 * or tw_durable_dead_delete() drops it. tw_durable_schedule() of its key
 * replaces it as it replaces a pending timer; tw_durable_cancel() of it is
 * TW_ENOENT (it is not pending) and leaves it.
 *
 * Dead letters have their own listing call rather than a state filter on
 * tw_durable_list(): that one walks due times in a range, and a dead
 * letter has no due time to wait for; dead letters are listed in key
 * order, and tw_durable_list() keeps its signature and cost.
 */

/*
 * tw_durable_rearm - make dead letter @key pending again at @due_ms with
 * its payload; its next delivery is attempt 1 (the policy starts over).
 * Returns 0 once that is durable; TW_ENOENT if @key is not a dead letter
 * (pending, never scheduled, done); TW_EINVAL (NULL @d, bad key);
 * TW_EROFS (a read-only store); TW_ESHUTDOWN; TW_EIO (the journal's record
 * could not be read back; Redis: its value could not be read and was set
 * aside into quarantine); TW_ENOSPC; TW_ECONN; TW_ENOMEM.
 * Context: any thread, callbacks included.
 */
TW_EXTERN int tw_durable_rearm(tw_durable *d, const void *key, size_t key_len,
                               int64_t due_ms);

/*
 * tw_durable_dead_delete - drop dead letter @key for good. Returns 0 once
 * that is durable; TW_ENOENT if @key is not a dead letter; TW_EINVAL,
 * TW_EROFS, TW_ESHUTDOWN, TW_EIO, TW_ENOSPC, TW_ECONN as above.
 * Context: any thread, callbacks included.
 */
TW_EXTERN int tw_durable_dead_delete(tw_durable *d, const void *key,
                                     size_t key_len);

/*
 * tw_durable_restore - put back one timer as tw_durable_scan() handed it
 * over: what an import of an export, or a move from one store to another,
 * needs (a function added after 0.2.0). @t's key, payload and due time;
 * its state: TW_DURABLE_DEAD makes it a dead letter that had @t->attempt
 * attempts, any other state a pending timer whose next delivery is
 * attempt @t->attempt (0 counts as 1). It never replaces: a key the store
 * holds, pending or dead, is TW_EEXIST and nothing changes (cancel or
 * delete it first). Unlike tw_durable_schedule() it works through a
 * TW_DURABLE_NOFIRE handle on both backends: on Redis the timer is
 * written unclaimed, and a node claims it as any other.
 * Returns 0 once that is durable; TW_EEXIST; TW_EINVAL (NULL @d or @t,
 * bad key, payload too long); TW_EROFS (a read-only store); TW_ESHUTDOWN;
 * TW_EIO; TW_ENOSPC; TW_ECONN; TW_ENOMEM.
 * Context: any thread, callbacks included.
 */
TW_EXTERN int tw_durable_restore(tw_durable *d, const tw_durable_scanned *t);

/*
 * tw_durable_list_dead - the next dead letters after *@cur, in order of
 * their key bytes (cur->due_ms is not used; a cursor of tw_durable_list()
 * must not be passed here). Arguments, return value and what an iteration
 * sees as for tw_durable_list(), with each entry's state TW_DURABLE_DEAD
 * and due_ms the due time of its last delivery (0 on Redis when its value
 * cannot be read). Cost: journal: O(log n + @max) under the store's lock
 * after a first call that orders the dead letters (O(n log n) over the
 * pending and dead timers); Redis: one read-only script per shard, each
 * O(log n + @max). Context: any thread, callbacks included.
 */
TW_EXTERN int tw_durable_list_dead(tw_durable *d, tw_durable_cursor *cur,
                                   tw_durable_entry *out, size_t max,
                                   void *keybuf, size_t keybuf_len);

/*
 * tw_durable_touch - tell the store that the callback delivering @key is
 * still at work. Redis: called from that callback, it renews the claim's
 * lease for cfg.lease_ms from now (as beanstalkd's touch or a BullMQ lock
 * renewal), so a callback that runs longer than lease_ms and touches at
 * least once per lease_ms is not delivered again by another node; one
 * that does not touch is (at least once). Journal: there is no lease (a
 * delivery ends only with its callback or its process); the call reports
 * whether a delivery of @key is under way.
 * Returns 0 (lease renewed; journal: a delivery of @key has begun and not
 * completed); TW_ENOENT (Redis: not called from the callback of @key, or
 * the claim is not this node's any more, so another delivery may start:
 * finish soon; journal: no delivery of @key under way); TW_EINVAL;
 * TW_EROFS; TW_ESHUTDOWN; TW_ECONN. Context: Redis: the callback of @key;
 * journal: any thread.
 */
TW_EXTERN int tw_durable_touch(tw_durable *d, const void *key, size_t key_len);

/*
 * Metrics
 * -------
 * The counters of tw_durable_stats_get() as text a Prometheus server (or
 * any OpenMetrics scraper) reads from an HTTP endpoint such as /metrics:
 * twheel_durable_pending, _backlog, _running (gauges), _fired_total,
 * _dead (gauge: dead letters), _retried_total, _cancelled_total,
 * _syncs_total (counters),
 * _journal_bytes, _segments, _recovered, _recovery_seconds (gauges) and
 * the histogram twheel_durable_lateness_seconds (how late deliveries
 * started; bucket le="x" counts those at most x late, in whole us).
 */
/* Flags of tw_durable_metrics(). Default: the Prometheus text format
 * 0.0.4 (Content-Type: text/plain; version=0.0.4). */
#define TW_DURABLE_METRICS_OPENMETRICS                                         \
    1u /* OpenMetrics 1.0 text, ending "# EOF" (Content-Type:                  \
          application/openmetrics-text; version=1.0.0) */

/*
 * tw_durable_metrics - the store's metrics as text into @buf, like
 * snprintf(): at most @len bytes, NUL-ended when @len > 0.
 * @labels: NULL, or labels added to every sample, as the text between the
 * braces of the exposition format (for example `store="orders"`): names
 * [a-zA-Z_][a-zA-Z0-9_]*, values in double quotes with \\, \" and \n
 * escapes; anything else is TW_EINVAL.
 * @flags: 0 or TW_DURABLE_METRICS_OPENMETRICS.
 * Returns the length of the whole text (without its NUL): if it is >=
 * @len the text was cut, and a buffer of the returned length + 1 holds it.
 * Or a negative error: TW_EINVAL, TW_ESHUTDOWN, or what
 * tw_durable_stats_get() returns (TW_ECONN, TW_ENOMEM). Nothing is
 * allocated for the caller. Context: any thread, callbacks included.
 */
TW_EXTERN long tw_durable_metrics(tw_durable *d, const char *labels,
                                  unsigned flags, char *buf, size_t len);

/*
 * tw_durable_metrics_fprint - tw_durable_metrics() written to @f.
 * Returns 0, TW_EIO (a write to @f failed), or an error as above.
 * Context: any thread, callbacks included.
 */
TW_EXTERN int tw_durable_metrics_fprint(tw_durable *d, const char *labels,
                                        unsigned flags, FILE *f);

#ifdef __cplusplus
}
#endif
#endif /* TWHEEL_DURABLE_H */
