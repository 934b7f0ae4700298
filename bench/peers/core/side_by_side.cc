/* SPDX-License-Identifier: MIT */
/*
 * bench/peers/core/side_by_side.cc - twheel's core wheel beside jsnell/ratas
 * and wahern/timeout in one process, engines interleaved rep by rep (one
 * warm-up, then REPS reps, median), loop bounds and index arrays in locals
 * for every engine. Not built by CMake: the peers' sources are fetched
 * outside the tree (never committed) and compiled with it:
 *
 *   P=/path/with/timer-wheel.h,timeout.c,timeout.h,timeout-bitops.c,...
 *   gcc -O3 -DNDEBUG -c $P/timeout.c -o timeout.o
 *   gcc -O3 -DNDEBUG -Iinclude -c src/wheel.c -o wheel.o
 *   g++ -O3 -DNDEBUG -std=c++17 -Iinclude -I$P -w \
 *       bench/peers/core/side_by_side.cc wheel.o timeout.o -o drv
 *   taskset -c 1 ./drv N REPS all|twheel,ratas,wahern,twinl WORKLOADS
 *
 * The engines' order rotates by one from rep to rep.
 *
 * twinl is twheel with tw_wheel_cancel_inline() in the two cancel
 * workloads (the same as twheel in the others); twunc is twheel with
 * tw_wheel_add_unchecked() in the two add workloads (and runs only
 * those); "all" runs both.
 *
 * Instructions of the timed loops alone: build with -DTW_CALLGRIND (each
 * clock read toggles callgrind's collection) and run REPS = 0 (the warm-up
 * only) under
 *   valgrind --tool=callgrind --collect-atstart=no ./drv N 0 ENGINE WORKLOAD
 * whose total divided by N is instructions per operation.
 *
 * WORKLOADS: any of add,add_rand,cancel,cancel_rand,expire_1,expire_jump
 * (or all); expire_jump is one advance past every deadline (ratas's
 * advance(2^20), which steps through the ticks inside).
 * Deadlines uniform in [1, 2^20] ticks, one fixed seed and permutation;
 * prints ns per operation (per expired timer for expire_1).
 */
// usage: drv N REPS engines(all|a,b) workloads
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <new>
#include <vector>
#include <algorithm>
#include <string>
extern "C" {
#include "twheel/wheel.h"
#include "timeout.h"
}
#include "timer-wheel.h"
/* Against a wheel.c from before tw_wheel_cancel_inline(): twinl is then
 * the same as twheel. */
#ifdef TW_NO_CANCEL_INLINE
#define tw_wheel_cancel_inline tw_wheel_cancel
#endif
#ifdef TW_CALLGRIND
#include <valgrind/callgrind.h>
#define MARK() CALLGRIND_TOGGLE_COLLECT
#else
#define MARK() ((void)0)
#endif

static const uint64_t DL_MAX = 1u << 20;
static uint64_t rng = 0x12345678abcdefULL;
static uint64_t rnd() { rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17; return rng; }
static double now_ns() { MARK(); timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec * 1e9 + ts.tv_nsec; }

static size_t N;
static uint32_t *g_dl, *g_perm, *g_dlp;
static size_t fired;
static volatile int sink;

enum { ADD, ADD_RAND, CANCEL, CANCEL_RAND, EXP1, EXPJ, NWL };
static const char *wl_names[] = {"add", "add_rand", "cancel", "cancel_rand", "expire_1", "expire_jump"};

