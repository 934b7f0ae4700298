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
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char usage[] =
    "Usage: twheeld [OPTIONS]\n"
    "A beanstalkd-compatible work queue on twheel's durable timers.\n"
    "\n"
    "  -b DIR    keep every job in a journal in DIR (an existing\n"
    "            directory, as beanstalkd's); without -b jobs live in\n"
    "            memory only\n"
    "  -f MS     fdatasync at most MS milliseconds after a write\n"
    "            (default 50); -f 0: reply only after the fdatasync\n"
    "  -F        never fdatasync (a crash of the process loses nothing,\n"
    "            a crash of the machine may)\n"
    "  --redis URL\n"
    "            keep every job in Redis instead (redis://host:port, ...)\n"
    "  --redis-user USER\n"
    "            the Redis ACL user (default: the URL's)\n"
    "  --redis-password-file FILE\n"
    "            the Redis password: FILE's first line (or set\n"
    "            TWHEELD_REDIS_PASSWORD; either keeps it out of ps, where\n"
    "            a password in the URL shows until the server hides it)\n"
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

/* A number option @name's argument @s in [@lo, @hi] into *@out; false
 * (said on stderr) if it is not one. */
static bool num_opt(const char *name, const char *s, long lo, long hi,
                    long *out)
{
    if (num_arg(s, lo, hi, out) == 0)
        return true;
    fprintf(stderr, "twheeld: %s: bad number %s (%ld..%ld)\n", name, s, lo, hi);
    return false;
}

/* The first line of @path (without its end of line), malloc'd; NULL, said
 * on stderr, if it cannot be read or is empty. */
static char *first_line(const char *path)
{
    FILE *f = fopen(path, "r");
    char buf[1024];
    if (!f || !fgets(buf, sizeof(buf), f)) {
        fprintf(stderr, "twheeld: --redis-password-file %s: %s\n", path,
                f ? "empty" : strerror(errno));
        if (f)
            fclose(f);
        return NULL;
    }
    fclose(f);
    buf[strcspn(buf, "\r\n")] = '\0';
    char *p = buf[0] ? strdup(buf) : NULL;
    explicit_bzero(buf, sizeof(buf));
    if (!p)
        fprintf(stderr, "twheeld: --redis-password-file %s: empty\n", path);
    return p;
}

/*
 * The URL @arg with any password in it overwritten in argv (so that ps
 * shows "redis://user:***@..." once the server runs): a copy is returned
 * for the store. Never NULL but when out of memory (exit 1).
 */
static const char *hide_url_password(char *arg)
{
    char *url = strdup(arg);
    if (!url) {
        fputs("twheeld: out of memory\n", stderr);
        exit(1);
    }
    size_t off, len;
    if (tbd_url_password(arg, &off, &len))
        memset(arg + off, '*', len);
    return url;
}

/* One option @opt (getopt_long's) into @o; 0, or the exit code. */
static int take_opt(struct tbd_options *o, int opt, char *arg)
{
    long v;
    switch (opt) {
    case 'b':
        o->dir = arg;
        return 0;
    case 'f':
        if (!num_opt("-f", arg, 0, INT_MAX, &v))
            return 2;
        o->fsync_ms = (int)v;
        return 0;
    case 'F':
        o->fsync_ms = -1;
        return 0;
    case 'l':
        o->addr = arg;
        return 0;
    case 'p':
        if (!num_opt("-p", arg, 0, 65535, &v))
            return 2;
        o->port = (int)v;
        return 0;
    case 'z':
        /* The store keeps a body with its record in one payload of at
         * most 1 MiB; leave room for the record's head. */
        if (!num_opt("-z", arg, 0, 1024 * 1024 - 512, &v))
            return 2;
        o->max_job_size = (uint32_t)v;
        return 0;
    case 's':
    case 'c':
    case 'n':
        return 0;
    case 'V':
        o->verbose++;
        return 0;
    }
    return -1;
}

