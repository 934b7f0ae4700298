/* SPDX-License-Identifier: MIT */
/*
 * test_config_abi.c - config structs that grow: a caller built against an
 * older header passes a shorter struct (its fields past that are taken as
 * zero, the default, and never read: the struct sits at the very end of a
 * heap block, so ASan and valgrind see any read past it); a caller built
 * against a newer header passes a longer one (zero extra bytes are fine,
 * any non-zero extra byte is TW_EINVAL with nothing made). The service's
 * stats struct grows the same way: an older caller's shorter struct gets
 * its fields and no byte past them, a newer one's zeros past ours.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"
#include "twheel/durable.h"
#include "twheel/repeated.h"
#include "twheel/service.h"

/* The 0.1 layout of tw_service_config, before the "additions". */
struct old_service_config {
    uint64_t tick_ns;
    uint32_t ticks_per_wheel;
    uint32_t levels;
    uint64_t max_pending;
    uint32_t executor_threads;
};

/* A copy of @len bytes of @src at the end of a block of exactly @len. */
static void *exact_copy(const void *src, size_t len)
{
    void *p = malloc(len);
    ASSERT_NOT_NULL(p);
    memcpy(p, src, len);
    return p;
}

static void task(tw_id id, void *arg)
{
    (void)id;
    (void)arg;
}

static void test_service_old_layout(void)
{
    struct old_service_config old = {.tick_ns = 1000000, .max_pending = 2};
    void *cfg = exact_copy(&old, sizeof old);
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create_sized(&s, cfg, sizeof old), 0);
    ASSERT_NOT_NULL(s);
    /* max_pending from the old struct holds; the missing fields are
     * defaults (the built-in clock, no caller-supplied executor). */
    tw_id a, b, c;
    ASSERT_EQ(tw_schedule(s, task, NULL, UINT64_C(3600000000000), &a), 0);
    ASSERT_EQ(tw_schedule(s, task, NULL, UINT64_C(3600000000000), &b), 0);
    ASSERT_EQ(tw_schedule(s, task, NULL, UINT64_C(3600000000000), &c),
              TW_EAGAIN);
    ASSERT_EQ(tw_service_pending(s), 2);
    tw_service_destroy(s);
    free(cfg);
}

static void test_service_newer_layout(void)
{
    /* A newer caller's struct: ours followed by fields we do not know. */
    unsigned char buf[sizeof(tw_service_config) + 16];
    memset(buf, 0, sizeof buf);
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create_sized(&s, (void *)buf, sizeof buf), 0);
    tw_service_destroy(s);
    s = NULL;
    buf[sizeof(tw_service_config) + 3] = 1; /* a setting we cannot honour */
    ASSERT_EQ(tw_service_create_sized(&s, (void *)buf, sizeof buf), TW_EINVAL);
    ASSERT_NULL(s);
    /* The plain name is the sized call with this header's size. */
    ASSERT_EQ(tw_service_create(&s, NULL), 0);
    tw_service_destroy(s);
}

/* A caller of the 0.2 development layout, which ended at flags: its
 * struct's tail padding (where no field was) may hold anything. */
static void test_service_padding_ignored(void)
{
    size_t len = offsetof(tw_service_config, slack_ns);
    unsigned char *buf = malloc(len);
    ASSERT_NOT_NULL(buf);
    memset(buf, 0, len);
    size_t pad = offsetof(tw_service_config, flags) + sizeof(uint32_t);
    memset(buf + pad, 0xff, len - pad);
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create_sized(&s, (void *)buf, len), 0);
    tw_service_destroy(s);
    free(buf);
}

/* The 0.1 layout of tw_service_stats, before backlog and late_hist. */
struct old_service_stats {
    uint64_t pending, ran, cancelled, handed_back, wakeups, nodes, memory_bytes;
};

