/* SPDX-License-Identifier: MIT */
/*
 * src/service_loop.c - the timer thread's loop: each round takes the
 * submission stacks whole and the producers' rings' new slots
 * (src/service_ring.h), frees what the cancel bitmap marks, advances the
 * wheel (whose callback, tw__svc_trampoline(), is src/service_run.c) and
 * sleeps until the next expiry or a wake-up. Stop, once it has joined the
 * thread, takes the same queues to hand back what never ran
 * (tw__svc_stop_drain()).
 */

#define _POSIX_C_SOURCE 200809L

#include "twheel/service.h"

#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <time.h>

#include "fence.h"
#include "service_impl.h"
#include "service_ring.h"
#include "wheel_internal.h"

#define DRAIN_BATCH 8192 /* submissions per timer-thread round */

/* Where stop hands tasks back, and how many it handed. */
struct handing {
    tw_unprocessed_fn fn;
    void *ctx;
    uint64_t handed;
};

/* Defined below, in the order a call meets them. */
static inline unsigned subq_drain(tw_service *s, unsigned max,
                                  void (*take)(tw_service *s, struct node *n,
                                               void *ctx),
                                  void *ctx, uint64_t *reading);
static struct node *subq_next(tw_service *s, uint32_t *pos);
static inline _Atomic(struct node *) *subq_at(tw_service *s, uint32_t k,
                                              uint32_t n);
static void take_submission(tw_service *s, struct node *n, void *ctx);
static void take_cancel(struct node *n, void *ctx);
static void timer_sleep(tw_service *s, uint64_t target, uint64_t now, bool nap);
static bool tick_deadline(const tw_service *s, uint64_t target,
                          struct timespec *ts);
static bool subq_any(tw_service *s);
static void stop_wheel(tw_service *s, struct handing *h);
static void stop_submissions(tw_service *s, struct handing *h);
static void stop_take(tw_service *s, struct node *n, void *ctx);
static void hand_back(tw_service *s, struct node *n, uint64_t st,
                      struct handing *h);
static void ignore_cancel(struct node *n, void *ctx);

static uint64_t mono_ns(void)
{
    return tw__clock_ns(CLOCK_MONOTONIC);
}

void *tw__svc_timer_main(void *p)
{
    tw_service *s = p;
    tw__svc_cur.s = s;
    tw__svc_cur.id = 0;
    while (!atomic_load(&s->timer.quit)) {
        uint64_t taken_at = 0;
        atomic_fetch_add(&s->timer.round_begin, 1);
        unsigned took =
            subq_drain(s, DRAIN_BATCH, take_submission, &taken_at, &taken_at);
        bool ring_left = false;
        took += ring_drain(s, DRAIN_BATCH - took, take_submission, &taken_at,
                           &ring_left);
        bool active = took != 0;
        if (atomic_load(&s->pool.cancel_dirty) != 0) {
            cancel_drain(&s->pool, take_cancel, s);
            active = true;
        }
        TEST_HOOK(tw__service_drained_hook, s);
        s->timer.round_ns = rel_ns(s);
        s->timer.round_fresh = true;
        uint64_t now = s->timer.round_ns / s->cfg.tick_ns;
        tw_wheel_advance(s->timer.wheel, now);
        tw__svc_dispatch_flush(s);
        free_flush(&s->pool);
        atomic_fetch_add(&s->timer.round_end, 1);
        if (s->timer.local != NULL || ring_left ||
            (!active &&
             (subq_any(s) || atomic_load(&s->pool.cancel_dirty) != 0)))
            continue;
        uint64_t next = tw_wheel_next_expiry(s->timer.wheel);
        if (next <= now)
            continue;
        if (active && next > now + 1)
            next = now + 1; /* poll once more before sleeping long */
        timer_sleep(s, next, now, active);
    }
    free_flush(&s->pool);
    tw__svc_cur.s = NULL;
    return NULL;
}

