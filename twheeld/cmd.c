/* SPDX-License-Identifier: MIT */
/*
 * cmd.c - twheeld: the commands: the command table and each command's body.
 */
#define _GNU_SOURCE
#include "tbd.h"

#include "delayq.h"

/* ---- commands ---- */

void tbd_conn_use(struct conn *c, struct tube *t)
{
    t->using ++;
    struct tube *old = c->use;
    c->use = t;
    if (old) {
        old->using --;
        tbd_tube_maybe_free(old);
    }
}

static bool conn_watches(struct conn *c, struct tube *t)
{
    for (size_t i = 0; i < c->nwatch; i++)
        if (c->watch[i] == t)
            return true;
    return false;
}

/* A job @c may delete, bury or touch: reserved by @c. */
static struct job *reserved_by(struct conn *c, uint64_t id)
{
    struct server *s = c->srv;
    struct job *j = tbd_job_find(s, id);
    return j && j->state == J_RESERVED && j->reserver == c ? j : NULL;
}

void tbd_cmd_reserve(struct conn *c, int64_t timeout_ms)
{
    struct server *s = c->srv;
    if (!c->worker) {
        c->worker = true;
        s->workers++;
    }
    uint64_t now = tw_wheel_now(s->wheel);
    c->rsv_timeout_ms = timeout_ms;
    c->rsv_start = now;
    struct job *j = tbd_conn_candidate(c);
    if (j) {
        tbd_reserve_job(c, j, now, RSV_ANY);
        return;
    }
    if (tbd_conn_deadline_soon(c, now)) {
        tbd_reply(c, "DEADLINE_SOON\r\n");
        return;
    }
    if (timeout_ms == 0 || c->eof) { /* eof: as beanstalkd, no wait */
        tbd_reply(c, "TIMED_OUT\r\n");
        return;
    }
    c->waiting = true;
    c->w_next = NULL;
    c->w_prev = s->w_tail;
    if (s->w_tail)
        s->w_tail->w_next = c;
    else
        s->w_head = c;
    s->w_tail = c;
    s->waiting++;
    for (size_t i = 0; i < c->nwatch; i++)
        c->watch[i]->waiting++;
    if (timeout_ms > 0)
        tw_wheel_add(s->wheel, &c->wait_timer, now + (uint64_t)timeout_ms);
}

void tbd_put_finish(struct conn *c)
{
    struct server *s = c->srv;
    struct job *j = c->put_job;
    c->put_job = NULL;
    c->in_state = IN_LINE;
    if (memcmp(j->body + j->body_len, "\r\n", 2) != 0) {
        tbd_job_release(s, j);
        tbd_reply(c, "EXPECTED_CRLF\r\n");
        return;
    }
    j->created_wall = tbd_wall_ms();
    j->tube = c->use;
    s->total_jobs++;
    j->tube->total_jobs++;
    char text[48];
    snprintf(text, sizeof(text), "INSERTED %" PRIu64 "\r\n", j->id);
    if (j->delay_s > 0) {
        tbd_job_delay(c, j, j->delay_s, false, text);
        return;
    }
    tbd_job_table_insert(j);
    tbd_job_make_ready(j);
    tbd_store_job(c, j, text);
}

static void cmd_put(struct conn *c, const struct tbd_cmd *cmd)
{
    struct server *s = c->srv;
    if (!c->producer) {
        c->producer = true;
        s->producers++;
    }
    if (cmd->bytes > s->opt->max_job_size || s->draining) {
        /* As beanstalkd: the body is read and dropped, then the answer. */
        c->in_state = IN_SKIP;
        c->skip_left = cmd->bytes + 2;
        c->skip_reply = cmd->bytes > s->opt->max_job_size ? "JOB_TOO_BIG\r\n"
                                                          : "DRAINING\r\n";
        return;
    }
    struct job *j = tbd_job_alloc();
    char *body = j ? malloc(cmd->bytes + 2) : NULL;
    if (j && !body)
        tbd_job_release(s, j);
    if (!body) {
        c->in_state = IN_SKIP;
        c->skip_left = cmd->bytes + 2;
        c->skip_reply = "OUT_OF_MEMORY\r\n";
        return;
    }
    /* The id is used up here, as beanstalkd's: a put whose body then
     * lacks its "\r\n" (EXPECTED_CRLF) leaves a gap. */
    j->id = tbd_next_job_id(s);
    j->pri = cmd->pri;
    j->delay_s = cmd->delay;
    j->ttr_s = cmd->ttr ? cmd->ttr : 1;
    j->body_len = (uint32_t)cmd->bytes;
    j->body = body;
    s->bodies++;
    tw_timer_init(&j->timer, tbd_job_timer_fn, j);
    c->put_job = j;
    c->body_got = 0;
    c->in_state = IN_BODY;
}

