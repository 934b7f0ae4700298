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
 * Parses the @n bytes at @p into @r; false if they are not a job record
 * as tbd_job_write() writes it: lengths that add up, a known state, a tube
 * name a client may send, times in [0, REC_TIME_MAX], an id above 0.
 */
bool tbd_rec_parse(const unsigned char *p, size_t n, struct rec *r)
{
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
