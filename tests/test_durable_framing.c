/* SPDX-License-Identifier: MIT */
/*
 * tests/test_durable_framing.c - a payload that holds the bytes of journal
 * records never acts as a record.
 *
 * Payloads here embed record images of three kinds: made with an unsalted
 * checksum (the format-1 framing, which any payload's author can compute),
 * copied byte for byte from another store's journal, and claiming that the
 * whole segment was synced (so that, taken for records, they would turn a
 * torn tail into "damage in the middle", or with TW_DURABLE_REPAIR cancel
 * an acknowledged timer). Cases: a torn tail whose own payload holds such
 * images, with and without TW_DURABLE_REPAIR; a sweep that cuts and
 * garbles the newest segment at every byte of its last records; kill -9 of
 * a child in the middle of 1 MiB writes of such payloads, round after
 * round; and a format-1 journal, which opens and is rewritten in format 2.
 *
 * Usage: test_durable_framing [ROUNDS [CASE]] (kill -9 rounds, default 12;
 * one case by its function's name).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <time.h>

#include "durable_fixture.h"
#include "journal.h"

static int fire_none(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)t;
    (void)arg;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Record images, encoded here (not by the library) the way format 1 did:
 * checksum from 0 over bytes 4 .. end. */

static void le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static size_t image(unsigned char *p, int type, const char *key,
                    const char *payload, uint32_t synced, uint64_t due)
{
    size_t kl = strlen(key), pl = payload ? strlen(payload) : 0;
    size_t body = kl + (type == JR_SCHED ? JR_SCHED_FIXED + pl : 0);
    le32(p + 4, (uint32_t)body);
    p[8] = (unsigned char)type;
    p[9] = 0;
    p[10] = (unsigned char)kl;
    p[11] = (unsigned char)(kl >> 8);
    le32(p + 12, synced);
    unsigned char *b = p + JR_REC_HDR;
    if (type == JR_SCHED) {
        for (int i = 0; i < 8; i++)
            b[i] = (unsigned char)(due >> (8 * i));
        le32(b + 8, 0);
        le32(b + 12, (uint32_t)pl);
        b += JR_SCHED_FIXED;
    }
    memcpy(b, key, kl);
    if (pl)
        memcpy(b + kl, payload, pl);
    le32(p, tw__crc32c(0, p + 4, JR_REC_HDR + body - 4));
    return JR_REC_HDR + body;
}

/* The last record of a real store's segment: a CANCEL of @key, valid in
 * that store's journal. */
static size_t foreign_cancel(unsigned char *out, const char *key)
{
    char buf[256];
    const char *dir = df_new_dir(buf, sizeof buf, NULL);
    tw_durable_config c = df_cfg(dir, fire_none);
    tw_durable *d = df_open(&c);
    ASSERT_EQ(tw_durable_schedule(d, key, strlen(key), INT64_MAX / 2, "", 0),
              0);
    ASSERT_EQ(tw_durable_cancel(d, key, strlen(key)), 0);
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    char path[300];
    snprintf(path, sizeof path, "%s/0000000001.twj", dir);
    unsigned char *b;
    df_read_file(path, &b);
    size_t size = JR_REC_HDR + strlen(key);
    size_t end = (size_t)st.journal_bytes;
    memcpy(out, b + end - size, size);
    free(b);
    df_rm_dir(dir);
    return size;
}

/* A payload holding record images meant to do harm if taken for records:
 * cancel "k0" and "k1", schedule "evil", all claiming the segment synced. */
static size_t evil_payload(unsigned char *p)
{
    static unsigned char foreign[64];
    static size_t nforeign;
    if (!nforeign)
        nforeign = foreign_cancel(foreign, "k1");
    size_t n = 0;
    memcpy(p + n, "<<", 2);
    n += 2;
    n += image(p + n, JR_CANCEL, "k0", NULL, 0xffffff00u, 0);
    memcpy(p + n, foreign, nforeign);
    n += nforeign;
    n += image(p + n, JR_SCHED, "evil", "x", 0xffffff00u, UINT64_C(1) << 60);
    memcpy(p + n, ">>", 2);
    return n + 2;
}

/* Keys "k0", "k1" acknowledged, then "k0" still pending, and "evil"
 * never scheduled: no forged record took effect. Keeps the store as it
 * was (the caller rewrites the files anyway). */
static void no_forgery(tw_durable *d)
{
    ASSERT_EQ(tw_durable_cancel(d, "evil", 4), TW_ENOENT);
    ASSERT_EQ(tw_durable_cancel(d, "k0", 2), 0);
    ASSERT_EQ(tw_durable_cancel(d, "k1", 2), 0);
}

