/* SPDX-License-Identifier: MIT */
/*
 * examples/order_timeout.c - cancel orders that are not paid within N
 * seconds, and keep that promise across a restart.
 *
 * Every new order schedules a durable timer keyed by its id; paying the
 * order cancels the timer; a timer that fires cancels the order. The store
 * lives in a directory, so orders created before a crash or a restart are
 * still cancelled on time afterwards (or at once, if their time passed
 * while the program was down). Delivery is at least once: the callback
 * must tolerate a repeat, as cancelling an already cancelled order does.
 *
 * Usage:
 *   order_timeout --dir DIR new ID [SECONDS]   create an unpaid order
 *   order_timeout --dir DIR pay ID             pay it (cancel its timer)
 *   order_timeout --dir DIR run SECONDS        cancel what times out
 *   order_timeout --demo                       a self-checking run with a
 *                                              restart in the middle
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <twheel/durable.h>

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* The "database": which orders were cancelled by their timer. */
#define MAX_ORDERS 64
static int cancelled[MAX_ORDERS];

static int on_timeout(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    char id[32] = {0};
    memcpy(id, t->key, t->key_len < sizeof id - 1 ? t->key_len : sizeof id - 1);
    printf("order %s cancelled: unpaid %lld ms after its deadline "
           "(attempt %u, note \"%.*s\")\n",
           id, (long long)(now_ms() - t->due_ms), t->attempt,
           (int)t->payload_len, (const char *)t->payload);
    int n = atoi(id);
    if (n >= 0 && n < MAX_ORDERS)
        cancelled[n]++;
    fflush(stdout);
    return 0; /* done: never delivered again */
}

static int open_store(tw_durable **d, const char *dir)
{
    tw_durable_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.dir = dir;
    cfg.fire = on_timeout;
    char err[256] = "";
    cfg.errbuf = err;
    cfg.errbuf_len = sizeof err;
    int rc = tw_durable_open(d, &cfg);
    if (rc)
        fprintf(stderr, "open %s: %s: %s\n", dir, tw_strerror(rc), err);
    return rc;
}

static int new_order(tw_durable *d, const char *id, int64_t timeout_ms)
{
    char note[64];
    int n = snprintf(note, sizeof note, "created at %lld", (long long)now_ms());
    return tw_durable_schedule(d, id, strlen(id), now_ms() + timeout_ms, note,
                               (size_t)n);
}

static int demo(void)
{
    char dir[] = "/tmp/order_timeout_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    tw_durable *d;
    if (open_store(&d, dir))
        return 1;
    /* Orders 1..6 with a 300 ms deadline; 2 and 5 are paid in time. */
    for (int i = 1; i <= 6; i++) {
        char id[8];
        snprintf(id, sizeof id, "%d", i);
        if (new_order(d, id, 300) != 0)
            return 1;
    }
    if (tw_durable_cancel(d, "2", 1) != 0 || tw_durable_cancel(d, "5", 1) != 0)
        return 1;
    printf("6 orders, 2 and 5 paid; restarting before any deadline\n");
    tw_durable_close(d); /* as if the process went down */
    sleep_ms(500);       /* and stayed down past the deadlines */
    if (open_store(&d, dir))
        return 1;
    tw_durable_stats st;
    tw_durable_stats_get(d, &st);
    printf("reopened: %llu pending orders recovered\n",
           (unsigned long long)st.recovered);
    for (int waited = 0; waited < 10000; waited += 10) {
        tw_durable_stats_get(d, &st);
        if (st.pending == 0)
            break;
        sleep_ms(10);
    }
    tw_durable_close(d);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        return 1;
    bool ok = st.recovered == 4 && st.pending == 0;
    for (int i = 1; i <= 6; i++)
        ok &= cancelled[i] == (i == 2 || i == 5 ? 0 : 1);
    printf("%s\n", ok ? "ok: every unpaid order cancelled once, paid ones "
                        "kept"
                      : "FAILED");
    return ok ? 0 : 1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: order_timeout --dir DIR new ID [SECONDS]\n"
               "       order_timeout --dir DIR pay ID\n"
               "       order_timeout --dir DIR run SECONDS\n"
               "       order_timeout --demo\n");
}

int main(int argc, char **argv)
{
    if (argc == 2 && strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return 0;
    }
    if (argc == 2 && strcmp(argv[1], "--demo") == 0)
        return demo();
    if (argc < 4 || strcmp(argv[1], "--dir") != 0) {
        usage(stderr);
        return 2;
    }
    tw_durable *d;
    if (open_store(&d, argv[2]))
        return 1;
    const char *cmd = argv[3];
    int rc = 0;
    if (strcmp(cmd, "new") == 0 && argc >= 5) {
        int64_t secs = argc >= 6 ? atoll(argv[5]) : 30;
        rc = new_order(d, argv[4], secs * 1000);
    } else if (strcmp(cmd, "pay") == 0 && argc >= 5) {
        rc = tw_durable_cancel(d, argv[4], strlen(argv[4]));
        if (rc == TW_ENOENT)
            fprintf(stderr,
                    "order %s: no unpaid order (already paid or "
                    "cancelled)\n",
                    argv[4]);
    } else if (strcmp(cmd, "run") == 0 && argc >= 5) {
        sleep_ms(atol(argv[4]) * 1000);
    } else {
        usage(stderr);
        rc = 2;
    }
    if (rc < 0)
        fprintf(stderr, "%s: %s\n", cmd, tw_strerror(rc));
    tw_durable_close(d);
    return rc == 0 ? 0 : 1;
}
