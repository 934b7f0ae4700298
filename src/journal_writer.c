/* SPDX-License-Identifier: MIT */
/*
 * src/journal_writer.c - the journal's writer: records staged and written
 * to the current segment, segments made, grown, adopted from the replay and
 * deleted, the MANIFEST written, and group commit (format in
 * journal_format.h; the reader is journal_reader.c). Every call but the
 * waits runs under the store's mutex.
 *
 * Group commit, pipelined: a caller appends its records with pwrite()
 * under the store's mutex, then waits until an fdatasync() that began after
 * its append has finished. If no sync is running it leads one: it waits
 * until as many callers wait as the previous sync released plus those
 * that were already waiting (gather_done(): at most a quarter of the last
 * sync's time, 1 ms at most; a lone caller never waits; the last of them
 * to arrive leads, so no sleeping thread need be woken to start a sync),
 * notes what is written by then (its target) and syncs without the
 * mutex. Callers that
 * append while that sync runs sleep on a futex word without the mutex;
 * when the sync ends its leader publishes the new durable LSN and wakes
 * them all with one FUTEX_WAKE. Those it covered return without taking
 * the mutex again; the first of the others leads the next sync, which
 * covers every record written during the previous one. So N threads that
 * each append one record and wait share each fdatasync, instead of the
 * first of them syncing alone and the rest sharing the next one; and a
 * sync never acknowledges a record written after it began. A failed
 * fdatasync is reported to every caller whose record it covered.
 *
 * Segments are allocated ahead of their appends (fallocate), so that an
 * append writes into allocated blocks and its fdatasync need not commit a
 * new file size: JR_ALLOC_MIN when made, then twice as much whenever an
 * append would pass the end, up to the segment size. So a small store's
 * segment stays small on disk and its open reads little, and a large one
 * changes its file size a few times per segment. An older segment is cut
 * to its last record and synced whole before the next one is made.
 */
#define _GNU_SOURCE

#include "journal.h"

#include "clock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "twheel/durable.h"

int (*tw__journal_fault)(int op);

uint64_t tw__jr_new_salt(void)
{
    uint64_t salt = 0;
    if (getrandom(&salt, sizeof salt, GRND_NONBLOCK) != (ssize_t)sizeof salt) {
        /* No entropy yet (early boot): still unknown to any payload's
         * author in practice, and distinct per segment. */
        static _Atomic uint64_t ctr;
        salt = tw__clock_ns(CLOCK_REALTIME) ^
               (tw__clock_ns(CLOCK_MONOTONIC) << 21) ^
               ((uint64_t)getpid() << 40) ^
               (atomic_fetch_add(&ctr, 1) * 0x9E3779B97F4A7C15u);
    }
    return salt;
}

/* ------------------------------------------------------------------------ */
/* Writer. */

static int fault(int op)
{
    int (*f)(int) = tw__journal_fault;
    return f ? f(op) : 0;
}

static int do_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    int e = fault('w');
    if (e)
        return -e;
    const unsigned char *p = buf;
    while (n) {
        ssize_t k = pwrite(fd, p, n, off);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return errno == ENOSPC || errno == EDQUOT ? TW_ENOSPC : TW_EIO;
        }
        p += k;
        n -= (size_t)k;
        off += k;
    }
    return 0;
}

static int sync_fd(int fd)
{
    int e = fault('s');
    if (e)
        return -e;
    if (fdatasync(fd) != 0)
        return errno == ENOSPC || errno == EDQUOT ? TW_ENOSPC : TW_EIO;
    return 0;
}

static int do_sync(jr_writer *w, int fd)
{
    w->syncs++;
    return sync_fd(fd);
}

/* Make @g's file at least @need bytes long, allocated: twice its size
 * (JR_ALLOC_MIN at first), or @need if more, but not past the segment
 * size unless one record needs it. Where fallocate() fails, appends grow
 * the file themselves. */