/*
 * Take up to @max nodes off the submission stacks, each to @take: first
 * what is left of the stack taken earlier, then each stack once (a whole
 * stack, with one exchange). Returns how many. Shared by the timer thread and
 * by stop, which owns the stacks once the thread is joined.
 * @reading: NULL, or the clock reading that @take uses for deadlines,
 * reset to 0 (not read yet) at each exchange: a call may push onto a stack
 * after the reading and before that stack's exchange in the same pass.
 * What is left of an earlier round's stack was exchanged before any
 * reading of this round.
 */
static inline unsigned subq_drain(tw_service *s, unsigned max,
                                  void (*take)(tw_service *s, struct node *n,
                                               void *ctx),
                                  void *ctx, uint64_t *reading)
{
    uint32_t pos = 0;
    unsigned i;
    s->timer.rr++;
    for (i = 0; i < max; i++) {
        if (s->timer.local == NULL) {
            if ((s->timer.local = subq_next(s, &pos)) == NULL)
                break;
            if (reading != NULL)
                *reading = 0;
        }
        struct node *n = s->timer.local;
        s->timer.local = node_of_timer(n->t.tw__next);
        take(s, n, ctx);
    }
    return i;
}

/* The next whole submission stack of this pass, taken with one exchange,
 * or NULL when the pass has seen them all: each stack at most once per
 * pass, so that what a thread pushed in two goes runs in two rounds, in
 * order. *@pos: the pass's position, the shared stack first (what a thread
 * pushed there before it had a producer comes before what it pushed on
 * its own), then the producers' from s->timer.rr. */
static struct node *subq_next(tw_service *s, uint32_t *pos)
{
    uint32_t n = atomic_load_explicit(&s->prods.n, memory_order_acquire);
    if (n > MAX_PRODS)
        n = MAX_PRODS;
    while (*pos <= n) {
        uint32_t k = (*pos)++;
        _Atomic(struct node *) *q =
            k == 0 ? &s->submit.subq : subq_at(s, (s->timer.rr + k - 1) % n, n);
        if (q != NULL && atomic_load(q) != NULL)
            return atomic_exchange(q, NULL);
    }
    return NULL;
}

/* Submission stack @k: the producers' 0 .. n-1, the shared one n. NULL if
 * producer @k has none (yet). */
static inline _Atomic(struct node *) *subq_at(tw_service *s, uint32_t k,
                                              uint32_t n)
{
    if (k == n)
        return &s->submit.subq;
    struct prod *p =
        atomic_load_explicit(&s->prods.slot[k], memory_order_acquire);
    return p != NULL ? &p->subq : NULL;
}

/*
 * A node from the submission stack. *@ctx is the timer thread's reading of
 * the relative time in ns for a lazy node's deadline (0 until first
 * needed): a reading taken after the exchange that took @n off its stack,
 * so after the schedule call that pushed it. subq_drain() resets it to 0
 * at each exchange; a reading kept across one would be earlier than the
 * calls whose nodes that exchange takes, and their tasks would run early.
 * Context: the wheel's owner.
 */
static void take_submission(tw_service *s, struct node *n, void *ctx)
{
    uint64_t *now = ctx, st;
    /* The window's width (see sched_publish()), not a link. */
    uint64_t span = (uintptr_t)n->t.tw__pprev;
    n->t.tw__pprev = NULL;
    if (!move_or_free(s, n, LOC_ARMED, ST_RELATIVE, true, &st))
        return;
    if (span == (uintptr_t)QUEUED_NS) { /* prod_schedule_cached() */
        n->t.tw__expires = ceil_tick(s, n->t.tw__expires);
        span = 0;
    }
    if (st & ST_RELATIVE) {
        if (*now == 0)
            *now = rel_ns(s) | 1; /* never 0; 1 ns later is harmless */
        n->t.tw__expires = ceil_tick(s, add_sat(*now, n->t.tw__expires));
        TEST_HOOK(tw__service_lazy_hook, s, make_id(st, node_index(n)), *now);
    }
    uint64_t first = n->t.tw__expires;
    if (first != NEVER && span == 0)
        tw__wheel_add_any(s->timer.wheel, &n->t, first);
    else if (first != NEVER)
        tw__wheel_add_window_any(s->timer.wheel, &n->t, first, first + span);
}

