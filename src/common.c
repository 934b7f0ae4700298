/* SPDX-License-Identifier: MIT */
/*
 * common.c - what every part of the library shares: the allocator
 * (tw_set_allocator() and tw__malloc & co, through which every allocation
 * in src/ goes), the version, the error names and messages, and the copies
 * of configuration and stats structs that can grow without breaking
 * callers.
 *
 * Config structs: every create/open call that takes a config struct has a
 * *_sized form that also takes the size of the caller's struct, and the
 * plain name is a macro passing sizeof the struct as the caller's header
 * declares it. A program built against an older header, whose struct ends
 * earlier, passes the smaller size: the library reads only those bytes and
 * treats the fields it did not get as zero, which is every field's
 * default. A program built against a newer header passes a larger size:
 * the bytes this library does not know must be zero (a newer field left at
 * its default), otherwise the call fails with TW_EINVAL rather than ignore
 * a setting.
 *
 * Stats structs go the other way, through the *_sized getters
 * (tw_service_get_stats_sized(), tw_durable_stats_get_sized()): the
 * library fills its full struct and tw__stats_copy_out() copies the part
 * the caller's struct holds, zeroing what a newer, larger struct has past
 * it.
 */
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "twheel/wheel.h"

/* ------------------------------------------------------------------------ */
/* Config structs that grow (see above). */

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

void tw__stats_copy_out(void *dst, size_t dst_size, const void *full,
                        size_t full_size)
{
    size_t n = dst_size < full_size ? dst_size : full_size;
    memcpy(dst, full, n);
    if (dst_size > n)
        memset((char *)dst + n, 0, dst_size - n);
}

/* ------------------------------------------------------------------------ */
/* Allocator: every allocation of the library goes through these (the
 * other sources call them as tw__malloc & co, see common.h). */

static struct {
    void *(*malloc_fn)(size_t);
    void *(*calloc_fn)(size_t, size_t);
    void *(*realloc_fn)(void *, size_t);
    void (*free_fn)(void *);
} alloc_fns = {malloc, calloc, realloc, free};

int tw_set_allocator(void *(*malloc_fn)(size_t),
                     void *(*calloc_fn)(size_t, size_t),
                     void *(*realloc_fn)(void *, size_t),
                     void (*free_fn)(void *))
{
    if (!malloc_fn || !calloc_fn || !realloc_fn || !free_fn)
        return TW_EINVAL;
    alloc_fns.malloc_fn = malloc_fn;
    alloc_fns.calloc_fn = calloc_fn;
    alloc_fns.realloc_fn = realloc_fn;
    alloc_fns.free_fn = free_fn;
    return 0;
}

void *tw__malloc(size_t n)
{
    return alloc_fns.malloc_fn(n);
}

void *tw__calloc(size_t n, size_t size)
{
    return alloc_fns.calloc_fn(n, size);
}

void *tw__realloc(void *p, size_t n)
{
    return alloc_fns.realloc_fn(p, n);
}

void tw__free(void *p)
{
    alloc_fns.free_fn(p);
}

/* ------------------------------------------------------------------------ */
/* Version and errors. */

unsigned tw_version(void)
{
    return TW_VERSION_HEX;
}

#define TW_STR_(x) #x
#define TW_STR(x) TW_STR_(x)

const char *tw_version_string(void)
{
    return TW_STR(TW_VERSION_MAJOR) "." TW_STR(TW_VERSION_MINOR) "." TW_STR(
        TW_VERSION_PATCH);
}

/* One row per TW_E* code: its name and a message true for every use. */
#define TW_ERRORS(X)                                                           \
    X(TW_EINVAL, "invalid argument")                                           \
    X(TW_ENOMEM, "out of memory")                                              \
    X(TW_EAGAIN, "limit reached (max_pending, max_callbacks) or no thread "    \
                 "could be started")                                           \
    X(TW_EBUSY, "resource busy")                                               \
    X(TW_ESHUTDOWN, "timer service is stopped")                                \
    X(TW_EDEADLK, "call would wait for itself")                                \
    X(TW_ENOENT, "no such key")                                                \
    X(TW_EEXIST, "key already held")                                           \
    X(TW_EIO, "I/O error or corrupt data")                                     \
    X(TW_ENOSPC, "no space left on device")                                    \
    X(TW_ECONN, "remote store unreachable")                                    \
    /* The durable store's file system errors. */                              \
    X(TW_EACCES, "permission denied")                                          \
    X(TW_EROFS, "read-only file system")                                       \
    X(TW_ENOTDIR, "not a directory")                                           \
    TW_ERRORS_REMOTE(X)
/* Remote stores' own codes. */
#define TW_ERRORS_REMOTE(X)                                                    \
    X(TW_EAUTH, "remote store refused the credentials or their rights")        \
    /* Conditional writes of the durable store. */                             \
    X(TW_ESTALE, "stored record is not the expected version")
#define TW_ERROR_MESSAGE(code, msg)                                            \
    case code:                                                                 \
        return msg;
#define TW_ERROR_NAME(code, msg)                                               \
    case code:                                                                 \
        return #code;

const char *tw_strerror(int err)
{
    switch (err) {
    case 0:
        return "success";
        TW_ERRORS(TW_ERROR_MESSAGE)
    default:
        return "unknown error";
    }
}

const char *tw_err_name(int err)
{
    switch (err) {
    case 0:
        return "0";
        TW_ERRORS(TW_ERROR_NAME)
    default:
        return "unknown";
    }
}
