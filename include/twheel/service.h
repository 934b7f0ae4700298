/* SPDX-License-Identifier: MIT */
/*
 * twheel/service.h - a thread-safe timer service in the manner of Netty's
 * HashedWheelTimer and Java's ScheduledThreadPoolExecutor.
 *
 * Thread safety: every function may be called from any thread at the same
 * time, task callbacks included, except tw_service_create() and
 * tw_service_destroy() (which must not race with any other call on the same
 * service). One timer thread owns a tw_wheel; producers hand it requests
 * through lock-free queues and never take a lock or make a system call in the
 * common case. Due tasks run on the timer thread (executor_threads == 0), on
 * a pool of executor threads, or on an executor supplied by the caller.
 *
 * Tasks are identified by a 64-bit tw_id (a slot index and a 32-bit
 * generation counter; never 0). An id stays meaningful after its task is
 * gone: a late tw_cancel() with it returns false and touches nothing, even
 * when the task's memory has been reused for another task, as long as that
 * record has been reused fewer than 2^32 - 1 times since (the generation
 * then wraps and the stale id would name the record's current task).
 *
 * Time: CLOCK_MONOTONIC, CLOCK_BOOTTIME or a caller's clock (see
 * "Clocks" below the config). A task
 * never runs before its delay has passed since the schedule call; deadlines
 * are absolute ticks since the service was created, so late wake-ups never
 * accumulate drift. On the built-in CLOCK_MONOTONIC on x86-64 with an
 * invariant TSC a schedule call reads an estimate of the clock from the
 * time-stamp counter, which is never earlier than the clock and at most a
 * few microseconds later (a deadline on a tick boundary may then move to
 * the next tick); the timer thread itself reads the clock. The first
 * tw_service_create() of a process on such a machine measures the
 * counter's rate against the clock, spinning for 2^22 cycles (about 1-4
 * ms). The timer thread sleeps until the next deadline and does not wake
 * periodically when idle.
 *
 * Memory: one 40-byte record per task (LP64), in chunks of 4096 that are
 * reused and only freed by tw_service_destroy(); a periodic task also has a
 * 32-byte side record. At most 2^27 - 1 records (then TW_ENOMEM). Each
 * distinct task function takes one entry of a per-service table
 * (max_callbacks) for the service's life.
 *
 * Producers: on a service without max_pending, each thread that schedules
 * or cancels gets a producer of its own (up to 64 per service; further
 * threads share one path): its own submission queue and pending count,
 * and a magazine of up to 64 free records taken from the pool at once, so
 * that threads do not contend on shared counters. A producer is about 200
 * bytes, kept until tw_service_destroy(); when its thread exits it passes
 * to the next thread that needs one, with its magazine. A record a task
 * released is therefore reused by whichever thread's magazine takes it,
 * not necessarily by the next call. To hand a producer back when its
 * thread exits, the library keeps one process-wide pthread key (made on
 * first use, never deleted) and a list of live services under one mutex;
 * no setting lives there. A program that unloads the library with
 * dlclose() must first let every thread that scheduled or cancelled exit.
 *
 * Deadlock rules: tw_service_stop(), tw_service_destroy() and
 * tw_cancel_wait() must not be called from inside the task they would wait
 * for (they return TW_EDEADLK and do nothing; stop and destroy do so on any
 * of the service's own threads), nor while holding a lock that a task
 * takes.
 */
#ifndef TWHEEL_SERVICE_H
#define TWHEEL_SERVICE_H

#include <stdbool.h>
#include <stdint.h>

#include "twheel/base.h" /* TW_VERSION_*, TW_E*, tw_strerror() */
#include "twheel/wheel.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tw_service tw_service;
typedef uint64_t tw_id; /* 0 is never a valid id */

/* A task. @id is the id tw_schedule*() returned, @arg the caller's. */
typedef void (*tw_task_fn)(tw_id id, void *arg);

/* Receives, from tw_service_stop(), each task that will never run. */
typedef void (*tw_unprocessed_fn)(tw_id id, tw_task_fn fn, void *arg,
                                  void *ctx);

