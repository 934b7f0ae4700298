/* SPDX-License-Identifier: MIT */
/*
 * fuzz/fuzz_journal.c - the durable store's journal reader on arbitrary
 * segment bytes.
 *
 * Input: one flags byte (bit 0: the newest segment, bit 1: repair mode,
 * bit 2: keep the input's own first 32 bytes as the segment header instead
 * of a valid one, bit 3: a format-2 header with a fixed salt instead of a
 * format-1 one, whose checksums are unsalted), then the segment's bytes. The
 * reader must never crash, must stay inside the buffer, and every record it
 * yields must be well formed, in order, not overlapping, and carry a checksum
 * that a separate bit-by-bit CRC32C (below) agrees with. Its verdict must be
 * one of: all good / torn tail at *end, damage skipped (repair mode only), or
 * TW_EIO at *end (never in repair mode).
 */
#include <stdbool.h>
#include <string.h>

#include "fuzz.h"
#include "journal.h"
#include "twheel/durable.h"

/* CRC32C bit by bit, continuing from @crc (0 to start). */
static uint32_t crc_ref(uint32_t crc, const unsigned char *p, size_t n)
{
    uint32_t c = ~crc;
    while (n--) {
        c ^= *p++;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
    }
    return ~c;
}

#define SALT UINT64_C(0x5a17c0ffee15bad5)

/* A format-1 header of segment @seg. */
static void header_v1(unsigned char *p, uint32_t seg)
{
    memset(p, 0, JR_SEG_HDR);
    memcpy(p, "TWJOURN1", 8);
    p[8] = 1;
    memcpy(p + 12, &seg, 4); /* little-endian hosts only, as the fuzzers */
    uint32_t crc = crc_ref(0, p, 28);
    memcpy(p + 28, &crc, 4);
}

struct check {
    uint32_t seed;
    const unsigned char *buf;
    size_t n;
    size_t next; /* the lowest offset the next record may start at */
    size_t count;
};

static int on_record(void *arg, const jr_rec *r)
{
    struct check *c = arg;
    FZ_CHECK(r->off >= c->next, "record at %u overlaps (next %zu)", r->off,
             c->next);
    FZ_CHECK((size_t)r->off + r->size <= c->n, "record past the end");
    const unsigned char *p = c->buf + r->off;
    uint32_t stored = (uint32_t)p[0] | (uint32_t)p[1] << 8 |
                      (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    FZ_CHECK(crc_ref(c->seed, p + 4, r->size - 4) == stored,
             "record at %u has a bad checksum", r->off);
    FZ_CHECK(r->key_len >= 1 && r->key_len <= TW_DURABLE_KEY_MAX, "key_len %u",
             r->key_len);
    FZ_CHECK(r->key >= p && r->key + r->key_len <= p + r->size,
             "key outside the record");
    if (r->type == JR_SCHED) {
        FZ_CHECK(r->payload + r->payload_len == p + r->size,
                 "payload does not end the record");
        FZ_CHECK(r->size == tw__jr_size(JR_SCHED, r->key_len, r->payload_len),
                 "size");
    } else {
        FZ_CHECK(r->type == JR_CANCEL || r->type == JR_DONE ||
                     r->type == JR_FIRE,
                 "type %u", r->type);
        FZ_CHECK(r->size == tw__jr_size(r->type, r->key_len, 0), "size");
    }
    /* Re-encoding the record gives the same bytes. */
    unsigned char tmp[JR_REC_HDR + JR_SCHED_FIXED + TW_DURABLE_KEY_MAX + 64];
    if (r->size <= sizeof tmp) {
        size_t sz =
            tw__jr_encode(tmp, c->seed, r->type, r->key, r->key_len, r->due_ms,
                          r->attempt, r->payload, r->payload_len, r->synced);
        FZ_CHECK(sz == r->size && memcmp(tmp, p, sz) == 0,
                 "re-encoding differs at %u", r->off);
    }
    c->next = (size_t)r->off + r->size;
    c->count++;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    uint8_t flags = data[0];
    data++;
    size--;
    bool last = flags & 1, repair = flags & 2, raw_hdr = flags & 4,
         v2 = flags & 8;
    size_t n = raw_hdr ? size : size + JR_SEG_HDR;
    unsigned char *buf = malloc(n ? n : 1);
    FZ_CHECK(buf != NULL, "malloc");
    if (raw_hdr) {
        memcpy(buf, data, size);
    } else {
        if (v2)
            tw__jr_seg_hdr(buf, 7, SALT);
        else
            header_v1(buf, 7);
        memcpy(buf + JR_SEG_HDR, data, size);
    }
    uint32_t seed = 1;
    unsigned version = tw__jr_seg_hdr_ok(buf, n, 7, &seed);
    if (!raw_hdr) {
        FZ_CHECK(version == (v2 ? 2u : 1u), "a fresh header is rejected");
        unsigned char salt[8];
        for (int i = 0; i < 8; i++)
            salt[i] = (unsigned char)(SALT >> (8 * i));
        FZ_CHECK(seed == (v2 ? crc_ref(0, salt, 8) : 0), "seed %u", seed);
    }
    if (version) {
        struct check c = {.seed = seed, .buf = buf, .n = n, .next = JR_SEG_HDR};
        size_t end = (size_t)-1;
        int rc = tw__jr_scan(buf, n, seed, last, repair, on_record, &c, &end);
        FZ_CHECK(rc == 0 || rc == 1 || rc == TW_EIO, "rc %d", rc);
        FZ_CHECK(end <= n, "end %zu > %zu", end, n);
        FZ_CHECK(!(repair && rc == TW_EIO), "EIO in repair mode");
        FZ_CHECK(repair || rc != 1, "damage skipped without repair");
        if (rc == 0)
            FZ_CHECK(end == c.next || (end == n && c.next >= n),
                     "end %zu, last record ends at %zu", end, c.next);
        if (rc == TW_EIO)
            FZ_CHECK(end >= c.next, "damage before a good record");
        if (!last && rc == 0)
            FZ_CHECK(end == n, "an older segment with a tail");
    }
    free(buf);
    return 0;
}
