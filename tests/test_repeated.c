/* SPDX-License-Identifier: MIT */
/*
 * tests/test_repeated.c - RepeatedTimer semantics in virtual time.
 *
 * The timer runs on a deterministic scheduler with a virtual clock (the
 * tw__sched seam in src/repeated_internal.h): tasks run on this thread,
 * in deadline order, when the test advances the clock. So every count
 * below is exact.
 * The same code on the real tw_service, with threads, is in
 * test_repeated_threads.c.
 */
#define _POSIX_C_SOURCE 200809L

#include "fixture.h"
#include "repeated_internal.h"
#include "test.h"

#define MAX_TASKS 64

/* ---- a virtual-time scheduler ---------------------------------------- */

enum { V_FREE, V_PENDING, V_TAKEN };

struct vtask {
    int state;
    tw_id id;
    tw_task_fn fn;
    void *arg;
    uint64_t due;
};

struct vsched {
    uint64_t now;
    tw_id last_id;
    int fail_next; /* the next schedule calls fail with this code */
    struct vtask t[MAX_TASKS];
};

static int v_schedule(void *ctx, tw_task_fn fn, void *arg, uint64_t delay,
                      tw_id *id)
{
    struct vsched *v = ctx;

    if (v->fail_next != 0)
        return v->fail_next;
    for (int i = 0; i < MAX_TASKS; i++) {
        if (v->t[i].state == V_FREE) {
            v->t[i] = (struct vtask){V_PENDING, ++v->last_id, fn, arg,
                                     v->now + delay};
            *id = v->last_id;
            return 0;
        }
    }
    return TW_EAGAIN;
}

static bool v_cancel(void *ctx, tw_id id)
{
    struct vsched *v = ctx;

    for (int i = 0; i < MAX_TASKS; i++) {
        if (v->t[i].state == V_PENDING && v->t[i].id == id) {
            v->t[i].state = V_FREE;
            return true;
        }
    }
    return false; /* ran, taken, or never existed */
}

static int v_count(const struct vsched *v, int state)
{
    int n = 0;
    for (int i = 0; i < MAX_TASKS; i++)
        n += v->t[i].state == state;
    return n;
}

/* The pending task with the earliest deadline <= @until, or NULL. */
static struct vtask *v_next(struct vsched *v, uint64_t until)
{
    struct vtask *best = NULL;
    for (int i = 0; i < MAX_TASKS; i++) {
        struct vtask *t = &v->t[i];
        if (t->state == V_PENDING && t->due <= until &&
            (best == NULL || t->due < best->due ||
             (t->due == best->due && t->id < best->id)))
            best = t;
    }
    return best;
}

static void v_run(struct vtask *t)
{
    struct vtask copy = *t;
    t->state = V_FREE;
    copy.fn(copy.id, copy.arg);
}

/* Move the clock to @until, running due tasks at their deadlines. */
static void v_advance(struct vsched *v, uint64_t until)
{
    struct vtask *t;
    while ((t = v_next(v, until)) != NULL) {
        v->now = t->due;
        v_run(t);
    }
    if (v->now < until) /* a task may have advanced it further */
        v->now = until;
}

/*
 * Take the next due task as the service does just before running it: a
 * cancel from now on fails. Run it later with v_run().
 */
static struct vtask *v_take(struct vsched *v)
{
    struct vtask *t = v_next(v, UINT64_MAX);
    ASSERT_NOT_NULL(t);
    v->now = t->due;
    t->state = V_TAKEN;
    return t;
}

/* ---- the timer under test -------------------------------------------- */

struct probe {
    int runs, destroyed, adjusts;
    uint64_t last_run;  /* virtual time of the last on_trigger */
    uint64_t adjust_to; /* adjust_timeout's answer, 0 = no change */
    struct vsched *v;
    tw_repeated *rt;
    void (*in_trigger)(struct probe *p); /* optional extra action */
    int in_trigger_rc;
    int trigger_returned_before_destroy;
};

static void on_trigger(tw_repeated *rt, void *arg)
{
    struct probe *p = arg;
    ASSERT(rt == p->rt);
    p->runs++;
    p->last_run = p->v->now;
    if (p->in_trigger != NULL)
        p->in_trigger(p);
}

