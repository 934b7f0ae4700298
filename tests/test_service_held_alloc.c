/* SPDX-License-Identifier: MIT */
/*
 * tests/test_service_held_alloc.c - interleavings of the service forced by
 * holding one thread inside an allocation function (linked with
 * -Wl,--wrap=free,--wrap=malloc,--wrap=posix_memalign): the next call of
 * the holder thread waits there until the test releases it.
 *
 * test_cancel_wait_sees_cancelled_job_end: tw_cancel_wait() wakes up when
 * a caller-supplied executor runs a job whose task was cancelled
 * meanwhile. The executor thread calls tw_service_run()
 * for a fixed-rate task that was cancelled after it was dispatched; the run
 * finds the cancel and frees the task's record, and that free (linked with
 * -Wl,--wrap=free) holds the executor thread while another thread calls
 * tw_cancel_wait() and goes to sleep on the task still seen RUNNING. Then
 * the free is released: the waiter must return at once (the service is
 * quiet, so nothing else would ever wake it). Bound: 5 s of real time.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "service_internal.h"
#include "fixture.h"
#include "test.h"
#include "twheel/service.h"

void __real_free(void *p);
void __wrap_free(void *p);
void *__real_malloc(size_t n);
void *__wrap_malloc(size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
int __wrap_posix_memalign(void **p, size_t a, size_t n);

static struct {
    _Atomic bool armed;   /* hold the next free() of the holder thread */
    pthread_t holder;     /* valid while armed */
    _Atomic bool entered; /* the holder is inside free() */
    _Atomic bool release;
} hold;

/* Hold the holder thread here if armed. */
static void maybe_hold(void)
{
    if (atomic_load(&hold.armed) &&
        pthread_equal(pthread_self(), hold.holder)) {
        atomic_store(&hold.armed, false);
        atomic_store(&hold.entered, true);
        while (!atomic_load(&hold.release))
            sleep_ns(100000);
    }
}

void __wrap_free(void *p)
{
    maybe_hold();
    __real_free(p);
}

void *__wrap_malloc(size_t n)
{
    maybe_hold();
    return __real_malloc(n);
}

int __wrap_posix_memalign(void **p, size_t a, size_t n)
{
    maybe_hold();
    return __real_posix_memalign(p, a, n);
}

static void hold_reset(void)
{
    atomic_store(&hold.armed, false);
    atomic_store(&hold.entered, false);
    atomic_store(&hold.release, false);
}

/* Arm the hold for the calling thread. */
static void hold_me(void)
{
    hold.holder = pthread_self();
    atomic_store(&hold.armed, true);
}

static _Atomic tw_id job;

static void take_job(tw_service *s, tw_id j, void *ctx)
{
    (void)s;
    (void)ctx;
    atomic_store(&job, j);
}

static _Atomic int runs;

static void task(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
    atomic_fetch_add(&runs, 1);
}

static tw_service *svc;
static tw_id task_id;

static void *executor(void *p)
{
    (void)p;
    hold_me();
    tw_service_run(svc, atomic_load(&job));
    return NULL;
}

static _Atomic int wait_rc = -1000;
static _Atomic bool wait_done;

static void *waiter(void *p)
{
    (void)p;
    atomic_store(&wait_rc, tw_cancel_wait(svc, task_id));
    atomic_store(&wait_done, true);
    return NULL;
}

/* Poll @cond every 100 us for at most @sec seconds; true if it held. */
static bool wait_for(_Atomic bool *flag, uint64_t sec)
{
    uint64_t end = mono_now() + sec * SEC;
    while (!atomic_load(flag) && mono_now() < end)
        sleep_ns(100000);
    return atomic_load(flag);
}