/*
 * A clock: nanoseconds on a monotonic scale (never decreasing). Called from
 * any thread. Used for tests (a virtual clock) or to share a time base. If
 * it steps back all the same, the service's time holds at its latest
 * reading until the clock is back there.
 */
typedef uint64_t (*tw_clock_fn)(void *ctx);

/*
 * An executor supplied by the caller. The timer thread calls it once for
 * each due task, with the task's id as a job handle; the executor must call
 * tw_service_run(@s, @job) once, from any thread, soon (further calls are
 * ignored). It must not block for long: the timer thread is waiting.
 * tw_service_stop() waits for those calls, so it must not be called from
 * the thread that makes them while it holds jobs.
 */
typedef void (*tw_execute_fn)(tw_service *s, tw_id job, void *ctx);

/* How a service runs; all zero gives the defaults. */
typedef struct tw_service_config {
    uint64_t tick_ns;          /* resolution; 0 = 1 ms; 1 us .. 1 day */
    uint32_t ticks_per_wheel;  /* 0 = 512; rounded up to a power of two;
                                  at most 2^30 */
    uint32_t levels;           /* as tw_wheel_config.levels (0 = default) */
    uint64_t max_pending;      /* 0 = unlimited */
    uint32_t executor_threads; /* 0 = tasks run on the timer thread; at
                                  most 1024 */
    /* Additions (zero = default): */
    uint32_t max_callbacks; /* distinct task functions the service can
                               hold; 0 = 1024; rounded up to a power of
                               two; at most 2^24. Each task stores its
                               function as an index into this table,
                               which keeps a pending task at 40 bytes. */
    tw_clock_fn clock;      /* NULL = CLOCK_MONOTONIC */
    void *clock_ctx;        /* passed to clock */
    tw_execute_fn execute;  /* NULL = built in; needs executor_threads
                               == 0 */
    void *execute_ctx;      /* passed to execute */
    uint32_t flags;         /* TW_SERVICE_* below */
    /* Added in 0.2.0, past the 0.1 struct's tail padding (which an older
     * caller may leave unset): */
    uint64_t slack_ns; /* default window of tw_schedule(): a task may run
                          up to this much after its delay, so that tasks
                          share wake-ups (see tw_schedule_window()); 0 =
                          exact. Periodic tasks stay exact. */
    int32_t clock_id;  /* the built-in clock: 0 or CLOCK_MONOTONIC
                          (the default), or CLOCK_BOOTTIME; anything
                          else is TW_EINVAL. 0 means the default, so
                          the wall clock cannot be chosen
                          (CLOCK_REALTIME is 0 on Linux). See "Clocks"
                          below. Must be 0 with a caller-supplied
                          clock. */
} tw_service_config;

/*
 * Clocks (tw_service_config.clock_id). Delays are measured on the chosen
 * clock, and the difference shows across a suspend of the machine:
 * - CLOCK_MONOTONIC (default) stops while the machine is suspended: a
 *   task due in 10 minutes, after a suspend of an hour, runs 10 minutes of
 *   awake time after the call. Right for timeouts of work that is frozen
 *   too (a request that cannot progress while asleep).
 * - CLOCK_BOOTTIME counts the time asleep: that task runs within about a
 *   second of the resume (the timer thread waits on CLOCK_MONOTONIC, which
 *   a condition variable supports, for at most 1 s at a time while a task
 *   is pending, and re-reads CLOCK_BOOTTIME; when nothing is pending it
 *   sleeps without a timeout). Right for leases, certificates, cache
 *   expiry and anything agreed with another machine.
 * Neither clock jumps when the wall clock is set.
 */

