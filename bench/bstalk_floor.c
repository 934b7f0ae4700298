/* SPDX-License-Identifier: MIT */
/*
 * bench/bstalk_floor.c - the floor under a beanstalkd server's request
 * rate on this machine: a server that keeps nothing and answers at once.
 *
 *   bstalk_floor -p PORT
 *
 * One thread, one epoll loop on 127.0.0.1:PORT, as beanstalkd and twheeld
 * have. It answers what bench_bstalk sends: `put` (the body skipped)
 * INSERTED, `reserve-with-timeout` RESERVED with a 64-byte body (always a
 * job), `delete` DELETED, `use` USING, anything else UNKNOWN_COMMAND;
 * each read's commands answered with one write. No job is stored, no
 * file written. What it reaches for one connection is the rate that the
 * load generator, the loopback round trip and the kernel allow any
 * server: a target above it for a real server cannot be met here
 * (scripts/bench_twheeld.sh runs it beside the two servers).
 *
 *   bstalk_floor -p PORT -b DIR
 *
 * The same with a group commit as cheap as one can be, the floor under
 * a reply after fdatasync (beanstalkd -f 0, twheeld -f 0): the answers of
 * one loop turn wait until one pwrite of 112 bytes per put of the turn
 * (at the end of a preallocated 64 MiB file in DIR, from its start again
 * once full) and one fdatasync have returned. No parsing of bodies, no
 * job kept: what is left is the client, the round trips and the disk.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define BUF 65536
#define REC 112                /* bytes written per put (-b) */
#define FILE_BYTES (64u << 20) /* the preallocated file (-b) */

struct conn {
    int fd;
    struct conn *next; /* -b: in the turn's list of held answers */
    size_t outn;       /* -b: bytes of out[] held for the sync */
    int dead;          /* -b: to close after the sync (in the list) */
    size_t have;       /* bytes in in[] */
    size_t skip;       /* body bytes of a put still to come */
    unsigned long n;   /* ids handed out */
    char in[BUF];
    char out[BUF];
};

/* Answer one command line @l (NUL-terminated, no CRLF) into @o; the
 * bytes written. *@body: bytes of body that follow (put). */
static unsigned long turn_puts; /* -b: puts of this loop turn */

static size_t answer(struct conn *c, const char *l, char *o, size_t *body)
{
    unsigned pri, delay, ttr, bytes;
    static const char job[65] =
        "0123456789012345678901234567890123456789012345678901234567890123";
    if (sscanf(l, "put %u %u %u %u", &pri, &delay, &ttr, &bytes) == 4) {
        *body = (size_t)bytes + 2;
        turn_puts++;
        return (size_t)sprintf(o, "INSERTED %lu\r\n", ++c->n);
    }
    if (!strncmp(l, "reserve", 7))
        return (size_t)sprintf(o, "RESERVED %lu 64\r\n%s\r\n", ++c->n, job);
    if (!strncmp(l, "delete ", 7))
        return (size_t)sprintf(o, "DELETED\r\n");
    if (!strncmp(l, "use ", 4))
        return (size_t)snprintf(o, 256, "USING %.200s\r\n", l + 4);
    return (size_t)sprintf(o, "UNKNOWN_COMMAND\r\n");
}

/* The complete commands in @c->in, answered into @c->out after the
 * @c->outn bytes held there: bytes to write. */
static size_t serve(struct conn *c)
{
    size_t pos = 0, out = c->outn;
    while (pos < c->have) {
        if (c->skip) {
            size_t k = c->have - pos < c->skip ? c->have - pos : c->skip;
            pos += k;
            c->skip -= k;
            continue;
        }
        char *eol = memmem(c->in + pos, c->have - pos, "\r\n", 2);
        if (!eol || out + 512 > BUF)
            break;
        *eol = '\0';
        out += answer(c, c->in + pos, c->out + out, &c->skip);
        pos = (size_t)(eol - c->in) + 2;
    }
    memmove(c->in, c->in + pos, c->have - pos);
    c->have -= pos;
    return out;
}

