/* SPDX-License-Identifier: MIT */
/*
 * bench/service_pair_instr.c - the instructions a producer runs per
 * tw_schedule() + tw_cancel() pair, counted by callgrind. Not built by
 * CMake (it needs valgrind's header); against a Release libtwheel.a:
 *
 *   gcc -O2 -Iinclude -Isrc bench/service_pair_instr.c \
 *       build/rel/libtwheel.a -lpthread -o pair_instr
 *   FORCE_TSC=1 valgrind --tool=callgrind --instr-atstart=no \
 *       --separate-threads=yes ./pair_instr 20000
 *   callgrind_annotate callgrind.out.PID-01   (the producer's thread)
 *
 * Per pair: (the thread's total - pair_instr.c:main's own) / N.
 *
 * One service; 200,000 tasks scheduled and cancelled first, so that the
 * producer exists, its function is known and the free list holds more
 * records than the measured pairs take (under valgrind the timer thread
 * runs seldom, and a producer that runs out takes never-used records,
 * another path). Then N pairs between CALLGRIND_START/STOP_INSTRUMENTATION.
 * valgrind's CPU has no invariant TSC, so the service would read the clock
 * through tw__tsc_refresh() on every call, which a native run does not:
 * FORCE_TSC=1 marks the estimate usable and sets its anchor by hand
 * before the service is created (the rate is made up, which moves
 * deadlines, not the path), so that the native path is counted.
 */
#define _POSIX_C_SOURCE 200809L

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <valgrind/callgrind.h>

#include "service_clock.h"
#include "twheel/service.h"

#define WARM 200000

static void nop(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
}

static tw_id warm_ids[WARM];

int main(int argc, char **argv)
{
    long n = argc > 1 ? atol(argv[1]) : 20000;
    if (getenv("FORCE_TSC") != NULL) { /* before the service reads it */
        struct tw__tsc *c = tw__tsc_mono();
        c->usable = true;
        atomic_store(&c->tsc0, __rdtsc());
        atomic_store(&c->mono0, tw__clock_ns(CLOCK_MONOTONIC));
        atomic_store(&c->mult, UINT64_C(1) << 31);
        atomic_store(&c->limit, UINT64_MAX);
    }
    tw_service *s;
    if (tw_service_create(&s, NULL) != 0 || tw_service_start(s) != 0)
        abort();
    /* Delays of 100 s: the warm-up runs for seconds under valgrind. */
    for (long i = 0; i < WARM; i++)
        if (tw_schedule(s, nop, NULL, 100000000000u + (uint64_t)i * 1000,
                        &warm_ids[i]) != 0)
            abort();
    for (long i = 0; i < WARM; i++)
        if (!tw_cancel(s, warm_ids[i]))
            abort();
    for (;;) { /* until the timer thread has freed them all */
        tw_service_stats st;
        tw_service_get_stats(s, &st);
        if (st.cancelled >= WARM)
            break;
        struct timespec ts = {0, 10000000};
        nanosleep(&ts, NULL);
    }
    tw_id id;
    /* The producer's ring starts at 1,024 slots and doubles each time it
     * was found full, once the timer thread has emptied it: rounds of
     * pairs, each more than the largest ring holds, with pauses for the
     * timer thread, grow it to its largest, so that the measured pairs fit
     * in it (native runs get there within a few ticks). */
    for (int round = 0; round < 8; round++) {
        for (long i = 0; i < 70000; i++)
            if (tw_schedule(s, nop, NULL, 1000000000u, &id) != 0 ||
                !tw_cancel(s, id))
                abort();
        struct timespec ts = {0, 100000000};
        nanosleep(&ts, NULL);
    }
    CALLGRIND_START_INSTRUMENTATION;
    for (long i = 0; i < n; i++)
        if (tw_schedule(s, nop, NULL, 1000000000u + (uint64_t)i * 1000, &id) !=
                0 ||
            !tw_cancel(s, id))
            abort();
    CALLGRIND_STOP_INSTRUMENTATION;
    tw_service_stop(s, NULL, NULL);
    tw_service_destroy(s);
    printf("%ld pairs\n", n);
    return 0;
}
