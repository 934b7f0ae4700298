/* SPDX-License-Identifier: MIT */
/*
 * idle_load - load and check an idle-connection server (examples/idle_server).
 *
 * Opens --conns TCP connections to the server over loopback, spread over
 * --sources local addresses 127.0.0.1, 127.0.0.2, ... Each source address
 * has its own ephemeral port range, so more than ~28K connections fit, and
 * the kernel's search for a free port in connect() stays short: with 20K
 * connections from one address opening took 5.5 s, from four 1.1 s.
 * Every connection first sends one byte and waits for its echo: from then on
 * the server is known to hold it. A share (--active percent) keeps sending a
 * byte every --period; the rest stay silent. It then checks, against the
 * server's --idle and --tick:
 *   - every silent connection is closed by the server, not before --idle has
 *     passed since its last byte was sent, and no later than idle + tick
 *     (+ --slack for scheduling delays) after that byte's echo arrived;
 *   - no active connection is ever closed;
 * and reports the server's resident memory per connection and its CPU time
 * over the run (from /proc, when the server's pid is known).
 *
 * The server is either given (--host, --port, --pid) or started by the tool:
 * everything after "--" is the server's command line; its first stdout line
 * must be "listening on HOST:PORT", the rest is copied to our stdout with a
 * "server: " prefix, and at the end it is sent SIGTERM and must exit with 0.
 *
 * More connections than one process may open (RLIMIT_NOFILE) are spread
 * over --procs worker processes, each with its own epoll loop; they share
 * the connection table (a MAP_SHARED mapping) and the parent reports.
 *
 * Exit codes: 0 when every check passed; 1 when the server misbehaved (a
 * close before idle, an active connection closed, a bad exit); 3 when only
 * timing bounds were missed (late closes, or this tool itself fell behind,
 * which a loaded machine can cause: retry with longer durations); 2 on bad
 * options.
 * Each worker is single-threaded: one epoll loop, send times kept in a
 * twheel wheel.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <twheel/wheel.h>

#include "cli.h"

#define MAX_EVENTS 1024
#define MS 1000000u
#define MAX_DURATION_NS (UINT64_C(86400) * 1000000000u)
#define MAX_CONNS 2000000u
#define EXIT_LATE 3 /* only timing bounds were missed */
#define MAX_PROCS 64

enum state {
    C_NEW,
    C_CONNECTING,
    C_HELLO, /* connected, our first byte sent, its echo not yet seen */
    C_OPEN,
    C_FLOOD,  /* connected, writing without ever reading */
    C_CLOSED, /* closed by the server (or by us after a failure) */
    C_RESET,  /* a flooding one we aborted mid-write */
    C_REFUSED,
    C_FAILED
};

enum kind { K_SILENT, K_ACTIVE, K_FLOOD, K_FLOOD_RESET };

/* One client connection. */
struct cconn {
    int fd;
    uint8_t state;
    uint8_t kind;
    uint64_t sent_ns; /* when our last byte was sent */
    uint64_t echo_ns; /* when the echo of a byte last arrived */
    uint64_t closed_ns;
    tw_timer send_timer; /* active connections: the next byte */
};

struct options {
    const char *host;
    uint64_t port, pid, conns, active_pct, idle_ns, tick_ns, period_ns;
    uint64_t slack_ns, sources, burst, max_time_ns, flood, procs, ramp_ns;
    bool allow_refused;
    char **server_argv; /* NULL, or the server to start */
};

/* What the worker processes share with the parent. */
struct shared {
    atomic_uint opened_procs; /* workers past their opening phase */
    struct cconn c[];
};

struct load {
    struct options o;
    struct sockaddr_in dst;
    struct shared *sh;
    struct cconn *c; /* sh->c */
    uint64_t total;  /* --flood + --conns */
    /* A worker's own state: its slice [next_new, end) of c. */
    int ep;
    tw_wheel *wheel; /* 1 ms ticks since t0 */
    uint64_t t0, end;
    uint64_t next_new, inflight, failed;
    uint64_t silent_open, flood_open; /* not closed yet */
    uint64_t last_open_ns;
    int server_out; /* the started server's stdout, or -1 */
    pid_t server_pid;
    char line[4096];
    size_t line_len;
    char buf[65536];
};

/* ---- the server's /proc numbers ---------------------------------------- */