/* Writes @c's answers, @n bytes: 0, or -1 when the connection is done. */
static int write_out(struct conn *c, size_t n)
{
    for (size_t done = 0; done < n;) {
        ssize_t w = write(c->fd, c->out + done, n - done);
        if (w < 0 && errno != EAGAIN && errno != EINTR)
            return -1;
        done += w > 0 ? (size_t)w : 0;
    }
    return 0;
}

/* Read what @c has, answer it: 0, or -1 when the connection is done. */
static int on_readable(struct conn *c)
{
    for (;;) {
        ssize_t r = read(c->fd, c->in + c->have, BUF - c->have);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return 0;
        if (r <= 0)
            return -1;
        c->have += (size_t)r;
        if (write_out(c, serve(c)) < 0)
            return -1;
        if (c->have == BUF)
            return -1; /* a line longer than the buffer */
    }
}

/* -b: one read of @c, its answers held in @c->out until the turn's sync
 * (@c joins *@held); 0, or -1 when the connection is done. */
static int on_readable_held(struct conn *c, struct conn **held)
{
    ssize_t r = read(c->fd, c->in + c->have, BUF - c->have);
    if (r < 0 && (errno == EINTR || errno == EAGAIN))
        return 0;
    if (!c->outn && !c->dead) {
        c->next = *held;
        *held = c;
    }
    if (r <= 0 || c->have + (size_t)r == BUF) {
        c->dead = 1; /* closed, or a line longer than the buffer */
        return -1;
    }
    c->have += (size_t)r;
    c->outn = serve(c);
    return 0;
}

/* -b: the turn's puts to the file at @fd (one pwrite, one fdatasync),
 * then the held answers. */
static void sync_turn(int fd, struct conn *held)
{
    static char rec[BUF];
    static off_t at;
    size_t n = turn_puts * REC;
    turn_puts = 0;
    while (n) {
        size_t k = n < sizeof rec ? n : sizeof rec;
        if (at + (off_t)k > (off_t)FILE_BYTES)
            at = 0;
        if (pwrite(fd, rec, k, at) != (ssize_t)k || fdatasync(fd) != 0) {
            perror("bstalk_floor: write");
            exit(1);
        }
        at += (off_t)k;
        n -= k;
    }
    for (struct conn *c = held, *nx; c; c = nx) {
        nx = c->next;
        size_t k = c->outn;
        c->outn = 0;
        if (c->dead || write_out(c, k) < 0) {
            close(c->fd);
            free(c);
        }
    }
}

static int listen_on(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    int one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 1024)) {
        perror("bstalk_floor: listen");
        exit(1);
    }
    return fd;
}

static void accept_all(int ep, int lfd)
{
    int fd;
    while ((fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct conn *c = calloc(1, sizeof *c);
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
    }
}

static void usage(FILE *f)
{
    fprintf(f, "usage: bstalk_floor -p PORT [-b DIR]\n");
}

/* -b DIR: the preallocated file the turns' puts are written to. */
static int open_file(const char *dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/floor.dat", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || fallocate(fd, 0, 0, FILE_BYTES) != 0 || fsync(fd) != 0) {
        perror("bstalk_floor: -b");
        exit(1);
    }
    return fd;
}

int main(int argc, char **argv)
{
    if (argc == 2 && !strcmp(argv[1], "--help")) {
        usage(stdout);
        return 0;
    }
    if ((argc != 3 && !(argc == 5 && !strcmp(argv[3], "-b"))) ||
        strcmp(argv[1], "-p") != 0 || atoi(argv[2]) <= 0) {
        usage(stderr);
        return 2;
    }
    int dfd = argc == 5 ? open_file(argv[4]) : -1;
    int lfd = listen_on(atoi(argv[2]));
    int ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    for (;;) {
        struct epoll_event evs[64];
        struct conn *held = NULL;
        int n = epoll_wait(ep, evs, 64, -1);
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (!c) {
                accept_all(ep, lfd);
            } else if (dfd >= 0) {
                on_readable_held(c, &held); /* closed after the sync */
            } else if (on_readable(c) < 0) {
                close(c->fd);
                free(c);
            }
        }
        if (dfd >= 0)
            sync_turn(dfd, held);
    }
}
