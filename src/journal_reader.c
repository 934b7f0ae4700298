/* SPDX-License-Identifier: MIT */
/*
 * src/journal_reader.c - the journal's reader: the segment files of a
 * directory listed, read whole and scanned, torn tails told from damage and
 * cleared, damage skipped in repair mode, the MANIFEST read, and one record
 * read back from a live segment (format in journal_format.h; the writer is
 * journal_writer.c). The open's replay (durable_journal_open.c) drives it
 * segment by segment; delivery, listing and scanning read records back
 * through it.
 *
 * Torn tails: every record carries "synced", the offset up to which its
 * segment was durable when it was written. A record that fails its checksum
 * in the newest segment is a torn tail (truncated) unless some later valid
 * record says the bad bytes had already been synced: then it is damage in
 * the middle (TW_EIO), like any bad record in an older segment (a segment
 * is synced whole before the next one is made).
 */
#define _GNU_SOURCE

#include "journal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "twheel/durable.h"

/* The first offset >= @from holding a valid record, or @n. A record's
 * length field (bytes 4..7) is never zero, so runs of zero bytes (the
 * preallocated end of a segment) are skipped a word at a time. */
static size_t next_valid(const unsigned char *p, size_t n, uint32_t seed,
                         size_t from, jr_rec *r)
{
    size_t o = from;
    while (o + JR_REC_HDR <= n) {
        if (tw__jr_get32(p + o + JR_RH_LEN) == 0) {
            size_t z = o + 8;
            while (z + 8 <= n) {
                uint64_t v;
                memcpy(&v, p + z, 8);
                if (v)
                    break;
                z += 8;
            }
            while (z < n && p[z] == 0)
                z++;
            if (z >= n)
                return n;
            /* The first non-zero byte at z can be part of a length field
             * of a record starting at z - 7 at the earliest. */
            size_t cand = z >= 7 ? z - 7 : 0;
            o = cand > o ? cand : o + 1;
            continue;
        }
        if (tw__jr_decode(p + o, n - o, (uint32_t)o, seed, r))
            return o;
        o++;
    }
    return n;
}

int tw__jr_scan(const unsigned char *p, size_t n, uint32_t seed, bool last,
                bool repair, int (*fn)(void *arg, const jr_rec *r), void *arg,
                size_t *end)
{
    size_t o = JR_SEG_HDR;
    int damaged = 0;
    jr_rec r;
    while (o < n) {
        size_t sz = tw__jr_decode(p + o, n - o, (uint32_t)o, seed, &r);
        if (sz) {
            int rc = fn ? fn(arg, &r) : 0;
            if (rc)
                return rc;
            o += sz;
            continue;
        }
        /* A bad record at o. In the newest segment it is a torn tail
         * unless a later good record was written after o was synced. */
        size_t bad = o;
        size_t nx = next_valid(p, n, seed, o + 1, &r);
        if (last) {
            bool synced_past = false;
            jr_rec q;
            for (size_t k = nx; k < n;) {
                size_t qs = tw__jr_decode(p + k, n - k, (uint32_t)k, seed, &q);
                if (!qs) {
                    k = next_valid(p, n, seed, k + 1, &q);
                    continue;
                }
                if (q.synced > bad) {
                    synced_past = true;
                    break;
                }
                k += qs;
            }
            if (!synced_past) {
                *end = bad;
                return damaged;
            }
        }
        if (!repair) {
            *end = bad;
            return TW_EIO;
        }
        damaged = 1;
        o = nx;
    }
    *end = n;
    return damaged;
}

