/*
 * src/internal.h - declarations shared by twheel's sources and its tests.
 * Nothing here is public API; names carry the tw__ prefix.
 */
#ifndef TWHEEL_INTERNAL_H
#define TWHEEL_INTERNAL_H

#include "twheel/wheel.h"

/* Core wheel invariant checkers: 0 when consistent, else the source line
 * of the first broken rule. tw__wheel_check is O(timers + occupied slots),
 * tw__wheel_check_full also scans every slot and bitmap word. */
int tw__wheel_check(const tw_wheel *w);
int tw__wheel_check_full(const tw_wheel *w);

/* Service test hooks (src/service.c). tw__service_kick: an injected
 * spurious wake-up of the timer thread (counted in stats.wakeups).
 * tw__service_node_size: bytes of one pending task's record. */
struct tw_service;
void tw__service_kick(struct tw_service *s);
size_t tw__service_node_size(void);

#endif
