/* SPDX-License-Identifier: MIT */
/*
 * src/service_run.c - dispatch and run: the wheel's callback for every
 * task record (tw__svc_trampoline()) runs a due task on the timer thread,
 * or queues it for this round's dispatch to the executor pool
 * (src/exec_pool.c) or the caller's executor (tw_service_run()); after a
 * run a one-shot task's record is freed and a periodic task goes back to
 * the wheel or the submission stack.
 */

#define _POSIX_C_SOURCE 200809L

#include "twheel/service.h"

#include <pthread.h>
#include <stdatomic.h>

#include "service_impl.h"
#include "wheel_internal.h"

/* Defined below, in the order a call meets them. */
static void run_node(tw_service *s, struct node *n, bool inline_wheel);
static void call_task(tw_service *s, struct node *n, uint64_t rst, tw_id id,
                      bool timer_thread);
static uint64_t run_start_ns(tw_service *s, bool timer_thread);
static void late_count(tw_service *s, uint64_t start_ns, uint64_t due_tick);
static void hold_release(tw_service *s, struct node *n, uint64_t running);
static uint64_t periodic_next(const tw_service *s, struct periodic *rec);
static void requeue(tw_service *s, struct node *n, uint64_t tick);
static void subq_push(tw_service *s, struct node *n);
static void notify_waiters(tw_service *s);
static void run_dispatched(tw_service *s, struct node *n);

/* The wheel's callback for every node: run it here, or queue it for this
 * round's dispatch. The node's chunk names its service. Context: timer
 * thread. */
void tw__svc_trampoline(tw_timer *t, void *arg)
{
    (void)arg;
    struct node *n = node_of_timer(t);
    tw_service *s = node_owner(n);
    if (s->cfg.execute == NULL && s->cfg.nexec == 0) {
        /* With the lazy clock: while a task runs here nobody takes the
         * submissions, so calls meanwhile read the clock themselves. */
        if (s->cfg.lazy)
            atomic_store_explicit(&s->timer.in_task, true,
                                  memory_order_relaxed);
        run_node(s, n, true);
        if (s->cfg.lazy)
            atomic_store_explicit(&s->timer.in_task, false,
                                  memory_order_relaxed);
        return;
    }
    uint64_t st;
    if (!move_or_free(s, n, LOC_DISPATCHED, 0, true, &st))
        return;
    atomic_fetch_add(&s->busy, 1);
    s->timer.disp_count++;
    n->t.tw__next = NULL;
    if (s->timer.disp_last != NULL)
        s->timer.disp_last->t.tw__next = &n->t;
    else
        s->timer.disp_first = n;
    s->timer.disp_last = n;
}

/*
 * Run owned node @n (location ARMED or DISPATCHED), or free it if it was
 * cancelled.
 * @inline_wheel: we are the timer thread inside tw_wheel_advance, and a
 * periodic task goes straight back into the wheel.
 */
static void run_node(tw_service *s, struct node *n, bool inline_wheel)
{
    uint64_t rst;
    if (!move_or_free(s, n, LOC_RUNNING, 0, inline_wheel, &rst)) {
        /* A cancelled job that tw_service_run() accepted was RUNNING for
         * a moment: a tw_cancel_wait() may have seen that and sleeps. */
        if (!inline_wheel)
            notify_waiters(s);
        return;
    }
    tw_id id = make_id(rst, node_index(n));
    TEST_HOOK(tw__service_started_hook, s, id);
    call_task(s, n, rst, id, inline_wheel);
    if (!(rst & ST_PERIODIC)) {
        if (inline_wheel)
            node_free_batched(&s->pool, n);
        else
            node_free(&s->pool, n);
    } else {
        uint64_t tick = ceil_tick(s, periodic_next(s, n->t.tw__arg));
        if (!inline_wheel)
            requeue(s, n, tick);
        else if (move_or_free(s, n, LOC_ARMED, 0, true, &rst) && tick != NEVER)
            tw__wheel_add_any(s->timer.wheel, &n->t, tick);
    }
    notify_waiters(s);
}