static void seg_grow(jr_writer *w, jr_seg *g, uint64_t need)
{
    if (need <= g->alloc || w->falloc_off)
        return;
    uint64_t want = g->alloc * 2 > JR_ALLOC_MIN ? g->alloc * 2 : JR_ALLOC_MIN;
    uint64_t cap = w->segment_bytes > need ? w->segment_bytes : need;
    if (want < need)
        want = need;
    if (want > cap)
        want = cap;
    if (fallocate(g->fd, 0, 0, (off_t)want) == 0)
        g->alloc = want;
    else if (errno == EOPNOTSUPP)
        w->falloc_off = true;
}

int tw__jr_errno(int e)
{
    switch (e) {
    case ENOSPC:
    case EDQUOT:
        return TW_ENOSPC;
    case EACCES:
    case EPERM:
        return TW_EACCES;
    case EROFS:
        return TW_EROFS;
    case ENOTDIR:
        return TW_ENOTDIR;
    case ENOMEM:
        return TW_ENOMEM;
    default:
        return TW_EIO;
    }
}

jr_seg *tw__jr_seg(jr_writer *w, uint32_t no)
{
    if (w->nseg == 0 || no < w->segs[0].no)
        return NULL;
    size_t i = no - w->segs[0].no;
    return i < w->nseg && w->segs[i].no == no ? &w->segs[i] : NULL;
}

/* Room in w->segs for one more segment. */
static int segs_reserve(jr_writer *w)
{
    if (w->nseg < w->cap)
        return 0;
    size_t nc = w->cap ? w->cap * 2 : 8;
    jr_seg *ns = tw__realloc(w->segs, nc * sizeof *ns);
    if (!ns)
        return TW_ENOMEM;
    w->segs = ns;
    w->cap = nc;
    return 0;
}

int tw__jr_adopt(jr_writer *w, jr_seg_file *f, size_t end, uint64_t sched)
{
    int rc = segs_reserve(w);
    if (rc)
        return rc;
    w->segs[w->nseg++] = (jr_seg){.no = f->no,
                                  .fd = f->fd,
                                  .size = end,
                                  .alloc = f->size,
                                  .records = sched,
                                  .seed = f->seed,
                                  .version = f->version};
    f->fd = -1;
    return 0;
}

