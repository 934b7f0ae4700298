/* SPDX-License-Identifier: MIT */
/* hello_durable - keyed timers in a journal directory survive a restart. */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <twheel/durable.h>

static atomic_int fired;

static int on_due(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d, (void)arg;
    printf("due: %.*s (%.*s), attempt %u\n", (int)t->key_len,
           (const char *)t->key, (int)t->payload_len, (const char *)t->payload,
           (unsigned)t->attempt);
    atomic_fetch_add(&fired, 1);
    return 0; /* done; n > 0 would deliver it again in n ms */
}

/* Open, or say why not: the code, and the message in cfg->errbuf. */
static int open_store(tw_durable **d, const tw_durable_config *cfg)
{
    int rc = tw_durable_open(d, cfg);
    if (rc != 0)
        fprintf(stderr, "hello_durable: %s: %s: %s\n", cfg->dir,
                tw_strerror(rc), cfg->errbuf);
    return rc;
}

int main(int argc, char **argv)
{
    tw_durable *d;
    char why[256]; /* errbuf_len says how many bytes errbuf holds */
    tw_durable_config cfg = {
        .fire = on_due, .errbuf = why, .errbuf_len = sizeof why};
    struct timespec ts;

    if (argc != 2 || strcmp(argv[1], "--help") == 0) {
        puts("usage: hello_durable DIR (a journal directory, made if absent)");
        return argc == 2 ? 0 : 2;
    }
    cfg.dir = argv[1];
    clock_gettime(CLOCK_REALTIME, &ts); /* due times are Unix ms */
    int64_t due = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + 300;
    if (open_store(&d, &cfg) != 0)
        return 1;
    /* Each call returns once its record is on disk (fdatasync). */
    tw_durable_schedule(d, "order-1", 7, due, "unpaid", 6);
    tw_durable_schedule(d, "order-2", 7, due, "paid", 4);
    tw_durable_cancel(d, "order-2", 7); /* TW_ENOENT if not pending */
    tw_durable_close(d);                /* order-1 stays pending on disk */
    if (open_store(&d, &cfg) != 0)      /* a restart replays the journal */
        return 1;
    while (atomic_load(&fired) < 1)
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    return tw_durable_close(d) == 0 ? 0 : 1;
}
