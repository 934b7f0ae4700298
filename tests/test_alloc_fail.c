/* SPDX-License-Identifier: MIT */
/*
 * tests/test_alloc_fail.c - allocation failures in the core wheel.
 *
 * Every allocation tw_wheel_create() makes is failed in turn (once, and
 * from that point on), for each configuration the differential test uses:
 * the call must return TW_ENOMEM, leave *out alone and leak nothing, and
 * the next create must work. A created wheel needs no more memory: with
 * every allocation failing, add, move, cancel, advance and next_expiry
 * keep working (the one later allocation, the slot table's widening at
 * 4,096 pending timers, fails without effect; tests/test_wheel.c
 * test_widen covers it).
 */
#include <stdbool.h>

#include <twheel/wheel.h>

#include "test.h"
#include "test_alloc_fail.h"

static const tw_wheel_config configs[] = {
    {0, 0}, {512, 1}, {64, 3}, {8, 2}, {1, 1}, {1u << 16, 0}, {3, 7}};
#define NCONFIGS (sizeof configs / sizeof configs[0])

static long points; /* failure points swept */
static int fired;

static void on_fire(tw_timer *t, void *arg)
{
    (void)t;
    (void)arg;
    fired++;
}

/* A wheel made under a failing allocator must still run timers. */
static void use_wheel(tw_wheel *w)
{
    tw_timer t[8];
    fired = 0;
    tw_af_arm(0, true); /* every allocation fails from here on */
    uint64_t now = tw_wheel_now(w);
    for (int i = 0; i < 8; i++) {
        tw_timer_init(&t[i], on_fire, NULL);
        ASSERT_EQ(tw_wheel_add(w, &t[i], now + (UINT64_C(1) << (i * 8))), 0);
    }
    ASSERT_EQ(tw_wheel_add(w, &t[7], UINT64_MAX), 0); /* move */
    ASSERT(tw_wheel_cancel(w, &t[6]));
    ASSERT_EQ(tw_wheel_count(w), 7);
    ASSERT_LE(tw_wheel_next_expiry(w), now + 1);
    ASSERT_EQ(tw_wheel_advance(w, now + (UINT64_C(1) << 40)), 6);
    ASSERT_EQ(tw_wheel_advance(w, UINT64_MAX), 1);
    ASSERT_EQ(fired, 7);
    ASSERT_EQ(tw_wheel_count(w), 0);
    ASSERT_EQ(tw_wheel_next_expiry(w), UINT64_MAX);
    ASSERT_EQ(tw_af_calls(), 0);
    tw_af_disarm();
}

static int make_wheel(void **obj, void *cfg)
{
    return tw_wheel_create((tw_wheel **)obj, cfg, 12345);
}

static void use_wheel_obj(void *w)
{
    use_wheel(w);
}

static void destroy_wheel(void *w)
{
    tw_wheel_destroy(w);
}

static void sweep_create(const tw_wheel_config *cfg, bool sticky)
{
    points += tw_af_sweep(make_wheel, use_wheel_obj, destroy_wheel, (void *)cfg,
                          sticky);
}

static void test_create_sweep(void)
{
    for (size_t i = 0; i < NCONFIGS; i++) {
        sweep_create(&configs[i], false);
        sweep_create(&configs[i], true);
    }
    long live0 = tw_af_live();
    for (long k = 0; k < 4; k++) {
        tw_wheel *w = NULL;
        tw_af_arm(k, true);
        int rc = tw_wheel_create(&w, NULL, 0); /* NULL cfg: defaults */
        tw_af_disarm();
        if (rc == 0) {
            tw_wheel_destroy(w);
            break;
        }
        ASSERT_EQ(rc, TW_ENOMEM);
        ASSERT_NULL(w);
    }
    ASSERT_EQ(tw_af_live(), live0);
}

/* Bad configurations are refused before anything is allocated. */
static void test_bad_config_allocates_nothing(void)
{
    static const tw_wheel_config bad[] = {
        {(1u << 30) + 1, 0}, {UINT32_MAX, 1}, {64, 65}, {8, UINT32_MAX}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        tw_wheel *w = NULL;
        tw_af_arm(-1, false);
        ASSERT_EQ(tw_wheel_create(&w, &bad[i], 0), TW_EINVAL);
        ASSERT_EQ(tw_af_calls(), 0);
        ASSERT_NULL(w);
    }
    tw_af_arm(-1, false);
    ASSERT_EQ(tw_wheel_create(NULL, NULL, 0), TW_EINVAL);
    ASSERT_EQ(tw_af_calls(), 0);
}

int main(void)
{
    RUN_TEST(test_bad_config_allocates_nothing);
    RUN_TEST(test_create_sweep);
    printf("wheel: %ld allocation failure points swept\n", points);
    return tw_test_done();
}