void tbd_cmd_peek_reply(struct conn *c, struct job *j)
{
    if (!j)
        tbd_reply(c, "NOT_FOUND\r\n");
    else
        tbd_reply_job(c, "FOUND", j);
}

/* Kicks @j (buried or delayed) to ready; stores it. */
static bool kick_one(struct job *j)
{
    if (!tbd_job_load_body(j))
        return false;
    tbd_job_unlink(j);
    j->kicks++;
    tbd_job_make_ready(j);
    return true;
}

/*
 * The job @id as @c may delete it (any job but one another connection
 * reserved), taken out of its state; NULL when there is none. A delayed
 * job the store alone holds is in no table (*@cold; its entry is dropped).
 * When its record may fire, its key @key is claimed (*@claim): from then
 * on no delivery of it reaches tbd_fired_jobs() until its cancel is done
 * (store.c); one that came before the claim is taken first, and the job
 * is then in memory, ready.
 */
static struct job *delete_take(struct conn *c, uint64_t id, const char *key,
                               bool *cold, bool *claim, int *err)
{
    struct server *s = c->srv;
    struct job *j = tbd_job_lookup(s, id, cold, err);
    *claim = j && s->store && (*cold || j->timed);
    if (*claim) {
        tbd_store_claim(s->store, key, strlen(key));
        tbd_fired_jobs(s);
        struct job *m = *cold ? tbd_job_find(s, id) : NULL;
        if (m) { /* it fired meanwhile */
            tbd_job_free_cold(j);
            j = m;
            *cold = false;
        }
    }
    if (!j || (j->state == J_RESERVED && j->reserver != c)) {
        if (j && *cold)
            tbd_job_free_cold(j);
        if (*claim)
            tbd_store_unclaim(s->store, key, strlen(key));
        return NULL;
    }
    j->tube->cmd_delete++;
    if (*cold)
        tbd_dq_remove(s->dq, id);
    else
        tbd_job_unlink(j);
    return j;
}

void tbd_cmd_delete(struct conn *c, uint64_t id)
{
    struct server *s = c->srv;
    char key[24];
    size_t kl = (size_t)snprintf(key, sizeof(key), "j%" PRIu64, id);
    bool cold, claim;
    int err;
    struct job *j = delete_take(c, id, key, &cold, &claim, &err);
    if (!j) {
        tbd_reply(c, err ? "INTERNAL_ERROR\r\n" : "NOT_FOUND\r\n");
        return;
    }
    (void)kl;
    struct tbd_write *w = s->store ? tbd_job_cancel_write(j, c) : NULL;
    if (cold)
        tbd_job_free_cold(j);
    else
        tbd_job_free(j);
    if (!w) {
        tbd_reply(c, "DELETED\r\n");
        return;
    }
    w->unclaim = claim;
    tbd_submit(s, c, w, "DELETED\r\n");
}

/*
 * One function per command: the command table below runs them. Each takes
 * the connection, the parsed command and the wheel's time now.
 */
typedef void cmd_fn(struct conn *c, const struct tbd_cmd *cmd, uint64_t now);

static void do_put(struct conn *c, const struct tbd_cmd *cmd, uint64_t now)
{
    (void)now;
    cmd_put(c, cmd);
}

static void do_use(struct conn *c, const struct tbd_cmd *cmd, uint64_t now)
{
    struct server *s = c->srv;
    (void)now;
    struct tube *t = tbd_tube_get(s, cmd->tube, cmd->tube_len);
    if (!t) {
        tbd_reply(c, "OUT_OF_MEMORY\r\n");
        return;
    }
    tbd_conn_use(c, t);
    tbd_replyf(c, "USING %s\r\n", t->name);
}

