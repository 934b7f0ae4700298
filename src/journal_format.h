/* SPDX-License-Identifier: MIT */
/*
 * src/journal_format.h - the journal's byte layout, in one place: segment
 * and record headers, record types, sizes, the little-endian field
 * helpers, record encode/decode and segment file names. The writer
 * (journal_writer.c) and the reader (journal_reader.c) both build on it;
 * nothing here does I/O.
 *
 * Segment file "NNNNNNNNNN.twj" (its number in decimal), format 2 or 3
 * (below):
 *
 *   header (32 bytes): "TWJOURN1" | u32 version (2, 3) | u32 segment number |
 *                      u64 salt | u32 0 | u32 crc32c of bytes 0..27
 *   records, back to back, none split across segments:
 *
 *   0   u32 crc32c of the segment's salt (8 bytes) then bytes 4 .. 16 + len
 *   4   u32 len        bytes after this 16-byte header
 *   8   u8  type       JR_SCHED, JR_CANCEL, JR_DONE, JR_FIRE, JR_DEAD
 *   9   u8  0
 *   10  u16 key_len    1 .. TW_DURABLE_KEY_MAX
 *   12  u32 synced     this segment was durable up to this offset when the
 *                      record was written (tells a torn tail from damage)
 *   16  SCHED, DEAD: i64 due_ms | u32 attempt | u32 payload_len | key |
 *       payload
 *       others: key
 *
 * All integers little-endian. Nothing here knows about keys' meaning.
 *
 * Why a salt. A payload is user data of up to 1 MiB and may hold anything,
 * the bytes of a journal record included (copied from another journal, or
 * written on purpose). The reader looks for valid records past a bad one
 * (to tell a torn tail from damage, and to skip damage in repair mode), so
 * with a plain checksum such bytes inside a torn record's payload passed
 * for a record. Every segment gets its own random 64-bit salt, from
 * getrandom(), when it is made, and every record's checksum covers it: a
 * record image is valid in one segment only, and one made without reading
 * that segment's header matches with probability 2^-32 (the width of the
 * checksum). Considered and not taken: block framing as LevelDB's log does
 * (a record may only begin at a block start or right after another), which
 * also rules forgery out but splits large records into fragments that a
 * delivery would have to gather again with several reads; and chaining
 * each checksum to the previous record's, as SQLite's WAL also does, which
 * would leave nothing after damage to check or keep in repair mode.
 *
 * Format 3 is format 2 that may hold DEAD records (a timer moved to the
 * dead letters: the due time of its last delivery, the attempts it had,
 * its payload). A segment is written as format 2 and its header is
 * rewritten in place to say 3 (same salt) just before its first DEAD
 * record is written, so a journal without dead letters still opens with
 * the code before dead letters, and one with them is refused by it with
 * "bad segment header" (TW_EIO) instead of being misread: that code
 * knows no DEAD record and would take one for damage, or for a torn tail
 * to cut. This code reads DEAD records in any format-2 or 3 segment (the
 * header rewrite and the record are not made durable together).
 *
 * Format 1 (twheel 0.2 and older) is the same with version 1 and no salt
 * (checksums from 0). Such a journal still opens: its segments are read
 * with the unsalted checksum, and the open rewrites every live record into
 * a new format-2 segment and deletes the old ones, so the format-1 reader
 * runs once, at that upgrade.
 *
 * MANIFEST (written only once a segment has been deleted): "TWMANIF1" |
 * u32 number of the oldest segment the store still has | u32 crc32c of
 * bytes 0..11. Without it the oldest segment is 1. Every segment from
 * that one to the newest must be present.
 */
#ifndef TWHEEL_JOURNAL_FORMAT_H
#define TWHEEL_JOURNAL_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "twheel/durable.h" /* TW_DURABLE_KEY_MAX */

/* Segment header: field offsets and size. */
#define JR_SH_MAGIC 0u   /* "TWJOURN1" */
#define JR_SH_VERSION 8u /* u32 */
#define JR_SH_NO 12u     /* u32 segment number */
#define JR_SH_SALT 16u   /* u64 */
#define JR_SH_ZERO 24u   /* u32 0 */
#define JR_SH_CRC 28u    /* u32 crc32c of bytes 0 .. JR_SH_CRC - 1 */
#define JR_SEG_HDR 32u
#define JR_SEG_MAGIC "TWJOURN1"

/* Record header: field offsets and size. */
#define JR_RH_CRC 0u
#define JR_RH_LEN 4u      /* u32 bytes after the header */
#define JR_RH_TYPE 8u     /* u8 */
#define JR_RH_PAD 9u      /* u8 0 */
#define JR_RH_KEY_LEN 10u /* u16 */
#define JR_RH_SYNCED 12u  /* u32 */
#define JR_REC_HDR 16u

/* SCHED and DEAD bodies: field offsets, then key and payload. */
#define JR_B_DUE 0u      /* i64 due_ms */
#define JR_B_ATTEMPT 8u  /* u32 */
#define JR_B_PAY_LEN 12u /* u32 */
#define JR_SCHED_FIXED 16u
/* The largest body: the fixed fields, a key and a 1 MiB payload. */
#define JR_MAX_BODY (JR_SCHED_FIXED + 1024u + 1024u * 1024u)

#define JR_VERSION 2u   /* what this code writes */
#define JR_VERSION_3 3u /* a segment that holds DEAD records */
#define JR_VERSION_1 1u /* unsalted, still read */

enum { JR_SCHED = 1, JR_CANCEL = 2, JR_DONE = 3, JR_FIRE = 4, JR_DEAD = 5 };

