/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_bstalk.c - a load generator for beanstalkd-protocol servers
 * (twheeld and beanstalkd side by side, same workload).
 *
 *   bench_bstalk [-h HOST] -p PORT [-c CONNS] [-d DEPTH] [-t SECONDS]
 *                [-s BYTES] [-n JOBS] [-D DELAY_S] MODE
 *
 * MODE put: each connection puts -s byte bodies, -d deep pipelined, for
 *   -t seconds; prints puts/s.
 * MODE reserve: each connection loops reserve-with-timeout 0 / delete
 *   (two round trips a job) until TIMED_OUT or -t seconds; prints
 *   reserve+delete/s. Fill the queue with MODE put first.
 * MODE delayed: puts -n jobs with delays spread over 1 .. -D seconds
 *   (pipelined, -c connections); prints the time taken.
 * MODE late: puts -n jobs whose body holds the Unix ms they are due at
 *   (delay 1 .. -D s), then reserves and deletes them all and prints how
 *   late each became reservable: p50, p99, max in ms, and how long the
 *   puts took. Delays are whole seconds, so the jobs fall due in -D
 *   bursts as dense as the puts were fast: with -d > 1 the figures are
 *   mostly the workers' reserve+delete rate against that density.
 * MODE steady: the same lateness, with the puts at a steady rate: -c
 *   connections put -n jobs one at a time, together -r a second, delays
 *   1 .. -D s, while -c other connections reserve and delete them as
 *   they become ready; prints p50, p99, max in ms and the put rate
 *   reached.
 * MODE ping: each connection sends `use default` (a command that touches
 *   no job and no disk) and waits for its reply, for -t seconds; prints
 *   round trips/s and the mean round trip in us: a request's cost
 *   through the server's loop, without the store.
 * One thread per connection, blocking sockets.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static const char *host = "127.0.0.1";
static const char *port;
static int conns = 1, depth = 1, seconds = 5, bytes = 64, max_delay = 3;
static double rate = 2000; /* steady mode: puts a second, all connections */
static long jobs = 100000;
static const char *mode;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void die(const char *what)
{
    fprintf(stderr, "bench_bstalk: %s: %s\n", what, strerror(errno));
    exit(1);
}

static int dial(void)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res;
    if (getaddrinfo(host, port, &hints, &res) != 0)
        die("getaddrinfo");
    int fd = socket(res->ai_family, SOCK_STREAM, 0);
    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0)
        die("connect");
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    freeaddrinfo(res);
    return fd;
}

struct rd {
    int fd;
    char buf[65536];
    size_t off, len;
};

static void send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            die("write");
        }
        p += w;
        n -= (size_t)w;
    }
}

/* Reads one line (without CRLF) into @line. */
static void read_line(struct rd *r, char *line, size_t cap)
{
    for (;;) {
        char *e = memmem(r->buf + r->off, r->len - r->off, "\r\n", 2);
        if (e) {
            size_t n = (size_t)(e - (r->buf + r->off));
            if (n >= cap)
                n = cap - 1;
            memcpy(line, r->buf + r->off, n);
            line[n] = 0;
            r->off = (size_t)(e - r->buf) + 2;
            return;
        }
        memmove(r->buf, r->buf + r->off, r->len - r->off);
        r->len -= r->off;
        r->off = 0;
        ssize_t k = read(r->fd, r->buf + r->len, sizeof(r->buf) - r->len);
        if (k <= 0)
            die("read");
        r->len += (size_t)k;
    }
}

/* Reads @n body bytes plus CRLF into @out (NULL: drop). */
static void read_body(struct rd *r, char *out, size_t n)
{
    size_t need = n + 2, got = 0;
    while (got < need) {
        if (r->off == r->len) {
            r->off = r->len = 0;
            ssize_t k = read(r->fd, r->buf, sizeof(r->buf));
            if (k <= 0)
                die("read");
            r->len = (size_t)k;
        }
        size_t k = r->len - r->off;
        if (k > need - got)
            k = need - got;
        if (out && got < n)
            memcpy(out + got, r->buf + r->off, k < n - got ? k : n - got);
        got += k;
        r->off += k;
    }
}

struct worker {
    pthread_t th;
    int idx;
    long done;
    long njobs;
    int64_t *late; /* late mode */
    long nlate;
};

static volatile int stop;