/* A node marked in the cancel bitmap. Context: the wheel's owner. */
static void take_cancel(struct node *n, void *ctx)
{
    tw_service *s = ctx;
    uint64_t st = atomic_load(&n->state);
    if (ST_LOC(st) != LOC_ARMED || !(st & ST_CANCELLED))
        return; /* already freed (and maybe reused) by the wheel */
    tw_wheel_cancel(s->timer.wheel, &n->t);
    node_free_batched(&s->pool, n);
    atomic_fetch_add_explicit(&s->cancelled, 1, memory_order_relaxed);
}

/*
 * Sleep until tick @target (@now: this round's tick), or until woken. A
 * @nap (after a round that took work, @target at most @now + 1) sleeps
 * even if more work has come meanwhile: it is taken at the next tick, in
 * one batch, instead of a round per few submissions, whose exchanges of
 * the producers' stacks and reads of their nodes race the producers for
 * those cache lines. A request due before @target wakes the thread
 * (wake_for_tick()), one pushed before sleep_until was set waits at most
 * until @target, and a cancel's record is released within the tick.
 */
static void timer_sleep(tw_service *s, uint64_t target, uint64_t now, bool nap)
{
    struct timespec ts;
    bool timed = tick_deadline(s, target, &ts);
    /* The first ns of tick target - 1, plus 1: a deadline before it has
     * a tick before target (NEVER: every finite deadline). */
    uint64_t wake_ns = target == 0 ? 0
                       : target - 1 < NEVER / s->cfg.tick_ns
                           ? (target - 1) * s->cfg.tick_ns + 1
                           : NEVER;
    pthread_mutex_lock(&s->timer.mu);
    atomic_store(&s->timer.sleep_until, target);
    atomic_store(&s->timer.wake_ns, wake_ns);
    atomic_store(&s->timer.sleep_long, target > now + 1);
    /* The producers publish in their rings without a full barrier
     * (publish_ring()): this one stands for it, before the rings are read,
     * when the sleep may be longer than the next tick. A nap, or a sleep
     * to the next tick, may miss a task published meanwhile, which then
     * waits until @target, as the comment above says. */
    if (s->cfg.fence && !nap && target > now + 1)
        tw__fence_heavy();
    if (!s->timer.kicked && !atomic_load(&s->timer.quit) &&
        (nap || (!subq_any(s) && atomic_load(&s->pool.cancel_dirty) == 0))) {
        if (timed)
            pthread_cond_timedwait(&s->timer.cv, &s->timer.mu, &ts);
        else
            pthread_cond_wait(&s->timer.cv, &s->timer.mu);
        atomic_fetch_add_explicit(&s->wakeups, 1, memory_order_relaxed);
    }
    s->timer.kicked = false;
    atomic_store(&s->timer.wake_ns, 0);
    atomic_store(&s->timer.sleep_until, 0);
    atomic_store(&s->timer.sleep_long, false);
    pthread_mutex_unlock(&s->timer.mu);
}

/* The absolute CLOCK_MONOTONIC time of tick @target; false if none fits. */
static bool tick_deadline(const tw_service *s, uint64_t target,
                          struct timespec *ts)
{
    if (target == NEVER || target > NEVER / s->cfg.tick_ns)
        return false;
    uint64_t abs;
    if (s->cfg.clock == NULL && s->cfg.clock_id == (int32_t)CLOCK_MONOTONIC) {
        abs = add_sat(s->cfg.start_ns, target * s->cfg.tick_ns);
    } else {
        /* Another clock: wait for the time left on it, re-read after at
         * most TW__SVC_WAIT_CAP_NS on the built-in BOOTTIME. */
        uint64_t rel = rel_ns(s), want = target * s->cfg.tick_ns;
        uint64_t left = want > rel ? want - rel : 0;
        if (s->cfg.clock == NULL)
            left = tw__svc_wait_ns((clockid_t)s->cfg.clock_id, left);
        abs = add_sat(mono_ns(), left);
    }
    if (abs / 1000000000u >= (uint64_t)INT32_MAX)
        return false;
    ts->tv_sec = (time_t)(abs / 1000000000u);
    ts->tv_nsec = (long)(abs % 1000000000u);
    return true;
}