/* Call the function of node @n, which has just become RUNNING (state
 * @rst), as task @id; a one-shot task's slot is released first.
 * @timer_thread: called by the timer thread (for run_start_ns()). */
static void call_task(tw_service *s, struct node *n, uint64_t rst, tw_id id,
                      bool timer_thread)
{
    bool periodic = (rst & ST_PERIODIC) != 0;
    bool hold = (rst & ST_HOLD) != 0;
    if (!periodic && !hold)
        pending_drop(s);
    void *arg =
        periodic ? ((struct periodic *)n->t.tw__arg)->arg : n->t.tw__arg;
    tw_task_fn fn = fn_at(&s->fns, rst);
    tw_service *saved_s = tw__svc_cur.s;
    tw_id saved_id = tw__svc_cur.id;
    tw__svc_cur.s = s;
    tw__svc_cur.id = id;
    uint64_t due_tick = n->t.tw__expires;
    uint64_t start = run_start_ns(s, timer_thread);
    fn(id, arg);
    tw__svc_cur.s = saved_s;
    tw__svc_cur.id = saved_id;
    late_count(s, start, due_tick);
    if (hold)
        hold_release(s, n, (rst & ~ST_LOC_MASK) | LOC_RUNNING);
}

/* The clock (relative ns) at the start of a run. The timer thread reuses
 * its round's reading for the first task it runs after it (nothing ran in
 * between), which saves the clock read when a wake-up runs one task; with
 * TW_SERVICE_LAZY_CLOCK for every task of the round. */
static uint64_t run_start_ns(tw_service *s, bool timer_thread)
{
    if (timer_thread && (s->timer.round_fresh || s->cfg.lazy)) {
        s->timer.round_fresh = false;
        return s->timer.round_ns;
    }
    return rel_ns(s);
}

/* Count a run that started at @start_ns, due at tick @due_tick, in the
 * lateness histogram (which is also the count of runs). */
static void late_count(tw_service *s, uint64_t start_ns, uint64_t due_tick)
{
    uint64_t due;
    if (__builtin_mul_overflow(due_tick, s->cfg.tick_ns, &due))
        due = UINT64_MAX; /* no division on this path: it runs per task */
    uint64_t late_us = start_ns > due ? (start_ns - due) / 1000u : 0;
    atomic_fetch_add_explicit(&s->late[tw__late_bucket(late_us)], 1,
                              memory_order_relaxed);
}

/* The end of the run of ST_HOLD node @n (state @running): release its
 * pending slot unless a replacing call took it over. That call may have set
 * ST_DROPPED before the run's own state reading (in the window between an
 * executor's acceptance and the run), so the bit is cleared from what the
 * compare-and-swap expects: whoever sets it first decides. */
static void hold_release(tw_service *s, struct node *n, uint64_t running)
{
    running &= ~ST_DROPPED;
    if (atomic_compare_exchange_strong(&n->state, &running,
                                       running | ST_DROPPED))
        pending_drop(s);
}

/* The next deadline (relative ns) of periodic task @rec after a run. */
static uint64_t periodic_next(const tw_service *s, struct periodic *rec)
{
    uint64_t now = rel_ns(s);
    if (!rec->fixed_rate)
        return add_sat(now, rec->period_ns);
    uint64_t next = add_sat(rec->next_ns, rec->period_ns);
    if (next != NEVER && next <= now) {
        /* Late by a period or more: skip the missed runs, no burst. */
        uint64_t k = (now - next) / rec->period_ns + 1;
        if (k > (NEVER - next) / rec->period_ns)
            next = NEVER;
        else
            next += k * rec->period_ns;
    }
    rec->next_ns = next;
    return next;
}

/* Re-queue periodic node @n (owned, RUNNING) for deadline @tick; frees it
 * instead if it was cancelled meanwhile. Context: not the timer thread. */
static void requeue(tw_service *s, struct node *n, uint64_t tick)
{
    uint64_t st;
    n->t.tw__expires = tick;
    if (!move_or_free(s, n, LOC_QUEUED, 0, false, &st))
        return; /* cancelled while running */
    subq_push(s, n);
    wake_for_tick(s, tick);
}

