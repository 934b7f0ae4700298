/* SPDX-License-Identifier: MIT */
/*
 * idle_server - an epoll echo server (Linux) that closes every connection
 * that has sent nothing for --idle.
 *
 * The idle timers live in one twheel core wheel inside the event loop:
 *   - every connection embeds one tw_timer (no allocation per timer);
 *   - every read that returns data re-arms it with tw_wheel_add(), an O(1)
 *     move within the wheel;
 *   - epoll_wait() sleeps exactly until tw_wheel_next_expiry(), so with no
 *     timer due the process does not wake at all (no polling tick).
 *
 * A timer's expiry tick is the first tick boundary at or after
 * last_read + idle, so a connection is never closed before it has been
 * silent for --idle, and is closed within --idle + one --tick of its last
 * read (plus the time the machine takes to schedule us).
 *
 * With --slack S the idle timer is a window (tw_wheel_add_window): it may
 * run at any tick from last_read + idle to last_read + idle + S, and the
 * wheel picks the coarsest tick boundary inside it, so timers of
 * connections that went silent at nearby times expire together and the
 * loop wakes once for them. A read that leaves the timer's tick inside the
 * new window does not move it at all. Never early; closed within --idle +
 * S (+ a tick when S is shorter than a tick).
 *
 * Usage: idle_server [--host ADDR] [--port N] [--idle DUR] [--tick DUR]
 *                    [--slack DUR] [--max-conns N] [--workers N]
 *                    [--stats DUR]
 * DUR is an integer with a unit: 250ms, 60s. The first line on stdout is
 * "listening on HOST:PORT"; then a line with the counters whenever they
 * changed (at most once per --stats), and a final line on SIGINT/SIGTERM.
 * Exit codes: 0 after a signal, 1 on a runtime failure, 2 on bad options.
 *
 * Thread safety: single-threaded by design; the wheel is owned by the loop.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <twheel/wheel.h>

#include "cli.h"

#define MAX_EVENTS 1024
#define ACCEPT_BATCH 256 /* accepts per wake-up, so reads are not starved */
#define IO_BUF 16384
#define MAX_DURATION_NS (UINT64_C(86400) * 1000000000u) /* one day */
#define MAX_WORKERS 64

/* One client. 64 bytes on LP64. */
struct conn {
    int fd;
    uint32_t out_len; /* echo bytes the peer has not taken yet */
    tw_timer idle;    /* the idle timer, embedded */
    char *out;        /* those bytes; NULL when none (the common case) */
    uint64_t last_ns; /* time of the last read that returned data */
};
_Static_assert(sizeof(void *) != 8 || sizeof(struct conn) == 64,
               "a connection is one cache line on LP64");

struct server {
    int ep, lfd, sigfd, spare_fd;
    tw_wheel *wheel;
    uint64_t t0, tick_ns, idle_ns, slack_ns, stats_ns, max_conns;
    struct conn **by_fd; /* every open connection, indexed by its fd */
    size_t by_fd_cap;
    uint64_t held, accepted, reaped, closed, refused, wakeups;
    uint64_t timer_wakeups; /* wake-ups with no socket ready: timers only */
    uint64_t rescued;       /* idle timers that found unread data: kept */
    uint64_t late_max_ns;   /* how long after last_read + idle a reap ran */
    tw_timer stats_timer;   /* prints the counters after a change */
    tw_timer resume_timer;  /* re-enables accept() after a hard failure */
    const char *tag;        /* log line prefix: "" or "w3: " */
    bool stop;
    char buf[IO_BUF];
};

static uint64_t now_tick(const struct server *s)
{
    return (cli_now_ns() - s->t0) / s->tick_ns;
}

static void print_counters(const struct server *s, const char *prefix)
{
    printf("%s%sheld=%" PRIu64 " accepted=%" PRIu64 " reaped=%" PRIu64
           " closed=%" PRIu64 " refused=%" PRIu64 " wakeups=%" PRIu64
           " reap_late_max_us=%" PRIu64 " rescued=%" PRIu64
           " timer_wakeups=%" PRIu64 "\n",
           s->tag, prefix, s->held, s->accepted, s->reaped, s->closed,
           s->refused, s->wakeups, s->late_max_ns / 1000, s->rescued,
           s->timer_wakeups);
}

