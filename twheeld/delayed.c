/* SPDX-License-Identifier: MIT */
/*
 * delayed.c - twheeld: delayed jobs, in every mode, on one index.
 *
 * Every delayed job this server holds has an entry in s->dq (delayq.c): its
 * id, due time and tube, so that a command finds it at once whatever the
 * store is doing, and peek-delayed and kick take the tube's delayed jobs
 * due first, as beanstalkd does. What else memory holds of it:
 *
 *   - no store: the whole job, its delay a timer on the wheel;
 *   - with a store (-b, --redis): the whole job while a write of it is
 *     under way (a put or release is not in the store before its write
 *     lands, and a command pipelined behind it must find it), then the
 *     entry alone (tbd_job_cool()): the store holds the record, body and
 *     all, and fires it at its due time (store.c); tbd_fired_jobs() makes
 *     it ready here. A command that needs more than the entry (peek,
 *     stats-job, kick, reserve-job, delete) reads the record back with one
 *     tbd_store_get() (tbd_job_lookup()).
 *
 * With --redis a delayed job may fall due on another server (the owner of
 * its shard), which takes it: the entry here is then stale. A read that
 * finds the record gone, or naming another server, drops the entry; so
 * does tbd_delayed_sweep() for entries well past their due time.
 */
#define _GNU_SOURCE
#include "tbd.h"

#include "delayq.h"

/* An entry this long past its due time whose job did not come back here
 * is looked up in the store (--redis: another server may have it). */
#define STALE_MS 10000
#define SWEEP_MAX 256 /* store reads per sweep */

static void dq_add(struct tube *t, uint64_t id, int64_t due)
{
    struct server *s = t->srv;
    if (tbd_dq_add(s->dq, t->dq, id, due) != 0) {
        fputs("twheeld: out of memory (delayed jobs)\n", stderr);
        abort();
    }
}

/* Drops @id's entry, if any, and its tube if nothing else holds it. */
static void dq_drop(struct server *s, uint64_t id)
{
    uint32_t qno;
    if (!tbd_dq_get(s->dq, id, &qno, NULL))
        return;
    tbd_dq_remove(s->dq, id);
    tbd_tube_maybe_free(s->qtube[qno]);
}

/* True when @id is a delayed job of this server's index. */
bool tbd_delayed_has(struct server *s, uint64_t id)
{
    return tbd_dq_get(s->dq, id, NULL, NULL);
}

/* A delayed job of this server that recovery read back: its entry alone
 * (the store holds and fires it). */
void tbd_delayed_recovered(struct tube *t, uint64_t id, int64_t due)
{
    dq_add(t, id, due);
}

/*
 * Makes @j (in no state's list or queue; in the job table when
 * @in_table) delayed by @delay_s from now, and stores it with @text as
 * its reply (at once without a store).
 */
void tbd_job_delay(struct conn *c, struct job *j, uint32_t delay_s,
                   bool in_table, const char *text)
{
    struct server *s = j->tube->srv;
    uint64_t now = tw_wheel_now(s->wheel);
    j->state = J_DELAYED;
    j->delay_s = delay_s;
    j->deadline = now + (uint64_t)delay_s * 1000u;
    /* Rounded up: the store fires at the due ms, so a job it holds is never
     * ready before its delay has passed. */
    j->due_wall = tbd_wall_ms_up() + (int64_t)delay_s * 1000;
    if (!in_table)
        tbd_job_table_insert(j);
    dq_add(j->tube, j->id, j->due_wall);
    if (!s->store) {
        tw_wheel_add(s->wheel, &j->timer, j->deadline);
        tbd_reply(c, text);
        return;
    }
    /* The store fires it: its record is due when the job is. */
    j->timed = true;
    struct tbd_write *w = tbd_job_write(j, J_DELAYED, c);
    w->due_ms = j->due_wall;
    w->delayed = true;
    tbd_submit(s, c, w, text);
}

/*
 * A write of delayed job @j came back (@ok: the store has it). Once no
 * other write of it is under way, memory keeps its entry alone. A delayed
 * job the store did not take is gone (logged; its reply said so).
 */
void tbd_job_cool(struct job *j, bool ok)
{
    struct server *s = j->tube->srv;
    if (j->state != J_DELAYED || !s->store)
        return;
    if (!ok) {
        tbd_job_unlink(j);
        tbd_job_free(j);
        return;
    }
    if (j->writes > 0)
        return;
    /* The entry stays; the job leaves the table (its tube stays: the
     * entry holds it). */
    tbd_job_table_remove(j);
    tbd_job_release(s, j);
}

