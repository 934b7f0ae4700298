/* SPDX-License-Identifier: MIT */
/*
 * test_twheeld_record - twheeld's job records (twheeld/record.c): the
 * compact record (version 4) that a server on the journal writes, against
 * version 3 for the same fields. Random jobs round-trip through both and
 * parse to the same fields; the compact record of a delayed job in tube
 * "default" with a 20-byte body (the bench's) is 44 bytes against 103;
 * every byte sequence the server never writes (an integer in more bytes
 * than it needs or over its field, a counter flagged but 0, "default"
 * spelled out, a bad state or tube, a time past REC_TIME_MAX, id 0) is
 * refused, and so is each prefix of a record that cuts a field; records
 * of versions 1 to 3 still parse.
 */
#include "proto.h"
#include "record.h"
#include "test.h"

#include <string.h>

static uint64_t rng = 0x9E3779B97F4A7C15ull;

static uint64_t rnd(void)
{
    return tw_test_rand(&rng);
}

/* A random value of up to @bits bits, mostly small ones. */
static uint64_t rbits(int bits)
{
    int b = (int)(rnd() % (uint64_t)(bits + 1));
    return b == 64 ? rnd() : rnd() & ((UINT64_C(1) << b) - 1);
}

static void same(const struct rec *a, const struct rec *b)
{
    ASSERT_EQ(a->state, b->state);
    ASSERT_EQ(a->pri, b->pri);
    ASSERT_EQ(a->ttr, b->ttr);
    ASSERT_EQ(a->delay, b->delay);
    ASSERT_EQ(a->id, b->id);
    ASSERT_EQ(a->due, b->due);
    ASSERT_EQ(a->created, b->created);
    ASSERT_EQ(a->owner, b->owner);
    ASSERT_EQ(a->body_len, b->body_len);
    ASSERT_EQ(a->tube_len, b->tube_len);
    ASSERT(memcmp(a->cnt, b->cnt, sizeof(a->cnt)) == 0);
    ASSERT(memcmp(a->tube, b->tube, a->tube_len) == 0);
    ASSERT(a->body_len == 0 || memcmp(a->body, b->body, a->body_len) == 0);
}

static void random_rec(struct rec *r, char *tube, unsigned char *body)
{
    static const char tc[] = "abcXYZ019-+/;.$_()";
    memset(r, 0, sizeof(*r));
    r->state = (int)(rnd() % 4);
    r->pri = (uint32_t)rbits(32);
    r->ttr = (uint32_t)rbits(32);
    r->delay = (uint32_t)rbits(32);
    r->id = rbits(64) | 1;
    r->created = (int64_t)(rnd() % ((uint64_t)REC_TIME_MAX + 1));
    r->due = rnd() % 4 ? (int64_t)(rnd() % ((uint64_t)REC_TIME_MAX + 1))
                       : r->created;
    for (int i = 0; i < 5; i++)
        r->cnt[i] = rnd() % 2 ? (uint32_t)rbits(32) : 0;
    r->owner = (uint32_t)rbits(32);
    r->token = rnd() | 1;
    if (rnd() % 3 == 0) {
        r->tube = "default";
        r->tube_len = 7;
    } else {
        r->tube_len = 1 + rnd() % TBD_TUBE_NAME_MAX;
        for (size_t i = 0; i < r->tube_len; i++)
            tube[i] = tc[rnd() % (sizeof(tc) - 1)];
        tube[0] = 'a'; /* not '-' */
        r->tube = tube;
    }
    r->body_len = (uint32_t)(rnd() % 300);
    for (uint32_t i = 0; i < r->body_len; i++)
        body[i] = (unsigned char)rnd();
    r->body = body;
}

/* Random records through both versions; every cut prefix refused. */
static void test_roundtrip(void)
{
    char tube[TBD_TUBE_NAME_MAX];
    unsigned char body[300], p[1024], q[1024];
    for (int k = 0; k < 20000; k++) {
        struct rec a, b, c;
        random_rec(&a, tube, body);
        size_t n = tbd_rec_encode_compact(&a, NULL);
        ASSERT(n <= tbd_rec_size(a.tube_len, a.body_len));
        memset(p, 0xee, sizeof(p));
        ASSERT_EQ(tbd_rec_encode_compact(&a, p), n);
        ASSERT_EQ(p[n], 0xee); /* nothing written past its length */
        ASSERT(tbd_rec_parse(p, n, &b));
        same(&a, &b);
        ASSERT_EQ(b.token, 0);
        size_t m = tbd_rec_size(a.tube_len, a.body_len);
        tbd_rec_encode(&a, q);
        ASSERT(tbd_rec_parse(q, m, &c));
        same(&a, &c);
        ASSERT_EQ(c.token, a.token);
        /* A prefix that ends before the body is not a record. */
        size_t head = n - a.body_len;
        for (size_t cut = 0; cut < head; cut++)
            ASSERT(!tbd_rec_parse(p, cut, &b));
    }
}

/* The bench's delayed job: 44 bytes compact, 103 in version 3. */
static void test_size(void)
{
    unsigned char body[20];
    memset(body, '7', sizeof(body));
    struct rec r = {.state = 1,
                    .pri = 0,
                    .ttr = 60,
                    .delay = 86400,
                    .id = 449999,
                    .created = INT64_C(1796700000000),
                    .due = INT64_C(1796700000000) + 86400000,
                    .tube = "default",
                    .tube_len = 7,
                    .body = body,
                    .body_len = 20};
    size_t n = tbd_rec_encode_compact(&r, NULL);
    printf("compact record of a delayed job, 20-byte body: %zu bytes "
           "(version 3: %zu)\n",
           n, tbd_rec_size(7, 20));
    ASSERT_EQ(n, 44);
    ASSERT_EQ(tbd_rec_size(7, 20), 103);
}

