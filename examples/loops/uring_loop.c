/* SPDX-License-Identifier: MIT */
/*
 * uring_loop - a wheel of per-connection idle timers driven by io_uring:
 * each turn submits one timeout operation for the wheel's next expiry as
 * an absolute CLOCK_MONOTONIC time (IORING_TIMEOUT_ABS), waits for its
 * completion, advances the wheel. Ticks are CLOCK_MONOTONIC milliseconds,
 * rounded down. The first timer to fire stands for activity on the last
 * connection and moves its timer later. Exit 0 if every timer fired once
 * and never early; 77 if the kernel does not allow io_uring.
 * Build: cc uring_loop.c $(pkg-config --cflags --libs twheel liburing)
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <twheel/wheel.h>

struct conn {
    tw_timer idle;
    uint64_t deadline; /* the tick its idle timer was last armed for */
    int fired;
};

static tw_wheel *wheel;
static struct conn *conns;
static unsigned nconns, wakeups, errors;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void on_idle(tw_timer *t, void *arg)
{
    struct conn *c = TW_CONTAINER_OF(t, struct conn, idle);
    uint64_t now = now_ms();

    (void)arg;
    errors += c->fired++ > 0 || now < c->deadline;
    printf("conn %td idle at tick %llu (deadline %llu)\n", c - conns,
           (unsigned long long)now, (unsigned long long)c->deadline);
    if (c == &conns[0] && nconns > 1) { /* activity: push the last one back */
        conns[nconns - 1].deadline += 50;
        tw_wheel_add(wheel, &conns[nconns - 1].idle,
                     conns[nconns - 1].deadline);
    }
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"conns", required_argument, 0, 'n'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    struct io_uring ring;
    int c, rc;

    nconns = 5;
    while ((c = getopt_long(argc, argv, "hn:", opts, NULL)) != -1) {
        if (c == 'n' && (nconns = (unsigned)atoi(optarg)) > 0 && nconns < 1000)
            continue;
        fprintf(c == 'h' ? stdout : stderr,
                "usage: uring_loop [--conns N]\n"
                "  N connections (1..999, default 5) idle out 20 ms apart\n");
        return c == 'h' ? 0 : 2;
    }
    if ((rc = io_uring_queue_init(4, &ring, 0)) < 0) {
        printf("io_uring not available here: %s\n", strerror(-rc));
        return 77;
    }
    conns = calloc(nconns, sizeof *conns);
    if (conns == NULL || tw_wheel_create(&wheel, NULL, now_ms()) != 0)
        return 1;
    for (unsigned i = 0; i < nconns; i++) {
        conns[i].deadline = tw_wheel_now(wheel) + 20 * (i + 1);
        tw_timer_init(&conns[i].idle, on_idle, NULL);
        tw_wheel_add(wheel, &conns[i].idle, conns[i].deadline);
    }
    /* A server would also have its socket reads in the ring; this loop
     * ends when no timer is left (next expiry UINT64_MAX: nothing to wait
     * for). */
    while (tw_wheel_count(wheel) > 0) {
        uint64_t next = tw_wheel_next_expiry(wheel);
        struct __kernel_timespec ts = {(long long)(next / 1000),
                                       (long long)(next % 1000 * 1000000)};
        struct io_uring_cqe *cqe;

        io_uring_prep_timeout(io_uring_get_sqe(&ring), &ts, 0,
                              IORING_TIMEOUT_ABS);
        io_uring_submit(&ring);
        if (io_uring_wait_cqe(&ring, &cqe) == 0) { /* res -ETIME: expired */
            io_uring_cqe_seen(&ring, cqe);
            wakeups++;
            tw_wheel_advance(wheel, now_ms());
        }
    }
    for (unsigned i = 0; i < nconns; i++)
        errors += conns[i].fired != 1;
    printf("%u timers, %u wake-ups, %u errors\n", nconns, wakeups, errors);
    io_uring_queue_exit(&ring);
    tw_wheel_destroy(wheel);
    free(conns);
    return errors ? 1 : 0;
}