static void subq_push(tw_service *s, struct node *n)
{
    stack_push(&s->submit.subq, n);
}

/* After the run of a task ended (its state word changed): wake the
 * tw_cancel_wait() callers. The fence orders that state change (a release
 * store on some paths) before the load of `waiters`; the waiter increments
 * `waiters` before it reads the state, so one of the two sees the other.
 * Without it the load may pass the store (x86 store buffer) and a waiter
 * that read the old state sleeps forever. */
static void notify_waiters(tw_service *s)
{
    atomic_thread_fence(memory_order_seq_cst);
    if (atomic_load(&s->wait.waiters) != 0) {
        pthread_mutex_lock(&s->wait.mu);
        pthread_cond_broadcast(&s->wait.cv);
        pthread_mutex_unlock(&s->wait.mu);
    }
}

/* Hand this round's due nodes to the executors. Context: timer thread. */
void tw__svc_dispatch_flush(tw_service *s)
{
    struct node *first = s->timer.disp_first;
    if (first == NULL)
        return;
    s->timer.disp_first = s->timer.disp_last = NULL;
    /* Counted before any executor can take one (and count it down). */
    atomic_fetch_add_explicit(&s->backlog, s->timer.disp_count,
                              memory_order_relaxed);
    s->timer.disp_count = 0;
    if (s->cfg.execute == NULL) {
        tw__exec_push(&s->exec, &first->t);
        return;
    }
    while (first != NULL) {
        struct node *n = first;
        first = node_of_timer(n->t.tw__next);
        uint64_t st = atomic_load(&n->state);
        s->cfg.execute(s, make_id(st, node_index(n)), s->cfg.execute_ctx);
    }
}

static void run_dispatched(tw_service *s, struct node *n)
{
    TEST_HOOK(tw__service_accepted_hook, s,
              make_id(atomic_load(&n->state), node_index(n)));
    run_node(s, n, false);
    atomic_fetch_sub(&s->busy, 1);
}

/* The executor pool's take(): an executor has unlinked @job and holds the
 * pool's mutex. It leaves DISPATCHED there, so that a cancel
 * (drop_queued()) never reads a node that an executor may free (and a
 * producer reuse) meanwhile: under the mutex, DISPATCHED means not taken.
 * A node cancelled while queued is freed here, still under the mutex. */
bool tw__svc_exec_take(tw_timer *job, void *ctx)
{
    tw_service *s = ctx;
    struct node *n = node_of_timer(job);
    atomic_fetch_sub_explicit(&s->backlog, 1, memory_order_relaxed);
    TEST_HOOK(tw__service_xpop_hook, s,
              make_id(atomic_load(&n->state), node_index(n)));
    uint64_t st;
    if (move_or_free(s, n, LOC_RUNNING, 0, false, &st))
        return true;
    atomic_fetch_sub(&s->busy, 1);
    return false;
}

/* The executor pool's run(). */
void tw__svc_exec_run(tw_timer *job, void *ctx)
{
    run_dispatched(ctx, node_of_timer(job));
}

void tw_service_run(tw_service *s, tw_id job)
{
    /* Only a caller-supplied executor receives jobs. On a pool service a
     * DISPATCHED node is linked in the pool's queue, which only the pool
     * may take it from. */
    if (s == NULL || s->cfg.execute == NULL)
        return;
    uint64_t st = 0;
    struct node *n = lookup(s, job, &st);
    if (n != NULL)
        TEST_HOOK(tw__service_run_hook, s, job);
    /* Accept the job once: a compare-and-swap out of DISPATCHED. A forged
     * id, a job already accepted (a repeated or concurrent call) or a
     * stale one (its node freed or reused) is ignored. */
    do {
        if (n == NULL || ST_GEN(st) != ST_GEN(job) ||
            ST_LOC(st) != LOC_DISPATCHED)
            return;
    } while (!atomic_compare_exchange_weak(&n->state, &st,
                                           (st & ~ST_LOC_MASK) | LOC_RUNNING));
    atomic_fetch_sub_explicit(&s->backlog, 1, memory_order_relaxed);
    run_dispatched(s, n);
}
