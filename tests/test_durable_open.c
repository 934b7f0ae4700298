/* SPDX-License-Identifier: MIT */
/*
 * tests/test_durable_open.c - what a journal store's open refuses, and
 * that it says why: a second process on a live store even after LOCK was
 * deleted, a deleted oldest segment (with and without a manifest), every
 * error of tw_durable_open() with its code and message, and how little a
 * small store takes on disk (a new segment: 64 KiB, growing with its
 * records).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>

#include "durable_fixture.h"

void tw__durable_sync(tw_durable *d);

static int fire_none(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)t;
    (void)arg;
    return 0;
}

static char err[512];

/* Open with @c, expecting @code and a message containing @want. */
static void open_fails(tw_durable_config c, int code, const char *want)
{
    tw_durable *d = NULL;
    err[0] = 0;
    c.errbuf = err;
    c.errbuf_len = sizeof err;
    int rc = tw_durable_open(&d, &c);
    if (rc != code)
        TW_TEST_FAIL_("open: %s (%s), want %s", tw_err_name(rc), err,
                      tw_err_name(code));
    ASSERT_NULL(d);
    fprintf(stderr, "   %s: %s\n", tw_err_name(rc), err);
    if (!strstr(err, want))
        TW_TEST_FAIL_("message \"%s\" lacks \"%s\"", err, want);
}

static char path[700];

static const char *in_dir(const char *dir, const char *name)
{
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return path;
}

/* ------------------------------------------------------------------------ */
/* One process per store, even without LOCK. */

static int open_code(void *arg)
{
    tw_durable_config c = df_cfg(arg, fire_none);
    tw_durable *d = NULL;
    int rc = tw_durable_open(&d, &c);
    return rc == TW_EBUSY ? 'b' : rc == 0 ? 'o' : 'e';
}

