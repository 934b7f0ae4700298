/* SPDX-License-Identifier: MIT */
/*
 * tests/test_service_stress.c - conservation under concurrency (run under
 * ThreadSanitizer in CI).
 *
 * Producer threads schedule one-shot tasks (delays from 0 to 3 ms, some an
 * hour away, some "never"), canceller threads cancel random ones and
 * periodic tasks, and the service is stopped in the middle of the load.
 * Every accepted task must then have exactly one outcome: it ran once, one
 * tw_cancel() returned true for it, or stop handed it back; tasks that were
 * not accepted have none. Periodic tasks never run twice at the same time
 * and never after stop returned. Stop comes when half of NTASKS are
 * produced or after LOAD_MS, so the test takes a few seconds at most even
 * under TSan.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#include "fixture.h"
#include "test.h"
#include "twheel/service.h"

#define LOAD_MS 300
#define NTASKS 60000
#define NPROD 3
#define NCANCEL 2
#define NPERIODIC 8

enum { NONE = 0, RAN, CANCELLED, HANDED };

static tw_service *svc;
static _Atomic uint8_t outcome[NTASKS];
static _Atomic uint8_t accepted[NTASKS];
static _Atomic tw_id ids[NTASKS];
static _Atomic uint32_t next_index;
static _Atomic bool load_over;
static _Atomic uint64_t n_accepted, n_ran, n_cancelled, n_handed;

struct periodic {
    _Atomic int running;
    _Atomic uint64_t runs;
    _Atomic uint8_t outcome;
    _Atomic int overlap;
    tw_id id;
};
static struct periodic per[NPERIODIC];

static void one_shot(tw_id id, void *arg)
{
    (void)id;
    uintptr_t i = (uintptr_t)arg;
    uint8_t prev = atomic_exchange(&outcome[i], RAN);
    ASSERT_EQ(prev, NONE);
    atomic_fetch_add(&n_ran, 1);
}

static void periodic_task(tw_id id, void *arg)
{
    (void)id;
    struct periodic *p = arg;
    if (atomic_exchange(&p->running, 1) != 0)
        atomic_store(&p->overlap, 1);
    atomic_fetch_add(&p->runs, 1);
    atomic_store(&p->running, 0);
}

static void *producer(void *arg)
{
    uint64_t rng = (uintptr_t)arg;
    while (!atomic_load(&load_over)) {
        uint32_t i = atomic_fetch_add(&next_index, 1);
        if (i >= NTASKS)
            break;
        uint64_t r = tw_test_rand(&rng);
        uint64_t delay = r % (3 * MS);
        if (r % 97 == 0)
            delay = 3600 * 1000 * MS;
        else if (r % 101 == 0)
            delay = UINT64_MAX;
        tw_id id;
        int rc = tw_schedule(svc, one_shot, (void *)(uintptr_t)i, delay, &id);
        if (rc == 0) {
            atomic_store(&ids[i], id);
            atomic_store(&accepted[i], 1);
            atomic_fetch_add(&n_accepted, 1);
        } else if (rc == TW_ESHUTDOWN) {
            break;
        } else {
            ASSERT_EQ(rc, TW_EAGAIN); /* max_pending */
        }
        if (r % 16 == 0)
            sched_yield();
    }
    return NULL;
}

static void *canceller(void *arg)
{
    uint64_t rng = (uintptr_t)arg;
    while (!atomic_load(&load_over)) {
        uint64_t r = tw_test_rand(&rng);
        uint32_t n = atomic_load(&next_index);
        if (n > NTASKS)
            n = NTASKS;
        if (r % 1000 == 0) {
            struct periodic *p = &per[r / 1000 % NPERIODIC];
            if (tw_cancel(svc, p->id)) {
                ASSERT_EQ(atomic_exchange(&p->outcome, CANCELLED), NONE);
                atomic_fetch_add(&n_cancelled, 1);
            }
            continue;
        }
        if (n == 0 || r % 3 == 0) {
            /* Random and stale ids must never hit anything. */
            ASSERT(!tw_cancel(svc, tw_test_rand(&rng) | 1u << 31));
            sched_yield();
            continue;
        }
        uint32_t j = (uint32_t)(r >> 8) % n;
        tw_id id = atomic_load(&ids[j]);
        if (id != 0 && tw_cancel(svc, id)) {
            ASSERT_EQ(atomic_exchange(&outcome[j], CANCELLED), NONE);
            atomic_fetch_add(&n_cancelled, 1);
        }
    }
    return NULL;
}

static void on_unprocessed(tw_id id, tw_task_fn fn, void *arg, void *ctx)
{
    (void)id;
    (void)ctx;
    if (fn == periodic_task) {
        struct periodic *p = arg;
        ASSERT_EQ(atomic_exchange(&p->outcome, HANDED), NONE);
    } else {
        ASSERT(fn == one_shot);
        ASSERT_EQ(atomic_exchange(&outcome[(uintptr_t)arg], HANDED), NONE);
    }
    atomic_fetch_add(&n_handed, 1);
}