static void *run_put(void *arg)
{
    struct worker *w = arg;
    struct rd *r = calloc(1, sizeof(*r));
    r->fd = dial();
    char *body = malloc((size_t)bytes + 1);
    memset(body, 'x', (size_t)bytes);
    size_t cap = (size_t)depth * ((size_t)bytes + 64);
    char *batch = malloc(cap), line[256];
    while (!stop) {
        size_t n = 0;
        for (int i = 0; i < depth; i++) {
            n += (size_t)sprintf(batch + n, "put 0 0 60 %d\r\n", bytes);
            memcpy(batch + n, body, (size_t)bytes);
            n += (size_t)bytes;
            memcpy(batch + n, "\r\n", 2);
            n += 2;
        }
        send_all(r->fd, batch, n);
        for (int i = 0; i < depth; i++) {
            read_line(r, line, sizeof(line));
            if (strncmp(line, "INSERTED ", 9) != 0) {
                fprintf(stderr, "put: %s\n", line);
                exit(1);
            }
        }
        w->done += depth;
    }
    close(r->fd);
    free(r);
    free(body);
    free(batch);
    return NULL;
}

/* Reads one line and exits unless it is @want (the reply to @what). */
static void expect_line(struct rd *r, const char *what, const char *want)
{
    char line[256];
    read_line(r, line, sizeof(line));
    if (strcmp(line, want) != 0) {
        fprintf(stderr, "%s: %s\n", what, line);
        exit(1);
    }
}

static void *run_ping(void *arg)
{
    struct worker *w = arg;
    struct rd *r = calloc(1, sizeof(*r));
    r->fd = dial();
    while (!stop) {
        send_all(r->fd, "use default\r\n", 13);
        expect_line(r, "use", "USING default");
        w->done++;
    }
    close(r->fd);
    free(r);
    return NULL;
}

static void *run_reserve(void *arg)
{
    struct worker *w = arg;
    struct rd *r = calloc(1, sizeof(*r));
    r->fd = dial();
    char line[256], cmd[64];
    while (!stop) {
        send_all(r->fd, "reserve-with-timeout 0\r\n", 24);
        read_line(r, line, sizeof(line));
        uint64_t id;
        unsigned len;
        if (sscanf(line, "RESERVED %" SCNu64 " %u", &id, &len) != 2)
            break; /* TIMED_OUT: the queue is empty */
        read_body(r, NULL, len);
        int n = sprintf(cmd, "delete %" PRIu64 "\r\n", id);
        send_all(r->fd, cmd, (size_t)n);
        expect_line(r, "delete", "DELETED");
        w->done++;
    }
    close(r->fd);
    free(r);
    return NULL;
}

/* Puts w->njobs delayed jobs (body: due Unix ms), pipelined. */
static void *run_delayed(void *arg)
{
    struct worker *w = arg;
    struct rd *r = calloc(1, sizeof(*r));
    r->fd = dial();
    int d = depth < 1 ? 1 : depth;
    char *batch = malloc((size_t)d * 96), line[256];
    unsigned seed = (unsigned)w->idx * 7919u + 1;
    for (long sent = 0; sent < w->njobs;) {
        size_t n = 0;
        int k = 0;
        for (; k < d && sent + k < w->njobs; k++) {
            seed = seed * 1103515245u + 12345u;
            int delay = 1 + (int)((seed >> 8) % (unsigned)max_delay);
            char b[32];
            int bl = sprintf(b, "%020" PRId64, wall_ms() + delay * 1000);
            n += (size_t)sprintf(batch + n, "put 0 %d 60 %d\r\n%s\r\n", delay,
                                 bl, b);
        }
        send_all(r->fd, batch, n);
        for (int i = 0; i < k; i++) {
            read_line(r, line, sizeof(line));
            if (strncmp(line, "INSERTED ", 9) != 0) {
                fprintf(stderr, "put: %s\n", line);
                exit(1);
            }
        }
        sent += k;
        w->done = sent;
    }
    close(r->fd);
    free(r);
    free(batch);
    return NULL;
}

/* A reserved job @id of @len body bytes (its due Unix ms): reads the
 * body, deletes the job; how late it was when reserved, in ms. */
static int64_t take_late(struct rd *r, uint64_t id, unsigned len)
{
    char body[64], cmd[64], line[256];
    read_body(r, body, len < 63 ? len : 63);
    body[len < 63 ? len : 63] = 0;
    int64_t late = wall_ms() - strtoll(body, NULL, 10);
    int n = sprintf(cmd, "delete %" PRIu64 "\r\n", id);
    send_all(r->fd, cmd, (size_t)n);
    read_line(r, line, sizeof(line));
    return late;
}

/* Steady mode: puts w->njobs delayed jobs one at a time, job k of this
 * connection at t0 + (k + idx / conns) * conns / rate. */