static char segpath[300];

static const char *seg_of(const char *dir, unsigned no)
{
    snprintf(segpath, sizeof segpath, "%s/%010u.twj", dir, no);
    return segpath;
}

/* Delete every segment of @dir and write @b as segment 1. */
static void only_segment(const char *dir, const unsigned char *b, size_t n)
{
    DIR *dd = opendir(dir);
    ASSERT_NOT_NULL(dd);
    struct dirent *e;
    while ((e = readdir(dd)) != NULL) {
        if (strstr(e->d_name, ".twj") || strcmp(e->d_name, "MANIFEST") == 0) {
            char p[600];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            ASSERT_EQ(unlink(p), 0);
        }
    }
    closedir(dd);
    df_write_file(seg_of(dir, 1), b, n);
}

/* ------------------------------------------------------------------------ */

/* k0..k3 acknowledged, then "torn" with an evil payload whose write was
 * cut after the images: the open finds a torn tail and nothing else. */
static void test_forged_in_torn_tail(void)
{
    char buf[256];
    const char *dir = df_new_dir(buf, sizeof buf, NULL);
    tw_durable_config c = df_cfg(dir, fire_none);
    tw_durable *d = df_open(&c);
    const char *keys[] = {"k0", "k1", "k2", "k3"};
    for (int i = 0; i < 4; i++)
        ASSERT_EQ(tw_durable_schedule(d, keys[i], 2, INT64_MAX / 2, "p", 1), 0);
    unsigned char pay[512];
    size_t pl = evil_payload(pay);
    ASSERT_EQ(tw_durable_schedule(d, "torn", 4, INT64_MAX / 2, pay, pl), 0);
    tw_durable_stats st;
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    unsigned char *b;
    size_t n = df_read_file(seg_of(dir, 1), &b);
    size_t end = (size_t)st.journal_bytes;
    size_t start = end - tw__jr_size(JR_SCHED, 4, pl);
    size_t in_pay = start + JR_REC_HDR + JR_SCHED_FIXED + 4;
    unsigned char *m = malloc(n);
    for (int repair = 0; repair < 2; repair++) {
        for (int how = 0; how < 3; how++) {
            memcpy(m, b, n);
            size_t len = n;
            if (how == 0) /* cut just before the payload's end */
                len = in_pay + pl - 1;
            else if (how == 1) /* the checksum of the whole record bad */
                m[start] ^= 0x40;
            else /* the rest of the write never happened: zeros */
                memset(m + in_pay + pl - 2, 0, end - (in_pay + pl - 2));
            only_segment(dir, m, len);
            c.flags = repair ? TW_DURABLE_REPAIR : 0;
            d = df_open(&c);
            ASSERT_EQ(df_pending(d), 4);
            ASSERT_EQ(tw_durable_cancel(d, "torn", 4), TW_ENOENT);
            no_forgery(d);
            ASSERT_EQ(tw_durable_close(d), 0);
        }
    }
    free(m);
    free(b);
    df_rm_dir(dir);
}

/* Where fast: tmpfs under /dev/shm (thousands of opens), else /tmp. */
static const char *fast_base(void)
{
    struct stat st;
    return stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) &&
                   access("/dev/shm", W_OK) == 0
               ? "/dev/shm"
               : NULL;
}

/* k0, k1 synced one by one; then r2, r3, r4 with evil payloads written
 * without fdatasync (so none of them claims another was synced: damage
 * to any of them is a torn tail there). Every cut and every garbled byte
 * from r2 on: the open succeeds without repair, keeps exactly the records
 * before the damage, and applies nothing forged. */