/* The record of delayed job @id read back, if it is still this server's
 * and delayed: a job in no table (free it with tbd_job_free_cold()).
 * NULL with *@err 0: gone or another server's (its entry is dropped);
 * NULL with *@err a TW_E* code: the store failed. */
static struct job *cold_read(struct server *s, uint64_t id, int *err)
{
    char key[24];
    size_t kl = (size_t)snprintf(key, sizeof(key), "j%" PRIu64, id);
    size_t cap = tbd_rec_size(TBD_TUBE_NAME_MAX, s->opt->max_job_size);
    size_t len = 0;
    unsigned char *p = tbd_xmalloc(cap);
    int rc = tbd_store_get(s->store, key, kl, p, cap, &len);
    struct rec r;
    struct job *j = NULL;
    *err = rc == TW_ENOENT ? 0 : rc;
    if (rc == 0 && len <= cap && tbd_rec_parse(p, len, &r) && r.id == id &&
        r.owner == s->opt->node && r.state == J_DELAYED) {
        j = tbd_job_from_rec(s, &r, true);
        if (!j)
            *err = TW_ENOMEM;
    }
    free(p);
    if (!j && *err == 0)
        dq_drop(s, id); /* it left: deleted, or taken by another server */
    if (j) {
        int64_t left = j->due_wall - tbd_wall_ms_up();
        j->deadline = tw_wheel_now(s->wheel) + (uint64_t)(left > 0 ? left : 0);
    }
    return j;
}

/* --redis: a write of job @id was refused (its record is not the one
 * this server last wrote: another server took the job over, and may have
 * deleted it). This server stops serving it. */
void tbd_job_fenced(struct server *s, uint64_t id)
{
    struct job *j = tbd_job_find(s, id);
    tbd_logv(s, 1, "job %" PRIu64 ": held by another server now: dropped", id);
    if (j) {
        tbd_job_unlink(j);
        tbd_job_free(j);
    } else {
        dq_drop(s, id);
    }
}

void tbd_job_free_cold(struct job *j)
{
    struct server *s = j->tube->srv;
    struct tube *t = j->tube;
    tbd_job_release(s, j);
    tbd_tube_maybe_free(t);
}

/*
 * The job @id this server holds, in any state: the one in memory, or a
 * delayed job whose record the store alone holds, read back (then *@cold
 * is set: it is in no table; tbd_job_warm() it or tbd_job_free_cold()
 * it). NULL: none (*@err 0), or the store failed (*@err a TW_E* code).
 */
struct job *tbd_job_lookup(struct server *s, uint64_t id, bool *cold, int *err)
{
    *cold = false;
    *err = 0;
    tbd_fired_jobs(s);
    struct job *j = tbd_job_find(s, id);
    if (j || !s->store || !tbd_dq_get(s->dq, id, NULL, NULL))
        return j;
    j = cold_read(s, id, err);
    *cold = j != NULL;
    return j;
}

/* A delayed job read back by tbd_job_lookup() joins memory as ready;
 * its record may still fire until a write of it lands (timed). */
void tbd_job_warm(struct job *j)
{
    struct server *s = j->tube->srv;
    tbd_dq_remove(s->dq, j->id);
    j->timed = true;
    tbd_job_table_insert(j);
    tbd_job_make_ready(j);
}

/* The first delayed job of @t by (due, id) (as tbd_job_lookup()). */
struct job *tbd_delayed_first(struct tube *t, bool *cold, int *err)
{
    struct server *s = t->srv;
    uint64_t id;
    int64_t due;
    *cold = false;
    *err = 0;
    tbd_fired_jobs(s);
    while (tbd_dq_first(s->dq, t->dq, &id, &due)) {
        struct job *j = tbd_job_lookup(s, id, cold, err);
        if (j || *err)
            return j;
        /* Its entry was stale and is gone: the next one. */
    }
    return NULL;
}

/* --redis: drops the entries of delayed jobs that fell due STALE_MS ago
 * or more and did not come back here (another server took them); at most
 * SWEEP_MAX store reads a call. */
void tbd_delayed_sweep(struct server *s)
{
    int64_t before = tbd_wall_ms() - STALE_MS;
    int reads = 0;
    tbd_fired_jobs(s);
    for (struct tube *t = s->tubes, *nx; t && reads < SWEEP_MAX; t = nx) {
        nx = t->next; /* t may be freed */
        uint64_t id;
        int64_t due;
        uint32_t qno = t->dq; /* a freed tube's queue is empty */
        while (reads < SWEEP_MAX && tbd_dq_first(s->dq, qno, &id, &due) &&
               due < before && !tbd_job_find(s, id)) {
            int err;
            struct job *j = cold_read(s, id, &err);
            reads++;
            if (j || err) { /* still here (not fired yet), or no answer */
                if (j)
                    tbd_job_free_cold(j);
                break;
            }
        }
    }
}

