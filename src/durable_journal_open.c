/* SPDX-License-Identifier: MIT */
/*
 * src/durable_journal_open.c - open and close of the journal backend.
 *
 * Open: check the journal's part of the config, make the directory
 * (mkdir -p, each level synced in its parent) and lock it, replay the
 * segments (journal_reader.c lists, reads and scans them; this file
 * applies their records in order: SCHED makes or replaces the key's
 * entry, CANCEL and DONE remove it, FIRE counts a delivery that began,
 * DEAD makes or replaces it as a dead letter), fit the key table, then
 * start the store's thread and the executor. Close stops them, syncs
 * what was written and frees everything.
 */
#define _GNU_SOURCE

#include "twheel/durable.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "durable_journal.h"
#include "durable_hooks.h"
#include "common.h"

#ifdef TW_TEST_HOOKS
void (*tw__journal_list_hook)(int dirfd, int step);
#endif

static void free_all(jstore *s);
static const struct tw_durable_ops journal_ops;

/* ------------------------------------------------------------------------ */
/* Open and replay. */

/* errno @e of @what on @path: its code, and a message with the cause
 * (the code's own words, or the system's for an I/O error). */
static int os_error(const tw_durable_config *cfg, int e, const char *what,
                    const char *path)
{
    char why[128];
    int rc = tw__jr_errno(e);
    tw__durable_errmsg(cfg, "%s %s: %s", what, path,
                       rc == TW_EIO ? strerror_r(e, why, sizeof why)
                                    : tw_strerror(rc));
    return rc;
}

struct replay_ctx {
    jstore *s;
    const tw_durable_config *cfg;
    const jr_seg_file *f;
    size_t next; /* where the next record should begin: a gap is damage */
    uint32_t no;
    uint64_t sched;
    jr_rec batch[RECS_AHEAD]; /* records read, not yet applied */
    size_t nbatch;
};

static int replay_apply(struct replay_ctx *c, const jr_rec *r)
{
    jstore *s = c->s;
    if ((r->type == JR_SCHED || r->type == JR_DEAD) &&
        tw__key_reserve(&s->keys) != 0)
        return TW_ENOMEM;
    struct tw__key_pos p = tw__key_find(&s->keys, r->key, r->key_len);
    struct tw__key_entry *n = tw__key_at(&s->keys, p);
    switch (r->type) {
    case JR_SCHED:
    case JR_DEAD:
        c->sched++;
        if (!n) {
            n = tw__key_entry_new(&s->keys, r->key, r->key_len,
                                  tw__journal_on_due);
            if (!n)
                return TW_ENOMEM;
            tw__key_insert(&s->keys, p, n);
        }
        tw__journal_dead_clear(s, n);
        tw__journal_entry_record(n, c->no, r->off);
        if (r->type == JR_SCHED) {
            tw_wheel_add(s->wheel, &n->tm, tw__journal_tick(r->due_ms));
        } else {
            tw_wheel_cancel(s->wheel, &n->tm);
            n->fl |= ENT_DEAD;
            s->ndead++;
        }
        break;
    case JR_FIRE:
        if (n)
            tw__journal_fires_add(n);
        break;
    default: /* CANCEL, DONE */
        if (n) {
            tw__journal_dead_clear(s, n);
            tw__key_take(&s->keys, p);
            tw_wheel_cancel(s->wheel, &n->tm);
            tw__key_entry_free(&s->keys, n);
        }
        break;
    }
    return 0;
}

/* Apply the records batched so far, in order, their keys asked for
 * ahead. */
static int replay_flush(struct replay_ctx *c)
{
    tw__journal_prefetch_records(c->s, c->batch, c->nbatch, sizeof c->batch[0]);
    int rc = 0;
    for (size_t i = 0; i < c->nbatch && !rc; i++)
        rc = replay_apply(c, &c->batch[i]);
    c->nbatch = 0;
    return rc;
}

