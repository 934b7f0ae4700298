/* SPDX-License-Identifier: MIT */
/*
 * src/futex.h - a futex word that threads sleep on until it changes, with
 * no system call on the wake side when nobody sleeps. The journal's group
 * commit and the durable store's call combiner wait on one (src/futex.c).
 */
#ifndef TWHEEL_FUTEX_H
#define TWHEEL_FUTEX_H

#include <stdatomic.h>
#include <stdint.h>

/* A futex word and how many threads sleep on it. */
typedef struct jr_futex {
    atomic_uint word;
    atomic_int sleepers;
} jr_futex;

/* Sleep while @f's word is @val (or until a signal). */
void tw__futex_wait(jr_futex *f, unsigned val);
/* tw__futex_wait() that also returns once CLOCK_MONOTONIC reaches
 * @until_ns. */
void tw__futex_wait_until(jr_futex *f, unsigned val, uint64_t until_ns);
/* Change @f's word and wake every sleeper (no system call if none). */
void tw__futex_bump(jr_futex *f);

#endif
