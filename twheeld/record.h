/* SPDX-License-Identifier: MIT */
/*
 * record.h - the records twheeld keeps in the store (record.c): a job
 * record "j<id>", the high-water mark of ids "m" ("m<node>"), and with
 * --redis a liveness record "n<node>". A pure codec: no server state,
 * so fuzz/fuzz_twheeld_record.c runs it alone.
 */
#ifndef TWHEELD_RECORD_H
#define TWHEELD_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Version 3 of a job record has a write token after its version byte:
 * 8 bytes, new at every write, so that the record's first REC_FENCE_LEN
 * bytes name one write of it and no other (a conditional write expects
 * them: tw_durable_schedule_if()). Version 2 ends with the node (--node)
 * of the server that holds the job; versions 1 (without it) and 2 are
 * still read. Version 4 (REC_COMPACT) is what a server on the journal
 * (-b) writes: the same fields in variable-length integers, without the
 * write token (nothing fences writes on the journal: --redis writes
 * version 3); see tbd_rec_encode_compact(). Marks and liveness records
 * keep their layout. */
enum {
    REC_JOB = 'J',
    REC_MARK = 'M',
    REC_LIVE = 'L',
    REC_VERSION = 3,
    REC_COMPACT = 4
};

/* A job record's fixed part before version 3: the head, the tube name's
 * length byte and the body's length (the owner adds 4 more). */
#define REC_HEAD (3 + 4 * 3 + 8 * 3 + 4 * 5 + 1 + 4)
#define REC_TOKEN 8                   /* the write token (version 3) */
#define REC_FENCE_LEN (2 + REC_TOKEN) /* "J", version, token */
#define MARK_LEN 10                   /* a high-water mark record */
#define LIVE_LEN 14                   /* a liveness record */
#define REC_STATE_MAX 3 /* the job states are 0 (ready) to 3 (buried) */
#define NODE_SHIFT 40   /* --node N: ids N * 2^40 + 1 ... (< 2^53) */

_Static_assert(REC_TOKEN == 8 && REC_TOKEN == sizeof(uint64_t),
               "the write token is 8 bytes, a uint64_t");

/* A job record read back from the store (tbd_job_write()'s layout). */
struct rec {
    int state;
    uint32_t pri, ttr, delay, body_len;
    uint32_t cnt[5]; /* reserves, timeouts, releases, buries, kicks */
    uint32_t owner;  /* --node of the server that holds it */
    uint64_t token;  /* the write token; 0 in records before version 3 */
    uint64_t id;
    int64_t due, created;
    const char *tube;
    size_t tube_len;
    const unsigned char *body;
};

/* The latest wall-clock time a job record may hold (Unix ms, about the
 * year 285,000): what tbd_job_write() writes is far below, and arithmetic on
 * anything below it cannot overflow. */
#define REC_TIME_MAX (INT64_C(1) << 53)

/* The bytes of a job record with a tube name of @tube_len bytes and a
 * body of @body_len: version 3's, and at most that in version 4 (its
 * largest integers take as many bytes as version 3's, see record.c). */
static inline size_t tbd_rec_size(size_t tube_len, uint32_t body_len)
{
    return REC_HEAD + REC_TOKEN + tube_len + body_len + 4;
}

void tbd_put_u32(unsigned char **p, uint32_t v);
void tbd_put_u64(unsigned char **p, uint64_t v);
uint32_t tbd_get_u32(const unsigned char *p);
uint64_t tbd_get_u64(const unsigned char *p);
int64_t tbd_key_num(const char *s, size_t len, uint64_t max);
uint64_t tbd_key_id(const char *key, size_t len);
bool tbd_rec_parse(const unsigned char *p, size_t n, struct rec *r);
void tbd_rec_encode(const struct rec *r, unsigned char *p);
size_t tbd_rec_encode_compact(const struct rec *r, unsigned char *p);
void tbd_mark_encode(unsigned char *p, uint64_t mark);
void tbd_live_encode(unsigned char *p, uint32_t node, int64_t due);
bool tbd_live_parse(const char *key, size_t key_len, const unsigned char *p,
                    size_t n, int64_t due_max, uint32_t *node, int64_t *due);

#endif
