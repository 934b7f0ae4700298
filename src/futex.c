/* SPDX-License-Identifier: MIT */
/*
 * futex.c - the futex word of src/futex.h: a sleeper counts itself before
 * FUTEX_WAIT, so a bump makes the FUTEX_WAKE system call only when some
 * thread may sleep.
 */
#define _GNU_SOURCE

#include "futex.h"

#include <limits.h>
#include <linux/futex.h>
#include <stddef.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

void tw__futex_wait(jr_futex *f, unsigned val)
{
    atomic_fetch_add(&f->sleepers, 1);
    (void)syscall(SYS_futex, (unsigned *)&f->word, FUTEX_WAIT_PRIVATE, val,
                  NULL, NULL, 0);
    atomic_fetch_sub(&f->sleepers, 1);
}

void tw__futex_wait_until(jr_futex *f, unsigned val, uint64_t until_ns)
{
    struct timespec ts = {.tv_sec = (time_t)(until_ns / 1000000000u),
                          .tv_nsec = (long)(until_ns % 1000000000u)};
    atomic_fetch_add(&f->sleepers, 1);
    /* WAIT_BITSET takes an absolute CLOCK_MONOTONIC time. */
    (void)syscall(SYS_futex, (unsigned *)&f->word, FUTEX_WAIT_BITSET_PRIVATE,
                  val, &ts, NULL, FUTEX_BITSET_MATCH_ANY);
    atomic_fetch_sub(&f->sleepers, 1);
}

void tw__futex_bump(jr_futex *f)
{
    /* A sleeper counted after this load read the word after the add, so
     * it does not sleep: the wake is needed only for those counted. */
    atomic_fetch_add(&f->word, 1);
    if (atomic_load(&f->sleepers))
        (void)syscall(SYS_futex, (unsigned *)&f->word, FUTEX_WAKE_PRIVATE,
                      INT_MAX, NULL, NULL, 0);
}
