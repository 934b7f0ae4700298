/* SPDX-License-Identifier: MIT */
/*
 * metrics.c - twheeld: the /metrics HTTP server (--metrics-port).
 */
#define _GNU_SOURCE
#include "tbd.h"

#include "delayq.h"

/* ---- /metrics (--metrics-port) ---- */

/*
 * A minimal HTTP/1.x endpoint on the event loop: one request per
 * connection (GET /metrics, the Prometheus text format 0.0.4), then the
 * connection is closed. At most MCONN_MAX connections at once (more are
 * closed at accept), each closed after MCONN_MS whatever it has sent, a
 * request of more than MCONN_IN bytes answered 431: a scraper that stalls
 * or floods costs a bounded buffer and never blocks the loop.
 */
#define MCONN_MAX 16
#define MCONN_MS 5000
#define MCONN_IN 2048

struct mconn {
    int fd;
    tw_timer timer;
    size_t in_len, out_len, out_off;
    char *out;
    char in[MCONN_IN];
    struct server *srv; /* its server */
};

static void mconn_close(struct mconn *m)
{
    struct server *s = m->srv;
    tw_wheel_cancel(s->wheel, &m->timer);
    close(m->fd);
    free(m->out);
    free(m);
    s->nmconn--;
}

/* Its time is up: the next event (a hang-up now) closes it; not freed
 * here, as this iteration's events may still name it. */
static void mconn_timeout(tw_timer *t, void *arg)
{
    (void)t;
    shutdown(((struct mconn *)arg)->fd, SHUT_RDWR);
}

/* The store's part of /metrics (with a store). */
static void metrics_store(struct server *s, char **bp, size_t *np, size_t *capp)
{
    char *b = *bp;
    size_t n = *np, cap = *capp;
    uint64_t written, batches, jbytes;
    tbd_store_counts(s->store, &written, &batches, &jbytes);
    tbd_yaml_add(&b, &n, &cap,
                 "# HELP twheeld_store_writes_total Job records written to the "
                 "store.\n# TYPE twheeld_store_writes_total counter\n"
                 "twheeld_store_writes_total %" PRIu64
                 "\n# HELP twheeld_store_batches_total Batches they were "
                 "written in.\n# TYPE twheeld_store_batches_total counter\n"
                 "twheeld_store_batches_total %" PRIu64
                 "\n# HELP twheeld_store_unreadable_total Records read from "
                 "the store that are not what twheeld writes, skipped or "
                 "removed.\n# TYPE twheeld_store_unreadable_total counter\n"
                 "twheeld_store_unreadable_total %" PRIu64 "\n",
                 written, batches, s->unreadable);
    long k = tbd_store_metrics(s->store, b + n, cap - n);
    if (k >= 0 && (size_t)k >= cap - n) {
        cap = n + (size_t)k + 1;
        b = realloc(b, cap);
        if (!b)
            abort();
        k = tbd_store_metrics(s->store, b + n, cap - n);
    }
    if (k >= 0 && (size_t)k < cap - n)
        n += (size_t)k;
    *bp = b;
    *np = n;
    *capp = cap;
}

/* twheeld's counters, then the store's (tw_durable_metrics()). */
static char *metrics_text(struct server *s, size_t *len)
{
    size_t n, cap;
    char *b;
    tbd_yaml_begin(&b, &n, &cap); /* a growing text, as for the YAML replies */
    tbd_yaml_add(
        &b, &n, &cap,
        "# HELP twheeld_jobs Jobs by state.\n# TYPE twheeld_jobs gauge\n");
    for (int i = 0; i < 4; i++)
        tbd_yaml_add(&b, &n, &cap, "twheeld_jobs{state=\"%s\"} %" PRIu64 "\n",
                     state_name[i],
                     i == J_DELAYED ? tbd_dq_total(s->dq) : s->counts[i]);
    tbd_yaml_add(
        &b, &n, &cap,
        "# HELP twheeld_bodies_in_memory Job bodies held in memory (the "
        "other jobs' bodies are read from the store when needed).\n"
        "# TYPE twheeld_bodies_in_memory gauge\n"
        "twheeld_bodies_in_memory %" PRIu64 "\n",
        s->bodies);
    tbd_yaml_add(
        &b, &n, &cap,
        "# HELP twheeld_jobs_total Jobs put since start.\n"
        "# TYPE twheeld_jobs_total counter\ntwheeld_jobs_total %" PRIu64
        "\n# HELP twheeld_job_timeouts_total Reserved jobs whose TTR ran "
        "out.\n# TYPE twheeld_job_timeouts_total counter\n"
        "twheeld_job_timeouts_total %" PRIu64 "\n",
        s->total_jobs, s->job_timeouts);
    tbd_yaml_add(
        &b, &n, &cap,
        "# HELP twheeld_connections Open client connections.\n"
        "# TYPE twheeld_connections gauge\ntwheeld_connections %" PRIu64
        "\n# HELP twheeld_connections_total Client connections accepted.\n"
        "# TYPE twheeld_connections_total counter\n"
        "twheeld_connections_total %" PRIu64 "\n",
        s->cur_conns, s->total_conns);
    tbd_yaml_add(&b, &n, &cap,
                 "# HELP twheeld_commands_total Commands by name.\n"
                 "# TYPE twheeld_commands_total counter\n");
    for (int op = 0; op < TBD_OP_COUNT; op++)
        tbd_yaml_add(&b, &n, &cap,
                     "twheeld_commands_total{cmd=\"%s\"} %" PRIu64 "\n",
                     tbd_op_name(op), s->cmd[op]);
    if (s->store)
        metrics_store(s, &b, &n, &cap);
    *len = n;
    return b;
}

