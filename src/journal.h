/* SPDX-License-Identifier: MIT */
/*
 * src/journal.h - the durable store's journal: segment files of
 * checksummed records in one directory, appended under the store's mutex
 * and made durable by group commit.
 *
 * The byte layout is in journal_format.h (codec: journal_format.c), the
 * writer in journal_writer.c, the reader in journal_reader.c.
 */
#ifndef TWHEEL_JOURNAL_H
#define TWHEEL_JOURNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "futex.h" /* jr_futex */
#include "journal_format.h"

/* A fresh random salt. */
uint64_t tw__jr_new_salt(void);
/*
 * Scan one segment's records from JR_SEG_HDR (@seed: its checksum seed,
 * from tw__jr_seg_hdr_ok()). @last: the newest segment
 * (a bad record there may be a torn tail). @repair: skip damage.
 * Calls @fn for each good record. Returns:
 *   0 and *@end = the offset after the last good record (where a torn tail
 *     begins in the last segment, else @n);
 *   1 if damage was skipped (repair mode);
 *   TW_EIO with *@end = the offset of the damage.
 * @fn returning non-zero stops the scan with that value.
 */
int tw__jr_scan(const unsigned char *p, size_t n, uint32_t seed, bool last,
                bool repair, int (*fn)(void *arg, const jr_rec *r), void *arg,
                size_t *end);

/* MANIFEST: read the number of the oldest segment the store must have
 * (0; TW_ENOENT if there is no manifest: the oldest is 1; TW_EIO if it is
 * damaged). */
int tw__jr_manifest_read(int dirfd, uint32_t *oldest);
/* The segment numbers of the files in directory @dirfd, sorted, into a
 * new array *@out (tw__free() it; NULL when there is none). */
int tw__jr_list_segments(int dirfd, uint32_t **out, size_t *n);
/* The format version of segment @no's header, or 0. */
unsigned tw__jr_seg_version(int dirfd, uint32_t no);

/* A segment file read whole, as the open's replay reads it. */
typedef struct jr_seg_file {
    uint32_t no;
    uint32_t seed;    /* its records' checksum seed */
    bool last;        /* the newest segment */
    bool legacy;      /* some segment read so far is in format 1 */
    unsigned version; /* the format of the segment read last */
    char name[JR_SEG_NAME_MAX];
    int fd;
    size_t size;
    unsigned char *buf; /* reused from segment to segment */
    size_t buf_cap;
} jr_seg_file;

/* Open segment @f->no (read-only if @readonly) and read it into @f->buf:
 * 0, TW_ENOENT (no such file), TW_EIO, TW_ENOMEM. */
int tw__jr_read_segment(int dirfd, bool readonly, jr_seg_file *f);
/* Whether bytes [@from, @to) of @p are all zero. */
bool tw__jr_all_zero(const unsigned char *p, size_t from, size_t to);
/* Zeros after the last record (at @end) are the allocated rest of the
 * segment; anything else is a torn tail, cleared (cut and synced) so that
 * no stale record can ever follow the next append. */
int tw__jr_clear_tail(jr_seg_file *f, size_t end);

/* One segment file. */
typedef struct jr_seg {
    uint32_t no;
    int fd;
    uint64_t size;    /* bytes written (header included) */
    uint64_t records; /* JR_SCHED and JR_DEAD records in it */
    uint64_t live;    /* of those, the current version of a pending key */
    uint32_t seed;    /* its records' checksum seed (from its salt) */
    uint64_t alloc;   /* the file's size: allocated ahead of @size */
    uint32_t version; /* its header's format version */
} jr_seg;

/* A new segment's first allocation; it doubles as the segment fills. */
#define JR_ALLOC_MIN (64u << 10)

/* LSN: segment number << 32 | offset. */
#define JR_LSN(seg, off) (((uint64_t)(seg) << 32) | (uint64_t)(off))

/*
 * The writer. Every function below is called with *@mu held (the store's
 * mutex, which also orders the in-memory changes like the records).
 */