static void on_destroy(tw_repeated *rt, void *arg)
{
    struct probe *p = arg;
    ASSERT(rt == p->rt);
    p->destroyed++;
}

static uint64_t adjust(tw_repeated *rt, uint64_t timeout, void *arg)
{
    struct probe *p = arg;
    (void)rt;
    p->adjusts++;
    return p->adjust_to != 0 ? p->adjust_to : timeout;
}

static void make(struct vsched *v, struct probe *p, uint64_t timeout)
{
    tw__sched s = {v_schedule, v_cancel, v, NULL};
    tw_repeated_config cfg = {"probe", timeout,    on_trigger,
                              adjust,  on_destroy, p};

    memset(v, 0, sizeof *v);
    memset(p, 0, sizeof *p);
    p->v = v;
    ASSERT_EQ(tw__repeated_create_on(&p->rt, &s, &cfg), 0);
    ASSERT_STR_EQ(tw_repeated_name(p->rt), "probe");
}

static void done(struct probe *p)
{
    tw_repeated_destroy(p->rt);
    ASSERT_EQ(p->destroyed, 1);
    ASSERT_EQ(v_count(p->v, V_PENDING), 0);
}

/* ---- tests ------------------------------------------------------------ */

static void test_bad_input(void)
{
    struct vsched v = {0};
    tw__sched s = {v_schedule, v_cancel, &v, NULL};
    tw_repeated_config ok = {NULL, 50 * MS, on_trigger, NULL, NULL, NULL};
    tw_repeated_config cfg;
    tw_repeated *rt = (tw_repeated *)&v; /* must stay untouched */

    ASSERT_EQ(tw_repeated_create(&rt, NULL, &ok), TW_EINVAL);
    ASSERT_EQ(tw__repeated_create_on(NULL, &s, &ok), TW_EINVAL);
    ASSERT_EQ(tw__repeated_create_on(&rt, NULL, &ok), TW_EINVAL);
    ASSERT_EQ(tw__repeated_create_on(&rt, &s, NULL), TW_EINVAL);
    cfg = ok;
    cfg.timeout_ns = 0;
    ASSERT_EQ(tw__repeated_create_on(&rt, &s, &cfg), TW_EINVAL);
    cfg = ok;
    cfg.on_trigger = NULL;
    ASSERT_EQ(tw__repeated_create_on(&rt, &s, &cfg), TW_EINVAL);
    ASSERT(rt == (tw_repeated *)&v);
    ASSERT_EQ(tw_repeated_start(NULL), TW_EINVAL);
    ASSERT_EQ(tw_repeated_restart(NULL), TW_EINVAL);
    ASSERT_EQ(tw_repeated_reset(NULL, 0), TW_EINVAL);
    ASSERT_EQ(tw_repeated_run_once_now(NULL), TW_EINVAL);
    tw_repeated_stop(NULL);
    tw_repeated_destroy(NULL);
    ASSERT_STR_EQ(tw_repeated_name(NULL), "");

    /* A NULL name reads as "". */
    ASSERT_EQ(tw__repeated_create_on(&rt, &s, &ok), 0);
    ASSERT_STR_EQ(tw_repeated_name(rt), "");
    tw_repeated_destroy(rt);
}

/* At a 50 ms timeout, 20 runs a second; a stopped timer never runs. */
static void test_rate_and_stop(void)
{
    struct vsched v;
    struct probe p;

    make(&v, &p, 50 * MS);
    v_advance(&v, 1000 * MS);
    ASSERT_EQ(p.runs, 0); /* created stopped */
    ASSERT_EQ(tw_repeated_start(p.rt), 0);
    v_advance(&v, 2000 * MS);
    ASSERT_EQ(p.runs, 20);
    ASSERT_EQ(p.last_run, 2000 * MS);
    ASSERT_EQ(v_count(&v, V_PENDING), 1);

    tw_repeated_stop(p.rt);
    ASSERT_EQ(v_count(&v, V_PENDING), 0);
    v_advance(&v, 5000 * MS);
    ASSERT_EQ(p.runs, 20);  /* stop freezes the count */
    tw_repeated_stop(p.rt); /* idempotent */

    ASSERT_EQ(tw_repeated_start(p.rt), 0);
    ASSERT_EQ(tw_repeated_start(p.rt), 0); /* no-op while started */
    ASSERT_EQ(v_count(&v, V_PENDING), 1);
    v_advance(&v, 6000 * MS);
    ASSERT_EQ(p.runs, 40);
    done(&p);
}