/* Resident set size of @pid in bytes, 0 if unknown. */
static uint64_t proc_rss(pid_t pid)
{
    char path[64], l[256];
    uint64_t kb = 0;
    FILE *f;

    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    f = fopen(path, "r");
    if (f == NULL)
        return 0;
    while (fgets(l, sizeof l, f) != NULL)
        if (sscanf(l, "VmRSS: %" SCNu64, &kb) == 1)
            break;
    fclose(f);
    return kb * 1024;
}

/* User and system CPU time of @pid in ns; false if unknown. */
static bool proc_cpu(pid_t pid, uint64_t *user, uint64_t *sys)
{
    char path[64], l[1024], *p;
    unsigned long long ut, st;
    long hz = sysconf(_SC_CLK_TCK);
    FILE *f;
    bool ok;

    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    f = fopen(path, "r");
    if (f == NULL)
        return false;
    ok = fgets(l, sizeof l, f) != NULL;
    fclose(f);
    /* The command name may hold spaces: fields count from its ')'. */
    if (!ok || (p = strrchr(l, ')')) == NULL || hz <= 0)
        return false;
    if (sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu",
               &ut, &st) != 2)
        return false;
    *user = (uint64_t)ut * 1000000000u / (uint64_t)hz;
    *sys = (uint64_t)st * 1000000000u / (uint64_t)hz;
    return true;
}

/* ---- the started server ------------------------------------------------ */

/* Copy complete lines of the server's output to stdout. */
static void server_output(struct load *l)
{
    ssize_t n;

    while ((n = read(l->server_out, l->line + l->line_len,
                     sizeof l->line - 1 - l->line_len)) > 0) {
        char *nl, *start = l->line;
        l->line_len += (size_t)n;
        l->line[l->line_len] = '\0';
        while ((nl = strchr(start, '\n')) != NULL) {
            printf("server: %.*s\n", (int)(nl - start), start);
            start = nl + 1;
        }
        l->line_len -= (size_t)(start - l->line);
        memmove(l->line, start, l->line_len);
        if (l->line_len == sizeof l->line - 1)
            l->line_len = 0; /* an overlong line: drop it */
    }
    if (n == 0) {
        close(l->server_out);
        l->server_out = -1;
    }
}

/*
 * Start the server with its stdout on a pipe and read its first line,
 * "listening on HOST:PORT", within 10 s. Fills l->o.host/port/pid.
 */
static int server_start(struct load *l)
{
    static char host[64];
    int p[2];
    size_t len = 0;
    uint64_t until = cli_now_ns() + UINT64_C(10000000000);
    char *colon;

    if (pipe2(p, O_CLOEXEC) != 0)
        return -1;
    fflush(stdout);
    l->server_pid = fork();
    if (l->server_pid < 0)
        return -1;
    if (l->server_pid == 0) {
        dup2(p[1], STDOUT_FILENO);
        execvp(l->o.server_argv[0], l->o.server_argv);
        fprintf(stderr, "idle_load: cannot run %s: %s\n", l->o.server_argv[0],
                strerror(errno));
        _exit(127);
    }
    close(p[1]);
    l->server_out = p[0];
    /* Read byte by byte up to the first newline: the rest stays queued. */
    while (len < sizeof l->line - 1) {
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        uint64_t now = cli_now_ns();
        if (now >= until || poll(&pf, 1, (int)((until - now) / MS) + 1) <= 0 ||
            read(p[0], l->line + len, 1) != 1)
            break;
        if (l->line[len] == '\n')
            break;
        len++;
    }
    l->line[len] = '\0';
    if (strncmp(l->line, "listening on ", 13) != 0 ||
        (colon = strrchr(l->line, ':')) == NULL ||
        (size_t)(colon - l->line - 13) >= sizeof host) {
        fprintf(stderr,
                "idle_load: the server did not say 'listening on "
                "HOST:PORT' (got '%s')\n",
                l->line);
        return -1;
    }
    memcpy(host, l->line + 13, (size_t)(colon - l->line - 13));
    host[colon - l->line - 13] = '\0';
    printf("server: %s\n", l->line);
    l->line_len = 0;
    l->o.host = host;
    l->o.pid = (uint64_t)l->server_pid;
    if (cli_parse_u64(colon + 1, 1, 65535, &l->o.port) != 0)
        return -1;
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    return 0;
}

