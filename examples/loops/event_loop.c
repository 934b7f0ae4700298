/* SPDX-License-Identifier: MIT */
/*
 * event_loop - a wheel of per-connection idle timers driven by libevent:
 * one timer event armed for the wheel's next expiry, the wheel advanced on
 * each wake-up, the event re-armed. Ticks are CLOCK_MONOTONIC milliseconds,
 * rounded down, so a tick has fully begun when the wheel reaches it. The
 * first timer to fire stands for activity on the last connection and moves
 * its timer later. Exit 0 if every timer fired once and never early.
 * Build: cc event_loop.c $(pkg-config --cflags --libs twheel libevent)
 */
#define _GNU_SOURCE
#include <event2/event.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <twheel/wheel.h>

struct conn {
    tw_timer idle;
    uint64_t deadline; /* the tick its idle timer was last armed for */
    int fired;
};

static tw_wheel *wheel;
static struct event *wake;
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

/* The loop's one timer waits for the wheel's next expiry, or not at all. */
static void arm(void)
{
    uint64_t next = tw_wheel_next_expiry(wheel), now = now_ms();
    uint64_t ms = next > now ? next - now : 0;
    struct timeval tv = {(time_t)(ms / 1000), (suseconds_t)(ms % 1000 * 1000)};

    if (next == UINT64_MAX) /* nothing pending: no event left, loop ends */
        return;
    /* libevent counts from its cached time, taken before our callbacks ran:
     * refresh it so that the event does not fire before tick @next. */
    event_base_update_cache_time(event_get_base(wake));
    evtimer_add(wake, &tv);
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)fd, (void)what, (void)arg;
    wakeups++;
    tw_wheel_advance(wheel, now_ms());
    arm();
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"conns", required_argument, 0, 'n'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    struct event_base *base;
    int c;

    nconns = 5;
    while ((c = getopt_long(argc, argv, "hn:", opts, NULL)) != -1) {
        if (c == 'n' && (nconns = (unsigned)atoi(optarg)) > 0 && nconns < 1000)
            continue;
        fprintf(c == 'h' ? stdout : stderr,
                "usage: event_loop [--conns N]\n"
                "  N connections (1..999, default 5) idle out 20 ms apart\n");
        return c == 'h' ? 0 : 2;
    }
    conns = calloc(nconns, sizeof *conns);
    base = event_base_new();
    if (conns == NULL || base == NULL ||
        (wake = evtimer_new(base, on_wake, NULL)) == NULL ||
        tw_wheel_create(&wheel, NULL, now_ms()) != 0)
        return 1;
    for (unsigned i = 0; i < nconns; i++) {
        conns[i].deadline = tw_wheel_now(wheel) + 20 * (i + 1);
        tw_timer_init(&conns[i].idle, on_idle, NULL);
        tw_wheel_add(wheel, &conns[i].idle, conns[i].deadline);
    }
    arm();
    event_base_dispatch(base);
    for (unsigned i = 0; i < nconns; i++)
        errors += conns[i].fired != 1;
    printf("%u timers, %u wake-ups, %u errors\n", nconns, wakeups, errors);
    event_free(wake);
    event_base_free(base);
    tw_wheel_destroy(wheel);
    free(conns);
    return errors ? 1 : 0;
}