/* An adjust hook answering 100 ms halves the rate of a 50 ms timer. */
static void test_adjust_halves_rate(void)
{
    struct vsched v;
    struct probe p;

    make(&v, &p, 50 * MS);
    p.adjust_to = 100 * MS;
    ASSERT_EQ(tw_repeated_start(p.rt), 0);
    v_advance(&v, 1000 * MS);
    ASSERT_EQ(p.runs, 10);
    /* Called before every scheduling: the first and after each run. */
    ASSERT_EQ(p.adjusts, 11);
    p.adjust_to = 0; /* the run at 1100 ms was planned with 100 ms */
    v_advance(&v, 2000 * MS);
    ASSERT_EQ(p.runs, 10 + 1 + 18);
    done(&p);
}

/* Repeated reset postpones the run; a new timeout applies from then on. */
static void test_reset_postpones(void)
{
    struct vsched v;
    struct probe p;

    make(&v, &p, 50 * MS);
    ASSERT_EQ(tw_repeated_reset(p.rt, 0), 0); /* stopped: nothing */
    ASSERT_EQ(v_count(&v, V_PENDING), 0);
    ASSERT_EQ(tw_repeated_start(p.rt), 0);
    for (int i = 1; i <= 100; i++) { /* a "heartbeat" every 40 ms */
        v_advance(&v, (uint64_t)i * 40 * MS);
        ASSERT_EQ(tw_repeated_reset(p.rt, 0), 0);
    }
    ASSERT_EQ(p.runs, 0);
    ASSERT_EQ(v_count(&v, V_PENDING), 1); /* each reset replaced it */
    v_advance(&v, 4049 * MS);
    ASSERT_EQ(p.runs, 0);
    v_advance(&v, 4050 * MS); /* 50 ms after the last heartbeat */
    ASSERT_EQ(p.runs, 1);

    ASSERT_EQ(tw_repeated_reset(p.rt, 200 * MS), 0);
    v_advance(&v, 4249 * MS);
    ASSERT_EQ(p.runs, 1);
    v_advance(&v, 4250 * MS);
    ASSERT_EQ(p.runs, 2);
    v_advance(&v, 4450 * MS);
    ASSERT_EQ(p.runs, 3);

    /* A stopped timer takes a new timeout for its next start. */
    tw_repeated_stop(p.rt);
    ASSERT_EQ(tw_repeated_reset(p.rt, 10 * MS), 0);
    ASSERT_EQ(v_count(&v, V_PENDING), 0);
    ASSERT_EQ(tw_repeated_start(p.rt), 0);
    v_advance(&v, 4550 * MS);
    ASSERT_EQ(p.runs, 13);
    done(&p);
}

/* restart reschedules even when started; it also starts a stopped timer. */
static void test_restart(void)
{
    struct vsched v;
    struct probe p;

    make(&v, &p, 50 * MS);
    ASSERT_EQ(tw_repeated_restart(p.rt), 0);
    v_advance(&v, 30 * MS);
    ASSERT_EQ(tw_repeated_restart(p.rt), 0);
    ASSERT_EQ(v_count(&v, V_PENDING), 1);
    v_advance(&v, 79 * MS);
    ASSERT_EQ(p.runs, 0);
    v_advance(&v, 80 * MS);
    ASSERT_EQ(p.runs, 1);
    /* start after restart is a no-op: the schedule stays. */
    ASSERT_EQ(tw_repeated_start(p.rt), 0);
    v_advance(&v, 130 * MS);
    ASSERT_EQ(p.runs, 2);
    done(&p);
}

