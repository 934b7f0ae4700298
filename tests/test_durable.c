/* SPDX-License-Identifier: MIT */
/*
 * tests/test_durable.c - the durable store's rules on an injected clock:
 * argument checks, delivery at the due time and not before, replace,
 * cancel, retries, recovery in due order, attempt after a crash (a forked
 * child dies inside its callback), one process per directory, wall-clock
 * steps, torn tails cut at every byte, bit flips in the tail and in the
 * middle, the repair flag, disk faults on write and fdatasync, compaction,
 * executors, group commit from threads, and the record size.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <twheel/durable.h>

#include "common.h"
#include "durable_hooks.h"
#include "journal.h"
#include "durable_fixture.h"
#include "test.h"

/* ------------------------------------------------------------------------ */
/* A log of deliveries (the injected clock is durable_fixture.h's). */

#define LOG_MAX 4096
struct fired {
    char key[64];
    char payload[64];
    int64_t due_ms, at_ms;
    uint32_t attempt;
};
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;
static struct fired fired_log[LOG_MAX];
static int nfired;
static int retry_ms;    /* what the callback returns */
static int retry_times; /* retries left */

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    pthread_mutex_lock(&log_mu);
    ASSERT_LT(nfired, LOG_MAX);
    struct fired *f = &fired_log[nfired++];
    ASSERT_LT(t->key_len, sizeof f->key);
    memcpy(f->key, t->key, t->key_len);
    f->key[t->key_len] = 0;
    ASSERT_LT(t->payload_len, sizeof f->payload);
    if (t->payload_len)
        memcpy(f->payload, t->payload, t->payload_len);
    f->payload[t->payload_len] = 0;
    f->due_ms = t->due_ms;
    f->at_ms = atomic_load(&df_wall);
    f->attempt = t->attempt;
    int r = 0;
    if (retry_times > 0) {
        retry_times--;
        r = retry_ms;
    }
    pthread_mutex_unlock(&log_mu);
    return r;
}

static void log_reset(void)
{
    pthread_mutex_lock(&log_mu);
    nfired = 0;
    retry_times = 0;
    pthread_mutex_unlock(&log_mu);
}

static int log_count(const char *key)
{
    int c = 0;
    pthread_mutex_lock(&log_mu);
    for (int i = 0; i < nfired; i++)
        c += strcmp(fired_log[i].key, key) == 0;
    pthread_mutex_unlock(&log_mu);
    return c;
}

static char tmpl_dir[256];

static const char *new_dir(void)
{
    return df_new_dir(tmpl_dir, sizeof tmpl_dir, NULL);
}

static tw_durable_config base_cfg(const char *dir)
{
    return df_cfg(dir, on_fire);
}

static int sched(tw_durable *d, const char *key, int64_t due, const char *p)
{
    return tw_durable_schedule(d, key, strlen(key), due, p, strlen(p));
}

static tw_durable_stats stats(tw_durable *d)
{
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    return st;
}

static void set_wall(int64_t ms)
{
    atomic_store(&df_wall, ms);
}

/* ------------------------------------------------------------------------ */

static void test_bad_input(void)
{
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    tw_durable *d = (tw_durable *)(uintptr_t)1;
    tw_durable_config bad = c;
    bad.fire = NULL;
    ASSERT_EQ(tw_durable_open(&d, &bad), TW_EINVAL);
    bad = c;
    bad.dir = NULL;
    ASSERT_EQ(tw_durable_open(&d, &bad), TW_EINVAL);
    bad.dir = "";
    ASSERT_EQ(tw_durable_open(&d, &bad), TW_EINVAL);
    bad = c;
    bad.sync = 7;
    ASSERT_EQ(tw_durable_open(&d, &bad), TW_EINVAL);
    bad.sync = TW_DURABLE_SYNC_INTERVAL + 1; /* the first unknown mode */
    ASSERT_EQ(tw_durable_open(&d, &bad), TW_EINVAL);
    bad = c;
    bad.segment_bytes = 100;
    ASSERT_EQ(tw_durable_open(&d, &bad), TW_EINVAL);
#ifndef TWHEEL_HAVE_REDIS
    bad = c;
    bad.redis = "127.0.0.1:1";
    ASSERT_EQ(tw_durable_open(&d, &bad), TW_EINVAL);
#endif
    ASSERT_EQ(tw_durable_open(NULL, &c), TW_EINVAL);
    ASSERT_EQ(tw_durable_open(&d, NULL), TW_EINVAL);
    ASSERT_EQ((uintptr_t)d, 1); /* unchanged on failure */

    d = df_open(&c);
    tw_durable_stats st0 = stats(d);
    static char big[TW_DURABLE_PAYLOAD_MAX + 1];
    char key[TW_DURABLE_KEY_MAX + 1];
    memset(key, 'k', sizeof key);
    ASSERT_EQ(tw_durable_schedule(d, NULL, 1, 0, NULL, 0), TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule(d, "k", 0, 0, NULL, 0), TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule(d, key, sizeof key, 0, NULL, 0), TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule(d, "k", 1, 0, NULL, 1), TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule(d, "k", 1, 0, big, sizeof big), TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule(NULL, "k", 1, 0, NULL, 0), TW_EINVAL);
    ASSERT_EQ(tw_durable_cancel(d, NULL, 1), TW_EINVAL);
    ASSERT_EQ(tw_durable_cancel(d, "k", 0), TW_EINVAL);
    ASSERT_EQ(tw_durable_cancel(d, key, sizeof key), TW_EINVAL);
    ASSERT_EQ(tw_durable_stats_get(d, NULL), TW_EINVAL);
    ASSERT_EQ(tw_durable_stats_get(NULL, &st0), TW_EINVAL);
    tw_durable_item one = {.key = "k", .key_len = 1};
    ASSERT_EQ(tw_durable_schedule_many(NULL, &one, 1), TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule_many(d, NULL, 1), TW_EINVAL);
    ASSERT_EQ(tw_durable_schedule_many(d, NULL, 0), 0);
    /* Shorter than the 0.1 struct: refused. As long as it: its fields
     * only, nothing past them. */
    unsigned char raw[sizeof(tw_durable_stats) + 8];
    memset(raw, 0xab, sizeof raw);
    size_t old = offsetof(tw_durable_stats, backlog);
    ASSERT_EQ(
        tw_durable_stats_get_sized(d, (tw_durable_stats *)(void *)raw, old - 1),
        TW_EINVAL);
    ASSERT_EQ(raw[0], 0xab);
    ASSERT_EQ(
        tw_durable_stats_get_sized(d, (tw_durable_stats *)(void *)raw, old), 0);
    ASSERT_EQ(raw[old], 0xab);
    ASSERT_EQ(raw[offsetof(tw_durable_stats, pending)], 0);
    tw_durable_stats st1 = stats(d);
    ASSERT_EQ(st1.journal_bytes, st0.journal_bytes); /* nothing written */
    ASSERT_EQ(st1.pending, 0);
    /* The limits themselves are fine. */
    ASSERT_EQ(tw_durable_schedule(d, key, TW_DURABLE_KEY_MAX, INT64_MAX, big,
                                  TW_DURABLE_PAYLOAD_MAX),
              0);
    ASSERT_EQ(stats(d).pending, 1);
    /* A bad item in a batch: that item is TW_EINVAL, the others done. */
    tw_durable_item mixed[3] = {
        {.key = "m1", .key_len = 2, .due_ms = INT64_MAX},
        {.key = "m2", .key_len = 0, .due_ms = INT64_MAX},
        {.key = "m3", .key_len = 2, .due_ms = INT64_MAX}};
    ASSERT_EQ(tw_durable_schedule_many(d, mixed, 3), TW_EINVAL);
    ASSERT_EQ(mixed[0].result, 0);
    ASSERT_EQ(mixed[1].result, TW_EINVAL);
    ASSERT_EQ(mixed[2].result, 0);
    ASSERT_EQ(stats(d).pending, 3);
    ASSERT_EQ(tw_durable_close(d), 0);
    ASSERT_EQ(tw_durable_close(NULL), 0);
    df_rm_dir(dir);
}

