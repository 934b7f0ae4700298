/* SPDX-License-Identifier: MIT */
/*
 * reserve.c - twheeld: reserving: the waiting list, TTR and reserve timeouts.
 */
#define _GNU_SOURCE
#include "tbd.h"

/* ---- reserving ---- */

void tbd_waiting_remove(struct conn *c)
{
    struct server *s = c->srv;
    if (!c->waiting)
        return;
    c->waiting = false;
    tw_wheel_cancel(s->wheel, &c->wait_timer);
    if (c->w_prev)
        c->w_prev->w_next = c->w_next;
    else
        s->w_head = c->w_next;
    if (c->w_next)
        c->w_next->w_prev = c->w_prev;
    else
        s->w_tail = c->w_prev;
    c->w_next = c->w_prev = NULL;
    s->waiting--;
    for (size_t i = 0; i < c->nwatch; i++)
        c->watch[i]->waiting--;
    /* The commands pipelined behind the reserve run once its reply is
     * out (tbd_repump()). */
    if (!c->closed && !c->repump && c->in && c->in_off < c->in_len) {
        c->repump = true;
        c->rp_next = s->repump;
        s->repump = c;
    }
}

void tbd_reply_job(struct conn *c, const char *word, struct job *j)
{
    /* A peek at a delayed or buried job whose body is in the store. */
    char *tmp = j->body ? NULL : tbd_body_from_store(j);
    if (!j->body && !tmp) {
        tbd_reply(c, "INTERNAL_ERROR\r\n");
        return;
    }
    tbd_replyf(c, "%s %" PRIu64 " %u\r\n", word, j->id, j->body_len);
    tbd_reply_raw(c, j->body ? j->body : tmp, (size_t)j->body_len + 2);
    free(tmp);
}

/* Starts (or restarts) @j's TTR: first the DEADLINE_SOON point, then
 * the deadline itself (tbd_job_timer_fn()). */
void tbd_arm_ttr(struct job *j, uint64_t now)
{
    struct server *s = j->tube->srv;
    j->deadline = now + (uint64_t)j->ttr_s * 1000u;
    j->soon_phase = (uint64_t)j->ttr_s * 1000u > SAFETY_MS;
    tw_wheel_add(s->wheel, &j->timer,
                 j->soon_phase ? j->deadline - SAFETY_MS : j->deadline);
}

/*
 * Redis: the record of a reserved job is due TTR + TAKEOVER_GRACE_MS
 * from now (a ready job, to whichever server the store hands it), so that
 * when this server dies the job comes back ready on another. While it
 * lives, this server releases the job at its TTR and writes it back
 * undated (ttr_ended()), well before the grace runs out; a touch dates it
 * again.
 */
#define TAKEOVER_GRACE_MS 2000

/* The lease record of reserved job @j: ready, due TTR + the grace from
 * now. Failed, it leaves the job reserved here (logged): only a takeover
 * after a crash is lost, so its reply stands (but for a fenced one). */
static struct tbd_write *lease_record(struct conn *c, struct job *j)
{
    struct tbd_write *w = tbd_job_write(j, J_READY, c);
    w->due_ms = tbd_wall_ms() + (int64_t)j->ttr_s * 1000 + TAKEOVER_GRACE_MS;
    w->keep_reply = true;
    j->timed = true;
    return w;
}

void tbd_lease_write(struct conn *c, struct job *j, const char *text)
{
    tbd_submit(j->tube->srv, c, lease_record(c, j), text);
}

/* Redis: a job in memory whose record may fire on another server (a
 * reserved job's, after tbd_lease_write()) is written back undated. */
void tbd_job_undate(struct job *j)
{
    struct server *s = j->tube->srv;
    if (s->opt->redis && s->store && j->timed)
        tbd_submit(s, NULL, tbd_job_write(j, J_READY, NULL), NULL);
}

/*
 * --redis: the reply to a reserve (@how) of @j, held in @c's output until
 * its lease is in Redis, with the body; the commands behind it wait
 * (c->leasing). The lease is fenced (bridge.c): refused, the job was
 * another server's already, and tbd_lease_done() takes the reply back.
 */
static void lease_reserved(struct conn *c, struct job *j, int how)
{
    struct server *s = j->tube->srv;
    char head[48];
    int n = snprintf(head, sizeof(head), "RESERVED %" PRIu64 " %u\r\n", j->id,
                     j->body_len);
    size_t len = (size_t)n + j->body_len + 2;
    struct out *o = tbd_out_new(len < 32 ? 32 : len);
    memcpy(o->data, head, (size_t)n);
    memcpy(o->data + n, j->body, (size_t)j->body_len + 2);
    o->len = len;
    o->ready = false;
    tbd_out_link(c, o);
    c->out_bytes += len;
    struct tbd_write *w = lease_record(c, j);
    w->reserving = (uint8_t)how;
    w->tag = (uint64_t)(uintptr_t)o;
    c->leasing = true;
    tbd_submit(s, c, w, NULL);
}

