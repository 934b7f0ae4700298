/* SPDX-License-Identifier: MIT */
/*
 * fuzz/replay_main.c - runs a fuzz harness over files without libFuzzer:
 * each argument is an input file or a directory of them (one level). Used
 * by CTest to replay the seed corpus in every build (gcc, ASan, valgrind)
 * and to measure coverage with a plain clang build.
 * Usage: replay_<name> PATH...
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "fuzz.h"

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        perror(path);
        return -1;
    }
    size_t cap = 4096, n = 0;
    uint8_t *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            uint8_t *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) {
        fprintf(stderr, "%s: out of memory\n", path);
        return -1;
    }
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    long inputs = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            perror(argv[i]);
            return 1;
        }
        if (!S_ISDIR(st.st_mode)) {
            if (run_file(argv[i]) != 0)
                return 1;
            inputs++;
            continue;
        }
        DIR *d = opendir(argv[i]);
        if (!d) {
            perror(argv[i]);
            return 1;
        }
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            size_t len = strlen(argv[i]) + strlen(e->d_name) + 2;
            char *p = malloc(len);
            if (!p) {
                closedir(d);
                return 1;
            }
            snprintf(p, len, "%s/%s", argv[i], e->d_name);
            int rc = run_file(p);
            free(p);
            if (rc != 0) {
                closedir(d);
                return 1;
            }
            inputs++;
        }
        closedir(d);
    }
    printf("%ld inputs replayed, 0 failed\n", inputs);
    return inputs > 0 ? 0 : 1;
}
