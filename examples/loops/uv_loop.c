/* SPDX-License-Identifier: MIT */
/*
 * uv_loop - a wheel of per-connection idle timers driven by libuv: one
 * uv_timer_t armed for the wheel's next expiry, the wheel advanced on each
 * wake-up, the uv_timer_t re-armed. Ticks are uv_now() milliseconds. The
 * first timer to fire stands for activity on the last connection and moves
 * its timer later. Exit 0 if every timer fired once and never early.
 * Build: cc uv_loop.c $(pkg-config --cflags --libs twheel libuv)
 */
#define _GNU_SOURCE /* uv.h needs the POSIX thread types */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <twheel/wheel.h>
#include <uv.h>

struct conn {
    tw_timer idle;
    uint64_t deadline; /* the tick its idle timer was last armed for */
    int fired;
};

static tw_wheel *wheel;
static uv_timer_t wake;
static struct conn *conns;
static unsigned nconns, wakeups, errors;

static void on_idle(tw_timer *t, void *arg)
{
    struct conn *c = TW_CONTAINER_OF(t, struct conn, idle);
    uint64_t now = uv_now(arg);

    errors += c->fired++ > 0 || now < c->deadline;
    printf("conn %td idle at tick %llu (deadline %llu)\n", c - conns,
           (unsigned long long)now, (unsigned long long)c->deadline);
    if (c == &conns[0] && nconns > 1) { /* activity: push the last one back */
        conns[nconns - 1].deadline += 50;
        tw_wheel_add(wheel, &conns[nconns - 1].idle,
                     conns[nconns - 1].deadline);
    }
}

/* The loop's one timer waits for the wheel's next expiry, or not at all. */
static void on_wake(uv_timer_t *h);
static void arm(uv_loop_t *loop)
{
    uint64_t next = tw_wheel_next_expiry(wheel), now = uv_now(loop);

    if (next == UINT64_MAX) /* nothing pending: no handle left, run ends */
        uv_timer_stop(&wake);
    else
        uv_timer_start(&wake, on_wake, next > now ? next - now : 0, 0);
}

static void on_wake(uv_timer_t *h)
{
    wakeups++;
    tw_wheel_advance(wheel, uv_now(h->loop));
    arm(h->loop);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"conns", required_argument, 0, 'n'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    uv_loop_t *loop = uv_default_loop();
    int c;

    nconns = 5;
    while ((c = getopt_long(argc, argv, "hn:", opts, NULL)) != -1) {
        if (c == 'n' && (nconns = (unsigned)atoi(optarg)) > 0 && nconns < 1000)
            continue;
        fprintf(c == 'h' ? stdout : stderr,
                "usage: uv_loop [--conns N]\n"
                "  N connections (1..999, default 5) idle out 20 ms apart\n");
        return c == 'h' ? 0 : 2;
    }
    conns = calloc(nconns, sizeof *conns);
    if (conns == NULL || tw_wheel_create(&wheel, NULL, uv_now(loop)) != 0)
        return 1;
    for (unsigned i = 0; i < nconns; i++) {
        conns[i].deadline = uv_now(loop) + 20 * (i + 1);
        tw_timer_init(&conns[i].idle, on_idle, loop);
        tw_wheel_add(wheel, &conns[i].idle, conns[i].deadline);
    }
    uv_timer_init(loop, &wake);
    arm(loop);
    uv_run(loop, UV_RUN_DEFAULT);
    for (unsigned i = 0; i < nconns; i++)
        errors += conns[i].fired != 1;
    printf("%u timers, %u wake-ups, %u errors\n", nconns, wakeups, errors);
    uv_close((uv_handle_t *)&wake, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    uv_loop_close(loop);
    tw_wheel_destroy(wheel);
    free(conns);
    return errors ? 1 : 0;
}