/* Drops every entry (tbd_forget_jobs()). */
void tbd_delayed_forget(struct server *s)
{
    for (struct tube *t = s->tubes, *nx; t; t = nx) {
        nx = t->next; /* t may be freed */
        uint32_t qno = t->dq;
        uint64_t id;
        int64_t due;
        while (tbd_dq_first(s->dq, qno, &id, &due))
            dq_drop(s, id);
    }
}

/* ---- what the store fired ---- */

/* True when this server issues job id @id (--node: its range). */
bool tbd_own_id(struct server *s, uint64_t id)
{
    return (id >> NODE_SHIFT) == s->opt->node;
}

/* A fired record of job @id that this server must not serve: one in
 * its own range of ids that it has not issued yet (a job of another
 * server cannot have it; served, it would meet the job this server
 * issues with that id). */
static bool fired_squats(struct server *s, uint64_t id)
{
    return tbd_own_id(s, id) && id >= s->next_id;
}

/* Fired job @r whose job is in memory: a delayed one whose write was
 * still under way (or just landed) becomes ready, if the record that
 * fired is its current one (the same due time). */
static void fired_in_memory(struct job *j, const struct rec *r)
{
    struct server *s = j->tube->srv;
    if (j->state != J_DELAYED || r->state != J_DELAYED || r->due != j->due_wall)
        return;
    tbd_job_unlink(j);
    tbd_job_make_ready(j);
    if (s->opt->redis) /* it must not fire on another server */
        tbd_submit(s, NULL, tbd_job_write(j, J_READY, NULL), NULL);
}

/*
 * Fired record @r of job @id, not in memory: this server's delayed job
 * becomes ready (with or without an entry: the store may fire a job due
 * while it opened before recovery could see it); a job of another server
 * (it fell due in a shard this server owns, or a takeover handed it here)
 * is taken: ready, or buried if it was. A job that left this server
 * (deleted) cannot come back here: its key is claimed while its cancel
 * is under way (tbd_cmd_delete()), and a delivery of a claimed key is
 * dropped (store.c).
 */
static void fired_cold(struct server *s, uint64_t id, const struct rec *r)
{
    struct job *j = tbd_job_from_rec(s, r, true);
    if (!j) {
        tbd_logv(s, 0, "job %" PRIu64 ": out of memory, left in the store", id);
        return;
    }
    tbd_dq_remove(s->dq, id);
    tbd_job_table_insert(j);
    if (r->state == J_BURIED)
        tbd_job_make_buried(j);
    else
        tbd_job_make_ready(j);
    /* Redis: from now on this server holds it, and the record must not
     * fire on another server again. */
    if (s->opt->redis)
        tbd_submit(s, NULL, tbd_job_write(j, j->state, NULL), NULL);
}

/* The jobs the store fired. A record that is not a job record of its key
 * is left in the store (logged, counted). */
void tbd_fired_jobs(struct server *s)
{
    if (!s->store)
        return;
    for (struct tbd_fired *f = tbd_store_take_fired(s->store), *nx; f; f = nx) {
        nx = f->next;
        uint64_t id = tbd_key_id(f->key, f->key_len);
        struct rec r;
        struct job *j = id ? tbd_job_find(s, id) : NULL;
        if (f->key_len && f->key[0] == 'n') {
            tbd_live_fired(s, f->key, f->key_len, f->payload, f->payload_len);
        } else if (id && tbd_rec_parse(f->payload, f->payload_len, &r) &&
                   r.id == id && !fired_squats(s, id)) {
            if (j)
                fired_in_memory(j, &r);
            else
                fired_cold(s, id, &r);
        } else if (!j) {
            tbd_unreadable(s, f->key, f->key_len,
                           "fired, not a job record of its key: left in the "
                           "store");
        }
        free(f);
    }
}

/* The queries the store answered: takeovers (live.c). */
void tbd_query_done(struct server *s, struct tbd_query *q)
{
    for (struct tbd_query *nx; q; q = nx) {
        nx = q->next;
        tbd_takeover_done(s, q);
        free(q->nodes);
        free(q->hits);
        free(q);
    }
}