/* tw__jr_scan()'s callback: records point into the segment's buffer,
 * which outlives the scan, so they are applied RECS_AHEAD at a time. */
static int replay_one(void *arg, const jr_rec *r)
{
    struct replay_ctx *c = arg;
    if (r->off > c->next) /* damage skipped (repair mode) */
        tw__journal_report_bytes(c->cfg, TW_DURABLE_DAMAGE_SKIPPED, c->no,
                                 c->f->buf, c->next, r->off, false);
    c->next = (size_t)r->off + r->size;
    c->batch[c->nbatch++] = *r;
    return c->nbatch == RECS_AHEAD ? replay_flush(c) : 0;
}

/* Size the key table once from the segments' sizes (the newest's
 * allocated size, a little more than its records): at 128 bytes a record and
 * two keys a bucket it rarely has to grow during the replay, and each growth
 * would touch every entry again. A guess: too small costs a growth, too large
 * one rehash at the end (fit_table()). */
static void presize_table(jstore *s, const uint32_t *nos, size_t cnt)
{
    uint64_t old_bytes = 0;
    for (size_t i = 0; i < cnt; i++) {
        char name[JR_SEG_NAME_MAX];
        struct stat st;
        tw__jr_seg_name(name, nos[i]);
        if (fstatat(s->dirfd, name, &st, 0) == 0)
            old_bytes += (uint64_t)st.st_size;
    }
    size_t want = s->keys.nbuckets;
    while (want < old_bytes / 256 && want < ((size_t)1 << 40))
        want *= 2;
    if (want > s->keys.nbuckets)
        (void)tw__key_resize(&s->keys, want);
}

/* After the replay: a table sized for records that turned out dead (or
 * replaced) is cut to one to two keys a bucket; nothing changes if that
 * fails. */
static void fit_table(jstore *s)
{
    tw__key_grow_finish(&s->keys);
    size_t want = s->keys.nbuckets;
    while (want > 1024 && s->keys.count < want)
        want /= 2;
    if (want < s->keys.nbuckets)
        (void)tw__key_resize(&s->keys, want);
}

/* A segment whose header is bad: 1 if it was deleted (a crash while the
 * newest segment was being made: it is preallocated before its header is
 * written and synced, and gets records only after that, so nothing but
 * zeros follow; or any, with TW_DURABLE_REPAIR), else TW_EIO. */
static int bad_header(jstore *s, const tw_durable_config *cfg, jr_seg_file *f,
                      bool *damaged)
{
    bool empty = f->last && tw__jr_all_zero(f->buf, JR_SEG_HDR, f->size);
    if (!empty && !(cfg->flags & TW_DURABLE_REPAIR)) {
        tw__durable_errmsg(cfg, "%s/%s offset 0: bad segment header", cfg->dir,
                           f->name);
        return TW_EIO;
    }
    if (!empty)
        tw__journal_report_bytes(cfg, TW_DURABLE_DAMAGE_SEGMENT, f->no, f->buf,
                                 0, f->size, true);
    close(f->fd);
    f->fd = -1;
    if (!s->readonly)
        unlinkat(s->dirfd, f->name, 0);
    fsync(s->dirfd);
    *damaged |= !empty;
    return 1;
}

