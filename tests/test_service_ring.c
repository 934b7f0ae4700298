/* SPDX-License-Identifier: MIT */
/*
 * tests/test_service_ring.c - the producers' rings (src/service_impl.h,
 * RS_*): a slot carries the cancel of the task in it until the timer
 * thread takes the task. Forced interleavings: the timer thread held in a
 * round (tw__service_drained_hook) so that tasks stay in a ring, and a
 * cancel between the timer thread's look at a slot and its take, or
 * between the take and the move of the task's state word
 * (tw__service_ring_hook), by the ring's owner and by another thread.
 * Also: the owner's cancelled record reused at once, a producer thread
 * that exits with tasks in its ring, stop with tasks in a ring, a ring
 * that fills up (the stack takes the rest), and the memory promise for a
 * task cancelled in a ring by another thread.
 */
#define _POSIX_C_SOURCE 200809L

#include <pthread.h>

#include "fence.h"
#include "fixture.h"
#include "service_internal.h"
#include "service_impl.h"

static tw_service *real_service(void)
{
    tw_service *s;
    ASSERT_EQ(tw_service_create(&s, NULL), 0);
    ASSERT_EQ(tw_service_start(s), 0);
    return s;
}

static uint64_t cancelled_count(tw_service *s)
{
    tw_service_stats st;
    tw_service_get_stats(s, &st);
    return st.cancelled;
}

/* This thread's producer exists, its function known: one pair. */
static void warm(tw_service *s)
{
    tw_id id;
    ASSERT_EQ(tw_schedule(s, runs_task, &(struct runs){0}, 10 * SEC, &id), 0);
    ASSERT(tw_cancel(s, id));
}

/* The producer at index @k of @s (0: the first thread that scheduled). */
static struct prod *prod_at(tw_service *s, uint32_t k)
{
    ASSERT(k < atomic_load(&s->prods.n));
    struct prod *p = atomic_load(&s->prods.slot[k]);
    ASSERT(p != NULL);
    return p;
}

/* The library's allocator for this test: calloc() fails for a block of
 * fail_size bytes while that is not 0 (a ring of a given size). */
static _Atomic size_t fail_size;

static void *ring_calloc(size_t n, size_t size)
{
    if (atomic_load(&fail_size) != 0 && n * size == atomic_load(&fail_size))
        return NULL;
    return calloc(n, size);
}

/* ------------------------------------------------------------------------ */
/* Holding the timer thread: after it has taken a round's submissions it
 * waits in the drained hook until released (or until stop tells it to
 * quit), so that what is scheduled meanwhile stays in the rings. */

/* The hooks are installed once, before any service starts (main()), and
 * act only when armed. */
static struct {
    _Atomic(tw_service *) s;
    _Atomic int hold; /* 1: hold the next round; 2: holding; 0: go */
} hd;

static void hold_hook(tw_service *s)
{
    int one = 1;
    if (s != atomic_load(&hd.s) ||
        !atomic_compare_exchange_strong(&hd.hold, &one, 2))
        return;
    while (atomic_load(&hd.hold) == 2 && !atomic_load(&s->timer.quit))
        sleep_us(100);
}

static void hold_timer(tw_service *s)
{
    atomic_store(&hd.s, s);
    atomic_store(&hd.hold, 1);
    tw__service_kick(s);
    while (atomic_load(&hd.hold) != 2)
        sleep_us(100);
}

static void release_timer(void)
{
    atomic_store(&hd.hold, 0);
}

static unsigned loc_of(tw_service *s, tw_id id)
{
    return ST_LOC(atomic_load(&node_at(&s->pool, (uint32_t)id - 1)->state));
}

/* The end of a test none of whose tasks ran: wait until the timer
 * thread has counted @cancelled cancels, free @ids, stop (nothing ran),
 * destroy. */
static void end_quiet(tw_service *s, struct runs *r, uint64_t cancelled,
                      tw_id *ids)
{
    WAIT_FOR(cancelled_count(s) == cancelled, 10);
    free(ids);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    ASSERT_EQ(atomic_load(&r->n), 0);
    tw_service_destroy(s);
}

/* With the timer thread held, fill producer @p's ring (this thread's
 * producer) and put one more task on its stack. Returns their ids (the
 * ring's slots + 1 of them, *@slots the ring's slots) in an array with
 * room for one more. */
static tw_id *fill_ring(tw_service *s, struct prod *p, struct runs *r,
                        uint32_t *slots)
{
    uint32_t n = p->ring_mask + 1;
    tw_id *ids = calloc((size_t)n + 2, sizeof(*ids));
    ASSERT(ids != NULL);
    tw__service_sync(s);
    hold_timer(s);
    for (uint32_t i = 0; i <= n; i++)
        ASSERT_EQ(tw_schedule(s, runs_task, r, 10 * SEC, &ids[i]), 0);
    ASSERT_EQ(loc_of(s, ids[n - 1]), LOC_RING);
    ASSERT_EQ(loc_of(s, ids[n]), LOC_QUEUED); /* full: the stack */
    *slots = n;
    return ids;
}

/* ------------------------------------------------------------------------ */
/* The owner cancels a task in its ring: true once, then false; the record
 * goes straight back to its magazine (the next call gets the same index,
 * a new generation, and the old id stays stale); the timer thread counts
 * the cancel when it passes the slot, and the task never runs. */
