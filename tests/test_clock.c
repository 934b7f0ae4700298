/* SPDX-License-Identifier: MIT */
/*
 * tests/test_clock.c - spurious wake-ups and clock behaviour of the service.
 *
 * - Spurious wake-ups: the timer thread is woken for nothing
 *   (tw__service_kick) thousands of times, by the test and by a thread that
 *   does nothing else, while tasks wait. No task may run before its
 *   deadline or twice, periodic tasks keep their schedule, and every task
 *   runs once its time has come. Once on a virtual clock (exact), once on
 *   CLOCK_MONOTONIC (bounds only).
 * - Clock jumps, with an injected clock: a jump forward by an hour, a day
 *   and to the end of the 64-bit range runs each due task once and each
 *   periodic task once (no burst of missed runs); a clock that steps back
 *   (outside the clock's contract) makes nothing run early or twice, it
 *   only delays work until the clock is back where it was; nor does it
 *   make the timer thread spin or strand a task due at once.
 * - TW_SERVICE_LAZY_CLOCK with tasks on the timer thread: a call made
 *   while a long task runs there is due its delay after the call, not
 *   after the long task.
 * The wall clock (CLOCK_REALTIME) is read nowhere, so a wall-clock jump
 * cannot reach the service; the injected clock stands in for a monotonic
 * clock that behaves as oddly as it can.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <time.h>

#define VCLOCK_START (UINT64_C(5000) * SEC)
#include "fixture.h"
#include "service_internal.h"
#include "test.h"
#include "twheel/service.h"

#define VBASE VCLOCK_START

/* The clock the current test's tasks read: virtual or monotonic. */
static bool use_mono;

static uint64_t now_ns(void)
{
    return use_mono ? mono_now() : atomic_load(&vnow);
}

/* A task and what the test knows about it. */
struct task {
    uint64_t due;    /* earliest allowed run (clock ns) */
    uint64_t period; /* 0: one-shot */
    bool fixed_rate;
    _Atomic int runs;
    _Atomic int running;
    _Atomic uint64_t last; /* clock at the start of the last run */
    tw_id id;
};

static void task_fn(tw_id id, void *arg)
{
    struct task *t = arg;
    uint64_t now = now_ns();
    ASSERT_EQ(atomic_exchange(&t->running, 1), 0); /* never overlaps */
    ASSERT_EQ(id, t->id);
    int k = atomic_load(&t->runs);
    if (t->period == 0) {
        ASSERT_EQ(k, 0); /* a one-shot task runs once */
        ASSERT_GE(now, t->due);
    } else if (t->fixed_rate) {
        /* Run k is never before start + initial + k * period. */
        ASSERT_GE(now, t->due + (uint64_t)k * t->period);
    } else {
        ASSERT_GE(now, k == 0 ? t->due : atomic_load(&t->last) + t->period);
    }
    atomic_store(&t->last, now);
    atomic_store(&t->runs, k + 1);
    atomic_store(&t->running, 0);
}

static void sched(tw_service *s, struct task *t, uint64_t delay,
                  uint64_t period, bool fixed_rate)
{
    t->period = period;
    t->fixed_rate = fixed_rate;
    atomic_store(&t->runs, 0);
    t->due = now_ns() + delay;
    if (period == 0)
        ASSERT_EQ(tw_schedule(s, task_fn, t, delay, &t->id), 0);
    else if (fixed_rate)
        ASSERT_EQ(tw_schedule_fixed_rate(s, task_fn, t, delay, period, &t->id),
                  0);
    else
        ASSERT_EQ(tw_schedule_fixed_delay(s, task_fn, t, delay, period, &t->id),
                  0);
}

static tw_service *vservice(uint32_t executors)
{
    tw_service_config cfg = {0};
    cfg.executor_threads = executors;
    use_mono = false;
    return vclock_service(&cfg);
}

static void vset(tw_service *s, uint64_t abs)
{
    atomic_store(&vnow, abs);
    tw__service_sync(s);
}

/* A thread that does nothing but wake the timer thread. */
struct kicker {
    pthread_t th;
    tw_service *s;
    _Atomic bool stop;
    _Atomic uint64_t kicks;
};

static void *kicker_main(void *p)
{
    struct kicker *k = p;
    while (!atomic_load(&k->stop)) {
        tw__service_kick(k->s);
        atomic_fetch_add(&k->kicks, 1);
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
    }
    return NULL;
}

