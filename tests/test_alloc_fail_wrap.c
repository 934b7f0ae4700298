/* SPDX-License-Identifier: MIT */
/*
 * tests/test_alloc_fail_wrap.c - the countdown behind test_alloc_fail.h:
 * __wrap_ versions of the allocation functions and of pthread_create (see
 * the header for the link flags). A failing call returns NULL (or ENOMEM) like
 * a real allocator out of memory and allocates nothing.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>

#include "test_alloc_fail.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t m, size_t n);
void *__real_realloc(void *p, size_t n);
void __real_free(void *p);
void *__real_aligned_alloc(size_t a, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t m, size_t n);
void *__wrap_realloc(void *p, size_t n);
void __wrap_free(void *p);
void *__wrap_aligned_alloc(size_t a, size_t n);
int __wrap_posix_memalign(void **p, size_t a, size_t n);
int __real_pthread_create(pthread_t *t, const pthread_attr_t *a,
                          void *(*fn)(void *), void *arg);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a,
                          void *(*fn)(void *), void *arg);

static atomic_long af_countdown = -1; /* < 0: disarmed */
static atomic_bool af_sticky;
static atomic_long af_calls, af_failures, af_live;

void tw_af_arm(long k, bool sticky)
{
    atomic_store(&af_sticky, sticky);
    atomic_store(&af_calls, 0);
    atomic_store(&af_failures, 0);
    atomic_store(&af_countdown, k);
}

void tw_af_disarm(void)
{
    atomic_store(&af_countdown, -1);
}

long tw_af_calls(void)
{
    return atomic_load(&af_calls);
}

long tw_af_failures(void)
{
    return atomic_load(&af_failures);
}

long tw_af_live(void)
{
    return atomic_load(&af_live);
}

/* Count one allocation call; true if it must fail. */
static bool af_fail_now(void)
{
    atomic_fetch_add(&af_calls, 1);
    long c = atomic_load(&af_countdown);
    while (c >= 0) {
        long next = c > 0 ? c - 1 : (atomic_load(&af_sticky) ? 0 : -1);
        if (atomic_compare_exchange_weak(&af_countdown, &c, next)) {
            if (c == 0) {
                atomic_fetch_add(&af_failures, 1);
                return true;
            }
            return false;
        }
    }
    return false;
}

static void *af_count(void *p)
{
    if (p)
        atomic_fetch_add(&af_live, 1);
    return p;
}

void *__wrap_malloc(size_t n)
{
    return af_fail_now() ? NULL : af_count(__real_malloc(n));
}

void *__wrap_calloc(size_t m, size_t n)
{
    return af_fail_now() ? NULL : af_count(__real_calloc(m, n));
}

void *__wrap_realloc(void *p, size_t n)
{
    if (p == NULL)
        return __wrap_malloc(n);
    if (n == 0) {
        __wrap_free(p);
        return NULL;
    }
    /* A failed realloc leaves the old block alone. */
    return af_fail_now() ? NULL : __real_realloc(p, n);
}

void __wrap_free(void *p)
{
    if (p)
        atomic_fetch_sub(&af_live, 1);
    __real_free(p);
}

void *__wrap_aligned_alloc(size_t a, size_t n)
{
    return af_fail_now() ? NULL : af_count(__real_aligned_alloc(a, n));
}

int __wrap_posix_memalign(void **p, size_t a, size_t n)
{
    if (af_fail_now())
        return ENOMEM;
    int rc = __real_posix_memalign(p, a, n);
    if (rc == 0)
        af_count(*p);
    return rc;
}

static atomic_long af_thread_countdown = -1;

void tw_af_arm_threads(long k)
{
    atomic_store(&af_thread_countdown, k);
}

int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a,
                          void *(*fn)(void *), void *arg)
{
    long c = atomic_load(&af_thread_countdown);
    while (c >= 0) {
        if (atomic_compare_exchange_weak(&af_thread_countdown, &c, c - 1)) {
            if (c == 0)
                return EAGAIN; /* as when the thread limit is reached */
            break;
        }
    }
    return __real_pthread_create(t, a, fn, arg);
}
