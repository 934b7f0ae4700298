/* SPDX-License-Identifier: MIT */
/*
 * tests/test_service_producers.c - the producers (src/service_impl.h,
 * struct prod): a thread's own submission stack, pending count and
 * magazine of records. A stop that races a producer's reservation (forced
 * with tw__service_reserved_hook), the count of a stopped service while a
 * late producer holds a reservation (the same hook), producers handed on
 * when threads exit or evict them from their cache, more threads than
 * producers, a cancel from another thread, a thread that outlives its
 * service, and the pending sum while a task scheduled on one producer is
 * cancelled on another (tw__service_sum_hook).
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>

#include "fixture.h"
#include "service_internal.h"

static void nop(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
}

static tw_service *real_service(void)
{
    tw_service *s;
    ASSERT_EQ(tw_service_create(&s, NULL), 0);
    ASSERT_EQ(tw_service_start(s), 0);
    return s;
}

/* ------------------------------------------------------------------------ */
/* Stop against a reservation: the producer has counted its task and not yet
 * pushed it. The hook starts stop on another thread and returns only once
 * stop has marked the service stopped, so stop runs while the task is
 * counted but not pushed: stop must wait for it, and the task must either
 * be refused (TW_ESHUTDOWN, nothing handed back) or accepted and handed
 * back (0, handed back once), never lost: the producer pushes, sees the
 * stop and takes its task back unless stop took it first. */

static struct {
    tw_service *s;
    pthread_t stopper;
    _Atomic int stop_rc;
    _Atomic bool stop_done;
    bool armed;
} rs;

static void *stopper_main(void *arg)
{
    (void)arg;
    atomic_store(&rs.stop_rc, tw_service_stop(rs.s, NULL, NULL));
    atomic_store(&rs.stop_done, true);
    return NULL;
}

static void reserved_hook(tw_service *s)
{
    if (!rs.armed || s != rs.s)
        return;
    rs.armed = false;
    ASSERT_EQ(pthread_create(&rs.stopper, NULL, stopper_main, NULL), 0);
    while (tw_service_start(s) != TW_ESHUTDOWN) /* stop set its bit */
        sleep_us(50);
    /* Stop now waits for this reservation; it cannot have returned. */
    sleep_ms(20);
    ASSERT(!atomic_load(&rs.stop_done));
}

static void test_stop_during_reservation(void)
{
    rs.s = real_service();
    tw_id warm;
    /* This thread's producer exists before the hook is armed. */
    ASSERT_EQ(tw_schedule(rs.s, nop, NULL, 10 * SEC, &warm), 0);
    ASSERT(tw_cancel(rs.s, warm));
    atomic_store(&rs.stop_done, false);
    tw__service_reserved_hook = reserved_hook;
    rs.armed = true;
    tw_id id = 0;
    int rc = tw_schedule(rs.s, nop, NULL, 10 * SEC, &id);
    tw__service_reserved_hook = NULL;
    pthread_join(rs.stopper, NULL);
    tw_service_stats st;
    tw_service_get_stats(rs.s, &st);
    if (rc == TW_ESHUTDOWN) {
        ASSERT_EQ(atomic_load(&rs.stop_rc), 0); /* nothing to hand back */
        ASSERT_EQ(st.handed_back, 0);
    } else {
        ASSERT_EQ(rc, 0);
        ASSERT_EQ(atomic_load(&rs.stop_rc), 1);
        ASSERT_EQ(st.handed_back, 1);
    }
    ASSERT_EQ(tw_service_pending(rs.s), 0);
    /* The refused task's record went back to the magazine, no leak. */
    ASSERT_EQ(tw_schedule(rs.s, nop, NULL, SEC, NULL), TW_ESHUTDOWN);
    tw_service_destroy(rs.s);
}

/* Stop after the push and before the producer looks for it: the hook runs
 * a whole stop, which takes the pushed task and hands it back; the call
 * then sees the stop, finds its stack empty and returns 0 (the task was
 * accepted: handed back once, never lost, never refused after a hand-back).
 * Each clock mode (the lazy clock publishes through another path). */
static struct {
    tw_service *s;
    bool armed;
    int stop_rc;
    tw_id handed;
} ps;

static void on_handed(tw_id id, tw_task_fn fn, void *arg, void *ctx)
{
    (void)fn;
    (void)arg;
    (void)ctx;
    ps.handed = id;
}

static void pushed_hook(tw_service *s)
{
    if (!ps.armed || s != ps.s)
        return;
    ps.armed = false;
    ps.stop_rc = tw_service_stop(s, on_handed, NULL);
}

