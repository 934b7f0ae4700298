/* SPDX-License-Identifier: MIT */
/*
 * src/service_life.c - a service's life: create (the configuration
 * checked and applied, the locks, the wheel, the executor pool), start
 * (the timer thread and the executors), stop (new work refused, the
 * threads joined, what never ran handed back: tw__svc_stop_drain()) and
 * destroy.
 */

#define _POSIX_C_SOURCE 200809L

#include "twheel/service.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#include "fence.h"
#include "service_impl.h"
#include "wheel_internal.h"

#define TICK_MIN_NS UINT64_C(1000)
/* The shortest tick with which the producers publish without a barrier
 * (publish_ring()): the timer thread then asks the kernel for one at most
 * every two ticks, 5,000 times a second. Below it the rings' tails are
 * exchanged. */
#define FENCE_MIN_TICK_NS UINT64_C(100000)
#define TICK_MAX_NS (UINT64_C(86400) * 1000000000u)

static int cond_init_mono(pthread_cond_t *cv)
{
    pthread_condattr_t ca;
    if (pthread_condattr_init(&ca) != 0)
        return TW_ENOMEM;
    int rc = pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    if (rc == 0)
        rc = pthread_cond_init(cv, &ca);
    pthread_condattr_destroy(&ca);
    return rc == 0 ? 0 : TW_ENOMEM;
}

/* The service's own mutexes and condition variables (the executor pool
 * has its own). */
enum { N_MUTEX = 3, N_COND = 2 };
struct syncs {
    pthread_mutex_t *mu[N_MUTEX];
    pthread_cond_t *cv[N_COND];
};

static struct syncs syncs_of(tw_service *s)
{
    return (struct syncs){{&s->timer.mu, &s->wait.mu, &s->life.stop_mu},
                          {&s->timer.cv, &s->wait.cv}};
}

/* Destroy the first @nm mutexes and @nc condition variables. */
static void sync_destroy(tw_service *s, unsigned nm, unsigned nc)
{
    struct syncs y = syncs_of(s);
    while (nc > 0)
        pthread_cond_destroy(y.cv[--nc]);
    while (nm > 0)
        pthread_mutex_destroy(y.mu[--nm]);
}

/* All on CLOCK_MONOTONIC. Returns 0 or TW_ENOMEM with nothing left. */
static int sync_init(tw_service *s)
{
    struct syncs y = syncs_of(s);
    unsigned nm = 0, nc = 0;
    while (nm < N_MUTEX && pthread_mutex_init(y.mu[nm], NULL) == 0)
        nm++;
    while (nm == N_MUTEX && nc < N_COND && cond_init_mono(y.cv[nc]) == 0)
        nc++;
    if (nm == N_MUTEX && nc == N_COND)
        return 0;
    sync_destroy(s, nm, nc);
    return TW_ENOMEM;
}

int tw_service_create_sized(tw_service **out, const tw_service_config *cfg,
                            size_t cfg_size)
{
    tw_service_config c;
    if (cfg == NULL)
        return (tw_service_create)(out, NULL);
    int rc = tw__config_copy(&c, sizeof c, cfg, cfg_size);
    return rc != 0 ? rc : (tw_service_create)(out, &c);
}

/* The sizes a config asks for, defaults applied and rounded up. */
struct sizes {
    uint64_t tick, slots;
    uint32_t nfns;
    clockid_t clock_id;
};

/* 0 and *@z, or TW_EINVAL if a field of @cfg is out of range. */
static int config_sizes(const tw_service_config *cfg, struct sizes *z)
{
    if (tw__svc_clock_id(cfg->clock_id, &z->clock_id) != 0 ||
        (cfg->clock != NULL && cfg->clock_id != 0))
        return TW_EINVAL;
    uint64_t tick = cfg->tick_ns ? cfg->tick_ns : UINT64_C(1000000);
    uint64_t slots = cfg->ticks_per_wheel ? cfg->ticks_per_wheel : 512;
    uint64_t maxfn = cfg->max_callbacks ? cfg->max_callbacks : 1024;
    if (tick < TICK_MIN_NS || tick > TICK_MAX_NS ||
        slots > (UINT64_C(1) << 30) || cfg->levels > 64 ||
        cfg->executor_threads > 1024 || maxfn > (UINT64_C(1) << 24) ||
        (cfg->flags & ~TW_SERVICE_LAZY_CLOCK) != 0 ||
        (cfg->execute != NULL && cfg->executor_threads != 0))
        return TW_EINVAL;
    uint64_t p2 = 1;
    while (p2 < slots)
        p2 <<= 1;
    slots = p2;
    /* One revolution of the first level must fit in 64 bits of ns. */
    if (slots > UINT64_MAX / tick)
        return TW_EINVAL;
    p2 = 1;
    while (p2 < maxfn)
        p2 <<= 1;
    z->tick = tick;
    z->slots = slots;
    z->nfns = (uint32_t)p2;
    return 0;
}