int tw__jr_manifest_read(int dirfd, uint32_t *oldest)
{
    int fd = openat(dirfd, "MANIFEST", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? TW_ENOENT : TW_EIO;
    unsigned char b[JR_MANIFEST_SIZE + 1];
    ssize_t got = pread(fd, b, sizeof b, 0);
    close(fd);
    if (got != (ssize_t)JR_MANIFEST_SIZE ||
        memcmp(b, JR_MANIFEST_MAGIC, 8) != 0 ||
        tw__jr_get32(b + JR_MF_CRC) != tw__crc32c(0, b, JR_MF_CRC) ||
        tw__jr_get32(b + JR_MF_OLDEST) == 0)
        return TW_EIO;
    *oldest = tw__jr_get32(b + JR_MF_OLDEST);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* The directory's segments. */

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

int tw__jr_list_segments(int dirfd, uint32_t **out, size_t *n)
{
    int fd = dup(dirfd);
    if (fd < 0)
        return TW_EIO;
    DIR *dir = fdopendir(fd);
    if (!dir) {
        close(fd);
        return TW_EIO;
    }
    rewinddir(dir); /* a dup shares its offset with @dirfd: listed before? */
    uint32_t *v = NULL;
    size_t cnt = 0, cap = 0;
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL) {
        uint32_t no;
        if (!tw__jr_seg_parse(e->d_name, &no))
            continue;
        if (cnt == cap) {
            cap = cap ? cap * 2 : 16;
            uint32_t *nv = tw__realloc(v, cap * sizeof *nv);
            if (!nv) {
                rc = TW_ENOMEM;
                break;
            }
            v = nv;
        }
        v[cnt++] = no;
    }
    closedir(dir);
    if (rc) {
        tw__free(v);
        return rc;
    }
    if (cnt)
        qsort(v, cnt, sizeof *v, cmp_u32);
    *out = v;
    *n = cnt;
    return 0;
}

unsigned tw__jr_seg_version(int dirfd, uint32_t no)
{
    char name[JR_SEG_NAME_MAX];
    unsigned char hdr[JR_SEG_HDR];
    uint32_t seed;
    tw__jr_seg_name(name, no);
    int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t got = pread(fd, hdr, sizeof hdr, 0);
    close(fd);
    return got == (ssize_t)sizeof hdr
               ? tw__jr_seg_hdr_ok(hdr, sizeof hdr, no, &seed)
               : 0;
}

int tw__jr_read_segment(int dirfd, bool readonly, jr_seg_file *f)
{
    tw__jr_seg_name(f->name, f->no);
    f->fd = openat(dirfd, f->name, (readonly ? O_RDONLY : O_RDWR) | O_CLOEXEC);
    if (f->fd < 0 && errno == ENOENT)
        return TW_ENOENT;
    struct stat st;
    if (f->fd < 0 || fstat(f->fd, &st) != 0)
        return TW_EIO;
    f->size = (size_t)st.st_size;
    if (f->size > f->buf_cap) {
        unsigned char *nb = tw__realloc(f->buf, f->size);
        if (!nb)
            return TW_ENOMEM;
        f->buf = nb;
        f->buf_cap = f->size;
    }
    if (pread(f->fd, f->buf, f->size, 0) != (ssize_t)f->size)
        return TW_EIO;
    return 0;
}

bool tw__jr_all_zero(const unsigned char *p, size_t from, size_t to)
{
    for (size_t k = from; k < to; k++)
        if (p[k])
            return false;
    return true;
}

int tw__jr_clear_tail(jr_seg_file *f, size_t end)
{
    if (end >= f->size || tw__jr_all_zero(f->buf, end, f->size))
        return 0;
    if (ftruncate(f->fd, (off_t)end) != 0 || fdatasync(f->fd) != 0)
        return TW_EIO;
    f->size = end; /* appends allocate again as they need */
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Records read back from the live segments. */

size_t tw__jr_rec_size_at(const jr_seg *g, uint32_t off)
{
    unsigned char hdr[JR_REC_HDR];
    if (pread(g->fd, hdr, sizeof hdr, off) != (ssize_t)sizeof hdr)
        return 0;
    return tw__jr_hdr_size(hdr);
}

bool tw__jr_read_rec(const jr_seg *g, uint32_t off, unsigned char *buf,
                     size_t size, jr_rec *out)
{
    return pread(g->fd, buf, size, off) == (ssize_t)size &&
           tw__jr_decode(buf, size, off, g->seed, out) == size;
}

bool tw__jr_due_at(const jr_seg *g, uint32_t off, int64_t *due)
{
    unsigned char b[JR_REC_HDR + JR_B_ATTEMPT];
    if (pread(g->fd, b, sizeof b, off) != (ssize_t)sizeof b)
        return false;
    *due = (int64_t)tw__jr_get64(b + JR_REC_HDR + JR_B_DUE);
    return true;
}

int tw__jr_read_blocks(int fd, uint32_t seed, uint64_t pos, uint64_t end,
                       unsigned char *buf, size_t cap,
                       void (*rec)(void *arg, const jr_rec *r),
                       int (*block_end)(void *arg), void *arg)
{
    while (pos < end) {
        size_t want = end - pos < cap ? (size_t)(end - pos) : cap;
        if (pread(fd, buf, want, (off_t)pos) != (ssize_t)want)
            return TW_EIO;
        size_t off = 0;
        while (off + JR_REC_HDR <= want) {
            const unsigned char *h = buf + off;
            size_t size = tw__jr_hdr_size(h);
            if (!size)
                return TW_EIO;
            if (off + size > want)
                break; /* the next block begins with it */
            jr_rec r;
            if (tw__jr_decode(h, size, (uint32_t)(pos + off), seed, &r) != size)
                return TW_EIO;
            rec(arg, &r);
            off += size;
        }
        int stop = block_end(arg); /* before @buf is read into again */
        if (off == 0)
            return TW_EIO; /* a record cut short by the end */
        pos += off;
        if (stop)
            break;
    }
    return 0;
}
