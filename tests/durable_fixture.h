/* SPDX-License-Identifier: MIT */
/*
 * tests/durable_fixture.h - what the journal tests share: an injected
 * clock, fresh directories, a config on them, files read and written
 * whole, and a child process that reports through a pipe.
 */
#ifndef TWHEEL_TEST_DURABLE_FIXTURE_H
#define TWHEEL_TEST_DURABLE_FIXTURE_H

#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <twheel/durable.h>

#include "test.h"

static _Atomic int64_t df_wall = 1700000000000;
static _Atomic uint64_t df_mono = 1000000000;

static inline int64_t df_clk_wall(void *arg)
{
    (void)arg;
    return atomic_load(&df_wall);
}

static inline uint64_t df_clk_mono(void *arg)
{
    (void)arg;
    return atomic_load(&df_mono);
}

/* A new empty directory under @base (NULL: /tmp) into @buf. */
static inline const char *df_new_dir(char *buf, size_t len, const char *base)
{
    snprintf(buf, len, "%s/tw_journal_XXXXXX", base ? base : "/tmp");
    ASSERT_NOT_NULL(mkdtemp(buf));
    return buf;
}

static inline void df_rm_dir(const char *dir)
{
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ASSERT_EQ(system(cmd), 0);
}

/* A journal config on @dir with the injected clock, SYNC_EACH and 16 KiB
 * segments. */
static inline tw_durable_config df_cfg(const char *dir, tw_durable_fire_fn fn)
{
    tw_durable_config c;
    memset(&c, 0, sizeof c);
    c.dir = dir;
    c.fire = fn;
    c.sync = TW_DURABLE_SYNC_EACH;
    c.segment_bytes = 16384;
    c.wall_ms = df_clk_wall;
    c.mono_ns = df_clk_mono;
    return c;
}

static inline tw_durable *df_open(const tw_durable_config *c)
{
    tw_durable *d = NULL;
    char err[256] = "";
    tw_durable_config cc = *c;
    if (!cc.errbuf) {
        cc.errbuf = err;
        cc.errbuf_len = sizeof err;
    }
    int rc = tw_durable_open(&d, &cc);
    if (rc)
        TW_TEST_FAIL_("open %s: %s (%s)", c->dir, tw_strerror(rc), cc.errbuf);
    return d;
}

/* Schedule @n timers far in the future, keys printf(@key_fmt, i), each
 * with a payload of @payload_len (<= 1024) bytes of @fill. */
static inline void df_fill(tw_durable *d, const char *key_fmt, int n, char fill,
                           size_t payload_len)
{
    char pay[1024];
    ASSERT(payload_len <= sizeof pay);
    memset(pay, fill, payload_len);
    for (int i = 0; i < n; i++) {
        char k[32];
        int kl = snprintf(k, sizeof k, key_fmt, i);
        ASSERT_EQ(tw_durable_schedule(d, k, (size_t)kl, INT64_MAX / 2, pay,
                                      payload_len),
                  0);
    }
}

static inline uint64_t df_pending(tw_durable *d)
{
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    return st.pending;
}

static inline size_t df_read_file(const char *path, unsigned char **out)
{
    FILE *f = fopen(path, "rb");
    ASSERT_NOT_NULL(f);
    ASSERT_EQ(fseek(f, 0, SEEK_END), 0);
    long n = ftell(f);
    ASSERT_EQ(fseek(f, 0, SEEK_SET), 0);
    unsigned char *b = malloc((size_t)n + 1);
    ASSERT_NOT_NULL(b);
    ASSERT_EQ(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *out = b;
    return (size_t)n;
}

static inline void df_write_file(const char *path, const unsigned char *b,
                                 size_t n)
{
    FILE *f = fopen(path, "wb");
    ASSERT_NOT_NULL(f);
    ASSERT_EQ(fwrite(b, 1, n, f), n);
    ASSERT_EQ(fclose(f), 0);
}

/* Run @fn(@arg) in a child process and return the byte it reports (its
 * return value). The child dies by SIGKILL, without exit handlers: valgrind
 * would otherwise see the parent's objects copied into it as leaks. */
static inline int df_in_child(int (*fn)(void *arg), void *arg)
{
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        unsigned char r = (unsigned char)fn(arg);
        if (write(p[1], &r, 1) != 1)
            _exit(99);
        raise(SIGKILL);
    }
    close(p[1]);
    unsigned char got = 0xff;
    ASSERT_EQ(read(p[0], &got, 1), 1);
    close(p[0]);
    int status;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    return got;
}

#endif