static void run_config(const tw_service_config *cfg)
{
    memset(outcome, 0, sizeof(outcome));
    memset(accepted, 0, sizeof(accepted));
    memset(ids, 0, sizeof(ids));
    memset(per, 0, sizeof(per));
    atomic_store(&next_index, 0);
    atomic_store(&load_over, false);
    atomic_store(&n_accepted, 0);
    atomic_store(&n_ran, 0);
    atomic_store(&n_cancelled, 0);
    atomic_store(&n_handed, 0);
    ASSERT_EQ(tw_service_create(&svc, cfg), 0);
    for (int k = 0; k < NPERIODIC; k++) {
        int rc = k % 2 ? tw_schedule_fixed_rate(svc, periodic_task, &per[k], MS,
                                                MS, &per[k].id)
                       : tw_schedule_fixed_delay(svc, periodic_task, &per[k], 0,
                                                 MS / 2, &per[k].id);
        ASSERT_EQ(rc, 0);
    }
    pthread_t th[NPROD + NCANCEL];
    for (int k = 0; k < NPROD; k++)
        ASSERT_EQ(
            pthread_create(&th[k], NULL, producer, (void *)(uintptr_t)(k + 1)),
            0);
    for (int k = 0; k < NCANCEL; k++)
        ASSERT_EQ(pthread_create(&th[NPROD + k], NULL, canceller,
                                 (void *)(uintptr_t)(k + 100)),
                  0);
    /* Stop in the middle of the load: once half the tasks are produced,
     * or after LOAD_MS. */
    for (int t = 0; t < LOAD_MS && atomic_load(&next_index) < NTASKS / 2; t++)
        sleep_ns(MS);
    int handed = tw_service_stop(svc, on_unprocessed, NULL);
    ASSERT_GE(handed, 0);
    ASSERT_EQ((uint64_t)handed, atomic_load(&n_handed));
    ASSERT_EQ(tw_service_pending(svc), 0);
    uint64_t runs_at_stop[NPERIODIC];
    for (int k = 0; k < NPERIODIC; k++)
        runs_at_stop[k] = atomic_load(&per[k].runs);
    sleep_ns(20 * MS);
    atomic_store(&load_over, true);
    for (int k = 0; k < NPROD + NCANCEL; k++)
        pthread_join(th[k], NULL);

    uint32_t n = atomic_load(&next_index);
    if (n > NTASKS)
        n = NTASKS;
    uint64_t acc = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (atomic_load(&accepted[i])) {
            acc++;
            ASSERT_NE(atomic_load(&outcome[i]), NONE);
            ASSERT(!tw_cancel(svc, atomic_load(&ids[i])));
        } else {
            ASSERT_EQ(atomic_load(&outcome[i]), NONE);
        }
    }
    for (int k = 0; k < NPERIODIC; k++) {
        ASSERT_EQ(atomic_load(&per[k].overlap), 0);
        ASSERT_NE(atomic_load(&per[k].outcome), NONE);
        ASSERT_EQ(atomic_load(&per[k].runs), runs_at_stop[k]);
        acc++;
    }
    ASSERT_EQ(acc, atomic_load(&n_accepted) + NPERIODIC);
    ASSERT_EQ(atomic_load(&n_ran) + atomic_load(&n_cancelled) +
                  atomic_load(&n_handed),
              acc);
    tw_service_stats st;
    tw_service_get_stats(svc, &st);
    ASSERT_EQ(st.pending, 0);
    ASSERT_EQ(st.handed_back, atomic_load(&n_handed));
    ASSERT_EQ(st.cancelled, atomic_load(&n_cancelled));
    uint64_t periodic_runs = 0;
    for (int k = 0; k < NPERIODIC; k++)
        periodic_runs += atomic_load(&per[k].runs);
    ASSERT_EQ(st.ran, atomic_load(&n_ran) + periodic_runs);
    fprintf(stderr,
            "   accepted %llu: ran %llu, cancelled %llu, handed back %llu; "
            "periodic runs %llu\n",
            (unsigned long long)acc, (unsigned long long)atomic_load(&n_ran),
            (unsigned long long)atomic_load(&n_cancelled),
            (unsigned long long)atomic_load(&n_handed),
            (unsigned long long)periodic_runs);
    tw_service_destroy(svc);
}

static void test_timer_thread(void)
{
    tw_service_config cfg = {.tick_ns = MS / 4};
    run_config(&cfg);
}

static void test_executors(void)
{
    tw_service_config cfg = {.tick_ns = MS / 4, .executor_threads = 2};
    run_config(&cfg);
}

static void test_lazy_clock(void)
{
    tw_service_config cfg = {.tick_ns = MS / 4, .flags = TW_SERVICE_LAZY_CLOCK};
    run_config(&cfg);
}

static void test_max_pending(void)
{
    tw_service_config cfg = {
        .max_pending = 500, .levels = 1, .ticks_per_wheel = 64};
    run_config(&cfg);
}

int main(void)
{
    RUN_TEST(test_timer_thread);
    RUN_TEST(test_executors);
    RUN_TEST(test_lazy_clock);
    RUN_TEST(test_max_pending);
    return tw_test_done();
}