/* Byte sequences the server never writes are refused. */
static void test_refused(void)
{
    unsigned char body[4] = {1, 2, 3, 4};
    struct rec r = {.state = 0,
                    .pri = 5,
                    .ttr = 1,
                    .delay = 0,
                    .id = 3,
                    .created = 1000,
                    .due = 1000,
                    .cnt = {0, 2, 0, 0, 0},
                    .tube = "default",
                    .tube_len = 7,
                    .body = body,
                    .body_len = 4};
    unsigned char p[128], q[128];
    size_t n = tbd_rec_encode_compact(&r, p);
    struct rec b;
    ASSERT(tbd_rec_parse(p, n, &b));
    /* Layout: J 4 state | pri ttr delay id | created (2 bytes) | due -
     * created | mask | cnt[1] | owner | tube length | body. */
    static const unsigned char want[] = {'J', 4, 0, 5, 1, 0, 3, 0xe8, 7,
                                         0,   2, 2, 0, 0, 1, 2, 3,    4};
    ASSERT_EQ(n, sizeof(want));
    ASSERT(memcmp(p, want, n) == 0);
    struct {
        size_t at;
        unsigned char v;
    } bad[] = {
        {2, 4},     /* state */
        {8, 0x87},  /* created: on into a 0 byte, not its shortest form */
        {10, 0x22}, /* a mask bit past the five counters */
        {10, 0x03}, /* counter 0 flagged: its varint eats the next */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        memcpy(q, p, n);
        q[bad[i].at] = bad[i].v;
        struct rec c;
        ASSERT(!tbd_rec_parse(q, n, &c));
    }
    /* pri 5 as two bytes (0x85 0x00): not the shortest form. */
    memcpy(q, p, 3);
    q[3] = 0x85;
    q[4] = 0x00;
    memcpy(q + 5, p + 4, n - 4);
    ASSERT(!tbd_rec_parse(q, n + 1, &b));
    /* A flagged counter that is 0. */
    memcpy(q, p, n);
    q[11] = 0;
    ASSERT(!tbd_rec_parse(q, n, &b));
    /* id 0. */
    memcpy(q, p, n);
    q[6] = 0;
    ASSERT(!tbd_rec_parse(q, n, &b));
    /* "default" spelled out. */
    memcpy(q, p, 13);
    q[13] = 7;
    memcpy(q + 14, "default", 7);
    memcpy(q + 21, body, 4);
    ASSERT(!tbd_rec_parse(q, 25, &b));
    q[14] = 'D'; /* another tube of 7 bytes is fine */
    ASSERT(tbd_rec_parse(q, 25, &b));
    ASSERT_EQ(b.tube_len, 7);
    ASSERT(memcmp(b.tube, "Default", 7) == 0);
    q[14] = '-'; /* a name a client may not send */
    ASSERT(!tbd_rec_parse(q, 25, &b));
    /* A time past REC_TIME_MAX. */
    r.created = REC_TIME_MAX;
    r.due = REC_TIME_MAX;
    n = tbd_rec_encode_compact(&r, p);
    ASSERT(tbd_rec_parse(p, n, &b));
    r.created = REC_TIME_MAX + 1;
    n = tbd_rec_encode_compact(&r, p);
    ASSERT(!tbd_rec_parse(p, n, &b));
    /* A pri over 32 bits. */
    r.created = 1000;
    n = tbd_rec_encode_compact(&r, p);
    memcpy(q, p, 3);
    static const unsigned char big[] = {0x80, 0x80, 0x80, 0x80, 0x10};
    memcpy(q + 3, big, sizeof(big));
    memcpy(q + 3 + sizeof(big), p + 4, n - 4);
    ASSERT(!tbd_rec_parse(q, n + 4, &b));
}

/* Versions 1 and 2 (no token; version 1 without the node) still parse. */
static void test_old_versions(void)
{
    unsigned char body[3] = {'a', 'b', 'c'};
    struct rec r = {.state = 3,
                    .pri = 7,
                    .ttr = 9,
                    .id = (UINT64_C(5) << NODE_SHIFT) + 1,
                    .created = 5,
                    .due = 6,
                    .owner = 5,
                    .tube = "t1",
                    .tube_len = 2,
                    .body = body,
                    .body_len = 3};
    unsigned char p[128], q[128];
    size_t n = tbd_rec_size(2, 3);
    tbd_rec_encode(&r, p);
    /* Version 2: version 3 without the token. */
    q[0] = REC_JOB;
    q[1] = 2;
    memcpy(q + 2, p + 2 + REC_TOKEN, n - 2 - REC_TOKEN);
    struct rec b;
    ASSERT(tbd_rec_parse(q, n - REC_TOKEN, &b));
    same(&r, &b);
    /* Version 1: without the node either (it comes from the id). */
    q[1] = 1;
    ASSERT(tbd_rec_parse(q, n - REC_TOKEN - 4, &b));
    same(&r, &b);
}

int main(void)
{
    test_size();
    test_refused();
    test_old_versions();
    test_roundtrip();
    puts("ok");
    return 0;
}