/* SIGTERM the started server and wait (10 s at most). True if it exited 0. */
static bool server_stop(struct load *l)
{
    int status = 0;
    uint64_t until = cli_now_ns() + UINT64_C(10000000000);
    pid_t r;

    kill(l->server_pid, SIGTERM);
    while ((r = waitpid(l->server_pid, &status, WNOHANG)) == 0) {
        if (l->server_out >= 0)
            server_output(l);
        if (cli_now_ns() >= until) {
            kill(l->server_pid, SIGKILL);
            waitpid(l->server_pid, &status, 0);
            fprintf(stderr, "idle_load: the server ignored SIGTERM\n");
            return false;
        }
        usleep(10000);
    }
    while (l->server_out >= 0)
        server_output(l);
    if (r < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr,
                "idle_load: the server did not exit cleanly "
                "(status 0x%x)\n",
                (unsigned)status);
        return false;
    }
    return true;
}

/* ---- connections ------------------------------------------------------- */

static uint64_t now_ms_tick(const struct load *l)
{
    return (cli_now_ns() - l->t0) / MS;
}

static int watch(struct load *l, struct cconn *c, int op, uint32_t ev)
{
    struct epoll_event e = {.events = ev, .data.ptr = c};
    return epoll_ctl(l->ep, op, c->fd, &e);
}

/*
 * Send one byte. The time is taken before the call: on loopback the server
 * may read the byte before send() returns here, and "not closed before
 * idle" must be judged from a time no later than the server's read.
 */
static bool send_byte(struct cconn *c)
{
    uint64_t t = cli_now_ns();

    if (send(c->fd, "x", 1, MSG_NOSIGNAL | MSG_DONTWAIT) != 1)
        return false;
    c->sent_ns = t;
    return true;
}

static void on_send(tw_timer *t, void *arg)
{
    struct load *l = arg;
    struct cconn *c = TW_CONTAINER_OF(t, struct cconn, send_timer);

    if (c->state != C_OPEN)
        return;
    send_byte(c); /* a full buffer is not an error: the next one goes */
    tw_wheel_add(l->wheel, t, now_ms_tick(l) + l->o.period_ns / MS);
}

static void conn_end(struct load *l, struct cconn *c, enum state st)
{
    tw_wheel_cancel(l->wheel, &c->send_timer);
    close(c->fd);
    c->fd = -1;
    c->state = (uint8_t)st;
}

/*
 * Connections 0 .. flood-1 flood (every other one resets mid-write), the
 * --conns after them are silent or active; active ones are spread evenly,
 * pct of every 100 consecutive ones.
 */
static enum kind kind_of(const struct load *l, uint64_t i)
{
    if (i < l->o.flood)
        return i % 2 ? K_FLOOD_RESET : K_FLOOD;
    i -= l->o.flood;
    if ((i + 1) * l->o.active_pct / 100 != i * l->o.active_pct / 100)
        return K_ACTIVE;
    return K_SILENT;
}

/* Start connecting number l->next_new. */
static void conn_start(struct load *l)
{
    uint64_t i = l->next_new++;
    struct cconn *c = &l->c[i];
    struct sockaddr_in src = {.sin_family = AF_INET};
    int one = 1;

    c->kind = (uint8_t)kind_of(l, i);
    tw_timer_init(&c->send_timer, on_send, l);
    c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        goto fail;
    /* The port is chosen at connect(), per 4-tuple, not at bind(). */
    setsockopt(c->fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof one);
    src.sin_addr.s_addr = htonl(INADDR_LOOPBACK + (uint32_t)(i % l->o.sources));
    if (bind(c->fd, (struct sockaddr *)&src, sizeof src) != 0 ||
        (connect(c->fd, (struct sockaddr *)&l->dst, sizeof l->dst) != 0 &&
         errno != EINPROGRESS) ||
        watch(l, c, EPOLL_CTL_ADD, EPOLLOUT | EPOLLIN) != 0)
        goto fail;
    c->state = C_CONNECTING;
    l->inflight++;
    if (c->kind >= K_FLOOD)
        l->flood_open++;
    return;
fail:
    if (l->failed++ < 5)
        fprintf(stderr, "idle_load: connection %" PRIu64 ": %s\n", i,
                strerror(errno));
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    c->state = C_FAILED;
}

/*
 * The server closed @c (or it failed) at @now. Only the times and the state
 * are recorded here; the parent judges them all at the end (tally()).
 */
static void conn_lost(struct load *l, struct cconn *c, uint64_t now)
{
    c->closed_ns = now;
    if (c->kind >= K_FLOOD)
        l->flood_open--;
    if (c->state == C_CONNECTING || c->state == C_HELLO) {
        l->inflight--;
        if (!l->o.allow_refused && l->failed++ < 5)
            fprintf(stderr,
                    "idle_load: connection %td closed before its "
                    "echo\n",
                    c - l->c);
        conn_end(l, c, l->o.allow_refused ? C_REFUSED : C_FAILED);
        return;
    }
    if (c->kind == K_SILENT)
        l->silent_open--;
    conn_end(l, c, C_CLOSED);
}

