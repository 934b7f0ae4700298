/* SPDX-License-Identifier: MIT */
/*
 * fuzz/fuzz_service.c - the service's request path on a virtual clock.
 *
 * The input picks a configuration (tick, wheel shape, executor threads or a
 * caller-supplied executor, max_pending, the lazy clock) and a sequence of
 * requests on a small set of task slots: one-shot, fixed-rate and fixed-delay
 * schedules with delays from the corners (0, 1 ns, a tick +- 1, huge,
 * overflowing), cancels (live, stale, foreign and forged ids), bad input,
 * spurious wake-ups, stop in the middle, and moves of the virtual clock, after
 * each of which the harness waits for a timer round (tw__service_sync).
 *
 * Checked against a model of every task:
 * - no task runs before its deadline; a one-shot task runs at most once and
 *   never after a cancel that returned true; a periodic run k of a
 *   fixed-rate task is not before start + initial + k * period, a
 *   fixed-delay run not before the previous run + delay; runs of one task
 *   never overlap;
 * - after the clock reaches a one-shot task's tick, it has run;
 * - error codes: TW_EINVAL, TW_EAGAIN at max_pending, TW_ESHUTDOWN after
 *   stop, each with the pending count unchanged and *id untouched;
 * - tw_cancel() returns true exactly for a task that can still be stopped;
 *   a stale or foreign id returns false;
 * - tw_service_pending() equals the model; stop hands back exactly the
 *   tasks that neither ran nor were cancelled, each once, and returns that
 *   number; every accepted task has exactly one outcome.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>

#include <twheel/service.h>

#include "service_internal.h"

#include "fuzz.h"

#define NT 24
#define VBASE (UINT64_C(1) << 40)

enum { K_ONE, K_RATE, K_DELAY };
enum { T_IDLE, T_PENDING, T_RAN, T_CANCELLED, T_HANDED };

typedef struct ftask {
    int kind;
    int state;
    tw_id id;
    uint64_t due;    /* relative ns; UINT64_MAX: never */
    uint64_t due_hi; /* lazy clock: the latest deadline the service may
                        compute (the clock when it takes the request) */
    uint64_t delay;
    bool unresolved; /* lazy: the clock has not moved since the call */
    uint64_t period;
    uint64_t last; /* relative ns of the last run's start */
    int runs;
    bool running;
    bool cancel_self; /* periodic: cancel itself in its next run */
    bool draining;    /* cancelled periodic: a run the service had begun
                         may still enter the function; the slot is not
                         reused before a timer round has passed */
    int runs_after_cancel;
} ftask;

static struct {
    tw_service *s;
    uint64_t tick;
    uint64_t max_pending;
    bool stopped;
    bool lazy; /* TW_SERVICE_LAZY_CLOCK */
    ftask t[NT];
    tw_id dead[8]; /* ids of tasks that are gone */
    unsigned ndead;
    uint64_t runs;      /* all task runs */
    tw_id waiting;      /* the harness is in tw_cancel_wait() on it */
    pthread_mutex_t mu; /* the model; callbacks run on other threads */
} F = {.mu = PTHREAD_MUTEX_INITIALIZER};

static _Atomic uint64_t vnow;

static uint64_t vclock(void *ctx)
{
    (void)ctx;
    return atomic_load(&vnow);
}

static uint64_t rel_now(void)
{
    return atomic_load(&vnow) - VBASE;
}

/* The relative time at which the timer thread runs something due at @due. */
static uint64_t ready_at(uint64_t due)
{
    if (due == UINT64_MAX)
        return UINT64_MAX;
    uint64_t ticks = due / F.tick + (due % F.tick != 0);
    return ticks > UINT64_MAX / F.tick ? UINT64_MAX : ticks * F.tick;
}

static size_t model_pending(void)
{
    size_t n = 0;
    for (int i = 0; i < NT; i++)
        n += F.t[i].state == T_PENDING;
    return n;
}

/* The earliest time the next run of @t may start (see task_fn). */
static uint64_t next_run_at(const ftask *t)
{
    if (t->kind == K_RATE) {
        uint64_t k = (uint64_t)t->runs;
        return k != 0 && t->period > (UINT64_MAX - t->due) / k
                   ? UINT64_MAX
                   : t->due + k * t->period;
    }
    if (t->kind == K_DELAY && t->runs > 0)
        return fz_sat_add(t->last, t->period);
    return t->due;
}