/* MANIFEST: magic, u32 oldest segment, u32 crc32c of bytes 0..11. */
#define JR_MANIFEST_MAGIC "TWMANIF1"
#define JR_MF_OLDEST 8u
#define JR_MF_CRC 12u
#define JR_MANIFEST_SIZE 16u

/* A segment file's name: ten decimal digits and ".twj"; buffers for it
 * hold JR_SEG_NAME_MAX bytes. */
#define JR_SEG_NAME_LEN 14u
#define JR_SEG_NAME_MAX 16u

_Static_assert(JR_SH_CRC + 4 == JR_SEG_HDR, "segment header is 32 bytes");
_Static_assert(sizeof JR_SEG_MAGIC - 1 == JR_SH_VERSION, "magic is 8 bytes");
_Static_assert(JR_RH_SYNCED + 4 == JR_REC_HDR, "record header is 16 bytes");
_Static_assert(JR_B_PAY_LEN + 4 == JR_SCHED_FIXED, "fixed body is 16 bytes");
_Static_assert(TW_DURABLE_KEY_MAX <= UINT16_MAX, "key_len is a u16");
_Static_assert(TW_DURABLE_KEY_MAX <= 1024u, "JR_MAX_BODY covers any key");
_Static_assert((uint64_t)JR_REC_HDR + JR_MAX_BODY < UINT32_MAX,
               "a record's size is a u32");
_Static_assert(JR_MF_CRC + 4 == JR_MANIFEST_SIZE, "manifest is 16 bytes");
_Static_assert(sizeof JR_MANIFEST_MAGIC - 1 == JR_MF_OLDEST,
               "manifest magic is 8 bytes");
_Static_assert(JR_SEG_NAME_LEN < JR_SEG_NAME_MAX, "room for the name's NUL");

/* Little-endian fields. */
static inline void tw__jr_put16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static inline void tw__jr_put32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void tw__jr_put64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint16_t tw__jr_get16(const unsigned char *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}

static inline uint32_t tw__jr_get32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
           (uint32_t)p[3] << 24;
}

static inline uint64_t tw__jr_get64(const unsigned char *p)
{
    return (uint64_t)tw__jr_get32(p) | (uint64_t)tw__jr_get32(p + 4) << 32;
}

uint32_t tw__crc32c(uint32_t crc, const void *buf, size_t n);

/* One decoded record; pointers into the scanned buffer. */
typedef struct jr_rec {
    uint32_t off;  /* offset of the record in its segment */
    uint32_t size; /* JR_REC_HDR + len */
    uint8_t type;
    uint32_t synced;
    const unsigned char *key;
    uint16_t key_len;
    int64_t due_ms;
    uint32_t attempt;
    const unsigned char *payload;
    uint32_t payload_len;
} jr_rec;

/* Decode the record at @p (@n bytes available) of a segment whose
 * checksum seed is @seed. Returns its size (> 0) if the record is
 * complete, well formed and its checksum matches; 0 if not. */
size_t tw__jr_decode(const unsigned char *p, size_t n, uint32_t off,
                     uint32_t seed, jr_rec *out);

/* Encode a record for a segment whose checksum seed is @seed into @buf
 * (room for JR_REC_HDR + body); returns its size. @payload is for
 * JR_SCHED only. */
size_t tw__jr_encode(unsigned char *buf, uint32_t seed, int type,
                     const void *key, size_t key_len, int64_t due_ms,
                     uint32_t attempt, const void *payload, size_t payload_len,
                     uint32_t synced);

static inline size_t tw__jr_size(int type, size_t key_len, size_t payload_len)
{
    return JR_REC_HDR + key_len +
           (type == JR_SCHED || type == JR_DEAD ? JR_SCHED_FIXED + payload_len
                                                : 0);
}

/* The size a record header @h (JR_REC_HDR bytes) claims for its record,
 * or 0 if that is more than any record's (nothing else is checked). */
static inline size_t tw__jr_hdr_size(const unsigned char *h)
{
    uint32_t len = tw__jr_get32(h + JR_RH_LEN);
    return len > JR_MAX_BODY ? 0 : JR_REC_HDR + (size_t)len;
}

/* The checksum seed of a segment with @salt: the CRC32C of its 8 bytes. */
uint32_t tw__jr_seed(uint64_t salt);
/* Segment header: check (returns its format version, *@seed set, or 0 if
 * it is not a valid header of segment @seg) / write (format 2) / say
 * format 3, the rest kept. */
unsigned tw__jr_seg_hdr_ok(const unsigned char *p, size_t n, uint32_t seg,
                           uint32_t *seed);
void tw__jr_seg_hdr(unsigned char *p, uint32_t seg, uint64_t salt);
void tw__jr_seg_hdr_v3(unsigned char *p);

/* "NNNNNNNNNN.twj", the name of segment @no, into @buf (JR_SEG_NAME_MAX
 * bytes). */
static inline void tw__jr_seg_name(char *buf, uint32_t no)
{
    snprintf(buf, JR_SEG_NAME_MAX, "%010u.twj", no);
}

/* Whether @name is a segment file's name; if so *@no is its number. */
static inline bool tw__jr_seg_parse(const char *name, uint32_t *no)
{
    uint64_t v = 0;
    for (unsigned i = 0; i < JR_SEG_NAME_LEN - 4; i++) {
        if (name[i] < '0' || name[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(name[i] - '0');
    }
    const char *ext = name + JR_SEG_NAME_LEN - 4;
    if (ext[0] != '.' || ext[1] != 't' || ext[2] != 'w' || ext[3] != 'j' ||
        ext[4] != '\0' || v > UINT32_MAX)
        return false;
    *no = (uint32_t)v;
    return true;
}

#endif
