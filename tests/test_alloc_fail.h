/* SPDX-License-Identifier: MIT */
/*
 * tests/test_alloc_fail.h - allocation-failure injection for tests.
 *
 * A test executable linked with
 *   -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=free,
 *   --wrap=aligned_alloc,--wrap=posix_memalign,--wrap=pthread_create
 * (tests/CMakeLists.txt: tw_alloc_fail_test()) routes every allocation made
 * by its own objects and by the static library through the countdown in
 * tests/test_alloc_fail_wrap.c. Allocations made inside the C library
 * itself (pthread_create, stdio) are not seen.
 *
 * The counters are atomic: the service's threads allocate too.
 */
#ifndef TWHEEL_TEST_ALLOC_FAIL_H
#define TWHEEL_TEST_ALLOC_FAIL_H

#include <stdbool.h>

#include "test.h"
#include "twheel/wheel.h"

/*
 * Make the allocation @k calls from now fail (0 = the next one), and with
 * @sticky every one after it too; k < 0 disarms. Resets the call counter.
 */
void tw_af_arm(long k, bool sticky);

/* Disarm: every allocation succeeds again. */
void tw_af_disarm(void);

/* Allocation calls (successful or failed) since the last tw_af_arm(). */
long tw_af_calls(void);

/* Allocation calls that were made to fail since the last tw_af_arm(). */
long tw_af_failures(void);

/* Blocks allocated through the wrapper and not yet freed (leak check). */
long tw_af_live(void);

/* Make the pthread_create() call @k calls from now fail with EAGAIN (0 =
 * the next one); k < 0 disarms. */
void tw_af_arm_threads(long k);

/*
 * Sweep a constructor: call @make(&obj, @ctx) with allocation k failing
 * (only that one, or every one from k on if @sticky), for k = 0, 1, ...
 * until a call meets no failure. Each failed call must return TW_ENOMEM,
 * leave obj as it was and leak nothing, and the same call must then work
 * with memory back. The final object is passed to @use (if not NULL), then
 * to @destroy. Returns how many failure points were swept.
 */
static inline long tw_af_sweep(int (*make)(void **obj, void *ctx),
                               void (*use)(void *obj),
                               void (*destroy)(void *obj), void *ctx,
                               bool sticky)
{
    static char sentinel;
    long live0 = tw_af_live();
    for (long k = 0;; k++) {
        void *obj = &sentinel;
        tw_af_arm(k, sticky);
        int rc = make(&obj, ctx);
        long failed = tw_af_failures();
        tw_af_disarm();
        if (failed == 0) {
            ASSERT_EQ(rc, 0);
            ASSERT_GT(k, 0); /* it does allocate */
            if (use != NULL)
                use(obj);
            destroy(obj);
            ASSERT_EQ(tw_af_live(), live0);
            return k;
        }
        ASSERT_EQ(rc, TW_ENOMEM);
        ASSERT(obj == &sentinel);
        ASSERT_EQ(tw_af_live(), live0);
        ASSERT_EQ(make(&obj, ctx), 0); /* memory is back */
        destroy(obj);
        ASSERT_EQ(tw_af_live(), live0);
    }
}

#endif
