/* SPDX-License-Identifier: MIT */
/*
 * stall_sync.c - a fault injector for twheeld's tests, loaded with
 * LD_PRELOAD: fdatasync(2) and fsync(2) stall while a file the test
 * controls exists. With TBD_STALL=PATH in the environment, a sync that
 * finds PATH creates PATH.on (so that the test knows a sync is held),
 * waits until PATH is removed, removes PATH.on and only then syncs. The
 * test thereby holds the store's fdatasync for as long as it likes, at
 * a moment it chooses, without a slow disk. Without TBD_STALL, or
 * without PATH, a sync is the real one at once.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

/* Waits while the file named by TBD_STALL exists (see above). */
static void stall(void)
{
    const char *p = getenv("TBD_STALL");
    if (!p || access(p, F_OK) != 0)
        return;
    char on[4096];
    snprintf(on, sizeof(on), "%s.on", p);
    int fd = open(on, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd >= 0)
        close(fd);
    struct timespec ms = {0, 1000000};
    while (access(p, F_OK) == 0)
        nanosleep(&ms, NULL);
    unlink(on);
}

/* Exported whatever the build's default visibility: they must interpose. */
#define SHIM __attribute__((visibility("default")))

SHIM int fdatasync(int fd)
{
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    stall();
    return real(fd);
}

SHIM int fsync(int fd)
{
    int (*real)(int) = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    stall();
    return real(fd);
}