/* Replay segment @f into the index and keep it. */
static int replay_segment(jstore *s, const tw_durable_config *cfg,
                          jr_seg_file *f, bool *damaged)
{
    int rc = tw__jr_read_segment(s->dirfd, s->readonly, f);
    if (rc)
        return rc;
    unsigned version = tw__jr_seg_hdr_ok(f->buf, f->size, f->no, &f->seed);
    if (!version)
        return bad_header(s, cfg, f, damaged);
    f->legacy |= version == JR_VERSION_1;
    f->version = version;
    struct replay_ctx c = {
        .s = s, .cfg = cfg, .f = f, .next = JR_SEG_HDR, .no = f->no};
    size_t end = f->size;
    rc = tw__jr_scan(f->buf, f->size, f->seed, f->last,
                     cfg->flags & TW_DURABLE_REPAIR, replay_one, &c, &end);
    int frc = replay_flush(&c); /* the records before any damage */
    if (rc >= 0 && frc)
        rc = frc;
    if (rc == TW_EIO)
        tw__durable_errmsg(cfg, "%s/%s offset %zu: corrupt record", cfg->dir,
                           f->name, end);
    if (rc < 0)
        return rc;
    /* Past the last good record: a torn tail in the newest segment;
     * skipped damage at the end of an older one (repair mode). */
    tw__journal_report_bytes(
        cfg, end < f->size ? TW_DURABLE_DAMAGE_TAIL : TW_DURABLE_DAMAGE_SKIPPED,
        f->no, f->buf, c.next, f->size, true);
    *damaged |= rc == 1;
    rc = s->readonly ? 0 : tw__jr_clear_tail(f, end);
    return rc ? rc : tw__jr_adopt(&s->w, f, end, c.sched);
}

/* After the replay: live counts per segment, the writer's position, and a
 * fresh segment if there was none or damage was repaired. */
static int replay_done(jstore *s, const tw_durable_config *cfg, bool damaged)
{
    for (size_t i = 0; i < s->keys.nbuckets; i++)
        for (struct tw__key_entry *n =
                 tw__key_entry_of(&s->keys, s->keys.buckets[i]);
             n; n = tw__key_entry_of(&s->keys, tw__key_link(n)))
            tw__journal_seg_live(s, n->seg, +1);
    if (s->readonly)
        return 0; /* nothing is written: no new segment */
    if (s->w.nseg) {
        jr_seg *cur = &s->w.segs[s->w.nseg - 1];
        s->w.written = JR_LSN(cur->no, cur->size);
        s->w.synced = s->w.written;
        if (!damaged)
            tw__jr_publish(&s->w);
    }
    if (s->w.nseg == 0 || damaged) {
        uint32_t no = s->w.nseg ? s->w.segs[s->w.nseg - 1].no + 1 : 1;
        int rc = tw__jr_new_segment(&s->w, no);
        if (rc)
            tw__durable_errmsg(cfg, "cannot make %s/%010u.twj: %s", cfg->dir,
                               no, tw_strerror(rc));
        return rc;
    }
    return 0;
}

/* Check that the oldest segment the store must have (MANIFEST, else 1) is
 * there, and delete the older ones, left by a deletion that a crash
 * interrupted (the manifest is written first); *@first: the index in
 * @nos of the oldest segment to replay. TW_DURABLE_REPAIR opens whatever
 * is there. A format-1 journal without a manifest may have deleted its
 * oldest segments: nothing can be checked. */
static int first_segment(jstore *s, const tw_durable_config *cfg,
                         const uint32_t *nos, size_t cnt, size_t *first)
{
    bool repair = cfg->flags & TW_DURABLE_REPAIR;
    uint32_t oldest = 1;
    int rc = tw__jr_manifest_read(s->dirfd, &oldest);
    bool manifest = rc == 0;
    if (rc == TW_EIO && !repair) {
        tw__durable_errmsg(cfg, "%s/MANIFEST: damaged", cfg->dir);
        return TW_EIO;
    }
    if (rc)
        oldest = 1;
    size_t i = 0;
    for (; manifest && i < cnt && nos[i] < oldest; i++) {
        char name[JR_SEG_NAME_MAX];
        tw__jr_seg_name(name, nos[i]);
        if (s->readonly) /* skipped, left for a writer to delete */
            continue;
        if (unlinkat(s->dirfd, name, 0) != 0)
            return TW_EIO;
        (void)fsync(s->dirfd);
    }
    *first = i;
    bool gone = i < cnt ? nos[i] > oldest : manifest;
    if (gone && repair) {
        if (i < cnt)
            tw__journal_report_missing(cfg, oldest, nos[i] - oldest);
        if (s->readonly)
            return 0; /* a dry run: nothing written */
        /* What is there is the journal from now on. */
        if (i < cnt)
            return tw__jr_manifest_write(s->dirfd, nos[i]);
        if (unlinkat(s->dirfd, "MANIFEST", 0) != 0 && errno != ENOENT)
            return TW_EIO;
        return 0;
    }
    if (gone && (manifest || tw__jr_seg_version(s->dirfd, nos[i]) != 1)) {
        tw__durable_errmsg(
            cfg,
            "%s/%010u.twj is missing: the journal begins at segment "
            "%u%s",
            cfg->dir, oldest, oldest, i < cnt ? "" : " and no segment is left");
        return TW_EIO;
    }
    return 0;
}