static void test_lock_removed(void)
{
    char buf[256];
    char *dir = (char *)df_new_dir(buf, sizeof buf, NULL);
    int ready[2], hold[2];
    ASSERT_EQ(pipe(ready), 0);
    ASSERT_EQ(pipe(hold), 0);
    pid_t a = fork();
    ASSERT(a >= 0);
    if (a == 0) { /* process A holds the store until the pipe closes */
        close(ready[0]);
        close(hold[1]);
        tw_durable_config c = df_cfg(dir, fire_none);
        tw_durable *d = NULL;
        char ok =
            tw_durable_open(&d, &c) == 0 &&
                    tw_durable_schedule(d, "a", 1, INT64_MAX / 2, "", 0) == 0
                ? 'y'
                : 'n';
        if (write(ready[1], &ok, 1) != 1)
            _exit(9);
        char x;
        while (read(hold[0], &x, 1) > 0)
            ;
        raise(SIGKILL);
    }
    close(ready[1]);
    close(hold[0]);
    char ok = 0;
    ASSERT_EQ(read(ready[0], &ok, 1), 1);
    ASSERT_EQ(ok, 'y');
    ASSERT_EQ(unlink(in_dir(dir, "LOCK")), 0);
    /* Process B, and another handle in this process: both refused. */
    ASSERT_EQ(df_in_child(open_code, dir), 'b');
    tw_durable_config c = df_cfg(dir, fire_none);
    open_fails(c, TW_EBUSY, "open in another process or handle");
    close(hold[1]);
    int status;
    ASSERT_EQ(waitpid(a, &status, 0), a);
    close(ready[0]);
    tw_durable *d = df_open(&c);
    ASSERT_EQ(df_pending(d), 1);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/* ------------------------------------------------------------------------ */
/* Missing segments. */

static unsigned count_segments(const char *dir, unsigned *lo)
{
    DIR *dd = opendir(dir);
    ASSERT_NOT_NULL(dd);
    unsigned n = 0;
    *lo = UINT32_MAX;
    struct dirent *e;
    while ((e = readdir(dd)) != NULL) {
        unsigned no;
        if (strlen(e->d_name) == 14 &&
            sscanf(e->d_name, "%10u.twj", &no) == 1) {
            n++;
            if (no < *lo)
                *lo = no;
        }
    }
    closedir(dd);
    return n;
}

/* 40 timers with 300-byte payloads over 4 KiB segments. */
static tw_durable *forty(const char *dir)
{
    tw_durable_config c = df_cfg(dir, fire_none);
    c.segment_bytes = 4096;
    tw_durable *d = df_open(&c);
    df_fill(d, "s%02d", 40, 'q', 300);
    return d;
}

static void test_oldest_segment_deleted(void)
{
    char buf[256];
    const char *dir = df_new_dir(buf, sizeof buf, NULL);
    ASSERT_EQ(tw_durable_close(forty(dir)), 0);
    unsigned lo, n = count_segments(dir, &lo);
    ASSERT_GE(n, 3);
    ASSERT_EQ(lo, 1);
    ASSERT_EQ(unlink(in_dir(dir, "0000000001.twj")), 0);
    tw_durable_config c = df_cfg(dir, fire_none);
    c.segment_bytes = 4096;
    open_fails(c, TW_EIO, "0000000001.twj is missing");
    /* Repair opens what is there, which is the journal from then on. */
    c.flags = TW_DURABLE_REPAIR;
    tw_durable *d = df_open(&c);
    uint64_t left = df_pending(d);
    ASSERT_LT(left, 40);
    ASSERT_GT(left, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    c.flags = 0;
    d = df_open(&c);
    ASSERT_EQ(df_pending(d), left);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/* Compaction deleted the first segments (the manifest says which is the
 * oldest now); deleting that one is noticed, a leftover older than it is
 * deleted, a damaged manifest refused. */
static void test_oldest_after_compaction(void)
{
    char buf[256];
    const char *dir = df_new_dir(buf, sizeof buf, NULL);
    tw_durable *d = forty(dir);
    for (int i = 0; i < 20; i++) {
        char k[16];
        int kl = snprintf(k, sizeof k, "s%02d", i);
        ASSERT_EQ(tw_durable_cancel(d, k, (size_t)kl), 0);
    }
    tw__durable_sync(d);
    ASSERT_EQ(tw_durable_close(d), 0);
    unsigned lo;
    count_segments(dir, &lo);
    ASSERT_GT(lo, 1);
    ASSERT_EQ(access(in_dir(dir, "MANIFEST"), F_OK), 0);
    tw_durable_config c = df_cfg(dir, fire_none);
    c.segment_bytes = 4096;
    /* A leftover of an interrupted deletion goes. */
    char name[32], old[32];
    snprintf(old, sizeof old, "%010u.twj", lo - 1);
    snprintf(name, sizeof name, "%010u.twj", lo);
    unsigned char junk[64] = "stale";
    df_write_file(in_dir(dir, old), junk, sizeof junk);
    d = df_open(&c);
    ASSERT_EQ(df_pending(d), 20);
    ASSERT_EQ(tw_durable_close(d), 0);
    ASSERT(access(in_dir(dir, old), F_OK) != 0);
    /* A damaged manifest. */
    unsigned char *m, m0[16];
    size_t mn = df_read_file(in_dir(dir, "MANIFEST"), &m);
    ASSERT_EQ(mn, sizeof m0);
    memcpy(m0, m, sizeof m0);
    m[9] ^= 1;
    df_write_file(in_dir(dir, "MANIFEST"), m, mn);
    open_fails(c, TW_EIO, "MANIFEST: damaged");
    m[9] ^= 1;
    df_write_file(in_dir(dir, "MANIFEST"), m, mn);
    free(m);
    /* The oldest deleted. */
    ASSERT_EQ(unlink(in_dir(dir, name)), 0);
    char want[64];
    snprintf(want, sizeof want, "%s is missing", name);
    open_fails(c, TW_EIO, want);
    /* Every segment deleted: still refused; repair starts afresh, and
     * the new segment 1 is not taken for a leftover. */
    df_rm_dir(dir);
    ASSERT_EQ(mkdir(dir, 0700), 0);
    df_write_file(in_dir(dir, "MANIFEST"), m0, sizeof m0);
    open_fails(c, TW_EIO, "no segment is left");
    c.flags = TW_DURABLE_REPAIR;
    d = df_open(&c);
    ASSERT_EQ(tw_durable_schedule(d, "n", 1, INT64_MAX / 2, "", 0), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    c.flags = 0;
    d = df_open(&c);
    ASSERT_EQ(df_pending(d), 1);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/* ------------------------------------------------------------------------ */
/* Errors that say why. */

static void test_einval(void)
{
    char buf[256];
    const char *dir = df_new_dir(buf, sizeof buf, NULL);
    tw_durable_config c = df_cfg(dir, fire_none);
    c.fire = NULL;
    open_fails(c, TW_EINVAL, "fire: ");
    c = df_cfg(NULL, fire_none);
    open_fails(c, TW_EINVAL, "dir: ");
    c.dir = "";
    open_fails(c, TW_EINVAL, "dir: ");
    c = df_cfg(dir, fire_none);
    c.redis = "127.0.0.1:1";
    open_fails(c, TW_EINVAL, "dir and redis: ");
    c = df_cfg(dir, fire_none);
    c.sync = 4;
    open_fails(c, TW_EINVAL, "sync: ");
    c = df_cfg(dir, fire_none);
    c.segment_bytes = 4095;
    open_fails(c, TW_EINVAL, "segment_bytes: 4096 <= n <= 2147483648");
    c.segment_bytes = (UINT64_C(1) << 31) + 1;
    open_fails(c, TW_EINVAL, "segment_bytes: ");
    c = df_cfg(dir, fire_none);
    c.executor_threads = 1025;
    open_fails(c, TW_EINVAL, "executor_threads: n <= 1024");
    c = df_cfg(NULL, fire_none);
    c.redis = "127.0.0.1:1";
    c.shards = (1u << 20) + 1;
    open_fails(c, TW_EINVAL, "shards: 0 < n <= 1048576");
    char longdir[5000];
    memset(longdir, 'a', sizeof longdir - 1);
    longdir[0] = '/';
    longdir[sizeof longdir - 1] = 0;
    c = df_cfg(longdir, fire_none);
    open_fails(c, TW_EINVAL, "dir: longer than");
    /* Nothing was made. */
    unsigned lo;
    ASSERT_EQ(count_segments(dir, &lo), 0);
    ASSERT(access(in_dir(dir, "LOCK"), F_OK) != 0);
    df_rm_dir(dir);
}

static void test_not_a_directory(void)
{
    char buf[256];
    const char *dir = df_new_dir(buf, sizeof buf, NULL);
    char file[300], below[400];
    snprintf(file, sizeof file, "%s/file", dir);
    df_write_file(file, (const unsigned char *)"x", 1);
    tw_durable_config c = df_cfg(file, fire_none);
    open_fails(c, TW_ENOTDIR, "not a directory");
    snprintf(below, sizeof below, "%s/file/store", dir);
    c.dir = below;
    open_fails(c, TW_ENOTDIR, "not a directory");
    ASSERT_NOT_NULL(strstr(err, file)); /* names the file in the way */
    df_rm_dir(dir);
}

/* In a child that drops root (uid and gid 65534): a store directory it
 * may not write, and one it would have to make in such a directory. */
static int unprivileged(void *arg)
{
    const char *dir = arg;
    if (setgid(65534) != 0 || setuid(65534) != 0)
        return 's';
    char store[400], below[400];
    snprintf(store, sizeof store, "%s/store", dir);
    tw_durable_config c = df_cfg(store, fire_none);
    open_fails(c, TW_EACCES, "permission denied");
    ASSERT_NOT_NULL(strstr(err, "LOCK"));
    snprintf(below, sizeof below, "%s/store/sub", dir);
    c.dir = below;
    open_fails(c, TW_EACCES, "permission denied");
    return 'y';
}

static void test_permission_denied(void)
{
    char buf[256];
    char *dir = (char *)df_new_dir(buf, sizeof buf, NULL);
    ASSERT_EQ(chmod(dir, 0755), 0);
    char store[400];
    snprintf(store, sizeof store, "%s/store", dir);
    ASSERT_EQ(mkdir(store, 0755), 0);
    if (geteuid() != 0) { /* then it is simply not ours to write */
        ASSERT_EQ(chmod(store, 0555), 0);
        tw_durable_config c = df_cfg(store, fire_none);
        open_fails(c, TW_EACCES, "permission denied");
    } else {
        ASSERT_EQ(df_in_child(unprivileged, dir), 'y');
    }
    df_rm_dir(dir);
}

/* A tmpfs of @kib KiB mounted at @at in a mount namespace of this (child)
 * process's own, so that it goes with the process whatever happens; or
 * false (and why) if this process may not mount. */
static bool mount_tmpfs(const char *at, unsigned kib)
{
    char opt[64];
    snprintf(opt, sizeof opt, "size=%uk,mode=0755", kib);
    if (unshare(CLONE_NEWNS) == 0 &&
        mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0 &&
        mount("tw_test", at, "tmpfs", 0, opt) == 0)
        return true;
    fprintf(stderr, "   skipped: cannot mount a tmpfs at %s: %s\n", at,
            strerror(errno));
    return false;
}

/* Run @fn on a fresh directory in a child (it mounts there). */
static void in_child_on_dir(int (*fn)(void *arg))
{
    char buf[256];
    char *dir = (char *)df_new_dir(buf, sizeof buf, NULL);
    ASSERT_EQ(df_in_child(fn, dir), 'y');
    df_rm_dir(dir);
}

static int read_only(void *arg)
{
    const char *dir = arg;
    if (!mount_tmpfs(dir, 1024))
        return 'y';
    char store[400];
    snprintf(store, sizeof store, "%s/store", dir);
    tw_durable_config c = df_cfg(store, fire_none);
    tw_durable *d = df_open(&c);
    ASSERT_EQ(tw_durable_schedule(d, "k", 1, INT64_MAX / 2, "", 0), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    ASSERT_EQ(mount(NULL, dir, NULL, MS_REMOUNT | MS_RDONLY, NULL), 0);
    open_fails(c, TW_EROFS, "read-only file system");
    /* A new store there too. */
    char fresh[400];
    snprintf(fresh, sizeof fresh, "%s/fresh", dir);
    c.dir = fresh;
    open_fails(c, TW_EROFS, "read-only file system");
    return 'y';
}

static void test_read_only(void)
{
    in_child_on_dir(read_only);
}

static int full_disk(void *arg)
{
    const char *dir = arg;
    if (!mount_tmpfs(dir, 64))
        return 'y';
    /* Fill it. */
    int fd = open(in_dir(dir, "fill"), O_WRONLY | O_CREAT, 0644);
    ASSERT(fd >= 0);
    static const char block[4096];
    while (write(fd, block, sizeof block) > 0)
        ;
    ASSERT_EQ(errno, ENOSPC);
    close(fd);
    char store[400];
    snprintf(store, sizeof store, "%s/store", dir);
    tw_durable_config c = df_cfg(store, fire_none);
    open_fails(c, TW_ENOSPC, "no space left on device");
    return 'y';
}

static void test_full_disk(void)
{
    in_child_on_dir(full_disk);
}

/* ------------------------------------------------------------------------ */
/* Footprint. */

/* A new store with the default 64 MiB segments takes 64 KiB on disk
 * (JR_ALLOC_MIN), and a segment grows with its records (at most twice their
 * bytes), so an open reads little more than the records. */
static void test_small_footprint(void)
{
    char buf[256];
    const char *dir = df_new_dir(buf, sizeof buf, NULL);
    tw_durable_config c = df_cfg(dir, fire_none);
    c.segment_bytes = 0; /* 64 MiB */
    c.sync = TW_DURABLE_SYNC_NONE;
    tw_durable *d = df_open(&c);
    ASSERT_EQ(tw_durable_close(d), 0);
    struct stat st;
    ASSERT_EQ(stat(in_dir(dir, "0000000001.twj"), &st), 0);
    ASSERT_LE(st.st_size, 65536);
    ASSERT_LE((uint64_t)st.st_blocks * 512, 65536 + 8192);
    d = df_open(&c);
    df_fill(d, "f%d", 3000, 'p', 100);
    tw_durable_stats ds;
    ASSERT_EQ(tw_durable_stats_get(d, &ds), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    ASSERT_EQ(stat(in_dir(dir, "0000000001.twj"), &st), 0);
    ASSERT_GE((uint64_t)st.st_size, ds.journal_bytes);
    ASSERT_LE((uint64_t)st.st_size, 2 * ds.journal_bytes);
    d = df_open(&c);
    ASSERT_EQ(df_pending(d), 3000);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/* One case by name (argv[1]), or all. */
#define CASE(fn)                                                               \
    if (argc < 2 || strcmp(argv[1], #fn) == 0)                                 \
    RUN_TEST(fn)

int main(int argc, char **argv)
{
    CASE(test_lock_removed);
    CASE(test_oldest_segment_deleted);
    CASE(test_oldest_after_compaction);
    CASE(test_einval);
    CASE(test_not_a_directory);
    CASE(test_permission_denied);
    CASE(test_read_only);
    CASE(test_full_disk);
    CASE(test_small_footprint);
    return tw_test_done();
}