typedef struct jr_writer {
    int dirfd;
    pthread_mutex_t *mu;
    jr_seg *segs; /* oldest first; segs[nseg - 1] is appended to */
    size_t nseg, cap;
    uint64_t written;   /* LSN */
    uint32_t sync_mode; /* TW_DURABLE_SYNC_* */
    uint64_t segment_bytes;
    bool falloc_off; /* fallocate() is not supported here */
    /*
     * Group commit. sync_mu guards the fields below (leaders and waiters
     * take it without *mu, so a waiter never queues behind appenders for
     * the store's mutex; *mu holders take it inside *mu). pub_written and
     * pub_fd: what a sync started now would cover (set by each append).
     */
    pthread_mutex_t sync_mu;
    uint64_t pub_written;
    int pub_fd;
    bool syncing; /* a shared (not SYNC_EACH) fdatasync is running */
    /* LSN up to which the journal is durable; readable without a lock. */
    _Atomic uint64_t synced;
    /* Highest target of a failed fdatasync and its error: a caller whose
     * record is at or below it is told (LSNs only grow, so such a sync
     * began after that record was written). */
    _Atomic uint64_t fail_max;
    atomic_int fail_err;
    /* Futex word: bumped whenever a sync ends, well or not; waiters sleep
     * on it without any lock. */
    jr_futex sync_seq;
    /* Gathering (SYNC_GROUP): calls whose records the next
     * sync would cover, counted as they begin to wait (arrived; a combiner
     * waits for all the calls it applied), and how many the next sync
     * waits for before it starts (expect: those the last sync released
     * plus those already waiting), at most gather_ns from the first
     * caller's look (until gather_until, CLOCK_MONOTONIC ns; gather_gen
     * numbers the gathers). sync_target: what the running sync covers. */
    unsigned arrived, expect, gather_gen;
    bool gathering;
    uint64_t sync_target, gather_ns, gather_until;
    atomic_int inflight; /* fdatasync calls running without *mu */
    _Atomic uint64_t syncs;
    unsigned char *buf; /* records encoded and not yet written */
    size_t buf_cap;
    size_t staged;         /* bytes of them at the start of buf */
    uint64_t staged_sched; /* JR_SCHED records among them */
    /* SYNC_NONE and SYNC_INTERVAL: LSN up to which the kernel has been
     * asked to start writing back (tw__jr_writeback). */
    _Atomic uint64_t wb_lsn;
} jr_writer;

/* Bytes written after which tw__jr_wb_wanted() says yes. */
#define JR_WB_CHUNK (4u << 20)

/* With SYNC_NONE or SYNC_INTERVAL: true once JR_WB_CHUNK bytes or more of
 * the current segment were written since the last tw__jr_writeback(). */
bool tw__jr_wb_wanted(const jr_writer *w);

/* Ask the kernel to start writing back what was written since the last
 * call (sync_file_range(SYNC_FILE_RANGE_WRITE): it starts the I/O and does
 * not wait for it, though submitting it can take milliseconds; a failure
 * is only a lost hint). Call without *mu: it takes sync_mu. Its point: the
 * fsync that closes a full segment, under *mu, then waits for the tail
 * written since, not for a whole segment of dirty pages. */
void tw__jr_writeback(jr_writer *w);

/* Most bytes staged before tw__jr_stage() asks for a flush (one record may
 * be larger on its own). */
#define JR_STAGE_MAX (1u << 20)

/* Make segment @no, the new current one: the previous one is made durable
 * first, the new one's header and the directory entry too. */
int tw__jr_new_segment(jr_writer *w, uint32_t no);
/*
 * Batched appends: tw__jr_stage() encodes a record after those staged
 * before it (@seg, @off: where it will begin), tw__jr_flush() writes all
 * staged records with one pwrite() and sets *@lsn to their end. Stage
 * returns TW_EAGAIN (nothing staged) when the record must wait for a flush:
 * the current segment cannot take it after the staged ones, or they hold
 * JR_STAGE_MAX bytes. With nothing staged it makes a new segment first if
 * the record does not fit. A failed flush writes nothing; either way
 * nothing stays staged. Records are staged and flushed without unlocking
 * *mu in between.
 */
int tw__jr_stage(jr_writer *w, int type, const void *key, size_t key_len,
                 int64_t due_ms, uint32_t attempt, const void *payload,
                 size_t payload_len, uint32_t *seg, uint32_t *off);
