/* SPDX-License-Identifier: MIT */
/*
 * server.c - twheeld: the beanstalkd protocol on one epoll event loop.
 *
 * One thread at a time owns everything below: connections, tubes, jobs
 * and a twheel wheel (wheel.h) ticking in milliseconds of
 * CLOCK_MONOTONIC that holds every delay, TTR, reserve timeout and tube
 * pause. That is the loop's thread, but for a stand-in while it waits
 * for a slow fdatasync (-f 0: standin.c, which hands the loop over under
 * a mutex). The other threads are the durable store's (store.c,
 * store_query.c), which touch none of it. The files of twheeld and a
 * command's way through them: docs/architecture.md.
 */
#define _GNU_SOURCE
#include "tbd.h"

#include "delayq.h"

#include <sys/random.h>

static struct server the_server;

/* ---- main loop ---- */

static int listen_on(const char *addr, int port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *res;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    int rc = getaddrinfo(addr, ps, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "twheeld: %s: %s\n", addr ? addr : "*",
                gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    0);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0)
            break;
        close(fd);
        fd = -1;
    }
    if (fd < 0)
        fprintf(stderr, "twheeld: cannot listen on %s:%d: %s\n",
                addr ? addr : "*", port, strerror(errno));
    freeaddrinfo(res);
    return fd;
}

static void report_port(int fd, int port_fd)
{
    if (port_fd < 0)
        return;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int port = 0;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET)
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else if (ss.ss_family == AF_INET6)
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    dprintf(port_fd, "%d\n", port);
    close(port_fd);
}

/* s->server_id: 16 hex digits from /dev/urandom (zeros without it). */
/*
 * The start of this server's write tokens (tbd_new_token()): random, so
 * that no two servers, nor two runs of one, issue the same sequence (a
 * shared token would let one server's conditional write pass for
 * another's). Without getrandom(2): the clocks, the pid and the node.
 */
static void seed_tokens(struct server *s)
{
    uint64_t seed = 0;
    if (getrandom(&seed, sizeof(seed), 0) != (ssize_t)sizeof(seed)) {
        struct timespec a, b;
        clock_gettime(CLOCK_REALTIME, &a);
        clock_gettime(CLOCK_MONOTONIC, &b);
        seed = (uint64_t)a.tv_nsec * 0x9E3779B97F4A7C15u ^
               (uint64_t)a.tv_sec << 20 ^ (uint64_t)b.tv_nsec ^
               (uint64_t)getpid() << 40 ^ (uint64_t)s->opt->node << 52;
    }
    s->token = seed;
}

static void make_server_id(struct server *s)
{
    unsigned char rb[8] = {0};
    FILE *f = fopen("/dev/urandom", "rb");
    if (f) {
        if (fread(rb, 1, sizeof(rb), f) != sizeof(rb))
            memset(rb, 0, sizeof(rb));
        fclose(f);
    }
    for (int i = 0; i < 8; i++)
        snprintf(s->server_id + 2 * i, 3, "%02x", rb[i]);
}

/* -b or --redis: opens the store and reads the jobs back; false (said on
 * stderr) if it cannot. */
static bool open_store(struct server *s, const struct tbd_options *opt)
{
    char shown[256]; /* the URL without a password in it */
    tbd_url_redact(opt->redis ? opt->redis : "", shown, sizeof(shown));
    const char *where = opt->dir ? opt->dir : shown;
    char err[256] = "";
    int rc = tbd_store_open(&s->store, opt, err, sizeof(err));
    if (rc != 0) {
        fprintf(stderr, "twheeld: cannot open %s: %s%s%s\n", where,
                tw_strerror(rc), err[0] ? ": " : "", err);
        return false;
    }
    if (opt->redis)
        tbd_live_wait(s);
    rc = tbd_recover_all(s, where);
    if (rc != 0) {
        fprintf(stderr, "twheeld: cannot read the jobs back from %s: %s\n",
                where, tw_strerror(rc));
        tbd_store_close(s->store);
        return false;
    }
    return true;
}

