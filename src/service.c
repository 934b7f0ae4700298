/* SPDX-License-Identifier: MIT */
/*
 * src/service.c - the thread-safe timer service (twheel/service.h): the
 * shared path of every schedule call, the pending count, statistics and
 * test hooks.
 *
 * The design, the state word of a task record and the lock order are in
 * src/service_impl.h; the records themselves in the node pool
 * (src/node_pool.h), the executor threads in src/exec_pool.c. The
 * service's files, one mechanism each, in the order a task meets them:
 *
 *   service_submit.c    a producer's tw_schedule(): the fast path, its clock
 *   service_producer.c  each thread's producer: its cache, claim, release
 *   service_ring.c      a producer's ring: memory, growth, withdrawal
 *   service.c           the shared path: tw_schedule_window(), periodic
 *                       tasks, max_pending, threads without a producer
 *   service_loop.c      the timer thread: takes the stacks, rings and
 *                       cancel marks, advances the wheel, sleeps
 *   service_run.c       dispatch and run: the wheel's trampoline
 *   service_cancel.c    tw_cancel(), tw_cancel_wait()
 *   service_life.c      create, start, stop (hands back what never ran),
 *                       destroy
 *
 * and the headers: service_impl.h (the state, shared inline helpers),
 * service_prod.h (a producer thread's cache, for the calls),
 * service_ring.h (the ring's consumer side, for the timer thread),
 * service_clock.h (clock, TSC estimate, windows), service_internal.h
 * (what the rest of the library and the tests use).
 */

#define _POSIX_C_SOURCE 200809L

#include "twheel/service.h"

#include <stdatomic.h>
#include <stddef.h>

#include "service_impl.h"

/* Defined below, in the order a call meets them. */
static inline int sched_validate(tw_service *s, const struct sched *r);
static inline int sched_reserve(tw_service *s, const struct sched *r,
                                struct reserved *v);
static int periodic_new(enum sched_kind kind, void *arg, uint64_t period,
                        struct periodic **out);
static int take_slot(tw_service *s, tw_id replace, bool *replaced);
static int pending_reserve(tw_service *s);
static uint64_t prods_sum(tw_service *m, bool dropped);

/* Test hooks (src/service_internal.h): only in the test build of the
 * library (TW_TEST_HOOKS); the installed libraries have neither the
 * variables nor the calls. */
#ifdef TW_TEST_HOOKS
void (*tw__service_run_hook)(tw_service *s, tw_id job);
void (*tw__service_started_hook)(tw_service *s, tw_id id);
void (*tw__service_xpop_hook)(tw_service *s, tw_id id);
void (*tw__service_xdrop_hook)(tw_service *s, tw_id id);
void (*tw__service_accepted_hook)(tw_service *s, tw_id id);
void (*tw__service_reserved_hook)(tw_service *s);
void (*tw__service_pushed_hook)(tw_service *s);
void (*tw__service_drained_hook)(tw_service *s);
void (*tw__service_sum_hook)(tw_service *s);
void (*tw__service_lazy_hook)(tw_service *s, tw_id id, uint64_t now);
void (*tw__service_ring_hook)(tw_service *s, tw_id id, bool taken);
void (*tw__service_cancel_ring_hook)(tw_service *s, tw_id id);
#endif

_Thread_local struct tw__svc_cur tw__svc_cur;

int tw_schedule_window(tw_service *s, tw_task_fn fn, void *arg,
                       uint64_t earliest_ns, uint64_t latest_ns, tw_id *id)
{
    if (latest_ns < earliest_ns)
        return TW_EINVAL;
    return tw__svc_schedule_shared(s, fn, arg, earliest_ns,
                                   latest_ns - earliest_ns, 0, KIND_ONCE, 0,
                                   NULL, id);
}

