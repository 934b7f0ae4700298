/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_durable_query.c - what look-up and listing cost on the
 * journal, next to a schedule on the same store, and whether a listing
 * loop slows firing.
 *
 *   bench_durable_query [--timers N] [--dir DIR] [--sync group|none]
 *
 * 1. N timers (due an hour and more ahead, 32-byte payloads) are put in a
 *    store by tw_durable_schedule_many;
 * 2. 2,000 tw_durable_schedule() calls of new keys, one at a time;
 * 3. 20,000 tw_durable_get() calls of random keys (payload copied);
 * 4. the first tw_durable_list() (it builds the ordered index), then 200
 *    pages of 1,000 entries from random due times, then one
 *    tw_durable_scan() of every timer with its payload;
 * 5. 2,000 timers due one per ms (scheduled in one batch) fire, alone
 *    and then while another
 *    thread lists pages of 1,000 without pause: the callback measures how
 *    late each started (CLOCK_REALTIME, us) and the percentiles of both
 *    runs are printed side by side.
 * Per-call figures are medians and 99th percentiles of wall time.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <twheel/durable.h>

static uint64_t now_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int64_t wall_ms(void)
{
    return (int64_t)(now_ns(CLOCK_REALTIME) / 1000000u);
}

#define FIRE_N 2000
static _Atomic int64_t late_us[FIRE_N];
static atomic_int fired;

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    int64_t late = (int64_t)(now_ns(CLOCK_REALTIME) / 1000u) - t->due_ms * 1000;
    int i = atomic_fetch_add(&fired, 1);
    if (i < FIRE_N)
        atomic_store(&late_us[i], late);
    return 0;
}

static int count_one(void *arg, const tw_durable_scanned *t)
{
    *(long *)arg += t->payload_len == 32;
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, uint64_t *ns, size_t n)
{
    qsort(ns, n, sizeof *ns, cmp_u64);
    printf("%-34s median %8.2f us  p99 %8.2f us  (%zu calls)\n", what,
           ns[n / 2] / 1e3, ns[n * 99 / 100] / 1e3, n);
}

static tw_durable *store;
static atomic_int lister_stop;

static void *lister(void *arg)
{
    (void)arg;
    static tw_durable_entry e[1000];
    static char kb[1000 * 16 + TW_DURABLE_KEY_MAX];
    unsigned long pages = 0;
    while (!atomic_load(&lister_stop)) {
        tw_durable_cursor c = TW_DURABLE_CURSOR_INIT;
        while (!c.done && !atomic_load(&lister_stop)) {
            if (tw_durable_list(store, 0, INT64_MAX, &c, e, 1000, kb,
                                sizeof kb) < 0)
                abort();
            pages++;
        }
    }
    return (void *)(uintptr_t)pages;
}

static void fire_run(const char *name, bool with_lister)
{
    atomic_store(&fired, 0);
    pthread_t th;
    atomic_store(&lister_stop, 0);
    if (with_lister && pthread_create(&th, NULL, lister, NULL))
        abort();
    /* One batch (one fdatasync), due from 500 ms on, one per ms. */
    static tw_durable_item it[FIRE_N];
    static char keys[FIRE_N][16];
    int64_t t0 = wall_ms() + 500;
    for (int i = 0; i < FIRE_N; i++) {
        int kl = snprintf(keys[i], sizeof keys[i], "%s%05d", name, i);
        it[i] = (tw_durable_item){keys[i], (size_t)kl, t0 + i, NULL, 0, 0};
    }
    if (tw_durable_schedule_many(store, it, FIRE_N))
        abort();
    while (atomic_load(&fired) < FIRE_N)
        usleep(1000);
    uintptr_t pages = 0;
    if (with_lister) {
        atomic_store(&lister_stop, 1);
        void *r;
        pthread_join(th, &r);
        pages = (uintptr_t)r;
    }
    static int64_t l[FIRE_N];
    for (int i = 0; i < FIRE_N; i++)
        l[i] = atomic_load(&late_us[i]);
    qsort(l, FIRE_N, sizeof *l, cmp_i64);
    printf("firing %-27s lateness p50 %6lld us  p99 %6lld us  max %6lld us"
           "  (%lu pages listed meanwhile)\n",
           with_lister ? "with a listing loop:" : "alone:",
           (long long)l[FIRE_N / 2], (long long)l[FIRE_N * 99 / 100],
           (long long)l[FIRE_N - 1], (unsigned long)pages);
}