int tw__jr_flush(jr_writer *w, uint64_t *lsn);
/* Stage one record and flush it (nothing may be staged before); on success
 * *@lsn is its end and @seg, @off say where it begins. On failure nothing
 * was appended. */
int tw__jr_append(jr_writer *w, int type, const void *key, size_t key_len,
                  int64_t due_ms, uint32_t attempt, const void *payload,
                  size_t payload_len, uint32_t *seg, uint32_t *off,
                  uint64_t *lsn);
/* Wait until everything up to @lsn is durable (per sync_mode; SYNC_NONE
 * returns at once). Called with *mu held; returns with it released. */
int tw__jr_wait_unlock(jr_writer *w, uint64_t lsn);
/* tw__jr_wait_unlock() for a caller that does not hold *mu. */
int tw__jr_wait_nolock(jr_writer *w, uint64_t lsn);
/* tw__jr_wait_nolock() on behalf of @calls callers whose records end at
 * or before @lsn (counted as that many in the gather of SYNC_GROUP). */
int tw__jr_wait_calls(jr_writer *w, uint64_t lsn, unsigned calls);
/* tw__jr_wait_unlock() that takes *mu again before it returns. SYNC_NONE
 * and SYNC_INTERVAL return at once. */
int tw__jr_wait(jr_writer *w, uint64_t lsn);
/* Make everything written so far durable, whatever the sync_mode (*mu
 * held; released while it waits). */
int tw__jr_sync_all(jr_writer *w);
/* MANIFEST: write the number of the oldest segment durably (tmp file,
 * rename, directory fsync). */
int tw__jr_manifest_write(int dirfd, uint32_t oldest);
/* Delete the oldest segment (it must not be the current one), after
 * recording the next one as the oldest in the manifest. */
int tw__jr_drop_oldest(jr_writer *w);
/* The segment numbered @no, or NULL. */
jr_seg *tw__jr_seg(jr_writer *w, uint32_t no);
/* Make the writer's position (written, the current segment) what the next
 * sync covers; called after the position changes outside tw__jr_flush()
 * and tw__jr_new_segment(). */
void tw__jr_publish(jr_writer *w);
/* The TW_E* code of errno @e from a file system call: TW_ENOSPC,
 * TW_EACCES, TW_EROFS, TW_ENOTDIR, TW_ENOMEM, else TW_EIO. */
int tw__jr_errno(int e);
/* Hand segment @f, replayed, @end bytes long with @sched SCHED and DEAD
 * records, to the writer (which then owns its fd; @f->fd becomes -1). */
int tw__jr_adopt(jr_writer *w, jr_seg_file *f, size_t end, uint64_t sched);
/* Close every fd, free memory. */
void tw__jr_close(jr_writer *w);
/*
 * Records read back from a live segment @g (a jr_writer's), at @off:
 * the size its header claims (0 if it cannot be read or is larger than any
 * record); the record itself into @buf (@size bytes), decoded into *@out
 * (false unless it reads whole and decodes to @size bytes); the due time
 * field of a SCHED or DEAD record (false if it cannot be read).
 */
size_t tw__jr_rec_size_at(const jr_seg *g, uint32_t off);
bool tw__jr_read_rec(const jr_seg *g, uint32_t off, unsigned char *buf,
                     size_t size, jr_rec *out);
bool tw__jr_due_at(const jr_seg *g, uint32_t off, int64_t *due);
/*
 * Read bytes [@pos, @end) of the segment open as @fd (checksum seed @seed)
 * block by block into @buf (@cap bytes, room for the largest record),
 * calling @rec for each record and @block_end after each block, before
 * @buf is read into again; @block_end returning non-zero ends the read
 * after that block. Returns 0, or TW_EIO at a record that does not decode
 * or is cut short by @end.
 */
int tw__jr_read_blocks(int fd, uint32_t seed, uint64_t pos, uint64_t end,
                       unsigned char *buf, size_t cap,
                       void (*rec)(void *arg, const jr_rec *r),
                       int (*block_end)(void *arg), void *arg);

/* Test hook: called before each write (op 'w') and fdatasync (op 's') of
 * the journal; a non-zero return is the errno the operation then fails
 * with. NULL in production. */
extern int (*tw__journal_fault)(int op);

#endif