static void test_stats_layouts(void)
{
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, NULL), 0);
    tw_id id;
    ASSERT_EQ(tw_schedule(s, task, NULL, UINT64_C(3600000000000), &id), 0);
    /* An old caller's struct at the very end of a block: the sized call
     * and the 0.1 entry point write nothing past it. */
    struct old_service_stats zero = {0};
    struct old_service_stats *old = exact_copy(&zero, sizeof zero);
    ASSERT_EQ(tw_service_get_stats_sized(s, (void *)old, sizeof *old), 0);
    ASSERT_EQ(old->pending, 1);
    ASSERT(old->memory_bytes > 0);
    memset(old, 0, sizeof *old);
    (tw_service_get_stats)(s, (void *)old);
    ASSERT_EQ(old->pending, 1);
    ASSERT(old->nodes > 0);
    free(old);
    /* Shorter than the 0.1 struct, or NULL: nothing written. */
    uint64_t small[2] = {5, 5};
    ASSERT_EQ(tw_service_get_stats_sized(s, (void *)small, sizeof small),
              TW_EINVAL);
    ASSERT_EQ(small[0], 5);
    ASSERT_EQ(tw_service_get_stats_sized(NULL, (void *)small, 64), TW_EINVAL);
    ASSERT_EQ(tw_service_get_stats_sized(s, NULL, 64), TW_EINVAL);
    /* A newer caller's longer struct: what we do not know reads as zero. */
    unsigned char big[sizeof(tw_service_stats) + 24];
    memset(big, 0xee, sizeof big);
    ASSERT_EQ(tw_service_get_stats_sized(s, (void *)big, sizeof big), 0);
    for (size_t i = sizeof(tw_service_stats); i < sizeof big; i++)
        ASSERT_EQ(big[i], 0);
    /* The plain name is the sized call with this header's size. */
    tw_service_stats st;
    memset(&st, 0xee, sizeof st);
    ASSERT_EQ(tw_service_get_stats(s, &st), 0);
    ASSERT_EQ(st.backlog, 0);
    ASSERT_EQ(st.late_hist[TW_LATE_BUCKETS - 1], 0);
    tw_service_destroy(s);
}

static void on_trigger(tw_repeated *rt, void *arg)
{
    (void)rt;
    (void)arg;
}

static void test_repeated_layouts(void)
{
    tw_service *s = NULL;
    ASSERT_EQ(tw_service_create(&s, NULL), 0);
    /* An older caller that knew name, timeout and on_trigger only. */
    tw_repeated_config full = {
        .name = "old", .timeout_ns = 1000000000, .on_trigger = on_trigger};
    size_t old_len = offsetof(tw_repeated_config, adjust_timeout);
    void *cfg = exact_copy(&full, old_len);
    tw_repeated *rt = NULL;
    ASSERT_EQ(tw_repeated_create_sized(&rt, s, cfg, old_len), 0);
    ASSERT_STR_EQ(tw_repeated_name(rt), "old");
    tw_repeated_destroy(rt);
    free(cfg);
    /* Too short to hold on_trigger: the required callback is missing. */
    rt = NULL;
    ASSERT_EQ(tw_repeated_create_sized(
                  &rt, s, &full, offsetof(tw_repeated_config, on_trigger)),
              TW_EINVAL);
    ASSERT_NULL(rt);
    tw_service_destroy(s);
}

static int fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)t;
    (void)arg;
    return 0;
}

static void test_durable_layouts(void)
{
    char dir[] = "/tmp/tw_config_abi_XXXXXX";
    ASSERT_NOT_NULL(mkdtemp(dir));
    tw_durable_config full = {.dir = dir, .fire = fire};
    tw_durable_stats st;
    /* An older caller that knew the journal fields only. */
    size_t old_len = offsetof(tw_durable_config, redis);
    void *cfg = exact_copy(&full, old_len);
    tw_durable *d = NULL;
    ASSERT_EQ(tw_durable_open_sized(&d, cfg, old_len), 0);
    ASSERT_EQ(tw_durable_schedule(d, "k", 1, INT64_MAX / 2, NULL, 0), 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    free(cfg);
    /* One built before the retry policy: no limit (its fields unread). */
    old_len = offsetof(tw_durable_config, max_attempts);
    cfg = exact_copy(&full, old_len);
    ASSERT_EQ(tw_durable_open_sized(&d, cfg, old_len), 0);
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(st.pending, 1);
    ASSERT_EQ(st.dead, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    free(cfg);
    /* A newer caller setting a field we do not know: refused, and the
     * message (into the errbuf its struct names) says why. */
    char err[200] = "";
    full.errbuf = err;
    full.errbuf_len = sizeof err;
    unsigned char buf[sizeof full + 8];
    memcpy(buf, &full, sizeof full);
    memset(buf + sizeof full, 0, 8);
    buf[sizeof full] = 7;
    d = NULL;
    ASSERT_EQ(tw_durable_open_sized(&d, (void *)buf, sizeof buf), TW_EINVAL);
    ASSERT_NULL(d);
    if (strstr(err, "newer twheel") == NULL)
        TW_TEST_FAIL_("message: \"%s\"", err);
    full.errbuf = NULL;
    full.errbuf_len = 0;
    /* Reopen through the plain name: the timer is still there. */
    ASSERT_EQ(tw_durable_open(&d, &full), 0);
    ASSERT_EQ(tw_durable_stats_get(d, &st), 0);
    ASSERT_EQ(st.pending, 1);
    ASSERT_EQ(tw_durable_close(d), 0);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ASSERT_EQ(system(cmd), 0);
}

int main(void)
{
    RUN_TEST(test_service_old_layout);
    RUN_TEST(test_service_newer_layout);
    RUN_TEST(test_service_padding_ignored);
    RUN_TEST(test_stats_layouts);
    RUN_TEST(test_repeated_layouts);
    RUN_TEST(test_durable_layouts);
    return 0;
}