int main(int argc, char **argv)
{
    long n = 100000;
    const char *dir = NULL;
    uint32_t sync = TW_DURABLE_SYNC_GROUP;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--timers"))
            n = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--dir"))
            dir = argv[i + 1];
        else if (!strcmp(argv[i], "--sync"))
            sync = !strcmp(argv[i + 1], "none") ? TW_DURABLE_SYNC_NONE
                                                : TW_DURABLE_SYNC_GROUP;
    }
    if (argc > 1 && !strcmp(argv[1], "--help")) {
        puts("usage: bench_durable_query [--timers N] [--dir DIR] "
             "[--sync group|none]");
        return 0;
    }
    char tmpl[] = "/tmp/bench_dq.XXXXXX";
    if (!dir && !(dir = mkdtemp(tmpl)))
        return 1;
    tw_durable_config cfg = {.dir = dir, .fire = on_fire, .sync = sync};
    if (tw_durable_open(&store, &cfg))
        return 1;
    int64_t far = wall_ms() + 3600 * 1000;
    char pl[32];
    memset(pl, 'p', sizeof pl);
    enum { B = 1000 };
    static tw_durable_item it[B];
    static char keys[B][16];
    for (long i = 0; i < n; i += B) {
        size_t m = 0;
        for (long j = i; j < n && j < i + B; j++, m++) {
            int kl = snprintf(keys[m], sizeof keys[m], "k%08ld", j);
            it[m] = (tw_durable_item){keys[m], (size_t)kl, far + j,
                                      pl,      sizeof pl,  0};
        }
        if (tw_durable_schedule_many(store, it, m))
            return 1;
    }
    printf("journal in %s, %ld pending timers, sync %s\n", dir, n,
           sync == TW_DURABLE_SYNC_NONE ? "none" : "group");

    static uint64_t ns[20000];
    for (int i = 0; i < 2000; i++) {
        char k[32];
        int kl = snprintf(k, sizeof k, "new%06d", i);
        uint64_t a = now_ns(CLOCK_MONOTONIC);
        if (tw_durable_schedule(store, k, (size_t)kl, far + n + i, pl,
                                sizeof pl))
            return 1;
        ns[i] = now_ns(CLOCK_MONOTONIC) - a;
    }
    report("tw_durable_schedule", ns, 2000);

    srand(1);
    for (int i = 0; i < 20000; i++) {
        char k[16], buf[64];
        int kl = snprintf(k, sizeof k, "k%08ld", (long)rand() % n);
        tw_durable_info in;
        uint64_t a = now_ns(CLOCK_MONOTONIC);
        if (tw_durable_get(store, k, (size_t)kl, &in, buf, sizeof buf))
            return 1;
        ns[i] = now_ns(CLOCK_MONOTONIC) - a;
    }
    report("tw_durable_get", ns, 20000);

    static tw_durable_entry e[1000];
    static char kb[1000 * 16 + TW_DURABLE_KEY_MAX];
    tw_durable_cursor c = TW_DURABLE_CURSOR_INIT;
    uint64_t a = now_ns(CLOCK_MONOTONIC);
    if (tw_durable_list(store, 0, INT64_MAX, &c, e, 1000, kb, sizeof kb) !=
        1000)
        return 1;
    printf("%-34s %8.2f ms (builds the index of %ld timers)\n",
           "first tw_durable_list, 1,000", (now_ns(CLOCK_MONOTONIC) - a) / 1e6,
           n + 2000);
    for (int i = 0; i < 200; i++) {
        tw_durable_cursor r = TW_DURABLE_CURSOR_INIT;
        int64_t from = far + rand() % (n - 1000 > 0 ? n - 1000 : 1);
        a = now_ns(CLOCK_MONOTONIC);
        int got =
            tw_durable_list(store, from, INT64_MAX, &r, e, 1000, kb, sizeof kb);
        ns[i] = now_ns(CLOCK_MONOTONIC) - a;
        if (got != 1000)
            return 1;
    }
    report("tw_durable_list, page of 1,000", ns, 200);

    long scanned = 0;
    a = now_ns(CLOCK_MONOTONIC);
    long got = tw_durable_scan(store, count_one, &scanned);
    if (got != n + 2000 || scanned != got)
        return 1;
    printf("%-34s %8.2f ms (%ld timers with their payloads)\n",
           "tw_durable_scan, everything", (now_ns(CLOCK_MONOTONIC) - a) / 1e6,
           got);

    fire_run("a", false);
    fire_run("b", true);
    fire_run("c", false);
    fire_run("d", true);
    return tw_durable_close(store) ? 1 : 0;
}