static void test_owner_cancel_reuses_record(void)
{
    tw_service *s = real_service();
    warm(s);
    hold_timer(s);
    struct runs r1 = {0}, r2 = {0};
    tw_id id1, id2;
    ASSERT_EQ(tw_schedule(s, runs_task, &r1, 0, &id1), 0);
    ASSERT(tw_cancel(s, id1));
    ASSERT(!tw_cancel(s, id1));
    ASSERT_EQ(tw_schedule(s, runs_task, &r2, 0, &id2), 0);
    ASSERT_EQ((uint32_t)id2, (uint32_t)id1);
    ASSERT(id2 != id1);
    ASSERT(!tw_cancel(s, id1)); /* stale: never the new task */
    ASSERT_EQ(tw_service_pending(s), 1);
    release_timer();
    WAIT_FOR(atomic_load(&r2.n) == 1, 10);
    tw__service_sync(s);
    ASSERT_EQ(atomic_load(&r1.n), 0);
    ASSERT_EQ(cancelled_count(s), 2); /* the warm-up's and id1 */
    ASSERT_EQ(tw_service_pending(s), 0);
    ASSERT(!tw_cancel(s, id2)); /* it ran */
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* A cancel against the timer thread's take, forced at both points of the
 * take (tw__service_ring_hook): before its compare-and-swap of the slot
 * (the cancel wins in the slot) and after it (the cancel wins in the state
 * word, and the timer thread must free the record instead of arming it).
 * The canceller is the timer thread itself (a thread without a producer:
 * another thread than the owner), or the owner, which the hook waits for.
 * Each way: the cancel returns true once, the task (due at once) never
 * runs, its record is released (counted) in that round, nothing pending. */
static struct {
    tw_service *s;
    _Atomic tw_id target;
    bool at_take; /* the hook's point: false before the take, true after */
    bool by_owner;
    _Atomic int step; /* by_owner: 1 the hook waits, 2 the owner is done */
    bool won, again;
} rc;

static void race_hook(tw_service *s, tw_id id, bool taken)
{
    /* rc's other fields are set before target. */
    if (id == 0 || id != atomic_load(&rc.target) || s != rc.s ||
        taken != rc.at_take)
        return;
    if (!rc.by_owner) {
        rc.won = tw_cancel(s, id);
        rc.again = tw_cancel(s, id);
        atomic_store(&rc.target, 0);
        return;
    }
    atomic_store(&rc.target, 0);
    atomic_store(&rc.step, 1);
    while (atomic_load(&rc.step) != 2)
        sleep_us(100);
}

static void test_cancel_races_take(void)
{
    for (int k = 0; k < 4; k++) {
        rc.s = real_service();
        rc.at_take = k & 1;
        rc.by_owner = k >> 1;
        rc.won = rc.again = false;
        atomic_store(&rc.step, 0);
        warm(rc.s);
        hold_timer(rc.s);
        struct runs r = {0};
        tw_id id;
        ASSERT_EQ(tw_schedule(rc.s, runs_task, &r, 0, &id), 0);
        atomic_store(&rc.target, id);
        release_timer();
        tw__service_kick(rc.s);
        if (rc.by_owner) {
            WAIT_FOR(atomic_load(&rc.step) == 1, 10);
            rc.won = tw_cancel(rc.s, id);
            rc.again = tw_cancel(rc.s, id);
            atomic_store(&rc.step, 2);
        }
        WAIT_FOR(atomic_load(&rc.target) == 0, 10); /* the hook ran */
        tw__service_sync(rc.s);
        tw__service_sync(rc.s);
        ASSERT(rc.won);
        ASSERT(!rc.again);
        ASSERT_EQ(atomic_load(&r.n), 0);
        ASSERT_EQ(cancelled_count(rc.s), 2);
        ASSERT_EQ(tw_service_pending(rc.s), 0);
        tw_service_destroy(rc.s);
    }
}

/* ------------------------------------------------------------------------ */
/* Stop hands back what waits in the rings, and only that: the timer thread
 * is held with tasks in the ring of this thread (some cancelled by it,
 * some by another thread) when stop begins. */
static struct {
    tw_id ids[64];
    bool handed[64];
    int nhanded;
} hb;

static void on_handed(tw_id id, tw_task_fn fn, void *arg, void *ctx)
{
    (void)ctx;
    ASSERT(fn == runs_task);
    for (int i = 0; i < 64; i++)
        if (hb.ids[i] == id) {
            ASSERT(!hb.handed[i]);
            ASSERT(arg != NULL);
            hb.handed[i] = true;
        }
    hb.nhanded++;
}

struct cancel_range {
    tw_service *s;
    const tw_id *ids;
    int from, to;
    bool all_won;
};

static void *cancel_range_main(void *arg)
{
    struct cancel_range *c = arg;
    c->all_won = true;
    for (int i = c->from; i < c->to; i++)
        c->all_won = c->all_won && tw_cancel(c->s, c->ids[i]) &&
                     !tw_cancel(c->s, c->ids[i]);
    return NULL;
}

static void test_stop_takes_ring(void)
{
    tw_service *s = real_service();
    warm(s);
    hold_timer(s);
    memset(&hb, 0, sizeof(hb));
    static struct runs r[64];
    memset(r, 0, sizeof(r));
    for (int i = 0; i < 64; i++)
        ASSERT_EQ(tw_schedule(s, runs_task, &r[i], 0, &hb.ids[i]), 0);
    for (int i = 0; i < 16; i++) /* the owner */
        ASSERT(tw_cancel(s, hb.ids[i]));
    struct cancel_range c = {s, hb.ids, 16, 32, false};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, cancel_range_main, &c), 0);
    pthread_join(th, NULL);
    ASSERT(c.all_won);
    ASSERT_EQ(tw_service_pending(s), 32);
    /* Stop makes the held timer thread quit before it takes the ring. */
    ASSERT_EQ(tw_service_stop(s, on_handed, NULL), 32);
    release_timer();
    ASSERT_EQ(hb.nhanded, 32);
    for (int i = 0; i < 64; i++) {
        ASSERT_EQ(hb.handed[i], i >= 32);
        ASSERT_EQ(atomic_load(&r[i].n), 0);
    }
    ASSERT_EQ(cancelled_count(s), 1 + 32);
    ASSERT_EQ(tw_service_pending(s), 0);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* A producer thread exits with tasks in its ring, some cancelled by it:
 * another thread cancels some of the rest, and each of those records is
 * released in the timer thread's next round (the memory promise), the
 * owner's at once. A new thread takes the producer over, ring and all, and
 * stop hands back exactly the tasks still pending. */