static void test_fire_at_due(void)
{
    log_reset();
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    int64_t t0 = 1700000000000;
    set_wall(t0);
    tw_durable *d = df_open(&c);
    ASSERT_EQ(sched(d, "a", t0 + 100, "pa"), 0);
    ASSERT_EQ(sched(d, "b", t0 + 50, ""), 0);
    ASSERT_EQ(stats(d).pending, 2);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 0);
    set_wall(t0 + 49);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 0); /* never early */
    set_wall(t0 + 50);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 1);
    ASSERT_STR_EQ(fired_log[0].key, "b");
    ASSERT_STR_EQ(fired_log[0].payload, "");
    ASSERT_EQ(fired_log[0].attempt, 1);
    ASSERT_EQ(fired_log[0].due_ms, t0 + 50);
    set_wall(t0 + 1000);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 2);
    ASSERT_STR_EQ(fired_log[1].key, "a");
    ASSERT_STR_EQ(fired_log[1].payload, "pa");
    tw_durable_stats st = stats(d);
    ASSERT_EQ(st.pending, 0);
    ASSERT_EQ(st.fired, 2);
    ASSERT_EQ(tw_durable_cancel(d, "a", 1), TW_ENOENT); /* done */
    /* A due time before 1970 is simply overdue. */
    ASSERT_EQ(sched(d, "neg", -5, "n"), 0);
    tw__durable_sync(d);
    ASSERT_EQ(log_count("neg"), 1);
    ASSERT_EQ(fired_log[2].due_ms, -5);
    ASSERT_EQ(tw_durable_close(d), 0);
    /* Completed timers stay completed. */
    d = df_open(&c);
    tw__durable_sync(d);
    ASSERT_EQ(stats(d).recovered, 0);
    ASSERT_EQ(nfired, 3);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

static void test_replace_cancel(void)
{
    log_reset();
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    int64_t t0 = 1700000000000;
    set_wall(t0);
    tw_durable *d = df_open(&c);
    ASSERT_EQ(sched(d, "k", t0 + 100, "old"), 0);
    ASSERT_EQ(sched(d, "k", t0 + 200, "new"), 0);
    ASSERT_EQ(stats(d).pending, 1);
    ASSERT_EQ(sched(d, "x", t0 + 100, "x"), 0);
    ASSERT_EQ(tw_durable_cancel(d, "x", 1), 0);
    ASSERT_EQ(tw_durable_cancel(d, "x", 1), TW_ENOENT);
    ASSERT_EQ(tw_durable_cancel(d, "nope", 4), TW_ENOENT);
    ASSERT_EQ(stats(d).cancelled, 1);
    set_wall(t0 + 150);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    /* After a restart: still the new version, still no x. */
    d = df_open(&c);
    ASSERT_EQ(stats(d).recovered, 1);
    set_wall(t0 + 199);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 0);
    set_wall(t0 + 200);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 1);
    ASSERT_STR_EQ(fired_log[0].payload, "new");
    ASSERT_EQ(fired_log[0].due_ms, t0 + 200);
    ASSERT_EQ(log_count("x"), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

static void test_retry(void)
{
    log_reset();
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    int64_t t0 = 1700000000000;
    set_wall(t0);
    tw_durable *d = df_open(&c);
    retry_ms = 50;
    retry_times = 2;
    ASSERT_EQ(sched(d, "r", t0 + 10, "p"), 0);
    set_wall(t0 + 10);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 1);
    ASSERT_EQ(fired_log[0].attempt, 1);
    set_wall(t0 + 59);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 1);
    ASSERT_EQ(tw_durable_close(d), 0);
    /* The retry survives a restart with its attempt count. */
    d = df_open(&c);
    set_wall(t0 + 60);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 2);
    ASSERT_EQ(fired_log[1].attempt, 2);
    ASSERT_STR_EQ(fired_log[1].payload, "p");
    ASSERT_EQ(fired_log[1].due_ms, t0 + 60);
    set_wall(t0 + 110);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 3);
    ASSERT_EQ(fired_log[2].attempt, 3);
    tw_durable_stats st = stats(d);
    ASSERT_EQ(st.retried, 1);
    ASSERT_EQ(st.fired, 1);
    ASSERT_EQ(st.pending, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

static void test_recovery_order(void)
{
    log_reset();
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.sync = TW_DURABLE_SYNC_GROUP;
    int64_t t0 = 1700000000000;
    set_wall(t0);
    tw_durable *d = df_open(&c);
    /* Due times in a scrambled order, some long ago. */
    for (int i = 0; i < 200; i++) {
        char k[16];
        snprintf(k, sizeof k, "k%03d", i);
        int64_t due = t0 + 1000 + (int64_t)((i * 7919) % 200) * 1000;
        ASSERT_EQ(sched(d, k, due, k), 0);
    }
    ASSERT_EQ(sched(d, "past", t0 + 500, "p"), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    /* Down for a year: everything is overdue, fires at once, in due
     * order, none lost. */
    set_wall(t0 + 365LL * 86400 * 1000);
    d = df_open(&c);
    tw_durable_stats st = stats(d);
    ASSERT_EQ(st.recovered, 201);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 201);
    ASSERT_STR_EQ(fired_log[0].key, "past");
    ASSERT_EQ(fired_log[0].due_ms, t0 + 500);
    for (int i = 1; i < nfired; i++)
        ASSERT_LE(fired_log[i - 1].due_ms, fired_log[i].due_ms);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/* A child delivers and dies inside the callback: the FIRE record was
 * durable, so the next open delivers again with attempt 2. A second child
 * dies the same way (two FIRE records after the schedule record), then the
 * delivery with attempt 3 asks for a retry, whose record carries the
 * count: the retry is attempt 4. */
static int die_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)t;
    (void)arg;
    raise(SIGKILL); /* a crash: no exit handlers (nor valgrind's checks) */
    return 0;
}

static void die_in_child(const char *dir, int64_t t0, bool first)
{
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        tw_durable_config c = base_cfg(dir);
        c.fire = die_fire;
        tw_durable *d = NULL;
        if (tw_durable_open(&d, &c) != 0 ||
            (first && sched(d, "c", t0 + 5, "x") != 0))
            _exit(1);
        set_wall(t0 + 5);
        tw__durable_sync(d);
        _exit(2);
    }
    int status;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT(WIFSIGNALED(status));
    ASSERT_EQ(WTERMSIG(status), SIGKILL);
}

static void test_attempt_after_crash(void)
{
    log_reset();
    const char *dir = new_dir();
    int64_t t0 = 1700000000000;
    set_wall(t0);
    die_in_child(dir, t0, true);
    tw_durable_config c = base_cfg(dir);
    set_wall(t0 + 5);
    tw_durable *d = df_open(&c);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 1);
    ASSERT_EQ(fired_log[0].attempt, 2);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);

    log_reset();
    dir = new_dir();
    set_wall(t0);
    die_in_child(dir, t0, true);
    die_in_child(dir, t0, false);
    retry_ms = 100;
    retry_times = 1;
    c = base_cfg(dir);
    set_wall(t0 + 5);
    d = df_open(&c);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 1);
    ASSERT_EQ(fired_log[0].attempt, 3);
    set_wall(t0 + 105);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 2);
    ASSERT_EQ(fired_log[1].attempt, 4);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

static void test_busy(void)
{
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    tw_durable *d = df_open(&c), *d2 = NULL;
    ASSERT_EQ(tw_durable_open(&d2, &c), TW_EBUSY);
    ASSERT_NULL(d2);
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) { /* reports through the pipe, then dies without exit
                       handlers (valgrind's leak check would see the
                       parent's store, copied into the child) */
        tw_durable *d3 = NULL;
        char ok = tw_durable_open(&d3, &c) == TW_EBUSY ? 'y' : 'n';
        if (write(p[1], &ok, 1) != 1)
            ok = 'n';
        raise(SIGKILL);
    }
    close(p[1]);
    char got = 0;
    ASSERT_EQ(read(p[0], &got, 1), 1);
    ASSERT_EQ(got, 'y');
    close(p[0]);
    int status;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_EQ(tw_durable_close(d), 0);
    d = df_open(&c); /* the lock went with the handle */
    ASSERT_EQ(tw_durable_close(d), 0);
    /* Missing parents are made too; a file in the way is an error. */
    char nested[600];
    snprintf(nested, sizeof nested, "%s/a/b/c/", dir);
    c.dir = nested;
    d = df_open(&c);
    ASSERT_EQ(sched(d, "n", INT64_MAX / 2, ""), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    snprintf(nested, sizeof nested, "%s/a/b/c/LOCK/x", dir);
    ASSERT_EQ(tw_durable_open(&d, &c), TW_ENOTDIR);
    df_rm_dir(dir);
}