static void do_reserve(struct conn *c, const struct tbd_cmd *cmd, uint64_t now)
{
    (void)cmd;
    (void)now;
    tbd_cmd_reserve(c, -1);
}

static void do_reserve_timeout(struct conn *c, const struct tbd_cmd *cmd,
                               uint64_t now)
{
    (void)now;
    tbd_cmd_reserve(c, (int64_t)cmd->timeout * 1000);
}

static void do_reserve_job(struct conn *c, const struct tbd_cmd *cmd,
                           uint64_t now)
{
    struct server *s = c->srv;
    bool cold;
    int err;
    struct job *j = tbd_job_lookup(s, cmd->id, &cold, &err);
    if (!j || j->state == J_RESERVED) {
        tbd_reply(c, err ? "INTERNAL_ERROR\r\n" : "NOT_FOUND\r\n");
        return;
    }
    if (!c->worker) {
        c->worker = true;
        s->workers++;
    }
    bool was_delayed = j->state == J_DELAYED;
    if (cold)
        tbd_job_warm(j);
    tbd_reserve_job(c, j, now, RSV_BY_ID);
    /* It was delayed in the store: ready after a crash (on Redis
     * tbd_reserve_job() wrote its lease). */
    if (was_delayed && s->store && !s->opt->redis)
        tbd_submit(s, c, tbd_job_write(j, J_READY, c), NULL);
}

static void do_delete(struct conn *c, const struct tbd_cmd *cmd, uint64_t now)
{
    (void)now;
    tbd_cmd_delete(c, cmd->id);
}

/* release and bury. */
static void do_release(struct conn *c, const struct tbd_cmd *cmd, uint64_t now)
{
    (void)now;
    struct job *j = reserved_by(c, cmd->id);
    if (!j) {
        tbd_reply(c, "NOT_FOUND\r\n");
        return;
    }
    tbd_job_unlink(j);
    j->pri = cmd->pri;
    if (cmd->op == TBD_BURY) {
        j->buries++;
        tbd_job_make_buried(j);
    } else {
        j->releases++;
        if (cmd->delay > 0) {
            tbd_job_delay(c, j, cmd->delay, true, "RELEASED\r\n");
            return;
        }
        tbd_job_make_ready(j);
    }
    tbd_store_job(c, j, cmd->op == TBD_BURY ? "BURIED\r\n" : "RELEASED\r\n");
}

static void do_touch(struct conn *c, const struct tbd_cmd *cmd, uint64_t now)
{
    struct server *s = c->srv;
    struct job *j = reserved_by(c, cmd->id);
    if (!j) {
        tbd_reply(c, "NOT_FOUND\r\n");
        return;
    }
    tbd_arm_ttr(j, now);
    if (s->opt->redis && s->store)
        tbd_lease_write(c, j, "TOUCHED\r\n");
    else
        tbd_reply(c, "TOUCHED\r\n");
}

static void do_watch(struct conn *c, const struct tbd_cmd *cmd, uint64_t now)
{
    struct server *s = c->srv;
    (void)now;
    struct tube *t = tbd_tube_get(s, cmd->tube, cmd->tube_len);
    if (!t) {
        tbd_reply(c, "OUT_OF_MEMORY\r\n");
        return;
    }
    if (!conn_watches(c, t)) {
        struct tube **nw = realloc(c->watch, (c->nwatch + 1) * sizeof(*nw));
        if (!nw) {
            tbd_tube_maybe_free(t);
            tbd_reply(c, "OUT_OF_MEMORY\r\n");
            return;
        }
        c->watch = nw;
        c->watch[c->nwatch++] = t;
        t->watching++;
    }
    tbd_replyf(c, "WATCHING %zu\r\n", c->nwatch);
}

static void do_ignore(struct conn *c, const struct tbd_cmd *cmd, uint64_t now)
{
    struct server *s = c->srv;
    (void)now;
    struct tube *t = tbd_tube_find(s, cmd->tube, cmd->tube_len);
    if (t && conn_watches(c, t)) {
        if (c->nwatch == 1) {
            tbd_reply(c, "NOT_IGNORED\r\n");
            return;
        }
        size_t i = 0;
        while (c->watch[i] != t)
            i++;
        memmove(&c->watch[i], &c->watch[i + 1],
                (c->nwatch - i - 1) * sizeof(c->watch[0]));
        c->nwatch--;
        t->watching--;
        tbd_tube_maybe_free(t);
    }
    tbd_replyf(c, "WATCHING %zu\r\n", c->nwatch);
}