static void kicker_start(struct kicker *k, tw_service *s)
{
    k->s = s;
    atomic_store(&k->stop, false);
    atomic_store(&k->kicks, 0);
    ASSERT_EQ(pthread_create(&k->th, NULL, kicker_main, k), 0);
}

static uint64_t kicker_stop(struct kicker *k)
{
    atomic_store(&k->stop, true);
    ASSERT_EQ(pthread_join(k->th, NULL), 0);
    return atomic_load(&k->kicks);
}

static void count_unprocessed(tw_id id, tw_task_fn fn, void *arg, void *ctx)
{
    (void)id;
    (void)arg;
    ASSERT(fn == task_fn);
    (*(int *)ctx)++;
}

/* ------------------------------------------------------------------------ */

#define NONE_SHOT 300
#define NPER 6

static void spurious_virtual(uint32_t executors)
{
    static struct task one[NONE_SHOT], per[NPER], never;
    tw_service *s = vservice(executors);
    struct kicker k;
    for (int i = 0; i < NONE_SHOT; i++)
        sched(s, &one[i], (uint64_t)(i % 100) * MS + (uint64_t)i * 1234, 0,
              false);
    for (int i = 0; i < NPER; i++)
        sched(s, &per[i], (uint64_t)i * 700 * US, (uint64_t)(i + 3) * MS,
              i % 2 == 0);
    sched(s, &never, UINT64_MAX, 0, false);
    tw_service_stats st0;
    tw_service_get_stats(s, &st0);
    kicker_start(&k, s);
    /* 130 ms in 250 us steps; at each step five extra wake-ups. */
    for (uint64_t t = 0; t <= 130 * MS; t += 250 * US) {
        atomic_store(&vnow, VBASE + t);
        for (int j = 0; j < 5; j++)
            tw__service_kick(s);
        tw__service_sync(s);
        /* Exactly what is due has run: a task runs at the first 1 ms
         * tick at or after its deadline (the task checks "not before"). */
        for (int i = 0; i < NONE_SHOT; i++) {
            uint64_t d = one[i].due - VBASE;
            ASSERT_EQ(atomic_load(&one[i].runs), (d + MS - 1) / MS * MS <= t);
        }
    }
    uint64_t kicks = kicker_stop(&k);
    for (int i = 0; i < NONE_SHOT; i++)
        ASSERT_EQ(atomic_load(&one[i].runs), 1);
    for (int i = 0; i < NPER; i++) {
        /* At least every other period, at most one run per period. */
        int runs = atomic_load(&per[i].runs);
        uint64_t p = per[i].period, span = 130 * MS - (uint64_t)i * 700 * US;
        ASSERT_LE((uint64_t)runs, span / p + 1);
        ASSERT_GE((uint64_t)runs, span / (p + MS));
    }
    ASSERT_EQ(atomic_load(&never.runs), 0);
    tw_service_stats st;
    tw_service_get_stats(s, &st);
    /* The kicks did reach the timer thread (a sync is a wake-up too). */
    ASSERT_GT(st.wakeups - st0.wakeups, 100);
    uint64_t periodic_runs = 0;
    for (int i = 0; i < NPER; i++)
        periodic_runs += (uint64_t)atomic_load(&per[i].runs);
    ASSERT_EQ(st.ran, NONE_SHOT + periodic_runs);
    int handed = 0;
    ASSERT_EQ(tw_service_stop(s, count_unprocessed, &handed), NPER + 1);
    ASSERT_EQ(handed, NPER + 1);
    tw_service_destroy(s);
    printf("spurious (virtual, %u executors): %llu kicks from a thread, "
           "%llu wake-ups\n",
           executors, (unsigned long long)kicks,
           (unsigned long long)(st.wakeups - st0.wakeups));
}

static void test_spurious_virtual(void)
{
    spurious_virtual(0);
    spurious_virtual(2);
}

/*
 * Real time: 60 tasks due in 10..130 ms, a kicker thread waking the timer
 * thread every ~20 us. Bounds: never before the delay (exact, measured with
 * CLOCK_MONOTONIC around the schedule call), all run within 5 s.
 */
