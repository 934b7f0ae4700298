/* SPDX-License-Identifier: MIT */
/*
 * tests/test_allocator.c - tw_set_allocator() sees every allocation and
 * every free of a wheel, a service with tasks (one-shot, periodic, on the
 * timer thread and on executors, record pool grown over several chunks)
 * and a RepeatedTimer; the counts balance to zero at the end. Calls that
 * bypass it are caught: the test is linked with -Wl,--wrap for malloc,
 * calloc, realloc, free, posix_memalign and aligned_alloc, so any direct
 * call from the library's objects (or this file) is counted as a bypass.
 * A NULL function is refused with TW_EINVAL and changes nothing.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "fixture.h"
#include "test.h"
#include "twheel/repeated.h"
#include "twheel/service.h"
#include "twheel/wheel.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t m, size_t n);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t m, size_t n);
void *__wrap_realloc(void *p, size_t n);
void __wrap_free(void *p);
int __wrap_posix_memalign(void **p, size_t a, size_t n);
void *__wrap_aligned_alloc(size_t a, size_t n);

/* Direct calls: not through the custom allocator. */
static atomic_long direct;

void *__wrap_malloc(size_t n)
{
    atomic_fetch_add(&direct, 1);
    return __real_malloc(n);
}

void *__wrap_calloc(size_t m, size_t n)
{
    atomic_fetch_add(&direct, 1);
    return __real_calloc(m, n);
}

void *__wrap_realloc(void *p, size_t n)
{
    atomic_fetch_add(&direct, 1);
    return __real_realloc(p, n);
}

void __wrap_free(void *p)
{
    if (p != NULL)
        atomic_fetch_add(&direct, 1);
    __real_free(p);
}

int __wrap_posix_memalign(void **p, size_t a, size_t n)
{
    atomic_fetch_add(&direct, 1);
    return __real_posix_memalign(p, a, n);
}

void *__wrap_aligned_alloc(size_t a, size_t n)
{
    atomic_fetch_add(&direct, 1);
    return __real_aligned_alloc(a, n);
}

/* The custom allocator: counts, and live blocks (allocs - frees). */
static atomic_long n_alloc, n_free, live;

static void *my_malloc(size_t n)
{
    void *p = __real_malloc(n);
    if (p != NULL) {
        atomic_fetch_add(&n_alloc, 1);
        atomic_fetch_add(&live, 1);
    }
    return p;
}

static void *my_calloc(size_t m, size_t n)
{
    void *p = __real_calloc(m, n);
    if (p != NULL) {
        atomic_fetch_add(&n_alloc, 1);
        atomic_fetch_add(&live, 1);
    }
    return p;
}

static void *my_realloc(void *p, size_t n)
{
    void *q = __real_realloc(p, n);
    if (p == NULL && q != NULL) {
        atomic_fetch_add(&n_alloc, 1);
        atomic_fetch_add(&live, 1);
    }
    return q;
}

static void my_free(void *p)
{
    if (p != NULL) {
        atomic_fetch_add(&n_free, 1);
        atomic_fetch_sub(&live, 1);
    }
    __real_free(p);
}

static void tick(tw_timer *t, void *arg)
{
    (void)t;
    (void)arg;
}

static _Atomic int runs;

static void task(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
    atomic_fetch_add(&runs, 1);
}

static _Atomic int triggers, destroyed;

static void on_trigger(tw_repeated *rt, void *arg)
{
    (void)rt;
    (void)arg;
    atomic_fetch_add(&triggers, 1);
}

static void on_destroy(tw_repeated *rt, void *arg)
{
    (void)rt;
    (void)arg;
    atomic_fetch_add(&destroyed, 1);
}

static void wheel_scenario(void)
{
    tw_wheel *w = NULL;
    static tw_timer t[100];
    ASSERT_EQ(tw_wheel_create(&w, NULL, 0), 0);
    for (int i = 0; i < 100; i++) {
        tw_timer_init(&t[i], tick, NULL);
        ASSERT_EQ(tw_wheel_add(w, &t[i], (uint64_t)i * 7), 0);
    }
    tw_wheel_advance(w, 1000);
    tw_wheel_destroy(w);
}