/* The reply of a command that looked up job @j (@err from the lookup):
 * FOUND (or its stats with @stats), NOT_FOUND, or INTERNAL_ERROR when
 * the store failed; a job read back from the store (@cold) is freed. */
static void found_reply(struct conn *c, struct job *j, bool cold, int err,
                        bool stats, uint64_t now)
{
    if (!j)
        tbd_reply(c, err ? "INTERNAL_ERROR\r\n" : "NOT_FOUND\r\n");
    else if (stats)
        tbd_cmd_stats_job(c, j, now);
    else
        tbd_cmd_peek_reply(c, j);
    if (cold)
        tbd_job_free_cold(j);
}

/* peek and stats-job. */
static void do_peek(struct conn *c, const struct tbd_cmd *cmd, uint64_t now)
{
    bool cold;
    int err;
    struct job *j = tbd_job_lookup(c->srv, cmd->id, &cold, &err);
    found_reply(c, j, cold, err, cmd->op == TBD_STATS_JOB, now);
}

static void do_peek_ready(struct conn *c, const struct tbd_cmd *cmd,
                          uint64_t now)
{
    (void)cmd;
    (void)now;
    tbd_cmd_peek_reply(c, c->use->nready ? c->use->heap[0] : NULL);
}

static void do_peek_delayed(struct conn *c, const struct tbd_cmd *cmd,
                            uint64_t now)
{
    (void)cmd;
    bool cold;
    int err;
    struct job *j = tbd_delayed_first(c->use, &cold, &err);
    found_reply(c, j, cold, err, false, now);
}

static void do_peek_buried(struct conn *c, const struct tbd_cmd *cmd,
                           uint64_t now)
{
    (void)cmd;
    (void)now;
    tbd_cmd_peek_reply(c, c->use->buried.head);
}

/* Kicks @j, buried or delayed (@cold: read back from the store, in no
 * table), to ready; false (logged) if its body could not be read back. */
static bool kick_any(struct job *j, bool cold)
{
    if (cold) {
        tbd_job_warm(j);
        j->kicks++;
        return true;
    }
    return kick_one(j);
}

/* kick: the tube's buried jobs if it has any, else its delayed jobs, due
 * first first (as beanstalkd). */
static void do_kick(struct conn *c, const struct tbd_cmd *cmd, uint64_t now)
{
    struct server *s = c->srv;
    (void)now;
    struct tube *t = c->use;
    bool buried = t->buried.n > 0;
    uint32_t k = 0;
    struct tbd_write *last = NULL;
    while (k < cmd->bound) {
        bool cold = false;
        int err = 0;
        struct job *j =
            buried ? t->buried.head : tbd_delayed_first(t, &cold, &err);
        if (!j || !kick_any(j, cold))
            break; /* none left, or its body could not be read (logged) */
        k++;
        if (s->store) {
            /* Each write but the last goes at once; the reply waits
             * for the last, and writes complete in order. */
            if (last)
                tbd_submit(s, c, last, NULL);
            last = tbd_job_write(j, J_READY, c);
        }
    }
    char text[40];
    snprintf(text, sizeof(text), "KICKED %u\r\n", k);
    if (last)
        tbd_submit(s, c, last, text);
    else
        tbd_reply(c, text);
}

static void do_kick_job(struct conn *c, const struct tbd_cmd *cmd, uint64_t now)
{
    struct server *s = c->srv;
    (void)now;
    bool cold;
    int err;
    struct job *j = tbd_job_lookup(s, cmd->id, &cold, &err);
    if (!j || (j->state != J_BURIED && j->state != J_DELAYED)) {
        tbd_reply(c, err ? "INTERNAL_ERROR\r\n" : "NOT_FOUND\r\n");
        return;
    }
    if (!kick_any(j, cold)) {
        tbd_reply(c, "INTERNAL_ERROR\r\n");
        return;
    }
    tbd_store_job(c, j, "KICKED\r\n");
}