/* The counters changed: print them once the --stats interval has passed. */
static void counters_changed(struct server *s)
{
    if (s->stats_ns == 0 || tw_timer_pending(&s->stats_timer))
        return;
    tw_wheel_add(s->wheel, &s->stats_timer,
                 now_tick(s) + (s->stats_ns + s->tick_ns - 1) / s->tick_ns);
}

static void on_stats(tw_timer *t, void *arg)
{
    (void)t;
    print_counters(arg, "");
}

/*
 * Re-arm @c's idle timer from a read at @now_ns. The expiry is the first
 * tick boundary at or after now + idle: never early, at most a tick late.
 * With --slack, a tick of the window up to now + idle + slack (the last
 * boundary inside it; the first tick if there is none).
 */
static void conn_touch(struct server *s, struct conn *c, uint64_t now_ns)
{
    uint64_t rel = now_ns - s->t0 + s->idle_ns;
    uint64_t due = (rel + s->tick_ns - 1) / s->tick_ns;
    uint64_t last = (rel + s->slack_ns) / s->tick_ns;

    if (last < due)
        last = due;
    c->last_ns = now_ns;
    /* Skip the move when the timer's tick is inside the new window: a
     * burst of reads in the same tick, or any read with enough slack. */
    if (tw_timer_pending(&c->idle) && tw_timer_expires(&c->idle) >= due &&
        tw_timer_expires(&c->idle) <= last)
        return;
    tw_wheel_add_window(s->wheel, &c->idle, due, last);
}

static void conn_close(struct server *s, struct conn *c)
{
    tw_wheel_cancel(s->wheel, &c->idle);
    s->by_fd[c->fd] = NULL;
    close(c->fd); /* also removes it from the epoll set */
    free(c->out);
    free(c);
    s->held--;
    counters_changed(s);
}

/*
 * The idle timer of @c expired. Data may be waiting unread all the same:
 * after a stall (the process stopped, or a long loop) more sockets may be
 * ready than one epoll_wait() returns, and the wheel is advanced after each
 * batch. Such a client did send, so it is not idle: its bytes count as a
 * read now (the loop reads them on its next round), never as silence.
 */
static void on_idle(tw_timer *t, void *arg)
{
    struct server *s = arg;
    struct conn *c = TW_CONTAINER_OF(t, struct conn, idle);
    char b;

    /* A client we stopped reading (it does not take its echo) is not
     * refreshed by what it sends: it stays subject to the reap. */
    if (c->out == NULL && recv(c->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 1) {
        s->rescued++;
        conn_touch(s, c, cli_now_ns());
        return;
    }
    uint64_t late = cli_now_ns() - (c->last_ns + s->idle_ns);

    if (late > s->late_max_ns)
        s->late_max_ns = late;
    s->reaped++;
    conn_close(s, c);
}

static int conn_watch(struct server *s, struct conn *c, int op, uint32_t ev)
{
    struct epoll_event e = {.events = ev, .data.ptr = c};
    return epoll_ctl(s->ep, op, c->fd, &e);
}

/*
 * Send what is left in c->out. While the peer does not take its echo we stop
 * reading from it (back-pressure): a client that floods without reading
 * holds one buffer, stops being refreshed and is reaped as idle.
 * Returns false if the connection was closed.
 */
static bool conn_flush(struct server *s, struct conn *c)
{
    ssize_t n = send(c->fd, c->out, c->out_len, MSG_NOSIGNAL | MSG_DONTWAIT);

    if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
            return true;
        s->closed++;
        conn_close(s, c);
        return false;
    }
    c->out_len -= (uint32_t)n;
    if (c->out_len > 0) {
        memmove(c->out, c->out + n, c->out_len);
        return true;
    }
    free(c->out);
    c->out = NULL;
    if (conn_watch(s, c, EPOLL_CTL_MOD, EPOLLIN) != 0) {
        s->closed++;
        conn_close(s, c);
        return false;
    }
    return true;
}