/* run_once_now adds one run at once and reschedules from then. */
static void test_run_once_now(void)
{
    struct vsched v;
    struct probe p;

    make(&v, &p, 50 * MS);
    ASSERT_EQ(tw_repeated_start(p.rt), 0);
    v_advance(&v, 1020 * MS);
    ASSERT_EQ(p.runs, 20);
    ASSERT_EQ(tw_repeated_run_once_now(p.rt), 0);
    ASSERT_EQ(p.runs, 21);
    ASSERT_EQ(p.last_run, 1020 * MS);
    ASSERT_EQ(v_count(&v, V_PENDING), 1);
    v_advance(&v, 1069 * MS);
    ASSERT_EQ(p.runs, 21);
    v_advance(&v, 1070 * MS);
    ASSERT_EQ(p.runs, 22);

    /* On a stopped timer: one run, nothing scheduled. */
    tw_repeated_stop(p.rt);
    ASSERT_EQ(tw_repeated_run_once_now(p.rt), 0);
    ASSERT_EQ(p.runs, 23);
    ASSERT_EQ(v_count(&v, V_PENDING), 0);
    v_advance(&v, 5000 * MS);
    ASSERT_EQ(p.runs, 23);
    done(&p);
}

static void nested_run_once(struct probe *p)
{
    p->in_trigger_rc = tw_repeated_run_once_now(p->rt);
}

static void nested_stop(struct probe *p)
{
    tw_repeated_stop(p->rt);
}

static void nested_reset(struct probe *p)
{
    p->in_trigger_rc = tw_repeated_reset(p->rt, 200 * MS);
}

static void nested_restart(struct probe *p)
{
    p->in_trigger_rc = tw_repeated_restart(p->rt);
}

static void nested_stop_start(struct probe *p)
{
    tw_repeated_stop(p->rt);
    p->in_trigger_rc = tw_repeated_start(p->rt);
}

/* A long run: 300 ms pass inside it, and a reset asks for 200 ms. */
static int depth, max_depth;
static void nested_long_run(struct probe *p)
{
    if (++depth > max_depth)
        max_depth = depth;
    p->in_trigger_rc = tw_repeated_reset(p->rt, 200 * MS);
    v_advance(p->v, p->v->now + 300 * MS);
    depth--;
}

static void nested_destroy(struct probe *p)
{
    tw_repeated_destroy(p->rt);
    /* on_destroy waits until this run has returned. */
    p->trigger_returned_before_destroy = p->destroyed == 0;
}

/* Calls from inside on_trigger; the next run is scheduled after it. */
static void test_calls_from_trigger(void)
{
    struct vsched v;
    struct probe p;

    make(&v, &p, 50 * MS);
    p.in_trigger = nested_run_once;
    ASSERT_EQ(tw_repeated_start(p.rt), 0);
    v_advance(&v, 50 * MS);
    ASSERT_EQ(p.runs, 1); /* runs never overlap */
    ASSERT_EQ(p.in_trigger_rc, TW_EBUSY);

    p.in_trigger = nested_reset;
    v_advance(&v, 100 * MS);
    ASSERT_EQ(p.runs, 2);
    ASSERT_EQ(p.in_trigger_rc, 0);
    ASSERT_EQ(v_count(&v, V_PENDING), 1); /* one, not two */
    p.in_trigger = NULL;
    v_advance(&v, 299 * MS);
    ASSERT_EQ(p.runs, 2);
    v_advance(&v, 300 * MS);
    ASSERT_EQ(p.runs, 3);

    p.in_trigger = nested_restart;
    v_advance(&v, 500 * MS);
    ASSERT_EQ(p.runs, 4);
    ASSERT_EQ(p.in_trigger_rc, 0);
    ASSERT_EQ(v_count(&v, V_PENDING), 1);

    p.in_trigger = nested_stop_start;
    v_advance(&v, 700 * MS);
    ASSERT_EQ(p.runs, 5);
    ASSERT_EQ(p.in_trigger_rc, 0);
    ASSERT_EQ(v_count(&v, V_PENDING), 1); /* still started */

    /* Runs never overlap, even when the run outlasts the timeout. */
    p.in_trigger = nested_long_run;
    v_advance(&v, 900 * MS);
    ASSERT_EQ(p.runs, 6);
    ASSERT_EQ(max_depth, 1);
    ASSERT_EQ(v.now, 1200 * MS);
    p.in_trigger = NULL;
    v_advance(&v, 1399 * MS); /* fixed delay: 200 ms after it returned */
    ASSERT_EQ(p.runs, 6);
    v_advance(&v, 1400 * MS);
    ASSERT_EQ(p.runs, 7);
    ASSERT_EQ(tw_repeated_reset(p.rt, 50 * MS), 0);
    v_advance(&v, 1450 * MS);
    ASSERT_EQ(p.runs, 8);

    p.in_trigger = nested_stop;
    v_advance(&v, 1500 * MS);
    ASSERT_EQ(p.runs, 9);
    ASSERT_EQ(v_count(&v, V_PENDING), 0);
    v_advance(&v, 5000 * MS);
    ASSERT_EQ(p.runs, 9);

    p.in_trigger = nested_destroy;
    ASSERT_EQ(tw_repeated_start(p.rt), 0);
    v_advance(&v, 5050 * MS);
    ASSERT_EQ(p.runs, 10);
    ASSERT_EQ(p.destroyed, 1);
    ASSERT(p.trigger_returned_before_destroy);
    ASSERT_EQ(v_count(&v, V_PENDING), 0);
}

