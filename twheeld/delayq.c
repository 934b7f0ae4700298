/* SPDX-License-Identifier: MIT */
/*
 * delayq.c - the delayed jobs a server holds, by id and by due time (the
 * layout and its cost per job are in delayq.h).
 *
 * Entries are numbered 0, 1, ... and live in chunks that never move, so
 * a number stays valid while the tables around it grow. The id table
 * holds numbers + 1 (0 is an empty slot) and is probed linearly from the
 * id's multiplicative hash; a removal shifts the probe run back instead
 * of leaving a tombstone, so lookups never slow down with churn. Each
 * queue is a binary min-heap of numbers by (due, id), and each entry
 * keeps its place in its heap so that a removal by id is O(log n).
 */
#include "delayq.h"

#include "twheel/wheel.h"

#include <stdlib.h>
#include <string.h>

#define CHUNK_BITS 12
#define CHUNK (1u << CHUNK_BITS)
#define NONE UINT32_MAX

struct entry {
    uint64_t id; /* 0: free */
    int64_t due;
    uint32_t qno;
    uint32_t at; /* place in its queue's heap; next free when free */
};

struct queue {
    uint32_t *heap; /* entry numbers */
    uint32_t n, cap;
    bool used;
};

struct tbd_dq {
    struct entry **chunks;
    uint32_t nchunks, chunks_cap;
    uint32_t nentries; /* numbers handed out so far */
    uint32_t free_head;
    uint32_t *slots; /* entry number + 1, or 0 */
    uint32_t slots_bits;
    uint64_t total;
    struct queue *queues;
    uint32_t nqueues;
};

/* The sizes delayq.h adds up to the cost of a delayed job. */
_Static_assert(sizeof(struct entry) == 24, "an entry is 24 bytes");
_Static_assert(sizeof(*((struct tbd_dq *)0)->slots) == 4,
               "an id table slot is 4 bytes");
_Static_assert(sizeof(*((struct queue *)0)->heap) == 4,
               "a queue heap's entry number is 4 bytes");

static struct entry *ent(const struct tbd_dq *dq, uint32_t e)
{
    return &dq->chunks[e >> CHUNK_BITS][e & (CHUNK - 1)];
}

static size_t slot_of(uint64_t id, uint32_t bits)
{
    return (size_t)((id * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - bits));
}

int tbd_dq_new(struct tbd_dq **out)
{
    struct tbd_dq *dq = calloc(1, sizeof(*dq));
    if (!dq)
        return TW_ENOMEM;
    dq->slots_bits = 4;
    dq->slots = calloc((size_t)1 << dq->slots_bits, sizeof(*dq->slots));
    if (!dq->slots) {
        free(dq);
        return TW_ENOMEM;
    }
    dq->free_head = NONE;
    *out = dq;
    return 0;
}

void tbd_dq_free(struct tbd_dq *dq)
{
    if (!dq)
        return;
    for (uint32_t i = 0; i < dq->nchunks; i++)
        free(dq->chunks[i]);
    for (uint32_t i = 0; i < dq->nqueues; i++)
        free(dq->queues[i].heap);
    free(dq->chunks);
    free(dq->slots);
    free(dq->queues);
    free(dq);
}

int tbd_dq_queue_new(struct tbd_dq *dq, uint32_t *qno)
{
    for (uint32_t i = 0; i < dq->nqueues; i++) {
        if (!dq->queues[i].used) {
            dq->queues[i].used = true;
            *qno = i;
            return 0;
        }
    }
    struct queue *q =
        realloc(dq->queues, ((size_t)dq->nqueues + 1) * sizeof(*q));
    if (!q)
        return TW_ENOMEM;
    dq->queues = q;
    memset(&q[dq->nqueues], 0, sizeof(*q));
    q[dq->nqueues].used = true;
    *qno = dq->nqueues++;
    return 0;
}

void tbd_dq_queue_free(struct tbd_dq *dq, uint32_t qno)
{
    struct queue *q = &dq->queues[qno];
    free(q->heap);
    memset(q, 0, sizeof(*q));
}

/* ---- the id table ---- */

/* The slot that holds @id, or the empty slot where its run ends. */
static size_t slot_find(const struct tbd_dq *dq, uint64_t id)
{
    size_t mask = ((size_t)1 << dq->slots_bits) - 1;
    size_t i = slot_of(id, dq->slots_bits);
    while (dq->slots[i] && ent(dq, dq->slots[i] - 1)->id != id)
        i = (i + 1) & mask;
    return i;
}

