/* SPDX-License-Identifier: MIT */
/*
 * cli.h - small helpers shared by the idle-connection server and its load
 * tool: option matching, durations with a unit suffix, the monotonic clock
 * and the open-file limit. Header-only (static functions), Linux, C11 with
 * the POSIX 2008 interfaces. Not part of the library.
 */
#ifndef TWHEEL_TOOLS_CLI_H
#define TWHEEL_TOOLS_CLI_H

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

/* Exit code for options that cannot be used (as in the BSD sysexits). */
#define CLI_EXIT_USAGE 2

/* Nanoseconds on CLOCK_MONOTONIC. It never goes backwards. */
static inline uint64_t cli_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/*
 * cli_option - if argv[*i] is the option @name, either as "--name value" or
 * "--name=value", store the value in *@val, step *@i past it and return
 * true. A missing value is stored as NULL (the caller reports it).
 */
static inline bool cli_option(int argc, char **argv, int *i, const char *name,
                              const char **val)
{
    const char *a = argv[*i];
    size_t n = strlen(name);

    if (strncmp(a, name, n) != 0)
        return false;
    if (a[n] == '=') {
        *val = a + n + 1;
        return true;
    }
    if (a[n] != '\0')
        return false;
    *val = *i + 1 < argc ? argv[++*i] : NULL;
    return true;
}

/*
 * cli_parse_u64 - parse a decimal number in [@min, @max] from the whole of
 * @s. Returns 0, or -1 (nothing stored) for anything else: NULL, empty,
 * signs, trailing characters, overflow, out of range.
 */
static inline int cli_parse_u64(const char *s, uint64_t min, uint64_t max,
                                uint64_t *out)
{
    uint64_t v = 0;

    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    for (; *s >= '0' && *s <= '9'; s++) {
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    if (*s != '\0' || v < min || v > max)
        return -1;
    *out = v;
    return 0;
}

/*
 * cli_parse_duration - parse "<integer>ms" or "<integer>s" into
 * nanoseconds, at most @max_ns, at least 1 ns unless @allow_zero. The unit
 * is required: a bare number is refused because it would be ambiguous.
 * Returns 0, or -1 with nothing stored.
 */
static inline int cli_parse_duration(const char *s, bool allow_zero,
                                     uint64_t max_ns, uint64_t *out)
{
    char num[24];
    size_t len, digits = 0;
    uint64_t v, unit;

    if (s == NULL)
        return -1;
    len = strlen(s);
    while (digits < len && s[digits] >= '0' && s[digits] <= '9')
        digits++;
    if (digits == 0 || digits >= sizeof num)
        return -1;
    if (strcmp(s + digits, "ms") == 0)
        unit = 1000000u;
    else if (strcmp(s + digits, "s") == 0)
        unit = 1000000000u;
    else
        return -1;
    memcpy(num, s, digits);
    num[digits] = '\0';
    if (cli_parse_u64(num, allow_zero ? 0 : 1, max_ns / unit, &v) != 0)
        return -1;
    *out = v * unit;
    return 0;
}

/*
 * cli_raise_nofile - raise the soft RLIMIT_NOFILE to at least @want (or to
 * the hard limit when @want is 0). The hard limit is raised too when that
 * is allowed (CAP_SYS_RESOURCE); failing that, the soft limit goes as high
 * as the hard one permits. Returns the soft limit in force afterwards.
 */
static inline uint64_t cli_raise_nofile(uint64_t want)
{
    struct rlimit rl;

    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return 0;
    if (want == 0)
        want = rl.rlim_max;
    if (rl.rlim_cur >= want)
        return rl.rlim_cur;
    if (rl.rlim_max < want) {
        struct rlimit up = {want, want};
        if (setrlimit(RLIMIT_NOFILE, &up) == 0)
            return want;
    }
    {
        struct rlimit up = {rl.rlim_max < want ? rl.rlim_max : want,
                            rl.rlim_max};
        if (setrlimit(RLIMIT_NOFILE, &up) == 0)
            return up.rlim_cur;
    }
    return rl.rlim_cur;
}

#endif