/*
 * Write to a flooding connection until the socket is full; never read. The
 * server's echo then backs up and it must stop reading from us, keep
 * serving the others, and close us once we have looked idle for --idle.
 * The K_FLOOD_RESET ones instead abort (RST) once the socket is full, while
 * the server still has echo bytes to write to them.
 */
static void flood(struct load *l, struct cconn *c, uint32_t ev)
{
    if (ev & (EPOLLERR | EPOLLHUP | EPOLLRDHUP)) {
        conn_lost(l, c, cli_now_ns());
        return;
    }
    for (;;) {
        ssize_t n =
            send(c->fd, l->buf, sizeof l->buf, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (c->kind == K_FLOOD_RESET) {
                struct linger lg = {.l_onoff = 1, .l_linger = 0};
                setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
                l->flood_open--;
                conn_end(l, c, C_RESET);
            }
            return;
        }
        if (n < 0 && errno == EINTR)
            continue;
        conn_lost(l, c, cli_now_ns());
        return;
    }
}

static void conn_event(struct load *l, struct cconn *c, uint32_t ev)
{
    uint64_t now = cli_now_ns();
    ssize_t n;

    if (c->state == C_FLOOD) {
        flood(l, c, ev);
        return;
    }
    if (c->state == C_CONNECTING) {
        int err = 0;
        socklen_t len = sizeof err;
        if (!(ev & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
            return;
        getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err == 0 && c->kind >= K_FLOOD) {
            l->inflight--;
            c->state = C_FLOOD;
            if (watch(l, c, EPOLL_CTL_MOD, EPOLLOUT | EPOLLRDHUP) == 0)
                flood(l, c, 0);
            else
                conn_lost(l, c, now);
            return;
        }
        if (err != 0 || !send_byte(c) ||
            watch(l, c, EPOLL_CTL_MOD, EPOLLIN) != 0) {
            conn_lost(l, c, now);
            return;
        }
        c->state = C_HELLO;
        return;
    }
    n = recv(c->fd, l->buf, sizeof l->buf, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR))
        return;
    if (n <= 0) {
        conn_lost(l, c, now);
        return;
    }
    c->echo_ns = now;
    if (c->state == C_HELLO) {
        c->state = C_OPEN;
        l->inflight--;
        l->last_open_ns = now;
        if (c->kind == K_ACTIVE)
            tw_wheel_add(l->wheel, &c->send_timer,
                         now_ms_tick(l) + l->o.period_ns / MS);
        else
            l->silent_open++;
    }
}

/* ---- a worker ---------------------------------------------------------- */

/* One round of the event loop; waits at most @wait_ms. */
static void poll_once(struct load *l, int wait_ms)
{
    static struct epoll_event ev[MAX_EVENTS];
    int n = epoll_wait(l->ep, ev, MAX_EVENTS, wait_ms);

    for (int i = 0; i < n; i++)
        conn_event(l, ev[i].data.ptr, ev[i].events);
    tw_wheel_advance(l->wheel, now_ms_tick(l));
}

/*
 * Open every connection of the slice, connection i not before
 * start + ramp * i / total; true unless --max-time ran out.
 */
static bool open_all(struct load *l, uint64_t start)
{
    while (l->next_new < l->end || l->inflight > 0) {
        uint64_t due = (uint64_t)((double)l->o.ramp_ns * (double)l->next_new /
                                  (double)l->total);
        while (l->next_new < l->end && l->inflight < l->o.burst &&
               cli_now_ns() - start >= due) {
            conn_start(l);
            due = (uint64_t)((double)l->o.ramp_ns * (double)l->next_new /
                             (double)l->total);
        }
        if (cli_now_ns() - start > l->o.max_time_ns)
            return false;
        poll_once(l, 20);
    }
    return true;
}

/*
 * Wait until every silent and flooding connection is closed and the active
 * ones have lived a whole idle period past the last opening, or until the
 * latest moment a silent connection may rightly still be open.
 */
static bool wait_closes(struct load *l, uint64_t start)
{
    uint64_t enough = l->last_open_ns + l->o.idle_ns + l->o.tick_ns;
    uint64_t deadline = enough + l->o.slack_ns + 50 * MS;

    for (;;) {
        uint64_t now = cli_now_ns();
        if ((l->silent_open == 0 && l->flood_open == 0 && now >= enough) ||
            now >= deadline)
            return true;
        if (now - start > l->o.max_time_ns)
            return false;
        poll_once(l, 20);
    }
}

