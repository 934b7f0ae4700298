/* SPDX-License-Identifier: MIT */
/*
 * test_durable_wake - the journal store's thread, on the real clocks,
 * wakes for a timer when the wall clock reaches its due millisecond, not
 * up to a millisecond after it (src/durable_journal_fire.c,
 * mono_at_tick()).
 *
 * A timer due 5 ms ahead is scheduled when the wall clock stands 0.70 to
 * 0.80 ms into its millisecond; the store's round that it starts reads
 * the wall clock truncated to ms. A sleep of whole ms from that reading
 * woke 0.7 ms or more after the due time, every time; the callback
 * measures its own lateness from CLOCK_REALTIME. Of 7 tries the least
 * late must be under 500 us: a bound that only a wake-up as late as the
 * truncation makes it can miss in all 7 (a busy machine adds lateness to
 * some tries, not to the least of 7).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <time.h>

#include <twheel/durable.h>

#include "durable_fixture.h"
#include "test.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static int64_t late_ns = -1;

static int64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    int64_t late = wall_ns() - t->due_ms * 1000000;
    pthread_mutex_lock(&mu);
    late_ns = late;
    pthread_cond_broadcast(&cv);
    pthread_mutex_unlock(&mu);
    return 0;
}

/* One try: the lateness of a timer scheduled 0.70 to 0.80 ms into a
 * wall-clock millisecond, due 5 ms later. */
static int64_t one_try(tw_durable *d, int i)
{
    int64_t now;
    do { /* at most a millisecond of polling */
        now = wall_ns();
    } while (now % 1000000 < 700000 || now % 1000000 >= 800000);
    pthread_mutex_lock(&mu);
    late_ns = -1;
    pthread_mutex_unlock(&mu);
    char key[16];
    int kl = snprintf(key, sizeof key, "w%d", i);
    ASSERT_EQ(
        tw_durable_schedule(d, key, (size_t)kl, now / 1000000 + 5, "x", 1), 0);
    pthread_mutex_lock(&mu);
    while (late_ns < 0) /* waits for the delivery (ctest's TIMEOUT) */
        pthread_cond_wait(&cv, &mu);
    int64_t late = late_ns;
    pthread_mutex_unlock(&mu);
    return late;
}

int main(void)
{
    char dir[256];
    df_new_dir(dir, sizeof dir, NULL);
    tw_durable_config c;
    memset(&c, 0, sizeof c);
    c.dir = dir;
    c.fire = on_fire;
    c.sync = TW_DURABLE_SYNC_NONE; /* the real clocks: no wall_ms/mono_ns */
    tw_durable *d = df_open(&c);
    int64_t least = INT64_MAX;
    for (int i = 0; i < 7; i++) {
        int64_t late = one_try(d, i);
        printf("try %d: delivered %" PRId64 " us after its due time\n", i,
               late / 1000);
        ASSERT_GE(late, 0); /* never early */
        if (late < least)
            least = late;
    }
    tw_durable_close(d);
    df_rm_dir(dir);
    printf("least late: %" PRId64 " us\n", least / 1000);
    fflush(stdout);
    ASSERT_LT(least, 500000);
    puts("ok");
    return 0;
}