/*
 * TW_SERVICE_LAZY_CLOCK: while the timer thread is awake or polling (it
 * polls once a tick for a tick after any schedule or cancel), a one-shot
 * schedule call does not read the clock: the timer thread computes the
 * deadline from its own clock reading when it takes the request. A task
 * still never runs before its delay has passed since the call, but it may
 * run later than without the flag by the time the request waited to be
 * taken: about one tick normally, more under a flood of submissions (the
 * timer thread takes a bounded batch per round; the delay starts when the
 * request is taken).
 * Saves one clock_gettime() per call (about 23 ns on a KVM guest). When
 * the timer thread sleeps longer, or runs a task itself (executor_threads
 * == 0), the call reads the clock as usual, so an isolated schedule is as
 * exact as without the flag. The true bound with tasks on the timer
 * thread: a call made in the instant before the timer thread starts the
 * tasks due in its round may run late by up to their run time.
 * The flag also saves the clock read at the start of each task run on the
 * timer thread (tw_service_stats.late_hist): the lateness of every task of
 * a round is then taken from the timer thread's reading for the round, so
 * the time spent running the round's earlier tasks is not counted.
 */
#define TW_SERVICE_LAZY_CLOCK 1u

/* Counters; each is a snapshot, exact once the service is stopped. */
typedef struct tw_service_stats {
    uint64_t pending;      /* as tw_service_pending() */
    uint64_t ran;          /* task runs (each run of a periodic task) */
    uint64_t cancelled;    /* tasks released after a successful cancel */
    uint64_t handed_back;  /* tasks given to the unprocessed callback */
    uint64_t wakeups;      /* times the timer thread woke from a sleep */
    uint64_t nodes;        /* task records allocated (in use or free) */
    uint64_t memory_bytes; /* bytes the service has allocated and uses;
                              a chunk of 4096 records also asks the
                              allocator for up to 256 KiB more address
                              space to align itself, never touched */
    /* Added in 0.2.0; see tw_service_get_stats_sized(). */
    uint64_t backlog; /* tasks found due and handed to an executor (the
                         built-in pool or a caller-supplied one) that have
                         not started yet. Tasks that run on the timer
                         thread (executor_threads == 0) are not counted:
                         while one runs, the others wait unseen in the
                         wheel, and only late_hist shows their delay. */
    uint64_t late_hist[TW_LATE_BUCKETS]; /* runs by how late they started
                         after their due time (wheel.h has the buckets):
                         the start of the tick the task was given (its
                         deadline rounded up to a tick; for a window, the
                         tick chosen in it). Every run is counted once;
                         the buckets add up to ran. */
} tw_service_stats;

/**
 * tw_service_create - make a stopped service; no thread is started yet.
 * @out: receives the service; left as it was on failure.
 * @cfg: the configuration, or NULL for the defaults.
 *
 * Context: any thread.
 * Return: 0, TW_EINVAL (NULL @out; a field out of range; tick_ns times
 * ticks_per_wheel overflowing; execute with executor_threads; unknown
 * flags) or TW_ENOMEM.
 */
TW_EXTERN int tw_service_create(tw_service **out, const tw_service_config *cfg);

/**
 * tw_service_create_sized - tw_service_create() for a config struct of a
 * given size.
 * @out: as tw_service_create().
 * @cfg: as tw_service_create().
 * @cfg_size: the size of *@cfg as the caller's header declares it.
 *
 * The plain name is a macro that passes sizeof(tw_service_config) as this
 * header declares it, so a program built against an older header (a
 * shorter struct) still works with a newer library: fields past @cfg_size
 * count as zero, their default. Bytes past the struct this library knows
 * must be zero, else TW_EINVAL.
 *
 * Context: any thread.
 * Return: as tw_service_create().
 */
TW_EXTERN int tw_service_create_sized(tw_service **out,
                                      const tw_service_config *cfg,
                                      size_t cfg_size);
/* tw_service_create() as a call of the sized form with this header's size. */
#define tw_service_create(out, cfg)                                            \
    tw_service_create_sized((out), (cfg), sizeof(tw_service_config))