/* Tasks that may leave the pending count by themselves: pending one-shot
 * tasks whose time has come (the service may be running them right now),
 * and periodic tasks that cancel themselves in a run that is due or under
 * way. The service's counts may already have moved past the model. */
static size_t model_racy(void)
{
    size_t n = 0;
    uint64_t now = rel_now();
    for (int i = 0; i < NT; i++) {
        const ftask *t = &F.t[i];
        if (t->state != T_PENDING)
            continue;
        if (t->kind == K_ONE)
            n += ready_at(t->due) <= now;
        else
            n += t->cancel_self &&
                 (t->running || ready_at(next_run_at(t)) <= now);
    }
    return n;
}

static void add_dead(tw_id id)
{
    F.dead[F.ndead++ % 8] = id;
}

static void task_fn(tw_id id, void *arg)
{
    ftask *t = arg;
    uint64_t now = rel_now();
    pthread_mutex_lock(&F.mu);
    FZ_CHECK(id == t->id, "task got id %" PRIx64 ", scheduled as %" PRIx64, id,
             t->id);
    /* A periodic task cancelled while the service was already starting
     * this run (it counts as in progress) may run once more. */
    FZ_CHECK(t->state == T_PENDING ||
                 (t->kind != K_ONE && t->state == T_CANCELLED &&
                  t->runs_after_cancel++ == 0),
             "task %d ran in state %d", (int)(t - F.t), t->state);
    FZ_CHECK(!t->running, "runs of one task overlap");
    FZ_CHECK(t->due != UINT64_MAX, "a task due never ran");
    uint64_t not_before = next_run_at(t);
    FZ_CHECK(now >= not_before, "task %d run %d at %" PRIu64 " before %" PRIu64,
             (int)(t - F.t), t->runs, now, not_before);
    t->runs++;
    F.runs++;
    t->last = now;
    t->running = true;
    if (t->kind == K_ONE) {
        t->state = T_RAN;
        add_dead(id);
    }
    pthread_mutex_unlock(&F.mu);

    /* Calls a task may make on its own service. */
    FZ_CHECK(tw_service_stop(F.s, NULL, NULL) == TW_EDEADLK,
             "stop from a task");
    FZ_CHECK(tw_cancel_wait(F.s, id) == TW_EDEADLK, "cancel_wait of itself");
    if (t->kind == K_ONE)
        FZ_CHECK(!tw_cancel(F.s, id), "a running one-shot task cancelled");

    pthread_mutex_lock(&F.mu);
    if (t->cancel_self && t->kind != K_ONE && t->state == T_PENDING) {
        if (tw_cancel(F.s, id)) {
            t->state = T_CANCELLED;
            t->runs_after_cancel = 1;
        } else {
            FZ_CHECK(F.waiting == id, "periodic task cannot cancel itself");
        }
        add_dead(id);
    }
    t->running = false;
    pthread_mutex_unlock(&F.mu);
}

static void unprocessed(tw_id id, tw_task_fn fn, void *arg, void *ctx)
{
    ftask *t = arg;
    (void)ctx;
    FZ_CHECK(fn == task_fn, "handed back with another function");
    /* No lock: stop hands tasks back after joining the service's threads,
     * and it holds the service's stop lock, which tw_schedule() may take
     * (it starts the service) while the harness holds F.mu. */
    FZ_CHECK(t >= F.t && t < F.t + NT && id == t->id, "unknown task");
    FZ_CHECK(t->state == T_PENDING, "task %d handed back in state %d",
             (int)(t - F.t), t->state);
    t->state = T_HANDED;
}

/* A caller-supplied executor that runs each job at once. */
static void run_inline(tw_service *s, tw_id job, void *ctx)
{
    (void)ctx;
    tw_service_run(s, job);
}

/* A delay or period drawn from the corners. */
static uint64_t pick_ns(fz_reader *r)
{
    uint8_t sel = fz_u8(r), b = fz_u8(r);
    switch (sel % 12) {
    case 0:
        return 0;
    case 1:
        return 1;
    case 2:
        return F.tick - 1;
    case 3:
        return F.tick;
    case 4:
        return F.tick + 1;
    case 5:
        return (uint64_t)b * F.tick;
    case 6:
        return (uint64_t)b * F.tick + 1 + b % 3;
    case 7:
        return (uint64_t)b * 1000;
    case 8:
        return UINT64_MAX;
    case 9: /* around the overflow of now + delay */
        return fz_sat_sub(UINT64_MAX - rel_now(), b);
    case 10:
        return (uint64_t)1 << (b % 64);
    default:
        return fz_u64(r);
    }
}

