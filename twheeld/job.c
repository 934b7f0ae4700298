/* SPDX-License-Identifier: MIT */
/*
 * job.c - twheeld: job memory, the job table by id, job states, bodies in and
 * out of memory.
 *
 * Jobs: a hash table by id; in its tube, a ready job sits in a binary heap
 * ordered by (priority, id) (the ready queue, as in beanstalkd; no time is
 * kept there), a buried job in a list, a reserved job in its reserver's
 * list, and every delayed job has an entry in s->dq by (due, id)
 * (delayed.c). With a store (-b, --redis) a delayed job whose record the
 * store holds is that entry alone: the store fires it.
 */
#define _GNU_SOURCE
#include "tbd.h"

#include "delayq.h"

/* ---- job memory ---- */

#define JOB_CHUNK 4096 /* jobs per allocation */

static struct job *job_free_list;

/* A zeroed job, from chunks of JOB_CHUNK that are kept until exit (no
 * allocator header a job); NULL when out of memory. */
struct job *tbd_job_alloc(void)
{
    if (!job_free_list) {
        struct job *chunk = malloc(JOB_CHUNK * sizeof(*chunk));
        if (!chunk)
            return NULL;
        for (size_t i = 0; i < JOB_CHUNK; i++) {
            chunk[i].h_next = job_free_list;
            job_free_list = &chunk[i];
        }
    }
    struct job *j = job_free_list;
    job_free_list = j->h_next;
    memset(j, 0, sizeof(*j));
    return j;
}

void tbd_job_release(struct server *s, struct job *j)
{
    s->bodies -= j->body != NULL;
    free(j->body);
    j->body = NULL;
    j->h_next = job_free_list;
    job_free_list = j;
}

/* ---- job table ---- */

static size_t hash_id(uint64_t id, size_t cap)
{
    return (size_t)((id * UINT64_C(0x9E3779B97F4A7C15)) >> 20) & (cap - 1);
}

struct job *tbd_job_find(struct server *s, uint64_t id)
{
    for (struct job *j = s->jobs[hash_id(id, s->jcap)]; j; j = j->h_next)
        if (j->id == id)
            return j;
    return NULL;
}

void tbd_job_table_insert(struct job *j)
{
    struct server *s = j->tube->srv;
    if (s->njobs + 1 > s->jcap) {
        size_t ncap = s->jcap * 2;
        struct job **nt = calloc(ncap, sizeof(*nt));
        if (nt) {
            for (size_t i = 0; i < s->jcap; i++) {
                for (struct job *e = s->jobs[i], *nx; e; e = nx) {
                    nx = e->h_next;
                    size_t h = hash_id(e->id, ncap);
                    e->h_next = nt[h];
                    nt[h] = e;
                }
            }
            free(s->jobs);
            s->jobs = nt;
            s->jcap = ncap;
        }
    }
    size_t h = hash_id(j->id, s->jcap);
    j->h_next = s->jobs[h];
    s->jobs[h] = j;
    s->njobs++;
}

/* Room for @n jobs without a rehash (best effort: at start-up). */
void tbd_job_table_reserve(struct server *s, uint64_t n)
{
    size_t cap = s->jcap;
    while (cap < n && cap < ((size_t)1 << 40))
        cap *= 2;
    if (cap == s->jcap || s->njobs)
        return;
    struct job **nt = calloc(cap, sizeof(*nt));
    if (nt) {
        free(s->jobs);
        s->jobs = nt;
        s->jcap = cap;
    }
}

void tbd_job_table_remove(struct job *j)
{
    struct server *s = j->tube->srv;
    struct job **pp = &s->jobs[hash_id(j->id, s->jcap)];
    while (*pp != j)
        pp = &(*pp)->h_next;
    *pp = j->h_next;
    s->njobs--;
}

/* ---- job states ---- */

/* Puts @j (in no list) into its tube's ready queue. */
void tbd_job_make_ready(struct job *j)
{
    struct server *s = j->tube->srv;
    j->state = J_READY;
    s->counts[J_READY]++;
    tbd_heap_push(j->tube, j);
    if (j->pri < URGENT)
        j->tube->nurgent++;
    s->nready_total++;
    s->queue_dirty = true;
}

/* Takes @j out of whatever list or queue its state keeps it in. */
void tbd_job_unlink(struct job *j)
{
    struct server *s = j->tube->srv;
    tw_wheel_cancel(s->wheel, &j->timer);
    if (j->state != J_DELAYED) /* delayed ones: tbd_dq_total(s->dq) */
        s->counts[j->state]--;
    switch (j->state) {
    case J_READY:
        tbd_heap_remove(j->tube, j);
        if (j->pri < URGENT)
            j->tube->nurgent--;
        s->nready_total--;
        break;
    case J_DELAYED:
        tbd_dq_remove(s->dq, j->id);
        break;
    case J_BURIED:
        tbd_jl_remove(&j->tube->buried, j);
        break;
    case J_RESERVED:
        tbd_jl_remove(&j->reserver->reserved, j);
        j->tube->nreserved--;
        j->reserver = NULL;
        break;
    }
}

void tbd_job_make_buried(struct job *j)
{
    struct server *s = j->tube->srv;
    j->state = J_BURIED;
    s->counts[J_BURIED]++;
    tbd_jl_push(&j->tube->buried, j);
}

void tbd_job_free(struct job *j)
{
    struct server *s = j->tube->srv;
    struct tube *t = j->tube;
    tbd_job_table_remove(j);
    tbd_job_release(s, j);
    tbd_tube_maybe_free(t);
}

/* Drops @j's body from memory when the store holds it and nothing here
 * needs it: a buried job with no write under way. */
void tbd_job_evict(struct job *j)
{
    struct server *s = j->tube->srv;
    if (s->store && j->stored && j->writes == 0 && j->body &&
        j->state == J_BURIED) {
        free(j->body);
        j->body = NULL;
        s->bodies--;
    }
}

/* The body of @j, read back from the store, into a new block (body_len
 * bytes and "\r\n"); NULL, logged, when the store does not have it. */
char *tbd_body_from_store(const struct job *j)
{
    struct server *s = j->tube->srv;
    char key[24];
    size_t kl = (size_t)snprintf(key, sizeof(key), "j%" PRIu64, j->id);
    size_t cap = tbd_rec_size(TBD_TUBE_NAME_MAX, j->body_len);
    size_t len = 0;
    unsigned char *p = malloc(cap);
    char *body = malloc((size_t)j->body_len + 2);
    int rc =
        p && body ? tbd_store_get(s->store, key, kl, p, cap, &len) : TW_ENOMEM;
    struct rec r;
    if (rc == 0 && (len > cap || !tbd_rec_parse(p, len, &r) || r.id != j->id ||
                    r.body_len != j->body_len))
        rc = TW_EIO;
    if (rc == 0) {
        memcpy(body, r.body, j->body_len);
        memcpy(body + j->body_len, "\r\n", 2);
    } else {
        tbd_logv(s, 0, "job %" PRIu64 ": cannot read its body back: %s", j->id,
                 tw_strerror(rc));
        free(body);
        body = NULL;
    }
    free(p);
    return body;
}

/* Makes sure @j's body is in memory; false (logged) if it cannot be. */
bool tbd_job_load_body(struct job *j)
{
    struct server *s = j->tube->srv;
    if (!j->body) {
        j->body = tbd_body_from_store(j);
        s->bodies += j->body != NULL;
    }
    return j->body != NULL;
}
