/* SPDX-License-Identifier: MIT */
/*
 * server.h - twheeld's entry point, tbd_serve() (server.c); the job model
 * and the rest of the server are in tbd.h.
 */
#ifndef TWHEELD_SERVER_H
#define TWHEELD_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tbd_options {
    const char *addr;           /* -l: listen address (NULL = 0.0.0.0) */
    int port;                   /* -p */
    const char *dir;            /* -b: journal directory, NULL = memory only */
    const char *redis;          /* --redis: the store on Redis (not with -b) */
    const char *redis_ns;       /* --namespace (NULL = the library's "tw") */
    const char *redis_user;     /* --redis-user (NULL = the URL's) */
    const char *redis_password; /* --redis-password-file or the environment
                                   (NULL = the URL's) */
    uint32_t node;              /* --node: this server's share of job ids */
    int fsync_ms;               /* -f MS (0 = every write), -1 with -F */
    uint32_t max_job_size;      /* -z */
    int verbose;                /* -V count */
    int port_fd;         /* test aid: write the bound port there, or -1 */
    int metrics_port;    /* --metrics-port: HTTP /metrics, -1 = none */
    int metrics_port_fd; /* test aid: its bound port goes there, or -1 */
};

/* Where the password in @url's user part is (util.c); false without one. */
bool tbd_url_password(const char *url, size_t *off, size_t *len);

/* Runs the server until SIGINT/SIGTERM. Returns the process exit code. */
int tbd_serve(const struct tbd_options *opt);

#endif
