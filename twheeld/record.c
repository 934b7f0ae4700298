/* SPDX-License-Identifier: MIT */
/*
 * record.c - twheeld: the job-record codec: what twheeld stores, and parsing it
 * back.
 */
#include "record.h"

#include "proto.h"

#include <string.h>

void tbd_put_u32(unsigned char **p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        *(*p)++ = (unsigned char)(v >> (8 * i));
}

void tbd_put_u64(unsigned char **p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        *(*p)++ = (unsigned char)(v >> (8 * i));
}

uint32_t tbd_get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

uint64_t tbd_get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* The number of @len bytes at @s, decimal digits without a leading zero
 * (but "0"), if it is at most @max; else -1. */
int64_t tbd_key_num(const char *s, size_t len, uint64_t max)
{
    if (len == 0 || len > 20 || (s[0] == '0' && len > 1))
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (max - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    return (int64_t)v;
}

/*
 * The node and due time of the liveness record @p (@n bytes) under key
 * @key: true only for a record as live_payload() writes it, under the
 * key live_key() gives its node, due no later than @due_max (a record
 * due far ahead was not written by a server renewing it).
 */
bool tbd_live_parse(const char *key, size_t key_len, const unsigned char *p,
                    size_t n, int64_t due_max, uint32_t *node, int64_t *due)
{
    if (n != LIVE_LEN || p[0] != REC_LIVE || p[1] != 2 || key_len < 2 ||
        key[0] != 'n')
        return false;
    *node = tbd_get_u32(p + 2);
    *due = (int64_t)tbd_get_u64(p + 6);
    return tbd_key_num(key + 1, key_len - 1, UINT32_MAX) == (int64_t)*node &&
           *due <= due_max;
}

/* The id of store key "j<id>" (as tbd_job_write() spells it), or 0. */
uint64_t tbd_key_id(const char *key, size_t len)
{
    if (len < 2 || key[0] != 'j')
        return 0;
    int64_t id = tbd_key_num(key + 1, len - 1, INT64_MAX);
    return id > 0 ? (uint64_t)id : 0;
}

/*
 * Version 4, the compact record (a server on the journal writes it):
 *
 *   'J' | 4 | u8 state | pri | ttr | delay | id | created | due - created
 *   | u8 mask: bit i set when counter i (reserves, timeouts, releases,
 *   buries, kicks) is not 0 | those counters | node | u8 tube length,
 *   0 for "default" | tube | body (the rest of the record)
 *
 * Integers unsigned LEB128 (7 bits a byte, least significant first, the
 * shortest form only), "due - created" zigzag-encoded (it may be
 * negative: a job kicked before its due time). A delayed job in tube
 * "default" takes less than half of version 3's bytes (the sizes:
 * tests/test_twheeld_record.c).
 * Its largest integers take no more bytes than version 3's fields (id
 * 10, created and the difference 8 each: times are below 2^53, counters
 * and the rest 5 each), so tbd_rec_size() bounds it too.
 */
struct cur {
    const unsigned char *p, *end;
    bool ok;
};

/* The next varint of @c, at most @max; sets c->ok false on a bad one. */
static uint64_t get_var(struct cur *c, uint64_t max)
{
    uint64_t v = 0;
    for (int shift = 0; c->ok && c->p < c->end && shift < 64; shift += 7) {
        unsigned char b = *c->p++;
        uint64_t d = (uint64_t)(b & 0x7f);
        if ((shift == 63 && d > 1) || (shift > 0 && b == 0))
            break; /* more than 64 bits, or not the shortest form */
        v |= d << shift;
        if (!(b & 0x80))
            return v <= max ? v : (c->ok = false, 0);
    }
    c->ok = false;
    return 0;
}

static bool parse_compact(const unsigned char *p, size_t n, struct rec *r)
{
    struct cur c = {p + 3, p + n, n >= 4};
    if (!c.ok || p[2] > REC_STATE_MAX)
        return false;
    r->state = p[2];
    r->token = 0;
    r->pri = (uint32_t)get_var(&c, UINT32_MAX);
    r->ttr = (uint32_t)get_var(&c, UINT32_MAX);
    r->delay = (uint32_t)get_var(&c, UINT32_MAX);
    r->id = get_var(&c, UINT64_MAX);
    r->created = (int64_t)get_var(&c, REC_TIME_MAX);
    uint64_t z = get_var(&c, UINT64_MAX);
    int64_t d = (int64_t)(z >> 1) ^ -(int64_t)(z & 1); /* zigzag */
    unsigned mask = c.ok && c.p < c.end ? *c.p++ : 0x80;
    for (int i = 0; i < 5; i++)
        r->cnt[i] = mask & (1u << i) ? (uint32_t)get_var(&c, UINT32_MAX) : 0;
    r->owner = (uint32_t)get_var(&c, UINT32_MAX);
    if (!c.ok || c.p >= c.end || mask > 0x1f || r->id == 0 || d < -r->created ||
        d > REC_TIME_MAX - r->created)
        return false;
    r->due = r->created + d;
    for (int i = 0; i < 5; i++)
        if ((mask & (1u << i)) && !r->cnt[i])
            return false; /* not the shortest form */
    r->tube_len = *c.p++;
    r->tube = "default";
    if (r->tube_len == 0) {
        r->tube_len = 7;
    } else if ((size_t)(c.end - c.p) < r->tube_len ||
               !tbd_tube_name_ok((const char *)c.p, r->tube_len) ||
               (r->tube_len == 7 && !memcmp(c.p, "default", 7))) {
        return false;
    } else {
        r->tube = (const char *)c.p;
        c.p += r->tube_len;
    }
    if ((size_t)(c.end - c.p) > UINT32_MAX)
        return false;
    r->body = c.p;
    r->body_len = (uint32_t)(c.end - c.p);
    return true;
}

/* Appends varint @v at *@p (NULL: counts only) and adds its length to
 * *@n. */
static void put_var(unsigned char **p, size_t *n, uint64_t v)
{
    do {
        unsigned char b = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (*p)
            *(*p)++ = (unsigned char)(b | (v ? 0x80 : 0));
        (*n)++;
    } while (v);
}

/* Writes the version 4 record of @r at @p (NULL: nothing written), which
 * has room for tbd_rec_size(r->tube_len, r->body_len) bytes; returns its
 * length. */
size_t tbd_rec_encode_compact(const struct rec *r, unsigned char *p)
{
    unsigned char *q = p;
    size_t n = 3;
    if (q) {
        *q++ = REC_JOB;
        *q++ = REC_COMPACT;
        *q++ = (unsigned char)r->state;
    }
    put_var(&q, &n, r->pri);
    put_var(&q, &n, r->ttr);
    put_var(&q, &n, r->delay);
    put_var(&q, &n, r->id);
    put_var(&q, &n, (uint64_t)r->created);
    int64_t d = r->due - r->created;
    put_var(&q, &n, ((uint64_t)d << 1) ^ (uint64_t)(d >> 63)); /* zigzag */
    unsigned mask = 0;
    for (int i = 0; i < 5; i++)
        mask |= r->cnt[i] ? 1u << i : 0;
    if (q)
        *q++ = (unsigned char)mask;
    n++;
    for (int i = 0; i < 5; i++)
        if (r->cnt[i])
            put_var(&q, &n, r->cnt[i]);
    put_var(&q, &n, r->owner);
    bool dflt = r->tube_len == 7 && !memcmp(r->tube, "default", 7);
    size_t tl = dflt ? 0 : r->tube_len;
    if (q) {
        *q++ = (unsigned char)tl;
        memcpy(q, r->tube, tl);
        q += tl;
        memcpy(q, r->body, r->body_len);
    }
    return n + 1 + tl + r->body_len;
}

/*
 * Parses the @n bytes at @p into @r; false if they are not a job record
 * as tbd_job_write() writes it: lengths that add up, a known state, a tube
 * name a client may send, times in [0, REC_TIME_MAX], an id above 0.
 */
bool tbd_rec_parse(const unsigned char *p, size_t n, struct rec *r)
{
    if (n >= 2 && p[0] == REC_JOB && p[1] == REC_COMPACT)
        return parse_compact(p, n, r);
    if (n < 2 || p[0] != REC_JOB || p[1] < 1 || p[1] > REC_VERSION)
        return false;
    size_t tok = p[1] >= 3 ? REC_TOKEN : 0;
    if (n < REC_HEAD + tok || p[2 + tok] > REC_STATE_MAX)
        return false;
    size_t tail = p[1] >= 2 ? 4 : 0; /* the owner */
    r->token = tok ? tbd_get_u64(p + 2) : 0;
    const unsigned char *q = p + 3 + tok;
    r->state = p[2 + tok];
    r->pri = tbd_get_u32(q);
    r->ttr = tbd_get_u32(q + 4);
    r->delay = tbd_get_u32(q + 8);
    q += 12;
    r->id = tbd_get_u64(q);
    r->due = (int64_t)tbd_get_u64(q + 8);
    r->created = (int64_t)tbd_get_u64(q + 16);
    q += 24;
    for (int i = 0; i < 5; i++, q += 4)
        r->cnt[i] = tbd_get_u32(q);
    r->tube_len = *q++;
    if ((size_t)(q - p) + r->tube_len + 4 > n ||
        !tbd_tube_name_ok((const char *)q, r->tube_len) || r->due < 0 ||
        r->due > REC_TIME_MAX || r->created < 0 || r->created > REC_TIME_MAX)
        return false;
    r->tube = (const char *)q;
    q += r->tube_len;
    r->body_len = tbd_get_u32(q);
    q += 4;
    r->body = q;
    if ((size_t)(q - p) + r->body_len + tail != n || r->id == 0)
        return false;
    r->owner =
        tail ? tbd_get_u32(q + r->body_len) : (uint32_t)(r->id >> NODE_SHIFT);
    return true;
}

/* Writes the record of @r at @p, which has room for
 * tbd_rec_size(r->tube_len, r->body_len) bytes: the layout (version 2)
 * that tbd_rec_parse() reads back. */
void tbd_rec_encode(const struct rec *r, unsigned char *p)
{
    unsigned char *q = p;
    *q++ = REC_JOB;
    *q++ = REC_VERSION;
    tbd_put_u64(&q, r->token);
    *q++ = (unsigned char)r->state;
    tbd_put_u32(&q, r->pri);
    tbd_put_u32(&q, r->ttr);
    tbd_put_u32(&q, r->delay);
    tbd_put_u64(&q, r->id);
    tbd_put_u64(&q, (uint64_t)r->due);
    tbd_put_u64(&q, (uint64_t)r->created);
    for (int i = 0; i < 5; i++)
        tbd_put_u32(&q, r->cnt[i]);
    *q++ = (unsigned char)r->tube_len;
    memcpy(q, r->tube, r->tube_len);
    q += r->tube_len;
    tbd_put_u32(&q, r->body_len);
    memcpy(q, r->body, r->body_len);
    q += r->body_len;
    tbd_put_u32(&q, r->owner);
}

/* The high-water mark record of ids (MARK_LEN bytes at @p). */
void tbd_mark_encode(unsigned char *p, uint64_t mark)
{
    unsigned char *q = p;
    *q++ = REC_MARK;
    *q++ = 2; /* marks and liveness records: version 2's layout */
    tbd_put_u64(&q, mark);
}

/* The liveness record of server @node due at @due (LIVE_LEN bytes at
 * @p), as tbd_live_parse() reads it. */
void tbd_live_encode(unsigned char *p, uint32_t node, int64_t due)
{
    unsigned char *q = p;
    *q++ = REC_LIVE;
    *q++ = 2;
    tbd_put_u32(&q, node);
    tbd_put_u64(&q, (uint64_t)due);
}