static struct {
    tw_service *s;
    tw_id ids[64];
    struct runs r[64];
} ex;

static void *exiting_main(void *arg)
{
    (void)arg;
    for (int i = 0; i < 64; i++)
        ASSERT_EQ(tw_schedule(ex.s, runs_task, &ex.r[i], 10 * SEC, &ex.ids[i]),
                  0);
    for (int i = 0; i < 16; i++)
        ASSERT(tw_cancel(ex.s, ex.ids[i]));
    return NULL;
}

static void *one_more_main(void *arg)
{
    tw_id *id = arg;
    ASSERT_EQ(tw_schedule(ex.s, runs_task, &ex.r[0], 10 * SEC, id), 0);
    return NULL;
}

static void test_exited_producer_ring(void)
{
    memset(&ex, 0, sizeof(ex));
    memset(&hb, 0, sizeof(hb));
    ex.s = real_service();
    hold_timer(ex.s);
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, exiting_main, NULL), 0);
    pthread_join(th, NULL);
    uint32_t owned = 99;
    ASSERT_EQ(tw__service_producers(ex.s, &owned), 1);
    ASSERT_EQ(owned, 0); /* released when the thread exited */
    /* This thread has no producer: each cancel is another thread's. */
    struct cancel_range c = {ex.s, ex.ids, 16, 32, false};
    cancel_range_main(&c);
    ASSERT(c.all_won);
    ASSERT_EQ(tw_service_pending(ex.s), 32);
    release_timer();
    tw__service_sync(ex.s);
    ASSERT_EQ(cancelled_count(ex.s), 32);
    tw_id last;
    ASSERT_EQ(pthread_create(&th, NULL, one_more_main, &last), 0);
    pthread_join(th, NULL);
    ASSERT_EQ(tw__service_producers(ex.s, NULL), 1); /* taken over */
    memcpy(hb.ids, ex.ids, sizeof(hb.ids));
    hb.ids[0] = last; /* ids[0] was cancelled */
    ASSERT_EQ(tw_service_stop(ex.s, on_handed, NULL), 33);
    ASSERT_EQ(hb.nhanded, 33);
    for (int i = 0; i < 64; i++)
        ASSERT_EQ(hb.handed[i], i == 0 || i >= 32);
    for (int i = 0; i < 64; i++)
        ASSERT_EQ(atomic_load(&ex.r[i].n), 0);
    tw_service_destroy(ex.s);
}

/* ------------------------------------------------------------------------ */
/* A full ring: the calls after RING_SLOTS go on the producer's stack, and
 * every task is accepted, cancelled once and released. */
static void test_full_ring_falls_back(void)
{
    enum { N = RING_SLOTS + 100 };
    tw_service *s = real_service();
    warm(s);
    hold_timer(s);
    tw_id *ids = calloc(N, sizeof(*ids));
    ASSERT(ids != NULL);
    struct runs r = {0};
    for (int i = 0; i < N; i++)
        ASSERT_EQ(tw_schedule(s, runs_task, &r, 10 * SEC, &ids[i]), 0);
    ASSERT_EQ(tw_service_pending(s), N);
    for (int i = 0; i < N; i++)
        ASSERT(tw_cancel(s, ids[i]));
    ASSERT_EQ(tw_service_pending(s), 0);
    release_timer();
    WAIT_FOR(cancelled_count(s) == 1 + (uint64_t)N, 30);
    for (int i = 0; i < N; i++)
        ASSERT(!tw_cancel(s, ids[i]));
    free(ids);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    ASSERT_EQ(atomic_load(&r.n), 0);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* The memory promise while the timer thread sleeps long: a task scheduled
 * later than the one it sleeps for does not wake it and may wait in the
 * ring; cancelled there by another thread, its record must still be
 * released within about a tick (the cancel wakes the thread). The bound
 * is generous (2 s against a 1 ms tick). */
static void *cancel_one_main(void *arg)
{
    struct cancel_range *c = arg;
    c->all_won = tw_cancel(c->s, c->ids[0]);
    return NULL;
}

/* tw_cancel(@s, @id) on a new thread (so: not the owner of a ring). */
static bool cancel_on_other_thread(tw_service *s, tw_id id)
{
    struct cancel_range c = {s, &id, 0, 1, false};
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, cancel_one_main, &c), 0);
    pthread_join(th, NULL);
    return c.all_won;
}