static void *run_steady_put(void *arg)
{
    struct worker *w = arg;
    struct rd *r = calloc(1, sizeof(*r));
    r->fd = dial();
    char cmd[128], line[256];
    unsigned seed = (unsigned)w->idx * 7919u + 1;
    double t0 = now_s(), gap = conns / rate;
    for (long k = 0; k < w->njobs; k++) {
        double at = t0 + ((double)k + (double)w->idx / conns) * gap,
               wait = at - now_s();
        if (wait > 0)
            usleep((useconds_t)(wait * 1e6));
        seed = seed * 1103515245u + 12345u;
        int delay = 1 + (int)((seed >> 8) % (unsigned)max_delay);
        char b[32];
        int bl = sprintf(b, "%020" PRId64, wall_ms() + delay * 1000);
        int n = sprintf(cmd, "put 0 %d 60 %d\r\n%s\r\n", delay, bl, b);
        send_all(r->fd, cmd, (size_t)n);
        read_line(r, line, sizeof(line));
        if (strncmp(line, "INSERTED ", 9) != 0) {
            fprintf(stderr, "put: %s\n", line);
            exit(1);
        }
        w->done = k + 1;
    }
    close(r->fd);
    free(r);
    return NULL;
}

static long steady_seen; /* jobs reserved by all steady reservers */

/* Steady mode: reserves and deletes whatever falls due, recording each
 * job's lateness, until every job was seen or none came for 10 s. */
static void *run_steady_reserve(void *arg)
{
    struct worker *w = arg;
    struct rd *r = calloc(1, sizeof(*r));
    r->fd = dial();
    char line[256];
    int idle = 0;
    while (__atomic_load_n(&steady_seen, __ATOMIC_RELAXED) < jobs &&
           idle < 10) {
        send_all(r->fd, "reserve-with-timeout 1\r\n", 24);
        read_line(r, line, sizeof(line));
        uint64_t id;
        unsigned len;
        if (sscanf(line, "RESERVED %" SCNu64 " %u", &id, &len) != 2) {
            idle++;
            continue;
        }
        idle = 0;
        int64_t late = take_late(r, id, len);
        if (w->nlate < jobs)
            w->late[w->nlate++] = late;
        __atomic_add_fetch(&steady_seen, 1, __ATOMIC_RELAXED);
    }
    close(r->fd);
    free(r);
    return NULL;
}

static double steady_put_s;

static void *run_steady_puts(void *arg)
{
    struct worker *ws = arg;
    double t0 = now_s();
    for (int i = 0; i < conns; i++)
        pthread_create(&ws[i].th, NULL, run_steady_put, &ws[i]);
    for (int i = 0; i < conns; i++)
        pthread_join(ws[i].th, NULL);
    steady_put_s = now_s() - t0;
    return NULL;
}

