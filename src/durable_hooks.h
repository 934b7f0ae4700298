/* SPDX-License-Identifier: MIT */
/*
 * src/durable_hooks.h - the journal backend's seams for the tests: calls
 * that wait for a state or report a size, and (in the test build only) a
 * hook at a point of a listing. Nothing here is public API; names carry
 * the tw__ prefix.
 */
#ifndef TWHEEL_DURABLE_HOOKS_H
#define TWHEEL_DURABLE_HOOKS_H

#include <stddef.h>

struct tw_durable;

/* tw__durable_sync (src/durable_journal_fire.c) returns once the store's
 * thread has run a whole round that began after the call (read the wall
 * clock, fired what is due, compacted) and every callback it started has
 * returned. */
void tw__durable_sync(struct tw_durable *d);
/* Bytes of one pending timer's record with a key of @key_len bytes
 * (src/durable_journal.c). */
size_t tw__durable_entry_size(size_t key_len);
/* The journal key table's bucket count and, while it grows, the previous
 * table's (else 0) (src/durable_journal.c). */
void tw__durable_table(struct tw_durable *d, size_t *nbuckets, size_t *nold);

#ifdef TW_TEST_HOOKS
/* A journal listing that builds the ordered index has let go of the
 * store's lock between two steps of the build
 * (src/durable_journal_query.c). */
extern void (*tw__durable_index_hook)(struct tw_durable *d);
/* A read-only open has listed the journal's segments (@step 0) and has
 * read its MANIFEST (@step 1), no segment yet (src/durable_journal_open.c). */
extern void (*tw__journal_list_hook)(int dirfd, int step);
#endif

#endif