/*
 * A run the service has already taken cannot be cancelled. stop, reset and
 * destroy must leave it harmless: it must not run on_trigger, and destroy's
 * on_destroy must wait for it (it still holds the timer's memory).
 */
static void test_stale_task(void)
{
    struct vsched v;
    struct probe p;
    struct vtask *t;

    make(&v, &p, 50 * MS);
    ASSERT_EQ(tw_repeated_start(p.rt), 0);
    t = v_take(&v);
    tw_repeated_stop(p.rt);
    v_run(t);
    ASSERT_EQ(p.runs, 0);

    ASSERT_EQ(tw_repeated_start(p.rt), 0);
    t = v_take(&v);
    ASSERT_EQ(tw_repeated_reset(p.rt, 0), 0); /* a heartbeat just in time */
    v_run(t);
    ASSERT_EQ(p.runs, 0);
    ASSERT_EQ(v_count(&v, V_PENDING), 1);
    v_advance(&v, v.now + 50 * MS);
    ASSERT_EQ(p.runs, 1);

    /* run_once_now while the service holds a taken task: one run only. */
    t = v_take(&v);
    ASSERT_EQ(tw_repeated_run_once_now(p.rt), 0);
    ASSERT_EQ(p.runs, 2);
    v_run(t);
    ASSERT_EQ(p.runs, 2);

    t = v_take(&v);
    tw_repeated_destroy(p.rt);
    ASSERT_EQ(p.destroyed, 0); /* the taken task still points at it */
    v_run(t);
    ASSERT_EQ(p.runs, 2);
    ASSERT_EQ(p.destroyed, 1);
    ASSERT_EQ(v_count(&v, V_PENDING), 0);
}