/**
 * tw_service_start - start the timer thread (and executor threads).
 * @s: the service.
 *
 * Optional: the first schedule call starts the service. Starting a started
 * service is a no-op returning 0.
 *
 * Context: any thread.
 * Return: 0, TW_EINVAL (NULL @s), TW_ESHUTDOWN (stopped) or TW_ENOMEM /
 * TW_EAGAIN (a thread could not be created; nothing is left running).
 */
TW_EXTERN int tw_service_start(tw_service *s);

/**
 * tw_schedule - run a task once, after a delay.
 * @s: the service.
 * @fn: the task; runs as @fn(@id, @arg).
 * @arg: the caller's, passed to @fn.
 * @delay_ns: nanoseconds from now: the task never runs earlier, and on an
 *            unloaded machine within one tick after. A delay whose
 *            deadline does not fit in 64 bits of nanoseconds means
 *            "never": the task is accepted and pending but never runs,
 *            and tw_service_stop() hands it back.
 * @id: may be NULL; receives the task's id before the task can run.
 *
 * On failure nothing changed and *@id is left as it was: the first call
 * starts the service only after its allocations succeeded, so one that
 * fails leaves no thread running.
 *
 * Context: any thread, tasks included. Lock-free, and without system calls
 * except when the pool of task records grows (4096 records from the
 * library's allocator, see tw_set_allocator(), published with a
 * compare-and-swap) or when the deadline is earlier than the timer
 * thread's planned wake-up (a mutex and a condition signal).
 * Return: 0; TW_EINVAL (NULL @s or @fn); TW_EAGAIN (max_pending reached, or
 * max_callbacks distinct functions in use); TW_ESHUTDOWN (stopped);
 * TW_ENOMEM; or a start error.
 */
TW_EXTERN int tw_schedule(tw_service *s, tw_task_fn fn, void *arg,
                          uint64_t delay_ns, tw_id *id);

/**
 * tw_schedule_window - run a task once, at some time inside a window.
 * @s: the service.
 * @fn: the task; runs as @fn(@id, @arg).
 * @arg: the caller's, passed to @fn.
 * @earliest_ns: nanoseconds from now (as tw_schedule()'s delay): the task
 *               never runs earlier.
 * @latest_ns: nanoseconds from now: on an unloaded machine the task runs
 *             no later; >= @earliest_ns.
 * @id: as tw_schedule().
 *
 * The run is placed so that tasks with overlapping windows share one
 * wake-up of the timer thread: at the coarsest tick boundary inside the
 * window, as tw_wheel_add_window() chooses it. A window that holds no tick
 * boundary after its first tick (narrower than a tick) runs as
 * tw_schedule(@earliest_ns) does. tw_schedule() on a service with
 * slack_ns is this call with @latest_ns = delay + slack_ns. A window is
 * never taken lazily (TW_SERVICE_LAZY_CLOCK): the call reads the clock.
 *
 * Context: any thread, tasks included; as tw_schedule(). It wakes the
 * timer thread only if that sleeps past the window's end.
 * Return: as tw_schedule(), and TW_EINVAL for @latest_ns < @earliest_ns.
 */
TW_EXTERN int tw_schedule_window(tw_service *s, tw_task_fn fn, void *arg,
                                 uint64_t earliest_ns, uint64_t latest_ns,
                                 tw_id *id);

/**
 * tw_schedule_fixed_rate - run a task periodically, at a fixed rate.
 * @s: the service.
 * @fn: the task; runs as @fn(@id, @arg).
 * @arg: the caller's, passed to @fn.
 * @initial_delay_ns: the first run's delay from now.
 * @period_ns: the period; not 0.
 * @id: as tw_schedule().
 *
 * Runs at start + @initial_delay_ns + k * @period_ns for k = 0, 1, ...
 * (start = the time of this call), without drift. Missed runs are not
 * repeated: after a run that ends past the next scheduled time (a stall,
 * or a run longer than the period), the next run is the first scheduled
 * time after it ended. Runs never overlap. Runs until cancelled or
 * stopped. Allocates a small side record (malloc) besides the task record.
 *
 * Context: any thread.
 * Return: as tw_schedule(), and TW_EINVAL for a zero @period_ns.
 */
