/* SPDX-License-Identifier: MIT */
/*
 * epoll_loop - a wheel of per-connection idle timers driven by epoll and
 * one timerfd. The timerfd is armed with the wheel's next expiry as an
 * absolute CLOCK_MONOTONIC time (TFD_TIMER_ABSTIME), so the loop never
 * drifts however late it runs; the wheel is advanced on each wake-up and
 * the timerfd re-armed. Ticks are CLOCK_MONOTONIC milliseconds, rounded
 * down. The first timer to fire stands for activity on the last connection
 * and moves its timer later. Exit 0 if every timer fired once, never early.
 * Build: cc epoll_loop.c $(pkg-config --cflags --libs twheel)
 */
#define _GNU_SOURCE
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <time.h>
#include <twheel/wheel.h>
#include <unistd.h>

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

/* Arm @tfd for the start of the wheel's next expiry tick, or disarm it. */
static void arm(int tfd)
{
    uint64_t next = tw_wheel_next_expiry(wheel);
    struct itimerspec its = {{0, 0}, {0, 0}}; /* all zero disarms */

    if (next != UINT64_MAX) {
        its.it_value.tv_sec = (time_t)(next / 1000);
        its.it_value.tv_nsec = (long)(next % 1000 * 1000000);
        its.it_value.tv_nsec += its.it_value.tv_sec == 0 &&
                                its.it_value.tv_nsec == 0; /* 0 disarms */
    }
    timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {{"conns", required_argument, 0, 'n'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    int c, ep = epoll_create1(EPOLL_CLOEXEC);
    int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    struct epoll_event ev = {.events = EPOLLIN, .data.fd = tfd};

    nconns = 5;
    while ((c = getopt_long(argc, argv, "hn:", opts, NULL)) != -1) {
        if (c == 'n' && (nconns = (unsigned)atoi(optarg)) > 0 && nconns < 1000)
            continue;
        fprintf(c == 'h' ? stdout : stderr,
                "usage: epoll_loop [--conns N]\n"
                "  N connections (1..999, default 5) idle out 20 ms apart\n");
        return c == 'h' ? 0 : 2;
    }
    conns = calloc(nconns, sizeof *conns);
    if (conns == NULL || ep < 0 || tfd < 0 ||
        epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &ev) != 0 ||
        tw_wheel_create(&wheel, NULL, now_ms()) != 0)
        return 1;
    for (unsigned i = 0; i < nconns; i++) {
        conns[i].deadline = tw_wheel_now(wheel) + 20 * (i + 1);
        tw_timer_init(&conns[i].idle, on_idle, NULL);
        tw_wheel_add(wheel, &conns[i].idle, conns[i].deadline);
    }
    arm(tfd);
    /* A server would also wait on its sockets here; this loop ends when no
     * timer is left. */
    while (tw_wheel_count(wheel) > 0) {
        uint64_t expirations;
        if (epoll_wait(ep, &ev, 1, -1) == 1 &&
            read(tfd, &expirations, sizeof expirations) > 0) {
            wakeups++;
            tw_wheel_advance(wheel, now_ms());
            arm(tfd);
        }
    }
    for (unsigned i = 0; i < nconns; i++)
        errors += conns[i].fired != 1;
    printf("%u timers, %u wake-ups, %u errors\n", nconns, wakeups, errors);
    close(tfd);
    close(ep);
    tw_wheel_destroy(wheel);
    free(conns);
    return errors ? 1 : 0;
}