int tw__schedule_replace(tw_service *s, tw_task_fn fn, void *arg,
                         uint64_t delay_ns, tw_id old, bool *old_cancelled,
                         tw_id *id)
{
    if (old_cancelled != NULL)
        *old_cancelled = false;
    return tw__svc_schedule_shared(s, fn, arg, delay_ns,
                                   s ? s->cfg.slack_ns : 0, 0, KIND_HOLD, old,
                                   old_cancelled, id);
}

int tw_schedule_fixed_rate(tw_service *s, tw_task_fn fn, void *arg,
                           uint64_t initial_delay_ns, uint64_t period_ns,
                           tw_id *id)
{
    return tw__svc_schedule_shared(s, fn, arg, initial_delay_ns, 0, period_ns,
                                   KIND_RATE, 0, NULL, id);
}

int tw_schedule_fixed_delay(tw_service *s, tw_task_fn fn, void *arg,
                            uint64_t initial_delay_ns, uint64_t delay_ns,
                            tw_id *id)
{
    return tw__svc_schedule_shared(s, fn, arg, initial_delay_ns, 0, delay_ns,
                                   KIND_DELAY, 0, NULL, id);
}

/*
 * Schedule a task of @kind. @width: a one-shot's window in ns (0: exact).
 * A non-zero @replace is a task to take over (see take_slot()), only for
 * KIND_HOLD.
 */
int tw__svc_schedule_shared(tw_service *s, tw_task_fn fn, void *arg,
                            uint64_t delay, uint64_t width, uint64_t period,
                            enum sched_kind kind, tw_id replace, bool *replaced,
                            tw_id *id)
{
    struct sched r = {fn, arg, delay, period, width, kind, replace, replaced};
    struct reserved v; /* each field set before it is read */
    int rc = sched_validate(s, &r);
    if (rc == 0)
        rc = sched_reserve(s, &r, &v);
    if (rc == 0)
        sched_publish(s, &r, &v, &s->submit.subq, id);
    return rc;
}

/* The checks that need no memory: bad arguments, stopped, and (unless it
 * replaces a task) max_pending, so that a call that max_pending rejects
 * does not grow the record pool. */
static inline int sched_validate(tw_service *s, const struct sched *r)
{
    if (s == NULL || r->fn == NULL || (kind_periodic(r->kind) && !r->period))
        return TW_EINVAL;
    uint64_t p = atomic_load_explicit(&s->submit.pending, memory_order_relaxed);
    if (p & STOPPED_BIT)
        return TW_ESHUTDOWN;
    if (s->cfg.max_pending != 0 && p >= s->cfg.max_pending && r->replace == 0)
        return TW_EAGAIN;
    return 0;
}

/*
 * Take what the task needs: its side record, a node, a started service, a
 * function table entry and a pending slot, with one undo path.
 *
 * Order: everything that may fail and can be undone comes before the
 * pending slot, which is the last step: a call that fails holds no slot,
 * not even for a moment, so it never makes a concurrent valid call fail.
 * The function table is only read first; a new function takes its entry
 * after the slot (a call that max_pending rejects takes no entry), or,
 * when replacing, before it (the takeover cannot be undone).
 */
static inline int sched_reserve(tw_service *s, const struct sched *r,
                                struct reserved *v)
{
    int rc = fn_find(&s->fns, r->fn, &v->fidx);
    if (rc < 0)
        return rc;
    bool fn_new = rc == 1;
    rc = periodic_new(r->kind, r->arg, r->period, &v->rec);
    if (rc != 0)
        return rc;
    bool have_node = (rc = node_alloc(&s->pool, &v->idx, &v->st)) == 0;
    if (have_node)
        v->n = node_at(&s->pool, v->idx);
    /* The first call starts the service only once its memory is there. */
    if (rc == 0 &&
        !atomic_load_explicit(&s->timer.started, memory_order_acquire))
        rc = tw_service_start(s);
    if (rc == 0 && fn_new && r->replace != 0)
        rc = tw__svc_fn_index(&s->fns, r->fn, &v->fidx);
    if (rc == 0)
        rc = take_slot(s, r->replace, r->replaced);
    if (rc == 0 && fn_new && r->replace == 0 &&
        (rc = tw__svc_fn_index(&s->fns, r->fn, &v->fidx)))
        pending_drop(s); /* the table filled up meanwhile */
    if (rc == 0)
        return 0;
    if (have_node)
        node_unalloc(&s->pool, v->idx, v->st);
    tw__free(v->rec);
    return rc;
}