TW_EXTERN int tw_schedule_fixed_rate(tw_service *s, tw_task_fn fn, void *arg,
                                     uint64_t initial_delay_ns,
                                     uint64_t period_ns, tw_id *id);

/**
 * tw_schedule_fixed_delay - run a task periodically, a fixed delay apart.
 * @s: the service.
 * @fn: the task; runs as @fn(@id, @arg).
 * @arg: the caller's, passed to @fn.
 * @initial_delay_ns: the first run's delay from now.
 * @delay_ns: the time from the end of one run to the next; not 0.
 * @id: as tw_schedule().
 *
 * Runs until cancelled or stopped.
 *
 * Context: any thread.
 * Return: as tw_schedule_fixed_rate() (TW_EINVAL for a zero @delay_ns).
 */
TW_EXTERN int tw_schedule_fixed_delay(tw_service *s, tw_task_fn fn, void *arg,
                                      uint64_t initial_delay_ns,
                                      uint64_t delay_ns, tw_id *id);

/**
 * tw_cancel - stop a task from running again.
 * @s: the service.
 * @id: the task.
 *
 * The task's memory is released within one tick; a task that is due and
 * waits in the executor pool's queue is released by the cancel itself,
 * however long the executors are busy. One exception: a task already
 * handed to a caller-supplied executor (tw_service_config.execute) keeps
 * its record until the executor calls tw_service_run() for it (which then
 * runs nothing). Does not wait for a run in progress (see
 * tw_cancel_wait()).
 *
 * Context: any thread, the task itself included. Lock-free, except that a
 * cancel that wins on a task already due for the executor pool takes the
 * pool's mutex (to unlink it); makes a system call only for that mutex or
 * to wake a timer thread that sleeps for longer than a tick.
 * Return: true if this call cancelled it: a one-shot task will not run; a
 * periodic task will not start another run (a run in progress completes).
 * False, touching nothing, if @id ran, is running (one-shot), was already
 * cancelled or handed back, is 0, or is not an id of @s.
 */
TW_EXTERN bool tw_cancel(tw_service *s, tw_id id);

/**
 * tw_cancel_wait - tw_cancel(), then wait until the task is not running.
 * @s: the service.
 * @id: the task.
 *
 * On return the task's function is not running and will not run again
 * (unless it was a one-shot task that had already started and finished).
 *
 * Context: any thread; must not hold a lock that the task takes.
 * Return: 1 if the cancel succeeded, 0 if it did not (see tw_cancel()),
 * TW_EDEADLK (nothing done) when called from inside task @id itself,
 * TW_EINVAL for a NULL @s.
 */
TW_EXTERN int tw_cancel_wait(tw_service *s, tw_id id);

/**
 * tw_service_pending - tasks accepted and not yet run, cancelled or handed
 * back.
 * @s: the service, or NULL.
 *
 * A one-shot task counts until it runs; a periodic task counts 1 until
 * cancelled or stopped; a RepeatedTimer counts 1 while started, during its
 * runs too. A call that fails never moves this count.
 *
 * Context: any thread.
 * Return: the count; 0 after stop, and for a NULL @s.
 */
TW_EXTERN uint64_t tw_service_pending(const tw_service *s);

/**
 * tw_service_stop - shut the service down.
 * @s: the service.
 * @fn: receives, as @fn(id, task fn, arg, @ctx), each task that will never
 *      run, exactly once, on the calling thread, so the caller can free its
 *      arg; may be NULL to drop them.
 * @ctx: passed to @fn.
 *
 * New schedule calls fail with TW_ESHUTDOWN from now on. Tasks that are
 * already due (handed to an executor) still run; every other task that has
 * not run is handed to @fn. Waits until no task is running, joins the
 * service's threads.
 *
 * Context: any thread except the service's own: from a task of @s (on an
 * executor thread or the timer thread), from the callback of a
 * caller-supplied executor (the timer thread) and from @fn it returns
 * TW_EDEADLK and does nothing. @fn may call the other functions on @s
 * (schedule and start fail with TW_ESHUTDOWN, stop and destroy with
 * TW_EDEADLK). With a caller-supplied executor, stop waits until
 * tw_service_run() was called for every job the executor received: never
 * call it from a thread that must still make one of those calls (for
 * example the thread that drains the executor's queue), or while holding a
 * lock that thread needs; that wait is not detected and never ends.
 * Return: how many tasks were handed back (>= 0); 0 if already stopped;
 * TW_EDEADLK (nothing done) when called from the service's own threads as
 * above; TW_EINVAL for a NULL @s.
 */