/* A worker process: connections [lo, hi). Exit code 0, or 3 if late. */
static int worker(struct load *l, uint64_t lo, uint64_t hi, uint64_t start)
{
    bool in_time;

    l->next_new = lo;
    l->end = hi;
    l->t0 = cli_now_ns();
    l->ep = epoll_create1(EPOLL_CLOEXEC);
    if (l->ep < 0 || tw_wheel_create(&l->wheel, NULL, 0) != 0) {
        perror("idle_load: worker setup");
        return 1;
    }
    in_time = open_all(l, start);
    atomic_fetch_add(&l->sh->opened_procs, 1);
    if (in_time)
        in_time = wait_closes(l, start);
    for (uint64_t i = lo; i < hi; i++) {
        struct cconn *c = &l->c[i];
        if (c->state == C_CONNECTING || c->state == C_HELLO ||
            c->state == C_OPEN || c->state == C_FLOOD)
            close(c->fd);
    }
    tw_wheel_destroy(l->wheel);
    close(l->ep);
    return in_time ? 0 : EXIT_LATE;
}

/* ---- the parent: start, watch and judge -------------------------------- */

/* A process tree's resident memory and CPU time, from /proc. */
struct usage {
    uint64_t rss, user, sys; /* bytes, ns, ns */
};

/* Add @pid's figures to @u; false if its CPU time is unknown. */
static bool usage_add(pid_t pid, struct usage *u)
{
    uint64_t user, sys;

    u->rss += proc_rss(pid);
    if (!proc_cpu(pid, &user, &sys))
        return false;
    u->user += user;
    u->sys += sys;
    return true;
}

/* @pid and its children (the server's workers); false if @pid is gone. */
static bool tree_usage(pid_t pid, struct usage *u)
{
    char path[64], buf[4096], *p = buf, *end;
    FILE *f;

    memset(u, 0, sizeof *u);
    if (!usage_add(pid, u))
        return false;
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)pid,
             (int)pid);
    f = fopen(path, "r");
    if (f == NULL)
        return true;
    buf[fread(buf, 1, sizeof buf - 1, f)] = '\0';
    fclose(f);
    for (long c; (c = strtol(p, &end, 10)) > 0; p = end)
        usage_add((pid_t)c, u);
    return true;
}

/* The outcome of every connection, judged from the shared table. */
struct tally {
    uint64_t opened, refused, failed, held;
    uint64_t silent_closed, early, late, active_open, active_closed;
    uint64_t active_stalled, flood_closed, flood_reset, flood_open;
};