/* The record of a periodic task, or NULL for a one-shot (@kind). */
static int periodic_new(enum sched_kind kind, void *arg, uint64_t period,
                        struct periodic **out)
{
    *out = NULL;
    if (kind == KIND_ONCE || kind == KIND_HOLD)
        return 0;
    struct periodic *rec = tw__malloc(sizeof(*rec));
    if (rec == NULL)
        return TW_ENOMEM;
    rec->arg = arg;
    rec->period_ns = period;
    rec->fixed_rate = kind == KIND_RATE;
    *out = rec;
    return 0;
}

/*
 * A pending slot for a new task. With @replace (a task of
 * tw__schedule_replace(), which keeps its slot while it runs): take over
 * that task's slot, by cancelling it, or, if it is running, by releasing
 * the slot in its place; *@replaced says whether the cancel won. Else, or
 * when @replace is gone, a free slot. Returns 0, TW_EAGAIN or
 * TW_ESHUTDOWN; on failure nothing changed.
 */
static int take_slot(tw_service *s, tw_id replace, bool *replaced)
{
    if (replace != 0) {
        if (tw__svc_cancel(s, replace, false)) {
            if (replaced != NULL)
                *replaced = true;
            return 0;
        }
        uint64_t st;
        struct node *n = lookup(s, replace, &st);
        while (n != NULL && ST_GEN(st) == ST_GEN(replace) &&
               ST_LOC(st) == LOC_RUNNING &&
               (st & (ST_HOLD | ST_DROPPED | ST_PERIODIC)) == ST_HOLD) {
            if (atomic_compare_exchange_weak(&n->state, &st, st | ST_DROPPED))
                return 0; /* its run ends without releasing the slot */
        }
    }
    return pending_reserve(s);
}

static int pending_reserve(tw_service *s)
{
    uint64_t v = atomic_load_explicit(&s->submit.pending, memory_order_relaxed);
    do {
        if (v & STOPPED_BIT)
            return TW_ESHUTDOWN;
        if (s->cfg.max_pending != 0 && v >= s->cfg.max_pending)
            return TW_EAGAIN;
    } while (!atomic_compare_exchange_weak_explicit(&s->submit.pending, &v,
                                                    v + 1, memory_order_relaxed,
                                                    memory_order_relaxed));
    return 0;
}

/* The entry of @fn in the function table, added if new: 0 and *@out, or
 * TW_EAGAIN if the table is full. Out of line: the first call with a
 * function, or a call without a producer. */
__attribute__((noinline)) int tw__svc_fn_index(struct fn_table *ft,
                                               tw_task_fn fn, uint32_t *out)
{
    uint32_t h = fn_hash(fn);
    for (uint32_t i = 0; i <= ft->mask; i++) {
        uint32_t slot = (h + i) & ft->mask;
        tw_task_fn cur =
            atomic_load_explicit(&ft->fns[slot], memory_order_acquire);
        if (cur == NULL && atomic_compare_exchange_strong_explicit(
                               &ft->fns[slot], &cur, fn, memory_order_acq_rel,
                               memory_order_acquire))
            cur = fn; /* ours now */
        if (cur == fn) {
            *out = slot;
            return 0;
        }
    }
    return TW_EAGAIN;
}

/* The sum of every producer's added (@dropped false) or dropped count. */
static uint64_t prods_sum(tw_service *m, bool dropped)
{
    uint64_t v = 0;
    uint32_t n = atomic_load_explicit(&m->prods.n, memory_order_acquire);
    for (uint32_t k = 0; k < n && k < MAX_PRODS; k++) {
        struct prod *p =
            atomic_load_explicit(&m->prods.slot[k], memory_order_acquire);
        if (p != NULL)
            v += atomic_load(dropped ? &p->dropped : &p->added);
    }
    return v;
}

