/* SPDX-License-Identifier: MIT */
/*
 * bench/fsync_probe.c - the disk's floor under a durable call: the latency
 * of one small pwrite() followed by fdatasync(), appended to a file that is
 * grown by each write (as an append-only file is), preallocated with
 * fallocate() (as the journal's segments are), or filled with zeros first.
 *
 * Usage: fsync_probe DIR [COUNT [BYTES [KIND [THREADS]]]]   (defaults:
 * 2000 calls of 112 bytes, the size of one journal record with a 16-byte
 * key and a 64-byte payload; every kind, or the one KIND named: grown,
 * fallocate, zeroed; one thread). Prints p50, p90 and p99 in microseconds
 * for each file kind, cpu_us: the CPU time (user and system) the process
 * spent per call, the device's cost to a caller before any work of its
 * own, and calls_per_s, calls over the wall time of the whole probe.
 *
 * With THREADS > 1, that many threads make COUNT calls each on one file,
 * as the journal's callers do: each takes the next BYTES of the file from
 * a shared counter, writes them and fdatasyncs, so several fdatasyncs of
 * the same file (often of the same page) are in flight at once. Whether
 * they overlap on this disk and file system is the question it answers:
 * calls_per_s near THREADS times the one-thread figure at the same p50
 * means they do; near the one-thread figure with THREADS times the p50
 * means they run one after the other.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "bench_stats.h"

enum kind { GROWN, FALLOCATED, ZEROED };
static const char *const kind_name[] = {"grown", "fallocate", "zeroed"};

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static double cpu_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

/* Make the file of @kind, big enough for @bytes; 0 or -1. */
static int prepare(int fd, enum kind kind, size_t bytes)
{
    if (kind == FALLOCATED)
        return fallocate(fd, 0, 0, (off_t)bytes);
    if (kind == ZEROED) {
        static char zero[1 << 16];
        for (size_t off = 0; off < bytes; off += sizeof zero)
            if (pwrite(fd, zero, sizeof zero, (off_t)off) != sizeof zero)
                return -1;
    }
    return fsync(fd);
}

/* One probe's shared state: the file, the next free offset, the calls'
 * latencies (thread t's at lat[t * count ...]). */
struct run {
    int fd;
    size_t len;
    int count;
    _Atomic long long next; /* the next write's offset */
    _Atomic int failed;
    double *lat;
};

struct caller {
    pthread_t th;
    struct run *run;
    int id;
};

static void *caller_main(void *arg)
{
    struct caller *c = arg;
    struct run *r = c->run;
    char *buf = malloc(r->len);
    if (buf == NULL) {
        atomic_store(&r->failed, 1);
        return NULL;
    }
    memset(buf, 'x', r->len);
    for (int i = 0; i < r->count && !atomic_load(&r->failed); i++) {
        double t0 = now_us();
        off_t off = (off_t)atomic_fetch_add(&r->next, (long long)r->len);
        if (pwrite(r->fd, buf, r->len, off) != (ssize_t)r->len ||
            fdatasync(r->fd) != 0) {
            perror("fsync_probe: write");
            atomic_store(&r->failed, 1);
            break;
        }
        r->lat[(size_t)c->id * (size_t)r->count + (size_t)i] = now_us() - t0;
    }
    free(buf);
    return NULL;
}

/* Run @threads callers of @r->count calls each; 0 or -1. */
static int run_callers(struct run *r, int threads)
{
    struct caller c[64];
    int started = 0;
    for (; started < threads; started++) {
        c[started] = (struct caller){.run = r, .id = started};
        if (pthread_create(&c[started].th, NULL, caller_main, &c[started]))
            break;
    }
    for (int i = 0; i < started; i++)
        pthread_join(c[i].th, NULL);
    return started == threads && !atomic_load(&r->failed) ? 0 : -1;
}

static int probe(const char *dir, enum kind kind, int count, size_t len,
                 int threads)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/fsync_probe.%d", dir, (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        perror(path);
        return 1;
    }
    size_t calls = (size_t)count * (size_t)threads;
    struct run r = {.fd = fd, .len = len, .count = count};
    r.lat = malloc(calls * sizeof *r.lat);
    int rc = 1;
    if (r.lat == NULL || prepare(fd, kind, calls * len + (1 << 16)) != 0) {
        perror("fsync_probe: prepare");
        goto out;
    }
    double cpu0 = cpu_us(), wall0 = now_us();
    if (run_callers(&r, threads) != 0)
        goto out;
    double wall = now_us() - wall0;
    double cpu = (cpu_us() - cpu0) / (double)calls;
    qsort(r.lat, calls, sizeof *r.lat, bench_cmp_double);
    printf("file=%s calls=%zu bytes=%zu threads=%d p50_us=%.1f p90_us=%.1f "
           "p99_us=%.1f cpu_us=%.1f calls_per_s=%.0f\n",
           kind_name[kind], calls, len, threads, r.lat[calls / 2],
           r.lat[calls * 9 / 10], r.lat[calls * 99 / 100], cpu,
           (double)calls * 1e6 / wall);
    rc = 0;
out:
    free(r.lat);
    close(fd);
    unlink(path);
    return rc;
}

int main(int argc, char **argv)
{
    int help = argc == 2 && strcmp(argv[1], "--help") == 0;
    if (help || argc < 2 || argc > 6) {
        fprintf(help ? stdout : stderr,
                "usage: %s DIR [COUNT [BYTES [grown|fallocate|zeroed|all "
                "[THREADS]]]]\n",
                argv[0]);
        return help ? 0 : 2;
    }
    int count = argc > 2 ? atoi(argv[2]) : 2000;
    long bytes = argc > 3 ? atol(argv[3]) : 112;
    int threads = argc > 5 ? atoi(argv[5]) : 1;
    if (count < 1 || bytes < 1 || bytes > (1L << 20) || threads < 1 ||
        threads > 64) {
        fprintf(stderr, "fsync_probe: COUNT >= 1, 1 <= BYTES <= 1 MiB, "
                        "1 <= THREADS <= 64\n");
        return 2;
    }
    int only = -1;
    for (int k = GROWN; argc > 4 && k <= ZEROED; k++)
        if (strcmp(argv[4], kind_name[k]) == 0)
            only = k;
    if (argc > 4 && only < 0 && strcmp(argv[4], "all") != 0) {
        fprintf(stderr,
                "fsync_probe: KIND is grown, fallocate, zeroed or all\n");
        return 2;
    }
    for (int k = GROWN; k <= ZEROED; k++)
        if ((only < 0 || k == only) &&
            probe(argv[1], (enum kind)k, count, (size_t)bytes, threads) != 0)
            return 1;
    return 0;
}