static void test_spurious_real(void)
{
    static struct task t[60];
    use_mono = true;
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, NULL), 0);
    struct kicker k;
    ASSERT_EQ(tw_service_start(s), 0);
    kicker_start(&k, s);
    for (int i = 0; i < 60; i++)
        sched(s, &t[i], (uint64_t)(10 + 2 * i) * MS, 0, false);
    uint64_t end = mono_now() + 5 * SEC;
    int done = 0;
    while (done < 60 && mono_now() < end) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        done = 0;
        for (int i = 0; i < 60; i++)
            done += atomic_load(&t[i].runs);
    }
    kicker_stop(&k);
    for (int i = 0; i < 60; i++)
        ASSERT_EQ(atomic_load(&t[i].runs), 1);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

/* Jumps forward: due work runs once, periodic tasks do not burst. */
static void test_jump_forward(void)
{
    static struct task hour, day, rate, delay, never;
    tw_service *s = vservice(0);
    sched(s, &hour, 3600 * SEC, 0, false);
    sched(s, &day, 86400 * SEC, 0, false);
    sched(s, &rate, 10 * MS, 10 * MS, true);
    sched(s, &delay, 10 * MS, 10 * MS, false);
    sched(s, &never, UINT64_MAX, 0, false);
    vset(s, VBASE + 3600 * SEC); /* one hour */
    ASSERT_EQ(atomic_load(&hour.runs), 1);
    ASSERT_EQ(atomic_load(&day.runs), 0);
    ASSERT_EQ(atomic_load(&rate.runs), 1); /* not 360,000 runs */
    ASSERT_EQ(atomic_load(&delay.runs), 1);
    vset(s, VBASE + 3600 * SEC + 10 * MS);
    ASSERT_EQ(atomic_load(&rate.runs), 2); /* back on its grid */
    ASSERT_EQ(atomic_load(&delay.runs), 2);
    vset(s, VBASE + 2 * 86400 * SEC); /* a day and more */
    ASSERT_EQ(atomic_load(&day.runs), 1);
    ASSERT_EQ(atomic_load(&rate.runs), 3);
    ASSERT_EQ(atomic_load(&delay.runs), 3);
    /* To the end of the range: nothing overflows, "never" stays never. */
    vset(s, UINT64_MAX - SEC);
    ASSERT_EQ(atomic_load(&rate.runs), 4);
    ASSERT_EQ(atomic_load(&delay.runs), 4);
    vset(s, UINT64_MAX);
    ASSERT_EQ(atomic_load(&never.runs), 0);
    ASSERT_EQ(atomic_load(&hour.runs), 1);
    ASSERT_EQ(atomic_load(&day.runs), 1);
    int rate_runs = atomic_load(&rate.runs);
    int delay_runs = atomic_load(&delay.runs);
    ASSERT_LE(rate_runs, 5);
    ASSERT_LE(delay_runs, 5);
    for (int i = 0; i < 100; i++)
        tw__service_kick(s);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&rate.runs), rate_runs);
    ASSERT_EQ(atomic_load(&delay.runs), delay_runs);
    int handed = 0;
    ASSERT_EQ(tw_service_stop(s, count_unprocessed, &handed), 3);
    tw_service_destroy(s);
}

/* A clock that steps back (a broken clock): nothing early, nothing twice. */
static void test_step_back(void)
{
    static struct task a, b, rate;
    tw_service *s = vservice(0);
    sched(s, &a, 10 * MS, 0, false);       /* due at 10 ms */
    sched(s, &rate, 2 * MS, 2 * MS, true); /* 2, 4, 6, ... */
    vset(s, VBASE + 5 * MS);
    ASSERT_EQ(atomic_load(&rate.runs), 1); /* 2 and 4 late: one run */
    vset(s, VBASE + 1 * MS);               /* back by 4 ms */
    for (int i = 0; i < 50; i++)
        tw__service_kick(s);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&a.runs), 0);
    ASSERT_EQ(atomic_load(&rate.runs), 1);
    /* The service's time stays at 5 ms while the clock is behind: b is
     * due 2 ms after that, at 7 ms, never earlier by any reading. */
    sched(s, &b, 2 * MS, 0, false);
    vset(s, VBASE + 4 * MS);
    ASSERT_EQ(atomic_load(&b.runs), 0);
    vset(s, VBASE + 6 * MS);
    ASSERT_EQ(atomic_load(&b.runs), 0);
    vset(s, VBASE + 7 * MS);
    ASSERT_EQ(atomic_load(&b.runs), 1);
    ASSERT_EQ(atomic_load(&a.runs), 0);
    vset(s, VBASE + 10 * MS);
    ASSERT_EQ(atomic_load(&a.runs), 1);
    ASSERT_EQ(atomic_load(&b.runs), 1);
    ASSERT_GE(atomic_load(&rate.runs), 3);
    /* Below the service's start: clamped to 0, nothing runs. */
    int runs = atomic_load(&rate.runs);
    vset(s, 0);
    tw__service_kick(s);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&rate.runs), runs);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 1);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* A caller-supplied clock that steps back. */