/* The pending count: reservations (the shared count and every producer's
 * added) less releases (the shared released and every producer's
 * dropped); without max_pending all of these only grow. Releases are read
 * first, all seq_cst: a release is ordered after its reservation, which
 * may be another producer's, so every release read has its reservation
 * read too, and a reservation still held when the releases are read is
 * counted. The sum is thus never below the reservations held throughout
 * the call, and never wraps: 0 only when nothing is pending. Stop's side
 * of the handshake in prod_schedule() is its exchange of each producer's
 * stack, after which it reads the added counts.
 * With max_pending, only the shared count moves, down as well. */
uint64_t tw_service_pending(const tw_service *s)
{
    if (s == NULL)
        return 0;
    tw_service *m = (tw_service *)s;
    if (atomic_load(&m->life.stopped))
        return 0;
    uint64_t out = atomic_load(&m->submit.released) + prods_sum(m, true);
    TEST_HOOK(tw__service_sum_hook, m);
    uint64_t in =
        (atomic_load(&m->submit.pending) & ~STOPPED_BIT) + prods_sum(m, false);
    return in - out;
}

int tw_service_get_stats_sized(const tw_service *s, tw_service_stats *out,
                               size_t out_size)
{
    if (s == NULL || out == NULL ||
        out_size < offsetof(tw_service_stats, backlog))
        return TW_EINVAL;
    tw_service *m = (tw_service *)s;
    tw_service_stats st = {0};
    st.pending = tw_service_pending(s);
    for (unsigned i = 0; i < TW_LATE_BUCKETS; i++) {
        st.late_hist[i] =
            atomic_load_explicit(&m->late[i], memory_order_relaxed);
        st.ran += st.late_hist[i];
    }
    st.cancelled = atomic_load_explicit(&m->cancelled, memory_order_relaxed);
    st.handed_back = atomic_load_explicit(&m->handed, memory_order_relaxed);
    st.wakeups = atomic_load_explicit(&m->wakeups, memory_order_relaxed);
    st.nodes = atomic_load_explicit(&m->pool.nodes, memory_order_relaxed);
    st.memory_bytes = atomic_load_explicit(&m->pool.mem, memory_order_relaxed) +
                      atomic_load_explicit(&m->mem, memory_order_relaxed);
    st.backlog = atomic_load_explicit(&m->backlog, memory_order_relaxed);
    tw__stats_copy_out(out, out_size, &st, sizeof st);
    return 0;
}

void(tw_service_get_stats)(const tw_service *s, tw_service_stats *out)
{
    (void)tw_service_get_stats_sized(s, out,
                                     offsetof(tw_service_stats, backlog));
}

void tw__service_kick(tw_service *s)
{
    wake(s);
}

void tw__service_sync(tw_service *s)
{
    /* Rounds are numbered from 1; round r0 + 1 begins after this call. */
    uint64_t r0 = atomic_load(&s->timer.round_begin);
    wake(s);
    while ((atomic_load(&s->timer.round_end) < r0 + 1 ||
            atomic_load(&s->busy) != 0) &&
           atomic_load(&s->timer.started) && !atomic_load(&s->timer.quit)) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
}

uint32_t tw__service_waiters(tw_service *s)
{
    return atomic_load(&s->wait.waiters);
}

uint32_t tw__service_producers(tw_service *s, uint32_t *owned)
{
    uint32_t n = atomic_load(&s->prods.n), o = 0;
    n = n < MAX_PRODS ? n : MAX_PRODS;
    for (uint32_t k = 0; k < n; k++) {
        struct prod *p = atomic_load(&s->prods.slot[k]);
        o += p != NULL && atomic_load(&p->owned);
    }
    if (owned != NULL)
        *owned = o;
    return n;
}

size_t tw__service_node_size(void)
{
    return sizeof(struct node);
}