/* Echo @len bytes from s->buf; keep what the socket does not take. */
static void conn_echo(struct server *s, struct conn *c, size_t len)
{
    ssize_t n = send(c->fd, s->buf, len, MSG_NOSIGNAL | MSG_DONTWAIT);

    if (n < 0) {
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
            s->closed++;
            conn_close(s, c);
            return;
        }
        n = 0;
    }
    if ((size_t)n == len)
        return;
    c->out_len = (uint32_t)(len - (size_t)n);
    c->out = malloc(c->out_len);
    if (c->out == NULL || conn_watch(s, c, EPOLL_CTL_MOD, EPOLLOUT) != 0) {
        s->closed++;
        conn_close(s, c);
        return;
    }
    memcpy(c->out, s->buf + n, c->out_len);
}

static void conn_event(struct server *s, struct conn *c, uint32_t ev)
{
    ssize_t n;

    if (c->out != NULL) {
        if (ev & (EPOLLOUT | EPOLLERR | EPOLLHUP))
            conn_flush(s, c);
        return;
    }
    /* One read per wake-up: a flooding client cannot starve the others. */
    n = recv(c->fd, s->buf, sizeof s->buf, MSG_DONTWAIT);
    if (n > 0) {
        conn_touch(s, c, cli_now_ns());
        conn_echo(s, c, (size_t)n);
    } else if (n == 0 ||
               (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        s->closed++;
        conn_close(s, c);
    }
}

/* Stop accepting for one tick (the kernel has no memory or no files). */
static void accept_pause(struct server *s)
{
    struct epoll_event e = {.events = 0, .data.ptr = &s->lfd};

    if (tw_timer_pending(&s->resume_timer))
        return;
    epoll_ctl(s->ep, EPOLL_CTL_MOD, s->lfd, &e);
    tw_wheel_add(s->wheel, &s->resume_timer, now_tick(s) + 1);
}

static void on_resume(tw_timer *t, void *arg)
{
    struct server *s = arg;
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &s->lfd};

    (void)t;
    epoll_ctl(s->ep, EPOLL_CTL_MOD, s->lfd, &e);
}

/*
 * Out of descriptors: refuse one pending connection by accepting it into
 * the descriptor held in reserve and closing it at once, so the listener
 * does not stay readable forever. Returns false if that was not possible.
 */
static bool accept_refuse(struct server *s)
{
    int fd;

    if (s->spare_fd < 0)
        return false;
    close(s->spare_fd);
    fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        s->refused++;
        counters_changed(s);
    }
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    return fd >= 0;
}

static bool by_fd_reserve(struct server *s, int fd)
{
    size_t cap = s->by_fd_cap ? s->by_fd_cap : 1024;
    struct conn **t;

    if ((size_t)fd < s->by_fd_cap)
        return true;
    while (cap <= (size_t)fd)
        cap *= 2;
    t = realloc(s->by_fd, cap * sizeof *t);
    if (t == NULL)
        return false;
    memset(t + s->by_fd_cap, 0, (cap - s->by_fd_cap) * sizeof *t);
    s->by_fd = t;
    s->by_fd_cap = cap;
    return true;
}

/* Take @fd as a new connection, or refuse it. */
static void conn_open(struct server *s, int fd)
{
    struct conn *c = NULL;

    if ((s->max_conns == 0 || s->held < s->max_conns) && by_fd_reserve(s, fd) &&
        (c = calloc(1, sizeof *c)) != NULL) {
        c->fd = fd;
        tw_timer_init(&c->idle, on_idle, s);
        if (conn_watch(s, c, EPOLL_CTL_ADD, EPOLLIN) == 0) {
            s->by_fd[fd] = c;
            s->held++;
            s->accepted++;
            conn_touch(s, c, cli_now_ns());
            counters_changed(s);
            return;
        }
        free(c);
    }
    close(fd);
    s->refused++;
    counters_changed(s);
}

static void accept_ready(struct server *s)
{
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        int fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

        if (fd >= 0) {
            conn_open(s, fd);
            continue;
        }
        switch (errno) {
        case EAGAIN:
#if EWOULDBLOCK != EAGAIN
        case EWOULDBLOCK:
#endif
            return;
        case EINTR:
        case ECONNABORTED:
        case EPROTO:
            continue;
        case EMFILE:
        case ENFILE:
            if (accept_refuse(s))
                continue;
            accept_pause(s);
            return;
        default: /* ENOBUFS, ENOMEM, ... */
            accept_pause(s);
            return;
        }
    }
}