static int slots_grow(struct tbd_dq *dq)
{
    uint32_t bits = dq->slots_bits + 1;
    uint32_t *ns = calloc((size_t)1 << bits, sizeof(*ns));
    if (!ns)
        return TW_ENOMEM;
    size_t mask = ((size_t)1 << bits) - 1;
    for (size_t i = 0; i < ((size_t)1 << dq->slots_bits); i++) {
        uint32_t v = dq->slots[i];
        if (!v)
            continue;
        size_t k = slot_of(ent(dq, v - 1)->id, bits);
        while (ns[k])
            k = (k + 1) & mask;
        ns[k] = v;
    }
    free(dq->slots);
    dq->slots = ns;
    dq->slots_bits = bits;
    return 0;
}

/* Empties slot @i, shifting back the entries of its probe run that
 * would no longer be found past the hole. */
static void slot_clear(struct tbd_dq *dq, size_t i)
{
    size_t mask = ((size_t)1 << dq->slots_bits) - 1;
    size_t hole = i;
    for (size_t k = (i + 1) & mask; dq->slots[k]; k = (k + 1) & mask) {
        size_t home = slot_of(ent(dq, dq->slots[k] - 1)->id, dq->slots_bits);
        /* The entry at k may move to the hole when its home is not in
         * (hole, k], cyclically. */
        bool stays =
            hole <= k ? (home > hole && home <= k) : (home > hole || home <= k);
        if (!stays) {
            dq->slots[hole] = dq->slots[k];
            hole = k;
        }
    }
    dq->slots[hole] = 0;
}

/* ---- entries ---- */

static int entry_new(struct tbd_dq *dq, uint32_t *e)
{
    if (dq->free_head != NONE) {
        *e = dq->free_head;
        dq->free_head = ent(dq, *e)->at;
        return 0;
    }
    if (dq->nentries == NONE - 1)
        return TW_ENOMEM;
    if ((dq->nentries & (CHUNK - 1)) == 0) {
        uint32_t c = dq->nentries >> CHUNK_BITS;
        if (c == dq->chunks_cap) {
            uint32_t ncap = dq->chunks_cap ? 2 * dq->chunks_cap : 16;
            struct entry **nc = realloc(dq->chunks, (size_t)ncap * sizeof(*nc));
            if (!nc)
                return TW_ENOMEM;
            dq->chunks = nc;
            dq->chunks_cap = ncap;
        }
        dq->chunks[c] = malloc(CHUNK * sizeof(struct entry));
        if (!dq->chunks[c])
            return TW_ENOMEM;
        dq->nchunks++;
    }
    *e = dq->nentries++;
    return 0;
}

static void entry_put_back(struct tbd_dq *dq, uint32_t e)
{
    struct entry *x = ent(dq, e);
    x->id = 0;
    x->at = dq->free_head;
    dq->free_head = e;
}

/* ---- queues: binary min-heaps by (due, id) ---- */

static bool before(const struct tbd_dq *dq, uint32_t a, uint32_t b)
{
    const struct entry *x = ent(dq, a), *y = ent(dq, b);
    return x->due < y->due || (x->due == y->due && x->id < y->id);
}

static void heap_set(struct tbd_dq *dq, struct queue *q, uint32_t i, uint32_t e)
{
    q->heap[i] = e;
    ent(dq, e)->at = i;
}

static void sift_up(struct tbd_dq *dq, struct queue *q, uint32_t i)
{
    uint32_t e = q->heap[i];
    while (i > 0) {
        uint32_t p = (i - 1) / 2;
        if (!before(dq, e, q->heap[p]))
            break;
        heap_set(dq, q, i, q->heap[p]);
        i = p;
    }
    heap_set(dq, q, i, e);
}

static void sift_down(struct tbd_dq *dq, struct queue *q, uint32_t i)
{
    uint32_t e = q->heap[i];
    for (;;) {
        uint32_t l = 2 * i + 1, best = l;
        if (l >= q->n)
            break;
        if (l + 1 < q->n && before(dq, q->heap[l + 1], q->heap[l]))
            best = l + 1;
        if (!before(dq, q->heap[best], e))
            break;
        heap_set(dq, q, i, q->heap[best]);
        i = best;
    }
    heap_set(dq, q, i, e);
}

/* Resizes @q's heap to @cap entries (at least its n). */
static int heap_resize(struct queue *q, uint32_t cap)
{
    uint32_t *h = realloc(q->heap, (size_t)(cap ? cap : 1) * sizeof(*h));
    if (!h)
        return TW_ENOMEM;
    q->heap = h;
    q->cap = cap;
    return 0;
}

static void heap_take(struct tbd_dq *dq, struct queue *q, uint32_t i)
{
    uint32_t last = q->heap[--q->n];
    if (i < q->n) {
        heap_set(dq, q, i, last);
        sift_down(dq, q, i);
        sift_up(dq, q, ent(dq, last)->at);
    }
    /* Halve at a quarter full; a failed shrink keeps the larger heap. */
    if (q->cap > 16 && q->n < q->cap / 4)
        (void)heap_resize(q, q->cap / 2);
}