/* Whether segment @no, listed and then not found, was deleted by a live
 * store's compaction meanwhile (read-only opens only): its MANIFEST now
 * names a later segment as the oldest. */
static bool compacted_away(jstore *s, uint32_t no)
{
    uint32_t oldest;
    return s->readonly && tw__jr_manifest_read(s->dirfd, &oldest) == 0 &&
           oldest > no;
}

/* Replay segments @nos[@i .. @cnt) in order; @f: the reader's buffer.
 * *@vanished: some segment was compacted away before it could be read. */
static int replay_list(jstore *s, const tw_durable_config *cfg,
                       const uint32_t *nos, size_t i, size_t cnt,
                       jr_seg_file *f, bool *damaged, bool *vanished)
{
    int rc = 0;
    for (size_t i0 = i; i < cnt && rc == 0; i++) {
        f->no = nos[i];
        f->last = i + 1 == cnt;
        if (i > i0 && nos[i] != nos[i - 1] + 1 &&
            !(cfg->flags & TW_DURABLE_REPAIR)) {
            tw__jr_seg_name(f->name, f->no);
            tw__durable_errmsg(cfg, "%s/%s: segment %u is missing", cfg->dir,
                               f->name, nos[i - 1] + 1);
            return TW_EIO;
        }
        if (i > i0 && nos[i] != nos[i - 1] + 1) { /* repair mode */
            tw__journal_report_missing(cfg, nos[i - 1] + 1,
                                       nos[i] - nos[i - 1] - 1);
            /* Rewritten after the replay, as damage is: left as it is,
             * the gap would stop the next open without TW_DURABLE_REPAIR. */
            *damaged = true;
        }
        rc = replay_segment(s, cfg, f, damaged);
        if (f->fd >= 0)
            close(f->fd);
        f->fd = -1;
        if (rc == 1) /* a bad header, deleted */
            rc = 0;
        if (rc == TW_ENOENT && compacted_away(s, f->no)) {
            *vanished = true;
            rc = 0;
        } else if (rc == TW_ENOENT) {
            rc = TW_EIO;
        }
    }
    return rc;
}

/* A read-only open beside a live store: while the listed segments were
 * read, its compaction may have copied live records of a segment this
 * open skipped (the MANIFEST had moved past it) or could not find any
 * more to the end of the journal, into segments the listing did not
 * name. Those copies were written before the segment went, so reading
 * the segments after @last that exist now finds them; a round that finds
 * another segment gone is followed by one more, a bounded number. */
#define REPLAY_ROUNDS 16
static int replay_newer(jstore *s, const tw_durable_config *cfg, uint32_t last,
                        jr_seg_file *f, bool *damaged)
{
    for (int round = 0; round < REPLAY_ROUNDS; round++) {
        uint32_t *nos = NULL;
        size_t cnt = 0, i = 0;
        int rc = tw__jr_list_segments(s->dirfd, &nos, &cnt);
        while (!rc && i < cnt && nos[i] <= last)
            i++;
        bool vanished = false;
        if (!rc && i < cnt) {
            rc = replay_list(s, cfg, nos, i, cnt, f, damaged, &vanished);
            last = nos[cnt - 1];
        }
        tw__free(nos);
        if (rc || !vanished)
            return rc;
    }
    tw__durable_errmsg(cfg, "%s: the journal changed too fast to be read",
                       cfg->dir);
    return TW_EAGAIN;
}

