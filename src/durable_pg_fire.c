/* SPDX-License-Identifier: MIT */
/*
 * src/durable_pg_fire.c - the PostgreSQL backend's firer: one thread per
 * handle that claims due rows and hands them to the shared executor
 * (src/durable_exec.h), and the deliveries' completions.
 *
 * The thread's loop, on its own connection (d->lc, LISTEN twheel):
 *   1. NOTIFYs of its namespace (twheel.schedule() sends one at commit)
 *      while nothing is due yet, a local hint (a schedule or retry
 *      through this handle), or PG_REFRESH_MS gone by: ask for the
 *      earliest claimable due time (one index probe, a read: rows
 *      unclaimed or whose lease ran out).
 *   2. Due by the handle's wall clock, and PG_CLAIM_GAP_MS since the
 *      last round that took rows: claim up to PG_BATCH rows, oldest
 *      first, in one statement (SELECT ... FOR UPDATE SKIP LOCKED inside
 *      an UPDATE that renews each row's version, counts the attempt and
 *      sets owner and lease_until), so nodes claiming together take
 *      different rows and never wait for each other; the same statement
 *      tells the next due time after it.
 *   3. Hand the claimed rows over in due order; then sleep in poll() on
 *      the connection's socket and an eventfd until the next due time
 *      (at most PG_REFRESH_MS; 5 ms with an injected clock, which may
 *      jump).
 * No polling beyond one small query a second when nothing happens; under
 * load one statement (and one commit) a round, a round at most every
 * PG_CLAIM_GAP_MS. The claim and the probe are prepared statements of
 * the connection.
 *
 * A delivery (fire_job(), on the executor): dropped if a local change
 * made it stale or its claim is near its lease's end (whoever claims it
 * next delivers it: at least once); then its callback runs, and its
 * completion is fenced by the claim's version (done: delete; retry: a
 * new due time, unclaimed: many a statement, src/durable_pg_batch.c,
 * which hands a batch that did not get in back here row by row; dead:
 * moved to twheel.dead) and does not wait for a row lock: one another
 * transaction holds keeps the completion aside (its job stays in
 * d->jobs, marked fin), tried again from 10 ms to every second by the
 * executor as the firer hands it over, until it gets in or is fenced
 * off, so the executor threads and the pool never wait for an
 * application's open transaction. The callback is counted as ended only
 * once its completion is in, so stats never show a delivered timer as
 * pending.
 * Close: the firer stops, queued deliveries are dropped, running ones
 * finish, and the claims of the dropped ones are given back at once
 * (attempt not counted).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "durable_pg.h"
#include "common.h"

#define DEAD_UNRUN (-2) /* to the dead letters without a callback */
#define FIN_NONE (-1)
#define FIN_DONE 0
#define FIN_RETRY 1
#define FIN_DEAD 2
#define FIN_FIRST_MS 10 /* the first try again after this */
#define FIN_MAX_MS 1000 /* tries at least this often */

/* A claim round: up to $3 due rows, and in a last row (key NULL) the
 * earliest claimable due time after $2 (NULL: none), read in the same
 * statement: no probe of its own after a round. The locked rows are
 * updated by their ctid (a TID scan): a join on the key was planned as
 * a scan of the whole namespace once the statement was prepared (a
 * generic plan: 8 ms a round at 2,400 pending). Due rows another
 * transaction holds locked are skipped by the claim and not counted as
 * next either (they were due at $2): the refresh (next_sql) finds them,
 * once a second, so a row an application's open transaction holds never
 * makes a busy loop. */