/* Quiescent: the clock is still and a timer round has passed. */
static void check_quiet(void)
{
    uint64_t now = rel_now();
    pthread_mutex_lock(&F.mu);
    for (int i = 0; i < NT; i++) {
        const ftask *t = &F.t[i];
        if (t->kind == K_ONE && t->state == T_PENDING)
            FZ_CHECK(ready_at(t->due_hi) > now,
                     "task %d due at %" PRIu64 " has not run at %" PRIu64, i,
                     t->due_hi, now);
    }
    uint64_t p = tw_service_pending(F.s);
    FZ_CHECK(p == model_pending(), "pending %" PRIu64 ", model %zu", p,
             model_pending());
    tw_service_stats st;
    tw_service_get_stats(F.s, &st);
    FZ_CHECK(st.pending == p && st.ran == F.runs,
             "stats: pending %" PRIu64 ", ran %" PRIu64 ", model %" PRIu64,
             st.pending, st.ran, F.runs);
    pthread_mutex_unlock(&F.mu);
}

/* A timer round has passed (or the service stopped): no run is in flight. */
static void undrain(void)
{
    pthread_mutex_lock(&F.mu);
    for (int i = 0; i < NT; i++)
        F.t[i].draining = false;
    pthread_mutex_unlock(&F.mu);
}

static void do_schedule(fz_reader *r, int kind)
{
    ftask *t = &F.t[fz_u8(r) % NT];
    uint64_t delay = pick_ns(r);
    uint64_t period = kind == K_ONE ? 0 : pick_ns(r);
    if (kind != K_ONE && period == 0)
        period = 1; /* zero is the bad-input case below */
    pthread_mutex_lock(&F.mu);
    if (t->state == T_PENDING || t->running || t->draining) {
        pthread_mutex_unlock(&F.mu);
        return;
    }
    uint64_t before = tw_service_pending(F.s);
    tw_id id = 0;
    uint64_t rel = rel_now();
    int rc = kind == K_ONE ? tw_schedule(F.s, task_fn, t, delay, &id)
             : kind == K_RATE
                 ? tw_schedule_fixed_rate(F.s, task_fn, t, delay, period, &id)
                 : tw_schedule_fixed_delay(F.s, task_fn, t, delay, period, &id);
    size_t hi = model_pending(), racy = model_racy();
    int want = F.stopped                              ? TW_ESHUTDOWN
               : F.max_pending && hi >= F.max_pending ? TW_EAGAIN
                                                      : 0;
    /* Full by the model but a due task may just have started. */
    bool either = want == TW_EAGAIN && hi - racy < F.max_pending;
    FZ_CHECK(rc == want || (either && rc == 0),
             "schedule returned %d, "
             "expected %d",
             rc, want);
    if (rc != 0) {
        FZ_CHECK(id == 0, "*id written on failure");
        FZ_CHECK(racy || tw_service_pending(F.s) == before, "pending moved");
    } else {
        FZ_CHECK(id != 0, "id 0");
        memset(t, 0, sizeof *t);
        t->kind = kind;
        t->state = T_PENDING;
        t->id = id;
        t->period = period;
        t->due = t->due_hi = fz_sat_add(rel, delay);
        t->delay = delay;
        t->unresolved = F.lazy && kind == K_ONE;
        if (t->unresolved)
            t->due_hi = fz_sat_add(rel | 1, delay);
    }
    pthread_mutex_unlock(&F.mu);
}

