/* SPDX-License-Identifier: MIT */
/*
 * examples/metrics_server.c - serve a durable store's metrics on /metrics
 * over HTTP, for a Prometheus server (or any OpenMetrics scraper).
 *
 * It opens a journal store in a directory, schedules --timers demo timers
 * (half due at once, half an hour from now), waits until the due half has
 * fired, then answers GET /metrics on 127.0.0.1 with
 * tw_durable_metrics(): the OpenMetrics text when the request's Accept
 * header asks for application/openmetrics-text, else the Prometheus text
 * format 0.0.4. One request per connection, one connection at a time; a
 * client that sends nothing for 2 s is dropped.
 *
 * Usage:
 *   metrics_server [--dir DIR] [--port N] [--timers N] [--requests N]
 *     --dir DIR       the store's directory (default: a new one in /tmp)
 *     --port N        the port on 127.0.0.1 (default 0: any free one)
 *     --timers N      demo timers to schedule (default 10)
 *     --requests N    exit after N requests (default 0: run until SIGTERM)
 * It prints "listening on 127.0.0.1:PORT" once it accepts scrapes.
 */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <twheel/durable.h>

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
    (void)sig;
    stop = 1;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)t;
    (void)arg;
    return 0;
}

static int usage(FILE *f, int rc)
{
    fprintf(f, "usage: metrics_server [--dir DIR] [--port N] [--timers N] "
               "[--requests N]\n");
    return rc;
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

/* Read one request head (up to the blank line) into @req. */
static size_t read_head(int fd, char *req, size_t cap)
{
    size_t n = 0;
    while (n + 1 < cap) {
        struct pollfd p = {fd, POLLIN, 0};
        if (poll(&p, 1, 2000) <= 0)
            return 0;
        ssize_t r = recv(fd, req + n, cap - 1 - n, 0);
        if (r <= 0)
            return 0;
        n += (size_t)r;
        req[n] = '\0';
        if (strstr(req, "\r\n\r\n"))
            return n;
    }
    return 0;
}

static void serve(int fd, tw_durable *d)
{
    char req[8192];
    if (!read_head(fd, req, sizeof req))
        return;
    if (strncmp(req, "GET /metrics ", 13) != 0) {
        static const char nf[] =
            "HTTP/1.1 404 Not Found\r\n"
            "Content-Length: 0\r\nConnection: close\r\n\r\n";
        send_all(fd, nf, sizeof nf - 1);
        return;
    }
    unsigned flags = strstr(req, "application/openmetrics-text")
                         ? TW_DURABLE_METRICS_OPENMETRICS
                         : 0;
    char small[16384], *body = small;
    long n = tw_durable_metrics(d, NULL, flags, small, sizeof small);
    if (n >= (long)sizeof small) { /* did not fit: the length it needs */
        body = malloc((size_t)n + 1);
        if (body)
            n = tw_durable_metrics(d, NULL, flags, body, (size_t)n + 1);
    }
    if (!body || n < 0) {
        static const char err[] =
            "HTTP/1.1 500 Internal Server Error\r\n"
            "Content-Length: 0\r\nConnection: close\r\n\r\n";
        send_all(fd, err, sizeof err - 1);
    } else {
        char hdr[256];
        int h = snprintf(hdr, sizeof hdr,
                         "HTTP/1.1 200 OK\r\nContent-Type: %s\r\n"
                         "Content-Length: %ld\r\nConnection: close\r\n\r\n",
                         flags ? "application/openmetrics-text; "
                                 "version=1.0.0; charset=utf-8"
                               : "text/plain; version=0.0.4; charset=utf-8",
                         n);
        send_all(fd, hdr, (size_t)h);
        send_all(fd, body, (size_t)n);
    }
    if (body != small)
        free(body);
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    long port = 0, timers = 10, requests = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help"))
            return usage(stdout, 0);
        if (i + 1 >= argc)
            return usage(stderr, 2);
        if (!strcmp(argv[i], "--dir"))
            dir = argv[++i];
        else if (!strcmp(argv[i], "--port"))
            port = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--timers"))
            timers = strtol(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--requests"))
            requests = strtol(argv[++i], NULL, 10);
        else
            return usage(stderr, 2);
    }
    if (port < 0 || port > 65535 || timers < 0 || requests < 0)
        return usage(stderr, 2);
    char tmpl[] = "/tmp/metrics_server.XXXXXX";
    if (!dir && !(dir = mkdtemp(tmpl))) {
        perror("mkdtemp");
        return 1;
    }
    char why[256]; /* errbuf_len: how many bytes errbuf holds */
    tw_durable_config cfg = {
        .dir = dir, .fire = on_fire, .errbuf = why, .errbuf_len = sizeof why};
    tw_durable *d;
    int rc = tw_durable_open(&d, &cfg);
    if (rc) {
        fprintf(stderr, "open %s: %s: %s\n", dir, tw_strerror(rc), why);
        return 1;
    }
    int64_t t0 = now_ms();
    for (long i = 0; i < timers; i++) {
        char key[32];
        int kl = snprintf(key, sizeof key, "demo-%ld", i);
        int64_t due = i % 2 ? t0 + 30 * 60 * 1000 : t0;
        if ((rc = tw_durable_schedule(d, key, (size_t)kl, due, "", 0))) {
            fprintf(stderr, "schedule: %s\n", tw_strerror(rc));
            return 1;
        }
    }
    /* Wait (up to 10 s) until the due half has fired. */
    tw_durable_stats st;
    for (int i = 0; i < 1000; i++) {
        if (tw_durable_stats_get(d, &st) == 0 &&
            st.fired >= (uint64_t)(timers + 1) / 2)
            break;
        nanosleep(&(struct timespec){0, 10000000L}, NULL);
    }

    int ls = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof a;
    if (ls < 0 || bind(ls, (struct sockaddr *)&a, sizeof a) || listen(ls, 16) ||
        getsockname(ls, (struct sockaddr *)&a, &al)) {
        perror("listen");
        return 1;
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    printf("listening on 127.0.0.1:%u\n", ntohs(a.sin_port));
    fflush(stdout);
    for (long served = 0; !stop && (!requests || served < requests);) {
        int c = accept(ls, NULL, NULL);
        if (c < 0)
            continue; /* EINTR: check stop */
        serve(c, d);
        close(c);
        served++;
    }
    close(ls);
    return tw_durable_close(d) ? 1 : 0;
}
