/* SPDX-License-Identifier: MIT */
/*
 * util.c - twheeld: clocks, logging, allocation and job lists.
 */
#define _GNU_SOURCE
#include "tbd.h"

/* ---- clocks ---- */

uint64_t tbd_mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t tbd_mono_ms(void)
{
    return tbd_mono_ns() / 1000000u;
}

/*
 * Whole seconds from now to @deadline (monotonic ms, as the wheel's), 0
 * once it passed: truncated from the clock's nanoseconds, as beanstalkd's
 * time-left, so a delay of 5 s reads 4 right after it was set.
 */
uint64_t tbd_secs_left(uint64_t deadline)
{
    uint64_t now = tbd_mono_ns();
    uint64_t end = deadline * 1000000u;
    return end > now ? (end - now) / 1000000000u : 0;
}

/* CLOCK_REALTIME: whole seconds and the nanoseconds beyond. */
static struct timespec wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts;
}

int64_t tbd_wall_ms(void)
{
    struct timespec ts = wall_now();
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The wall clock in ms rounded up: a due time of this + delay is never
 * before the delay has passed, though the store fires at the due ms. */
int64_t tbd_wall_ms_up(void)
{
    struct timespec ts = wall_now();
    return (int64_t)ts.tv_sec * 1000 + (ts.tv_nsec + 999999) / 1000000;
}

void tbd_logv(struct server *s, int level, const char *fmt, ...)
{
    if (s->opt && s->opt->verbose < level)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("twheeld: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void *tbd_xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fputs("twheeld: out of memory\n", stderr);
        abort();
    }
    return p;
}

/* ---- lists ---- */

void tbd_jl_push(struct jlist *l, struct job *j)
{
    j->l_next = NULL;
    j->l_prev = l->tail;
    if (l->tail)
        l->tail->l_next = j;
    else
        l->head = j;
    l->tail = j;
    l->n++;
}

void tbd_jl_remove(struct jlist *l, struct job *j)
{
    if (j->l_prev)
        j->l_prev->l_next = j->l_next;
    else
        l->head = j->l_next;
    if (j->l_next)
        j->l_next->l_prev = j->l_prev;
    else
        l->tail = j->l_prev;
    j->l_next = j->l_prev = NULL;
    l->n--;
}

/* @url into @out (@n bytes) with the password of its user part, if any,
 * as "***": what a message may show. */
void tbd_url_redact(const char *url, char *out, size_t n)
{
    size_t off, len;
    if (!tbd_url_password(url, &off, &len))
        snprintf(out, n, "%s", url);
    else
        snprintf(out, n, "%.*s***%s", (int)off, url, url + off + len);
}

/* Where the password of @url's user part ("scheme://user:PASSWORD@...")
 * is: its offset into *@off, its length into *@len; false without one. */
bool tbd_url_password(const char *url, size_t *off, size_t *len)
{
    const char *auth = strstr(url, "://");
    auth = auth ? auth + 3 : NULL;
    const char *at = auth ? strchr(auth, '@') : NULL;
    const char *colon = at ? memchr(auth, ':', (size_t)(at - auth)) : NULL;
    if (!colon)
        return false;
    *off = (size_t)(colon + 1 - url);
    *len = (size_t)(at - colon - 1);
    return true;
}
