/* SPDX-License-Identifier: MIT */
/*
 * main.c - twheeld's command line, beanstalkd's flags where they apply.
 */
#define _GNU_SOURCE
#include "server.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char usage[] =
    "Usage: twheeld [OPTIONS]\n"
    "A beanstalkd-compatible work queue on twheel's durable timers.\n"
    "\n"
    "  -b DIR    keep every job in a journal in DIR (made if missing);\n"
    "            without -b jobs live in memory only\n"
    "  -f MS     fdatasync at most MS milliseconds after a write\n"
    "            (default 50); -f 0: reply only after the fdatasync\n"
    "  -F        never fdatasync (a crash of the process loses nothing,\n"
    "            a crash of the machine may)\n"
    "  --redis URL\n"
    "            keep every job in Redis instead (redis://host:port, ...)\n"
    "  --namespace NS\n"
    "            the Redis key prefix (default tw)\n"
    "  --node N  this server's number, 0..4095 (default 0): its job ids\n"
    "            are N * 2^40 + 1, ...; servers sharing a Redis namespace\n"
    "            each need their own\n"
    "  -l ADDR   listen on ADDR (default 0.0.0.0)\n"
    "  -p PORT   listen on TCP port PORT (default 11300; 0 = any)\n"
    "  -z BYTES  largest job body (default 65535)\n"
    "  -s BYTES  accepted for beanstalkd compatibility, ignored\n"
    "  -c, -n    accepted for beanstalkd compatibility, ignored\n"
    "  --metrics-port PORT\n"
    "            serve Prometheus metrics (twheeld's counters and the\n"
    "            store's) at http://ADDR:PORT/metrics (0 = any port)\n"
    "  -V        more log lines on stderr (repeat for more)\n"
    "  -v        print the version and exit\n"
    "  -h, --help  print this help and exit\n"
    "\n"
    "SIGUSR1 puts the server into drain mode (put answers DRAINING);\n"
    "SIGINT and SIGTERM stop it after the pending writes are durable.\n";

static int num_arg(const char *s, long lo, long hi, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    struct tbd_options o = {.addr = NULL,
                            .port = 11300,
                            .dir = NULL,
                            .fsync_ms = 50,
                            .max_job_size = 65535,
                            .verbose = 0,
                            .port_fd = -1,
                            .metrics_port = -1,
                            .metrics_port_fd = -1};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--version") || !strcmp(argv[i], "-v")) {
            printf("twheeld %s\n", TBD_VERSION);
            return 0;
        }
    }
    int opt;
    long v;
    static const struct option longopts[] = {
        {"metrics-port", required_argument, NULL, 'M'},
        {"metrics-port-fd", required_argument, NULL, 'Q'},
        {"redis", required_argument, NULL, 'R'},
        {"namespace", required_argument, NULL, 'N'},
        {"node", required_argument, NULL, 'D'},
        {NULL, 0, NULL, 0}};
    while ((opt = getopt_long(argc, argv, "b:f:Fl:p:z:s:cnVP:", longopts,
                              NULL)) != -1) {
        switch (opt) {
        case 'b':
            o.dir = optarg;
            break;
        case 'f':
            if (num_arg(optarg, 0, INT_MAX, &v)) {
                fprintf(stderr, "twheeld: -f: bad number %s\n", optarg);
                return 2;
            }
            o.fsync_ms = (int)v;
            break;
        case 'F':
            o.fsync_ms = -1;
            break;
        case 'l':
            o.addr = optarg;
            break;
        case 'p':
            if (num_arg(optarg, 0, 65535, &v)) {
                fprintf(stderr, "twheeld: -p: bad port %s\n", optarg);
                return 2;
            }
            o.port = (int)v;
            break;
        case 'z':
            /* The store keeps a body with its record in one payload of at
             * most 1 MiB; leave room for the record's head. */
            if (num_arg(optarg, 0, 1024 * 1024 - 512, &v)) {
                fprintf(stderr, "twheeld: -z: bad size %s (0..%d)\n", optarg,
                        1024 * 1024 - 512);
                return 2;
            }
            o.max_job_size = (uint32_t)v;
            break;
        case 's':
        case 'c':
        case 'n':
            break;
        case 'V':
            o.verbose++;
            break;
        case 'M':
            if (num_arg(optarg, 0, 65535, &v)) {
                fprintf(stderr, "twheeld: --metrics-port: bad port %s\n",
                        optarg);
                return 2;
            }
            o.metrics_port = (int)v;
            break;
        case 'R':
            o.redis = optarg;
            break;
        case 'N':
            o.redis_ns = optarg;
            break;
        case 'D':
            if (num_arg(optarg, 0, 4095, &v)) {
                fprintf(stderr, "twheeld: --node: bad number %s (0..4095)\n",
                        optarg);
                return 2;
            }
            o.node = (uint32_t)v;
            break;
        case 'Q':
            /* Undocumented test aid: the metrics port goes to this fd. */
            if (num_arg(optarg, 0, INT_MAX, &v))
                return 2;
            o.metrics_port_fd = (int)v;
            break;
        case 'P':
            /* Undocumented test aid: write the bound port to this fd. */
            if (num_arg(optarg, 0, INT_MAX, &v))
                return 2;
            o.port_fd = (int)v;
            break;
        default:
            fputs(usage, stderr);
            return 2;
        }
    }
    if (o.dir && o.redis) {
        fputs("twheeld: -b and --redis exclude each other\n", stderr);
        return 2;
    }
    if (optind < argc) {
        fprintf(stderr, "twheeld: unexpected argument %s\n", argv[optind]);
        return 2;
    }
    return tbd_serve(&o);
}
