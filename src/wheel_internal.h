/* SPDX-License-Identifier: MIT */
/*
 * src/wheel_internal.h - what the core wheel (src/wheel.c) offers the rest
 * of the library and the tests beyond twheel/wheel.h: the invariant
 * checkers the tests and the fuzzer run after each step, and the seam the
 * service builds on (one fire function for every timer of a wheel, so
 * that the service may keep its own data in a timer's tw__fn).
 *
 * src/wheel.c declares the same functions itself and does not include
 * this header, so that wheel.h + wheel.c stay copy-embeddable (STYLE.md);
 * keep the two in step. Nothing here is public API; names carry the tw__
 * prefix.
 */
#ifndef TWHEEL_WHEEL_INTERNAL_H
#define TWHEEL_WHEEL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "twheel/wheel.h"

#if UINTPTR_MAX == UINT64_MAX
_Static_assert(sizeof(tw_timer) == 40, "a timer is 40 bytes on LP64");
#endif

/* Core wheel invariant checkers: 0 when consistent, else the source line
 * of the first broken rule. tw__wheel_check is O(timers + occupied slots),
 * tw__wheel_check_full also scans every slot and bitmap word. */
int tw__wheel_check(const tw_wheel *w);
int tw__wheel_check_full(const tw_wheel *w);
/* Slots marked occupied whose lists are all empty: left so by
 * tw_wheel_cancel_inline() until tw_wheel_advance() visits them. */
size_t tw__wheel_stale_slots(const tw_wheel *w);

/* Make @w call @fire(t, @arg) for every timer it runs, instead of each
 * timer's own function: the wheel then never reads a timer's tw__fn, and
 * a user of the wheel (the service) may keep other data in its place.
 * Call before the first add. */
void tw__wheel_set_fire(tw_wheel *w, tw_timer_fn fire, void *arg);
/* tw_wheel_add() and tw_wheel_add_window() for such a wheel: @w and @t
 * valid (latest >= earliest), and @t's tw__fn is not read. */
int tw__wheel_add_any(tw_wheel *w, tw_timer *t, uint64_t expires);
int tw__wheel_add_window_any(tw_wheel *w, tw_timer *t, uint64_t earliest,
                             uint64_t latest);

#endif