/* Fill the new service's configuration. */
static void config_apply(tw_service *s, const tw_service_config *cfg,
                         const struct sizes *z)
{
    s->cfg.tick_ns = z->tick;
    s->cfg.max_pending = cfg->max_pending;
    s->cfg.clock = cfg->clock;
    s->cfg.clock_ctx = cfg->clock_ctx;
    s->cfg.clock_id = (int32_t)z->clock_id;
    s->cfg.slack_ns = cfg->slack_ns;
    s->cfg.execute = cfg->execute;
    s->cfg.execute_ctx = cfg->execute_ctx;
    s->cfg.nexec = cfg->executor_threads;
    s->cfg.lazy = (cfg->flags & TW_SERVICE_LAZY_CLOCK) != 0;
    s->cfg.tick_recip = tw__recip(z->tick);
    if (cfg->clock == NULL && z->clock_id == CLOCK_MONOTONIC)
        s->cfg.tsc = tw__tsc_mono();
    s->cfg.hot = s->cfg.tsc != NULL && !s->cfg.lazy && s->cfg.slack_ns == 0 &&
                 s->cfg.max_pending == 0;
    s->cfg.fence = z->tick >= FENCE_MIN_TICK_NS && tw__fence_ready();
    s->cfg.start_ns = s->cfg.clock ? s->cfg.clock(s->cfg.clock_ctx)
                                   : tw__clock_ns((clockid_t)s->cfg.clock_id);
    atomic_fetch_add(&s->mem, sizeof(*s));
}

int(tw_service_create)(tw_service **out, const tw_service_config *cfg)
{
    static const tw_service_config defaults = {0};
    static _Atomic uint64_t serial;
    struct sizes z;
    if (out == NULL)
        return TW_EINVAL;
    if (cfg == NULL)
        cfg = &defaults;
    int rc = config_sizes(cfg, &z);
    if (rc != 0)
        return rc;
    tw_service *s = tw__calloc(1, sizeof(*s));
    if (s == NULL)
        return TW_ENOMEM;
    uint64_t sn = atomic_fetch_add(&serial, 1) + 1;
    uint32_t salt =
        (uint32_t)sn * UINT32_C(0x85EBCA6B) ^ (uint32_t)(uintptr_t)s;
    s->prods.serial = sn;
    tw__pool_init(&s->pool, s, salt);
    s->fns.fns = tw__calloc((size_t)z.nfns, sizeof(*s->fns.fns));
    if (s->fns.fns == NULL) {
        rc = TW_ENOMEM;
        goto fail_pool;
    }
    s->fns.mask = z.nfns - 1;
    atomic_fetch_add(&s->mem, (uint64_t)z.nfns * sizeof(*s->fns.fns));
    rc = tw__exec_init(&s->exec, cfg->executor_threads, tw__svc_exec_take,
                       tw__svc_exec_run, s);
    if (rc != 0)
        goto fail_exec;
    s->cfg.wcfg.slots = (uint32_t)z.slots;
    s->cfg.wcfg.levels = cfg->levels;
    if ((rc = tw_wheel_create(&s->timer.wheel, &s->cfg.wcfg, 0)) != 0)
        goto fail_wheel;
    tw__wheel_set_fire(s->timer.wheel, tw__svc_trampoline,
                       s); /* see struct node */
    if ((rc = sync_init(s)) != 0)
        goto fail_sync;
    config_apply(s, cfg, &z);
    tw__svc_reg_add(s);
    *out = s;
    return 0;

fail_sync:
    tw_wheel_destroy(s->timer.wheel);
fail_wheel:
    tw__exec_destroy(&s->exec);
fail_exec:
    tw__free((void *)s->fns.fns);
fail_pool:
    tw__free(s);
    return rc;
}

