/* SPDX-License-Identifier: MIT */
/*
 * twheel/base.h - what every part of twheel stands on: the version, the
 * error codes with their names and messages, the buckets of the lateness
 * histograms, and the allocator hook.
 *
 * Every public header of twheel includes this one, so a program that
 * includes any of them has TW_VERSION_*, the TW_E* codes, tw_strerror()
 * and tw_set_allocator(). The functions are defined in src/common.c.
 *
 * Thread safety: tw_version(), tw_version_string(), tw_strerror() and
 * tw_err_name() may be called from any thread at any time; they return
 * static strings and keep no state. tw_set_allocator() is for start-up
 * (see below).
 */
#ifndef TWHEEL_BASE_H
#define TWHEEL_BASE_H

#include <errno.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(TWHEEL_STATIC)
#define TW_EXTERN
#elif defined(__GNUC__)
#define TW_EXTERN __attribute__((visibility("default")))
#else
#define TW_EXTERN
#endif

#define TW_VERSION_MAJOR 0 /* the headers' version: major */
#define TW_VERSION_MINOR 2 /* minor: 0.x breaks the ABI at each one */
#define TW_VERSION_PATCH 0 /* patch */
/* The version as one number, 0xMMmmpp; compare with tw_version(). */
#define TW_VERSION_HEX                                                         \
    ((TW_VERSION_MAJOR << 16) | (TW_VERSION_MINOR << 8) | TW_VERSION_PATCH)

/* Error codes: always negative, equal to -errno of the same name. */
#define TW_EINVAL (-EINVAL) /* bad argument; nothing was changed */
#define TW_ENOMEM (-ENOMEM) /* out of memory; nothing was changed */
#define TW_EAGAIN                                                              \
    (-EAGAIN)             /* a limit (max_pending, max_callbacks) is reached   \
                              or a thread could not be started */
#define TW_EBUSY (-EBUSY) /* the object is in use */
#define TW_ESHUTDOWN (-ESHUTDOWN) /* the service is stopped */
#define TW_EDEADLK (-EDEADLK)     /* the call would wait for itself */
#define TW_ENOENT (-ENOENT)       /* no such key or object */
#define TW_EEXIST (-EEXIST)       /* the key is held already */
#define TW_EIO (-EIO)             /* an I/O error or corrupt stored data */
#define TW_ENOSPC (-ENOSPC)       /* no space left on the device */
#define TW_ECONN (-ENOTCONN)      /* a remote store cannot be reached */
/* Error codes of the durable store's open that name the file system's
 * reason (0.3.0). */
#define TW_EACCES (-EACCES)   /* permission denied */
#define TW_EROFS (-EROFS)     /* read-only file system */
#define TW_ENOTDIR (-ENOTDIR) /* a path names a file, not a directory */

/* Remote stores: the server refused the credentials (wrong password,
 * unknown or disabled user, AUTH missing) or the rights they carry (an ACL
 * user without a command or key the store needs). EKEYREJECTED ("key was
 * rejected by service") because the server rejected what we presented;
 * EACCES and EPERM stay with local permissions, so a wrong password and a
 * directory that may not be written are told apart by the code alone. */
#define TW_EAUTH (-EKEYREJECTED)

/* Conditional writes (twheel/durable.h, tw_durable_schedule_if() and
 * friends): the stored record is not the version the caller expected (it
 * was rewritten since, or a key that had to be absent is pending). ESTALE
 * ("stale file handle"): the caller's view of the record is stale. */
#define TW_ESTALE (-ESTALE)

/*
 * TW_LATE_BUCKETS - buckets of the lateness histograms in tw_service_stats
 * and tw_durable_stats. Bucket 0 counts runs that started less than 1 us
 * after their due time; bucket i (1 .. TW_LATE_BUCKETS - 2) those that
 * started [2^(i-1), 2^i) us late; the last bucket everything later.
 */
#define TW_LATE_BUCKETS 32

/* The version of the library linked in, as TW_VERSION_HEX. */
TW_EXTERN unsigned tw_version(void);

/*
 * tw_version_string - the version of the library linked in, as text:
 * "MAJOR.MINOR.PATCH" (e.g. "0.2.0"), the same version as tw_version().
 * Return: a static string, never NULL.
 */
TW_EXTERN const char *tw_version_string(void);

/* A static English message for a TW_E* code (or 0). Never NULL. */
TW_EXTERN const char *tw_strerror(int err);

/*
 * tw_err_name - the name of a TW_E* code as a static string ("TW_EINVAL"),
 * in the manner of uv_err_name(); "0" for 0, "unknown" for any other value.
 * Never NULL.
 */
TW_EXTERN const char *tw_err_name(int err);

/**
 * tw_set_allocator - route every allocation twheel makes through the given
 * functions, in the manner of uv_replace_allocator().
 * @malloc_fn: replaces malloc().
 * @calloc_fn: replaces calloc().
 * @realloc_fn: replaces realloc().
 * @free_fn: replaces free().
 *
 * Covers wheels, the service's records, RepeatedTimers and durable stores.
 * All four must be non-NULL and behave as the C library's. Call it before
 * twheel allocates anything, or while no twheel object exists: memory is
 * freed with the functions that were current when it was allocated only if
 * they are the same.
 *
 * Context: not thread-safe; once, at start-up.
 * Return: 0, or TW_EINVAL (a NULL function) with nothing changed.
 */
TW_EXTERN int tw_set_allocator(void *(*malloc_fn)(size_t),
                               void *(*calloc_fn)(size_t, size_t),
                               void *(*realloc_fn)(void *, size_t),
                               void (*free_fn)(void *));

#ifdef __cplusplus
}
#endif

#endif