// ---- twheel
static void tw_cb(tw_timer *t, void *a) { (void)t; (void)a; fired++; }
template <bool INL, bool UNC = false> static double run_tw_t(int wl) {
    const size_t n = N; const uint32_t *const dl = g_dl, *const perm = g_perm, *const dlp = g_dlp;
    const uint64_t base = 1000;
    tw_timer *t = (tw_timer *)aligned_alloc(64, ((n * sizeof(tw_timer)) + 63) / 64 * 64);
    for (size_t i = 0; i < n; i++) tw_timer_init(&t[i], tw_cb, NULL);
    tw_wheel *w; tw_wheel_create(&w, NULL, base);
    double t0 = 0, t1 = 0; fired = 0;
    if (wl == ADD && UNC) { t0 = now_ns(); for (size_t i = 0; i < n; i++) tw_wheel_add_unchecked(w, &t[i], base + dl[i]); t1 = now_ns(); }
    else if (wl == ADD_RAND && UNC) { t0 = now_ns(); for (size_t k = 0; k < n; k++) tw_wheel_add_unchecked(w, &t[perm[k]], base + dlp[k]); t1 = now_ns(); }
    else if (wl == ADD) { t0 = now_ns(); for (size_t i = 0; i < n; i++) tw_wheel_add(w, &t[i], base + dl[i]); t1 = now_ns(); }
    else if (wl == ADD_RAND) { t0 = now_ns(); for (size_t k = 0; k < n; k++) tw_wheel_add(w, &t[perm[k]], base + dlp[k]); t1 = now_ns(); }
    else {
        for (size_t i = 0; i < n; i++) tw_wheel_add(w, &t[i], base + dl[i]);
        if (wl == CANCEL && INL) { t0 = now_ns(); for (size_t i = 0; i < n; i++) tw_wheel_cancel_inline(w, &t[i]); t1 = now_ns(); }
        else if (wl == CANCEL_RAND && INL) { t0 = now_ns(); for (size_t k = 0; k < n; k++) tw_wheel_cancel_inline(w, &t[perm[k]]); t1 = now_ns(); }
        else if (wl == CANCEL) { t0 = now_ns(); for (size_t i = 0; i < n; i++) tw_wheel_cancel(w, &t[i]); t1 = now_ns(); }
        else if (wl == CANCEL_RAND) { t0 = now_ns(); for (size_t k = 0; k < n; k++) tw_wheel_cancel(w, &t[perm[k]]); t1 = now_ns(); }
        else if (wl == EXPJ) { t0 = now_ns(); tw_wheel_advance(w, base + DL_MAX); t1 = now_ns();
            if (fired != n) { fprintf(stderr, "twheel fired %zu\n", fired); exit(1); } }
        else { t0 = now_ns(); for (uint64_t x = base + 1; x <= base + DL_MAX; x++) tw_wheel_advance(w, x); t1 = now_ns();
            if (fired != n) { fprintf(stderr, "twheel fired %zu\n", fired); exit(1); } }
    }
    tw_wheel_destroy(w); free(t);
    return (t1 - t0) / n;
}

// ---- ratas
struct RCB { void operator()() { fired++; } };
typedef TimerEvent<RCB> REv;
static double run_ratas(int wl) {
    const size_t n = N; const uint32_t *const dl = g_dl, *const perm = g_perm, *const dlp = g_dlp;
    REv *t = (REv *)aligned_alloc(64, ((n * sizeof(REv)) + 63) / 64 * 64);
    for (size_t i = 0; i < n; i++) new (&t[i]) REv(RCB());
    TimerWheel *w = new TimerWheel(0);
    double t0 = 0, t1 = 0; fired = 0;
    if (wl == ADD) { t0 = now_ns(); for (size_t i = 0; i < n; i++) w->schedule(&t[i], dl[i]); t1 = now_ns(); }
    else if (wl == ADD_RAND) { t0 = now_ns(); for (size_t k = 0; k < n; k++) w->schedule(&t[perm[k]], dlp[k]); t1 = now_ns(); }
    else {
        for (size_t i = 0; i < n; i++) w->schedule(&t[i], dl[i]);
        if (wl == CANCEL) { t0 = now_ns(); for (size_t i = 0; i < n; i++) t[i].cancel(); t1 = now_ns(); }
        else if (wl == CANCEL_RAND) { t0 = now_ns(); for (size_t k = 0; k < n; k++) t[perm[k]].cancel(); t1 = now_ns(); }
        else if (wl == EXPJ) { t0 = now_ns(); w->advance(DL_MAX); t1 = now_ns();
            if (fired != n) { fprintf(stderr, "ratas fired %zu\n", fired); exit(1); } }
        else { t0 = now_ns(); for (uint64_t x = 1; x <= DL_MAX; x++) w->advance(1); t1 = now_ns();
            if (fired != n) { fprintf(stderr, "ratas fired %zu\n", fired); exit(1); } }
    }
    for (size_t i = 0; i < n; i++) t[i].cancel();
    delete w;
    for (size_t i = 0; i < n; i++) t[i].~REv();
    free(t);
    return (t1 - t0) / n;
}

