/* SPDX-License-Identifier: MIT */
/*
 * src/durable_pg.h - what the files of the PostgreSQL backend share: the
 * handle (struct pgd), a claimed delivery (struct pgjob), a statement's
 * parameters (struct pgp), and the functions one file calls in another.
 *
 * Files, one concern each:
 *   src/durable_pg.c         open, close, schedule and cancel (plain and
 *                            conditional), restore, stats, the ops table
 *   src/durable_pg_conn.c    connections: the pool, parameters, results,
 *                            SQLSTATE to TW_E* codes
 *   src/durable_pg_schema.c  the schema "twheel" (tables, SQL functions):
 *                            installed and versioned at open, privileges
 *   src/durable_pg_fire.c    the firer thread: LISTEN, claim due rows,
 *                            deliver through the shared executor, complete
 *   src/durable_pg_batch.c   done and retry completions, many a statement
 *   src/durable_pg_query.c   get, list, scan, dead letters, touch
 *   src/durable_pg_many.c    schedule_many: a batch in one statement
 *
 * Versions. Every row of twheel.timers has a version (ver, from the
 * sequence twheel.ver_seq) that every write of the row renews: a
 * schedule, a replace, a claim. A completion (done, retry, dead letter) is
 * a write conditional on the version its claim got, so a node never
 * erases what another client or node wrote after its claim. Local rule: a
 * cancel or replace through this handle that returned stops every
 * delivery of the key this handle claimed before it and whose callback
 * has not started: the change's own write returns a version C (taken
 * after the write locked the row), and deliveries of the key with a
 * version below C are marked stale (d->jobs), including those of a claim
 * round still on the wire (d->raced, kept while d->claiming).
 *
 * Locks: d->mu guards the jobs list, the raced list, the counters and
 * d->hint; the pool's mutex is taken with d->mu not held; the executor is
 * called with neither held.
 */
#ifndef TWHEEL_DURABLE_PG_H
#define TWHEEL_DURABLE_PG_H

#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "durable_backend.h"
#include "durable_exec.h"

#define PG_POOL 4        /* connections for the calls of any thread */
#define PG_PARAMS 8      /* most parameters of a statement */
#define PG_BATCH 256     /* most rows one claim takes */
#define PG_SCHEMA_V 1    /* the schema version this library installs */
#define PG_NS_MAX 64     /* bytes of a namespace (postgres_namespace) */
#define PG_SWEEP_MS 5000 /* hostile rows set aside at most this often */
#define PG_STMT_MS 5000  /* statement_timeout unless the session has one */
#define PG_SLACK_MS                                                            \
    2000 /* a call's bound: statement_timeout plus this (the server's own      \
            timeout and its answer); no answer by then: TW_ECONN */
#define PG_REFRESH_MS                                                          \
    1000 /* the firer asks for the next due row at least                       \
            this often (expired leases, lost NOTIFYs) */
/* Claim rounds that took rows start at least this many ms apart (a round
 * that took PG_BATCH rows: the next at once): under load a round takes
 * what became due meanwhile, one statement and one commit for many
 * timers, rather than one round a millisecond; a timer may be this much
 * later than it would have been. */
#ifndef PG_CLAIM_GAP_MS
#define PG_CLAIM_GAP_MS 2
#endif
#if PG_CLAIM_GAP_MS < 0 || PG_CLAIM_GAP_MS > 100
#error "PG_CLAIM_GAP_MS: 0 to 100 ms"
#endif
/* Completions wait up to this many ms for others to share their
 * statement (src/durable_pg_batch.c): the server's cost is per
 * statement much more than per row. */
#ifndef PG_FIN_GATHER_MS
#define PG_FIN_GATHER_MS 20
#endif
/* A write of a timer due within this many ms of the database's clock
 * NOTIFYs the nodes; a later one is found by their poll (PG_REFRESH_MS),
 * with PG_NOTIFY_MS - PG_REFRESH_MS to spare for the poll and clocks. */
#define PG_NOTIFY_MS 2000

/* A statement's parameters, all sent in binary. */
struct pgp {
    int n;
    const char *v[PG_PARAMS];
    int len[PG_PARAMS];
    int fmt[PG_PARAMS];
    unsigned int type[PG_PARAMS];
    unsigned char num[PG_PARAMS][8];
};

/* One claimed delivery: key bytes, then payload bytes. */
struct pgjob {
    struct tw__durable_job job;
    struct pgjob *next, *prev; /* d->jobs */
    struct pgd *d;
    int64_t due_ms;
    int64_t ver;         /* the claim's version: completions fenced */
    uint64_t claimed_ms; /* real monotonic ms at the claim */
    uint32_t attempt;    /* the delivery's attempt (claims so far) */
    bool stale;          /* a local cancel or replace came after it */
    bool started;        /* its callback began */
    /* A completion that did not get in (the row locked by another
     * transaction, the database away): kept, tried again by the executor
     * when the firer hands it over at fin_at (src/durable_pg_fire.c). */
    int8_t fin;         /* FIN_* of src/durable_pg_fire.c, FIN_NONE: none */
    bool fin_queued;    /* handed to the executor for its next try */
    bool fin_started;   /* the callback ran (the counters' end) */
    int fin_res;        /* the callback's result */
    int32_t fin_arg;    /* dead letter: whether the callback never ran */
    int64_t fin_due;    /* retry: the new due time */
    uint64_t fin_at;    /* real monotonic ms of its next try */
    uint64_t fin_since; /* real monotonic ms of its first failure */
    uint32_t fin_tries;
    size_t key_len, payload_len;
    unsigned char data[];
};

