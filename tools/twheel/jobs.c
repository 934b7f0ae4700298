/* SPDX-License-Identifier: MIT */
/*
 * tools/twheel/jobs.c - twheel jobs: the jobs of a twheeld store,
 * decoded. twheeld (twheeld/store.c) keeps each job as one durable timer,
 * key "j<id>", payload the job record of twheeld/record.c; key "m" or
 * "m<N>" holds a server's high-water mark of ids, "n<N>" a server's
 * liveness record.
 *
 * The job records are read with twheeld's own codec (twheeld/record.c,
 * tbd_rec_parse(): versions 1 to 4, the layouts are described there). A
 * record that it does not take for one that twheeld writes is counted
 * as unreadable, not guessed at.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "record.h"
#include "twheel.h"

struct job {
    unsigned state;
    uint32_t pri, ttr, delay, cnt[5], body_len, node;
    uint64_t id;
    int64_t due, created;
    const unsigned char *tube, *body;
    size_t tube_len;
};

/* The @n bytes at @p as a job record into @j; false if they are not one
 * that twheeld writes. */
static bool job_parse(const unsigned char *p, size_t n, struct job *j)
{
    struct rec r;
    if (!tbd_rec_parse(p, n, &r))
        return false;
    *j = (struct job){.state = (unsigned)r.state,
                      .pri = r.pri,
                      .ttr = r.ttr,
                      .delay = r.delay,
                      .body_len = r.body_len,
                      .node = r.owner,
                      .id = r.id,
                      .due = r.due,
                      .created = r.created,
                      .tube = (const unsigned char *)r.tube,
                      .body = r.body,
                      .tube_len = r.tube_len};
    memcpy(j->cnt, r.cnt, sizeof(j->cnt));
    return true;
}

struct jobs_walk {
    const struct opts *o;
    uint64_t jobs, marks, other, unreadable;
    uint64_t after, upto; /* the page: ids in (after, upto] */
    uint64_t *ids;        /* first pass: ids above after (n of cap) */
    size_t n, cap;
    bool oom;
};

static const char *const states[] = {"ready", "delayed", "reserved", "buried"};

static void job_json(const struct job *j, const tw_durable_scanned *t,
                     bool first)
{
    printf("%s\n{\"key\":", first ? "" : ",");
    json_str(t->key, t->key_len);
    printf(",\"id\":%" PRIu64 ",\"state\":\"%s\",\"tube\":", j->id,
           states[j->state]);
    json_str(j->tube, j->tube_len);
    printf(",\"pri\":%" PRIu32 ",\"delay_s\":%" PRIu32 ",\"ttr_s\":%" PRIu32
           ",\"due_ms\":%" PRId64 ",\"created_ms\":%" PRId64
           ",\"reserves\":%" PRIu32 ",\"timeouts\":%" PRIu32
           ",\"releases\":%" PRIu32 ",\"buries\":%" PRIu32 ",\"kicks\":%" PRIu32
           ",\"node\":%" PRIu32 ",\"body_len\":%" PRIu32 ",\"body\":",
           j->pri, j->delay, j->ttr, j->due, j->created, j->cnt[0], j->cnt[1],
           j->cnt[2], j->cnt[3], j->cnt[4], j->node, j->body_len);
    json_str(j->body, j->body_len);
    putchar('}');
}

static void job_human(const struct job *j)
{
    char due[40] = "-"; /* not delayed */
    if (j->due > 0)
        iso(j->due, due, sizeof due);
    printf("%-12" PRIu64 " %-8s %-10.*s pri %-10" PRIu32 " ttr %-6" PRIu32
           " due %-24s r/t/rl/b/k %" PRIu32 "/%" PRIu32 "/%" PRIu32 "/%" PRIu32
           "/%" PRIu32 "  body %" PRIu32 " bytes: ",
           j->id, states[j->state], (int)j->tube_len, (const char *)j->tube,
           j->pri, j->ttr, due, j->cnt[0], j->cnt[1], j->cnt[2], j->cnt[3],
           j->cnt[4], j->body_len);
    human_str(j->body, j->body_len < 40 ? j->body_len : 40);
    puts(j->body_len > 40 ? "..." : "");
}