static void test_memory_promise_sleeping(void)
{
    tw_service *s = real_service();
    warm(s);
    tw__service_sync(s);
    struct runs r = {0};
    tw_id early, late;
    ASSERT_EQ(tw_schedule(s, runs_task, &r, 10 * SEC, &early), 0);
    tw__service_sync(s);
    tw__service_sync(s); /* it sleeps until the early task now */
    uint64_t before = cancelled_count(s);
    ASSERT_EQ(tw_schedule(s, runs_task, &r, 20 * SEC, &late), 0);
    ASSERT(cancel_on_other_thread(s, late));
    WAIT_FOR(cancelled_count(s) == before + 1, 2);
    ASSERT_EQ(tw_service_pending(s), 1);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 1);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* The producers store their tails without a full barrier when the kernel
 * offers membarrier(2) (src/fence.h): the timer thread's heavy barrier
 * stands for theirs. It must come after the timer thread has said how long
 * it sleeps (wake_ns, which a producer reads after its store) and before it
 * reads the rings, whenever it may sleep past the next tick, and in stop
 * after the stop bit. Counted and checked by tw__fence_heavy_hook; with
 * TW_TEST_FENCE_OFF in the environment (the test's second CTest entry) the
 * service must use none and exchange its tails as before. */
static _Atomic(tw_service *) fence_s;
static pthread_t fence_main;
static _Atomic unsigned fence_timer, fence_stop, fence_bad;
/* The timer thread's calls are checked only while fence_strict is set: no
 * schedule runs then, which would clear wake_ns (wake_for_tick()) between
 * the timer thread's store and the barrier. fence_in_hook: calls under
 * way, so that the test can clear fence_strict and wait for them. */
static _Atomic bool fence_strict;
static _Atomic unsigned fence_in_hook, fence_checked;

static void fence_hook(void)
{
    tw_service *s = fence_s;
    if (s == NULL)
        return;
    if (pthread_equal(pthread_self(), fence_main)) {
        if (atomic_load(&s->submit.pending) & STOPPED_BIT)
            atomic_fetch_add(&fence_stop, 1);
        else
            atomic_fetch_add(&fence_bad, 1);
        return;
    }
    atomic_fetch_add(&fence_in_hook, 1);
    atomic_fetch_add(&fence_timer, 1);
    /* Sleeping long: both set, before the rings are read. */
    if (atomic_load(&fence_strict)) {
        atomic_fetch_add(&fence_checked, 1);
        if (atomic_load(&s->timer.wake_ns) == 0 ||
            atomic_load(&s->timer.sleep_until) <= 1)
            atomic_fetch_add(&fence_bad, 1);
    }
    atomic_fetch_sub(&fence_in_hook, 1);
}

static void test_fence_points(void)
{
    bool want = tw__fence_ready();
    if (!want)
        fprintf(stderr, "   no heavy barrier here (%s): tails exchanged\n",
                getenv("TW_TEST_FENCE_OFF") ? "TW_TEST_FENCE_OFF"
                                            : "no membarrier(2)");
    fence_main = pthread_self();
    atomic_store(&fence_timer, 0);
    atomic_store(&fence_stop, 0);
    atomic_store(&fence_bad, 0);
    atomic_store(&fence_checked, 0);
    atomic_store(&fence_strict, false);
    tw__fence_heavy_hook = fence_hook;
    tw_service *s = real_service();
    fence_s = s;
    warm(s);
    ASSERT_EQ(s->cfg.fence, want);
    ASSERT_EQ(prod_at(s, 0)->tail_plain, want);
    struct runs r = {0};
    ASSERT_EQ(tw_schedule(s, runs_task, &r, 10 * SEC, NULL), 0);
    tw__service_sync(s); /* taken: no call of this test wakes it now */
    atomic_store(&fence_strict, true);
    tw__service_sync(s);
    if (want)
        WAIT_FOR(atomic_load(&fence_checked) >= 1, 5);
    /* Idle for 100 ticks: one long sleep, not a barrier per tick (a
     * spurious wake-up may add one). */
    unsigned before = atomic_load(&fence_timer);
    sleep_ns(100 * MS);
    ASSERT_LE(atomic_load(&fence_timer) - before, 2);
    /* Busy, a task due at each of the next 100 ticks: sleeps to the next
     * tick take no barrier (no interrupt of the producers per tick). */
    struct runs busy = {0};
    atomic_store(&fence_strict, false);
    while (atomic_load(&fence_in_hook) != 0)
        sleep_ns(MS);
    for (int k = 1; k <= 100; k++)
        ASSERT_EQ(tw_schedule(s, runs_task, &busy, (uint64_t)k * MS, NULL), 0);
    before = atomic_load(&fence_timer);
    WAIT_FOR(atomic_load(&busy.n) == 100, 10);
    ASSERT_LE(atomic_load(&fence_timer) - before, 10);
    ASSERT_EQ(atomic_load(&fence_stop), 0);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 1);
    ASSERT_EQ(atomic_load(&fence_stop), want ? 1 : 0);
    if (!want)
        ASSERT_EQ(atomic_load(&fence_timer), 0);
    ASSERT_EQ(atomic_load(&fence_bad), 0);
    fence_s = NULL;
    tw__fence_heavy_hook = NULL;
    tw_service_destroy(s);

    /* A tick under 100 us: the tails are exchanged (a barrier asked of the
     * kernel every two ticks would interrupt the producers too often). */
    tw_service_config cfg = {0};
    cfg.tick_ns = 99 * 1000;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    ASSERT_EQ(tw_service_start(s), 0);
    warm(s);
    ASSERT(!s->cfg.fence);
    ASSERT(!prod_at(s, 0)->tail_plain);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
    cfg.tick_ns = 100 * 1000;
    ASSERT_EQ(tw_service_create(&s, &cfg), 0);
    ASSERT_EQ(s->cfg.fence, want);
    tw_service_destroy(s);
}