static void test_clock_steps(void)
{
    log_reset();
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    int64_t t0 = 1700000000000, hour = 3600 * 1000;
    set_wall(t0);
    tw_durable *d = df_open(&c);
    tw__durable_sync(d);
    ASSERT_EQ(sched(d, "a", t0 + 10000, "a"), 0);
    /* Step back one hour: "a" keeps its Unix due time. */
    set_wall(t0 - hour);
    tw__durable_sync(d);
    set_wall(t0 - hour + 20000);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 0);
    /* Scheduled during the step for a time the wheel has passed: fires at
     * once, early by less than the step. */
    ASSERT_EQ(sched(d, "b", t0 - 1000, "b"), 0);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 1);
    ASSERT_STR_EQ(fired_log[0].key, "b");
    ASSERT_LT(fired_log[0].due_ms - fired_log[0].at_ms, hour);
    /* Back at the real time, "a" fires at its due time, not before. */
    set_wall(t0 + 9999);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 1);
    set_wall(t0 + 10000);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 2);
    ASSERT_STR_EQ(fired_log[1].key, "a");
    /* Step forward one hour: everything due by then fires, nothing lost,
     * in due order; later timers wait. */
    ASSERT_EQ(sched(d, "c", t0 + 20000, "c"), 0);
    ASSERT_EQ(sched(d, "d", t0 + 30000, "d"), 0);
    ASSERT_EQ(sched(d, "e", t0 + 3 * hour, "e"), 0);
    set_wall(t0 + hour);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 4);
    ASSERT_STR_EQ(fired_log[2].key, "c");
    ASSERT_STR_EQ(fired_log[3].key, "d");
    ASSERT_EQ(stats(d).pending, 1);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/* ------------------------------------------------------------------------ */
/* Files. */

static char seg_path[600];

static const char *seg1(const char *dir)
{
    snprintf(seg_path, sizeof seg_path, "%s/0000000001.twj", dir);
    return seg_path;
}

/* A store with keys k0..k4 far in the future; returns the segment's bytes
 * and the record offsets. */
static size_t five_records(const char *dir, unsigned char **bytes,
                           size_t offs[6])
{
    tw_durable_config c = base_cfg(dir);
    tw_durable *d = df_open(&c);
    offs[0] = JR_SEG_HDR;
    for (int i = 0; i < 5; i++) {
        char k[4] = {'k', (char)('0' + i), 0};
        ASSERT_EQ(sched(d, k, INT64_MAX / 2, "payload"), 0);
        offs[i + 1] = offs[i] + tw__jr_size(JR_SCHED, 2, 7);
    }
    ASSERT_EQ(tw_durable_close(d), 0);
    size_t n = df_read_file(seg1(dir), bytes);
    /* The segment was preallocated: zeros after the last record. */
    ASSERT_GE(n, offs[5]);
    for (size_t i = offs[5]; i < n; i++)
        ASSERT_EQ((*bytes)[i], 0);
    return offs[5];
}

