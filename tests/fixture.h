/* SPDX-License-Identifier: MIT */
/*
 * tests/fixture.h - what the service tests (and bench_service) share: time
 * units, a virtual clock, real-time helpers, and the scale of real-time
 * cases under sanitizers and valgrind. Include after defining
 * _POSIX_C_SOURCE (or _GNU_SOURCE).
 */
#ifndef TWHEEL_TEST_FIXTURE_H
#define TWHEEL_TEST_FIXTURE_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define US UINT64_C(1000)
#define MS UINT64_C(1000000)
#define SEC UINT64_C(1000000000)

/* ------------------------------------------------------------------------ */
/* The virtual clock: a service created with tw_service_config.clock =
 * vclock reads vnow, which the test moves (then tw__service_sync() lets the
 * timer thread see it). vnow starts at VCLOCK_START, 1000 s unless the test
 * defines it before including this header. */

#ifndef VCLOCK_START
#define VCLOCK_START (UINT64_C(1000) * SEC)
#endif

static _Atomic uint64_t vnow __attribute__((unused)) = VCLOCK_START;

static inline uint64_t vclock(void *ctx)
{
    (void)ctx;
    return atomic_load(&vnow);
}

/* ------------------------------------------------------------------------ */
/* Real time. */

/* CLOCK_MONOTONIC in nanoseconds. */
static inline uint64_t mono_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

/* Sleep @ns, resuming after signals. */
static inline void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / SEC), (long)(ns % SEC)};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

static inline void sleep_us(uint64_t us)
{
    sleep_ns(us * US);
}

static inline void sleep_ms(uint64_t ms)
{
    sleep_ns(ms * MS);
}

/* Built with a sanitizer: real-time cases shrink their load. */
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
#define TW_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer) || __has_feature(address_sanitizer)
#define TW_SANITIZED 1
#endif
#endif
#ifndef TW_SANITIZED
#define TW_SANITIZED 0
#endif

/* Under valgrind (scripts/test.d/60-valgrind.sh: one core, ~30-50x
 * slower) the timed cases shrink: fewer tasks, shorter races. */
static inline bool under_valgrind(void)
{
    const char *p = getenv("LD_PRELOAD");
    return p != NULL && strstr(p, "vgpreload") != NULL;
}

/* In main(argc, argv): run test @fn if no test is named on the command
 * line, or if it is one of them. */
#define RUN_SELECTED(fn)                                                       \
    do {                                                                       \
        bool any_ = argc < 2;                                                  \
        for (int i_ = 1; i_ < argc; i_++)                                      \
            any_ = any_ || strcmp(argv[i_], #fn) == 0;                         \
        if (any_)                                                              \
            RUN_TEST(fn);                                                      \
    } while (0)

#endif