/* With @say, print the first few early closes. */
static void tally(const struct load *l, struct tally *t, bool say)
{
    const struct options *o = &l->o;

    memset(t, 0, sizeof *t);
    for (uint64_t i = 0; i < l->total; i++) {
        const struct cconn *c = &l->c[i];
        bool was_open = c->echo_ns != 0;
        t->opened += was_open && c->kind < K_FLOOD;
        t->held += c->state == C_OPEN;
        t->refused += c->state == C_REFUSED;
        t->failed += c->state == C_FAILED || c->state == C_NEW ||
                     c->state == C_CONNECTING || c->state == C_HELLO;
        if (c->kind >= K_FLOOD) {
            t->flood_closed += c->state == C_CLOSED;
            t->flood_reset += c->state == C_RESET;
            t->flood_open += c->state == C_FLOOD;
        } else if (c->kind == K_ACTIVE && c->state == C_CLOSED) {
            /* Closing is right if we ourselves fell an idle period behind. */
            if (c->closed_ns - c->sent_ns >= o->idle_ns)
                t->active_stalled++;
            else
                t->active_closed++;
        } else if (c->kind == K_ACTIVE) {
            t->active_open += c->state == C_OPEN;
        } else if (c->state == C_OPEN) {
            t->late++; /* still open after the deadline */
        } else if (c->state == C_CLOSED) {
            t->silent_closed++;
            if (c->closed_ns - c->sent_ns < o->idle_ns && t->early++ < 3 && say)
                printf("early: connection %" PRIu64 " closed %.3f ms after "
                       "its last byte (idle %.0f ms)\n",
                       i, (double)(c->closed_ns - c->sent_ns) / MS,
                       (double)o->idle_ns / MS);
            else if (c->closed_ns - c->echo_ns >
                     o->idle_ns + o->tick_ns + o->slack_ns)
                t->late++;
        }
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* How long after idle the silent connections were closed: a distribution. */
static void report_lateness(const struct load *l)
{
    uint64_t n = 0, *v = malloc((l->total + 1) * sizeof *v);

    if (v == NULL)
        return;
    for (uint64_t i = 0; i < l->total; i++) {
        const struct cconn *c = &l->c[i];
        if (c->kind == K_SILENT && c->state == C_CLOSED &&
            c->closed_ns >= c->sent_ns + l->o.idle_ns)
            v[n++] = c->closed_ns - c->sent_ns - l->o.idle_ns;
    }
    if (n > 0) {
        qsort(v, n, sizeof *v, cmp_u64);
        printf("silent: closed at idle + min %.1f / p50 %.1f / p99 %.1f / "
               "max %.1f ms after their last byte (tick %.1f ms)\n",
               (double)v[0] / MS, (double)v[n / 2] / MS,
               (double)v[n * 99 / 100] / MS, (double)v[n - 1] / MS,
               (double)l->o.tick_ns / MS);
    }
    free(v);
}

/* Wait @ms at most for server output, and copy it. */
static void parent_wait(struct load *l, int ms)
{
    struct pollfd pf = {.fd = l->server_out, .events = POLLIN};

    if (l->server_out < 0) {
        usleep((useconds_t)ms * 1000);
        return;
    }
    if (poll(&pf, 1, ms) > 0)
        server_output(l);
}

/*
 * Start the workers and watch them: once all have opened their share,
 * take the server's memory; once all are done, its CPU time; then judge.
 */
static int run(struct load *l)
{
    uint64_t start = cli_now_ns();
    struct usage u0 = {0}, u1;
    uint64_t silent = 0, per = (l->total + l->o.procs - 1) / l->o.procs;
    pid_t pid[MAX_PROCS];
    bool have_cpu = false, rss_done = false, in_time = true;
    unsigned running = 0;
    struct tally t;

    for (uint64_t i = l->o.flood; i < l->total; i++)
        silent += kind_of(l, i) == K_SILENT;
    if (l->o.pid) {
        have_cpu = tree_usage((pid_t)l->o.pid, &u0);
    }
    printf("idle_load: %" PRIu64 " connections to %s:%" PRIu64 " from %" PRIu64
           " source address(es), %" PRIu64 " process(es): %" PRIu64
           " silent, %" PRIu64 " active (a byte every %" PRIu64 " ms), %" PRIu64
           " flooding\n",
           l->o.conns, l->o.host, l->o.port, l->o.sources, l->o.procs, silent,
           l->o.conns - silent, l->o.period_ns / MS, l->o.flood);
    fflush(stdout);
    for (uint64_t lo = 0; lo < l->total; lo += per) {
        uint64_t hi = lo + per < l->total ? lo + per : l->total;
        pid_t p = fork();
        if (p == 0) {
            if (l->server_out >= 0)
                close(l->server_out);
            _exit(worker(l, lo, hi, start));
        }
        if (p < 0) {
            perror("idle_load: fork");
            in_time = false;
            break;
        }
        pid[running++] = p;
    }
    for (unsigned left = running; left > 0;) {
        int status;
        if (!rss_done && atomic_load(&l->sh->opened_procs) == running) {
            rss_done = true;
            tally(l, &t, false);
            printf("opened: %" PRIu64 " in %.0f ms (%" PRIu64
                   " refused, %" PRIu64 " failed), %" PRIu64 " held\n",
                   t.opened, (double)(cli_now_ns() - start) / MS, t.refused,
                   t.failed, t.held);
            if (l->o.pid && t.held > 0 && tree_usage((pid_t)l->o.pid, &u1))
                printf("server rss: %" PRIu64 " KiB before, %" PRIu64
                       " KiB holding %" PRIu64 ": %.0f bytes per connection\n",
                       u0.rss / 1024, u1.rss / 1024, t.held,
                       u1.rss > u0.rss
                           ? (double)(u1.rss - u0.rss) / (double)t.held
                           : 0.0);
        }
        for (unsigned i = 0; i < running; i++) {
            if (pid[i] <= 0 || waitpid(pid[i], &status, WNOHANG) != pid[i])
                continue;
            pid[i] = 0;
            left--;
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
                in_time = false;
        }
        if (left > 0)
            parent_wait(l, 20);
    }
    if (have_cpu && tree_usage((pid_t)l->o.pid, &u1))
        printf("server cpu: %.0f ms user + %.0f ms system over %.1f s\n",
               (double)(u1.user - u0.user) / MS, (double)(u1.sys - u0.sys) / MS,
               (double)(cli_now_ns() - start) / 1e9);
    report_lateness(l);
    tally(l, &t, true);
    printf("silent: %" PRIu64 " closed, %" PRIu64 " early, %" PRIu64
           " late (bound: idle + tick + slack %.0f ms after the echo)\n",
           t.silent_closed, t.early, t.late, (double)l->o.slack_ns / MS);
    printf("active: %" PRIu64 " open, %" PRIu64
           " closed by the server, %" PRIu64
           " closed after this tool fell an idle period behind\n",
           t.active_open, t.active_closed, t.active_stalled);
    if (l->o.flood > 0)
        printf("flood: %" PRIu64 " closed by the server, %" PRIu64
               " reset by us mid-write, %" PRIu64 " still open\n",
               t.flood_closed, t.flood_reset, t.flood_open);
    if (!in_time)
        printf("a worker ran out of --max-time or failed\n");
    /* Wrong behaviour fails outright; lateness may be the machine's. */
    if (t.opened == 0 || t.failed > 0 || t.early > 0 || t.active_closed > 0)
        return 1;
    if (!in_time || t.late > 0 || t.active_stalled > 0 || t.flood_open > 0)
        return EXIT_LATE;
    return 0;
}

/* ---- options ------------------------------------------------------------ */

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: idle_load --conns N [--idle DUR] [--tick DUR] [options]\n"
        "                 (--port N [--host ADDR] [--pid PID] | -- SERVER...)\n"
        "  --conns N        connections to open (1..%u)\n"
        "  --idle DUR       the server's --idle (60s)\n"
        "  --tick DUR       the server's --tick (100ms)\n"
        "  --active PCT     percent of connections kept active (10)\n"
        "  --period DUR     an active connection sends a byte this often "
        "(idle/4)\n"
        "  --slack DUR      scheduling delay allowed past idle + tick (50ms)\n"
        "  --flood N        also open N connections that write without "
        "reading\n"
        "                   (every other one resets mid-write) (0)\n"
        "  --procs P        worker processes (enough for the open-file "
        "limit)\n"
        "  --sources K      local addresses 127.0.0.1.. to connect from "
        "(1 per 5000)\n"
        "  --burst N        connects in flight at once (256)\n"
        "  --ramp DUR       spread the openings evenly over DUR (0s: at "
        "once)\n"
        "  --max-time DUR   give up after this long (600s)\n"
        "  --allow-refused  count connections closed before their echo as "
        "refused, not failed\n"
        "  --host, --port, --pid  a running server (its pid for /proc "
        "figures)\n"
        "  -- SERVER...     start this server command instead\n"
        "DUR is an integer followed by ms or s.\n",
        MAX_CONNS);
}

