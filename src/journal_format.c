/* SPDX-License-Identifier: MIT */
/*
 * src/journal_format.c - the journal's codec: CRC32C, records encoded and
 * decoded, segment headers made and checked (the layout is in
 * journal_format.h). No I/O: the writer (journal_writer.c) and the reader
 * (journal_reader.c) call it on bytes they hold.
 */
#include "journal_format.h"

#include <pthread.h>
#include <string.h>

/* ------------------------------------------------------------------------ */
/* CRC32C (Castagnoli), slicing by 8; the tables are made once. */

static uint32_t crc_tab[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;
static uint32_t (*crc_fn)(uint32_t crc, const unsigned char *p, size_t n);

static uint32_t crc_sw(uint32_t crc, const unsigned char *p, size_t n)
{
    while (n >= 8) {
        uint32_t lo = crc ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 |
                             (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
        crc = crc_tab[7][lo & 0xff] ^ crc_tab[6][(lo >> 8) & 0xff] ^
              crc_tab[5][(lo >> 16) & 0xff] ^ crc_tab[4][lo >> 24] ^
              crc_tab[3][p[4]] ^ crc_tab[2][p[5]] ^ crc_tab[1][p[6]] ^
              crc_tab[0][p[7]];
        p += 8;
        n -= 8;
    }
    while (n--)
        crc = (crc >> 8) ^ crc_tab[0][(crc ^ *p++) & 0xff];
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TW_CRC_HW 1
/* The SSE4.2 crc32 instruction computes the same CRC32C (little-endian
 * loads: x86 only). */
__attribute__((target("sse4.2"))) static uint32_t
crc_hw(uint32_t crc, const unsigned char *p, size_t n)
{
    uint64_t c = crc;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = __builtin_ia32_crc32di(c, v);
        p += 8;
        n -= 8;
    }
    uint32_t c32 = (uint32_t)c;
    while (n--)
        c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#endif

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
        crc_tab[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_tab[t][i] =
                (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 0xff];
    crc_fn = crc_sw;
#ifdef TW_CRC_HW
    __builtin_cpu_init();
    if (__builtin_cpu_supports("sse4.2"))
        crc_fn = crc_hw;
#endif
}

uint32_t tw__crc32c(uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&crc_once, crc_init);
    return ~crc_fn(~crc, buf, n);
}

/* ------------------------------------------------------------------------ */
/* Records. */

size_t tw__jr_encode(unsigned char *buf, uint32_t seed, int type,
                     const void *key, size_t key_len, int64_t due_ms,
                     uint32_t attempt, const void *payload, size_t payload_len,
                     uint32_t synced)
{
    size_t size = tw__jr_size(type, key_len, payload_len);
    tw__jr_put32(buf + JR_RH_LEN, (uint32_t)(size - JR_REC_HDR));
    buf[JR_RH_TYPE] = (unsigned char)type;
    buf[JR_RH_PAD] = 0;
    tw__jr_put16(buf + JR_RH_KEY_LEN, (uint16_t)key_len);
    tw__jr_put32(buf + JR_RH_SYNCED, synced);
    unsigned char *p = buf + JR_REC_HDR;
    bool body = type == JR_SCHED || type == JR_DEAD;
    if (body) {
        tw__jr_put64(p + JR_B_DUE, (uint64_t)due_ms);
        tw__jr_put32(p + JR_B_ATTEMPT, attempt);
        tw__jr_put32(p + JR_B_PAY_LEN, (uint32_t)payload_len);
        p += JR_SCHED_FIXED;
    }
    memcpy(p, key, key_len);
    if (body && payload_len)
        memcpy(p + key_len, payload, payload_len);
    tw__jr_put32(buf + JR_RH_CRC,
                 tw__crc32c(seed, buf + JR_RH_LEN, size - JR_RH_LEN));
    return size;
}

size_t tw__jr_decode(const unsigned char *p, size_t n, uint32_t off,
                     uint32_t seed, jr_rec *out)
{
    if (n < JR_REC_HDR)
        return 0;
    uint32_t len = tw__jr_get32(p + JR_RH_LEN);
    uint8_t type = p[JR_RH_TYPE];
    uint16_t key_len = tw__jr_get16(p + JR_RH_KEY_LEN);
    if (len > JR_MAX_BODY || len > n - JR_REC_HDR || p[JR_RH_PAD] != 0 ||
        key_len == 0 || key_len > TW_DURABLE_KEY_MAX)
        return 0;
    if (type == JR_SCHED || type == JR_DEAD) {
        if (len < JR_SCHED_FIXED + key_len ||
            tw__jr_get32(p + JR_REC_HDR + JR_B_PAY_LEN) !=
                len - JR_SCHED_FIXED - key_len)
            return 0;
    } else if (type == JR_CANCEL || type == JR_DONE || type == JR_FIRE) {
        if (len != key_len)
            return 0;
    } else {
        return 0;
    }
    size_t size = JR_REC_HDR + (size_t)len;
    if (tw__crc32c(seed, p + JR_RH_LEN, size - JR_RH_LEN) !=
        tw__jr_get32(p + JR_RH_CRC))
        return 0;
    out->off = off;
    out->size = (uint32_t)size;
    out->type = type;
    out->synced = tw__jr_get32(p + JR_RH_SYNCED);
    out->key_len = key_len;
    const unsigned char *b = p + JR_REC_HDR;
    if (type == JR_SCHED || type == JR_DEAD) {
        out->due_ms = (int64_t)tw__jr_get64(b + JR_B_DUE);
        out->attempt = tw__jr_get32(b + JR_B_ATTEMPT);
        out->payload_len = tw__jr_get32(b + JR_B_PAY_LEN);
        out->key = b + JR_SCHED_FIXED;
        out->payload = out->key + key_len;
    } else {
        out->due_ms = 0;
        out->attempt = 0;
        out->payload_len = 0;
        out->key = b;
        out->payload = NULL;
    }
    return size;
}

uint32_t tw__jr_seed(uint64_t salt)
{
    unsigned char b[8];
    tw__jr_put64(b, salt);
    return tw__crc32c(0, b, sizeof b);
}

unsigned tw__jr_seg_hdr_ok(const unsigned char *p, size_t n, uint32_t seg,
                           uint32_t *seed)
{
    if (n < JR_SEG_HDR || memcmp(p + JR_SH_MAGIC, JR_SEG_MAGIC, 8) != 0 ||
        tw__jr_get32(p + JR_SH_NO) != seg ||
        tw__jr_get32(p + JR_SH_CRC) != tw__crc32c(0, p, JR_SH_CRC))
        return 0;
    uint32_t v = tw__jr_get32(p + JR_SH_VERSION);
    if (v == JR_VERSION_1 && tw__jr_get64(p + JR_SH_SALT) == 0)
        *seed = 0; /* format 1: the records' checksums are unsalted */
    else if (v == JR_VERSION || v == JR_VERSION_3)
        *seed = tw__jr_seed(tw__jr_get64(p + JR_SH_SALT));
    else
        return 0;
    return v;
}

void tw__jr_seg_hdr(unsigned char *p, uint32_t seg, uint64_t salt)
{
    memset(p, 0, JR_SEG_HDR);
    memcpy(p + JR_SH_MAGIC, JR_SEG_MAGIC, 8);
    tw__jr_put32(p + JR_SH_VERSION, JR_VERSION);
    tw__jr_put32(p + JR_SH_NO, seg);
    tw__jr_put64(p + JR_SH_SALT, salt);
    tw__jr_put32(p + JR_SH_CRC, tw__crc32c(0, p, JR_SH_CRC));
}

void tw__jr_seg_hdr_v3(unsigned char *p)
{
    tw__jr_put32(p + JR_SH_VERSION, JR_VERSION_3);
    tw__jr_put32(p + JR_SH_CRC, tw__crc32c(0, p, JR_SH_CRC));
}