static uint64_t cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * SEC + (uint64_t)ts.tv_nsec;
}

/*
 * The clock at 10 s steps back to 9 s; a delay-0 task and a 500 ms task
 * are scheduled. Before the fix the delay-0 task was due in the wheel but
 * below the wheel's time, and the timer thread looped on it at 100% CPU
 * until the clock caught up. Now the service's time stays at 10 s: the
 * delay-0 task runs at once, the other 500 ms after 10 s, and the timer
 * thread sleeps meanwhile. Bound: under a third of 400 ms of real time in
 * CPU time for the whole process (a spinning thread takes nearly all).
 */
static void test_clock_step_back(void)
{
    tw_service_config cfg = {0};
    tw_service *s = vclock_service(&cfg);
    atomic_store(&vnow, VBASE + 10 * SEC);
    tw__service_sync(s);
    atomic_store(&vnow, VBASE + 9 * SEC);
    struct runs now = {0}, later = {0};
    ASSERT_EQ(tw_schedule(s, runs_task, &now, 0, NULL), 0);
    ASSERT_EQ(tw_schedule(s, runs_task, &later, 500 * MS, NULL), 0);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&now.n), 1); /* before the fix: 0 */
    uint64_t c0 = cpu_ns(), t0 = mono_now();
    sleep_ns(400 * MS);
    uint64_t cpu = cpu_ns() - c0, real = mono_now() - t0;
    fprintf(stderr, "   %.1f ms CPU in %.1f ms\n", (double)cpu / 1e6,
            (double)real / 1e6);
    ASSERT_LT(cpu, real / 3);
    atomic_store(&vnow, VBASE + 10 * SEC + 499 * MS);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&later.n), 0); /* never early */
    atomic_store(&vnow, VBASE + 10 * SEC + 500 * MS);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&later.n), 1);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/*
 * TW_SERVICE_LAZY_CLOCK with tasks on the timer thread: a 100 ms task is
 * scheduled while a long task runs there; the clock moves 300 ms before
 * the long task returns. Before the fix the call left its deadline to the
 * timer thread, which computed it after the long task: due at 400 ms, 300
 * ms late. Now a call made while a task runs on the timer thread reads the
 * clock itself: due at 100 ms, so it runs as soon as the long task ends.
 */
static void test_lazy_clock_busy_timer_thread(void)
{
    tw_service_config cfg = {0};
    cfg.flags = TW_SERVICE_LAZY_CLOCK;
    tw_service *s = vclock_service(&cfg);
    blocked_reset();
    /* Periodic: its deadline is read at the call (a lazy one may be a
     * tick later, and the virtual clock stands still). */
    tw_id bid = 0;
    ASSERT_EQ(
        tw_schedule_fixed_rate(s, blocking_task, NULL, 0, 100 * SEC, &bid), 0);
    WAIT_FOR(atomic_load(&blocked.running) == 1, 10);
    struct runs b = {0};
    ASSERT_EQ(tw_schedule(s, runs_task, &b, 100 * MS, NULL), 0);
    atomic_store(&vnow, VBASE + 300 * MS);
    atomic_store(&blocked.release, true);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&b.n), 1); /* before the fix: 0 until 400 ms */
    ASSERT_EQ(atomic_load(&b.at), 300 * MS);
    ASSERT(tw_cancel(s, bid));
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

int main(void)
{
    RUN_TEST(test_spurious_virtual);
    RUN_TEST(test_jump_forward);
    RUN_TEST(test_step_back);
    RUN_TEST(test_spurious_real);
    RUN_TEST(test_clock_step_back);
    RUN_TEST(test_lazy_clock_busy_timer_thread);
    return tw_test_done();
}