/* Has the timer thread taken every ring's slots? (It takes DRAIN_BATCH a
 * round: a full ring takes several rounds, more than a tw__service_sync().)
 */
static bool rings_empty(tw_service *s)
{
    for (uint32_t k = 0; k < atomic_load(&s->prods.n) && k < MAX_PRODS; k++) {
        struct prod *p = atomic_load(&s->prods.slot[k]);
        if (p != NULL && atomic_load(&p->head) != atomic_load(&p->tail))
            return false;
    }
    return true;
}

/* ------------------------------------------------------------------------ */
/* The owner's cancels take records back into its magazine; a burst of them
 * (a ring full of tasks that all end before their deadline) must not keep
 * them all there, out of reach of the other threads: the magazine keeps a
 * bounded number and gives the rest back to the pool. Measured by the
 * records a second thread then needs: with the burst's records in the
 * pool, it allocates no new chunk of 4096 (memory_bytes stays within one
 * chunk); kept in the first thread's magazine, it would need N new ones. */
static uint64_t memory_bytes(tw_service *s)
{
    tw_service_stats st;
    tw_service_get_stats(s, &st);
    return st.memory_bytes;
}

enum { BURST = 4 * 4096 };

static void *burst_main(void *arg)
{
    tw_service *s = arg;
    static tw_id ids[BURST];
    for (int i = 0; i < BURST; i++)
        ASSERT_EQ(
            tw_schedule(s, runs_task, &(struct runs){0}, 10 * SEC, &ids[i]), 0);
    for (int i = 0; i < BURST; i++)
        ASSERT(tw_cancel(s, ids[i]));
    return NULL;
}

/* Grow producer @p's ring to at least @want slots: fill it with the
 * timer thread held, let the thread take the tasks, cancel them, and one
 * more call finds the ring empty and doubles it. Returns the tasks it
 * scheduled (all cancelled). Context: @p's owner. */
static uint64_t grow_ring(tw_service *s, struct prod *p, uint32_t want)
{
    uint64_t n = 0;
    while (p->ring_mask + 1 < want) {
        uint32_t slots;
        tw_id *ids = fill_ring(s, p, &(struct runs){0}, &slots);
        release_timer();
        WAIT_FOR(rings_empty(s), 10);
        for (uint32_t i = 0; i <= slots; i++)
            ASSERT(tw_cancel(s, ids[i]));
        free(ids);
        warm(s); /* finds the ring empty: it grows */
        n += slots + 2;
        ASSERT_EQ(p->ring_mask + 1, 2 * slots);
    }
    return n;
}

static void test_owner_burst_returns_records(void)
{
    tw_service *s = real_service();
    warm(s);
    /* A ring that holds the whole burst. */
    uint64_t grown = grow_ring(s, prod_at(s, 0), BURST);
    hold_timer(s); /* the burst stays in the ring: the owner's cancels */
    burst_main(s);
    ASSERT_EQ(tw_service_pending(s), 0);
    uint64_t before = memory_bytes(s);
    /* Another thread's producer (this one stays owned). Its ring lives
     * with the producer: leave that out of the comparison. */
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, burst_main, s), 0);
    pthread_join(th, NULL);
    struct prod *other = prod_at(s, 1);
    ASSERT_EQ(other->ring_old_n, 0); /* full, but never found empty */
    uint64_t ring = sizeof(struct prod) + ring_bytes(other->ring_mask);
    uint64_t grew = memory_bytes(s) - before - ring;
    ASSERT(grew < 4096u * sizeof(struct node) + 4096u);
    release_timer();
    WAIT_FOR(cancelled_count(s) == 1 + grown + 2 * (uint64_t)BURST, 10);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* Stop begins after a call published its task in the ring and before the
 * call looks for the stop (tw__service_pushed_hook), and stop is held (in
 * its hand-back of a task from the wheel) until the call has looked: the
 * call withdraws its slot, returns TW_ESHUTDOWN with *id as it was, and
 * stop, which passes the slot later, neither hands the task back nor
 * counts it; nothing stays pending. (When stop takes the slot first, the
 * call succeeds: test_service_producers, test_stop_after_push.) */
static struct {
    tw_service *s;
    _Atomic bool armed;
    _Atomic int step; /* 1: stop is in its hand-back; 2: the call is done */
    int stop_rc;
    int nhanded;
    tw_id handed;
} wd;

static void wd_handed(tw_id id, tw_task_fn fn, void *arg, void *ctx)
{
    (void)fn;
    (void)arg;
    (void)ctx;
    wd.handed = id;
    wd.nhanded++;
    atomic_store(&wd.step, 1);
    while (atomic_load(&wd.step) != 2)
        sleep_us(100);
}