/* The listeners (commands, and --metrics-port); false if one fails. */
static bool open_listeners(struct server *s, const struct tbd_options *opt)
{
    s->lfd = listen_on(opt->addr, opt->port);
    if (s->lfd < 0) {
        tbd_store_close(s->store);
        return false;
    }
    s->mfd = -1;
    if (opt->metrics_port >= 0) {
        s->mfd = listen_on(opt->addr, opt->metrics_port);
        if (s->mfd < 0) {
            close(s->lfd);
            tbd_store_close(s->store);
            return false;
        }
        report_port(s->mfd, opt->metrics_port_fd);
    }
    report_port(s->lfd, opt->port_fd);
    return true;
}

/* What an epoll event's data.ptr points at, besides a connection (and a
 * /metrics connection, tagged with bit 0). */
static int tag_listen, tag_signal, tag_store, tag_metrics, tag_standin;

static void epoll_setup(struct server *s, const sigset_t *ss)
{
    s->sfd = signalfd(-1, ss, SFD_NONBLOCK | SFD_CLOEXEC);
    s->ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &tag_listen};
    epoll_ctl(s->ep, EPOLL_CTL_ADD, s->lfd, &e);
    if (s->mfd >= 0) {
        e.data.ptr = &tag_metrics;
        epoll_ctl(s->ep, EPOLL_CTL_ADD, s->mfd, &e);
    }
    e.data.ptr = &tag_signal;
    epoll_ctl(s->ep, EPOLL_CTL_ADD, s->sfd, &e);
    if (s->store) {
        e.data.ptr = &tag_store;
        epoll_ctl(s->ep, EPOLL_CTL_ADD, tbd_store_fd(s->store), &e);
    }
}

/* The signals: SIGUSR1 drains, the others stop (*running = false). */
static void signals_read(struct server *s, bool *running)
{
    struct signalfd_siginfo si;
    while (read(s->sfd, &si, sizeof(si)) == sizeof(si)) {
        if (si.ssi_signo == SIGUSR1) {
            s->draining = true;
            tbd_logv(s, 0, "draining: put answers DRAINING");
        } else {
            *running = false;
        }
    }
}

static void conn_event(struct conn *c, uint32_t events)
{
    if (c->closed)
        return;
    if (events & (EPOLLERR | EPOLLHUP) && !(events & EPOLLIN)) {
        tbd_conn_close(c);
        return;
    }
    if (events & EPOLLOUT)
        tbd_conn_pump(c);
    if (!c->closed && (events & (EPOLLIN | EPOLLHUP)))
        tbd_conn_readable(c);
}

static void event(struct server *s, const struct epoll_event *ev)
{
    void *p = ev->data.ptr;
    if (p == &tag_listen) {
        tbd_conn_accept(s);
    } else if (p == &tag_metrics) {
        tbd_metrics_accept(s);
    } else if ((uintptr_t)p & 1u) {
        tbd_mconn_event((struct mconn *)((uintptr_t)p & ~(uintptr_t)1),
                        ev->events);
    } else if (p == &tag_signal) {
        signals_read(s, &s->running);
    } else if (p == &tag_standin) {
        tbd_standin_woken(s);
    } else if (p == &tag_store) {
        /* The stand-in leaves the completions to the loop's thread
         * (standin.c). */
        if (s->standin_on)
            tbd_store_ack(s->store);
        else
            tbd_store_completions(s, tbd_store_take(s->store));
        tbd_fired_jobs(s);
        tbd_query_done(s, tbd_store_take_queries(s->store));
    } else {
        conn_event(p, ev->events);
    }
}

/* The stand-in's turns wait for events this long at most (standin.c). */
#define STANDIN_POLL_MS 10

