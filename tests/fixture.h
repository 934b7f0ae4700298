/* SPDX-License-Identifier: MIT */
/*
 * tests/fixture.h - what the service tests (and bench_service) share: time
 * units, a virtual clock and a service on it, real-time helpers, and the
 * scale of real-time cases under sanitizers and valgrind. Include after
 * defining _POSIX_C_SOURCE (or _GNU_SOURCE).
 */
#ifndef TWHEEL_TEST_FIXTURE_H
#define TWHEEL_TEST_FIXTURE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock_fixture.h"
#include "test.h"
#include "twheel/service.h"

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

/* A started service on the virtual clock, which is set to VCLOCK_START;
 * @cfg (NULL: the defaults) gets vclock as its clock. */
static inline tw_service *vclock_service(tw_service_config *cfg)
{
    tw_service_config def = {0};
    if (cfg == NULL)
        cfg = &def;
    atomic_store(&vnow, VCLOCK_START);
    cfg->clock = vclock;
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, cfg), 0);
    ASSERT_EQ(tw_service_start(s), 0);
    return s;
}

/* ------------------------------------------------------------------------ */
/* Tasks the tests schedule. */

/* blocking_task: blocks until blocked.release is set; blocked.running
 * counts the runs that started. */
static struct {
    _Atomic int running;
    _Atomic bool release;
} blocked __attribute__((unused));

static inline void blocked_reset(void)
{
    atomic_store(&blocked.running, 0);
    atomic_store(&blocked.release, false);
}

static inline void blocking_task(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
    atomic_fetch_add(&blocked.running, 1);
    while (!atomic_load(&blocked.release))
        sleep_ns(100000);
}

/* runs_task(@arg = struct runs *): counts its runs and notes the thread and
 * the virtual time (since VCLOCK_START) of the last. */
struct runs {
    _Atomic int n;
    _Atomic uint64_t at;
    pthread_t thread;
};

static inline void runs_task(tw_id id, void *arg)
{
    (void)id;
    struct runs *r = arg;
    r->thread = pthread_self();
    atomic_store(&r->at, atomic_load(&vnow) - VCLOCK_START);
    atomic_fetch_add(&r->n, 1);
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