static void do_stats_tube(struct conn *c, const struct tbd_cmd *cmd,
                          uint64_t now)
{
    struct server *s = c->srv;
    struct tube *t = tbd_tube_find(s, cmd->tube, cmd->tube_len);
    if (!t)
        tbd_reply(c, "NOT_FOUND\r\n");
    else
        tbd_cmd_stats_tube(c, t, now);
}

static void do_stats(struct conn *c, const struct tbd_cmd *cmd, uint64_t now)
{
    (void)cmd;
    (void)now;
    tbd_cmd_stats(c);
}

/* list-tubes and list-tubes-watched. */
static void do_list(struct conn *c, const struct tbd_cmd *cmd, uint64_t now)
{
    (void)now;
    tbd_cmd_list(c, cmd->op);
}

static void do_list_used(struct conn *c, const struct tbd_cmd *cmd,
                         uint64_t now)
{
    (void)cmd;
    (void)now;
    tbd_replyf(c, "USING %s\r\n", c->use->name);
}

static void do_pause(struct conn *c, const struct tbd_cmd *cmd, uint64_t now)
{
    struct server *s = c->srv;
    struct tube *t = tbd_tube_find(s, cmd->tube, cmd->tube_len);
    if (!t) {
        tbd_reply(c, "NOT_FOUND\r\n");
        return;
    }
    t->cmd_pause++;
    t->pause_s = cmd->delay;
    if (cmd->delay) {
        t->pause_until = now + (uint64_t)cmd->delay * 1000u;
        tw_wheel_add(s->wheel, &t->pause_timer, t->pause_until);
    } else {
        t->pause_until = 0;
        tw_wheel_cancel(s->wheel, &t->pause_timer);
        s->queue_dirty = true;
    }
    tbd_reply(c, "PAUSED\r\n");
}

static void do_quit(struct conn *c, const struct tbd_cmd *cmd, uint64_t now)
{
    (void)cmd;
    (void)now;
    c->close_after_flush = true;
}

/* The command table: the function of each command (proto.h's ops). */
static cmd_fn *const commands[TBD_OP_COUNT] = {
    [TBD_PUT] = do_put,
    [TBD_USE] = do_use,
    [TBD_RESERVE] = do_reserve,
    [TBD_RESERVE_TIMEOUT] = do_reserve_timeout,
    [TBD_RESERVE_JOB] = do_reserve_job,
    [TBD_DELETE] = do_delete,
    [TBD_RELEASE] = do_release,
    [TBD_BURY] = do_release,
    [TBD_TOUCH] = do_touch,
    [TBD_WATCH] = do_watch,
    [TBD_IGNORE] = do_ignore,
    [TBD_PEEK] = do_peek,
    [TBD_PEEK_READY] = do_peek_ready,
    [TBD_PEEK_DELAYED] = do_peek_delayed,
    [TBD_PEEK_BURIED] = do_peek_buried,
    [TBD_KICK] = do_kick,
    [TBD_KICK_JOB] = do_kick_job,
    [TBD_STATS_JOB] = do_peek,
    [TBD_STATS_TUBE] = do_stats_tube,
    [TBD_STATS] = do_stats,
    [TBD_LIST_TUBES] = do_list,
    [TBD_LIST_TUBE_USED] = do_list_used,
    [TBD_LIST_TUBES_WATCHED] = do_list,
    [TBD_PAUSE_TUBE] = do_pause,
    [TBD_QUIT] = do_quit,
};

void tbd_run_command(struct conn *c, const struct tbd_cmd *cmd)
{
    struct server *s = c->srv;
    uint64_t now = tw_wheel_now(s->wheel);
    if (cmd->op >= 0)
        s->cmd[cmd->op]++;
    tbd_logv(s, 3, "fd %d: %s", c->fd, tbd_op_name(cmd->op));
    if (cmd->op == TBD_BAD_FORMAT)
        tbd_reply(c, "BAD_FORMAT\r\n");
    else if (cmd->op == TBD_UNKNOWN)
        tbd_reply(c, "UNKNOWN_COMMAND\r\n");
    else if (cmd->op >= 0 && cmd->op < TBD_OP_COUNT && commands[cmd->op])
        commands[cmd->op](c, cmd, now);
}