/* The long options into @o; 0, or the exit code (2: usage). */
static int take_long_opt(struct tbd_options *o, int opt, char *arg)
{
    long v;
    switch (opt) {
    case 'M':
        if (!num_opt("--metrics-port", arg, 0, 65535, &v))
            return 2;
        o->metrics_port = (int)v;
        return 0;
    case 'R':
        free((char *)o->redis); /* given twice: the last counts */
        o->redis = hide_url_password(arg);
        return 0;
    case 'U':
        o->redis_user = arg;
        return 0;
    case 'W':
        free((char *)o->redis_password);
        o->redis_password = first_line(arg);
        return o->redis_password ? 0 : 1;
    case 'N':
        o->redis_ns = arg;
        return 0;
    case 'D':
        if (!num_opt("--node", arg, 0, 4095, &v))
            return 2;
        o->node = (uint32_t)v;
        return 0;
    case 'Q': /* undocumented test aid: the metrics port goes to this fd */
    case 'P': /* undocumented test aid: the bound port goes to this fd */
        if (num_arg(arg, 0, INT_MAX, &v))
            return 2;
        *(opt == 'Q' ? &o->metrics_port_fd : &o->port_fd) = (int)v;
        return 0;
    }
    fputs(usage, stderr);
    return 2;
}

/* What the options say together; 0, or the exit code. */
static int check_opts(struct tbd_options *o)
{
    if (o->dir && o->redis) {
        fputs("twheeld: -b and --redis exclude each other\n", stderr);
        return 2;
    }
    if ((o->redis_user || o->redis_password) && !o->redis) {
        fputs("twheeld: a Redis user or password needs --redis\n", stderr);
        return 2;
    }
    char *env = getenv("TWHEELD_REDIS_PASSWORD");
    if (env && !o->redis_password && o->redis) {
        o->redis_password = strdup(env);
        if (!o->redis_password)
            return 1;
    }
    if (env) /* wiped in place: gone from /proc/PID/environ too */
        explicit_bzero(env, strlen(env));
    unsetenv("TWHEELD_REDIS_PASSWORD"); /* not inherited by children */
    struct stat st;
    const char *why = NULL;
    if (o->dir && stat(o->dir, &st) != 0)
        why = strerror(errno);
    else if (o->dir && !S_ISDIR(st.st_mode))
        why = "not a directory";
    if (why) { /* as beanstalkd: the directory must exist */
        fprintf(stderr, "twheeld: -b %s: %s\n", o->dir, why);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    struct tbd_options o = {.port = 11300,
                            .fsync_ms = 50,
                            .max_job_size = 65535,
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
    static const struct option longopts[] = {
        {"metrics-port", required_argument, NULL, 'M'},
        {"metrics-port-fd", required_argument, NULL, 'Q'},
        {"redis", required_argument, NULL, 'R'},
        {"redis-user", required_argument, NULL, 'U'},
        {"redis-password-file", required_argument, NULL, 'W'},
        {"namespace", required_argument, NULL, 'N'},
        {"node", required_argument, NULL, 'D'},
        {NULL, 0, NULL, 0}};
    int opt, rc = 0;
    while (rc == 0 && (opt = getopt_long(argc, argv, "b:f:Fl:p:z:s:cnVP:",
                                         longopts, NULL)) != -1) {
        rc = take_opt(&o, opt, optarg);
        if (rc < 0)
            rc = take_long_opt(&o, opt, optarg);
    }
    if (rc == 0 && optind < argc) {
        fprintf(stderr, "twheeld: unexpected argument %s\n", argv[optind]);
        rc = 2;
    }
    if (rc == 0)
        rc = check_opts(&o);
    if (rc == 0)
        rc = tbd_serve(&o);
    /* The copies main made (hide_url_password(), the password). */
    free((char *)o.redis);
    if (o.redis_password) {
        explicit_bzero((char *)o.redis_password, strlen(o.redis_password));
        free((char *)o.redis_password);
    }
    return rc;
}
