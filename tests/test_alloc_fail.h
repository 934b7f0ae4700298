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

#endif