static void *wd_stop_main(void *arg)
{
    (void)arg;
    wd.stop_rc = tw_service_stop(wd.s, wd_handed, NULL);
    return NULL;
}

static pthread_t wd_stopper;

static void wd_pushed(tw_service *s)
{
    bool yes = true;
    if (s != wd.s || !atomic_compare_exchange_strong(&wd.armed, &yes, false))
        return;
    ASSERT_EQ(pthread_create(&wd_stopper, NULL, wd_stop_main, NULL), 0);
    while (atomic_load(&wd.step) != 1)
        sleep_us(100);
}

static void test_stop_withdraws_slot(void)
{
    memset(&wd, 0, sizeof(wd));
    wd.s = real_service();
    warm(wd.s);
    struct runs r = {0};
    tw_id armed;
    ASSERT_EQ(tw_schedule(wd.s, runs_task, &r, 10 * SEC, &armed), 0);
    tw__service_sync(wd.s);
    tw__service_sync(wd.s); /* in the wheel */
    tw__service_pushed_hook = wd_pushed;
    atomic_store(&wd.armed, true);
    tw_id id = 12345;
    int sched_rc = tw_schedule(wd.s, runs_task, &r, 10 * SEC, &id);
    tw__service_pushed_hook = NULL;
    ASSERT(!atomic_load(&wd.armed)); /* the hook ran */
    ASSERT_EQ(sched_rc, TW_ESHUTDOWN);
    ASSERT_EQ(id, 12345);
    atomic_store(&wd.step, 2);
    pthread_join(wd_stopper, NULL);
    ASSERT_EQ(wd.stop_rc, 1);
    ASSERT_EQ(wd.nhanded, 1);
    ASSERT_EQ(wd.handed, armed);
    ASSERT_EQ(tw_service_pending(wd.s), 0);
    ASSERT_EQ(cancelled_count(wd.s), 1); /* the warm-up's only */
    ASSERT_EQ(atomic_load(&r.n), 0);
    ASSERT_EQ(tw_schedule(wd.s, runs_task, &r, 0, NULL), TW_ESHUTDOWN);
    tw_service_destroy(wd.s);
}

/* ------------------------------------------------------------------------ */
/* The timer thread, and an executor thread, as producers: a task schedules
 * a task due at once and one due later, then cancels the later one and
 * tries again. Both tasks wait in the ring of the running thread (the
 * timer thread cannot take the slot while it runs the task: the state
 * word reads LOC_RING there); the owner's cancel wins once, the task due
 * at once runs once, on a thread of the service, and nothing stays. */
static struct {
    tw_service *s;
    struct runs now_r, later_r;
    _Atomic int done;
    bool in_ring, won, again;
} tp;

static void tp_task(tw_id self, void *arg)
{
    (void)self;
    (void)arg;
    tw_id now_id, later_id;
    ASSERT_EQ(tw_schedule(tp.s, runs_task, &tp.now_r, 0, &now_id), 0);
    ASSERT_EQ(tw_schedule(tp.s, runs_task, &tp.later_r, 10 * SEC, &later_id),
              0);
    tp.in_ring = loc_of(tp.s, later_id) == LOC_RING;
    tp.won = tw_cancel(tp.s, later_id);
    tp.again = tw_cancel(tp.s, later_id);
    atomic_store(&tp.done, 1);
}

static void test_service_threads_as_producers(void)
{
    for (uint32_t nexec = 0; nexec < 2; nexec++) {
        memset(&tp, 0, sizeof(tp));
        tw_service_config cfg = {.executor_threads = nexec};
        ASSERT_EQ(tw_service_create(&tp.s, &cfg), 0);
        ASSERT_EQ(tw_service_start(tp.s), 0);
        ASSERT_EQ(tw_schedule(tp.s, tp_task, NULL, 0, NULL), 0);
        WAIT_FOR(atomic_load(&tp.done) == 1, 10);
        WAIT_FOR(atomic_load(&tp.now_r.n) == 1, 10);
        tw__service_sync(tp.s);
        if (nexec == 0)
            ASSERT(tp.in_ring); /* an executor's: it may have been taken */
        ASSERT(tp.won);
        ASSERT(!tp.again);
        ASSERT_EQ(atomic_load(&tp.now_r.n), 1);
        ASSERT_EQ(atomic_load(&tp.later_r.n), 0);
        WAIT_FOR(tw_service_pending(tp.s) == 0, 10);
        ASSERT_EQ(cancelled_count(tp.s), 1);
        ASSERT_EQ(tw_service_stop(tp.s, NULL, NULL), 0);
        ASSERT_EQ(atomic_load(&tp.now_r.n), 1);
        tw_service_destroy(tp.s);
    }
}

/* ------------------------------------------------------------------------ */
/* A full lap of a ring that may not grow: its slots' worth of tasks fill
 * it exactly (the last one in it, the next on the stack), the timer
 * thread takes them, and the next call finds room again in the next lap,
 * in the same ring. There, the records come back with new generations: no
 * id of the first lap cancels a task of the second, and each task of the
 * second is cancelled once by its owner. */