/* A local change of a key while a claim round is on the wire. */
struct pgrace {
    unsigned char *key;
    size_t key_len;
    int64_t ver;
};

/* A completion queued for the batch thread (src/durable_pg_batch.c). */
struct pgfin {
    struct pgjob *j;
    int next;    /* tw__retry_next(): 0 done, > 0 retry */
    int res;     /* the callback's result */
    int64_t due; /* retry: the new due time */
};

struct pgbatch {
    pthread_mutex_t mu;
    pthread_cond_t cv; /* CLOCK_MONOTONIC */
    struct pgfin *q;
    size_t n, cap;
    uint64_t first_at; /* mono ms the oldest queued completion came */
    pthread_t thr;
    bool inited, on, stop;
};

struct pgpool {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    PGconn *c[PG_POOL];
    bool busy[PG_POOL];
    unsigned prep[PG_POOL]; /* the PG_PREP_* prepared on c[i] (its holder's) */
};

/* Statements prepared once a session (tw__pg_exec_prep()), by number. */
enum { PG_PREP_CLAIM, PG_PREP_NEXT, PG_PREP_BATCH };

struct pgd {
    struct tw_durable base;
    char *conninfo;
    char *ns;
    atomic_int call_ms; /* a call's bound (tw__pg_connect()), stored by
                           every connect (the same value each time) */
    struct pgpool pool;
    tw_durable_fire_fn fire;
    void *fire_arg;
    int64_t (*wall_ms)(void *);
    void *clock_arg;
    bool injected; /* cfg.wall_ms given: poll the clock often */
    bool nofire;
    struct tw__retry retry;
    uint32_t lease_ms;
    char node[96]; /* this handle's name in the owner column */
    struct tw__durable_exec exec;
    uint32_t nexec;
    pthread_mutex_t mu;
    struct tw__durable_counts counts;
    uint64_t cancelled, recovered, recovery_us;
    struct pgjob *jobs; /* claimed, not completed */
    size_t njobs;
    bool claiming;
    struct pgrace *raced;
    size_t nraced, cap_raced;
    int64_t raced_lost;  /* a change not recorded (no memory): every claim
                            of the round below this version is stale */
    int64_t hint;        /* a due time the firer should look at, or INT64_MAX */
    size_t fin_waiting;  /* jobs whose completion waits for another try */
    PGconn *lc;          /* the firer's own connection (LISTEN, claims) */
    unsigned lc_prep;    /* the PG_PREP_* prepared on lc */
    uint64_t claim_gate; /* mono ms before which no claim round starts */
    uint64_t sweep_at;   /* the firer's next sweep (mono ms) */
    pthread_t thr;
    bool thr_on;
    atomic_bool stop;
    int evfd; /* wakes the firer */
    /* Completions in batches (src/durable_pg_batch.c). */
    struct pgbatch batch;
};

/* Parameters (src/durable_pg_conn.c). */
void tw__pg_p_init(struct pgp *p);
void tw__pg_p_bytes(struct pgp *p, const void *b, size_t n); /* bytea */
void tw__pg_p_null(struct pgp *p);                           /* NULL */
void tw__pg_p_text(struct pgp *p, const char *s);            /* text */
void tw__pg_p_i64(struct pgp *p, int64_t v);                 /* bigint */
void tw__pg_p_i32(struct pgp *p, int32_t v);                 /* integer */
/* @d's namespace then @key: the first two parameters of most statements. */
void tw__pg_p_nskey(struct pgp *p, const struct pgd *d, const void *key,
                    size_t key_len);

/* A new connection to @conninfo (nonblocking, statement_timeout set),
 * with the bound of a call on it in *@call_ms; or NULL with a TW_E* code
 * in *@code (if not NULL) and a message in @err. */
PGconn *tw__pg_connect(const char *conninfo, int *call_ms, int *code, char *err,
                       size_t err_len);
/* Run @sql with @p on @c; results in binary. Returns 0 with *@res (the
 * caller clears it; NULL @res: cleared here) or a TW_E* code: TW_ECONN
 * when the connection broke or no answer came within @ms (the caller
 * drops @c then). */
int tw__pg_exec(PGconn *c, int ms, const char *sql, const struct pgp *p,
                PGresult **res);
/* The same as a statement prepared on @c as number @id (0 .. 31) the
 * first time (@mask: the bits of those prepared on @c, cleared by the
 * caller for a new connection); @p must not be NULL. */
int tw__pg_exec_prep(PGconn *c, int ms, unsigned *mask, int id, const char *sql,
                     const struct pgp *p, PGresult **res);
