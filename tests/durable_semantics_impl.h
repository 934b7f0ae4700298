/* SPDX-License-Identifier: MIT */
/*
 * tests/durable_semantics_impl.h - what the files of the shared semantic
 * suite share: tests/durable_semantics.c keeps the injected clock, the
 * recording callback and the store helpers; the rules of a feature may
 * live in a file of their own (tests/durable_semantics_cas.c) that uses
 * them through these names and is run by tw_sem_run().
 */
#ifndef TWHEEL_DURABLE_SEMANTICS_IMPL_H
#define TWHEEL_DURABLE_SEMANTICS_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "durable_semantics.h"

/* The backend under test. */
const tw_sem_backend *sem_backend(void);
/* The injected wall clock (ms), and a step of both clocks by @ms. */
int64_t sem_now(void);
void sem_advance(int64_t ms);
void sem_sleep_ms(int ms);
/* A fresh store for one test, and the same store again. */
tw_durable *sem_open_new(void);
tw_durable *sem_reopen(void);
/* Deliveries of @key so far, and the payload of its last one (a string;
 * a payload holds no NUL in the suite). */
uint32_t sem_count(const char *key);
/* Print @key's deliveries (attempt, due time, clock at the callback). */
void sem_dump(const char *key);
void sem_last_payload(const char *key, char *out, size_t len);
/* Wait in real time until @key was delivered @n times (fails after the
 * suite's limit). */
void sem_wait_count(const char *key, uint32_t n);
/* Two sentinel timers due now, delivered one after the other: every timer
 * due by now has had its chance to fire. */
void sem_settle(tw_durable *d);
/* The completions of delivered timers are in the store (see
 * TW_SEM_KNOWN_DONE_LAG) and stats.pending is @want_pending. */
void sem_done_flush(tw_durable *d, uint64_t want_pending);
/* Wait until stats.fired reaches @n. */
void sem_wait_fired(tw_durable *d, uint64_t n);
tw_durable_stats sem_stats(tw_durable *d);
/* A payload "B" holds its callback until sem_unblock(): clear both
 * marks, wait for a callback to be held. */
void sem_block_reset(void);
void sem_wait_blocked(void);
void sem_unblock(void);
/* Deliveries that began before their due time. */
int sem_early(void);

/* The rules of conditional writes (tests/durable_semantics_cas.c). */
void sem_test_cas_single(void);
void sem_test_cas_many(void);
void sem_test_cas_fire_race(void);
void sem_test_cas_threads(void);

#endif