static const char claim_sql[] =
    "WITH c AS (SELECT ctid FROM twheel.timers WHERE ns = $1"
    " AND greatest(due, 0) <= $2 AND (lease_until IS NULL"
    " OR lease_until < clock_timestamp())"
    " ORDER BY greatest(due, 0), key LIMIT $3 FOR UPDATE SKIP LOCKED),"
    " u AS (UPDATE twheel.timers t"
    " SET attempts = least(t.attempts, 2147483646) + 1,"
    " ver = nextval('twheel.ver_seq'), owner = $4,"
    " lease_until = clock_timestamp() + $5 * interval '1 millisecond'"
    " WHERE t.ctid = ANY (ARRAY(SELECT ctid FROM c))"
    " RETURNING t.key, t.due, t.payload, t.attempts, t.ver)"
    " SELECT key, due, payload, attempts, ver FROM u UNION ALL"
    " SELECT NULL, (SELECT greatest(due, 0) FROM twheel.timers"
    " WHERE ns = $1 AND greatest(due, 0) > $2 AND (lease_until IS NULL"
    " OR lease_until < clock_timestamp()) ORDER BY greatest(due, 0), key"
    " LIMIT 1), NULL, NULL, NULL";

/* The earliest claimable due time: a read, no lock (a row another
 * transaction holds is found due, a claim round then takes nothing and
 * tells the next due time after it: see claim_sql). */
static const char next_sql[] =
    "SELECT greatest(due, 0) FROM twheel.timers WHERE ns = $1"
    " AND (lease_until IS NULL OR lease_until < clock_timestamp())"
    " ORDER BY greatest(due, 0), key LIMIT 1";

/* Due rows that no node can have claimed as they are: a lease_until past
 * now + 2^32 ms (lease_ms is 32 bits; 'infinity' written by hand, say)
 * would never be claimed. Set aside into twheel.quarantine (counted in
 * stats.quarantined), never delivered; rows locked now are left to the
 * next sweep, which comes every PG_SWEEP_MS. */
static const char sweep_sql[] =
    "WITH x AS (DELETE FROM twheel.timers WHERE (ns, key) IN (SELECT ns, key"
    " FROM twheel.timers WHERE ns = $1 AND greatest(due, 0) <= $2"
    " AND lease_until > clock_timestamp() + interval '4294967296 ms'"
    " FOR UPDATE SKIP LOCKED) RETURNING ns, key, due, payload, attempts,"
    " owner, lease_until) INSERT INTO twheel.quarantine (ns, key, due,"
    " payload, attempts, owner, lease_until, why) SELECT ns, key, due,"
    " payload, attempts, owner, lease_until, 'lease_until beyond any lease'"
    " FROM x";

/* The delivery whose callback this thread runs (tw_durable_touch()). */
static _Thread_local struct pgjob *pg_cur;

static void kick(struct pgd *d)
{
    uint64_t one = 1;
    if (d->evfd >= 0 && write(d->evfd, &one, sizeof one) < 0)
        (void)errno; /* full: a wake-up is pending anyway */
}

void tw__pg_wake(struct pgd *d, int64_t due)
{
    pthread_mutex_lock(&d->mu);
    bool earlier = due < d->hint;
    if (earlier)
        d->hint = due;
    pthread_mutex_unlock(&d->mu);
    if (earlier)
        kick(d);
}

static bool same_key(const struct pgjob *j, const void *key, size_t len)
{
    return j->key_len == len && !memcmp(j->data, key, len);
}

void tw__pg_changed(struct pgd *d, const void *key, size_t key_len, int64_t ver)
{
    pthread_mutex_lock(&d->mu);
    for (struct pgjob *j = d->jobs; j; j = j->next)
        if (j->ver < ver && same_key(j, key, key_len))
            j->stale = true;
    if (d->claiming) {
        if (d->nraced == d->cap_raced) {
            size_t cap = d->cap_raced ? 2 * d->cap_raced : 16;
            struct pgrace *n = tw__realloc(d->raced, cap * sizeof *n);
            if (n) {
                d->raced = n;
                d->cap_raced = cap;
            }
        }
        unsigned char *k = tw__malloc(key_len);
        if (k && d->nraced < d->cap_raced) {
            memcpy(k, key, key_len);
            d->raced[d->nraced++] = (struct pgrace){k, key_len, ver};
        } else {
            tw__free(k);
            d->raced_lost = ver > d->raced_lost ? ver : d->raced_lost;
        }
    }
    pthread_mutex_unlock(&d->mu);
}

