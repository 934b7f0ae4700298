/* SPDX-License-Identifier: MIT */
/*
 * conn.c - twheeld: connections: replies out (in order, held for store writes)
 * and commands in.
 *
 * Memory per connection is bounded: a line is at most TBD_LINE_MAX bytes,
 * a body at most -z bytes (JOB_TOO_BIG beyond), the input buffer is
 * allocated only while it holds bytes, and a connection whose unsent
 * replies pass OUT_CAP bytes is not read from (nor are its buffered
 * commands run) until the client reads them: a client that never reads
 * costs OUT_CAP plus one reply, and TCP pushes back on it.
 */
#define _GNU_SOURCE
#include "tbd.h"

/* ---- output ---- */

struct out *tbd_out_new(size_t cap)
{
    struct out *o = tbd_xmalloc(sizeof(*o) + cap);
    o->next = NULL;
    o->len = o->off = 0;
    o->cap = cap;
    o->ready = true;
    return o;
}

void tbd_out_link(struct conn *c, struct out *o)
{
    if (c->out_tail)
        c->out_tail->next = o;
    else
        c->out_head = o;
    c->out_tail = o;
}

/* Appends bytes to the reply stream. */
void tbd_reply_raw(struct conn *c, const void *p, size_t n)
{
    if (c->closed)
        return;
    struct out *o = c->out_tail;
    if (!o || !o->ready || o->cap - o->len < n) {
        o = tbd_out_new(n > CHUNK ? n : CHUNK);
        tbd_out_link(c, o);
    }
    memcpy(o->data + o->len, p, n);
    o->len += n;
    c->out_bytes += n;
}

void tbd_reply(struct conn *c, const char *s)
{
    tbd_reply_raw(c, s, strlen(s));
}

void tbd_replyf(struct conn *c, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n > 0)
        tbd_reply_raw(c, buf,
                      (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf));
}

/* A reply that waits for a store write: its own chunk, not ready yet. */
struct out *tbd_reply_held(struct conn *c, const char *s)
{
    size_t n = strlen(s);
    struct out *o = tbd_out_new(n < 32 ? 32 : n);
    memcpy(o->data, s, n);
    o->len = n;
    o->ready = false;
    tbd_out_link(c, o);
    c->out_bytes += n;
    return o;
}

/* ---- connections ---- */

static void conn_update_events(struct conn *c)
{
    struct server *s = c->srv;
    if (c->closed)
        return;
    uint32_t ev = 0;
    /* No input while it cannot be taken: backpressure, the end of the
     * client's input, or a full buffer behind a reserve that waits (for
     * a job, or for its lease to be written). */
    if (!c->close_after_flush && !c->eof && c->out_bytes < OUT_CAP &&
        !((c->waiting || c->leasing) && c->in && c->in_len == IN_CAP))
        ev |= EPOLLIN;
    if (c->out_head && c->out_head->ready)
        ev |= EPOLLOUT;
    if (ev == c->events)
        return;
    struct epoll_event e = {.events = ev, .data.ptr = c};
    epoll_ctl(s->ep, EPOLL_CTL_MOD, c->fd, &e);
    c->events = ev;
}

static void conn_free(struct conn *c)
{
    for (struct out *o = c->out_head, *nx; o; o = nx) {
        nx = o->next;
        free(o);
    }
    free(c->in);
    free(c->watch);
    free(c);
}

