/* SPDX-License-Identifier: MIT */
/*
 * src/fence.h - an asymmetric full barrier: a side that runs often orders
 * its store before its load with a compiler barrier only, and the side
 * that runs seldom makes every running thread of the process execute a
 * full barrier (Linux membarrier(2), MEMBARRIER_CMD_PRIVATE_EXPEDITED).
 *
 * The pattern it serves (store buffering, "Dekker"):
 *   often:  store A; tw__fence_light(); load B
 *   seldom: store B; tw__fence_heavy(); load A
 * At least one of the two loads sees the other side's store, as with a
 * full barrier on both sides. tw__fence_heavy() costs a system call and
 * an interrupt of each CPU that runs one of the process's threads (a few
 * microseconds); tw__fence_light() costs nothing at run time.
 */
#ifndef TWHEEL_FENCE_H
#define TWHEEL_FENCE_H

#include <stdatomic.h>
#include <stdbool.h>

/* Register the process for tw__fence_heavy() (idempotent, thread-safe:
 * the kernel keeps the registration). False when the kernel does not
 * offer it (not Linux, older than 4.14, or a seccomp filter that refuses
 * it): the caller then keeps full barriers on both sides. In the test
 * build of the library, also false while the environment has
 * TW_TEST_FENCE_OFF set (to test that fallback). */
bool tw__fence_ready(void);

/* The seldom side's barrier; only after tw__fence_ready() said true. */
void tw__fence_heavy(void);

/* The often side's barrier: the compiler does not move memory accesses
 * across it; the hardware order comes from tw__fence_heavy(). */
static inline void tw__fence_light(void)
{
    atomic_signal_fence(memory_order_seq_cst);
}

#ifdef TW_TEST_HOOKS
/* Called when tw__fence_heavy() is about to make the other threads
 * execute a full barrier (test build only). */
extern void (*tw__fence_heavy_hook)(void);
#endif

#endif