/* Milliseconds epoll_wait may sleep: until the wheel's next expiry. */
static int sleep_ms(const struct server *s)
{
    uint64_t next = tw_wheel_next_expiry(s->wheel), now, due;

    if (next == UINT64_MAX)
        return -1; /* nothing pending: sleep until a socket or a signal */
    if (next > (UINT64_MAX - s->t0) / s->tick_ns)
        return INT_MAX;
    due = s->t0 + next * s->tick_ns;
    now = cli_now_ns();
    if (due <= now)
        return 0;
    /* Round up: waking before the tick boundary would find nothing due. */
    due = (due - now + 999999) / 1000000;
    return due > INT_MAX ? INT_MAX : (int)due;
}

static int run(struct server *s)
{
    static struct epoll_event ev[MAX_EVENTS];

    while (!s->stop) {
        int n = epoll_wait(s->ep, ev, MAX_EVENTS, sleep_ms(s));

        if (n < 0) {
            if (errno == EINTR)
                continue;
            perror("idle_server: epoll_wait");
            return 1;
        }
        s->wakeups++;
        s->timer_wakeups += n == 0;
        for (int i = 0; i < n; i++) {
            void *p = ev[i].data.ptr;
            if (p == &s->lfd) {
                accept_ready(s);
            } else if (p == &s->sigfd) {
                struct signalfd_siginfo si;
                if (read(s->sigfd, &si, sizeof si) == (ssize_t)sizeof si) {
                    printf("%sstopping on %s\n", s->tag,
                           si.ssi_signo == SIGINT ? "SIGINT" : "SIGTERM");
                    s->stop = true;
                }
            } else {
                conn_event(s, p, ev[i].events);
            }
        }
        tw_wheel_advance(s->wheel, now_tick(s));
    }
    return 0;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: idle_server [--host ADDR] [--port N] [--idle DUR] "
            "[--tick DUR]\n"
            "                   [--slack DUR] [--max-conns N] [--workers N] "
            "[--stats DUR]\n"
            "  --host ADDR     numeric IPv4 or IPv6 address (127.0.0.1)\n"
            "  --port N        0..65535; 0 picks a free port (0)\n"
            "  --idle DUR      close connections silent this long (60s)\n"
            "  --tick DUR      timer resolution, 1ms..idle (100ms)\n"
            "  --slack DUR     an idle timer may run this much late, so that "
            "timers\n"
            "                  share wake-ups; 0s..idle (0s: exact)\n"
            "  --max-conns N   refuse connections beyond N (no limit; per "
            "worker)\n"
            "  --workers N     N processes sharing the port, each with its "
            "own loop\n"
            "                  and wheel (1)\n"
            "  --stats DUR     print counters at most this often; 0s: only "
            "at exit (1s)\n"
            "DUR is an integer followed by ms or s, e.g. 250ms, 60s.\n");
}

static int bad_option(const char *opt, const char *val, const char *why)
{
    if (val != NULL)
        fprintf(stderr, "idle_server: bad %s '%s': %s\n", opt, val, why);
    else
        fprintf(stderr, "idle_server: %s without a value: %s\n", opt, why);
    fprintf(stderr, "idle_server: see idle_server --help\n");
    return CLI_EXIT_USAGE;
}

struct options {
    const char *host;
    uint64_t port, idle_ns, tick_ns, slack_ns, stats_ns, max_conns, workers;
};