static void test_torn_tail(void)
{
    const char *dir = new_dir();
    unsigned char *b;
    size_t offs[6];
    size_t n = five_records(dir, &b, offs);
    /* Cut anywhere in the last two records: the records before the cut
     * are all there, the torn one is gone, and the store works on. */
    for (size_t cut = offs[3]; cut <= n; cut++) {
        df_write_file(seg1(dir), b, cut);
        tw_durable_config c = base_cfg(dir);
        tw_durable *d = df_open(&c);
        size_t whole = cut >= offs[5] ? 5 : cut >= offs[4] ? 4 : 3;
        tw_durable_stats st = stats(d);
        ASSERT_EQ(st.recovered, whole);
        ASSERT_EQ(st.journal_bytes, offs[whole]);
        ASSERT_EQ(sched(d, "after", INT64_MAX / 2, ""), 0);
        ASSERT_EQ(tw_durable_close(d), 0);
        d = df_open(&c);
        ASSERT_EQ(stats(d).recovered, whole + 1);
        ASSERT_EQ(tw_durable_close(d), 0);
    }
    /* A crash after the newest segment was preallocated, before its
     * header was written: zeros only. (The previous segment was cut to
     * its last record and synced before the new one was made.) */
    {
        tw_durable_config c = base_cfg(dir);
        tw_durable *d = df_open(&c);
        tw_durable_stats st = stats(d);
        ASSERT_EQ(tw_durable_close(d), 0);
        ASSERT_EQ(truncate(seg1(dir), (off_t)st.journal_bytes), 0);
        char next[600];
        snprintf(next, sizeof next, "%s/0000000002.twj", dir);
        unsigned char *z = calloc(1, 16384);
        df_write_file(next, z, 16384);
        free(z);
        d = df_open(&c);
        ASSERT_EQ(stats(d).recovered, st.pending);
        ASSERT_EQ(sched(d, "later", INT64_MAX / 2, ""), 0);
        ASSERT_EQ(tw_durable_close(d), 0);
        d = df_open(&c);
        ASSERT_EQ(stats(d).recovered, st.pending + 1);
        ASSERT_EQ(tw_durable_close(d), 0);
    }
    /* A cut inside the segment header of the only segment. */
    df_write_file(seg1(dir), b, 10);
    tw_durable_config c = base_cfg(dir);
    tw_durable *d = df_open(&c);
    ASSERT_EQ(stats(d).recovered, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    free(b);
    df_rm_dir(dir);
}

/* A write torn in the middle of an unsynced batch: record 3 never reached
 * the disk, record 4 did. Recovery cuts at record 3 and clears what
 * follows, so the stale record 4 cannot come back behind a new record of
 * exactly record 3's size. */
static void test_torn_batch(void)
{
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.sync = TW_DURABLE_SYNC_NONE;
    tw_durable *d = df_open(&c);
    size_t offs[6];
    offs[0] = JR_SEG_HDR;
    for (int i = 0; i < 5; i++) {
        char k[4] = {'k', (char)('0' + i), 0};
        ASSERT_EQ(sched(d, k, INT64_MAX / 2, "payload"), 0);
        offs[i + 1] = offs[i] + tw__jr_size(JR_SCHED, 2, 7);
    }
    ASSERT_EQ(tw_durable_close(d), 0);
    unsigned char *b;
    size_t n = df_read_file(seg1(dir), &b);
    memset(b + offs[3], 0, offs[4] - offs[3]);
    df_write_file(seg1(dir), b, n);
    c.sync = TW_DURABLE_SYNC_EACH;
    d = df_open(&c);
    ASSERT_EQ(stats(d).recovered, 3);
    ASSERT_EQ(sched(d, "n3", INT64_MAX / 2, "payload"), 0); /* same size */
    ASSERT_EQ(tw_durable_close(d), 0);
    d = df_open(&c);
    ASSERT_EQ(stats(d).recovered, 4);
    ASSERT_EQ(tw_durable_cancel(d, "k4", 2), TW_ENOENT);
    ASSERT_EQ(tw_durable_cancel(d, "n3", 2), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    free(b);
    df_rm_dir(dir);
}

static void test_bit_flips(void)
{
    const char *dir = new_dir();
    unsigned char *b;
    size_t offs[6];
    size_t n = five_records(dir, &b, offs);
    unsigned char *m = malloc(n);
    /* Any flip in the last record: a torn tail, four records remain. */
    for (size_t o = offs[4]; o < n; o++) {
        memcpy(m, b, n);
        m[o] ^= (unsigned char)(1u << (o % 8));
        df_write_file(seg1(dir), m, n);
        tw_durable_config c = base_cfg(dir);
        tw_durable *d = df_open(&c);
        ASSERT_EQ(stats(d).recovered, 4);
        ASSERT_EQ(tw_durable_close(d), 0);
    }
    /* A flip in an earlier record that later records show was synced:
     * damage in the middle, TW_EIO naming the segment and offset. */
    for (int r = 0; r < 4; r++) {
        memcpy(m, b, n);
        m[offs[r] + 20] ^= 0x10;
        df_write_file(seg1(dir), m, n);
        tw_durable_config c = base_cfg(dir);
        char err[256] = "";
        c.errbuf = err;
        c.errbuf_len = sizeof err;
        tw_durable *d = NULL;
        ASSERT_EQ(tw_durable_open(&d, &c), TW_EIO);
        ASSERT_NULL(d);
        char want[64];
        snprintf(want, sizeof want, "0000000001.twj offset %zu", offs[r]);
        if (!strstr(err, want))
            TW_TEST_FAIL_("error message \"%s\" lacks \"%s\"", err, want);
        /* The file was left alone. */
        unsigned char *again;
        ASSERT_EQ(df_read_file(seg1(dir), &again), n);
        ASSERT_EQ(memcmp(again, m, n), 0);
        free(again);
        /* REPAIR drops the damaged record and rewrites the rest. */
        c.flags = TW_DURABLE_REPAIR;
        d = df_open(&c);
        ASSERT_EQ(stats(d).recovered, 4);
        ASSERT_EQ(tw_durable_close(d), 0);
        c.flags = 0;
        d = df_open(&c);
        ASSERT_EQ(stats(d).recovered, 4);
        ASSERT_EQ(tw_durable_close(d), 0);
        df_rm_dir(dir);
        ASSERT_EQ(mkdir(dir, 0755), 0);
    }
    free(m);
    free(b);
    df_rm_dir(dir);
}

/* Damage in an older segment, and a segment missing in the middle. */
static void test_old_segment_damage(void)
{
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.segment_bytes = 4096;
    tw_durable *d = df_open(&c);
    df_fill(d, "s%02d", 40, 'q', 300);
    tw_durable_stats st = stats(d);
    ASSERT_GE(st.segments, 3);
    ASSERT_EQ(tw_durable_close(d), 0);
    /* Flip a bit in the first record of segment 1 (an older one). */
    unsigned char *b;
    size_t n = df_read_file(seg1(dir), &b);
    b[JR_SEG_HDR + 40] ^= 1;
    df_write_file(seg1(dir), b, n);
    char err[256] = "";
    c.errbuf = err;
    c.errbuf_len = sizeof err;
    ASSERT_EQ(tw_durable_open(&d, &c), TW_EIO);
    if (!strstr(err, "0000000001.twj offset 32"))
        TW_TEST_FAIL_("error message \"%s\"", err);
    c.flags = TW_DURABLE_REPAIR;
    d = df_open(&c);
    ASSERT_EQ(stats(d).recovered, 39);
    ASSERT_EQ(tw_durable_cancel(d, "s00", 3), TW_ENOENT);
    ASSERT_EQ(tw_durable_close(d), 0);
    c.flags = 0;
    d = df_open(&c);
    ASSERT_EQ(stats(d).recovered, 39);
    st = stats(d);
    ASSERT_EQ(tw_durable_close(d), 0);
    free(b);
    /* A segment missing between two others. */
    ASSERT_GE(st.segments, 3);
    DIR *dd = opendir(dir);
    ASSERT_NOT_NULL(dd);
    unsigned lo = UINT32_MAX;
    struct dirent *e;
    while ((e = readdir(dd)) != NULL) {
        unsigned no;
        if (sscanf(e->d_name, "%10u.twj", &no) == 1 && no < lo)
            lo = no;
    }
    closedir(dd);
    char gap[600];
    snprintf(gap, sizeof gap, "%s/%010u.twj", dir, lo + 1);
    ASSERT_EQ(unlink(gap), 0);
    err[0] = 0;
    ASSERT_EQ(tw_durable_open(&d, &c), TW_EIO);
    ASSERT(strstr(err, "missing") != NULL);
    df_rm_dir(dir);
}

/* ------------------------------------------------------------------------ */
/* Disk faults. */

static _Atomic int fault_op, fault_errno, fault_count, fault_skip;

static int fault_hook(int op)
{
    if (atomic_load(&fault_count) > 0 && op == atomic_load(&fault_op)) {
        if (atomic_load(&fault_skip) > 0) { /* let this many through */
            atomic_fetch_sub(&fault_skip, 1);
            return 0;
        }
        atomic_fetch_sub(&fault_count, 1);
        return atomic_load(&fault_errno);
    }
    return 0;
}

/* Fail the journal's next @count operations @op ('w' write, 's' sync)
 * with @err, after letting @skip of them through. */
static void fault_arm(int op, int err, int skip, int count)
{
    tw__journal_fault = fault_hook;
    atomic_store(&fault_op, op);
    atomic_store(&fault_errno, err);
    atomic_store(&fault_skip, skip);
    atomic_store(&fault_count, count);
}

static void test_disk_faults(void)
{
    log_reset();
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    int64_t t0 = 1700000000000;
    set_wall(t0);
    tw_durable *d = df_open(&c);
    ASSERT_EQ(sched(d, "keep1", t0 + 1000, "a"), 0);
    tw__journal_fault = fault_hook;
    const int ops[2] = {'w', 's'};
    const int errs[2] = {ENOSPC, EIO};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            atomic_store(&fault_op, ops[i]);
            atomic_store(&fault_errno, errs[j]);
            atomic_store(&fault_count, 1);
            tw_durable_stats before = stats(d);
            int rc = sched(d, "fail", t0 + 1000, "f");
            ASSERT_EQ(rc, -errs[j]);
            if (ops[i] == 'w') { /* nothing changed */
                tw_durable_stats after = stats(d);
                ASSERT_EQ(after.pending, before.pending);
                ASSERT_EQ(after.journal_bytes, before.journal_bytes);
                ASSERT_EQ(tw_durable_cancel(d, "fail", 4), TW_ENOENT);
            } else {
                /* The outcome of a failed sync is unknown, like a timeout;
                 * the key is still pending in memory. */
                ASSERT_EQ(tw_durable_cancel(d, "fail", 4), 0);
            }
            atomic_store(&fault_count, 1);
            ASSERT_EQ(tw_durable_cancel(d, "keep1", 5), -errs[j]);
            if (ops[i] == 'w') {
                ASSERT_EQ(stats(d).pending, 1);
            } else { /* unknown outcome: put it back */
                ASSERT_EQ(sched(d, "keep1", t0 + 1000, "a"), 0);
            }
            /* Working again. */
            ASSERT_EQ(sched(d, "ok", t0 + 2000, "o"), 0);
            ASSERT_EQ(tw_durable_cancel(d, "ok", 2), 0);
        }
    ASSERT_EQ(sched(d, "keep2", t0 + 1000, "b"), 0);
    tw__journal_fault = NULL;
    ASSERT_EQ(tw_durable_close(d), 0);
    d = df_open(&c);
    ASSERT_EQ(stats(d).recovered, 2);
    set_wall(t0 + 1000);
    tw__durable_sync(d);
    ASSERT_EQ(log_count("keep1"), 1);
    ASSERT_EQ(log_count("keep2"), 1);
    ASSERT_EQ(log_count("fail"), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/* ENOSPC while a new segment is made (its header write) is returned too. */
static void test_fault_rotation(void)
{
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.segment_bytes = 4096;
    tw_durable *d = df_open(&c);
    char pay[1000];
    memset(pay, 'p', sizeof pay);
    int i = 0;
    while (stats(d).segments == 1) {
        char k[16];
        snprintf(k, sizeof k, "r%d", i++);
        ASSERT_EQ(tw_durable_schedule(d, k, strlen(k), INT64_MAX / 2, pay,
                                      sizeof pay),
                  0);
    }
    /* The next record that does not fit needs a new segment. */
    tw__journal_fault = fault_hook;
    atomic_store(&fault_op, 'w');
    atomic_store(&fault_errno, ENOSPC);
    int fails = 0;
    for (int k = 0; k < 8; k++) {
        atomic_store(&fault_count, 1);
        char key[16];
        snprintf(key, sizeof key, "x%d", k);
        int rc = tw_durable_schedule(d, key, strlen(key), INT64_MAX / 2, pay,
                                     sizeof pay);
        ASSERT(rc == 0 || rc == TW_ENOSPC);
        fails += rc != 0;
    }
    tw__journal_fault = NULL;
    ASSERT_EQ(fails, 8);
    ASSERT_EQ(stats(d).pending, (uint64_t)i);
    ASSERT_EQ(tw_durable_close(d), 0);
    d = df_open(&c);
    ASSERT_EQ(stats(d).recovered, (uint64_t)i);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/* ------------------------------------------------------------------------ */
/* tw_durable_schedule_many. */

#define MANY 300

static char many_keys[MANY + 2][24], many_pays[MANY + 2][24];

/* Items m0 .. m<n-1> due at @due with payload "p<i>". */
static void many_items(tw_durable_item *it, size_t n, int64_t due)
{
    for (size_t i = 0; i < n; i++) {
        snprintf(many_keys[i], sizeof many_keys[i], "m%zu", i);
        snprintf(many_pays[i], sizeof many_pays[i], "p%zu", i);
        it[i] = (tw_durable_item){.key = many_keys[i],
                                  .key_len = strlen(many_keys[i]),
                                  .due_ms = due,
                                  .payload = many_pays[i],
                                  .payload_len = strlen(many_pays[i]),
                                  .result = 12345};
    }
}

static const char *payload_of(const char *key)
{
    const char *p = NULL;
    pthread_mutex_lock(&log_mu);
    for (int i = 0; i < nfired; i++)
        if (strcmp(fired_log[i].key, key) == 0)
            p = fired_log[i].payload;
    pthread_mutex_unlock(&log_mu);
    return p;
}

/* A batch larger than a write group and than a segment, with replaces of
 * a pending key and of a key given twice in the batch, in order; one
 * fdatasync for the whole call; everything survives a reopen. */
static void test_schedule_many(void)
{
    log_reset();
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.segment_bytes = 4096;
    int64_t t0 = 1700000000000;
    set_wall(t0);
    tw_durable *d = df_open(&c);
    ASSERT_EQ(sched(d, "m7", t0 + 500, "old"), 0);
    tw_durable_item it[MANY + 2];
    many_items(it, MANY, t0 + 1000);
    /* m5 again at the end: the last item wins. */
    it[MANY] = (tw_durable_item){.key = "m5",
                                 .key_len = 2,
                                 .due_ms = t0 + 2000,
                                 .payload = "again",
                                 .payload_len = 5};
    uint64_t syncs = stats(d).syncs, segs = stats(d).segments;
    ASSERT_EQ(tw_durable_schedule_many(d, it, MANY + 1), 0);
    for (size_t i = 0; i <= MANY; i++)
        ASSERT_EQ(it[i].result, 0);
    tw_durable_stats st = stats(d);
    ASSERT_EQ(st.pending, MANY);
    ASSERT_GT(st.segments, segs); /* it crossed into new segments */
    /* One fdatasync for the batch, plus one fsync per segment made. */
    ASSERT_LE(st.syncs - syncs, 1 + 2 * (st.segments - segs));
    ASSERT_EQ(tw_durable_schedule_many(d, it, 0), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    d = df_open(&c);
    ASSERT_EQ(stats(d).recovered, MANY);
    set_wall(t0 + 1000);
    tw__durable_sync(d);
    ASSERT_EQ(log_count("m7"), 1); /* replaced: not at t0 + 500 */
    ASSERT_STR_EQ(payload_of("m7"), "p7");
    ASSERT_EQ(log_count("m5"), 0);
    ASSERT_EQ(log_count("m299"), 1);
    set_wall(t0 + 2000);
    tw__durable_sync(d);
    ASSERT_EQ(log_count("m5"), 1);
    ASSERT_STR_EQ(payload_of("m5"), "again");
    ASSERT_EQ(stats(d).pending, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/* A write fault in the middle of a batch fails the items of that write
 * group only (nothing of theirs changed); an fdatasync fault fails every
 * item, whose outcome is then unknown (they stay in memory). */
static void test_schedule_many_faults(void)
{
    log_reset();
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.segment_bytes = 1 << 20; /* no new segment: writes are the groups */
    int64_t t0 = 1700000000000;
    set_wall(t0);
    tw_durable *d = df_open(&c);
    tw_durable_item it[MANY];
    many_items(it, MANY, t0 + 1000);
    fault_arm('w', EIO, 1, 1);
    ASSERT_EQ(tw_durable_schedule_many(d, it, MANY), TW_EIO);
    size_t failed = 0;
    for (size_t i = 0; i < MANY; i++) {
        ASSERT(it[i].result == 0 || it[i].result == TW_EIO);
        /* The second group of 64 failed. */
        ASSERT_EQ(it[i].result != 0, i >= 64 && i < 128);
        failed += it[i].result != 0;
    }
    ASSERT_EQ(stats(d).pending, MANY - failed);
    ASSERT_EQ(tw_durable_cancel(d, "m64", 3), TW_ENOENT);
    ASSERT_EQ(tw_durable_cancel(d, "m63", 3), 0);
    /* The sync fails: every item reports it, all stay pending. */
    atomic_store(&fault_op, 's');
    atomic_store(&fault_count, 1);
    many_items(it, MANY, t0 + 1000);
    ASSERT_EQ(tw_durable_schedule_many(d, it, MANY), TW_EIO);
    for (size_t i = 0; i < MANY; i++)
        ASSERT_EQ(it[i].result, TW_EIO);
    ASSERT_EQ(stats(d).pending, MANY);
    tw__journal_fault = NULL;
    /* Working again; then everything is durable. */
    many_items(it, 10, t0 + 1000);
    ASSERT_EQ(tw_durable_schedule_many(d, it, 10), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    d = df_open(&c);
    ASSERT_EQ(stats(d).recovered, MANY);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/* tw_durable_cancel_many: 152 keys (more than a write group), one of them
 * twice, one never scheduled, one gone; an invalid one in another call;
 * one fdatasync for a call; a
 * write fault fails the items of its group only (their keys stay
 * pending); the cancels survive a reopen. */
static void test_cancel_many(void)
{
    log_reset();
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.segment_bytes = 1 << 20; /* no new segment: writes are the groups */
    int64_t t0 = 1700000000000;
    set_wall(t0);
    tw_durable *d = df_open(&c);
    tw_durable_item it[MANY + 3];
    many_items(it, MANY, t0 + 1000);
    ASSERT_EQ(tw_durable_schedule_many(d, it, MANY), 0);
    ASSERT_EQ(sched(d, "keep", t0 + 1000, "k"), 0);
    /* m3, "nope" and an empty key. */
    size_t n = 150;
    it[n++] = (tw_durable_item){.key = "m3", .key_len = 2};
    it[n++] = (tw_durable_item){.key = "nope", .key_len = 4};
    it[n++] = (tw_durable_item){.key = "m0", .key_len = 0};
    ASSERT_EQ(tw_durable_cancel_many(NULL, it, 1), TW_EINVAL);
    ASSERT_EQ(tw_durable_cancel_many(d, NULL, 1), TW_EINVAL);
    ASSERT_EQ(tw_durable_cancel_many(d, NULL, 0), 0);
    /* An invalid item: the others are still cancelled, one by one. */
    ASSERT_EQ(tw_durable_cancel_many(d, it + 150, 3), TW_ENOENT);
    ASSERT_EQ(it[150].result, 0);
    ASSERT_EQ(it[151].result, TW_ENOENT);
    ASSERT_EQ(it[152].result, TW_EINVAL);
    ASSERT_EQ(stats(d).pending, MANY);
    /* m0 .. m149 (m3 is gone), m5 again, "nope": one fdatasync. */
    it[150] = (tw_durable_item){.key = "m5", .key_len = 2};
    uint64_t syncs = stats(d).syncs;
    ASSERT_EQ(tw_durable_cancel_many(d, it, 152), TW_ENOENT);
    for (size_t i = 0; i < 150; i++)
        ASSERT_EQ(it[i].result, i == 3 ? TW_ENOENT : 0);
    ASSERT_EQ(it[150].result, TW_ENOENT); /* m5 went with item 5 */
    ASSERT_EQ(it[151].result, TW_ENOENT);
    ASSERT_EQ(stats(d).syncs - syncs, 1);
    ASSERT_EQ(stats(d).pending, MANY + 1 - 150);
    ASSERT_EQ(stats(d).cancelled, 150);
    /* A write fault in the second group of 64: those keys stay. */
    many_items(it, MANY, t0 + 1000);
    fault_arm('w', EIO, 1, 1);
    ASSERT_EQ(tw_durable_cancel_many(d, it + 150, MANY - 150), TW_EIO);
    for (size_t i = 150; i < MANY; i++)
        ASSERT_EQ(it[i].result, i - 150 >= 64 && i - 150 < 128 ? TW_EIO : 0);
    tw__journal_fault = NULL;
    ASSERT_EQ(stats(d).pending, 1 + 64);
    ASSERT_EQ(tw_durable_close(d), 0);
    d = df_open(&c);
    ASSERT_EQ(stats(d).recovered, 1 + 64);
    set_wall(t0 + 1000);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 1 + 64);
    ASSERT_EQ(log_count("keep"), 1);
    ASSERT_EQ(log_count("m214"), 1);
    ASSERT_EQ(log_count("m213"), 0);
    ASSERT_EQ(log_count("m278"), 0);
    ASSERT_EQ(log_count("m3"), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/* ------------------------------------------------------------------------ */
/* Clocks that move while a round runs. */

static _Atomic int jump_armed;

/* The wall clock; once armed, the read returns the time, then both clocks
 * jump 400 ms, as if time passed right after the store read it. */
static int64_t df_clk_wall_jump(void *arg)
{
    (void)arg;
    int64_t v = atomic_load(&df_wall);
    if (atomic_exchange(&jump_armed, 0)) {
        atomic_fetch_add(&df_wall, 400);
        atomic_fetch_add(&df_mono, UINT64_C(400) * 1000000u);
    }
    return v;
}

/* A round that read the wall clock just before both clocks moved must not
 * sleep past the next expiry measured from where the clocks moved to: the
 * sleep is counted from the round's start. With injected clocks that move
 * no more, an oversleep never ends; a delivery is awaited for 10 s of real
 * time (it takes about a millisecond). */
static void test_clock_moves_in_round(void)
{
    log_reset();
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.wall_ms = df_clk_wall_jump;
    int64_t t0 = 1700000000000;
    set_wall(t0);
    tw_durable *d = df_open(&c);
    tw__durable_sync(d); /* the store's thread now sleeps, reading no clock */
    atomic_store(&jump_armed, 1);
    /* Due before the store's next wall check: kicks a round, whose wall
     * reading comes just before the jump. */
    ASSERT_EQ(sched(d, "x", t0 + 200, ""), 0);
    for (int i = 0; i < 10000 && log_count("x") == 0; i++)
        usleep(1000);
    ASSERT_EQ(atomic_load(&jump_armed), 0);
    ASSERT_EQ(log_count("x"), 1);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/* ------------------------------------------------------------------------ */
/* Backlog and lateness in the stats. */

static _Atomic int64_t backlog_seen = -1;

static int backlog_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    if (t->key_len == 2 && memcmp(t->key, "b0", 2) == 0) {
        tw_durable_stats st;
        ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
        atomic_store(&backlog_seen, (int64_t)st.backlog);
    }
    return on_fire(d, t, arg);
}

static uint64_t hist_total(const tw_durable_stats *st)
{
    uint64_t n = 0;
    for (int i = 0; i < TW_LATE_BUCKETS; i++)
        n += st->late_hist[i];
    return n;
}

/* Three timers due at once on the store's thread: the first callback sees
 * the other two in the backlog. Lateness is the injected wall clock at the
 * start of the callback minus the due time; a retry is a delivery of its
 * own, late from its new due time. */
static void test_late_stats(void)
{
    log_reset();
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.fire = backlog_fire;
    int64_t t0 = 1700000000000;
    set_wall(t0);
    tw_durable *d = df_open(&c);
    ASSERT_EQ(sched(d, "b0", t0 + 1000, ""), 0);
    ASSERT_EQ(sched(d, "b1", t0 + 1000, ""), 0);
    ASSERT_EQ(sched(d, "b2", t0 + 1000, ""), 0);
    ASSERT_EQ(sched(d, "late", t0 + 2000, ""), 0);
    tw_durable_stats st = stats(d);
    ASSERT_EQ(st.backlog, 0);
    ASSERT_EQ(hist_total(&st), 0);
    set_wall(t0 + 1000);
    tw__durable_sync(d);
    ASSERT_EQ(atomic_load(&backlog_seen), 2);
    st = stats(d);
    ASSERT_EQ(st.backlog, 0);
    ASSERT_EQ(st.late_hist[0], 3); /* on time: less than 1 us late */
    ASSERT_EQ(hist_total(&st), 3);
    /* 3 ms late, then a retry in 10 ms delivered 7 ms after its due. */
    pthread_mutex_lock(&log_mu);
    retry_ms = 10;
    retry_times = 1;
    pthread_mutex_unlock(&log_mu);
    set_wall(t0 + 2003);
    tw__durable_sync(d);
    set_wall(t0 + 2003 + 10 + 7);
    tw__durable_sync(d);
    ASSERT_EQ(log_count("late"), 2);
    st = stats(d);
    ASSERT_EQ(st.late_hist[tw__late_bucket(3000)], 1);
    ASSERT_EQ(st.late_hist[tw__late_bucket(7000)], 1);
    ASSERT_EQ(hist_total(&st), 5);
    ASSERT_EQ(st.backlog, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/* ------------------------------------------------------------------------ */

static int count_files(const char *dir)
{
    DIR *dd = opendir(dir);
    ASSERT_NOT_NULL(dd);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(dd)) != NULL)
        n += strstr(e->d_name, ".twj") != NULL;
    closedir(dd);
    return n;
}

static void test_compaction(void)
{
    log_reset();
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.sync = TW_DURABLE_SYNC_NONE;
    c.segment_bytes = 4096;
    int64_t t0 = 1700000000000;
    set_wall(t0);
    tw_durable *d = df_open(&c);
    /* 20 long-lived keys, then heavy churn of others. */
    for (int i = 0; i < 20; i++) {
        char k[16];
        snprintf(k, sizeof k, "live%02d", i);
        ASSERT_EQ(sched(d, k, t0 + 1000000 + i, k), 0);
    }
    uint64_t maxbytes = 0;
    for (int round = 0; round < 200; round++) {
        for (int i = 0; i < 20; i++) {
            char k[16];
            snprintf(k, sizeof k, "tmp%d", i);
            ASSERT_EQ(sched(d, k, t0 + 500000, "0123456789abcdef"), 0);
            if (i % 2)
                ASSERT_EQ(tw_durable_cancel(d, k, strlen(k)), 0);
        }
        tw__durable_sync(d);
        tw_durable_stats st = stats(d);
        if (st.journal_bytes > maxbytes)
            maxbytes = st.journal_bytes;
    }
    tw_durable_stats st = stats(d);
    ASSERT_EQ(st.pending, 30);
    /* Live: 30 records of about 50 bytes; bounded by 2x live + one
     * segment + the segment being filled, not by the 200 rounds. */
    ASSERT_LE(maxbytes, 4 * 4096);
    ASSERT_EQ((int)st.segments, count_files(dir));
    ASSERT_EQ(tw_durable_close(d), 0);
    d = df_open(&c);
    ASSERT_EQ(stats(d).recovered, 30);
    set_wall(t0 + 2000000);
    tw__durable_sync(d);
    for (int i = 0; i < 20; i++) {
        char k[16];
        snprintf(k, sizeof k, "live%02d", i);
        ASSERT_EQ(log_count(k), 1);
    }
    ASSERT_EQ(nfired, 30);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

static void test_executors(void)
{
    log_reset();
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.executor_threads = 3;
    c.sync = TW_DURABLE_SYNC_GROUP;
    int64_t t0 = 1700000000000;
    set_wall(t0);
    tw_durable *d = df_open(&c);
    for (int i = 0; i < 100; i++) {
        char k[16];
        snprintf(k, sizeof k, "e%d", i);
        ASSERT_EQ(sched(d, k, t0 + i, k), 0);
    }
    set_wall(t0 + 100);
    tw__durable_sync(d);
    ASSERT_EQ(nfired, 100);
    ASSERT_EQ(stats(d).pending, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

struct gc_arg {
    tw_durable *d;
    int id;
    int n; /* schedules to make (0: 200) */
};

static void *gc_thread(void *p)
{
    struct gc_arg *a = p;
    for (int i = 0; i < (a->n ? a->n : 200); i++) {
        char k[32];
        snprintf(k, sizeof k, "t%d-%d", a->id, i);
        ASSERT_EQ(sched(a->d, k, INT64_MAX / 2, "x"), 0);
    }
    return NULL;
}

static void test_group_commit(void)
{
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.sync = TW_DURABLE_SYNC_GROUP;
    c.wall_ms = NULL;
    c.mono_ns = NULL;
    tw_durable *d = df_open(&c);
    uint64_t s0 = stats(d).syncs;
    pthread_t th[8];
    struct gc_arg a[8];
    for (int i = 0; i < 8; i++) {
        a[i] = (struct gc_arg){d, i, 0};
        ASSERT_EQ(pthread_create(&th[i], NULL, gc_thread, &a[i]), 0);
    }
    for (int i = 0; i < 8; i++)
        pthread_join(th[i], NULL);
    tw_durable_stats st = stats(d);
    ASSERT_EQ(st.pending, 1600);
    /* Shared: fewer fdatasync calls than acknowledged calls. */
    fprintf(stderr, "   1600 schedules from 8 threads: %" PRIu64 " syncs\n",
            st.syncs - s0);
    ASSERT_LT(st.syncs - s0, 1600);
    ASSERT_EQ(tw_durable_close(d), 0);
    d = df_open(&c);
    ASSERT_EQ(stats(d).recovered, 1600);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/*
 * Gathered group commit: on a device whose fdatasync takes 8 ms (the
 * hook sleeps), 4 threads that each schedule one timer per call and call
 * again at once share each sync, 4 records a sync (51 or 52 syncs for the
 * 200 here), not 1 and 3 by turns (the first caller back syncing alone:
 * 70 to 79 syncs before the gather). A loaded machine that wakes a thread
 * later than the gather's 1 ms costs a few shared syncs, hence the bound
 * of 64.
 */
static int slow_sync(int op)
{
    if (op == 's')
        usleep(8000);
    return 0;
}

static void test_group_gather(void)
{
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.sync = TW_DURABLE_SYNC_GROUP;
    tw_durable *d = df_open(&c);
    tw__journal_fault = slow_sync;
    uint64_t s0 = stats(d).syncs;
    pthread_t th[4];
    struct gc_arg a[4];
    for (int i = 0; i < 4; i++) {
        a[i] = (struct gc_arg){d, i, 50};
        ASSERT_EQ(pthread_create(&th[i], NULL, gc_thread, &a[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    tw__journal_fault = NULL;
    uint64_t syncs = stats(d).syncs - s0;
    fprintf(stderr,
            "   200 schedules from 4 threads, 8 ms syncs: %" PRIu64 " syncs\n",
            syncs);
    ASSERT_LT(syncs, 64);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/*
 * Pipelined group commit: a record written while a sync runs is not
 * acknowledged by that sync. The hook holds the first fdatasync until a
 * second caller has written its record (the journal grew), then fails the
 * next fdatasync: the second caller must get that failure, because only a
 * sync that began after its write may acknowledge it; the first caller,
 * covered by the first sync, gets 0.
 */
static tw_durable *il_store;
static atomic_int il_syncs;
static _Atomic int il_late_rc = 1;

static void *il_late(void *arg)
{
    (void)arg;
    atomic_store(&il_late_rc, sched(il_store, "late", INT64_MAX / 2, "l"));
    return NULL;
}

static pthread_t il_thread;

static int il_hook(int op)
{
    if (op != 's')
        return 0;
    int n = atomic_fetch_add(&il_syncs, 1) + 1;
    if (n == 2)
        return EIO;
    if (n != 1)
        return 0;
    uint64_t bytes = stats(il_store).journal_bytes;
    ASSERT_EQ(pthread_create(&il_thread, NULL, il_late, NULL), 0);
    while (stats(il_store).journal_bytes == bytes)
        usleep(200);
    /* The late record is written and its caller waits; this sync does not
     * cover it. */
    ASSERT_EQ(atomic_load(&il_late_rc), 1);
    return 0;
}

static void test_sync_interleaving(void)
{
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.sync = TW_DURABLE_SYNC_GROUP;
    il_store = df_open(&c);
    atomic_store(&il_syncs, 0);
    tw__journal_fault = il_hook;
    ASSERT_EQ(sched(il_store, "early", INT64_MAX / 2, "e"), 0);
    pthread_join(il_thread, NULL);
    tw__journal_fault = NULL;
    ASSERT_EQ(atomic_load(&il_late_rc), TW_EIO);
    ASSERT_EQ(atomic_load(&il_syncs), 2);
    /* Working again, and the acknowledged key survives a reopen. */
    ASSERT_EQ(sched(il_store, "after", INT64_MAX / 2, "a"), 0);
    ASSERT_EQ(tw_durable_close(il_store), 0);
    il_store = df_open(&c);
    ASSERT_EQ(tw_durable_cancel(il_store, "early", 5), 0);
    ASSERT_EQ(tw_durable_cancel(il_store, "after", 5), 0);
    ASSERT_EQ(tw_durable_close(il_store), 0);
    df_rm_dir(dir);
}

/*
 * SYNC_INTERVAL: calls return without an fdatasync (counted by the fault
 * hook, which sees every one), the store's thread makes one once
 * sync_interval_ms of the (injected) monotonic clock has passed, and not
 * before; compaction syncs its copies before it deletes a segment. Then
 * the same on the real clock, with a generous bound.
 */
static atomic_int iv_syncs;

static int iv_count(int op)
{
    if (op == 's')
        atomic_fetch_add(&iv_syncs, 1);
    return 0;
}

static void test_sync_interval(void)
{
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.sync = TW_DURABLE_SYNC_INTERVAL;
    c.sync_interval_ms = 100;
    tw_durable *d = df_open(&c);
    tw__durable_sync(d); /* the first round: the interval starts */
    atomic_store(&iv_syncs, 0);
    tw__journal_fault = iv_count;
    for (int i = 0; i < 10; i++) {
        char k[16];
        snprintf(k, sizeof k, "iv%d", i);
        ASSERT_EQ(sched(d, k, INT64_MAX / 2, "p"), 0);
    }
    ASSERT_EQ(tw_durable_cancel(d, "iv0", 3), 0);
    tw__durable_sync(d);
    ASSERT_EQ(atomic_load(&iv_syncs), 0); /* acknowledged, not synced */
    atomic_fetch_add(&df_mono, UINT64_C(99) * 1000000u);
    tw__durable_sync(d);
    ASSERT_EQ(atomic_load(&iv_syncs), 0);
    atomic_fetch_add(&df_mono, UINT64_C(1) * 1000000u);
    tw__durable_sync(d);
    ASSERT_EQ(atomic_load(&iv_syncs), 1); /* 100 ms after the last */
    tw__durable_sync(d);
    ASSERT_EQ(atomic_load(&iv_syncs), 1);
    tw__journal_fault = NULL;
    ASSERT_EQ(tw_durable_close(d), 0);
    d = df_open(&c);
    ASSERT_EQ(stats(d).recovered, 9);
    ASSERT_EQ(tw_durable_close(d), 0);

    /* The real clock: a record is synced within 20 ms plus scheduling
     * (bound: 10 s, for loaded machines and valgrind). */
    c.wall_ms = NULL;
    c.mono_ns = NULL;
    c.sync_interval_ms = 20;
    d = df_open(&c);
    uint64_t s0 = stats(d).syncs;
    ASSERT_EQ(sched(d, "real", INT64_MAX / 2, "r"), 0);
    for (int i = 0; i < 10000 && stats(d).syncs == s0; i++)
        usleep(1000);
    ASSERT_LT(s0, stats(d).syncs);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/*
 * SYNC_INTERVAL: the interval's fdatasync does not hold up firing. The
 * hook holds that fdatasync until a timer that fell due after it began
 * has fired (or 5 s of real time pass); the timer must fire meanwhile.
 * Before the sync had a thread of its own, the store's thread made it, and
 * the timer waited for the whole fdatasync (here the 5 s).
 */
static atomic_int sb_in_sync, sb_fired_during;

static int sb_hook(int op)
{
    if (op != 's' || atomic_exchange(&sb_in_sync, 1))
        return 0;
    for (int i = 0; i < 5000 && !log_count("due"); i++)
        usleep(1000);
    atomic_store(&sb_fired_during, log_count("due") > 0);
    return 0;
}

static void test_sync_interval_no_stall(void)
{
    log_reset();
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.sync = TW_DURABLE_SYNC_INTERVAL;
    c.sync_interval_ms = 100;
    int64_t t0 = 1700000000000;
    set_wall(t0);
    tw_durable *d = df_open(&c);
    tw__durable_sync(d); /* the first round: the interval starts */
    atomic_store(&sb_in_sync, 0);
    atomic_store(&sb_fired_during, 0);
    tw__journal_fault = sb_hook;
    ASSERT_EQ(sched(d, "due", t0 + 10, "d"), 0); /* to sync, due soon */
    atomic_fetch_add(&df_mono, UINT64_C(100) * 1000000u); /* sync now */
    for (int i = 0; i < 10000 && !atomic_load(&sb_in_sync); i++)
        usleep(1000);
    ASSERT(atomic_load(&sb_in_sync));
    set_wall(t0 + 20); /* "due" is due while the sync runs */
    tw__durable_sync(d);
    tw__journal_fault = NULL;
    ASSERT_EQ(log_count("due"), 1);
    ASSERT(atomic_load(&sb_fired_during));
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/* A pending timer's record: 64 bytes plus the key, rounded up to 16. */
/* A callback that schedules its own key again (a periodic job): the new
 * version survives the completion of the old one, and a restart. */
static int rearm_count;

static int rearm_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)arg;
    rearm_count++;
    if (rearm_count < 3)
        ASSERT_EQ(tw_durable_schedule(d, t->key, t->key_len, t->due_ms + 100,
                                      "again", 5),
                  0);
    /* And one that cancels another key from inside. */
    if (rearm_count == 1)
        ASSERT_EQ(tw_durable_cancel(d, "other", 5), 0);
    return 0;
}

static void test_rearm_from_callback(void)
{
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.fire = rearm_fire;
    int64_t t0 = 1700000000000;
    set_wall(t0);
    rearm_count = 0;
    tw_durable *d = df_open(&c);
    ASSERT_EQ(sched(d, "job", t0 + 10, "first"), 0);
    ASSERT_EQ(sched(d, "other", t0 + 500, "o"), 0);
    set_wall(t0 + 10);
    tw__durable_sync(d);
    ASSERT_EQ(rearm_count, 1);
    ASSERT_EQ(stats(d).pending, 1); /* job again; other cancelled */
    ASSERT_EQ(tw_durable_close(d), 0);
    d = df_open(&c);
    ASSERT_EQ(stats(d).recovered, 1);
    set_wall(t0 + 110);
    tw__durable_sync(d);
    ASSERT_EQ(rearm_count, 2);
    set_wall(t0 + 210);
    tw__durable_sync(d);
    ASSERT_EQ(rearm_count, 3);
    set_wall(t0 + 1000);
    tw__durable_sync(d);
    ASSERT_EQ(rearm_count, 3);
    ASSERT_EQ(stats(d).pending, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

/* The largest payload goes to disk and comes back whole at fire time,
 * after a restart too. */
static size_t big_len;
static uint32_t big_crc;

static int big_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    big_len = t->payload_len;
    big_crc = tw__crc32c(0, t->payload, t->payload_len);
    return 0;
}

static void test_big_payload(void)
{
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.fire = big_fire;
    c.segment_bytes = 0; /* default: 64 MiB */
    int64_t t0 = 1700000000000;
    set_wall(t0);
    unsigned char *p = malloc(TW_DURABLE_PAYLOAD_MAX);
    uint64_t rng = 7;
    for (size_t i = 0; i < TW_DURABLE_PAYLOAD_MAX; i++)
        p[i] = (unsigned char)tw_test_rand(&rng);
    tw_durable *d = df_open(&c);
    ASSERT_EQ(
        tw_durable_schedule(d, "big", 3, t0 + 5, p, TW_DURABLE_PAYLOAD_MAX), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    d = df_open(&c);
    set_wall(t0 + 5);
    tw__durable_sync(d);
    ASSERT_EQ(big_len, TW_DURABLE_PAYLOAD_MAX);
    ASSERT_EQ(big_crc, tw__crc32c(0, p, TW_DURABLE_PAYLOAD_MAX));
    ASSERT_EQ(tw_durable_close(d), 0);
    free(p);
    df_rm_dir(dir);
}

/* The key table grows a few buckets per new key: while it does, keys in
 * the previous table and in the new one are found, replaced and
 * cancelled, and a reopen finds exactly the keys left. */
#define GROW_KEYS 12000

static void test_key_table_growth(void)
{
    log_reset();
    const char *dir = new_dir();
    tw_durable_config c = base_cfg(dir);
    c.sync = TW_DURABLE_SYNC_NONE;
    c.segment_bytes = 1 << 20;
    int64_t t0 = 1700000000000;
    set_wall(t0);
    tw_durable *d = df_open(&c);
    static bool gone[GROW_KEYS];
    memset(gone, 0, sizeof gone);
    size_t pending = 0, growing = 0, nb = 0, nold = 0, grew = 0, last_nb = 0;
    size_t checks = 0;
    char k[32];
    for (size_t i = 0; i < GROW_KEYS; i++) {
        snprintf(k, sizeof k, "g%zu", i);
        ASSERT_EQ(sched(d, k, t0 + 100000, "a"), 0);
        pending++;
        tw__durable_table(d, &nb, &nold);
        growing += nold != 0;
        if (nold != 0 && growing % 97 == 1) {
            /* Mid-growth: every live key is found (a cancel finds it),
             * then scheduled again. */
            for (size_t j = 0; j <= i; j++) {
                if (gone[j])
                    continue;
                snprintf(k, sizeof k, "g%zu", j);
                ASSERT_EQ(tw_durable_cancel(d, k, strlen(k)), 0);
                ASSERT_EQ(sched(d, k, t0 + 100000, "b"), 0);
            }
            ASSERT_EQ(stats(d).pending, pending);
            checks++;
        }
        grew += nb != last_nb && last_nb != 0;
        last_nb = nb;
        if (i % 7 == 6) { /* an older key, perhaps not yet moved */
            size_t j = i / 2;
            snprintf(k, sizeof k, "g%zu", j);
            ASSERT_EQ(tw_durable_cancel(d, k, strlen(k)),
                      gone[j] ? TW_ENOENT : 0);
            pending -= !gone[j];
            gone[j] = true;
        }
        if (i % 5 == 4) { /* replace a recent one: still one key */
            size_t j = i - 3;
            snprintf(k, sizeof k, "g%zu", j);
            ASSERT_EQ(sched(d, k, t0 + 100000, "b"), 0);
            pending += gone[j];
            gone[j] = false;
        }
    }
    ASSERT_GE(grew, 3);     /* 1024 -> 2048 -> ... buckets */
    ASSERT_GT(growing, 50); /* calls made while a growth was under way */
    ASSERT_GE(checks, 3);
    ASSERT_EQ(stats(d).pending, pending);
    ASSERT_EQ(tw_durable_close(d), 0);
    d = df_open(&c);
    ASSERT_EQ(stats(d).recovered, pending);
    for (size_t i = 0; i < GROW_KEYS; i++) {
        snprintf(k, sizeof k, "g%zu", i);
        ASSERT_EQ(tw_durable_cancel(d, k, strlen(k)), gone[i] ? TW_ENOENT : 0);
    }
    ASSERT_EQ(stats(d).pending, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

static void test_node_size(void)
{
    ASSERT_EQ(tw__durable_entry_size(0), 56);
    ASSERT_EQ(tw__durable_entry_size(1), 56);
    ASSERT_EQ(tw__durable_entry_size(4), 56);
    ASSERT_EQ(tw__durable_entry_size(5), 64);
    ASSERT_EQ(tw__durable_entry_size(16), 72);
    ASSERT_EQ(tw__durable_entry_size(20), 72);
    ASSERT_EQ(tw__durable_entry_size(21), 80);
    /* 52 bytes and the key's padding to 8: with at most 4 bytes of key
     * table a key, within 64 bytes plus the key at every length. */
    for (size_t k = 1; k <= TW_DURABLE_KEY_MAX; k++)
        ASSERT(tw__durable_entry_size(k) - k <= 59);
    /* The checksum is CRC32C (its check value). */
    ASSERT_EQ(tw__crc32c(0, "123456789", 9), 0xE3069283u);
}

int main(void)
{
    RUN_TEST(test_bad_input);
    RUN_TEST(test_fire_at_due);
    RUN_TEST(test_replace_cancel);
    RUN_TEST(test_retry);
    RUN_TEST(test_recovery_order);
    RUN_TEST(test_attempt_after_crash);
    RUN_TEST(test_busy);
    RUN_TEST(test_clock_steps);
    RUN_TEST(test_torn_tail);
    RUN_TEST(test_torn_batch);
    RUN_TEST(test_bit_flips);
    RUN_TEST(test_old_segment_damage);
    RUN_TEST(test_disk_faults);
    RUN_TEST(test_fault_rotation);
    RUN_TEST(test_schedule_many);
    RUN_TEST(test_schedule_many_faults);
    RUN_TEST(test_cancel_many);
    RUN_TEST(test_late_stats);
    RUN_TEST(test_clock_moves_in_round);
    RUN_TEST(test_compaction);
    RUN_TEST(test_executors);
    RUN_TEST(test_group_commit);
    RUN_TEST(test_group_gather);
    RUN_TEST(test_sync_interleaving);
    RUN_TEST(test_sync_interval);
    RUN_TEST(test_sync_interval_no_stall);
    RUN_TEST(test_rearm_from_callback);
    RUN_TEST(test_big_payload);
    RUN_TEST(test_node_size);
    RUN_TEST(test_key_table_growth);
    return tw_test_done();
}
