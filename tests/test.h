/* SPDX-License-Identifier: MIT */
/*
 * tests/test.h - the assertions every twheel test uses. No framework: a
 * failed check prints file, line, the expression and both values, then
 * aborts, so CTest (and any sanitizer) sees the failure.
 */
#ifndef TWHEEL_TEST_H
#define TWHEEL_TEST_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TW_TEST_FAIL_(fmt, ...)                                                \
    do {                                                                       \
        fprintf(stderr, "%s:%d: " fmt "\n", __FILE__, __LINE__, __VA_ARGS__);  \
        fflush(stderr);                                                        \
        abort();                                                               \
    } while (0)

#define ASSERT(expr)                                                           \
    do {                                                                       \
        if (!(expr))                                                           \
            TW_TEST_FAIL_("assertion failed: %s", #expr);                      \
    } while (0)

#define TW_TEST_CMP_(a, op, b)                                                 \
    do {                                                                       \
        uint64_t tw_a_ = (uint64_t)(a), tw_b_ = (uint64_t)(b);                 \
        if (!(tw_a_ op tw_b_))                                                 \
            TW_TEST_FAIL_(                                                     \
                "assertion failed: %s %s %s (%" PRIu64 " vs %" PRIu64          \
                ", signed %" PRId64 " vs %" PRId64 ")",                        \
                #a, #op, #b, tw_a_, tw_b_, (int64_t)tw_a_, (int64_t)tw_b_);    \
    } while (0)

#define ASSERT_EQ(a, b) TW_TEST_CMP_(a, ==, b)
#define ASSERT_NE(a, b) TW_TEST_CMP_(a, !=, b)
#define ASSERT_LT(a, b) TW_TEST_CMP_(a, <, b)
#define ASSERT_LE(a, b) TW_TEST_CMP_(a, <=, b)
#define ASSERT_GT(a, b) TW_TEST_CMP_(a, >, b)
#define ASSERT_GE(a, b) TW_TEST_CMP_(a, >=, b)
#define ASSERT_NULL(p) ASSERT((p) == NULL)
#define ASSERT_NOT_NULL(p) ASSERT((p) != NULL)
#define ASSERT_STR_EQ(a, b)                                                    \
    do {                                                                       \
        if (strcmp((a), (b)) != 0)                                             \
            TW_TEST_FAIL_("assertion failed: %s == %s (\"%s\" vs \"%s\")", #a, \
                          #b, (a), (b));                                       \
    } while (0)

/* Run one test function and say so; a failure has aborted before "ok". */
#define RUN_TEST(fn)                                                           \
    do {                                                                       \
        fprintf(stderr, "-- %s\n", #fn);                                       \
        fn();                                                                  \
        tw_test_passed_++;                                                     \
    } while (0)

static int tw_test_passed_;

/* Print the closing line of a test program and return its exit code. */
static inline int tw_test_done(void)
{
    printf("%d passed, 0 failed\n", tw_test_passed_);
    return 0;
}

/* splitmix64: a small deterministic generator for randomized tests. */
static inline uint64_t tw_test_rand(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

#endif