static void job_link_locked(struct pgd *d, struct pgjob *j)
{
    j->prev = NULL;
    j->next = d->jobs;
    if (d->jobs)
        d->jobs->prev = j;
    d->jobs = j;
    d->njobs++;
}

static void job_unlink_locked(struct pgd *d, struct pgjob *j)
{
    if (j->prev)
        j->prev->next = j->next;
    else
        d->jobs = j->next;
    if (j->next)
        j->next->prev = j->prev;
    d->njobs--;
}

/* A claimed row into a job; NULL without memory (the row's lease runs
 * out and it is claimed again). */
static struct pgjob *job_of(struct pgd *d, const PGresult *r, int i)
{
    size_t kl = (size_t)PQgetlength(r, i, 0);
    size_t pl = (size_t)PQgetlength(r, i, 2);
    struct pgjob *j = tw__malloc(sizeof *j + kl + pl);
    if (!j)
        return NULL;
    memset(j, 0, sizeof *j);
    j->d = d;
    j->fin = FIN_NONE;
    j->key_len = kl;
    j->payload_len = pl;
    memcpy(j->data, PQgetvalue(r, i, 0), kl);
    memcpy(j->data + kl, PQgetvalue(r, i, 2), pl);
    j->due_ms = tw__pg_i64(r, i, 1);
    int32_t att = tw__pg_i32(r, i, 3);
    j->attempt = att > 0 ? (uint32_t)att : 1;
    j->ver = tw__pg_i64(r, i, 4);
    j->claimed_ms = tw__pg_mono_ms();
    return j;
}

/* Whether a local change of the round (d->raced) makes @j stale. */
static bool raced_locked(const struct pgd *d, const struct pgjob *j)
{
    if (j->ver < d->raced_lost)
        return true;
    for (size_t i = 0; i < d->nraced; i++)
        if (j->ver < d->raced[i].ver &&
            same_key(j, d->raced[i].key, d->raced[i].key_len))
            return true;
    return false;
}