static int replay(jstore *s, const tw_durable_config *cfg, bool *damaged)
{
    uint32_t *nos = NULL;
    size_t cnt = 0;
    int rc = tw__jr_list_segments(s->dirfd, &nos, &cnt);
    if (rc)
        return rc;
#ifdef TW_TEST_HOOKS
    if (tw__journal_list_hook && s->readonly)
        tw__journal_list_hook(s->dirfd, 0);
#endif
    size_t i = 0;
    rc = first_segment(s, cfg, nos, cnt, &i);
#ifdef TW_TEST_HOOKS
    if (tw__journal_list_hook && s->readonly)
        tw__journal_list_hook(s->dirfd, 1);
#endif
    if (i < cnt && !rc) /* (nos is NULL when there is no segment) */
        presize_table(s, nos + i, cnt - i);
    jr_seg_file f = {.fd = -1};
    bool vanished = false;
    if (!rc)
        rc = replay_list(s, cfg, nos, i, cnt, &f, damaged, &vanished);
    if (!rc && s->readonly)
        rc = replay_newer(s, cfg, cnt ? nos[cnt - 1] : 0, &f, damaged);
    tw__free(f.buf);
    tw__free(nos);
    /* A format-1 journal is rewritten in format 2 as after a repair: a
     * new segment, everything older copied forward and deleted. */
    *damaged |= f.legacy;
    if (!rc)
        fit_table(s);
    return rc ? rc : replay_done(s, cfg, *damaged);
}

