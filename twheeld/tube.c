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

struct tube *tbd_tube_find(const char *name, size_t len)
{
    for (struct tube *t = g.tubes; t; t = t->next)
        if (t->name_len == len && memcmp(t->name, name, len) == 0)
            return t;
    return NULL;
}

struct tube *tbd_tube_get(const char *name, size_t len)
{
    struct tube *t = tbd_tube_find(name, len);
    if (t)
        return t;
    t = calloc(1, sizeof(*t));
    if (!t || tbd_dq_queue_new(g.dq, &t->dq) != 0) {
        free(t);
        return NULL;
    }
    if (t->dq >= g.nqtube) {
        uint32_t n = g.nqtube ? 2 * g.nqtube : 16;
        struct tube **q = realloc(g.qtube, (size_t)n * sizeof(*q));
        if (!q) {
            tbd_dq_queue_free(g.dq, t->dq);
            free(t);
            return NULL;
        }
        g.qtube = q;
        g.nqtube = n;
    }
    g.qtube[t->dq] = t;
    memcpy(t->name, name, len);
    t->name_len = len;
    tw_timer_init(&t->pause_timer, tube_unpause, t);
    t->next = g.tubes;
    g.tubes = t;
    g.ntubes++;
    return t;
}

/* Frees @t if nothing refers to it any more (beanstalkd's tube lifetime). */
void tbd_tube_maybe_free(struct tube *t)
{
    if (t == g.default_tube || t->using || t->watching || t->nready ||
        t->nreserved || tbd_dq_count(g.dq, t->dq) || t->buried.n)
        return;
    struct tube **pp = &g.tubes;
    while (*pp != t)
        pp = &(*pp)->next;
    *pp = t->next;
    tw_wheel_cancel(g.wheel, &t->pause_timer);
    free(t->heap);
    tbd_dq_queue_free(g.dq, t->dq);
    g.qtube[t->dq] = NULL;
    free(t);
    g.ntubes--;
}

bool tbd_tube_paused(const struct tube *t)
{
    return t->pause_until != 0;
}

static void tube_unpause(tw_timer *tm, void *arg)
{
    (void)tm;
    struct tube *t = arg;
    t->pause_until = 0;
    t->pause_s = 0;
    g.queue_dirty = true;
}