static void test_stop_after_push(void)
{
    for (int lazy = 0; lazy < 2; lazy++) {
        tw_service_config cfg = {.flags = lazy ? TW_SERVICE_LAZY_CLOCK : 0};
        ASSERT_EQ(tw_service_create(&ps.s, &cfg), 0);
        ASSERT_EQ(tw_service_start(ps.s), 0);
        tw_id warm;
        ASSERT_EQ(tw_schedule(ps.s, nop, NULL, 10 * SEC, &warm), 0);
        ASSERT(tw_cancel(ps.s, warm));
        ps.handed = 0;
        ps.stop_rc = -1;
        tw__service_pushed_hook = pushed_hook;
        ps.armed = true;
        tw_id id = 0;
        int rc = tw_schedule(ps.s, nop, NULL, 10 * SEC, &id);
        tw__service_pushed_hook = NULL;
        ASSERT(!ps.armed); /* the hook ran */
        ASSERT_EQ(rc, 0);
        ASSERT_EQ(ps.stop_rc, 1);
        ASSERT_EQ(ps.handed, id);
        ASSERT_EQ(tw_service_pending(ps.s), 0);
        ASSERT_EQ(tw_schedule(ps.s, nop, NULL, SEC, NULL), TW_ESHUTDOWN);
        tw_service_destroy(ps.s);
    }
}

/* After stop has returned: a thread whose producer counts a task before it
 * sees the stop (the hook holds it there) must not make the count of a
 * stopped service non-zero, which is 0 by contract. */
static tw_service *late_s;
static uint64_t late_pending = UINT64_MAX;

static void late_hook(tw_service *s)
{
    if (s == late_s)
        late_pending = tw_service_pending(s);
}

static void test_pending_zero_while_late_producer_counts(void)
{
    late_s = real_service();
    tw_id warm;
    ASSERT_EQ(tw_schedule(late_s, nop, NULL, 10 * SEC, &warm), 0);
    ASSERT(tw_cancel(late_s, warm));
    ASSERT_EQ(tw_service_stop(late_s, NULL, NULL), 0);
    tw__service_reserved_hook = late_hook;
    int rc = tw_schedule(late_s, nop, NULL, SEC, NULL);
    tw__service_reserved_hook = NULL;
    ASSERT_EQ(rc, TW_ESHUTDOWN);
    ASSERT_EQ(late_pending, 0); /* the hook ran, and saw 0 */
    ASSERT_EQ(tw_service_pending(late_s), 0);
    tw_service_destroy(late_s);
}

/* A task scheduled by one thread's producer and cancelled by another's
 * while tw_service_pending() sums the counts (the hook runs the pair
 * between its two passes): the sum may count the task, but never wraps
 * below the true count. */
static struct {
    tw_service *s;
    bool armed;
    tw_id id;
    int sched_rc;
    bool cancelled;
} pair;

static void *pair_scheduler(void *arg)
{
    (void)arg;
    pair.sched_rc = tw_schedule(pair.s, nop, NULL, 10 * SEC, &pair.id);
    return NULL;
}

static void *pair_canceller(void *arg)
{
    (void)arg;
    pair.cancelled = tw_cancel(pair.s, pair.id);
    return NULL;
}

static void sum_hook(tw_service *s)
{
    if (!pair.armed || s != pair.s)
        return;
    pair.armed = false;
    pthread_t a, b;
    ASSERT_EQ(pthread_create(&a, NULL, pair_scheduler, NULL), 0);
    ASSERT_EQ(pthread_join(a, NULL), 0);
    ASSERT_EQ(pthread_create(&b, NULL, pair_canceller, NULL), 0);
    ASSERT_EQ(pthread_join(b, NULL), 0);
}

static void test_pending_sum_across_producers(void)
{
    pair.s = real_service();
    tw_id mine;
    ASSERT_EQ(tw_schedule(pair.s, nop, NULL, 10 * SEC, &mine), 0);
    tw__service_sum_hook = sum_hook;
    pair.armed = true;
    uint64_t n = tw_service_pending(pair.s);
    tw__service_sum_hook = NULL;
    ASSERT_EQ(pair.sched_rc, 0);
    ASSERT(pair.cancelled);
    ASSERT(n == 1 || n == 2); /* mine, and perhaps the pair's task */
    ASSERT_EQ(tw_service_pending(pair.s), 1);
    ASSERT(tw_cancel(pair.s, mine));
    ASSERT_EQ(tw_service_pending(pair.s), 0);
    tw_service_destroy(pair.s);
}

/* Without the race: a task counted before stop is handed back. */
static void test_stop_hands_back_producer_tasks(void)
{
    tw_service *s = real_service();
    for (int i = 0; i < 1000; i++)
        ASSERT_EQ(tw_schedule(s, nop, NULL, 10 * SEC, NULL), 0);
    ASSERT_EQ(tw_service_pending(s), 1000);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 1000);
    ASSERT_EQ(tw_service_pending(s), 0);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* Threads that come and go: each exits before the next starts, so each
 * takes over the producer the last one released; its count and magazine
 * go with it. */

struct job {
    tw_service *s;
    int n;
    tw_id *ids;
    pthread_barrier_t *bar;
};

static void *schedule_some(void *arg)
{
    struct job *j = arg;
    if (j->bar != NULL)
        pthread_barrier_wait(j->bar);
    for (int i = 0; i < j->n; i++)
        ASSERT_EQ(tw_schedule(j->s, nop, NULL, 10 * SEC, &j->ids[i]), 0);
    for (int i = 0; i < j->n; i += 2)
        ASSERT(tw_cancel(j->s, j->ids[i]));
    return NULL;
}