/* Stop and join the timer thread, then the executors (they finish the
 * tasks already due). */
static void join_threads(tw_service *s)
{
    atomic_store(&s->timer.quit, true);
    wake(s);
    pthread_join(s->timer.thread, NULL);
    tw__exec_stop(&s->exec);
}

int tw_service_start(tw_service *s)
{
    if (s == NULL)
        return TW_EINVAL;
    /* Checked before the lock too: stop holds it while it hands tasks
     * back, and its callback may call us. */
    if (atomic_load(&s->submit.pending) & STOPPED_BIT)
        return TW_ESHUTDOWN;
    /* Started: a no-op, and without the lock. A task calling us must not
     * wait for a stop that has taken the lock and waits for the task. */
    if (atomic_load_explicit(&s->timer.started, memory_order_acquire))
        return 0;
    pthread_mutex_lock(&s->life.stop_mu);
    int rc = 0;
    if (atomic_load(&s->submit.pending) & STOPPED_BIT)
        rc = TW_ESHUTDOWN;
    if (rc != 0 || atomic_load(&s->timer.started))
        goto out;
    rc = tw__exec_start(&s->exec);
    if (rc == 0) {
        rc = pthread_create(&s->timer.thread, NULL, tw__svc_timer_main, s);
        if (rc == 0) {
            atomic_store_explicit(&s->timer.started, true,
                                  memory_order_release);
            goto out;
        }
        tw__exec_stop(&s->exec);
    }
    rc = rc == ENOMEM ? TW_ENOMEM : TW_EAGAIN;
out:
    pthread_mutex_unlock(&s->life.stop_mu);
    return rc;
}

int tw_service_stop(tw_service *s, tw_unprocessed_fn fn, void *ctx)
{
    if (s == NULL)
        return TW_EINVAL;
    if (tw__svc_cur.s == s)
        return TW_EDEADLK;
    pthread_mutex_lock(&s->life.stop_mu);
    if (s->life.stop_done) {
        pthread_mutex_unlock(&s->life.stop_mu);
        return 0;
    }
    atomic_fetch_or(&s->submit.pending, STOPPED_BIT);
    /* For the producers' rings (publish_ring()): a schedule either sees
     * the bit or has published its slot before the rings are drained. */
    if (s->cfg.fence)
        tw__fence_heavy();
    if (atomic_load(&s->timer.started)) {
        join_threads(s);
        /* A caller-supplied executor: wait for the jobs it holds. */
        while (atomic_load(&s->busy) != 0) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
    /* While @fn runs, this thread counts as one of the service's: a stop
     * from the callback returns TW_EDEADLK. */
    tw_service *saved_s = tw__svc_cur.s;
    tw__svc_cur.s = s;
    uint64_t handed = tw__svc_stop_drain(s, fn, ctx);
    tw__svc_cur.s = saved_s;
    s->life.stop_done = true;
    atomic_store(&s->life.stopped, true);
    pthread_mutex_unlock(&s->life.stop_mu);
    return handed > INT_MAX ? INT_MAX : (int)handed;
}

int tw_service_destroy(tw_service *s)
{
    if (s == NULL)
        return 0;
    /* From a task, the timer thread (a caller-supplied executor's callback)
     * or stop's callback: stop would wait for this very thread and the
     * frees below would pull the service from under it. */
    if (tw__svc_cur.s == s)
        return TW_EDEADLK;
    tw_service_stop(s, NULL, NULL);
    tw__svc_reg_remove(s);
    for (uint32_t k = 0; k < atomic_load(&s->prods.n) && k < MAX_PRODS; k++) {
        struct prod *p = atomic_load(&s->prods.slot[k]);
        if (p != NULL) {
            tw__free(atomic_load(&p->ring));
            for (unsigned i = 0; i < p->ring_old_n; i++)
                tw__free(p->ring_old[i]);
        }
        tw__free(p);
    }
    tw__pool_destroy(&s->pool);
    tw__free((void *)s->fns.fns);
    sync_destroy(s, N_MUTEX, N_COND);
    tw__exec_destroy(&s->exec);
    tw_wheel_destroy(s->timer.wheel);
    tw__free(s);
    return 0;
}
