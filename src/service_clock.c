/* SPDX-License-Identifier: MIT */
/*
 * src/service_clock.c - the timer service's clock choice, deadline windows
 * and statistics layout (declared in src/service_clock.h).
 *
 * Clocks: the service measures time on CLOCK_MONOTONIC (the default) or
 * CLOCK_BOOTTIME. A condition variable can only wait on CLOCK_MONOTONIC
 * (or CLOCK_REALTIME), and CLOCK_MONOTONIC stops during a suspend while
 * CLOCK_BOOTTIME does not: a wait computed from a BOOTTIME deadline would
 * oversleep by the time the machine was suspended. So on BOOTTIME the
 * timer thread waits at most TW__SVC_WAIT_CAP_NS and then re-reads its
 * clock.
 */
#define _POSIX_C_SOURCE 200809L

#include "service_clock.h"

#include <string.h>

int tw__svc_clock_id(int32_t cfg_id, clockid_t *out)
{
    /* 0 is the default: CLOCK_REALTIME, 0 on Linux, cannot be asked for
     * (a wall clock that is set would move every deadline). */
    if (cfg_id == 0 || cfg_id == (int32_t)CLOCK_MONOTONIC) {
        *out = CLOCK_MONOTONIC;
        return 0;
    }
#ifdef CLOCK_BOOTTIME
    if (cfg_id == (int32_t)CLOCK_BOOTTIME) {
        *out = CLOCK_BOOTTIME;
        return 0;
    }
#endif
    return TW_EINVAL;
}

uint64_t tw__svc_wait_ns(clockid_t id, uint64_t left_ns)
{
    if (id != CLOCK_MONOTONIC && left_ns > TW__SVC_WAIT_CAP_NS)
        return TW__SVC_WAIT_CAP_NS;
    return left_ns;
}

void tw__svc_window(uint64_t tick_ns, uint64_t due_ns, uint64_t width_ns,
                    uint64_t *first, uint64_t *last)
{
    uint64_t f = due_ns / tick_ns + (due_ns % tick_ns != 0);
    uint64_t end =
        width_ns >= UINT64_MAX - due_ns ? UINT64_MAX : due_ns + width_ns;
    uint64_t l = end / tick_ns;
    *first = f;
    *last = l > f ? l : f;
}

void tw__svc_stats_out(tw_service_stats *out, size_t out_size,
                       const tw_service_stats *full)
{
    size_t n = out_size < sizeof *full ? out_size : sizeof *full;
    memcpy(out, full, n);
    if (out_size > n)
        memset((char *)out + n, 0, out_size - n);
}