/* Real time, small delays: bounded waits only. */
static void service_scenario(uint32_t executors)
{
    tw_service_config cfg = {0};
    cfg.executor_threads = executors;
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    /* Over two chunks of records (4096 each), far in the future. */
    static tw_id ids[9000];
    for (int i = 0; i < 9000; i++)
        ASSERT_EQ(tw_schedule(s, task, NULL, 3600 * SEC, &ids[i]), 0);
    for (int i = 0; i < 9000; i += 2)
        ASSERT(tw_cancel(s, ids[i]));
    atomic_store(&runs, 0);
    for (int i = 0; i < 50; i++)
        ASSERT_EQ(tw_schedule(s, task, NULL, 0, NULL), 0);
    tw_id rate = 0, delay = 0;
    ASSERT_EQ(tw_schedule_fixed_rate(s, task, NULL, 0, MS, &rate), 0);
    ASSERT_EQ(tw_schedule_fixed_delay(s, task, NULL, 0, MS, &delay), 0);

    tw_repeated_config rc = {0};
    rc.name = "allocator";
    rc.timeout_ns = MS;
    rc.on_trigger = on_trigger;
    rc.on_destroy = on_destroy;
    tw_repeated *rt = NULL;
    atomic_store(&triggers, 0);
    atomic_store(&destroyed, 0);
    ASSERT_EQ(tw_repeated_create(&rt, s, &rc), 0);
    ASSERT_EQ(tw_repeated_start(rt), 0);
    uint64_t end = mono_now() + 30 * SEC;
    while ((atomic_load(&runs) < 60 || atomic_load(&triggers) < 3) &&
           mono_now() < end)
        sleep_ns(MS);
    ASSERT_GE(atomic_load(&runs), 60);
    ASSERT_GE(atomic_load(&triggers), 3);
    tw_repeated_destroy(rt);
    ASSERT_EQ(tw_cancel_wait(s, rate), 1);
    ASSERT_EQ(tw_cancel_wait(s, delay), 1);
    end = mono_now() + 30 * SEC;
    while (atomic_load(&destroyed) == 0 && mono_now() < end)
        sleep_ns(MS);
    ASSERT_EQ(atomic_load(&destroyed), 1);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 4500);
    tw_service_destroy(s);
}

static void test_sees_everything(void)
{
    ASSERT_EQ(tw_set_allocator(my_malloc, my_calloc, my_realloc, my_free), 0);
    atomic_store(&direct, 0);

    wheel_scenario();
    long after_wheel = atomic_load(&n_alloc);
    ASSERT_GE(after_wheel, 1);
    ASSERT_EQ(atomic_load(&live), 0);

    service_scenario(0);
    service_scenario(2);
    fprintf(stderr, "   %ld allocations, %ld frees, %ld direct calls\n",
            atomic_load(&n_alloc), atomic_load(&n_free), atomic_load(&direct));
    /* Wheel (1) + per service: itself, the function table, executors
     * (with a pool), a directory block, 3 chunks, 2 side records, the
     * RepeatedTimer: at least 8 more each. */
    ASSERT_GE(atomic_load(&n_alloc), after_wheel + 16);
    ASSERT_EQ(atomic_load(&n_alloc), atomic_load(&n_free));
    ASSERT_EQ(atomic_load(&live), 0);
    ASSERT_EQ(atomic_load(&direct), 0);
}

static void test_null_refused(void)
{
    ASSERT_EQ(tw_set_allocator(my_malloc, my_calloc, my_realloc, my_free), 0);
    ASSERT_EQ(tw_set_allocator(NULL, my_calloc, my_realloc, my_free),
              TW_EINVAL);
    ASSERT_EQ(tw_set_allocator(my_malloc, NULL, my_realloc, my_free),
              TW_EINVAL);
    ASSERT_EQ(tw_set_allocator(my_malloc, my_calloc, NULL, my_free), TW_EINVAL);
    ASSERT_EQ(tw_set_allocator(my_malloc, my_calloc, my_realloc, NULL),
              TW_EINVAL);
    ASSERT_EQ(tw_set_allocator(NULL, NULL, NULL, NULL), TW_EINVAL);
    /* Nothing changed: the custom allocator is still the one in use. */
    long a0 = atomic_load(&n_alloc), d0 = atomic_load(&direct);
    wheel_scenario();
    ASSERT_GT(atomic_load(&n_alloc), a0);
    ASSERT_EQ(atomic_load(&direct), d0);
    ASSERT_EQ(atomic_load(&live), 0);
}

int main(void)
{
    RUN_TEST(test_sees_everything);
    RUN_TEST(test_null_refused);
    return tw_test_done();
}
