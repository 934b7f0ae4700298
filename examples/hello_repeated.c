/* SPDX-License-Identifier: MIT */
/* hello_repeated - a RepeatedTimer runs every 50 ms and stops itself. */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <twheel/repeated.h>

static atomic_int runs;

static void on_trigger(tw_repeated *rt, void *arg)
{
    int n = atomic_fetch_add(&runs, 1) + 1;
    printf("%s: run %d\n", (char *)arg, n);
    if (n == 3)
        tw_repeated_stop(rt); /* any call is allowed from inside a run */
}

int main(int argc, char **argv)
{
    tw_service *s;
    tw_repeated *rt;
    tw_repeated_config cfg = {.timeout_ns = 50000000,
                              .on_trigger = on_trigger,
                              .arg = (void *)"heartbeat"};

    if (argc > 1) /* --help: exit 0, anything else: 2 */
        return puts("usage: hello_repeated"), strcmp(argv[1], "--help") ? 2 : 0;
    if (tw_service_create(&s, NULL) != 0 ||
        tw_repeated_create(&rt, s, &cfg) != 0 || tw_repeated_start(rt) != 0)
        return 1;
    while (atomic_load(&runs) < 3)
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    tw_repeated_destroy(rt); /* stop and free it, before the service */
    tw_service_stop(s, tw_repeated_unprocessed, NULL);
    tw_service_destroy(s);
    return 0;
}