static void test_sweep(void)
{
    char buf[256];
    const char *dir = df_new_dir(buf, sizeof buf, fast_base());
    tw_durable_config c = df_cfg(dir, fire_none);
    tw_durable *d = df_open(&c);
    ASSERT_EQ(tw_durable_schedule(d, "k0", 2, INT64_MAX / 2, "p", 1), 0);
    ASSERT_EQ(tw_durable_schedule(d, "k1", 2, INT64_MAX / 2, "p", 1), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    c.sync = TW_DURABLE_SYNC_NONE;
    d = df_open(&c);
    unsigned char pay[512];
    size_t pl = evil_payload(pay);
    size_t offs[6];
    offs[0] = JR_SEG_HDR;
    offs[1] = offs[0] + tw__jr_size(JR_SCHED, 2, 1);
    offs[2] = offs[1] + tw__jr_size(JR_SCHED, 2, 1);
    for (int i = 2; i < 5; i++) {
        char k[3] = {'r', (char)('0' + i), 0};
        ASSERT_EQ(tw_durable_schedule(d, k, 2, INT64_MAX / 2, pay, pl), 0);
        offs[i + 1] = offs[i] + tw__jr_size(JR_SCHED, 2, pl);
    }
    ASSERT_EQ(tw_durable_close(d), 0);
    c.sync = TW_DURABLE_SYNC_EACH;
    unsigned char *b;
    size_t n = df_read_file(seg_of(dir, 1), &b);
    ASSERT_GE(n, offs[5]);
    unsigned char *m = malloc(n);
    unsigned opens = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (size_t at = offs[2]; at <= offs[5]; at++) {
        for (int how = 0; how < 2; how++) {
            if (how == 1 && at == offs[5])
                break;
            memcpy(m, b, n);
            size_t len = n;
            if (how == 0)
                len = at;
            else
                m[at] ^= (unsigned char)(1u << (at % 8));
            /* Records wholly before the damage. */
            size_t whole = 2;
            while (whole < 5 && offs[whole + 1] <= at)
                whole++;
            if (how == 0 && at == offs[5])
                whole = 5;
            only_segment(dir, m, len);
            d = df_open(&c);
            opens++;
            ASSERT_EQ(df_pending(d), whole);
            no_forgery(d);
            ASSERT_EQ(tw_durable_close(d), 0);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    fprintf(stderr, "   %u opens, %.2f s\n", opens,
            (double)(t1.tv_sec - t0.tv_sec) +
                (double)(t1.tv_nsec - t0.tv_nsec) / 1e9);
    free(m);
    free(b);
    df_rm_dir(dir);
}

/* ------------------------------------------------------------------------ */
/* kill -9 in the middle of 1 MiB writes. */

#define BIG (1024u * 1024u)

/* A 1 MiB payload with an evil image block every 4 KiB, so that a write
 * cut anywhere past its first page leaves images behind the cut. */
static unsigned char *big_payload(void)
{
    unsigned char *p = malloc(BIG);
    ASSERT_NOT_NULL(p);
    unsigned char blk[512];
    size_t bl = evil_payload(blk);
    for (size_t o = 0; o < BIG; o += 4096) {
        memset(p + o, 'a' + (int)(o / 4096 % 26), 4096);
        memcpy(p + o + 100, blk, bl);
    }
    return p;
}

struct writer_arg {
    const char *dir;
    unsigned round;
    int fd; /* acknowledgements: one uint32 index each */
};

/* The child: writes 1 MiB timers "r<round>-<i>" until it is killed,
 * reporting each one acknowledged. */
static void writer(const struct writer_arg *a, const unsigned char *pay)
{
    tw_durable_config c = df_cfg(a->dir, fire_none);
    c.sync = TW_DURABLE_SYNC_NONE; /* acknowledged once written: survives
                                      kill -9 of the process */
    c.segment_bytes = 8u << 20;
    tw_durable *d = NULL;
    if (tw_durable_open(&d, &c) != 0)
        _exit(3);
    for (uint32_t i = 0;; i++) {
        char k[32];
        int kl = snprintf(k, sizeof k, "r%u-%u", a->round, i);
        if (tw_durable_schedule(d, k, (size_t)kl, INT64_MAX / 2, pay, BIG) != 0)
            _exit(4);
        if (write(a->fd, &i, sizeof i) != (ssize_t)sizeof i)
            _exit(5);
    }
}

static void test_kill_in_big_writes(unsigned rounds)
{
    char buf[256];
    const char *dir = df_new_dir(buf, sizeof buf, NULL);
    unsigned char *pay = big_payload();
    uint64_t rng = (uint64_t)time(NULL);
    fprintf(stderr, "   seed %" PRIu64 "\n", rng);
    unsigned torn = 0;
    for (unsigned r = 0; r < rounds; r++) {
        int p[2];
        ASSERT_EQ(pipe(p), 0);
        pid_t pid = fork();
        ASSERT(pid >= 0);
        if (pid == 0) {
            close(p[0]);
            struct writer_arg a = {.dir = dir, .round = r, .fd = p[1]};
            writer(&a, pay);
        }
        close(p[1]);
        uint32_t idx, acked = 0;
        ASSERT_EQ(read(p[0], &idx, sizeof idx), (ssize_t)sizeof idx);
        acked = idx + 1;
        /* A random moment a few writes later. */
        struct timespec ts = {0, (long)(tw_test_rand(&rng) % 20000000u)};
        nanosleep(&ts, NULL);
        ASSERT_EQ(kill(pid, SIGKILL), 0);
        while (read(p[0], &idx, sizeof idx) == (ssize_t)sizeof idx)
            acked = idx + 1;
        close(p[0]);
        int status;
        ASSERT_EQ(waitpid(pid, &status, 0), pid);
        ASSERT(WIFSIGNALED(status));
        /* Open without repair: every acknowledged timer is there (each
         * cancel finds it; that also keeps the store small). */
        tw_durable_config c = df_cfg(dir, fire_none);
        c.segment_bytes = 8u << 20;
        tw_durable *d = df_open(&c);
        tw_durable_stats st;
        ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
        for (uint32_t i = 0; i < acked; i++) {
            char k[32];
            int kl = snprintf(k, sizeof k, "r%u-%u", r, i);
            ASSERT_EQ(tw_durable_cancel(d, k, (size_t)kl), 0);
        }
        /* What was written and not acknowledged may be there or not. */
        char k[32];
        int kl = snprintf(k, sizeof k, "r%u-%u", r, acked);
        torn += tw_durable_cancel(d, k, (size_t)kl) != 0;
        ASSERT_EQ(tw_durable_cancel(d, "evil", 4), TW_ENOENT);
        ASSERT_EQ(tw_durable_close(d), 0);
    }
    fprintf(stderr, "   %u rounds, %u with the last write lost\n", rounds,
            torn);
    free(pay);
    df_rm_dir(dir);
}

/* ------------------------------------------------------------------------ */
/* Format 1. */

/* A format-1 journal (as twheel 0.2 wrote it) with "old0" .. "old2", a
 * cancel of "old1", and a torn tail: it opens, keeps what it held, and is
 * rewritten in format 2 (whose header says version 2). */
static void test_format_1(void)
{
    char buf[256];
    const char *dir = df_new_dir(buf, sizeof buf, NULL);
    unsigned char seg[4096];
    memset(seg, 0, sizeof seg);
    memcpy(seg, "TWJOURN1", 8);
    le32(seg + 8, 1);
    le32(seg + 12, 1);
    le32(seg + 28, tw__crc32c(0, seg, 28));
    size_t n = JR_SEG_HDR;
    const uint64_t far = UINT64_C(1) << 60;
    n += image(seg + n, JR_SCHED, "old0", "zero", 32, far);
    n += image(seg + n, JR_SCHED, "old1", "one", 32, far);
    n += image(seg + n, JR_SCHED, "old2", "two", 32, far);
    n += image(seg + n, JR_CANCEL, "old1", NULL, (uint32_t)n, far);
    size_t torn = image(seg + n, JR_SCHED, "old3", "three", (uint32_t)n, far);
    seg[n + torn - 1] ^= 1;
    df_write_file(seg_of(dir, 1), seg, sizeof seg);
    tw_durable_config c = df_cfg(dir, fire_none);
    tw_durable *d = df_open(&c);
    ASSERT_EQ(df_pending(d), 2);
    ASSERT_EQ(tw_durable_close(d), 0);
    /* Segment 1 is gone; the newest one is format 2. */
    ASSERT(access(seg_of(dir, 1), F_OK) != 0);
    unsigned char *b;
    size_t len = df_read_file(seg_of(dir, 2), &b);
    ASSERT_GE(len, JR_SEG_HDR);
    ASSERT_EQ(b[8], 2);
    free(b);
    d = df_open(&c);
    ASSERT_EQ(df_pending(d), 2);
    ASSERT_EQ(tw_durable_cancel(d, "old0", 4), 0);
    ASSERT_EQ(tw_durable_cancel(d, "old1", 4), TW_ENOENT);
    ASSERT_EQ(tw_durable_cancel(d, "old2", 4), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

static unsigned kill_rounds = 12;

static void test_kill(void)
{
    test_kill_in_big_writes(kill_rounds);
}

/* One case by name (argv[2]), or all. */
#define CASE(fn)                                                               \
    if (argc < 3 || strcmp(argv[2], #fn) == 0)                                 \
    RUN_TEST(fn)

int main(int argc, char **argv)
{
    if (argc > 1)
        kill_rounds = (unsigned)strtoul(argv[1], NULL, 10);
    CASE(test_forged_in_torn_tail);
    CASE(test_sweep);
    CASE(test_format_1);
    CASE(test_kill);
    return tw_test_done();
}