/* Answers the request in m->in (complete or too long). */
static void mconn_answer(struct mconn *m, bool too_long)
{
    struct server *s = m->srv;
    const char *status = "200 OK";
    size_t blen = 0;
    char *body = NULL;
    if (too_long) {
        status = "431 Request Header Fields Too Large";
    } else if (!strncmp(m->in, "GET /metrics ", 13) ||
               !strncmp(m->in, "GET /metrics?", 13)) {
        body = metrics_text(s, &blen);
    } else if (!strncmp(m->in, "GET ", 4) || !strncmp(m->in, "HEAD ", 5)) {
        status = "404 Not Found";
    } else {
        status = "405 Method Not Allowed";
    }
    char head[256];
    int hl = snprintf(head, sizeof(head),
                      "HTTP/1.1 %s\r\nContent-Type: text/plain; "
                      "version=0.0.4; charset=utf-8\r\nContent-Length: "
                      "%zu\r\nConnection: close\r\n\r\n",
                      status, blen);
    m->out = tbd_xmalloc((size_t)hl + blen);
    memcpy(m->out, head, (size_t)hl);
    if (blen)
        memcpy(m->out + hl, body, blen);
    free(body);
    m->out_len = (size_t)hl + blen;
    m->out_off = 0;
    struct epoll_event e = {.events = EPOLLOUT,
                            .data.ptr = (void *)((uintptr_t)m | 1u)};
    epoll_ctl(s->ep, EPOLL_CTL_MOD, m->fd, &e);
}

void tbd_mconn_event(struct mconn *m, uint32_t events)
{
    if (!m->out) {
        ssize_t r = read(m->fd, m->in + m->in_len, MCONN_IN - 1 - m->in_len);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
            mconn_close(m);
            return;
        }
        if (r > 0)
            m->in_len += (size_t)r;
        m->in[m->in_len] = '\0';
        if (strstr(m->in, "\r\n\r\n") || strstr(m->in, "\n\n"))
            mconn_answer(m, false);
        else if (m->in_len == MCONN_IN - 1)
            mconn_answer(m, true);
        return;
    }
    if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
        return;
    ssize_t w = write(m->fd, m->out + m->out_off, m->out_len - m->out_off);
    if (w < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (w > 0)
        m->out_off += (size_t)w;
    if (w <= 0 || m->out_off == m->out_len)
        mconn_close(m);
}

void tbd_metrics_accept(struct server *s)
{
    for (;;) {
        int fd = accept4(s->mfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        struct mconn *m = s->nmconn < MCONN_MAX ? calloc(1, sizeof(*m)) : NULL;
        if (!m) {
            close(fd);
            continue;
        }
        m->fd = fd;
        m->srv = s;
        s->nmconn++;
        tw_timer_init(&m->timer, mconn_timeout, m);
        tw_wheel_add(s->wheel, &m->timer, tw_wheel_now(s->wheel) + MCONN_MS);
        struct epoll_event e = {.events = EPOLLIN,
                                .data.ptr = (void *)((uintptr_t)m | 1u)};
        if (epoll_ctl(s->ep, EPOLL_CTL_ADD, fd, &e) != 0)
            mconn_close(m);
    }
}