void tbd_turn(struct server *s)
{
    struct epoll_event evs[256];
    uint64_t now = tbd_mono_ms();
    uint64_t to = tw_wheel_timeout(s->wheel, now);
    int timeout = to == TW_WHEEL_NO_TIMEOUT ? -1 : to > 60000 ? 60000 : (int)to;
    if (s->queue_dirty || (s->store && tbd_store_pending_inline(s->store)))
        timeout = 0;
    if (s->standin_on && (timeout < 0 || timeout > STANDIN_POLL_MS))
        timeout = STANDIN_POLL_MS;
    int n = epoll_wait(s->ep, evs, 256, timeout);
    if (n < 0 && errno != EINTR) {
        perror("twheeld: epoll_wait");
        s->running = false;
        return;
    }
    tbd_live_check(s); /* before any event: a pause may have fenced it */
    tw_wheel_advance(s->wheel, tbd_mono_ms());
    /* -f 0: this iteration's writes in one batch on this thread, with no
     * hand-off (store.c); not the stand-in's. */
    bool held = n > 0 && s->store && !s->standin_on;
    if (held)
        tbd_store_hold(s->store);
    for (int i = 0; i < n; i++)
        event(s, &evs[i]);
    if (held)
        tbd_store_completions(s, tbd_store_run_held(s->store));
    for (int round = 0; round < 2; round++) {
        if (s->queue_dirty)
            tbd_process_queue(s);
        /* Inline writes: this iteration's batch, then its replies
         * (which may run held-back commands: one more round). */
        if (s->store && tbd_store_pending_inline(s->store))
            tbd_store_completions(s, tbd_store_run_inline(s->store));
        tbd_repump(s);
    }
    tbd_reap(s);
}

static void loop(struct server *s)
{
    /* -f 0 on the journal: a stand-in for the slow fdatasyncs. */
    if (s->opt->dir && s->opt->fsync_ms == 0 &&
        !tbd_standin_start(s, &tag_standin))
        tbd_logv(s, 0,
                 "no stand-in thread: a slow fdatasync stops the "
                 "loop while it runs");
    s->running = true;
    while (s->running)
        tbd_turn(s);
    tbd_standin_stop(s);
}

int tbd_serve(const struct tbd_options *opt)
{
    struct server *s = &the_server;
    s->opt = opt;
    s->started_mono = tbd_mono_ms();
    /* Blocked before any thread starts (the store's), so that only the
     * signalfd sees them. */
    sigset_t ss;
    sigemptyset(&ss);
    sigaddset(&ss, SIGINT);
    sigaddset(&ss, SIGTERM);
    sigaddset(&ss, SIGUSR1);
    sigprocmask(SIG_BLOCK, &ss, NULL);
    signal(SIGPIPE, SIG_IGN);

    uname(&s->uts);
    make_server_id(s);
    seed_tokens(s);
    s->jcap = 1024;
    s->jobs = calloc(s->jcap, sizeof(*s->jobs));
    if (!s->jobs || tbd_dq_new(&s->dq) != 0 ||
        tw_wheel_create(&s->wheel, NULL, tbd_mono_ms()) != 0) {
        fputs("twheeld: out of memory\n", stderr);
        return 1;
    }
    s->default_tube = tbd_tube_get(s, "default", 7);
    s->next_id = ((uint64_t)opt->node << NODE_SHIFT) + 1;
    s->id_mark = s->next_id - 1;
    if ((opt->dir || opt->redis) && !open_store(s, opt))
        return 1;
    if (opt->redis) {
        tw_timer_init(&s->live_timer, tbd_live_fn, s);
        tw_wheel_add(s->wheel, &s->live_timer,
                     tw_wheel_now(s->wheel) + LIVE_RENEW_MS);
    }
    if (!open_listeners(s, opt))
        return 1;
    epoll_setup(s, &ss);
    loop(s);
    tbd_logv(s, 0, "shutting down");
    close(s->lfd);
    if (s->mfd >= 0)
        close(s->mfd);
    /* Flush the store: every acknowledged write stays. */
    tbd_store_close(s->store);
    free(s->take_wait);
    return 0;
}