/*
 * The lease write @w of @c's reserve came back; @o holds its reply. When
 * it was fenced (the job is gone from here: another server has it) the
 * reply goes: a reserve-job is NOT_FOUND, a reserve is made again with
 * what is left of its timeout. Then the commands behind it run.
 */
void tbd_lease_done(struct conn *c, struct out *o, const struct tbd_write *w,
                    bool fenced)
{
    struct server *s = c->srv;
    c->leasing = false;
    o->ready = true;
    if (!fenced || c->closed)
        return;
    c->out_bytes -= o->len;
    o->len = 0;
    if (w->reserving == RSV_BY_ID) {
        memcpy(o->data, "NOT_FOUND\r\n", 11);
        o->len = 11;
        c->out_bytes += o->len;
        return;
    }
    int64_t left = c->rsv_timeout_ms;
    if (left > 0) {
        left -= (int64_t)(tw_wheel_now(s->wheel) - c->rsv_start);
        left = left > 0 ? left : 0;
    }
    tbd_cmd_reserve(c, left);
}

void tbd_reserve_job(struct conn *c, struct job *j, uint64_t now, int how)
{
    struct server *s = j->tube->srv;
    tbd_job_unlink(j);
    j->state = J_RESERVED;
    s->counts[J_RESERVED]++;
    j->reserver = c;
    j->reserves++;
    j->tube->nreserved++;
    tbd_jl_push(&c->reserved, j);
    tbd_arm_ttr(j, now);
    if (!s->opt->redis || !s->store || !tbd_job_load_body(j)) {
        tbd_reply_job(c, "RESERVED", j);
        return;
    }
    /* Redis: RESERVED goes once the lease is in Redis, so a job whose
     * RESERVED reached a worker comes back on another server if this one
     * dies. */
    lease_reserved(c, j, how);
}

/* The best ready job of the unpaused tubes @c watches. */
struct job *tbd_conn_candidate(struct conn *c)
{
    struct job *best = NULL;
    for (size_t i = 0; i < c->nwatch; i++) {
        struct tube *t = c->watch[i];
        if (!t->nready || tbd_tube_paused(t))
            continue;
        if (!best || tbd_job_less(t->heap[0], best))
            best = t->heap[0];
    }
    return best;
}

bool tbd_conn_deadline_soon(struct conn *c, uint64_t now)
{
    for (struct job *j = c->reserved.head; j; j = j->l_next)
        if (now + SAFETY_MS >= j->deadline)
            return true;
    return false;
}

/* Gives ready jobs to waiting connections, oldest waiter first. */
void tbd_process_queue(struct server *s)
{
    s->queue_dirty = false;
    uint64_t now = tw_wheel_now(s->wheel);
    for (struct conn *c = s->w_head, *nx; c && s->nready_total; c = nx) {
        nx = c->w_next;
        struct job *j = tbd_conn_candidate(c);
        if (!j)
            continue;
        tbd_waiting_remove(c);
        tbd_reserve_job(c, j, now, RSV_ANY);
        tbd_conn_flush(c);
    }
}

void tbd_wait_timeout_fn(tw_timer *tm, void *arg)
{
    (void)tm;
    struct conn *c = arg;
    tbd_waiting_remove(c);
    tbd_reply(c, "TIMED_OUT\r\n");
    tbd_conn_flush(c);
}

void tbd_job_timer_fn(tw_timer *tm, void *arg)
{
    (void)tm;
    struct job *j = arg;
    struct server *s = j->tube->srv;
    uint64_t now = tw_wheel_now(s->wheel);
    if (j->state == J_DELAYED) {
        if (!tbd_job_load_body(j)) { /* the store failed: try again later */
            tw_wheel_add(s->wheel, &j->timer, now + 1000);
            return;
        }
        tbd_job_unlink(j);
        tbd_job_make_ready(j);
        return;
    }
    if (j->state != J_RESERVED)
        return;
    struct conn *c = j->reserver;
    if (j->soon_phase) {
        j->soon_phase = false;
        tw_wheel_add(s->wheel, &j->timer, j->deadline);
        if (c->waiting) {
            tbd_waiting_remove(c);
            tbd_reply(c, "DEADLINE_SOON\r\n");
            tbd_conn_flush(c);
        }
        return;
    }
    (void)now;
    /* The TTR ran out: the job goes back to ready, as in beanstalkd. */
    tbd_job_unlink(j);
    j->timeouts++;
    s->job_timeouts++;
    tbd_job_make_ready(j);
    tbd_job_undate(j);
}