/* fsync the directory that holds @path (its first @len bytes name it). */
static void sync_parent(const char *path, size_t len)
{
    char parent[4096];
    while (len > 0 && path[len - 1] != '/')
        len--;
    if (len + 2 > sizeof parent)
        return;
    memcpy(parent, path, len);
    strcpy(parent + len, ".");
    int fd = open(parent, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
}

/* mkdir -p @cfg->dir; each directory made is made durable in its
 * parent. On failure the message names the directory that could not be
 * made and why. */
static int make_dirs(const tw_durable_config *cfg)
{
    char path[4096];
    size_t n = strlen(cfg->dir);
    if (n >= sizeof path) {
        tw__durable_errmsg(cfg, "dir: longer than %zu bytes", sizeof path - 1);
        return TW_EINVAL;
    }
    memcpy(path, cfg->dir, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (path[i] != '/' && path[i] != 0)
            continue;
        char c = path[i];
        path[i] = 0;
        if (mkdir(path, 0755) == 0) {
            sync_parent(path, i);
        } else if (errno != EEXIST) {
            int e = errno;
            if (e != ENOTDIR)
                return os_error(cfg, e, "cannot make the directory", path);
            /* Name the file in the way: the parent of what was made. */
            while (i > 0 && path[i - 1] == '/')
                i--;
            while (i > 0 && path[i - 1] != '/')
                i--;
            while (i > 1 && path[i - 1] == '/')
                i--;
            path[i] = 0;
            tw__durable_errmsg(
                cfg, "cannot make the directory %s: %s is not a directory",
                cfg->dir, path);
            return TW_ENOTDIR;
        }
        path[i] = c;
    }
    return 0;
}

/* Fill a new store's fields from @cfg and make its locks (nothing can
 * fail). */
static void init_store(jstore *s, const tw_durable_config *cfg,
                       uint64_t seg_bytes)
{
    s->base.ops = &journal_ops;
    s->dirfd = s->lockfd = -1;
    s->fire = cfg->fire;
    tw__retry_init(&s->retry, cfg);
    s->fire_arg = cfg->fire_arg;
    s->wall_ms = cfg->wall_ms ? cfg->wall_ms : tw__durable_real_wall_ms;
    s->mono_ns = cfg->mono_ns ? cfg->mono_ns : tw__durable_real_mono_ns;
    s->fake_mono = cfg->mono_ns != NULL;
    s->clock_arg = cfg->clock_arg;
    s->wake_at = INT64_MAX;
    pthread_mutex_init(&s->mu, NULL);
    pthread_mutex_init(&s->w.sync_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&s->round_cv, NULL);
    pthread_cond_init(&s->sync_cv, NULL);
    s->w.mu = &s->mu;
    tw__journal_combiner_init(s);
    s->w.sync_mode = cfg->sync;
    s->sync_every_ns =
        (uint64_t)(cfg->sync_interval_ms ? cfg->sync_interval_ms : 1000) *
        1000000u;
    s->w.segment_bytes = seg_bytes;
}

/* Make and open the directory and take its lock. */
static int lock_dir(jstore *s, const tw_durable_config *cfg)
{
    if (s->readonly) { /* the directory as it is: no lock, nothing made */
        s->dirfd = open(cfg->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        s->w.dirfd = s->dirfd;
        if (s->dirfd >= 0)
            return 0;
        if (errno != ENOENT)
            return os_error(cfg, errno, "cannot open the directory", cfg->dir);
        tw__durable_errmsg(cfg, "%s: no such directory", cfg->dir);
        return TW_ENOENT;
    }
    int rc = make_dirs(cfg);
    if (rc)
        return rc;
    s->dirfd = open(cfg->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (s->dirfd < 0)
        return os_error(cfg, errno, "cannot open the directory", cfg->dir);
    s->w.dirfd = s->dirfd;
    /* The lock is on the directory itself, which cannot be deleted or
     * replaced from under an open store as a file in it can. LOCK is
     * locked as well, for a process of an older version (which locks
     * only LOCK) on the same directory. */
    int rc2 = 0;
    if (flock(s->dirfd, LOCK_EX | LOCK_NB) != 0)
        rc2 = errno == EWOULDBLOCK ? TW_EBUSY : TW_EIO;
    if (!rc2) {
        s->lockfd =
            openat(s->dirfd, "LOCK", O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (s->lockfd < 0) {
            char lock[4096];
            snprintf(lock, sizeof lock, "%s/LOCK", cfg->dir);
            return os_error(cfg, errno, "cannot open or create", lock);
        }
        if (flock(s->lockfd, LOCK_EX | LOCK_NB) != 0)
            rc2 = errno == EWOULDBLOCK ? TW_EBUSY : TW_EIO;
    }
    if (rc2 == TW_EBUSY)
        tw__durable_errmsg(cfg, "%s: open in another process or handle",
                           cfg->dir);
    return rc2;
}

/* Replay the journal; after a repair, rewrite everything live so the
 * damage is gone: every segment older than the one replay() began is
 * copied forward. */
static int recover(jstore *s, const tw_durable_config *cfg)
{
    bool damaged = false;
    pthread_mutex_lock(&s->mu);
    int rc = replay(s, cfg, &damaged);
    if (rc == 0 && damaged && !s->readonly) {
        uint32_t fresh = s->w.segs[s->w.nseg - 1].no;
        while (rc == 0 && s->w.segs[0].no < fresh)
            rc = tw__journal_compact_oldest(s);
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int tw__durable_journal_open(tw_durable **out, const tw_durable_config *cfg)
{
    uint64_t seg_bytes =
        cfg->segment_bytes ? cfg->segment_bytes : UINT64_C(64) << 20;
    if (cfg->sync > TW_DURABLE_SYNC_INTERVAL) {
        tw__durable_errmsg(cfg, "sync: %u is not a TW_DURABLE_SYNC_* mode",
                           cfg->sync);
        return TW_EINVAL;
    }
    if (seg_bytes < 4096 || seg_bytes > (UINT64_C(1) << 31)) {
        tw__durable_errmsg(
            cfg, "segment_bytes: 4096 <= n <= 2147483648 (0: 64 MiB)");
        return TW_EINVAL;
    }
    if (cfg->executor_threads > 1024) {
        tw__durable_errmsg(cfg, "executor_threads: n <= 1024");
        return TW_EINVAL;
    }
    jstore *s = tw__calloc(1, sizeof *s);
    if (!s)
        return TW_ENOMEM;
    uint64_t t0 = tw__durable_real_mono_ns(NULL);
    init_store(s, cfg, seg_bytes);
    s->readonly = cfg->flags & TW_DURABLE_READONLY;
    s->base.readonly = s->readonly;
    s->nofire = s->readonly || (cfg->flags & TW_DURABLE_NOFIRE);
    int rc = TW_ENOMEM;
    if (tw__key_table_init(&s->keys, 1024, t0 ^ (uint64_t)(uintptr_t)s) == 0 &&
        tw_wheel_create(&s->wheel, NULL,
                        tw__journal_tick(tw__journal_wall(s))) == 0)
        rc = lock_dir(s, cfg);
    if (!rc)
        rc = recover(s, cfg);
    if (!rc) {
        s->recovered = s->keys.count - s->ndead;
        s->recovery_us = (tw__durable_real_mono_ns(NULL) - t0) / 1000;
        rc =
            s->nofire ? 0 : tw__journal_start_threads(s, cfg->executor_threads);
    }
    if (rc) {
        free_all(s);
        return rc;
    }
    *out = &s->base;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Close. */

static void free_all(jstore *s)
{
    tw__durable_exec_destroy(&s->exec);
    tw__key_table_free(&s->keys); /* and every entry */
    tw__free(s->due);
    tw__dx_free(s->dx);
    tw__dx_free(s->dxd);
    tw_wheel_destroy(s->wheel);
    tw__jr_close(&s->w);
    if (s->lockfd >= 0)
        close(s->lockfd); /* releases the flock */
    if (s->dirfd >= 0)
        close(s->dirfd);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->round_cv);
    pthread_cond_destroy(&s->sync_cv);
    pthread_mutex_destroy(&s->mu);
    pthread_mutex_destroy(&s->w.sync_mu);
    tw__free(s);
}

static int journal_close(tw_durable *d)
{
    jstore *s = (jstore *)d;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_broadcast(&s->cv);
    pthread_cond_broadcast(&s->round_cv);
    pthread_cond_broadcast(&s->sync_cv);
    pthread_mutex_unlock(&s->mu);
    if (!s->nofire)
        tw__journal_stop_threads(s);
    pthread_mutex_lock(&s->mu);
    int rc = 0;
    jr_seg *cur = s->w.nseg ? &s->w.segs[s->w.nseg - 1] : NULL;
    if (cur && s->w.synced < s->w.written && fdatasync(cur->fd) != 0)
        rc = TW_EIO;
    pthread_mutex_unlock(&s->mu);
    free_all(s);
    return rc;
}

static const struct tw_durable_ops journal_ops = {
    .schedule = tw__journal_schedule,
    .cancel = tw__journal_cancel,
    .close = journal_close,
    .stats = tw__journal_stats,
    .get = tw__journal_get,
    .list = tw__journal_list,
    .scan = tw__journal_scan,
    .schedule_many = tw__journal_schedule_many,
    .cancel_many = tw__journal_cancel_many,
    .dead_op = tw__journal_dead_op,
    .restore = tw__journal_restore,
    .list_dead = tw__journal_list_dead,
    .touch = tw__journal_touch,
    .schedule_if = tw__journal_schedule_if,
    .cancel_if = tw__journal_cancel_if,
};
