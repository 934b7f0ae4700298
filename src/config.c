/* SPDX-License-Identifier: MIT */
/*
 * config.c - configuration structs that can grow without breaking callers.
 *
 * Every create/open call that takes a config struct has a *_sized form
 * that also takes the size of the caller's struct, and the plain name is a
 * macro passing sizeof the struct as the caller's header declares it. A
 * program built against an older header, whose struct ends earlier, passes
 * the smaller size: the library reads only those bytes and treats the
 * fields it did not get as zero, which is every field's default. A program
 * built against a newer header passes a larger size: the bytes this
 * library does not know must be zero (a newer field left at its default),
 * otherwise the call fails with TW_EINVAL rather than ignore a setting.
 */
#include <string.h>

#include "internal.h"

int tw__config_copy(void *dst, size_t dst_size, const void *src,
                    size_t src_size)
{
    const unsigned char *s = src;
    memset(dst, 0, dst_size);
    if (src == NULL)
        return 0;
    for (size_t i = dst_size; i < src_size; i++)
        if (s[i] != 0)
            return TW_EINVAL;
    memcpy(dst, src, src_size < dst_size ? src_size : dst_size);
    return 0;
}