/* Returns -1 to go on, or an exit code. */
static int parse_options(int argc, char **argv, struct options *o)
{
    *o = (struct options){.host = "127.0.0.1",
                          .idle_ns = UINT64_C(60000000000),
                          .tick_ns = UINT64_C(100000000),
                          .stats_ns = UINT64_C(1000000000),
                          .workers = 1};
    for (int i = 1; i < argc; i++) {
        const char *v = "";
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (cli_option(argc, argv, &i, "--host", &v)) {
            if (v == NULL || *v == '\0')
                return bad_option("--host", v, "need an address");
            o->host = v;
        } else if (cli_option(argc, argv, &i, "--port", &v)) {
            if (cli_parse_u64(v, 0, 65535, &o->port) != 0)
                return bad_option("--port", v, "need 0..65535");
        } else if (cli_option(argc, argv, &i, "--idle", &v)) {
            if (cli_parse_duration(v, false, MAX_DURATION_NS, &o->idle_ns))
                return bad_option("--idle", v, "need e.g. 500ms or 60s");
        } else if (cli_option(argc, argv, &i, "--tick", &v)) {
            if (cli_parse_duration(v, false, MAX_DURATION_NS, &o->tick_ns))
                return bad_option("--tick", v, "need e.g. 10ms or 1s");
        } else if (cli_option(argc, argv, &i, "--slack", &v)) {
            if (cli_parse_duration(v, true, MAX_DURATION_NS, &o->slack_ns))
                return bad_option("--slack", v, "need e.g. 0s or 1s");
        } else if (cli_option(argc, argv, &i, "--stats", &v)) {
            if (cli_parse_duration(v, true, MAX_DURATION_NS, &o->stats_ns))
                return bad_option("--stats", v, "need e.g. 0s or 1s");
        } else if (cli_option(argc, argv, &i, "--workers", &v)) {
            if (cli_parse_u64(v, 1, MAX_WORKERS, &o->workers) != 0)
                return bad_option("--workers", v, "need 1..64");
        } else if (cli_option(argc, argv, &i, "--max-conns", &v)) {
            if (cli_parse_u64(v, 1, UINT32_MAX, &o->max_conns) != 0)
                return bad_option("--max-conns", v, "need 1..4294967295");
        } else {
            return bad_option("option", argv[i], "unknown");
        }
    }
    if (o->tick_ns > o->idle_ns)
        return bad_option("--tick", ">idle", "must not exceed --idle");
    if (o->slack_ns > o->idle_ns)
        return bad_option("--slack", ">idle", "must not exceed --idle");
    return -1;
}

/*
 * Bind and listen, with SO_REUSEPORT if @shared (one socket per worker on
 * the same port). With @say, print "listening on HOST:PORT". Returns the
 * fd (and the port in *@port), or -1.
 */
static int listen_on(const char *host, uint16_t *port, bool shared, bool say,
                     int *err_usage)
{
    struct sockaddr_storage ss;
    struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
    socklen_t len;
    char name[INET6_ADDRSTRLEN];
    int fd, one = 1;

    memset(&ss, 0, sizeof ss);
    if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons(*port);
        len = sizeof *in4;
    } else if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons(*port);
        len = sizeof *in6;
    } else {
        *err_usage = 1;
        return -1;
    }
    fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (shared)
        setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    /* The kernel caps the backlog at net.core.somaxconn. */
    if (bind(fd, (struct sockaddr *)&ss, len) != 0 || listen(fd, 65535) != 0 ||
        getsockname(fd, (struct sockaddr *)&ss, &len) != 0) {
        close(fd);
        return -1;
    }
    *port = ntohs(ss.ss_family == AF_INET ? in4->sin_port : in6->sin6_port);
    if (say && ss.ss_family == AF_INET) {
        inet_ntop(AF_INET, &in4->sin_addr, name, sizeof name);
        printf("listening on %s:%u\n", name, *port);
    } else if (say) {
        inet_ntop(AF_INET6, &in6->sin6_addr, name, sizeof name);
        printf("listening on [%s]:%u\n", name, *port);
    }
    return fd;
}

static int add_watch(int ep, int fd, void *tag)
{
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = tag};
    return epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e);
}

static void server_close(struct server *s)
{
    for (size_t fd = 0; fd < s->by_fd_cap; fd++)
        if (s->by_fd[fd] != NULL)
            conn_close(s, s->by_fd[fd]);
    free(s->by_fd);
    tw_wheel_destroy(s->wheel);
    if (s->spare_fd >= 0)
        close(s->spare_fd);
    if (s->sigfd >= 0)
        close(s->sigfd);
    if (s->lfd >= 0)
        close(s->lfd);
    if (s->ep >= 0)
        close(s->ep);
}

/*
 * Serve on the listening socket @lfd until SIGINT/SIGTERM; print the final
 * counters. @tag prefixes every log line ("" or "w3: "). Returns the exit
 * code.
 */