void tbd_conn_close(struct conn *c)
{
    struct server *s = c->srv;
    if (c->closed)
        return;
    tbd_logv(s, 2, "close fd %d", c->fd);
    epoll_ctl(s->ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->closed = true;
    s->cur_conns--;
    if (c->producer)
        s->producers--;
    if (c->worker)
        s->workers--;
    tbd_waiting_remove(c);
    while (c->reserved.head) {
        struct job *j = c->reserved.head;
        tbd_jl_remove(&c->reserved, j);
        tw_wheel_cancel(s->wheel, &j->timer);
        j->tube->nreserved--;
        s->counts[J_RESERVED]--;
        j->reserver = NULL;
        tbd_job_make_ready(j);
        tbd_job_undate(j);
    }
    if (c->put_job) {
        tbd_job_release(s, c->put_job);
        c->put_job = NULL;
    }
    if (c->use) {
        c->use->using --;
        tbd_tube_maybe_free(c->use);
    }
    for (size_t i = 0; i < c->nwatch; i++) {
        c->watch[i]->watching--;
        tbd_tube_maybe_free(c->watch[i]);
    }
    c->use = NULL;
    c->nwatch = 0;
    /* Freed by tbd_reap() at the end of the loop iteration, never here: the
     * callers, and later events of the same epoll batch, still hold it. */
    c->dead_next = s->dead;
    s->dead = c;
}

/* Frees the closed connections whose store writes have all come back. */
void tbd_reap(struct server *s)
{
    struct conn **pp = &s->dead;
    while (*pp) {
        struct conn *c = *pp;
        if (c->pending_writes == 0) {
            *pp = c->dead_next;
            conn_free(c);
        } else {
            pp = &c->dead_next;
        }
    }
}

/* Writes what is ready; closes the connection on an error. */
/* Frees the replies at the head of @c's output that hold nothing more to
 * send (a reply taken back is empty: tbd_lease_done()). */
static void drop_sent(struct conn *c)
{
    while (c->out_head && c->out_head->ready &&
           c->out_head->off == c->out_head->len) {
        struct out *o = c->out_head;
        c->out_head = o->next;
        if (!c->out_head)
            c->out_tail = NULL;
        free(o);
    }
}

void tbd_conn_flush(struct conn *c)
{
    for (;;) {
        drop_sent(c); /* the head, if any, has bytes to send */
        if (c->closed || !c->out_head || !c->out_head->ready)
            break;
        struct iovec iov[64];
        int n = 0;
        for (struct out *o = c->out_head; o && o->ready && n < 64;
             o = o->next) {
            iov[n].iov_base = o->data + o->off;
            iov[n].iov_len = o->len - o->off;
            n++;
        }
        ssize_t w = writev(c->fd, iov, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            tbd_conn_close(c);
            return;
        }
        c->out_bytes -= (size_t)w;
        while (w > 0) {
            struct out *o = c->out_head;
            size_t left = o->len - o->off;
            if ((size_t)w < left) {
                o->off += (size_t)w;
                break;
            }
            w -= (ssize_t)left;
            c->out_head = o->next;
            if (!c->out_head)
                c->out_tail = NULL;
            free(o);
        }
    }
    if (c->closed)
        return;
    if (c->close_after_flush && !c->out_head && c->pending_writes == 0) {
        tbd_conn_close(c);
        return;
    }
    conn_update_events(c);
}

/* ---- input ---- */

/* Finds "\r\n" in [p, p + n); its offset or -1. */
static long find_crlf(const char *p, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++) {
        const char *r = memchr(p + i, '\r', n - 1 - i);
        if (!r)
            return -1;
        i = (size_t)(r - p);
        if (p[i + 1] == '\n')
            return (long)i;
    }
    return -1;
}

/*
 * The rest of a line longer than TBD_LINE_MAX, as beanstalkd drops it: in
 * chunks of TBD_LINE_MAX bytes, each searched for "\r\n" on its own (an
 * end of line split between two chunks is not seen); at the first one
 * found, BAD_FORMAT, and what follows it is the next command.
 */
static int in_discard(struct conn *c, const char *p, size_t avail)
{
    size_t room = TBD_LINE_MAX - c->disc_got;
    size_t k = avail < room ? avail : room;
    long e = c->disc_cr && p[0] == '\n' ? -2 : find_crlf(p, k);
    if (e != -1) {
        c->in_off += e == -2 ? 1 : (size_t)e + 2;
        c->in_state = IN_LINE;
        tbd_reply(c, "BAD_FORMAT\r\n");
        return 1;
    }
    c->in_off += k;
    c->disc_got = (uint16_t)(c->disc_got + k);
    c->disc_cr = p[k - 1] == '\r';
    if (c->disc_got == TBD_LINE_MAX) {
        c->disc_got = 0;
        c->disc_cr = false;
    }
    return 1;
}

/* Input in a state other than IN_LINE: skips, discards or takes body
 * bytes from the @avail at @p. 1: go on, -1: wait for more input, 0: in
 * IN_LINE (nothing done). */
static int in_nonline(struct conn *c, char *p, size_t avail)
{
    if (c->in_state == IN_SKIP) {
        size_t k = avail < c->skip_left ? avail : (size_t)c->skip_left;
        c->skip_left -= k;
        c->in_off += k;
        if (c->skip_left == 0) {
            c->in_state = IN_LINE;
            if (c->skip_reply)
                tbd_reply(c, c->skip_reply);
            c->skip_reply = NULL;
        }
        return 1;
    }
    if (c->in_state == IN_DISCARD)
        return in_discard(c, p, avail);
    if (c->in_state == IN_BODY) {
        struct job *j = c->put_job;
        size_t need = (size_t)j->body_len + 2 - c->body_got;
        size_t k = avail < need ? avail : need;
        memcpy(j->body + c->body_got, p, k);
        c->body_got += k;
        c->in_off += k;
        if (c->body_got == (size_t)j->body_len + 2)
            tbd_put_finish(c);
        return 1;
    }
    return 0;
}

/* Frees the input buffer once empty, else moves what is left to its
 * start. */
static void in_compact(struct conn *c)
{
    if (c->in_off == c->in_len) {
        c->in_off = c->in_len = 0;
        free(c->in);
        c->in = NULL;
    } else if (c->in_off > 0) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
}