static void test_ring_lap(void)
{
    tw_service *s = real_service();
    warm(s);
    struct prod *p = prod_at(s, 0);
    p->ring_cap = p->ring_mask + 1; /* as after a failed growth */
    struct ring *first = atomic_load(&p->ring);
    tw__service_sync(s);
    hold_timer(s);
    const int N = (int)p->ring_mask + 1;
    tw_id *ids = calloc(2 * (size_t)N + 1, sizeof(*ids));
    ASSERT(ids != NULL);
    struct runs r = {0};
    for (int i = 0; i < N; i++)
        ASSERT_EQ(tw_schedule(s, runs_task, &r, 10 * SEC, &ids[i]), 0);
    ASSERT_EQ(loc_of(s, ids[N - 1]), LOC_RING);
    ASSERT_EQ(tw_schedule(s, runs_task, &r, 10 * SEC, &ids[N]), 0);
    ASSERT_EQ(loc_of(s, ids[N]), LOC_QUEUED); /* full: the stack */
    release_timer();
    WAIT_FOR(rings_empty(s), 10);
    tw__service_sync(s);
    for (int i = 0; i <= N; i++)
        ASSERT(tw_cancel(s, ids[i]));
    tw__service_sync(s);
    tw__service_sync(s); /* their records back in the pool */
    hold_timer(s);
    for (int i = N + 1; i <= 2 * N; i++) {
        ASSERT_EQ(tw_schedule(s, runs_task, &r, 10 * SEC, &ids[i]), 0);
        ASSERT_EQ(loc_of(s, ids[i]), LOC_RING);
    }
    ASSERT(atomic_load(&p->ring) == first);
    for (int i = 0; i <= N; i++)
        ASSERT(!tw_cancel(s, ids[i]));
    ASSERT_EQ(tw_service_pending(s), N);
    for (int i = N + 1; i <= 2 * N; i++)
        ASSERT(tw_cancel(s, ids[i]) && !tw_cancel(s, ids[i]));
    ASSERT_EQ(tw_service_pending(s), 0);
    release_timer();
    end_quiet(s, &r, 2 + 2 * (uint64_t)N, ids);
}

/* ------------------------------------------------------------------------ */
/* Another thread cancels a task in the owner's ring first, then the owner
 * tries: the owner's cancel loses and must not take the record back (the
 * timer thread frees it: taken back too, it would be freed twice and the
 * owner's next call would get it while it is still in the ring). */
static void test_other_then_owner_cancel(void)
{
    tw_service *s = real_service();
    warm(s);
    hold_timer(s);
    struct runs r = {0};
    tw_id x, y;
    ASSERT_EQ(tw_schedule(s, runs_task, &r, 0, &x), 0);
    ASSERT(cancel_on_other_thread(s, x));
    ASSERT(!tw_cancel(s, x));
    ASSERT_EQ(loc_of(s, x), LOC_RING); /* still the timer thread's to free */
    ASSERT_EQ(tw_schedule(s, runs_task, &r, 0, &y), 0);
    ASSERT((uint32_t)y != (uint32_t)x);
    ASSERT_EQ(tw_service_pending(s), 1);
    release_timer();
    WAIT_FOR(atomic_load(&r.n) == 1, 10);
    WAIT_FOR(cancelled_count(s) == 2, 10);
    ASSERT_EQ(loc_of(s, x), LOC_FREE);
    ASSERT_EQ(tw_service_pending(s), 0);
    ASSERT_EQ(tw_service_stop(s, NULL, NULL), 0);
    ASSERT_EQ(atomic_load(&r.n), 1);
    tw_service_destroy(s);
}

/* ------------------------------------------------------------------------ */
/* A ring starts small and doubles once it has been found full, at the
 * first call that finds it empty again: with the timer thread held, a
 * ring's worth of tasks fills it and the next task goes on the stack (the
 * ring does not change while tasks wait in it); once the timer thread has
 * taken them, the next call has a ring twice the size, counted in
 * memory_bytes, and the outgrown one is kept. Every task of every ring is
 * cancelled once by its owner. At the cap it stops growing. */
static void test_ring_grows(void)
{
    tw_service *s = real_service();
    warm(s);
    struct prod *p = prod_at(s, 0);
    ASSERT_EQ(p->ring_mask + 1, 1u << RING_MIN_BITS);
    ASSERT_EQ(p->ring_old_n, 0);
    p->ring_cap = 4u << RING_MIN_BITS; /* two doublings, then the cap */
    struct runs r = {0};
    uint64_t all = 1;
    for (unsigned round = 0; round < 3; round++) {
        struct ring *before = atomic_load(&p->ring);
        uint32_t slots;
        tw_id *ids = fill_ring(s, p, &r, &slots);
        ASSERT_EQ(p->ring_grow, round < 2);
        ASSERT(atomic_load(&p->ring) == before);
        release_timer();
        WAIT_FOR(rings_empty(s), 10);
        uint64_t mem = memory_bytes(s);
        ASSERT_EQ(tw_schedule(s, runs_task, &r, 10 * SEC, &ids[slots + 1]), 0);
        ASSERT_EQ(loc_of(s, ids[slots + 1]), LOC_RING);
        if (round < 2) {
            ASSERT_EQ(p->ring_mask + 1, 2 * slots);
            ASSERT_EQ(p->ring_old_n, round + 1);
            ASSERT(p->ring_old[round] == before);
            ASSERT(memory_bytes(s) - mem >= ring_bytes(p->ring_mask));
        } else {
            ASSERT_EQ(p->ring_mask + 1, slots);
            ASSERT(atomic_load(&p->ring) == before);
        }
        for (uint32_t i = 0; i <= slots + 1; i++)
            ASSERT(tw_cancel(s, ids[i]) && !tw_cancel(s, ids[i]));
        all += slots + 2;
        ASSERT_EQ(tw_service_pending(s), 0);
        free(ids);
    }
    end_quiet(s, &r, all, NULL);
}

