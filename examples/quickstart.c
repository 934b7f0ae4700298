/* SPDX-License-Identifier: MIT */
/* quickstart - echo stdin lines; say "idle" after 2 s without one. */
#define _POSIX_C_SOURCE 200809L
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <twheel/wheel.h>
#include <unistd.h>

#define TICK_NS 1000000u /* one tick = 1 ms of CLOCK_MONOTONIC */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void on_idle(tw_timer *t, void *arg)
{
    (void)t, (void)arg;
    puts("idle for 2 s");
}

int main(int argc, char **argv)
{
    tw_wheel *w;
    tw_timer idle;
    char line[256];

    if (argc > 1) /* --help: exit 0, anything else: 2 */
        return puts("usage: quickstart < input"),
               strcmp(argv[1], "--help") ? 2 : 0;
    if (tw_wheel_create(&w, NULL, now_ns() / TICK_NS) != 0)
        return 1;
    tw_timer_init(&idle, on_idle, NULL);
    tw_wheel_add(w, &idle, tw_wheel_now(w) + 2000);
    for (;;) {
        /* Sleep until the next expiry: tw_wheel_timeout() gives the ticks
         * (ms) from now, so poll never wakes early; -1: no timer pending. */
        uint64_t dt = tw_wheel_timeout(w, now_ns() / TICK_NS);
        int timeout = dt == TW_WHEEL_NO_TIMEOUT ? -1
                      : dt > INT_MAX            ? INT_MAX
                                                : (int)dt;
        struct pollfd pfd = {.fd = 0, .events = POLLIN};
        if (poll(&pfd, 1, timeout) > 0) {
            ssize_t n = read(0, line, sizeof line);
            if (n <= 0)
                break; /* end of input */
            printf("echo: %.*s", (int)n, line);
            tw_wheel_add(w, &idle, now_ns() / TICK_NS + 2000); /* re-arm */
        }
        tw_wheel_advance(w, now_ns() / TICK_NS);
    }
    tw_wheel_destroy(w);
    return 0;
}
