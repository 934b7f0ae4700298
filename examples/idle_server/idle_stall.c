/* SPDX-License-Identifier: MIT */
/*
 * idle_stall - checks that idle_server keeps every client that sent within
 * --idle, even after the server stalled with more clients ready than one
 * epoll_wait() returns. Used by idle_server_test.sh.
 *
 * Usage: idle_stall --port N --pid PID --idle DUR [--active N] [--silent N]
 *
 * It opens active + silent connections to 127.0.0.1:PORT, sends one byte
 * on each and reads the echo (each connection's last read), then stops the
 * server (SIGSTOP). Half an idle later every active connection sends one
 * byte, into the stopped server's socket buffers; at 1.25 idle after the
 * stop the server continues (SIGCONT). By then every silent connection is
 * past its deadline and every active one has been silent for only about
 * 0.75 idle: each active one must get its echo back, none may be closed.
 *
 * Prints "active: A open, B closed" and "silent: C closed of D".
 * Exit codes: 0 pass; 1 an active connection was closed; 2 bad options;
 * 3 inconclusive (this tool was delayed so long that an active connection
 * had really been silent for --idle, or the silent ones were not closed
 * within 5 s): the caller retries with a longer --idle.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cli.h"

#define SEC UINT64_C(1000000000)

static void sleep_until(uint64_t t)
{
    for (uint64_t now = cli_now_ns(); now < t; now = cli_now_ns()) {
        struct timespec ts = {(time_t)((t - now) / SEC),
                              (long)((t - now) % SEC)};
        nanosleep(&ts, NULL);
    }
}

static int open_conn(uint16_t port)
{
    struct sockaddr_in a = {0};
    int fd = socket(AF_INET, SOCK_STREAM, 0);

    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        perror("idle_stall: connect");
        exit(1);
    }
    return fd;
}

/* Read one byte from @fd within @ms: 1 (the echo), 0 (closed) or -1. */
static int read_echo(int fd, int ms)
{
    struct pollfd p = {fd, POLLIN, 0};
    char b;

    if (poll(&p, 1, ms) != 1)
        return -1;
    ssize_t n = recv(fd, &b, 1, 0);
    return n == 1 ? 1 : n == 0 || errno == ECONNRESET ? 0 : -1;
}

static int usage_error(const char *why)
{
    fprintf(stderr,
            "idle_stall: %s\nusage: idle_stall --port N --pid PID "
            "--idle DUR [--active N] [--silent N]\n",
            why);
    return CLI_EXIT_USAGE;
}

int main(int argc, char **argv)
{
    uint64_t port = 0, pid = 0, idle = 0, active = 1500, silent = 500;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: idle_stall --port N --pid PID --idle DUR "
                   "[--active N] [--silent N]\n");
            return 0;
        }
        const char *v = NULL;
        int bad = 0;
        if (cli_option(argc, argv, &i, "--port", &v))
            bad = cli_parse_u64(v, 1, 65535, &port);
        else if (cli_option(argc, argv, &i, "--pid", &v))
            bad = cli_parse_u64(v, 1, INT32_MAX, &pid);
        else if (cli_option(argc, argv, &i, "--idle", &v))
            bad = cli_parse_duration(v, false, 3600 * SEC, &idle);
        else if (cli_option(argc, argv, &i, "--active", &v))
            bad = cli_parse_u64(v, 1, 100000, &active);
        else if (cli_option(argc, argv, &i, "--silent", &v))
            bad = cli_parse_u64(v, 0, 100000, &silent);
        else
            return usage_error("unknown option");
        if (bad)
            return usage_error("bad option value");
    }
    if (port == 0 || pid == 0 || idle == 0)
        return usage_error("--port, --pid and --idle are required");
    uint64_t n = active + silent;
    if (n > 200000) /* both are parsed as at most 100000 */
        return usage_error("too many connections");
    if (cli_raise_nofile(n + 64) < n + 64)
        return usage_error("cannot open that many descriptors");
    int *fd = calloc(n, sizeof *fd);
    if (fd == NULL)
        return 1;

    for (uint64_t i = 0; i < n; i++) {
        fd[i] = open_conn((uint16_t)port);
        if (send(fd[i], "x", 1, 0) != 1)
            return 1;
    }
    for (uint64_t i = 0; i < n; i++)
        if (read_echo(fd[i], 5000) != 1) {
            fprintf(stderr, "idle_stall: no first echo\n");
            return 1;
        }

    uint64_t t_stop = cli_now_ns();
    if (kill((pid_t)pid, SIGSTOP) != 0) {
        perror("idle_stall: SIGSTOP");
        return 1;
    }
    sleep_until(t_stop + idle / 2);
    uint64_t t_send = cli_now_ns();
    for (uint64_t i = 0; i < active; i++)
        if (send(fd[i], "y", 1, 0) != 1)
            return 1;
    sleep_until(t_stop + idle + idle / 4);
    uint64_t t_cont = cli_now_ns();
    kill((pid_t)pid, SIGCONT);

    uint64_t open = 0, closed = 0, gone = 0;
    for (uint64_t i = 0; i < active; i++) {
        int r = read_echo(fd[i], 5000);
        open += r == 1;
        closed += r != 1;
    }
    for (uint64_t i = active; i < n; i++)
        gone += read_echo(fd[i], 5000) == 0;
    printf("active: %llu open, %llu closed\n", (unsigned long long)open,
           (unsigned long long)closed);
    printf("silent: %llu closed of %llu\n", (unsigned long long)gone,
           (unsigned long long)silent);
    for (uint64_t i = 0; i < n; i++)
        close(fd[i]);
    free(fd);
    /* Inconclusive when the last active byte left after the first send
     * plus a full idle had passed by the continue (this tool was late). */
    if (t_cont - t_send >= idle) {
        printf("inconclusive: the stall was %.0f ms after the sends\n",
               (double)(t_cont - t_send) / 1e6);
        return 3;
    }
    if (closed != 0)
        return 1;
    return gone == silent ? 0 : 3;
}
