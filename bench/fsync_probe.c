/* SPDX-License-Identifier: MIT */
/*
 * bench/fsync_probe.c - the disk's floor under a durable call: the latency
 * of one small pwrite() followed by fdatasync(), appended to a file that is
 * grown by each write (as an append-only file is), preallocated with
 * fallocate() (as the journal's segments are), or filled with zeros first.
 *
 * Usage: fsync_probe DIR [COUNT [BYTES [KIND]]]   (defaults: 2000 calls of
 * 112 bytes, the size of one journal record with a 16-byte key and a
 * 64-byte payload; every kind, or the one KIND named: grown, fallocate,
 * zeroed). Prints p50, p90 and p99 in microseconds for each file kind,
 * and cpu_us: the CPU time (user and system) the calling process spent
 * per call, the device's cost to a caller before any work of its own.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
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

static int probe(const char *dir, enum kind kind, int count, size_t len)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/fsync_probe.%d", dir, (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) {
        perror(path);
        return 1;
    }
    char *buf = malloc(len);
    double *lat = malloc((size_t)count * sizeof *lat);
    int rc = 1;
    if (buf == NULL || lat == NULL ||
        prepare(fd, kind, (size_t)count * len + (1 << 16)) != 0) {
        perror("fsync_probe: prepare");
        goto out;
    }
    memset(buf, 'x', len);
    double cpu0 = cpu_us();
    for (int i = 0; i < count; i++) {
        double t0 = now_us();
        if (pwrite(fd, buf, len, (off_t)i * (off_t)len) != (ssize_t)len ||
            fdatasync(fd) != 0) {
            perror("fsync_probe: write");
            goto out;
        }
        lat[i] = now_us() - t0;
    }
    double cpu = (cpu_us() - cpu0) / count;
    qsort(lat, (size_t)count, sizeof *lat, cmp_double);
    printf("file=%s calls=%d bytes=%zu p50_us=%.1f p90_us=%.1f p99_us=%.1f "
           "cpu_us=%.1f\n",
           kind_name[kind], count, len, lat[count / 2], lat[count * 9 / 10],
           lat[count * 99 / 100], cpu);
    rc = 0;
out:
    free(lat);
    free(buf);
    close(fd);
    unlink(path);
    return rc;
}

int main(int argc, char **argv)
{
    int help = argc == 2 && strcmp(argv[1], "--help") == 0;
    if (help || argc < 2 || argc > 5) {
        fprintf(help ? stdout : stderr,
                "usage: %s DIR [COUNT [BYTES [grown|fallocate|zeroed]]]\n",
                argv[0]);
        return help ? 0 : 2;
    }
    int count = argc > 2 ? atoi(argv[2]) : 2000;
    long bytes = argc > 3 ? atol(argv[3]) : 112;
    if (count < 1 || bytes < 1 || bytes > (1L << 20)) {
        fprintf(stderr, "fsync_probe: COUNT >= 1, 1 <= BYTES <= 1 MiB\n");
        return 2;
    }
    int only = -1;
    for (int k = GROWN; argc > 4 && k <= ZEROED; k++)
        if (strcmp(argv[4], kind_name[k]) == 0)
            only = k;
    if (argc > 4 && only < 0) {
        fprintf(stderr, "fsync_probe: KIND is grown, fallocate or zeroed\n");
        return 2;
    }
    for (int k = GROWN; k <= ZEROED; k++)
        if ((only < 0 || k == only) &&
            probe(argv[1], (enum kind)k, count, (size_t)bytes) != 0)
            return 1;
    return 0;
}