/* Reserves until w->njobs jobs were seen; records lateness. */
static void *run_late(void *arg)
{
    struct worker *w = arg;
    struct rd *r = calloc(1, sizeof(*r));
    r->fd = dial();
    char line[256];
    while (w->nlate < w->njobs) {
        send_all(r->fd, "reserve-with-timeout 30\r\n", 25);
        read_line(r, line, sizeof(line));
        uint64_t id;
        unsigned len;
        if (sscanf(line, "RESERVED %" SCNu64 " %u", &id, &len) != 2)
            break;
        w->late[w->nlate++] = take_late(r, id, len);
    }
    close(r->fd);
    free(r);
    return NULL;
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static double run_threads(void *(*fn)(void *), struct worker *ws, int n,
                          int timed)
{
    double t0 = now_s();
    stop = 0;
    for (int i = 0; i < n; i++)
        pthread_create(&ws[i].th, NULL, fn, &ws[i]);
    if (timed) {
        usleep((useconds_t)seconds * 1000000u);
        stop = 1;
    }
    for (int i = 0; i < n; i++)
        pthread_join(ws[i].th, NULL);
    return now_s() - t0;
}

/* MODE steady: the putters (one thread starting them) and as many
 * reservers side by side; prints the lateness percentiles. */
static int steady(struct worker *ws)
{
    struct worker *rs = calloc((size_t)conns, sizeof(*rs));
    pthread_t put_th;
    for (int i = 0; i < conns; i++)
        rs[i].late = malloc((size_t)jobs * sizeof(int64_t));
    for (int i = 0; i < conns; i++)
        pthread_create(&rs[i].th, NULL, run_steady_reserve, &rs[i]);
    pthread_create(&put_th, NULL, run_steady_puts, ws);
    pthread_join(put_th, NULL);
    for (int i = 0; i < conns; i++)
        pthread_join(rs[i].th, NULL);
    int64_t *all = malloc((size_t)jobs * sizeof(int64_t));
    long n = 0;
    for (int i = 0; i < conns; i++)
        for (long k = 0; k < rs[i].nlate && n < jobs; k++)
            all[n++] = rs[i].late[k];
    if (n == 0)
        return 1;
    qsort(all, (size_t)n, sizeof(*all), cmp64);
    printf("steady: %ld of %ld delayed jobs: lateness ms p50 %" PRId64
           " p99 %" PRId64 " max %" PRId64 " (min %" PRId64
           "; put at %.0f/s of %.0f/s asked)\n",
           n, jobs, all[n / 2], all[n * 99 / 100], all[n - 1], all[0],
           (double)jobs / steady_put_s, rate);
    for (int i = 0; i < conns; i++)
        free(rs[i].late);
    free(rs);
    free(all);
    return 0;
}

/* Runs MODE with the workers @ws and prints its line; the exit status. */
static int run_mode(struct worker *ws)
{
    long total = 0;
    if (!strcmp(mode, "put") || !strcmp(mode, "reserve")) {
        double el = run_threads(!strcmp(mode, "put") ? run_put : run_reserve,
                                ws, conns, 1);
        for (int i = 0; i < conns; i++)
            total += ws[i].done;
        printf("%s: %d conns, depth %d, %d-byte bodies: %ld in %.2f s = "
               "%.0f/s\n",
               mode, conns, depth, bytes, total, el, total / el);
    } else if (!strcmp(mode, "delayed")) {
        double el = run_threads(run_delayed, ws, conns, 0);
        printf("delayed: %ld jobs (delay 1..%d s) put in %.2f s = %.0f/s\n",
               jobs, max_delay, el, jobs / el);
    } else if (!strcmp(mode, "late")) {
        double put_s = run_threads(run_delayed, ws, conns, 0);
        for (int i = 0; i < conns; i++)
            ws[i].late = malloc((size_t)ws[i].njobs * sizeof(int64_t));
        run_threads(run_late, ws, conns, 0);
        int64_t *all = malloc((size_t)jobs * sizeof(int64_t));
        long n = 0;
        for (int i = 0; i < conns; i++)
            for (long k = 0; k < ws[i].nlate; k++)
                all[n++] = ws[i].late[k];
        qsort(all, (size_t)n, sizeof(*all), cmp64);
        if (n == 0)
            return 1;
        printf("late: %ld delayed jobs: lateness ms p50 %" PRId64
               " p99 %" PRId64 " max %" PRId64 " (min %" PRId64
               "; put in %.2f s)\n",
               n, all[n / 2], all[n * 99 / 100], all[n - 1], all[0], put_s);
    } else if (!strcmp(mode, "ping")) {
        double el = run_threads(run_ping, ws, conns, 1);
        for (int i = 0; i < conns; i++)
            total += ws[i].done;
        printf("ping: %d conns: %ld round trips in %.2f s = %.0f/s, "
               "mean %.1f us\n",
               conns, total, el, total / el, el * 1e6 * conns / (double)total);
    } else if (!strcmp(mode, "steady")) {
        return steady(ws);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    return 0;
}

int main(int argc, char **argv)
{
    static const char usage[] =
        "usage: bench_bstalk -p PORT [-h HOST] [-c CONNS] [-d DEPTH] "
        "[-t S] [-s BYTES] [-n JOBS] [-D DELAY_S] [-r RATE] "
        "put|reserve|delayed|late|steady|ping\n";
    if (argc == 2 && !strcmp(argv[1], "--help")) {
        fputs(usage, stdout);
        return 0;
    }
    int opt;
    while ((opt = getopt(argc, argv, "h:p:c:d:t:s:n:D:r:")) != -1) {
        switch (opt) {
        case 'h':
            host = optarg;
            break;
        case 'p':
            port = optarg;
            break;
        case 'c':
            conns = atoi(optarg);
            break;
        case 'd':
            depth = atoi(optarg);
            break;
        case 't':
            seconds = atoi(optarg);
            break;
        case 's':
            bytes = atoi(optarg);
            break;
        case 'n':
            jobs = atol(optarg);
            break;
        case 'D':
            max_delay = atoi(optarg);
            break;
        case 'r':
            rate = atof(optarg);
            break;
        default:
            return 2;
        }
    }
    if (!port || optind >= argc || conns < 1 || depth < 1 || max_delay < 1 ||
        !(rate > 0)) {
        fputs(usage, stderr);
        return 2;
    }
    mode = argv[optind];
    struct worker *ws = calloc((size_t)conns, sizeof(*ws));
    for (int i = 0; i < conns; i++) {
        ws[i].idx = i;
        ws[i].njobs = jobs / conns + (i < jobs % conns);
    }
    return run_mode(ws);
}