static void test_cancel_wait_sees_cancelled_job_end(void)
{
    tw_service_config cfg = {0};
    hold_reset();
    cfg.clock = vclock;
    cfg.execute = take_job;
    ASSERT_EQ(tw_service_create(&svc, &cfg), 0);
    ASSERT_EQ(tw_schedule_fixed_rate(svc, task, NULL, 0, SEC, &task_id), 0);
    for (int i = 0; i < 50000 && atomic_load(&job) == 0; i++)
        sleep_ns(100000);
    ASSERT_NE(atomic_load(&job), 0);
    ASSERT(tw_cancel(svc, task_id)); /* dispatched: the cancel wins */

    pthread_t ex, wt;
    ASSERT_EQ(pthread_create(&ex, NULL, executor, NULL), 0);
    ASSERT(wait_for(&hold.entered, 5)); /* in the free of the record */
    ASSERT_EQ(pthread_create(&wt, NULL, waiter, NULL), 0);
    /* The waiter is registered, then give it time to go to sleep. */
    for (int i = 0; i < 50000 && tw__service_waiters(svc) == 0; i++)
        sleep_ns(100000);
    ASSERT_EQ(tw__service_waiters(svc), 1);
    sleep_ns(50 * MS);
    atomic_store(&hold.release, true);
    pthread_join(ex, NULL);
    ASSERT(wait_for(&wait_done, 5)); /* before the fix: blocked for good */
    pthread_join(wt, NULL);
    ASSERT_EQ(atomic_load(&wait_rc), 0); /* the cancel was the earlier one */
    ASSERT_EQ(atomic_load(&runs), 0);
    ASSERT_EQ(tw_service_pending(svc), 0);
    ASSERT_EQ(tw_service_stop(svc, NULL, NULL), 0);
    tw_service_destroy(svc);
}

/* ------------------------------------------------------------------------ */
/*
 * test_failed_call_holds_no_slot: a schedule call that fails (here: its
 * function does not fit max_callbacks) never holds a pending slot. The
 * failing call is held inside the allocation of a new chunk of records,
 * if it makes one: before the fix it had reserved its slot by then, so
 * tw_service_pending() read one too many and a valid call at max_pending
 * failed with TW_EAGAIN. Fixed, the call fails before it allocates.
 */
static void other_fn(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
}

#define CHUNK 4096 /* records per chunk (service.c) */

static _Atomic int other_rc = 1;

static void *schedule_other(void *p)
{
    (void)p;
    hold_me();
    atomic_store(&other_rc, tw_schedule(svc, other_fn, NULL, SEC, NULL));
    atomic_store(&hold.armed, false);
    return NULL;
}

static void test_failed_call_holds_no_slot(void)
{
    tw_service_config cfg = {0};
    hold_reset();
    cfg.clock = vclock;
    cfg.max_callbacks = 1;
    cfg.max_pending = CHUNK + 1;
    ASSERT_EQ(tw_service_create(&svc, &cfg), 0);
    /* The first chunk full: the next record needs a new chunk. */
    for (int i = 0; i < CHUNK; i++)
        ASSERT_EQ(tw_schedule(svc, task, NULL, SEC, NULL), 0);
    ASSERT_EQ(tw_service_pending(svc), CHUNK);
    pthread_t t;
    ASSERT_EQ(pthread_create(&t, NULL, schedule_other, NULL), 0);
    uint64_t end = mono_now() + 5 * SEC;
    while (!atomic_load(&hold.entered) && atomic_load(&other_rc) == 1 &&
           mono_now() < end)
        sleep_ns(100000);
    bool held = atomic_load(&hold.entered);
    /* While the failing call is inside (or after it): nothing held. */
    ASSERT_EQ(tw_service_pending(svc), CHUNK); /* before the fix: +1 */
    tw_id last = 0;
    int rc = tw_schedule(svc, task, NULL, SEC, &last);
    atomic_store(&hold.release, true);
    pthread_join(t, NULL);
    fprintf(stderr, "   failing call %s\n",
            held ? "held in an allocation" : "made no allocation");
    ASSERT_EQ(rc, 0);
    ASSERT_EQ(atomic_load(&other_rc), TW_EAGAIN);
    ASSERT_EQ(tw_service_pending(svc), CHUNK + 1);
    ASSERT_EQ(tw_service_stop(svc, NULL, NULL), CHUNK + 1);
    tw_service_destroy(svc);
}

int main(void)
{
    RUN_TEST(test_cancel_wait_sees_cancelled_job_end);
    RUN_TEST(test_failed_call_holds_no_slot);
    return tw_test_done();
}