static int job_cmp(const void *a, const void *b)
{
    const struct pgjob *x = *(struct pgjob *const *)a;
    const struct pgjob *y = *(struct pgjob *const *)b;
    int64_t dx = x->due_ms > 0 ? x->due_ms : 0;
    int64_t dy = y->due_ms > 0 ? y->due_ms : 0;
    if (dx != dy)
        return dx < dy ? -1 : 1;
    size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
    int c = memcmp(x->data, y->data, n);
    return c ? c : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

/* The claimed rows of @r (the first @n) into jobs, in due order, onto
 * @l. */
static void take_rows(struct pgd *d, const PGresult *r, int n,
                      struct tw__durable_jobs *l)
{
    struct pgjob *v[PG_BATCH];
    int m = 0;
    for (int i = 0; i < n && m < PG_BATCH; i++)
        if ((v[m] = job_of(d, r, i)))
            m++;
    qsort(v, (size_t)m, sizeof v[0], job_cmp);
    pthread_mutex_lock(&d->mu);
    for (int i = 0; i < m; i++) {
        v[i]->stale = raced_locked(d, v[i]);
        job_link_locked(d, v[i]);
        d->counts.backlog++;
        tw__durable_jobs_add(l, &v[i]->job);
    }
    for (size_t i = 0; i < d->nraced; i++)
        tw__free(d->raced[i].key);
    d->nraced = 0;
    d->raced_lost = 0;
    d->claiming = false;
    pthread_mutex_unlock(&d->mu);
}

/* One claim round at wall @now: how many rows, or a TW_E* code; the
 * earliest claimable due time after @now into *@next (INT64_MAX: none;
 * @now when the round was full: more may be due). */
static int claim(struct pgd *d, int64_t now, int64_t *next)
{
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_text(&p, d->ns);
    tw__pg_p_i64(&p, now);
    tw__pg_p_i32(&p, PG_BATCH);
    tw__pg_p_text(&p, d->node);
    tw__pg_p_i64(&p, d->lease_ms);
    pthread_mutex_lock(&d->mu);
    d->claiming = true;
    pthread_mutex_unlock(&d->mu);
    PGresult *r = NULL;
    int rc = tw__pg_exec_prep(d->lc, atomic_load(&d->call_ms), &d->lc_prep,
                              PG_PREP_CLAIM, claim_sql, &p, &r);
    int n = rc ? 0 : PQntuples(r) - 1; /* the last row: the next due time */
    struct tw__durable_jobs l;
    tw__durable_jobs_init(&l);
    take_rows(d, r, n > 0 ? n : 0, &l);
    if (rc)
        return rc;
    *next = n >= PG_BATCH                     ? now
            : n >= 0 && !PQgetisnull(r, n, 1) ? tw__pg_i64(r, n, 1)
                                              : INT64_MAX;
    PQclear(r);
    tw__durable_exec_submit(&d->exec, &l);
    return n;
}

/* Completions, fenced by the claim's version. Each first locks its row
 * with NOWAIT: a row another transaction holds (an application's open
 * transaction that cancelled or locked it, or for a statement another
 * node's claim or probe) fails the statement at once (55P03, TW_EBUSY)
 * rather than holding an executor thread and a pool connection until
 * that transaction ends; the completion is then kept and tried again
 * (complete_later()), never dropped while the lock is the reason. */
static const char *const fin_sql[] = {
    "WITH l AS (SELECT key FROM twheel.timers WHERE ns = $1 AND key = $2"
    " AND ver = $3 FOR UPDATE NOWAIT) DELETE FROM twheel.timers t USING l"
    " WHERE t.ns = $1 AND t.key = l.key AND t.ver = $3",
    "WITH l AS (SELECT key FROM twheel.timers WHERE ns = $1 AND key = $2"
    " AND ver = $3 FOR UPDATE NOWAIT) UPDATE twheel.timers t SET due = $4,"
    " owner = NULL, lease_until = NULL FROM l"
    " WHERE t.ns = $1 AND t.key = l.key AND t.ver = $3",
    "WITH l AS (SELECT key FROM twheel.timers WHERE ns = $1 AND key = $2"
    " AND ver = $3 FOR UPDATE NOWAIT), x AS (DELETE FROM twheel.timers t"
    " USING l WHERE t.ns = $1 AND t.key = l.key AND t.ver = $3"
    " RETURNING t.ns, t.key, t.due, t.payload, t.attempts)"
    " INSERT INTO twheel.dead (ns, key, due, payload, attempts)"
    " SELECT ns, key, due, payload, greatest(attempts - $4, 0) FROM x"
    " ON CONFLICT (ns, key) DO UPDATE SET due = excluded.due,"
    " payload = excluded.payload, attempts = excluded.attempts,"
    " died = now()"};

/* One try of @j's completion; 0 once it is in (or fenced off). */
static int complete_try(struct pgd *d, struct pgjob *j)
{
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_nskey(&p, d, j->data, j->key_len);
    tw__pg_p_i64(&p, j->ver);
    if (j->fin == FIN_RETRY)
        tw__pg_p_i64(&p, j->fin_due);
    else if (j->fin == FIN_DEAD)
        tw__pg_p_i32(&p, j->fin_arg);
    int rc = tw__pg_run(d, fin_sql[j->fin], &p, NULL);
    if (!rc && j->fin == FIN_RETRY)
        tw__pg_wake(d, j->fin_due);
    return rc;
}

/* Forget @j (its callback ended, or it never starts). */
static void job_end(struct pgd *d, struct pgjob *j, bool started, int res);

/* @j's completion failed with @rc: keep it for another try (a lock may
 * be held for as long as a transaction stays open; the database may be
 * away), or give it up: an error other than a lock that lasted past the
 * lease (the lease ends the claim: another node delivers it again). */
static void complete_later(struct pgd *d, struct pgjob *j, int rc)
{
    uint64_t now = tw__pg_mono_ms();
    if (!j->fin_tries++)
        j->fin_since = now;
    if (rc != TW_EBUSY && now - j->fin_since > d->lease_ms) {
        job_end(d, j, j->fin_started, j->fin_res);
        return;
    }
    uint32_t shift = j->fin_tries < 8 ? j->fin_tries - 1 : 7;
    uint64_t wait = (uint64_t)FIN_FIRST_MS << shift;
    pthread_mutex_lock(&d->mu);
    j->fin_at = now + (wait < FIN_MAX_MS ? wait : FIN_MAX_MS);
    j->fin_queued = false;
    d->fin_waiting++;
    pthread_mutex_unlock(&d->mu);
    kick(d); /* the firer sleeps until fin_at at most */
}

/* The completion of @j: @next as tw__retry_next() says, or DEAD_UNRUN;
 * @started and @res for the counters once it is in. */
static void complete(struct pgd *d, struct pgjob *j, int next, bool started,
                     int res)
{
    /* Under the lock, and queued: complete_due() leaves it to this try. */
    pthread_mutex_lock(&d->mu);
    j->fin = next == 0 ? FIN_DONE : next > 0 ? FIN_RETRY : FIN_DEAD;
    j->fin_queued = true;
    pthread_mutex_unlock(&d->mu);
    j->fin_started = started;
    j->fin_res = res;
    j->fin_arg = next == DEAD_UNRUN;
    if (next > 0) {
        int64_t now = tw__pg_wall(d);
        j->fin_due = now > INT64_MAX - next ? INT64_MAX : now + next;
    }
    int rc = complete_try(d, j);
    if (rc)
        complete_later(d, j, rc);
    else
        job_end(d, j, started, res);
}

/* Completions kept by complete_later() whose time came, to the executor;
 * the mono ms of the next one still waiting into *@next_at. */
static void complete_due(struct pgd *d, uint64_t *next_at)
{
    struct tw__durable_jobs l;
    tw__durable_jobs_init(&l);
    uint64_t now = tw__pg_mono_ms();
    *next_at = UINT64_MAX;
    pthread_mutex_lock(&d->mu);
    for (struct pgjob *j = d->jobs; j && d->fin_waiting; j = j->next) {
        if (j->fin == FIN_NONE || j->fin_queued)
            continue;
        if (j->fin_at <= now) {
            j->fin_queued = true;
            d->fin_waiting--;
            tw__durable_jobs_add(&l, &j->job);
        } else if (j->fin_at < *next_at) {
            *next_at = j->fin_at;
        }
    }
    pthread_mutex_unlock(&d->mu);
    if (l.n)
        tw__durable_exec_submit(&d->exec, &l);
}

/* Forget @j (its callback ended, or it never starts). */
static void job_end(struct pgd *d, struct pgjob *j, bool started, int res)
{
    pthread_mutex_lock(&d->mu);
    if (started)
        tw__durable_counts_end(&d->counts, res);
    else if (!j->started)
        d->counts.backlog--;
    job_unlink_locked(d, j);
    pthread_mutex_unlock(&d->mu);
    tw__free(j);
    kick(d); /* room for the next claim */
}

/* The callback of @j; mu held on entry, not on return. */
static void run_one(struct pgd *d, struct pgjob *j)
{
    uint64_t late = tw__durable_late_us(tw__pg_wall(d), j->due_ms);
    j->started = true;
    d->counts.backlog--;
    tw__durable_counts_begin(&d->counts, late);
    pthread_mutex_unlock(&d->mu);
    tw_durable_timer t = {
        j->data,    j->key_len, j->data + j->key_len, j->payload_len, j->due_ms,
        j->attempt, 0,          (uint64_t)j->ver};
    pg_cur = j;
    int res = tw__durable_fire(&d->base, d->fire, &t, d->fire_arg);
    pg_cur = NULL;
    int next = tw__retry_next(&d->retry, j->attempt, res);
    if (next >= 0 && tw__pg_batch_add(d, j, next, res))
        return; /* completed in a batch (src/durable_pg_batch.c) */
    complete(d, j, next, true, res);
}

void tw__pg_job_fin(struct pgd *d, struct pgjob *j, int res)
{
    job_end(d, j, true, res);
}

void tw__pg_fin_one(struct pgd *d, struct pgjob *j, int next, int res)
{
    complete(d, j, next, true, res);
}

/* A delivery as the executor runs it (src/durable_exec.h). */
static void fire_job(struct tw__durable_job *job, void *ctx)
{
    struct pgd *d = ctx;
    struct pgjob *j = TW_CONTAINER_OF(job, struct pgjob, job);
    if (j->fin != FIN_NONE) {
        /* A completion kept for another try (complete_later()). */
        int rc = complete_try(d, j);
        if (rc)
            complete_later(d, j, rc);
        else
            job_end(d, j, j->fin_started, j->fin_res);
        return;
    }
    pthread_mutex_lock(&d->mu);
    bool old = tw__pg_mono_ms() - j->claimed_ms >= d->lease_ms / 4 * 3;
    if (j->stale || old) {
        /* Cancelled or replaced here since its claim; or its lease may
         * run out before the callback could complete: whoever claims it
         * next delivers it. */
        pthread_mutex_unlock(&d->mu);
        job_end(d, j, false, 0);
        return;
    }
    if (!tw__retry_may(&d->retry, j->attempt)) {
        /* The deliveries before ran out of their leases (crashes). */
        pthread_mutex_unlock(&d->mu);
        complete(d, j, DEAD_UNRUN, false, 0);
        return;
    }
    run_one(d, j);
}

/* Close left @job queued: it stays in d->jobs, whose unstarted claims
 * tw__pg_fire_stop() gives back. */
static void drop_job(struct tw__durable_job *job, void *ctx)
{
    (void)job;
    (void)ctx;
}

/* (Re)connect the firer's connection and LISTEN; false if it failed. */
static bool lc_open(struct pgd *d)
{
    int ms = 0;
    d->lc = tw__pg_connect(d->conninfo, &ms, NULL, NULL, 0);
    d->lc_prep = 0; /* a new session: nothing prepared */
    if (d->lc && !tw__pg_exec(d->lc, ms, "LISTEN twheel", NULL, NULL)) {
        atomic_store(&d->call_ms, ms);
        return true;
    }
    PQfinish(d->lc);
    d->lc = NULL;
    return false;
}

static void lc_drop(struct pgd *d)
{
    PQfinish(d->lc);
    d->lc = NULL;
}

/* NOTIFYs read: whether one was for this namespace; -1 if the connection
 * broke. */
static int drain(struct pgd *d)
{
    if (!PQconsumeInput(d->lc))
        return -1;
    int mine = 0;
    PGnotify *n;
    while ((n = PQnotifies(d->lc))) {
        if (n->extra && !strcmp(n->extra, d->ns))
            mine = 1;
        PQfreemem(n);
    }
    return mine;
}

/* The earliest claimable due time into *@next (INT64_MAX: none). */
static int next_due(struct pgd *d, int64_t *next)
{
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_text(&p, d->ns);
    PGresult *r = NULL;
    int rc = tw__pg_exec_prep(d->lc, atomic_load(&d->call_ms), &d->lc_prep,
                              PG_PREP_NEXT, next_sql, &p, &r);
    if (rc)
        return rc;
    *next = PQntuples(r) ? tw__pg_i64(r, 0, 0) : INT64_MAX;
    PQclear(r);
    return 0;
}

/* Set aside the due rows of sweep_sql, at most every PG_SWEEP_MS. */
static int sweep(struct pgd *d)
{
    uint64_t now = tw__pg_mono_ms();
    if (now < d->sweep_at)
        return 0;
    d->sweep_at = now + PG_SWEEP_MS;
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_text(&p, d->ns);
    tw__pg_p_i64(&p, tw__pg_wall(d));
    return tw__pg_exec(d->lc, atomic_load(&d->call_ms), sweep_sql, &p, NULL);
}

/* Sleep up to @ms in poll() on the connection's socket and the eventfd. */
static void nap(struct pgd *d, int ms)
{
    struct pollfd pf[2] = {{d->evfd, POLLIN, 0},
                           {d->lc ? PQsocket(d->lc) : -1, POLLIN, 0}};
    if (poll(pf, 2, ms) > 0 && (pf[0].revents & POLLIN)) {
        uint64_t v;
        if (read(d->evfd, &v, sizeof v) < 0)
            (void)errno; /* nothing to read: another reader took it */
    }
}

/* How long to sleep: until @next by the wall clock, at most until the
 * next refresh, at most 5 ms with an injected (jumping) clock. */
static int sleep_ms(struct pgd *d, int64_t next, uint64_t refresh_at)
{
    int64_t now = tw__pg_wall(d);
    uint64_t mono = tw__pg_mono_ms();
    int64_t ms = next == INT64_MAX            ? PG_REFRESH_MS
                 : next <= now                ? 0
                 : next - now > PG_REFRESH_MS ? PG_REFRESH_MS
                                              : next - now;
    if (refresh_at > mono && (int64_t)(refresh_at - mono) < ms)
        ms = (int64_t)(refresh_at - mono);
    else if (refresh_at <= mono)
        ms = 0;
    if (d->injected && ms > 5)
        ms = 5;
    return (int)ms;
}

/* How long to nap in a turn that claims nothing: until the next due
 * time (@gated: until the claim gate), the next refresh or the next kept
 * completion (@fin_at), as the handle has @room for more claims. */
static int nap_ms(struct pgd *d, int64_t next, uint64_t refresh_at,
                  uint64_t fin_at, bool room, bool gated)
{
    uint64_t mono = tw__pg_mono_ms();
    int ms = !room   ? PG_REFRESH_MS
             : gated ? (int)(d->claim_gate - mono)
                     : sleep_ms(d, next, refresh_at);
    if (fin_at != UINT64_MAX)
        ms = fin_at <= mono                 ? 0
             : fin_at - mono < (uint64_t)ms ? (int)(fin_at - mono)
                                            : ms;
    return ms;
}

/* One turn of the loop; false when the connection broke. A NOTIFY asks
 * for the next due time unless one is due within PG_CLAIM_GAP_MS (the
 * claim then takes every due row: a timer of the NOTIFY due before that
 * one is at most as late as the gate makes it); a claim round tells the
 * next due time after it; so
 * under load a round is one statement, and rounds start at most every
 * PG_CLAIM_GAP_MS (d->claim_gate) unless the last one was full. */
static bool turn(struct pgd *d, int64_t *next, uint64_t *refresh_at)
{
    int mine = drain(d);
    if (mine < 0)
        return false;
    pthread_mutex_lock(&d->mu);
    if (d->hint < *next)
        *next = d->hint;
    d->hint = INT64_MAX;
    bool room = d->njobs < 2 * PG_BATCH;
    pthread_mutex_unlock(&d->mu);
    uint64_t fin_at;
    complete_due(d, &fin_at);
    int64_t now = tw__pg_wall(d);
    if ((mine && *next > now + PG_CLAIM_GAP_MS) ||
        tw__pg_mono_ms() >= *refresh_at) {
        if (sweep(d) == TW_ECONN || next_due(d, next))
            return false;
        *refresh_at = tw__pg_mono_ms() + PG_REFRESH_MS;
        now = tw__pg_wall(d);
    }
    bool gated = *next <= now && tw__pg_mono_ms() < d->claim_gate;
    if (room && *next <= now && !gated) {
        int n = claim(d, now, next);
        if (n < 0)
            return false;
        d->claim_gate = n ? tw__pg_mono_ms() + PG_CLAIM_GAP_MS : 0;
        if (n >= PG_BATCH)
            d->claim_gate = 0; /* a backlog: the next round at once */
        return true;
    }
    nap(d, nap_ms(d, *next, *refresh_at, fin_at, room, gated));
    return true;
}

static void *pg_main(void *arg)
{
    struct pgd *d = arg;
    int64_t next = INT64_MAX;
    uint64_t refresh_at = 0;
    while (!atomic_load(&d->stop)) {
        if (!d->lc && !lc_open(d)) {
            nap(d, 500); /* the database is away: try again soon */
            continue;
        }
        if (!turn(d, &next, &refresh_at)) {
            lc_drop(d);
            refresh_at = 0;
        }
    }
    return NULL;
}

int tw__pg_fire_start(struct pgd *d)
{
    d->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (d->evfd < 0)
        return TW_ENOMEM;
    if (tw__durable_exec_init(&d->exec, d->nexec, fire_job, drop_job, d) ||
        tw__durable_exec_start(&d->exec)) {
        tw__durable_exec_destroy(&d->exec);
        close(d->evfd);
        return TW_ENOMEM;
    }
    tw__pg_batch_start(d);
    lc_open(d); /* if not now, the thread tries again */
    d->thr_on = !pthread_create(&d->thr, NULL, pg_main, d);
    if (!d->thr_on) {
        tw__durable_exec_stop(&d->exec);
        tw__pg_batch_stop(d);
        tw__durable_exec_destroy(&d->exec);
        lc_drop(d);
        close(d->evfd);
        return TW_ENOMEM;
    }
    return 0;
}

/* Give back the claim of a delivery that never started (its lease would
 * end it anyway); a TW_E* code if that failed. */
static int give_back(struct pgd *d, struct pgjob *j)
{
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_nskey(&p, d, j->data, j->key_len);
    tw__pg_p_i64(&p, j->ver);
    return tw__pg_run(
        d,
        "UPDATE twheel.timers SET owner = NULL, lease_until = NULL,"
        " attempts = greatest(attempts - 1, 0)"
        " WHERE ns = $1 AND key = $2 AND ver = $3",
        &p, NULL);
}

void tw__pg_fire_stop(struct pgd *d)
{
    atomic_store(&d->stop, true);
    kick(d);
    if (d->thr_on)
        pthread_join(d->thr, NULL);
    tw__durable_exec_stop(&d->exec);
    tw__pg_batch_stop(d); /* the queued completions in */
    /* Only dropped deliveries are left: no thread runs one now. With the
     * database away, the rest wait for their leases (no connect each). */
    bool reach = true;
    while (d->jobs) {
        struct pgjob *j = d->jobs;
        if (reach && j->fin != FIN_NONE)
            reach = complete_try(d, j) != TW_ECONN; /* a last try */
        else if (reach && !j->stale && !j->started)
            reach = give_back(d, j) != TW_ECONN;
        job_unlink_locked(d, j);
        tw__free(j);
    }
    tw__durable_exec_destroy(&d->exec);
    lc_drop(d);
    close(d->evfd);
}

int tw__pg_touch(tw_durable *base, const void *key, size_t key_len)
{
    struct pgd *d = (struct pgd *)base;
    int64_t ver = 0;
    pthread_mutex_lock(&d->mu);
    if (pg_cur && pg_cur->d == d && same_key(pg_cur, key, key_len))
        ver = pg_cur->ver;
    for (struct pgjob *j = d->jobs; j && !ver; j = j->next)
        if (j->started && same_key(j, key, key_len))
            ver = j->ver;
    pthread_mutex_unlock(&d->mu);
    if (!ver)
        return TW_ENOENT;
    struct pgp p;
    tw__pg_p_init(&p);
    tw__pg_p_nskey(&p, d, key, key_len);
    tw__pg_p_i64(&p, ver);
    tw__pg_p_i64(&p, d->lease_ms);
    PGresult *r = NULL;
    int rc = tw__pg_run(d,
                        "UPDATE twheel.timers SET lease_until ="
                        " clock_timestamp() + $4 * interval '1 millisecond'"
                        " WHERE ns = $1 AND key = $2 AND ver = $3",
                        &p, &r);
    if (rc)
        return rc;
    bool hit = atoi(PQcmdTuples(r)) == 1;
    PQclear(r);
    if (hit) {
        pthread_mutex_lock(&d->mu);
        for (struct pgjob *j = d->jobs; j; j = j->next)
            if (j->ver == ver)
                j->claimed_ms = tw__pg_mono_ms();
        pthread_mutex_unlock(&d->mu);
    }
    return hit ? 0 : TW_ENOENT;
}