static int serve(const struct options *o, int lfd, const char *tag,
                 const sigset_t *sigs)
{
    static struct server srv;
    struct server *s = &srv;
    int rc = 1;

    s->ep = s->sigfd = s->spare_fd = -1;
    s->lfd = lfd;
    s->tag = tag;
    s->t0 = cli_now_ns();
    s->tick_ns = o->tick_ns;
    s->idle_ns = o->idle_ns;
    s->slack_ns = o->slack_ns;
    s->stats_ns = o->stats_ns;
    s->max_conns = o->max_conns;
    tw_timer_init(&s->stats_timer, on_stats, s);
    tw_timer_init(&s->resume_timer, on_resume, s);
    s->ep = epoll_create1(EPOLL_CLOEXEC);
    s->sigfd = signalfd(-1, sigs, SFD_NONBLOCK | SFD_CLOEXEC);
    s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (s->ep < 0 || s->sigfd < 0 || s->spare_fd < 0 ||
        tw_wheel_create(&s->wheel, NULL, 0) != 0 ||
        add_watch(s->ep, s->lfd, &s->lfd) != 0 ||
        add_watch(s->ep, s->sigfd, &s->sigfd) != 0) {
        perror("idle_server: setup");
    } else {
        rc = run(s);
        print_counters(s, "final: ");
    }
    server_close(s);
    return rc;
}

/*
 * --workers N > 1: N processes, each with its own listening socket on the
 * same port (SO_REUSEPORT: the kernel spreads connections over them), its
 * own epoll loop and its own wheel, as multi-process servers do to go past
 * one process's file-descriptor limit. The parent only forwards SIGINT and
 * SIGTERM and collects the workers' exit codes.
 */
static int run_workers(const struct options *o, int *lfd, const sigset_t *sigs)
{
    pid_t pid[MAX_WORKERS];
    static char tags[MAX_WORKERS][16];
    int started = 0, rc = 0, sig;

    fflush(stdout);
    for (; started < (int)o->workers; started++) {
        pid[started] = fork();
        if (pid[started] < 0)
            break;
        if (pid[started] == 0) {
            for (int i = 0; i < (int)o->workers; i++)
                if (i != started)
                    close(lfd[i]);
            snprintf(tags[started], sizeof tags[started], "w%d: ", started);
            exit(serve(o, lfd[started], tags[started], sigs));
        }
    }
    for (int i = 0; i < (int)o->workers; i++)
        close(lfd[i]);
    if (started < (int)o->workers) {
        perror("idle_server: fork");
        rc = 1;
    } else if (sigwait(sigs, &sig) == 0) {
        printf("stopping on %s\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    }
    for (int i = 0; i < started; i++)
        kill(pid[i], SIGTERM);
    for (int i = 0; i < started; i++) {
        int status;
        if (waitpid(pid[i], &status, 0) != pid[i] || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0)
            rc = 1;
    }
    printf("final: workers=%d exit=%d\n", started, rc);
    return rc;
}

int main(int argc, char **argv)
{
    struct options o;
    int lfd[MAX_WORKERS];
    uint16_t port;
    sigset_t sigs;
    int rc, usage_err = 0;

    rc = parse_options(argc, argv, &o);
    if (rc >= 0)
        return rc;
    /* Scripts read our stdout through a pipe: one line at a time. */
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    cli_raise_nofile(0); /* soft limit up to the hard one */
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigprocmask(SIG_BLOCK, &sigs, NULL);

    port = (uint16_t)o.port;
    for (int i = 0; i < (int)o.workers; i++) {
        /* The first socket picks the port (0: any); the others share it. */
        lfd[i] = listen_on(o.host, &port, o.workers > 1,
                           i + 1 == (int)o.workers, &usage_err);
        if (lfd[i] >= 0)
            continue;
        if (usage_err)
            return bad_option("--host", o.host, "not a numeric address");
        fprintf(stderr, "idle_server: cannot listen on %s port %u: %s\n",
                o.host, (unsigned)port, strerror(errno));
        while (i-- > 0)
            close(lfd[i]);
        return 1;
    }
    if (o.workers == 1)
        return serve(&o, lfd[0], "", &sigs);
    return run_workers(&o, lfd, &sigs);
}
