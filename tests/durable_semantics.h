/* SPDX-License-Identifier: MIT */
/*
 * tests/durable_semantics.h - the rules of twheel/durable.h that every
 * backend must meet, as one suite run once per backend.
 */
#ifndef TWHEEL_DURABLE_SEMANTICS_H
#define TWHEEL_DURABLE_SEMANTICS_H

#include "twheel/durable.h"

/* A backend under test: how to point a config at a fresh, empty store. */
typedef struct tw_sem_backend {
    const char *name; /* "journal", "redis": printed */
    /* Fill the backend's fields of @cfg (dir, or redis and its namespace)
     * for the store called @store; the same @store names the same store
     * across opens. Strings must outlive the suite. */
    void (*setup)(tw_durable_config *cfg, const char *store, void *arg);
    void *arg;
    unsigned known; /* TW_SEM_KNOWN_*: rules this backend meets differently */
} tw_sem_backend;

/*
 * Known difference (the Redis backend): a delivery's completion reaches the
 * store up to DONE_DELAY_MS (500 ms, src/redis_fire.c; of cfg.mono_ns
 * when injected) after its callback returned and stats.fired counted it.
 * Until then tw_durable_cancel() of that key returns 0 (and counts as
 * cancelled) instead of TW_ENOENT, and stats.pending still counts it. The
 * suite checks that this is what happens, and that the strict rule holds
 * once the clock has moved past the delay.
 */
#define TW_SEM_KNOWN_DONE_LAG 1u

/* Run every rule against @b; aborts on the first failure, returns 0. */
int tw_sem_run(const tw_sem_backend *b);

#endif
