/* SPDX-License-Identifier: MIT */
/* hello_service - two tasks run on a timer service, a third is cancelled. */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <twheel/service.h>

static atomic_int ran;

static void say(tw_id id, void *arg) /* runs on the service's thread */
{
    (void)id;
    printf("%s\n", (char *)arg);
    atomic_fetch_add(&ran, 1);
}

int main(int argc, char **argv)
{
    tw_service *s;
    tw_id id;

    if (argc > 1) /* --help: exit 0, anything else: 2 */
        return puts("usage: hello_service"), strcmp(argv[1], "--help") ? 2 : 0;
    if (tw_service_create(&s, NULL) != 0) /* 1 ms tick */
        return 1;
    tw_schedule(s, say, (void *)"after 200 ms", 200000000, NULL); /* in ns */
    tw_schedule(s, say, (void *)"after 100 ms", 100000000, NULL);
    tw_schedule(s, say, (void *)"never", 150000000, &id);
    if (tw_cancel(s, id)) /* true: it will not run */
        puts("cancelled the 150 ms task");
    while (atomic_load(&ran) < 2)
        nanosleep(&(struct timespec){0, 10000000}, NULL);
    tw_service_stop(s, NULL, NULL); /* hands back what has not run */
    tw_service_destroy(s);
    return 0;
}