/* The same for @sql of several statements, no parameters, no result. */
int tw__pg_exec_script(PGconn *c, int ms, const char *sql);
/* The same on a connection of @d's pool, taken and given back. */
int tw__pg_run(struct pgd *d, const char *sql, const struct pgp *p,
               PGresult **res);
/* The same as a statement prepared on that connection (above). */
int tw__pg_run_prep(struct pgd *d, int id, const char *sql, const struct pgp *p,
                    PGresult **res);
/* The TW_E* code of a failed result (SQLSTATE classes). */
int tw__pg_code(const PGresult *r, PGconn *c);
/* Binary result fields. */
int64_t tw__pg_i64(const PGresult *r, int row, int col);
int32_t tw__pg_i32(const PGresult *r, int row, int col);
bool tw__pg_bool(const PGresult *r, int row, int col);
/* The pool: set up (no connection yet), and closed. */
int tw__pg_pool_init(struct pgpool *p);
void tw__pg_pool_close(struct pgpool *p);
/* A connection of the pool (connected, maybe now), or NULL with *@rc. */
PGconn *tw__pg_take(struct pgd *d, int *rc);
/* Give @c back; @broken: it failed, drop it. */
void tw__pg_give(struct pgd *d, PGconn *c, bool broken);
/* Real CLOCK_MONOTONIC in ms. */
uint64_t tw__pg_mono_ms(void);

/* Schema (src/durable_pg_schema.c): make sure the schema of version
 * PG_SCHEMA_V is there (install it unless @readonly) and that the role
 * may use it. 0 or a TW_E* code with a message in @err. */
int tw__pg_schema(PGconn *c, int ms, bool readonly, char *err, size_t err_len);

/* Firing (src/durable_pg_fire.c). */
int tw__pg_fire_start(struct pgd *d);
void tw__pg_fire_stop(struct pgd *d);
/* A local change of @key wrote version @ver: stale its deliveries. */
void tw__pg_changed(struct pgd *d, const void *key, size_t key_len,
                    int64_t ver);
/* A timer due at @due may have become due earlier than the firer knows. */
void tw__pg_wake(struct pgd *d, int64_t due);
/* Whether a delivery of @key is claimed and not completed (touch). */
int tw__pg_touch(tw_durable *base, const void *key, size_t key_len);

/* tw_durable_schedule_many: one statement a batch (src/durable_pg_many.c). */
int tw__pg_schedule_many(tw_durable *base, tw_durable_item *items, size_t n);
/* One-dimensional arrays in the binary format, as parameters
 * (src/durable_pg_many.c): @a->b holds 20 bytes of header plus 4 and the
 * bytes of each element; head first (@n elements of type @elem), then
 * each element, put or NULL. */
struct pgarr {
    unsigned char *b;
    size_t len;
};
void tw__pg_arr_head(struct pgarr *a, uint32_t elem, size_t n);
void tw__pg_arr_put(struct pgarr *a, const void *p, size_t n);
/* An int8 element: @v in network byte order. */
void tw__pg_arr_i64(struct pgarr *a, int64_t v);
void tw__pg_arr_null(struct pgarr *a);
/* @a as the next parameter of @p, of array type @type. */
void tw__pg_p_arr(struct pgp *p, const struct pgarr *a, unsigned int type);

/* The end of @j's delivery, whose callback returned @res: it leaves
 * d->jobs (src/durable_pg_fire.c). */
void tw__pg_job_fin(struct pgd *d, struct pgjob *j, int res);
/* The completion of @j alone, as when no batch takes it: one statement
 * that does not wait for a row lock, kept and tried again if it did not
 * get in (src/durable_pg_fire.c); it ends the job once in. */
void tw__pg_fin_one(struct pgd *d, struct pgjob *j, int next, int res);

/* Completions in batches (src/durable_pg_batch.c): the thread, started
 * (if it cannot be, completions are made one by one) and stopped after
 * everything queued completed. add queues the completion of @j (@next of
 * tw__retry_next(): 0 done, > 0 retry) and returns true; false: the
 * caller completes it. */
void tw__pg_batch_start(struct pgd *d);
void tw__pg_batch_stop(struct pgd *d);
bool tw__pg_batch_add(struct pgd *d, struct pgjob *j, int next, int res);

/* Look-ups (src/durable_pg_query.c), ops of the table. */
int tw__pg_get(tw_durable *base, const void *key, size_t key_len,
               tw_durable_info *info, void *buf, size_t buf_len);
int tw__pg_list(tw_durable *base, const struct tw__list_req *q,
                tw_durable_entry *out, bool *end);
long tw__pg_scan(tw_durable *base, tw_durable_scan_fn fn, void *arg);
int tw__pg_dead_op(tw_durable *base, const void *key, size_t key_len,
                   int64_t due_ms, bool del);
int tw__pg_list_dead(tw_durable *base, const struct tw__list_req *q,
                     tw_durable_entry *out, bool *end);

static inline int64_t tw__pg_wall(const struct pgd *d)
{
    return d->wall_ms(d->clock_arg);
}

#endif
