/* SPDX-License-Identifier: MIT */
/*
 * src/common.h - what src/common.c gives every part of the library: the
 * allocator, the copies of growing config and stats structs, and the
 * bucket of a lateness histogram; the internal side of twheel/base.h.
 * With twheel/wheel.h, twheel/base.h, src/wheel.c and src/common.c it is
 * all the single-threaded wheel needs. Nothing here is public API; names
 * carry the tw__ prefix.
 */
#ifndef TWHEEL_COMMON_H
#define TWHEEL_COMMON_H

#include <stddef.h>
#include <stdint.h>

#include "twheel/base.h" /* TW_LATE_BUCKETS */

/* The library's allocator (tw_set_allocator() replaces it). Every
 * allocation in src/ goes through these. */
void *tw__malloc(size_t n);
void *tw__calloc(size_t n, size_t size);
void *tw__realloc(void *p, size_t n);
void tw__free(void *p);

/* Copy the caller's config of @src_size bytes into @dst (@dst_size bytes),
 * zeroing what the caller's struct did not have. TW_EINVAL, with @dst
 * zeroed, if @src is longer and any byte past @dst_size is non-zero. A
 * NULL @src gives an all-zero @dst. */
int tw__config_copy(void *dst, size_t dst_size, const void *src,
                    size_t src_size);

/* The way back, for the *_sized getters of growing stats structs: copy
 * the library's full struct @full (@full_size bytes) into the caller's
 * @dst of @dst_size bytes, the fields that fit, zero past them (a caller's
 * newer, larger struct). The getter checks @dst_size against the oldest
 * struct it accepts first. */
void tw__stats_copy_out(void *dst, size_t dst_size, const void *full,
                        size_t full_size);

/* The TW_LATE_BUCKETS bucket of a run that started @late_us microseconds
 * after its due time (see twheel/base.h); the service and the durable
 * stores count their lateness histograms with it. */
static inline unsigned tw__late_bucket(uint64_t late_us)
{
    unsigned b = late_us ? 64u - (unsigned)__builtin_clzll(late_us) : 0u;
    return b < TW_LATE_BUCKETS - 1 ? b : TW_LATE_BUCKETS - 1;
}

#endif