/* Is any submission stack or ring non-empty? (seq_cst loads: the timer thread's
 * side of the wake-up handshake, see timer_sleep()). */
static bool subq_any(tw_service *s)
{
    uint32_t n = atomic_load_explicit(&s->prods.n, memory_order_acquire);
    if (n > MAX_PRODS)
        n = MAX_PRODS;
    for (uint32_t k = 0; k <= n; k++) {
        _Atomic(struct node *) *q = subq_at(s, k, n);
        if (q != NULL && atomic_load(q) != NULL)
            return true;
    }
    return ring_any(s);
}

/* wake_for_due()'s call (src/service_impl.h). */
int tw__svc_wake_for_due(tw_service *s, uint64_t due)
{
    wake_for_tick(s, ceil_tick(s, due));
    return 0;
}

/* Hand back (to @fn, with @ctx) every task in the wheel and the queues,
 * once the timer thread is joined; how many. Context: tw_service_stop(),
 * under life.stop_mu. */
uint64_t tw__svc_stop_drain(tw_service *s, tw_unprocessed_fn fn, void *ctx)
{
    struct handing h = {fn, ctx, 0};
    stop_wheel(s, &h);
    stop_submissions(s, &h);
    return h.handed;
}

/* Everything in the wheel, cancelled or not; nodes beyond fresh were never
 * used. Then the cancel marks, which are all stale now. */
static void stop_wheel(tw_service *s, struct handing *h)
{
    uint32_t fresh = atomic_load(&s->pool.fresh);
    for (uint32_t i = 0; i < fresh; i++) {
        struct node *n = node_at(&s->pool, i);
        if (ST_LOC(atomic_load(&n->state)) != LOC_ARMED)
            continue;
        tw_wheel_cancel(s->timer.wheel, &n->t);
        stop_take(s, n, h);
    }
    cancel_drain(&s->pool, ignore_cancel, NULL);
}

/* The submission stack, until every accepted task is accounted for: a
 * producer may still be between its reservation and its push. */
static void stop_submissions(tw_service *s, struct handing *h)
{
    for (;;) {
        bool left = false;
        if (subq_drain(s, UINT_MAX, stop_take, h, NULL) != 0 ||
            ring_drain(s, UINT_MAX, stop_take, h, &left) != 0)
            continue;
        if (tw_service_pending(s) == 0)
            break;
        sched_yield();
    }
}

/* Claim owned node @n for stop and hand it back, unless a cancel had won
 * (then free it): the cancelled bit decides. */
static void stop_take(tw_service *s, struct node *n, void *ctx)
{
    uint64_t v = atomic_load(&n->state);
    do {
        if (v & ST_CANCELLED) {
            node_free(&s->pool, n);
            atomic_fetch_add_explicit(&s->cancelled, 1, memory_order_relaxed);
            return;
        }
    } while (!atomic_compare_exchange_weak(&n->state, &v, v | ST_CANCELLED));
    hand_back(s, n, v, ctx);
}

/* Hand node @n (claimed: cancelled bit set by us) back, then free it. */
static void hand_back(tw_service *s, struct node *n, uint64_t st,
                      struct handing *h)
{
    pending_drop(s);
    if (h->fn != NULL) {
        void *arg = n->t.tw__arg;
        if (st & ST_PERIODIC)
            arg = ((struct periodic *)arg)->arg;
        h->fn(make_id(st, node_index(n)), fn_at(&s->fns, st), arg, h->ctx);
    }
    node_free(&s->pool, n);
    atomic_fetch_add_explicit(&s->handed, 1, memory_order_relaxed);
    h->handed++;
}

static void ignore_cancel(struct node *n, void *ctx)
{
    (void)n;
    (void)ctx;
}