/* ---- the calls ---- */

/* Makes room for one more of everything; nothing changes on failure. */
static int reserve_one(struct tbd_dq *dq, struct queue *q)
{
    if (q->n == q->cap) {
        int rc = heap_resize(q, q->cap ? 2 * q->cap : 8);
        if (rc != 0)
            return rc;
    }
    if ((dq->total + 1) * 4 > ((uint64_t)3 << dq->slots_bits))
        return slots_grow(dq);
    return 0;
}

int tbd_dq_add(struct tbd_dq *dq, uint32_t qno, uint64_t id, int64_t due)
{
    if (id == 0 || qno >= dq->nqueues || !dq->queues[qno].used)
        return TW_EINVAL;
    size_t s = slot_find(dq, id);
    if (dq->slots[s])
        return TW_EINVAL;
    struct queue *q = &dq->queues[qno];
    uint32_t e;
    int rc = reserve_one(dq, q);
    if (rc == 0)
        rc = entry_new(dq, &e);
    if (rc != 0)
        return rc;
    struct entry *x = ent(dq, e);
    x->id = id;
    x->due = due;
    x->qno = qno;
    dq->slots[slot_find(dq, id)] = e + 1; /* the table may have grown */
    q->heap[q->n] = e;
    x->at = q->n++;
    sift_up(dq, q, x->at);
    dq->total++;
    return 0;
}

bool tbd_dq_get(const struct tbd_dq *dq, uint64_t id, uint32_t *qno,
                int64_t *due)
{
    if (id == 0)
        return false;
    uint32_t v = dq->slots[slot_find(dq, id)];
    if (!v)
        return false;
    const struct entry *x = ent(dq, v - 1);
    if (qno)
        *qno = x->qno;
    if (due)
        *due = x->due;
    return true;
}

bool tbd_dq_remove(struct tbd_dq *dq, uint64_t id)
{
    if (id == 0)
        return false;
    size_t s = slot_find(dq, id);
    uint32_t v = dq->slots[s];
    if (!v)
        return false;
    uint32_t e = v - 1;
    struct entry *x = ent(dq, e);
    slot_clear(dq, s);
    heap_take(dq, &dq->queues[x->qno], x->at);
    entry_put_back(dq, e);
    dq->total--;
    return true;
}

bool tbd_dq_first(const struct tbd_dq *dq, uint32_t qno, uint64_t *id,
                  int64_t *due)
{
    const struct queue *q = &dq->queues[qno];
    if (q->n == 0)
        return false;
    const struct entry *x = ent(dq, q->heap[0]);
    *id = x->id;
    *due = x->due;
    return true;
}

uint64_t tbd_dq_count(const struct tbd_dq *dq, uint32_t qno)
{
    return dq->queues[qno].n;
}

uint64_t tbd_dq_total(const struct tbd_dq *dq)
{
    return dq->total;
}

size_t tbd_dq_bytes(const struct tbd_dq *dq)
{
    size_t b = sizeof(*dq) +
               (size_t)dq->nchunks * CHUNK * sizeof(struct entry) +
               (size_t)dq->chunks_cap * sizeof(*dq->chunks) +
               ((size_t)sizeof(*dq->slots) << dq->slots_bits) +
               (size_t)dq->nqueues * sizeof(*dq->queues);
    for (uint32_t i = 0; i < dq->nqueues; i++)
        b += (size_t)dq->queues[i].cap * sizeof(uint32_t);
    return b;
}

static bool queue_check(const struct tbd_dq *dq, uint32_t qno)
{
    const struct queue *q = &dq->queues[qno];
    for (uint32_t i = 0; i < q->n; i++) {
        const struct entry *x = ent(dq, q->heap[i]);
        if (x->id == 0 || x->qno != qno || x->at != i ||
            (i > 0 && before(dq, q->heap[i], q->heap[(i - 1) / 2])) ||
            !tbd_dq_get(dq, x->id, NULL, NULL))
            return false;
    }
    return true;
}

bool tbd_dq_check(const struct tbd_dq *dq)
{
    uint64_t in_queues = 0, in_slots = 0;
    for (uint32_t i = 0; i < dq->nqueues; i++) {
        if (!queue_check(dq, i))
            return false;
        in_queues += dq->queues[i].n;
    }
    for (size_t i = 0; i < ((size_t)1 << dq->slots_bits); i++) {
        uint32_t v = dq->slots[i];
        if (v && (v - 1 >= dq->nentries || ent(dq, v - 1)->id == 0 ||
                  slot_find(dq, ent(dq, v - 1)->id) != i))
            return false;
        in_slots += v != 0;
    }
    return in_queues == dq->total && in_slots == dq->total;
}