/* Without the memory for a bigger ring, the producer keeps its ring for
 * good (and its tasks still go in it, or on the stack when it is full). */
static void test_ring_grow_fails(void)
{
    tw_service *s = real_service();
    warm(s);
    struct prod *p = prod_at(s, 0);
    struct runs r = {0};
    uint32_t slots;
    tw_id *ids = fill_ring(s, p, &r, &slots);
    ASSERT(p->ring_grow);
    release_timer();
    WAIT_FOR(rings_empty(s), 10);
    atomic_store(&fail_size, ring_bytes(2 * slots - 1));
    ASSERT_EQ(tw_schedule(s, runs_task, &r, 10 * SEC, &ids[slots + 1]), 0);
    atomic_store(&fail_size, 0);
    ASSERT_EQ(loc_of(s, ids[slots + 1]), LOC_RING);
    ASSERT_EQ(p->ring_mask + 1, slots);
    ASSERT_EQ(p->ring_cap, slots);
    ASSERT(!p->ring_grow);
    ASSERT_EQ(p->ring_old_n, 0);
    for (uint32_t i = 0; i <= slots + 1; i++)
        ASSERT(tw_cancel(s, ids[i]));
    ASSERT_EQ(tw_service_pending(s), 0);
    end_quiet(s, &r, 3 + (uint64_t)slots, ids);
}

/* Another thread's cancel reads the task's state word (in the ring) and
 * stops before it reads the producer's ring (tw__service_cancel_ring_hook).
 * Meanwhile the timer thread takes the task and the owner's ring grows:
 * the cancel then reads a slot of the new ring that is not the task's,
 * and must cancel the task through its state word, once. */
static struct {
    _Atomic tw_id id;
    _Atomic int stage; /* 1: the cancel waits in the hook; 2: go on */
} cg;

static void cancel_ring_hook(tw_service *s, uint64_t id)
{
    (void)s;
    if (id != atomic_load(&cg.id))
        return;
    atomic_store(&cg.stage, 1);
    while (atomic_load(&cg.stage) != 2)
        sleep_us(100);
}

static void *cancel_main(void *arg)
{
    tw_service *s = arg;
    return tw_cancel(s, atomic_load(&cg.id)) ? s : NULL;
}

static void test_cancel_reads_grown_ring(void)
{
    tw_service *s = real_service();
    warm(s);
    struct prod *p = prod_at(s, 0);
    struct runs r = {0};
    uint32_t slots;
    tw_id *ids = fill_ring(s, p, &r, &slots);
    tw_id victim = ids[5];
    ASSERT_EQ(loc_of(s, victim), LOC_RING);
    atomic_store(&cg.id, victim);
    atomic_store(&cg.stage, 0);
    tw__service_cancel_ring_hook = cancel_ring_hook;
    pthread_t th;
    ASSERT_EQ(pthread_create(&th, NULL, cancel_main, s), 0);
    while (atomic_load(&cg.stage) != 1)
        sleep_us(100);
    release_timer();
    WAIT_FOR(rings_empty(s), 10);
    ASSERT_EQ(tw_schedule(s, runs_task, &r, 10 * SEC, &ids[slots + 1]), 0);
    ASSERT_EQ(p->ring_mask + 1, 2 * slots); /* grown */
    ASSERT(loc_of(s, victim) != LOC_RING);
    atomic_store(&cg.stage, 2);
    void *won;
    pthread_join(th, &won);
    tw__service_cancel_ring_hook = NULL;
    ASSERT(won == s);
    ASSERT(!tw_cancel(s, victim));
    for (uint32_t i = 0; i <= slots + 1; i++)
        if (ids[i] != victim)
            ASSERT(tw_cancel(s, ids[i]));
    ASSERT_EQ(tw_service_pending(s), 0);
    end_quiet(s, &r, 3 + (uint64_t)slots, ids);
}

int main(int argc, char **argv)
{
    ASSERT_EQ(tw_set_allocator(malloc, ring_calloc, realloc, free), 0);
    tw__service_drained_hook = hold_hook;
    tw__service_ring_hook = race_hook;
    RUN_SELECTED(test_owner_cancel_reuses_record);
    RUN_SELECTED(test_cancel_races_take);
    RUN_SELECTED(test_stop_takes_ring);
    RUN_SELECTED(test_exited_producer_ring);
    RUN_SELECTED(test_full_ring_falls_back);
    RUN_SELECTED(test_memory_promise_sleeping);
    RUN_SELECTED(test_owner_burst_returns_records);
    RUN_SELECTED(test_stop_withdraws_slot);
    RUN_SELECTED(test_service_threads_as_producers);
    RUN_SELECTED(test_ring_lap);
    RUN_SELECTED(test_other_then_owner_cancel);
    RUN_SELECTED(test_ring_grows);
    RUN_SELECTED(test_ring_grow_fails);
    RUN_SELECTED(test_cancel_reads_grown_ring);
    RUN_SELECTED(test_fence_points);
    return tw_test_done();
}
