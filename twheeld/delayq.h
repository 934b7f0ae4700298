/* SPDX-License-Identifier: MIT */
/*
 * delayq.h - the delayed jobs a server holds, found by id and by due time.
 *
 * Every delayed job of twheeld has one entry here: its id, its due time
 * and the queue (one per tube) that orders it by (due, id). That is what
 * lets a command find a delayed job at once whatever the store is doing,
 * and what peek-delayed and kick read in due order. With a store (-b,
 * --redis) the entry is all that memory holds of a delayed job (the body
 * and the rest of its record stay in the store), so it is compact:
 *
 *   entry        24 bytes (id, due, queue, place in the queue's heap),
 *                in chunks of 4,096, a free list through them
 *   id table     4-byte slots (entry number + 1), linear probing with
 *                backward-shift deletion, at most 3/4 full:
 *                5.3 to 10.7 bytes an entry
 *   queue heap   4-byte entry numbers, capacity doubled and halved:
 *                4 to 16 bytes an entry
 *
 * about 33 to 51 bytes a delayed job (24 + 5.3 + 4 to 24 + 10.7 + 16).
 * A pure unit: no globals, no clock, no server structures; every call is
 * O(1) but add/remove (O(log n) in the job's queue) and the growth of a
 * table (amortized O(1)).
 */
#ifndef TWHEELD_DELAYQ_H
#define TWHEELD_DELAYQ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct tbd_dq;

/* A new, empty index into *@out. Returns 0 or TW_ENOMEM. */
int tbd_dq_new(struct tbd_dq **out);

/* Frees @dq and every entry. NULL is accepted. */
void tbd_dq_free(struct tbd_dq *dq);

/* A new, empty queue (for a tube); its number into *@qno. Returns 0 or
 * TW_ENOMEM. Numbers of freed queues are reused. */
int tbd_dq_queue_new(struct tbd_dq *dq, uint32_t *qno);

/* Frees queue @qno, which must be empty. */
void tbd_dq_queue_free(struct tbd_dq *dq, uint32_t qno);

/* Adds job @id due at @due to queue @qno. Returns 0, TW_EINVAL if @id is
 * 0 or already held (nothing changed), or TW_ENOMEM (nothing changed). */
int tbd_dq_add(struct tbd_dq *dq, uint32_t qno, uint64_t id, int64_t due);

/* True when @dq holds @id; its queue and due time into *@qno and *@due
 * (either may be NULL). */
bool tbd_dq_get(const struct tbd_dq *dq, uint64_t id, uint32_t *qno,
                int64_t *due);

/* Removes @id; false if it was not held. */
bool tbd_dq_remove(struct tbd_dq *dq, uint64_t id);

/* The first job of queue @qno by (due, id) into *@id and *@due; false
 * when the queue is empty. */
bool tbd_dq_first(const struct tbd_dq *dq, uint32_t qno, uint64_t *id,
                  int64_t *due);

/* The jobs in queue @qno, and in all queues. */
uint64_t tbd_dq_count(const struct tbd_dq *dq, uint32_t qno);
uint64_t tbd_dq_total(const struct tbd_dq *dq);

/* The bytes @dq has allocated (entries, id table, queues). */
size_t tbd_dq_bytes(const struct tbd_dq *dq);

/* Checks every invariant (tests): the id table finds every entry, each
 * heap is ordered and each entry knows its place. */
bool tbd_dq_check(const struct tbd_dq *dq);

#endif