static void test_threads_come_and_go(void)
{
    tw_service *s = real_service();
    tw_id ids[100];
    for (int t = 0; t < 200; t++) {
        struct job j = {s, 100, ids, NULL};
        pthread_t th;
        ASSERT_EQ(pthread_create(&th, NULL, schedule_some, &j), 0);
        pthread_join(th, NULL);
    }
    uint32_t owned;
    ASSERT_EQ(tw__service_producers(s, &owned), 1);
    ASSERT_EQ(owned, 0);
    ASSERT_EQ(tw_service_pending(s), 200 * 50);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 200 * 50);
    tw_service_destroy(s);
}

/* More threads at once than a service has producers: the rest take the
 * shared paths, and every task is counted. */
static void test_more_threads_than_producers(void)
{
    enum { T = 80, N = 50 };
    tw_service *s = real_service();
    static tw_id ids[T][N];
    struct job j[T];
    pthread_t th[T];
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, T);
    for (int t = 0; t < T; t++) {
        j[t] = (struct job){s, N, ids[t], &bar};
        ASSERT_EQ(pthread_create(&th[t], NULL, schedule_some, &j[t]), 0);
    }
    for (int t = 0; t < T; t++)
        pthread_join(th[t], NULL);
    pthread_barrier_destroy(&bar);
    ASSERT_LE(tw__service_producers(s, NULL), 64);
    ASSERT_EQ(tw_service_pending(s), T * N / 2);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), T * N / 2);
    tw_service_destroy(s);
}

/* Cancels of one thread's tasks by another: counted against the other's
 * producer; the sum stays right. */
static void test_cancel_from_other_thread(void)
{
    tw_service *s = real_service();
    static tw_id ids[1000];
    struct job j = {s, 1000, ids, NULL};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, schedule_some, &j), 0);
    pthread_join(th, NULL);
    for (int i = 1; i < 1000; i += 2)
        ASSERT(tw_cancel(s, ids[i]));
    ASSERT_EQ(tw_service_pending(s), 0);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

/* One thread on more services than its cache holds: an evicted producer is
 * released and taken again, so each service keeps one. */
static void test_cache_eviction(void)
{
    enum { S = 7 };
    tw_service *s[S];
    for (int i = 0; i < S; i++)
        s[i] = real_service();
    for (int round = 0; round < 20; round++)
        for (int i = 0; i < S; i++)
            ASSERT_EQ(tw_schedule(s[i], nop, NULL, 10 * SEC, NULL), 0);
    for (int i = 0; i < S; i++) {
        ASSERT_EQ(tw__service_producers(s[i], NULL), 1);
        ASSERT_EQ(tw_service_pending(s[i]), 20);
        tw_service_destroy(s[i]);
    }
}

/* A thread that outlives its service: at its exit it must not touch the
 * destroyed service (ASan and valgrind would see it), even when a new
 * service sits at the same address. */
static struct {
    tw_service *s;
    _Atomic int step;
} ol;

static void *outlive_main(void *arg)
{
    (void)arg;
    ASSERT_EQ(tw_schedule(ol.s, nop, NULL, 10 * SEC, NULL), 0);
    atomic_store(&ol.step, 1);
    while (atomic_load(&ol.step) != 2)
        sleep_us(100);
    /* Same address maybe, another serial: a new producer. */
    ASSERT_EQ(tw_schedule(ol.s, nop, NULL, 10 * SEC, NULL), 0);
    atomic_store(&ol.step, 3);
    while (atomic_load(&ol.step) != 4)
        sleep_us(100);
    return NULL; /* exits after the second service is gone too */
}

static void test_thread_outlives_service(void)
{
    ol.s = real_service();
    atomic_store(&ol.step, 0);
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, outlive_main, NULL), 0);
    while (atomic_load(&ol.step) != 1)
        sleep_us(100);
    tw_service_destroy(ol.s);
    ol.s = real_service();
    atomic_store(&ol.step, 2);
    while (atomic_load(&ol.step) != 3)
        sleep_us(100);
    ASSERT_EQ(tw__service_producers(ol.s, NULL), 1);
    ASSERT_EQ(tw_service_pending(ol.s), 1);
    tw_service_destroy(ol.s);
    atomic_store(&ol.step, 4);
    pthread_join(th, NULL);
}

int main(int argc, char **argv)
{
    RUN_SELECTED(test_stop_during_reservation);
    RUN_SELECTED(test_stop_after_push);
    RUN_SELECTED(test_stop_hands_back_producer_tasks);
    RUN_SELECTED(test_pending_zero_while_late_producer_counts);
    RUN_SELECTED(test_pending_sum_across_producers);
    RUN_SELECTED(test_threads_come_and_go);
    RUN_SELECTED(test_more_threads_than_producers);
    RUN_SELECTED(test_cancel_from_other_thread);
    RUN_SELECTED(test_cache_eviction);
    RUN_SELECTED(test_thread_outlives_service);
    return tw_test_done();
}