/* Runs the buffered input as far as backpressure allows. */
static void conn_process(struct conn *c)
{
    while (!c->closed && !c->close_after_flush && !c->waiting && !c->leasing &&
           c->out_bytes < OUT_CAP && c->in_off < c->in_len) {
        char *p = c->in + c->in_off;
        size_t avail = c->in_len - c->in_off;
        int st = in_nonline(c, p, avail);
        if (st > 0)
            continue;
        if (st < 0)
            break;
        long e = find_crlf(p, avail < TBD_LINE_MAX ? avail : TBD_LINE_MAX);
        if (e < 0) {
            if (avail >= TBD_LINE_MAX) {
                /* No end of line within the longest line: as beanstalkd,
                 * its first TBD_LINE_MAX bytes go, and the rest up to an
                 * end of line, then BAD_FORMAT (in_discard()). */
                c->in_state = IN_DISCARD;
                c->in_off += TBD_LINE_MAX;
                c->disc_got = 0;
                c->disc_cr = false;
                continue;
            }
            break;
        }
        struct tbd_cmd cmd;
        tbd_parse(p, (size_t)e, &cmd);
        c->in_off += (size_t)e + 2;
        tbd_run_command(c, &cmd);
    }
    if (c->closed)
        return;
    in_compact(c);
    /* The client shut its side: once every command it sent has run (a
     * partial one never will), the connection closes after its replies,
     * as beanstalkd's does. */
    if (c->eof && !c->waiting && !c->leasing && c->out_bytes < OUT_CAP)
        c->close_after_flush = true;
}

/*
 * Runs buffered commands and writes replies until neither moves: once a
 * flush makes room, commands held back by backpressure run without
 * waiting for more input (which may never come).
 */
void tbd_conn_pump(struct conn *c)
{
    for (;;) {
        size_t in_before = c->in_len - c->in_off;
        size_t out_before = c->out_bytes;
        if (c->in)
            conn_process(c);
        if (c->closed)
            return;
        tbd_conn_flush(c);
        if (c->closed || !c->in || c->in_len == c->in_off ||
            c->out_bytes >= OUT_CAP)
            return;
        /* Stop when neither the input nor the output moved. */
        if (c->in_len - c->in_off == in_before && c->out_bytes >= out_before)
            return;
    }
}

/* The client shut its side. A reserve that waits ends (TIMED_OUT, as
 * beanstalkd), and the commands already read still run (conn_process()). */
static void conn_eof(struct conn *c)
{
    c->eof = true;
    if (c->waiting) {
        tbd_waiting_remove(c);
        tbd_reply(c, "TIMED_OUT\r\n");
    }
    conn_process(c);
}

/* Runs the commands held behind the reserves that ended since the last
 * call (tbd_waiting_remove()), once the job queue is processed. */
void tbd_repump(struct server *s)
{
    while (s->repump) {
        struct conn *c = s->repump;
        s->repump = c->rp_next;
        c->repump = false;
        if (!c->closed)
            tbd_conn_pump(c);
    }
}

void tbd_conn_readable(struct conn *c)
{
    for (int rounds = 0; rounds < 4 && !c->closed; rounds++) {
        if (c->close_after_flush || c->out_bytes >= OUT_CAP)
            break;
        if (!c->in) {
            c->in = malloc(IN_CAP);
            if (!c->in) {
                tbd_conn_close(c);
                return;
            }
        }
        size_t room = IN_CAP - c->in_len;
        if (room == 0)
            break;
        ssize_t r = read(c->fd, c->in + c->in_len, room);
        if (r == 0) {
            conn_eof(c);
            break;
        }
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                tbd_conn_close(c);
            else
                conn_process(c);
            break;
        }
        c->in_len += (size_t)r;
        conn_process(c);
        if ((size_t)r < room)
            break;
    }
    if (!c->closed) {
        if (c->in && c->in_len == 0) {
            free(c->in);
            c->in = NULL;
        }
        tbd_conn_pump(c);
    }
}

void tbd_conn_accept(struct server *s)
{
    for (int i = 0; i < 256; i++) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                tbd_logv(s, 1, "accept: %s", strerror(errno));
            return;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        struct conn *c = calloc(1, sizeof(*c));
        struct tube **w = malloc(sizeof(*w));
        if (!c || !w) {
            free(c);
            free(w);
            close(fd);
            continue;
        }
        c->fd = fd;
        c->srv = s;
        c->watch = w;
        c->watch[0] = s->default_tube;
        c->nwatch = 1;
        s->default_tube->watching++;
        tbd_conn_use(c, s->default_tube);
        tw_timer_init(&c->wait_timer, tbd_wait_timeout_fn, c);
        c->events = EPOLLIN;
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &e) != 0) {
            close(fd);
            free(w);
            s->default_tube->watching--;
            s->default_tube->using --;
            free(c);
            continue;
        }
        s->cur_conns++;
        s->total_conns++;
        tbd_logv(s, 2, "accept fd %d", fd);
    }
}