TW_EXTERN int tw_service_stop(tw_service *s, tw_unprocessed_fn fn, void *ctx);

/**
 * tw_service_destroy - stop the service if needed and free it.
 * @s: the service, or NULL (a no-op).
 *
 * Unprocessed tasks are dropped. No other call on @s may be running or
 * follow.
 *
 * Context: any thread except the service's own, as for tw_service_stop():
 * from a task of @s, from a caller-supplied executor's callback or from
 * stop's @fn it returns TW_EDEADLK and does nothing (@s stays as it was).
 * Return: 0 (@s is freed), or TW_EDEADLK as above.
 */
TW_EXTERN int tw_service_destroy(tw_service *s);

/**
 * tw_service_run - run a job that a caller-supplied executor received.
 * @s: the service (with tw_service_config.execute).
 * @job: the job, as the executor received it.
 *
 * Must be called once per job, even after tw_service_stop() was called
 * (stop waits for it). A job is accepted only once (a compare-and-swap): a
 * repeated or concurrent call for the same job, a stale job (its task ran,
 * or was cancelled, and its record may be reused) and a forged id are
 * ignored, so a task never runs twice for one dispatch. A periodic task
 * keeps its id for every run: a late repeated call that arrives after the
 * next run was dispatched counts as the call for that run (which still
 * runs once). On a service without a caller-supplied executor every call
 * is ignored: the built-in executor pool hands out no jobs.
 *
 * Context: any thread.
 */
TW_EXTERN void tw_service_run(tw_service *s, tw_id job);

/**
 * tw_service_get_stats_sized - the service's counters, for a struct of
 * any version.
 * @s: the service.
 * @out: filled with the counters.
 * @out_size: bytes at @out: sizeof(tw_service_stats) as the caller's
 *            header declares it. A caller built against an older header
 *            (a shorter struct) gets its fields and nothing past them;
 *            bytes past the struct this library knows are zeroed.
 *
 * The plain name tw_service_get_stats() is a macro that passes this
 * header's sizeof. Cost of the counters: one clock read per run (none for
 * the first task the timer thread runs after it read the clock, none on
 * the timer thread with TW_SERVICE_LAZY_CLOCK) and one relaxed atomic
 * add; BENCHMARKS.md has the measurement.
 *
 * Context: any thread.
 * Return: 0, or TW_EINVAL (NULL @s or @out, @out_size shorter than the
 * 0.1 struct, offsetof(tw_service_stats, backlog)) with nothing written.
 */
TW_EXTERN int tw_service_get_stats_sized(const tw_service *s,
                                         tw_service_stats *out,
                                         size_t out_size);

/**
 * tw_service_get_stats - the 0.1 entry point of the counters.
 * @s: the service; NULL does nothing.
 * @out: filled with the fields up to memory_bytes (the 0.1 struct);
 *       NULL does nothing.
 *
 * Kept for callers built against a 0.1 header. The plain name is the macro
 * below, which reaches every field through tw_service_get_stats_sized().
 *
 * Context: any thread.
 */
TW_EXTERN void tw_service_get_stats(const tw_service *s, tw_service_stats *out);
#define tw_service_get_stats(s, out)                                           \
    tw_service_get_stats_sized((s), (out), sizeof(tw_service_stats))

#ifdef __cplusplus
}
#endif
#endif /* TWHEEL_SERVICE_H */