/* A failed schedule changes nothing. */
static void test_schedule_failure(void)
{
    struct vsched v;
    struct probe p;

    make(&v, &p, 50 * MS);
    v.fail_next = TW_ENOMEM;
    ASSERT_EQ(tw_repeated_start(p.rt), TW_ENOMEM);
    ASSERT_EQ(tw_repeated_restart(p.rt), TW_ENOMEM);
    v.fail_next = 0;
    v_advance(&v, 1000 * MS);
    ASSERT_EQ(p.runs, 0); /* still stopped */
    ASSERT_EQ(tw_repeated_start(p.rt), 0);

    v_advance(&v, 1020 * MS);
    v.fail_next = TW_ESHUTDOWN;
    ASSERT_EQ(tw_repeated_reset(p.rt, 500 * MS), TW_ESHUTDOWN);
    ASSERT_EQ(tw_repeated_restart(p.rt), TW_ESHUTDOWN);
    v.fail_next = 0;
    v_advance(&v, 1050 * MS); /* the old schedule and timeout stand */
    ASSERT_EQ(p.runs, 1);
    v_advance(&v, 1100 * MS);
    ASSERT_EQ(p.runs, 2);

    /* A run whose rescheduling fails does not stop the timer: the
     * failure is counted, and the next start arms it again. */
    ASSERT_EQ(tw_repeated_rearm_failures(p.rt), 0);
    v.fail_next = TW_EAGAIN;
    v_advance(&v, 1150 * MS);
    ASSERT_EQ(p.runs, 3);
    ASSERT_EQ(v_count(&v, V_PENDING), 0);
    ASSERT_EQ(tw_repeated_rearm_failures(p.rt), 1);
    v.fail_next = 0;
    ASSERT_EQ(tw_repeated_start(p.rt), 0); /* started, nothing armed */
    ASSERT_EQ(v_count(&v, V_PENDING), 1);
    ASSERT_EQ(tw_repeated_start(p.rt), 0); /* armed: a no-op */
    ASSERT_EQ(v_count(&v, V_PENDING), 1);
    v_advance(&v, 1200 * MS);
    ASSERT_EQ(p.runs, 4);
    ASSERT_EQ(v_count(&v, V_PENDING), 1);
    /* The same for a reset after a failed re-arm. */
    v.fail_next = TW_ENOMEM;
    ASSERT_EQ(tw_repeated_run_once_now(p.rt), TW_ENOMEM);
    ASSERT_EQ(p.runs, 5);
    ASSERT_EQ(tw_repeated_rearm_failures(p.rt), 2);
    ASSERT_EQ(v_count(&v, V_PENDING), 0);
    v.fail_next = 0;
    ASSERT_EQ(tw_repeated_reset(p.rt, 0), 0);
    v_advance(&v, 1250 * MS);
    ASSERT_EQ(p.runs, 6);
    /* A stopped timer: run_once_now runs once and schedules nothing. */
    tw_repeated_stop(p.rt);
    ASSERT_EQ(tw_repeated_run_once_now(p.rt), 0);
    ASSERT_EQ(p.runs, 7);
    ASSERT_EQ(v_count(&v, V_PENDING), 0);
    ASSERT_EQ(tw_repeated_rearm_failures(p.rt), 2);
    done(&p);
}

/* destroy: on_destroy once, at once when idle; calls after it are refused. */
static void test_destroy(void)
{
    struct vsched v;
    struct probe p;

    make(&v, &p, 50 * MS);
    done(&p); /* never started */

    make(&v, &p, 50 * MS);
    ASSERT_EQ(tw_repeated_start(p.rt), 0);
    v_advance(&v, 120 * MS);
    done(&p); /* cancels the pending run */
    v_advance(&v, 1000 * MS);
    ASSERT_EQ(p.runs, 2);
    ASSERT_EQ(p.destroyed, 1);
}

/* Tasks handed back by a stopping service release their timers. */
static void test_unprocessed(void)
{
    struct vsched v;
    struct probe p;
    struct vtask t;

    ASSERT(tw_repeated_owns(tw__repeated_task));
    ASSERT(!tw_repeated_owns(NULL));
    make(&v, &p, 50 * MS);
    ASSERT_EQ(tw_repeated_start(p.rt), 0);
    t = *v_next(&v, UINT64_MAX);
    ASSERT(tw_repeated_owns(t.fn));
    v.t[0].state = V_FREE; /* the service gives it back */
    tw_repeated_unprocessed(t.id, t.fn, t.arg, NULL);
    tw_repeated_unprocessed(t.id, NULL, &p, NULL); /* not ours: ignored */
    v_advance(&v, 1000 * MS);
    ASSERT_EQ(p.runs, 0);
    /* The timer is stopped; starting needs a running service. */
    v.fail_next = TW_ESHUTDOWN;
    ASSERT_EQ(tw_repeated_start(p.rt), TW_ESHUTDOWN);
    v.fail_next = 0;
    done(&p);
}

int main(void)
{
    RUN_TEST(test_bad_input);
    RUN_TEST(test_rate_and_stop);
    RUN_TEST(test_adjust_halves_rate);
    RUN_TEST(test_reset_postpones);
    RUN_TEST(test_restart);
    RUN_TEST(test_run_once_now);
    RUN_TEST(test_calls_from_trigger);
    RUN_TEST(test_stale_task);
    RUN_TEST(test_schedule_failure);
    RUN_TEST(test_destroy);
    RUN_TEST(test_unprocessed);
    return tw_test_done();
}
