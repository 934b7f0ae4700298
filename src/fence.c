/* SPDX-License-Identifier: MIT */
/*
 * src/fence.c - the heavy side of the asymmetric barrier (src/fence.h).
 */
#define _GNU_SOURCE

#include "fence.h"

#include <stdlib.h>

#if defined(__linux__)
#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#ifdef TW_TEST_HOOKS
void (*tw__fence_heavy_hook)(void);
#endif

bool tw__fence_ready(void)
{
#ifdef TW_TEST_HOOKS
    if (getenv("TW_TEST_FENCE_OFF") != NULL)
        return false;
#endif
#if defined(__linux__) && defined(SYS_membarrier)
    long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
    if (cmds < 0 || !(cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED))
        return false;
    /* Registered, and one barrier taken, so that a filter that would
     * refuse the barrier itself is found here and not later. */
    return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0,
                   0) == 0 &&
           syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
#else
    return false;
#endif
}

void tw__fence_heavy(void)
{
#ifdef TW_TEST_HOOKS
    void (*hook)(void) = tw__fence_heavy_hook;
    if (hook != NULL)
        hook();
#endif
#if defined(__linux__) && defined(SYS_membarrier)
    /* Its errors (EINVAL, ENOSYS, EPERM: not registered) cannot happen
     * after tw__fence_ready() said true; going on without the barrier
     * would lose wake-ups silently. */
    if (syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) != 0)
        abort();
#else
    abort();
#endif
}
