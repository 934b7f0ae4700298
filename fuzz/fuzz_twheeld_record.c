/* SPDX-License-Identifier: MIT */
/*
 * fuzz/fuzz_twheeld_record.c - twheeld's store records (twheeld/record.c)
 * on any bytes: what a store that someone else wrote to may hold.
 *
 * The whole input is parsed as a job record, and as a key "j<id>"; its
 * first byte, modulo 32, is the length of a key that the next bytes hold,
 * and the bytes after that are parsed as a liveness record under it.
 * Besides memory safety (ASan, UBSan) the harness checks: a job record
 * that parses has a known state, an id above 0, a tube name a client may
 * send and times in [0, REC_TIME_MAX]; encoded again it parses to the
 * same fields, and a version 3 record encodes to the same bytes; so
 * does the compact record (version 4) of the same fields, no longer than
 * version 3's; a version 4 record is its own compact encoding; a key
 * id and a liveness record write back to the same bytes.
 */
#include "fuzz.h"
#include "proto.h"
#include "record.h"

#include <string.h>

/* True when @a and @b hold the same fields, the write token aside. */
static bool same(const struct rec *a, const struct rec *b)
{
    return a->state == b->state && a->pri == b->pri && a->ttr == b->ttr &&
           a->delay == b->delay && a->body_len == b->body_len &&
           memcmp(a->cnt, b->cnt, sizeof(a->cnt)) == 0 &&
           a->owner == b->owner && a->id == b->id && a->due == b->due &&
           a->created == b->created && a->tube_len == b->tube_len &&
           memcmp(a->tube, b->tube, a->tube_len) == 0 &&
           memcmp(a->body, b->body, a->body_len) == 0;
}

static void check_rec(const uint8_t *data, size_t size)
{
    struct rec a, b;
    if (!tbd_rec_parse(data, size, &a))
        return;
    FZ_CHECK(a.state >= 0 && a.state <= REC_STATE_MAX, "state %d", a.state);
    FZ_CHECK(a.id > 0, "id 0");
    FZ_CHECK(tbd_tube_name_ok(a.tube, a.tube_len), "tube");
    FZ_CHECK(a.due >= 0 && a.due <= REC_TIME_MAX, "due %" PRId64, a.due);
    FZ_CHECK(a.created >= 0 && a.created <= REC_TIME_MAX, "created %" PRId64,
             a.created);
    size_t n = tbd_rec_size(a.tube_len, a.body_len);
    /* Version 3 adds to versions 1 and 2 at most the node and the token;
     * to a compact record at most 71 bytes (its 12 least against 76,
     * and the tube "default" it leaves out). */
    FZ_CHECK(n <= size + (data[1] == REC_COMPACT ? 71 : 4 + REC_TOKEN),
             "size %zu of %zu", n, size);
    unsigned char *p = malloc(n);
    FZ_CHECK(p != NULL, "malloc");
    tbd_rec_encode(&a, p);
    FZ_CHECK(tbd_rec_parse(p, n, &b), "reparse");
    FZ_CHECK(same(&a, &b) && a.token == b.token, "reparse differs");
    if (data[1] == REC_VERSION)
        FZ_CHECK(n == size && memcmp(p, data, n) == 0, "encoding differs");
    /* The compact record (version 4) of the same fields: no longer, the
     * same fields back, and a version 4 record is its own encoding. */
    size_t m = tbd_rec_encode_compact(&a, NULL);
    FZ_CHECK(m <= n, "compact %zu of %zu", m, n);
    FZ_CHECK(tbd_rec_encode_compact(&a, p) == m, "compact length");
    FZ_CHECK(tbd_rec_parse(p, m, &b), "compact reparse");
    FZ_CHECK(same(&a, &b) && b.token == 0, "compact reparse differs");
    if (data[1] == REC_COMPACT)
        FZ_CHECK(m == size && memcmp(p, data, m) == 0, "compact differs");
    free(p);
}

static void check_key(const uint8_t *data, size_t size)
{
    uint64_t id = tbd_key_id((const char *)data, size);
    if (id == 0)
        return;
    char k[24];
    int n = snprintf(k, sizeof(k), "j%" PRIu64, id);
    FZ_CHECK((size_t)n == size && memcmp(k, data, size) == 0, "key %s", k);
}

static void check_live(const uint8_t *data, size_t size)
{
    if (size == 0)
        return;
    size_t kl = data[0] % 32u;
    if (kl > size - 1)
        kl = size - 1;
    const char *key = (const char *)data + 1;
    const unsigned char *p = data + 1 + kl;
    size_t n = size - 1 - kl;
    uint32_t node;
    int64_t due;
    if (!tbd_live_parse(key, kl, p, n, INT64_MAX, &node, &due))
        return;
    unsigned char q[LIVE_LEN];
    tbd_live_encode(q, node, due);
    FZ_CHECK(n == LIVE_LEN && memcmp(p, q, LIVE_LEN) == 0, "live differs");
    char k[24];
    int m = snprintf(k, sizeof(k), "n%" PRIu32, node);
    FZ_CHECK((size_t)m == kl && memcmp(k, key, kl) == 0, "live key %s", k);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    check_rec(data, size);
    check_key(data, size);
    check_live(data, size);
    return 0;
}