// ---- wahern
static double run_wahern(int wl) {
    const size_t n = N; const uint32_t *const dl = g_dl, *const perm = g_perm, *const dlp = g_dlp;
    const uint64_t base = 1000;
    struct timeout *t = (struct timeout *)aligned_alloc(64, ((n * sizeof(struct timeout)) + 63) / 64 * 64);
    for (size_t i = 0; i < n; i++) timeout_init(&t[i], TIMEOUT_ABS);
    int err; struct timeouts *T = timeouts_open(0, &err); timeouts_update(T, base);
    double t0 = 0, t1 = 0; fired = 0;
    if (wl == ADD) { t0 = now_ns(); for (size_t i = 0; i < n; i++) timeouts_add(T, &t[i], base + dl[i]); t1 = now_ns(); }
    else if (wl == ADD_RAND) { t0 = now_ns(); for (size_t k = 0; k < n; k++) timeouts_add(T, &t[perm[k]], base + dlp[k]); t1 = now_ns(); }
    else {
        for (size_t i = 0; i < n; i++) timeouts_add(T, &t[i], base + dl[i]);
        if (wl == CANCEL) { t0 = now_ns(); for (size_t i = 0; i < n; i++) timeouts_del(T, &t[i]); t1 = now_ns(); }
        else if (wl == CANCEL_RAND) { t0 = now_ns(); for (size_t k = 0; k < n; k++) timeouts_del(T, &t[perm[k]]); t1 = now_ns(); }
        else if (wl == EXPJ) { t0 = now_ns(); timeouts_update(T, base + DL_MAX); while (timeouts_get(T)) fired++; t1 = now_ns();
            if (fired != n) { fprintf(stderr, "wahern fired %zu\n", fired); exit(1); } }
        else { t0 = now_ns(); for (uint64_t x = base + 1; x <= base + DL_MAX; x++) { timeouts_update(T, x); while (timeouts_get(T)) fired++; } t1 = now_ns();
            if (fired != n) { fprintf(stderr, "wahern fired %zu\n", fired); exit(1); } }
    }
    timeouts_close(T); free(t);
    return (t1 - t0) / n;
}

struct Eng { const char *name; double (*run)(int); };
static double run_tw(int wl) { return run_tw_t<false>(wl); }
static double run_tw_inl(int wl) { return run_tw_t<true>(wl); }
static double run_tw_unc(int wl) { return run_tw_t<false, true>(wl); }
static Eng engs[] = {{"twheel", run_tw}, {"ratas", run_ratas}, {"wahern", run_wahern}, {"twinl", run_tw_inl}, {"twunc", run_tw_unc}};
enum { NENG = sizeof(engs) / sizeof(engs[0]) };

int main(int argc, char **argv) {
    if (argc < 5) { fprintf(stderr, "usage: drv N REPS engines workloads\n"); return 2; }
    N = strtoull(argv[1], 0, 10); int reps = atoi(argv[2]);
    std::string es = argv[3], ws = argv[4];
    g_dl = new uint32_t[N]; g_perm = new uint32_t[N]; g_dlp = new uint32_t[N];
    for (size_t i = 0; i < N; i++) { g_dl[i] = 1 + rnd() % DL_MAX; g_perm[i] = i; }
    for (size_t i = N - 1; i > 0; i--) { size_t j = rnd() % (i + 1); std::swap(g_perm[i], g_perm[j]); }
    for (size_t k = 0; k < N; k++) g_dlp[k] = g_dl[g_perm[k]];
    auto has = [](const std::string &list, const char *x) { if (list == "all") return true; std::string l = "," + list + ","; return l.find(std::string(",") + x + ",") != std::string::npos; };
    for (int wl = 0; wl < NWL; wl++) {
        if (!has(ws, wl_names[wl])) continue;
        std::vector<std::vector<double>> r(NENG);
        for (int rep = -1; rep < reps; rep++)
            for (int j = 0; j < NENG; j++) {
                /* Each rep starts one engine later, so that no engine
                 * always runs after the same one (whose memory it finds
                 * in the caches, or evicted). */
                int e = (j + rep + 1) % NENG;
                if (!has(es, engs[e].name)) continue;
                if (e == 4 && wl != ADD && wl != ADD_RAND) continue; /* twunc: adds only */
                double v = engs[e].run(wl);
                if (rep >= 0) r[e].push_back(v);
            }
        printf("%zu %-12s", N, wl_names[wl]);
        for (int e = 0; e < NENG; e++) {
            if (r[e].empty()) continue;
            std::sort(r[e].begin(), r[e].end());
            printf("  %s %.2f", engs[e].name, r[e][r[e].size() / 2]);
        }
        printf("\n"); fflush(stdout);
    }
    return 0;
}
