/* SPDX-License-Identifier: MIT */
/*
 * src/service_clock.h - the timer service's clock choice, deadline windows
 * and statistics layout (src/service_clock.c): pure helpers that need no
 * service state.
 */
#ifndef TWHEEL_SERVICE_CLOCK_H
#define TWHEEL_SERVICE_CLOCK_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "clock.h"
#include "twheel/service.h"

/* The clock tw_service_config.clock_id selects: 0 on success (*@out is
 * CLOCK_MONOTONIC or CLOCK_BOOTTIME), TW_EINVAL for any other value. */
int tw__svc_clock_id(int32_t cfg_id, clockid_t *out);

/* How long the timer thread may wait on CLOCK_MONOTONIC (its condition
 * variable's clock) for a deadline @left_ns away on clock @id: all of it
 * on CLOCK_MONOTONIC itself, at most TW__SVC_WAIT_CAP_NS on a clock that
 * runs on during a suspend, so that a deadline passed while the machine
 * slept is seen soon after it wakes. */
#define TW__SVC_WAIT_CAP_NS UINT64_C(1000000000)
uint64_t tw__svc_wait_ns(clockid_t id, uint64_t left_ns);

/* The ticks of a window: the task is due @due_ns (relative, never
 * UINT64_MAX) and may run until @width_ns later. *@first is the first tick
 * at or after @due_ns, *@last the last tick at or before @due_ns +
 * @width_ns (saturating), or *@first when the window holds no tick
 * boundary after *@first. */
void tw__svc_window(uint64_t tick_ns, uint64_t due_ns, uint64_t width_ns,
                    uint64_t *first, uint64_t *last);

/* Copy the counters @full into the caller's struct @out of @out_size
 * bytes (at least the 0.1 struct): the fields that fit, zero past them. */
void tw__svc_stats_out(tw_service_stats *out, size_t out_size,
                       const tw_service_stats *full);

#endif