static void do_cancel(fz_reader *r)
{
    uint8_t b = fz_u8(r);
    ftask *t = &F.t[b % NT];
    pthread_mutex_lock(&F.mu);
    if (t->state == T_IDLE) {
        pthread_mutex_unlock(&F.mu);
        return;
    }
    bool got;
    if (b & 128) {
        /* cancel_wait waits for a run in progress, which needs F.mu. */
        tw_id id = t->id;
        F.waiting = id;
        pthread_mutex_unlock(&F.mu);
        int rc = tw_cancel_wait(F.s, id);
        pthread_mutex_lock(&F.mu);
        F.waiting = 0;
        FZ_CHECK(rc == 0 || rc == 1, "cancel_wait: %d", rc);
        FZ_CHECK(!t->running, "task %d running after cancel_wait",
                 (int)(t - F.t));
        got = rc == 1;
    } else {
        got = tw_cancel(F.s, t->id);
    }
    if (got)
        /* After cancel_wait nothing runs any more; after a cancel, a run
         * the service had already begun may still enter the function. */
        t->runs_after_cancel = t->running || (b & 128) ? 1 : 0;
    if (got && t->kind != K_ONE && !(b & 128))
        t->draining = true;
    /* A one-shot task whose time has come may be running right now. */
    bool racy = t->kind == K_ONE && ready_at(t->due) <= rel_now();
    bool want = t->state == T_PENDING;
    FZ_CHECK(got == want || (racy && !got),
             "cancel of task %d in state %d"
             " returned %d",
             (int)(t - F.t), t->state, got);
    if (got) {
        t->state = T_CANCELLED;
        add_dead(t->id);
    }
    pthread_mutex_unlock(&F.mu);
}

static void do_bad_ids(fz_reader *r)
{
    uint8_t b = fz_u8(r);
    tw_id id;
    pthread_mutex_lock(&F.mu);
    switch (b % 4) {
    case 0:
        id = F.ndead ? F.dead[b / 4 % (F.ndead < 8 ? F.ndead : 8)] : 0;
        break;
    case 1:
        id = 0;
        break;
    case 2:
        id = F.t[b / 4 % NT].id ^ (UINT64_C(1) << 40);
        break;
    default:
        id = (uint64_t)b << 32 | UINT32_MAX;
        break;
    }
    uint64_t before = tw_service_pending(F.s);
    /* Due tasks may run (and leave the pending count) by themselves. */
    bool racy = model_racy() != 0;
    FZ_CHECK(!tw_cancel(F.s, id), "cancel of a dead or forged id %" PRIx64, id);
    /* A forged job id is ignored. (Not a dead id: that may name a job an
     * executor still holds, and running a job twice is misuse.) */
    if (b % 4 != 0) {
        /* Only meaningful when no task can be running by itself. */
        bool quiet = !racy;
        for (int i = 0; i < NT; i++)
            quiet &= !(F.t[i].kind != K_ONE &&
                       (F.t[i].state == T_PENDING || F.t[i].draining));
        uint64_t runs = F.runs;
        pthread_mutex_unlock(&F.mu);
        tw_service_run(F.s, id);
        pthread_mutex_lock(&F.mu);
        FZ_CHECK(F.runs == runs || !quiet, "tw_service_run ran a task");
    }
    FZ_CHECK(racy || tw_service_pending(F.s) == before, "pending moved");
    pthread_mutex_unlock(&F.mu);
}

static void do_bad_input(void)
{
    tw_id id = 7;
    pthread_mutex_lock(&F.mu);
    uint64_t before = tw_service_pending(F.s);
    bool racy = model_racy() != 0;
    FZ_CHECK(tw_schedule(F.s, NULL, NULL, 1, &id) == TW_EINVAL, "NULL fn");
    FZ_CHECK(tw_schedule_fixed_rate(F.s, task_fn, NULL, 1, 0, &id) == TW_EINVAL,
             "zero period");
    FZ_CHECK(tw_schedule_fixed_delay(F.s, task_fn, NULL, 0, 0, &id) ==
                 TW_EINVAL,
             "zero delay");
    FZ_CHECK(tw_schedule(NULL, task_fn, NULL, 1, &id) == TW_EINVAL, "NULL s");
    FZ_CHECK(id == 7, "*id written on failure");
    FZ_CHECK(racy || tw_service_pending(F.s) == before, "changed");
    pthread_mutex_unlock(&F.mu);
}