int tw__jr_new_segment(jr_writer *w, uint32_t no)
{
    int rc = segs_reserve(w);
    if (rc)
        return rc;
    if (w->nseg) {
        /* The old segment ends at its last record (no preallocated zeros:
         * an older segment is read strictly) and is durable whole. */
        jr_seg *cur = &w->segs[w->nseg - 1];
        if (ftruncate(cur->fd, (off_t)cur->size) != 0)
            return TW_EIO;
        w->syncs++;
        int e = fault('s');
        if (e)
            return -e;
        if (fsync(cur->fd) != 0)
            return errno == ENOSPC ? TW_ENOSPC : TW_EIO;
        pthread_mutex_lock(&w->sync_mu);
        if (w->synced < JR_LSN(cur->no, cur->size))
            w->synced = JR_LSN(cur->no, cur->size);
        pthread_mutex_unlock(&w->sync_mu);
    }
    char name[JR_SEG_NAME_MAX];
    tw__jr_seg_name(name, no);
    int fd =
        openat(w->dirfd, name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return tw__jr_errno(errno);
    /* Allocate the segment's first blocks now: an fdatasync after a write
     * into allocated blocks need not also commit a new file size (measured
     * on ext4: 120 against 175 us). */
    jr_seg g = {.no = no, .fd = fd, .size = JR_SEG_HDR};
    seg_grow(w, &g, JR_SEG_HDR);
    unsigned char hdr[JR_SEG_HDR];
    uint64_t salt = tw__jr_new_salt();
    tw__jr_seg_hdr(hdr, no, salt);
    rc = do_pwrite(fd, hdr, sizeof hdr, 0);
    if (!rc)
        rc = do_sync(w, fd);
    if (!rc && fsync(w->dirfd) != 0)
        rc = TW_EIO;
    if (rc) {
        close(fd);
        unlinkat(w->dirfd, name, 0);
        return rc;
    }
    g.seed = tw__jr_seed(salt);
    g.version = JR_VERSION;
    w->segs[w->nseg++] = g;
    w->written = JR_LSN(no, JR_SEG_HDR);
    tw__jr_publish(w);
    return 0;
}

/* Say format 3 in segment @g's header, its salt kept (see journal.h): the
 * 32 bytes are rewritten in place, before the first DEAD record. */
static int seg_v3(jr_seg *g)
{
    unsigned char hdr[JR_SEG_HDR];
    uint32_t seed;
    if (pread(g->fd, hdr, sizeof hdr, 0) != (ssize_t)sizeof hdr ||
        !tw__jr_seg_hdr_ok(hdr, sizeof hdr, g->no, &seed) || seed != g->seed)
        return TW_EIO;
    tw__jr_seg_hdr_v3(hdr);
    int rc = do_pwrite(g->fd, hdr, sizeof hdr, 0);
    if (!rc)
        g->version = JR_VERSION_3;
    return rc;
}

int tw__jr_stage(jr_writer *w, int type, const void *key, size_t key_len,
                 int64_t due_ms, uint32_t attempt, const void *payload,
                 size_t payload_len, uint32_t *seg, uint32_t *off)
{
    size_t size = tw__jr_size(type, key_len, payload_len);
    jr_seg *cur = &w->segs[w->nseg - 1];
    if (w->staged && (cur->size + w->staged + size > w->segment_bytes ||
                      w->staged + size > JR_STAGE_MAX))
        return TW_EAGAIN;
    if (!w->staged && cur->size > JR_SEG_HDR &&
        cur->size + size > w->segment_bytes) {
        int rc = tw__jr_new_segment(w, cur->no + 1);
        if (rc)
            return rc;
        cur = &w->segs[w->nseg - 1];
    }
    if (type == JR_DEAD && cur->version != JR_VERSION_3) {
        int rc = seg_v3(cur);
        if (rc)
            return rc;
    }
    if (w->staged + size > w->buf_cap) {
        size_t nc = w->staged + size < 4096 ? 4096 : w->staged + size;
        unsigned char *nb = tw__realloc(w->buf, nc);
        if (!nb)
            return TW_ENOMEM;
        w->buf = nb;
        w->buf_cap = nc;
    }
    uint32_t synced =
        (uint32_t)(w->synced >> 32) == cur->no ? (uint32_t)w->synced : 0;
    tw__jr_encode(w->buf + w->staged, cur->seed, type, key, key_len, due_ms,
                  attempt, payload, payload_len, synced);
    *seg = cur->no;
    *off = (uint32_t)(cur->size + w->staged);
    w->staged += size;
    w->staged_sched += type == JR_SCHED || type == JR_DEAD;
    return 0;
}

int tw__jr_flush(jr_writer *w, uint64_t *lsn)
{
    jr_seg *cur = &w->segs[w->nseg - 1];
    size_t n = w->staged;
    uint64_t sched = w->staged_sched;
    w->staged = 0;
    w->staged_sched = 0;
    if (n) {
        seg_grow(w, cur, cur->size + n);
        int rc = do_pwrite(cur->fd, w->buf, n, (off_t)cur->size);
        if (rc) {
            /* Leave no partial record behind for the next append to
             * follow. */
            if (ftruncate(cur->fd, (off_t)cur->size) != 0)
                rc = TW_EIO;
            cur->alloc = cur->size;
            return rc;
        }
        cur->size += n;
        cur->records += sched;
        w->written = JR_LSN(cur->no, cur->size);
        tw__jr_publish(w);
    }
    *lsn = w->written;
    return 0;
}

int tw__jr_append(jr_writer *w, int type, const void *key, size_t key_len,
                  int64_t due_ms, uint32_t attempt, const void *payload,
                  size_t payload_len, uint32_t *seg, uint32_t *off,
                  uint64_t *lsn)
{
    int rc = tw__jr_stage(w, type, key, key_len, due_ms, attempt, payload,
                          payload_len, seg, off);
    return rc ? rc : tw__jr_flush(w, lsn);
}

void tw__jr_publish(jr_writer *w)
{
    pthread_mutex_lock(&w->sync_mu);
    w->pub_written = w->written;
    w->pub_fd = w->segs[w->nseg - 1].fd;
    /* Everything before the current segment is durable (each one is
     * synced whole before the next is made), and so is its header. */
    uint64_t floor = JR_LSN(w->segs[w->nseg - 1].no, JR_SEG_HDR);
    if (w->synced < floor)
        w->synced = floor;
    pthread_mutex_unlock(&w->sync_mu);
}

/* The longest a gather waits for callers before a shared sync, and the
 * share of the last sync's time it may take (1/GATHER_SHARE). */
#define GATHER_MAX_NS 1000000u
#define GATHER_SHARE 4u

/* Whether a caller that finds no shared sync running (sync_mu held) starts
 * one now: once as many calls wait as expected (the last of them leads,
 * on its own thread, so no thread has to be woken to start the sync), or
 * at the gather's deadline, at most gather_ns after the first of them
 * looked. The callers the last sync released append again within
 * microseconds when their threads have more to write, and one that misses
 * this sync waits for the whole next one: without the gather, the first
 * of them would sync its record alone and the rest would share the sync
 * after, each caller acknowledged every other sync. If fewer come, the
 * next gather expects only those. *@mine: the gather this caller began
 * (it alone sleeps until the deadline), else left alone. */
static bool gather_done(jr_writer *w, unsigned *mine)
{
    if (w->arrived >= w->expect || !w->gather_ns)
        return true;
    uint64_t now = tw__clock_ns(CLOCK_MONOTONIC);
    if (!w->gathering) {
        w->gathering = true;
        w->gather_until = now + w->gather_ns;
        *mine = ++w->gather_gen ? w->gather_gen : ++w->gather_gen;
        return false;
    }
    if (now < w->gather_until)
        return false;
    w->expect = w->arrived;
    return true;
}

/* Whether the gather @mine (0: none) is still open (sync_mu held). */
static bool gather_open(const jr_writer *w, unsigned mine)
{
    return mine && w->gathering && w->gather_gen == mine;
}

/* A caller whose outcome is decided while the gather it began is open
 * (a segment change made its record durable) ends that gather, so that
 * the others, who sleep without a deadline, look again (one of them
 * begins the next). */
static void gather_leave(jr_writer *w, unsigned mine, bool locked)
{
    if (!mine)
        return;
    if (!locked)
        pthread_mutex_lock(&w->sync_mu);
    if (gather_open(w, mine)) {
        w->gathering = false;
        tw__futex_bump(&w->sync_seq);
    }
    if (!locked)
        pthread_mutex_unlock(&w->sync_mu);
}

/* After a shared sync of @covered calls that took @ns (sync_mu held):
 * what the next gather waits for. */
static void gather_next(jr_writer *w, unsigned covered, uint64_t ns)
{
    w->expect = covered + w->arrived;
    ns /= GATHER_SHARE;
    w->gather_ns = ns < GATHER_MAX_NS ? ns : GATHER_MAX_NS;
}

/* Sync everything published so far (sync_mu held; released during the
 * fdatasync), publish the outcome and wake every waiter with one call,
 * after letting go of sync_mu (so that the woken do not queue for it
 * behind this thread): it returns without the lock. */
static void lead_sync(jr_writer *w)
{
    bool group = w->sync_mode != TW_DURABLE_SYNC_EACH;
    w->syncing = group;
    w->gathering = false;
    uint64_t target = w->pub_written;
    int fd = w->pub_fd;
    unsigned covered = w->arrived;
    w->arrived = 0;
    w->sync_target = target;
    w->inflight++;
    w->syncs++;
    pthread_mutex_unlock(&w->sync_mu);
    uint64_t t0 = tw__clock_ns(CLOCK_MONOTONIC);
    int rc = sync_fd(fd);
    uint64_t t1 = tw__clock_ns(CLOCK_MONOTONIC);
    pthread_mutex_lock(&w->sync_mu);
    w->inflight--;
    if (group) {
        w->syncing = false;
        gather_next(w, covered, t1 - t0);
    }
    if (rc) {
        w->fail_err = rc;
        if (target > w->fail_max)
            w->fail_max = target;
    } else if (target > w->synced) {
        w->synced = target;
    }
    pthread_mutex_unlock(&w->sync_mu);
    tw__futex_bump(&w->sync_seq);
}

#define UNKNOWN 1

/* 0 once @lsn is durable, the error of a failed sync that covered it, or
 * UNKNOWN while neither is known. No lock needed. */
static int outcome(jr_writer *w, uint64_t lsn)
{
    if (w->fail_max >= lsn)
        return w->fail_err;
    return w->synced >= lsn ? 0 : UNKNOWN;
}

/* A caller waiting for @lsn for @calls calls counts them once among
 * those the next sync covers (sync_mu held): not if the running one
 * covers them. */
static void arrive(jr_writer *w, uint64_t lsn, unsigned calls)
{
    if (!(w->syncing && lsn <= w->sync_target))
        w->arrived += calls;
}

/* Wait until @lsn is durable, leading syncs as needed (no lock held), on
 * behalf of @calls calls. */
static int wait_durable(jr_writer *w, uint64_t lsn, unsigned calls)
{
    int rc = outcome(w, lsn);
    if (rc != UNKNOWN)
        return rc; /* a combiner waited for it: no lock to take */
    bool counted = false;
    unsigned mine = 0;
    pthread_mutex_lock(&w->sync_mu);
    while ((rc = outcome(w, lsn)) == UNKNOWN) {
        if (!counted) {
            arrive(w, lsn, calls);
            counted = true;
        }
        if (w->sync_mode == TW_DURABLE_SYNC_EACH ||
            (!w->syncing && gather_done(w, &mine))) {
            /* Lead: whatever is written by now shares this sync (with
             * SYNC_EACH every caller syncs for itself). */
            lead_sync(w);
            if ((rc = outcome(w, lsn)) != UNKNOWN)
                return rc; /* a leader's gather has ended */
            pthread_mutex_lock(&w->sync_mu);
            continue;
        }
        /* Follow: a sync runs that may not cover @lsn, or a gather goes
         * on (the caller that began it wakes at its deadline to end it);
         * sleep without any lock until a sync ends, then look again. */
        unsigned seq = atomic_load(&w->sync_seq.word);
        bool timed = gather_open(w, mine);
        uint64_t until = w->gather_until;
        pthread_mutex_unlock(&w->sync_mu);
        if (timed) {
            tw__futex_wait_until(&w->sync_seq, seq, until);
        } else {
            do
                tw__futex_wait(&w->sync_seq, seq);
            while (atomic_load(&w->sync_seq.word) == seq);
        }
        if ((rc = outcome(w, lsn)) != UNKNOWN) {
            gather_leave(w, mine, false);
            return rc; /* the common case: no lock to take again */
        }
        pthread_mutex_lock(&w->sync_mu);
    }
    gather_leave(w, mine, true);
    pthread_mutex_unlock(&w->sync_mu);
    return rc;
}

static bool acks_unsynced(const jr_writer *w)
{
    return w->sync_mode == TW_DURABLE_SYNC_NONE ||
           w->sync_mode == TW_DURABLE_SYNC_INTERVAL;
}

int tw__jr_wait_calls(jr_writer *w, uint64_t lsn, unsigned calls)
{
    return acks_unsynced(w) ? 0 : wait_durable(w, lsn, calls);
}

int tw__jr_wait_nolock(jr_writer *w, uint64_t lsn)
{
    return tw__jr_wait_calls(w, lsn, 1);
}

int tw__jr_wait_unlock(jr_writer *w, uint64_t lsn)
{
    pthread_mutex_unlock(w->mu);
    return tw__jr_wait_nolock(w, lsn);
}

/* wait_durable() for a caller that holds *mu, which it holds again on
 * return. */
static int wait_durable_relock(jr_writer *w, uint64_t lsn)
{
    if (w->synced >= lsn)
        return 0;
    pthread_mutex_unlock(w->mu);
    int rc = wait_durable(w, lsn, 1);
    pthread_mutex_lock(w->mu);
    return rc;
}

int tw__jr_wait(jr_writer *w, uint64_t lsn)
{
    return acks_unsynced(w) ? 0 : wait_durable_relock(w, lsn);
}

int tw__jr_sync_all(jr_writer *w)
{
    return wait_durable_relock(w, w->written);
}

bool tw__jr_wb_wanted(const jr_writer *w)
{
    if (!acks_unsynced(w))
        return false;
    uint64_t from = atomic_load(&w->wb_lsn);
    return w->written >> 32 != from >> 32 || w->written - from >= JR_WB_CHUNK;
}

void tw__jr_writeback(jr_writer *w)
{
    pthread_mutex_lock(&w->sync_mu);
    uint64_t to = w->pub_written, from = atomic_load(&w->wb_lsn);
    int fd = w->pub_fd;
    if (from >> 32 != to >> 32)
        from = JR_LSN(to >> 32, JR_SEG_HDR); /* a new segment */
    if (to <= from) {
        atomic_store(&w->wb_lsn, from);
        pthread_mutex_unlock(&w->sync_mu);
        return;
    }
    atomic_store(&w->wb_lsn, to);
    w->inflight++; /* the fd stays open meanwhile */
    pthread_mutex_unlock(&w->sync_mu);
    (void)sync_file_range(fd, (off_t)(from & UINT32_MAX), (off_t)(to - from),
                          SYNC_FILE_RANGE_WRITE);
    pthread_mutex_lock(&w->sync_mu);
    w->inflight--;
    pthread_mutex_unlock(&w->sync_mu);
}

int tw__jr_manifest_write(int dirfd, uint32_t oldest)
{
    unsigned char b[JR_MANIFEST_SIZE];
    memcpy(b, JR_MANIFEST_MAGIC, 8);
    tw__jr_put32(b + JR_MF_OLDEST, oldest);
    tw__jr_put32(b + JR_MF_CRC, tw__crc32c(0, b, JR_MF_CRC));
    int fd = openat(dirfd, "MANIFEST.tmp",
                    O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return errno == ENOSPC ? TW_ENOSPC : TW_EIO;
    int rc = do_pwrite(fd, b, sizeof b, 0);
    if (!rc && fsync(fd) != 0)
        rc = TW_EIO;
    close(fd);
    if (!rc && renameat(dirfd, "MANIFEST.tmp", dirfd, "MANIFEST") != 0)
        rc = TW_EIO;
    if (!rc && fsync(dirfd) != 0)
        rc = TW_EIO;
    if (rc)
        unlinkat(dirfd, "MANIFEST.tmp", 0);
    return rc;
}

int tw__jr_drop_oldest(jr_writer *w)
{
    if (w->nseg < 2)
        return TW_EINVAL;
    if (atomic_load(&w->inflight))
        return TW_EBUSY; /* a sync may still use an old fd */
    jr_seg s = w->segs[0];
    char name[JR_SEG_NAME_MAX];
    tw__jr_seg_name(name, s.no);
    /* The manifest first: a crash between the two leaves a segment older
     * than it says, which the next open deletes; the other order would
     * leave a segment missing. */
    int rc = tw__jr_manifest_write(w->dirfd, w->segs[1].no);
    if (rc)
        return rc;
    if (unlinkat(w->dirfd, name, 0) != 0 || fsync(w->dirfd) != 0)
        return TW_EIO;
    close(s.fd);
    memmove(&w->segs[0], &w->segs[1], (w->nseg - 1) * sizeof s);
    w->nseg--;
    return 0;
}

void tw__jr_close(jr_writer *w)
{
    for (size_t i = 0; i < w->nseg; i++)
        close(w->segs[i].fd);
    tw__free(w->segs);
    tw__free(w->buf);
    w->segs = NULL;
    w->buf = NULL;
    w->nseg = w->cap = 0;
}