/* First pass of a page (--limit): the ids of the jobs above --after. */
static int jobs_ids(void *arg, const tw_durable_scanned *t)
{
    struct jobs_walk *w = arg;
    struct job j;
    const unsigned char *k = t->key;
    if (t->key_len < 2 || k[0] != 'j' ||
        !job_parse(t->payload, t->payload_len, &j) || j.id <= w->after)
        return 0;
    if (w->n == w->cap) {
        size_t ncap = w->cap ? 2 * w->cap : 1024;
        uint64_t *v = realloc(w->ids, ncap * sizeof(*v));
        if (!v) {
            w->oom = true;
            return 1;
        }
        w->ids = v;
        w->cap = ncap;
    }
    w->ids[w->n++] = j.id;
    return 0;
}

static int cmp_id(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* --limit N [--after ID]: the page's bound into w->upto (UINT64_MAX: the
 * page holds the rest); false on an error (said). */
static bool jobs_page(tw_durable *d, struct jobs_walk *w)
{
    w->upto = UINT64_MAX;
    if (!w->o->limit)
        return true;
    long n = tw_durable_scan(d, jobs_ids, w);
    if (n < 0 || w->oom) {
        fprintf(stderr, "twheel: jobs: %s\n",
                tw_strerror(w->oom ? TW_ENOMEM : (int)n));
        return false;
    }
    if (w->n > w->o->limit) {
        qsort(w->ids, w->n, sizeof(*w->ids), cmp_id);
        w->upto = w->ids[w->o->limit - 1];
    }
    return true;
}

static int jobs_one(void *arg, const tw_durable_scanned *t)
{
    struct jobs_walk *w = arg;
    const unsigned char *k = t->key;
    struct job j;
    if (t->key_len > 1 && k[0] == 'j' &&
        job_parse(t->payload, t->payload_len, &j) &&
        (j.id <= w->after || j.id > w->upto)) {
        return 0; /* not on this page */
    } else if (t->key_len > 1 && k[0] == 'j') {
        if (!job_parse(t->payload, t->payload_len, &j)) {
            w->unreadable++;
            fprintf(stderr, "twheel: %.*s: not a job record twheel reads\n",
                    (int)t->key_len, (const char *)k);
            return 0;
        }
        if (w->o->json)
            job_json(&j, t, w->jobs == 0);
        else
            job_human(&j);
        w->jobs++;
    } else if (t->key_len >= 1 && k[0] == 'm') {
        w->marks++;
    } else {
        w->other++;
    }
    return 0;
}

/* twheel jobs: the jobs of a twheeld store, decoded, in no order; with
 * --limit N the N of lowest ids above --after ID. */
int cmd_jobs(const struct opts *o, tw_durable *d)
{
    struct jobs_walk w = {.o = o};
    char *end = NULL;
    if (o->after_arg) {
        errno = 0;
        w.after = strtoull(o->after_arg, &end, 10);
        if (errno || end == o->after_arg || *end) {
            fprintf(stderr, "twheel: bad --after: %s (jobs: an id)\n",
                    o->after_arg);
            return EX_ERROR;
        }
    }
    bool paged = jobs_page(d, &w);
    free(w.ids);
    if (!paged)
        return EX_ERROR;
    if (o->json)
        fputs("{\"jobs\":[", stdout);
    long n = tw_durable_scan(d, jobs_one, &w);
    if (n < 0) {
        if (o->json)
            puts("]}");
        fprintf(stderr, "twheel: jobs: %s\n", tw_strerror((int)n));
        return EX_ERROR;
    }
    if (o->json && w.upto != UINT64_MAX)
        printf("\n],\"after\":%" PRIu64, w.upto);
    else if (o->json)
        fputs("\n],\"after\":null", stdout);
    if (o->json)
        printf(",\"count\":%" PRIu64 ",\"id_marks\":%" PRIu64
               ",\"other\":%" PRIu64 ",\"unreadable\":%" PRIu64 "}\n",
               w.jobs, w.marks, w.other, w.unreadable);
    else if (w.upto != UINT64_MAX)
        printf("(more: --after %" PRIu64 ")\n", w.upto);
    if (!w.jobs && !w.marks)
        fprintf(stderr, "twheel: warning: %s: no twheeld job here\n", where(o));
    return w.unreadable ? EX_PROBLEM : EX_OK;
}