static void do_stop(void)
{
    if (F.stopped)
        return;
    pthread_mutex_lock(&F.mu);
    size_t expect = model_pending();
    pthread_mutex_unlock(&F.mu);
    int n = tw_service_stop(F.s, unprocessed, NULL);
    F.stopped = true;
    pthread_mutex_lock(&F.mu);
    size_t handed = 0;
    for (int i = 0; i < NT; i++) {
        ftask *t = &F.t[i];
        handed += t->state == T_HANDED;
        /* Due one-shot tasks may have run instead of being handed back. */
        FZ_CHECK(t->state != T_PENDING, "task %d has no outcome", i);
        FZ_CHECK(!t->running, "task %d still running after stop", i);
        if (t->state == T_HANDED)
            t->state = T_CANCELLED; /* gone, for the ops that follow */
    }
    FZ_CHECK(n >= 0 && (size_t)n == handed && handed <= expect,
             "stop returned %d, %zu handed back, %zu pending", n, handed,
             expect);
    FZ_CHECK(tw_service_pending(F.s) == 0, "pending after stop");
    pthread_mutex_unlock(&F.mu);
    undrain();
    FZ_CHECK(tw_service_stop(F.s, unprocessed, NULL) == 0, "second stop");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const uint64_t ticks[] = {1000000, 1000, 250000, 3000000};
    static const uint32_t slots[] = {0, 1, 8, 64};
    static const uint32_t levels[] = {0, 1, 2, 0};
    static const uint32_t execs[] = {0, 0, 1, 2}; /* 0 twice: see below */
    fz_reader rd = {data, size}, *r = &rd;
    uint8_t c = fz_u8(r), m = fz_u8(r);
    tw_service_config cfg = {0};
    cfg.tick_ns = ticks[c & 3];
    cfg.ticks_per_wheel = slots[(c >> 2) & 3];
    cfg.levels = levels[(c >> 4) & 3];
    cfg.executor_threads = execs[(c >> 6) & 3];
    cfg.max_pending = m % 4 == 0 ? m / 4 % 8 : 0;
    cfg.clock = vclock;
    uint8_t opts = fz_u8(r);
    if (opts & 2)
        cfg.flags |= TW_SERVICE_LAZY_CLOCK;
    if ((c >> 6) == 1)
        cfg.execute = run_inline; /* an executor supplied by the caller */

    memset(F.t, 0, sizeof F.t);
    F.runs = 0;
    F.ndead = 0;
    F.stopped = false;
    F.lazy = (cfg.flags & TW_SERVICE_LAZY_CLOCK) != 0;
    F.tick = cfg.tick_ns;
    F.max_pending = cfg.max_pending;
    atomic_store(&vnow, VBASE);
    int rc = tw_service_create(&F.s, &cfg);
    FZ_CHECK(rc == 0, "create: %d", rc);
    if (opts & 1)
        FZ_CHECK(tw_service_start(F.s) == 0, "start");

    while (fz_more(r)) {
        uint8_t op = fz_u8(r);
        switch (op % 12) {
        case 0:
        case 1:
            do_schedule(r, K_ONE);
            break;
        case 2:
            do_schedule(r, K_RATE);
            break;
        case 3:
            do_schedule(r, K_DELAY);
            break;
        case 4:
            do_cancel(r);
            break;
        case 5:
        case 6: {
            uint64_t d = op % 12 == 5 ? (uint64_t)fz_u8(r) * F.tick / 4
                                      : pick_ns(r) / 16;
            uint64_t v = atomic_load(&vnow);
            atomic_store(&vnow, fz_sat_add(v, d));
            /* A lazy request is taken, and its deadline computed, at some
             * clock reading from its call up to the new time. */
            pthread_mutex_lock(&F.mu);
            for (int i = 0; i < NT; i++) {
                ftask *t = &F.t[i];
                if (t->unresolved && !F.stopped) {
                    /* The service reads "now | 1" (never 0). */
                    t->due_hi = fz_sat_add(rel_now() | 1, t->delay);
                    t->unresolved = false;
                }
            }
            pthread_mutex_unlock(&F.mu);
            if (!F.stopped && tw_service_start(F.s) == 0) {
                tw__service_sync(F.s);
                check_quiet();
                undrain();
            }
            break;
        }
        case 7:
            if (!F.stopped)
                tw__service_kick(F.s);
            break;
        case 8: {
            ftask *t = &F.t[fz_u8(r) % NT];
            pthread_mutex_lock(&F.mu);
            t->cancel_self = true;
            pthread_mutex_unlock(&F.mu);
            break;
        }
        case 9:
            do_bad_ids(r);
            break;
        case 10:
            do_bad_input();
            break;
        default:
            if (fz_u8(r) % 4 == 0)
                do_stop();
            break;
        }
    }
    do_stop();
    FZ_CHECK(tw_service_start(F.s) == TW_ESHUTDOWN, "start after stop");
    tw_service_destroy(F.s);
    F.s = NULL;
    return 0;
}