static int bad_option(const char *opt, const char *val, const char *why)
{
    fprintf(stderr, "idle_load: bad %s '%s': %s\n", opt,
            val ? val : "(missing)", why);
    fprintf(stderr, "idle_load: see idle_load --help\n");
    return CLI_EXIT_USAGE;
}

/* Returns -1 to go on, or an exit code. */
static int parse_options(int argc, char **argv, struct options *o)
{
    *o = (struct options){.host = "127.0.0.1",
                          .active_pct = 10,
                          .idle_ns = UINT64_C(60000000000),
                          .tick_ns = 100 * MS,
                          .slack_ns = 50 * MS,
                          .burst = 256,
                          .max_time_ns = UINT64_C(600000000000)};
    for (int i = 1; i < argc; i++) {
        const char *v = "";
        int bad = 0;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--") == 0) {
            if (i + 1 >= argc)
                return bad_option("--", NULL, "needs a server command");
            o->server_argv = argv + i + 1;
            break;
        } else if (strcmp(argv[i], "--allow-refused") == 0) {
            o->allow_refused = true;
        } else if (cli_option(argc, argv, &i, "--host", &v)) {
            bad = v == NULL || *v == '\0';
            o->host = v;
        } else if (cli_option(argc, argv, &i, "--port", &v)) {
            bad = cli_parse_u64(v, 1, 65535, &o->port);
        } else if (cli_option(argc, argv, &i, "--pid", &v)) {
            bad = cli_parse_u64(v, 1, INT_MAX, &o->pid);
        } else if (cli_option(argc, argv, &i, "--conns", &v)) {
            bad = cli_parse_u64(v, 1, MAX_CONNS, &o->conns);
        } else if (cli_option(argc, argv, &i, "--active", &v)) {
            bad = cli_parse_u64(v, 0, 100, &o->active_pct);
        } else if (cli_option(argc, argv, &i, "--flood", &v)) {
            bad = cli_parse_u64(v, 0, 10000, &o->flood);
        } else if (cli_option(argc, argv, &i, "--procs", &v)) {
            bad = cli_parse_u64(v, 1, MAX_PROCS, &o->procs);
        } else if (cli_option(argc, argv, &i, "--sources", &v)) {
            bad = cli_parse_u64(v, 1, 254, &o->sources);
        } else if (cli_option(argc, argv, &i, "--burst", &v)) {
            bad = cli_parse_u64(v, 1, 65536, &o->burst);
        } else if (cli_option(argc, argv, &i, "--idle", &v)) {
            bad = cli_parse_duration(v, false, MAX_DURATION_NS, &o->idle_ns);
        } else if (cli_option(argc, argv, &i, "--tick", &v)) {
            bad = cli_parse_duration(v, false, MAX_DURATION_NS, &o->tick_ns);
        } else if (cli_option(argc, argv, &i, "--period", &v)) {
            bad = cli_parse_duration(v, false, MAX_DURATION_NS, &o->period_ns);
        } else if (cli_option(argc, argv, &i, "--slack", &v)) {
            bad = cli_parse_duration(v, true, MAX_DURATION_NS, &o->slack_ns);
        } else if (cli_option(argc, argv, &i, "--ramp", &v)) {
            bad = cli_parse_duration(v, true, MAX_DURATION_NS, &o->ramp_ns);
        } else if (cli_option(argc, argv, &i, "--max-time", &v)) {
            bad =
                cli_parse_duration(v, false, MAX_DURATION_NS, &o->max_time_ns);
        } else {
            return bad_option("option", argv[i], "unknown");
        }
        if (bad)
            return bad_option(argv[i], v, "see --help for the forms");
    }
    if (o->conns == 0)
        return bad_option("--conns", NULL, "is required");
    if (o->server_argv == NULL && o->port == 0)
        return bad_option("--port", NULL, "or a server command is required");
    if (o->period_ns == 0)
        o->period_ns = o->idle_ns / 4;
    if (o->period_ns < MS || o->period_ns >= o->idle_ns)
        return bad_option("--period", NULL, "must be 1ms..idle");
    if (o->sources == 0)
        o->sources = (o->conns + o->flood + 4999) / 5000;
    if (o->sources > 254)
        o->sources = 254;
    return -1;
}

