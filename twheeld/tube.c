/* SPDX-License-Identifier: MIT */
/*
 * tube.c - twheeld: tubes, their ready heaps and pauses.
 */
#define _GNU_SOURCE
#include "tbd.h"

#include "delayq.h"

/* ---- ready heap ---- */

bool tbd_job_less(const struct job *a, const struct job *b)
{
    return a->pri < b->pri || (a->pri == b->pri && a->id < b->id);
}

static void heap_set(struct tube *t, size_t i, struct job *j)
{
    t->heap[i] = j;
    j->heap_idx = (uint32_t)i;
}

static void heap_up(struct tube *t, size_t i)
{
    struct job *j = t->heap[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!tbd_job_less(j, t->heap[p]))
            break;
        heap_set(t, i, t->heap[p]);
        i = p;
    }
    heap_set(t, i, j);
}

static void heap_down(struct tube *t, size_t i)
{
    struct job *j = t->heap[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= t->nready)
            break;
        if (c + 1 < t->nready && tbd_job_less(t->heap[c + 1], t->heap[c]))
            c++;
        if (!tbd_job_less(t->heap[c], j))
            break;
        heap_set(t, i, t->heap[c]);
        i = c;
    }
    heap_set(t, i, j);
}

void tbd_heap_push(struct tube *t, struct job *j)
{
    if (t->nready == t->cap) {
        size_t ncap = t->cap ? t->cap * 2 : 16;
        struct job **nh = realloc(t->heap, ncap * sizeof(*nh));
        if (!nh) {
            fputs("twheeld: out of memory\n", stderr);
            abort();
        }
        t->heap = nh;
        t->cap = ncap;
    }
    heap_set(t, t->nready++, j);
    heap_up(t, t->nready - 1);
}

void tbd_heap_remove(struct tube *t, struct job *j)
{
    size_t i = j->heap_idx;
    struct job *last = t->heap[--t->nready];
    if (i == t->nready)
        return;
    heap_set(t, i, last);
    heap_down(t, i);
    heap_up(t, last->heap_idx);
}

/* ---- tubes ---- */

static void tube_unpause(tw_timer *tm, void *arg);

struct tube *tbd_tube_find(struct server *s, const char *name, size_t len)
{
    for (struct tube *t = s->tubes; t; t = t->next)
        if (t->name_len == len && memcmp(t->name, name, len) == 0)
            return t;
    return NULL;
}

struct tube *tbd_tube_get(struct server *s, const char *name, size_t len)
{
    struct tube *t = tbd_tube_find(s, name, len);
    if (t)
        return t;
    t = calloc(1, sizeof(*t));
    if (!t || tbd_dq_queue_new(s->dq, &t->dq) != 0) {
        free(t);
        return NULL;
    }
    if (t->dq >= s->nqtube) {
        uint32_t n = s->nqtube ? 2 * s->nqtube : 16;
        struct tube **q = realloc(s->qtube, (size_t)n * sizeof(*q));
        if (!q) {
            tbd_dq_queue_free(s->dq, t->dq);
            free(t);
            return NULL;
        }
        s->qtube = q;
        s->nqtube = n;
    }
    s->qtube[t->dq] = t;
    t->srv = s;
    memcpy(t->name, name, len);
    t->name_len = len;
    tw_timer_init(&t->pause_timer, tube_unpause, t);
    t->next = s->tubes;
    s->tubes = t;
    s->ntubes++;
    return t;
}

/* Frees @t if nothing refers to it any more (beanstalkd's tube lifetime). */
void tbd_tube_maybe_free(struct tube *t)
{
    struct server *s = t->srv;
    if (t == s->default_tube || t->using || t->watching || t->nready ||
        t->nreserved || tbd_dq_count(s->dq, t->dq) || t->buried.n)
        return;
    struct tube **pp = &s->tubes;
    while (*pp != t)
        pp = &(*pp)->next;
    *pp = t->next;
    tw_wheel_cancel(s->wheel, &t->pause_timer);
    free(t->heap);
    tbd_dq_queue_free(s->dq, t->dq);
    s->qtube[t->dq] = NULL;
    free(t);
    s->ntubes--;
}

bool tbd_tube_paused(const struct tube *t)
{
    return t->pause_until != 0;
}

static void tube_unpause(tw_timer *tm, void *arg)
{
    (void)tm;
    struct tube *t = arg;
    struct server *s = t->srv;
    t->pause_until = 0;
    t->pause_s = 0;
    s->queue_dirty = true;
}
