/* SPDX-License-Identifier: MIT */
/*
 * fuzz/fuzz.h - helpers shared by the twheel fuzz harnesses: the libFuzzer
 * entry point prototype, a byte reader that never runs out (missing bytes
 * read as zero) and a check macro that aborts with a message, so libFuzzer,
 * the replay driver and CTest all see a failure the same way.
 */
#ifndef TWHEEL_FUZZ_H
#define TWHEEL_FUZZ_H

#include <inttypes.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_CHECK(cond, ...)                                                    \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__,   \
                    #cond);                                                    \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
            fflush(stderr);                                                    \
            abort();                                                           \
        }                                                                      \
    } while (0)

/* The input, consumed front to back. */
typedef struct fz_reader {
    const uint8_t *p;
    size_t n;
} fz_reader;

static inline int fz_more(const fz_reader *r)
{
    return r->n > 0;
}

static inline uint8_t fz_u8(fz_reader *r)
{
    if (r->n == 0)
        return 0;
    r->n--;
    return *r->p++;
}

static inline uint64_t fz_u64(fz_reader *r)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = (v << 8) | fz_u8(r);
    return v;
}

static inline uint64_t fz_sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static inline uint64_t fz_sat_sub(uint64_t a, uint64_t b)
{
    return a < b ? 0 : a - b;
}

/* @b ** @e, saturating at UINT64_MAX. */
static inline uint64_t fz_sat_pow(uint64_t b, unsigned e)
{
    uint64_t v = 1;
    while (e--) {
        if (b != 0 && v > UINT64_MAX / b)
            return UINT64_MAX;
        v *= b;
    }
    return v;
}

#endif