int main(int argc, char **argv)
{
    static struct load load;
    struct load *l = &load;
    uint64_t limit, per;
    size_t map_len;
    int rc = parse_options(argc, argv, &l->o);

    if (rc >= 0)
        return rc;
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);
    l->ep = -1;
    l->server_out = -1;
    /* Each worker needs its share of sockets plus a few; a started server
     * inherits the same limit. */
    l->total = l->o.conns + l->o.flood;
    limit = cli_raise_nofile(l->total + 64);
    if (limit < 128) {
        fprintf(stderr,
                "idle_load: the open-file limit (%" PRIu64 ") is too low\n",
                limit);
        return 1;
    }
    if (l->o.procs == 0)
        l->o.procs = (l->total + limit - 65) / (limit - 64);
    per = (l->total + l->o.procs - 1) / l->o.procs;
    if (l->o.procs > MAX_PROCS || per + 64 > limit) {
        fprintf(stderr,
                "idle_load: %" PRIu64 " connections per process need %" PRIu64
                " open files, the limit is %" PRIu64
                " (raise --procs or ulimit -n)\n",
                per, per + 64, limit);
        return 1;
    }
    map_len = sizeof(struct shared) + l->total * sizeof(struct cconn);
    l->sh = mmap(NULL, map_len, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (l->sh == MAP_FAILED) {
        perror("idle_load: mmap");
        return 1;
    }
    l->c = l->sh->c;
    rc = 1;
    if (l->o.server_argv != NULL && server_start(l) != 0)
        goto out;
    l->dst.sin_family = AF_INET;
    l->dst.sin_port = htons((uint16_t)l->o.port);
    if (inet_pton(AF_INET, l->o.host, &l->dst.sin_addr) != 1) {
        fprintf(stderr, "idle_load: %s is not a numeric IPv4 address\n",
                l->o.host);
        goto out;
    }
    rc = run(l);
out:
    if (l->server_pid > 0 && !server_stop(l))
        rc = 1;
    printf("result: %s\n", rc == 0           ? "PASS"
                           : rc == EXIT_LATE ? "FAIL (timing bounds only)"
                                             : "FAIL");
    munmap(l->sh, map_len);
    return rc;
}
