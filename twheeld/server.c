/* SPDX-License-Identifier: MIT */
/*
 * server.c - twheeld: the beanstalkd protocol on one epoll event loop.
 *
 * One thread owns everything below: connections, tubes, jobs and a
 * twheel wheel (wheel.h) ticking in milliseconds of CLOCK_MONOTONIC that
 * holds every delay, TTR, reserve timeout and tube pause. The only other
 * thread is the durable store's writer (store.c).
 *
 * Jobs: a hash table by id; in its tube, a ready job sits in a binary heap
 * ordered by (priority, id) (the ready queue, as in beanstalkd; no time is
 * kept there), a delayed or buried job in a list, a reserved job in its
 * reserver's list. With a store (-b, --redis) a delayed job is not in
 * memory at all: the store holds and fires it ("delayed jobs in the
 * store" below).
 *
 * Memory per connection is bounded: a line is at most TBD_LINE_MAX bytes,
 * a body at most -z bytes (JOB_TOO_BIG beyond), the input buffer is
 * allocated only while it holds bytes, and a connection whose unsent
 * replies pass OUT_CAP bytes is not read from (nor are its buffered
 * commands run) until the client reads them: a client that never reads
 * costs OUT_CAP plus one reply, and TCP pushes back on it.
 *
 * Durability (-b): a command that changes what a crash must see (put,
 * release, bury, kick, kick-job, delete) queues a write to the store and
 * its reply waits in the connection's output, in order, until the write
 * is back; replies after it wait too. The change itself is made in memory
 * at once, so other connections may see a job (reserve it) before its put
 * is durable; its INSERTED is never sent before.
 */
#define _GNU_SOURCE
#include "server.h"

#include "proto.h"
#include "store.h"
#include "twheel/wheel.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#define IN_CAP 16384           /* input buffer, allocated while in use */
#define OUT_CAP (256u * 1024u) /* unsent reply bytes before backpressure */
#define CHUNK 4096             /* reply chunk size (bigger for bodies) */
#define URGENT 1024u           /* priority below which a job is urgent */
#define SAFETY_MS 1000         /* DEADLINE_SOON margin, as beanstalkd */
#define ID_BLOCK 1024          /* ids issued per high-water-mark write */
#define NODE_SHIFT 40          /* --node N: ids N * 2^40 + 1 ... (< 2^53) */

enum jstate { J_READY, J_DELAYED, J_RESERVED, J_BURIED };
static const char *const state_name[] = {"ready", "delayed", "reserved",
                                         "buried"};

struct conn;
struct tube;

/*
 * A job: 168 bytes on LP64, from job_alloc()'s chunks, and its body in a
 * separate block. With a store (-b), the body of a delayed or buried job
 * whose record the store holds is not kept in memory (job_evict()): it is
 * read back from the store when the job becomes ready or is peeked at
 * (job_load_body()). Bodies never change, so any record of the job the
 * store holds has it. That is what a million delayed jobs cost: the
 * store's key table and this struct, without the bodies.
 */
struct job {
    uint64_t id;
    uint32_t pri, ttr_s, delay_s;
    uint32_t body_len;
    uint8_t state;
    bool soon_phase;   /* reserved: timer is at deadline - SAFETY_MS */
    bool stored;       /* a store write of it succeeded */
    bool timed;        /* taken from the store while delayed: its record
                          may fire until a write of it is done */
    uint8_t writes;    /* its store writes under way (saturating) */
    uint32_t heap_idx; /* in the tube's ready heap */
    struct tube *tube;
    int64_t created_wall; /* Unix ms of the put */
    int64_t due_wall;     /* delayed: Unix ms it becomes ready */
    uint64_t deadline;    /* delayed/reserved: monotonic ms */
    tw_timer timer;       /* delay, or TTR (soon phase, then deadline) */
    struct conn *reserver;
    struct job *l_next, *l_prev; /* tube's delayed/buried or conn's list */
    struct job *h_next;          /* id hash chain; job_alloc()'s free list */
    uint32_t reserves, timeouts, releases, buries, kicks;
    char *body; /* body_len bytes, then "\r\n"; NULL when evicted */
};

struct jlist {
    struct job *head, *tail;
    uint64_t n;
};

struct tube {
    struct tube *next;
    size_t name_len;
    char name[TBD_TUBE_NAME_MAX + 1];
    struct job **heap; /* ready jobs by (pri, id) */
    size_t nready, cap;
    uint64_t nurgent, nreserved, total_jobs;
    struct jlist delayed, buried;
    uint64_t ncold; /* delayed jobs held by the store alone (-b, --redis) */
    /* Of those, the first ones by (due, id): see cold_add(). */
    struct tbd_hit *first; /* FIRST_MAX entries once used */
    uint32_t nfirst;
    bool first_known; /* first[] holds every one up to first_bound */
    struct tbd_hit first_bound;
    uint64_t cold_adds; /* delayed jobs added to the store, ever */
    uint64_t using, watching, waiting;
    uint64_t cmd_delete, cmd_pause;
    uint32_t pause_s;
    uint64_t pause_until; /* monotonic ms; 0 = not paused */
    tw_timer pause_timer;
};

struct out {
    struct out *next;
    size_t len, off, cap;
    bool ready; /* false while its store write is under way */
    char data[];
};

struct conn {
    int fd;
    uint32_t events; /* epoll interest now */
    char *in;        /* IN_CAP bytes while in use, else NULL */
    size_t in_len, in_off;
    int in_state;        /* IN_LINE, IN_BODY, IN_SKIP */
    struct job *put_job; /* IN_BODY: the job being read */
    size_t body_got;
    uint64_t skip_left;
    const char *skip_reply;
    struct tube *use;
    struct tube **watch;
    size_t nwatch;
    struct out *out_head, *out_tail;
    size_t out_bytes;
    struct jlist reserved;
    bool waiting;
    tw_timer wait_timer;
    struct conn *w_next, *w_prev; /* waiting list */
    int pending_writes;
    bool closed; /* socket gone; freed with its last pending write */
    bool close_after_flush;
    bool producer, worker;
    struct conn *dead_next; /* closed, on g.dead until freed */
};

enum { IN_LINE, IN_BODY, IN_SKIP, IN_DISCARD };

static struct server {
    const struct tbd_options *opt;
    int ep, lfd, sfd;
    tw_wheel *wheel;
    struct tbd_store *store;
    struct tube *tubes;
    struct tube *default_tube;
    uint64_t ntubes;
    struct job **jobs; /* hash by id */
    size_t jcap, njobs;
    uint64_t next_id, id_mark; /* ids <= id_mark may be issued freely */
    struct conn *w_head, *w_tail;
    struct conn *dead;     /* closed connections, freed by reap() */
    uint64_t nready_total; /* ready jobs in all tubes */
    bool queue_dirty;
    bool draining;
    uint64_t cmd[TBD_OP_COUNT];
    uint64_t job_timeouts, total_jobs, total_conns, cur_conns;
    uint64_t producers, workers, waiting;
    uint64_t counts[4];  /* jobs by state */
    uint64_t bodies;     /* job bodies in memory (the rest are in the store) */
    uint64_t unreadable; /* store records skipped or set aside (hostile) */
    /* --redis takeovers: the query out (or NULL) and the dead nodes that
     * wait for the next one, sorted (takeover_start()). */
    struct tbd_query *take_q;
    uint32_t *take_wait;
    size_t ntake_wait, take_wait_cap;
    int mfd;         /* --metrics-port listener, or -1 */
    unsigned nmconn; /* its connections open */
    uint64_t started_mono;
    tw_timer live_timer; /* --redis: renews this server's liveness record */
    char server_id[17];
    struct utsname uts;
} g;

/* ---- clocks ---- */

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void logv(int level, const char *fmt, ...)
{
    if (g.opt && g.opt->verbose < level)
        return;
    va_list ap;
    va_start(ap, fmt);
    fputs("twheeld: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n);
    if (!p) {
        fputs("twheeld: out of memory\n", stderr);
        abort();
    }
    return p;
}

/* ---- lists ---- */

static void jl_push(struct jlist *l, struct job *j)
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

static void jl_remove(struct jlist *l, struct job *j)
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

/* ---- job memory ---- */

#define JOB_CHUNK 4096 /* jobs per allocation */

static struct job *job_free_list;

/* A zeroed job, from chunks of JOB_CHUNK that are kept until exit (no
 * allocator header a job); NULL when out of memory. */
static struct job *job_alloc(void)
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

static void job_release(struct job *j)
{
    g.bodies -= j->body != NULL;
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

static struct job *job_find(uint64_t id)
{
    for (struct job *j = g.jobs[hash_id(id, g.jcap)]; j; j = j->h_next)
        if (j->id == id)
            return j;
    return NULL;
}

static void job_table_insert(struct job *j)
{
    if (g.njobs + 1 > g.jcap) {
        size_t ncap = g.jcap * 2;
        struct job **nt = calloc(ncap, sizeof(*nt));
        if (nt) {
            for (size_t i = 0; i < g.jcap; i++) {
                for (struct job *e = g.jobs[i], *nx; e; e = nx) {
                    nx = e->h_next;
                    size_t h = hash_id(e->id, ncap);
                    e->h_next = nt[h];
                    nt[h] = e;
                }
            }
            free(g.jobs);
            g.jobs = nt;
            g.jcap = ncap;
        }
    }
    size_t h = hash_id(j->id, g.jcap);
    j->h_next = g.jobs[h];
    g.jobs[h] = j;
    g.njobs++;
}

/* Room for @n jobs without a rehash (best effort: at start-up). */
static void job_table_reserve(uint64_t n)
{
    size_t cap = g.jcap;
    while (cap < n && cap < ((size_t)1 << 40))
        cap *= 2;
    if (cap == g.jcap || g.njobs)
        return;
    struct job **nt = calloc(cap, sizeof(*nt));
    if (nt) {
        free(g.jobs);
        g.jobs = nt;
        g.jcap = cap;
    }
}

static void job_table_remove(struct job *j)
{
    struct job **pp = &g.jobs[hash_id(j->id, g.jcap)];
    while (*pp != j)
        pp = &(*pp)->h_next;
    *pp = j->h_next;
    g.njobs--;
}

/* ---- ready heap ---- */

static bool job_less(const struct job *a, const struct job *b)
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
        if (!job_less(j, t->heap[p]))
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
        if (c + 1 < t->nready && job_less(t->heap[c + 1], t->heap[c]))
            c++;
        if (!job_less(t->heap[c], j))
            break;
        heap_set(t, i, t->heap[c]);
        i = c;
    }
    heap_set(t, i, j);
}

static void heap_push(struct tube *t, struct job *j)
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

static void heap_remove(struct tube *t, struct job *j)
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

static struct tube *tube_find(const char *name, size_t len)
{
    for (struct tube *t = g.tubes; t; t = t->next)
        if (t->name_len == len && memcmp(t->name, name, len) == 0)
            return t;
    return NULL;
}

static struct tube *tube_get(const char *name, size_t len)
{
    struct tube *t = tube_find(name, len);
    if (t)
        return t;
    t = calloc(1, sizeof(*t));
    if (!t)
        return NULL;
    memcpy(t->name, name, len);
    t->name_len = len;
    /* No delayed job yet: first[] (empty) holds all of them. */
    t->first_known = true;
    t->first_bound = (struct tbd_hit){INT64_MAX, UINT64_MAX};
    tw_timer_init(&t->pause_timer, tube_unpause, t);
    t->next = g.tubes;
    g.tubes = t;
    g.ntubes++;
    return t;
}

/* Frees @t if nothing refers to it any more (beanstalkd's tube lifetime). */
static void tube_maybe_free(struct tube *t)
{
    if (t == g.default_tube || t->using || t->watching || t->nready ||
        t->nreserved || t->delayed.n || t->ncold || t->buried.n)
        return;
    struct tube **pp = &g.tubes;
    while (*pp != t)
        pp = &(*pp)->next;
    *pp = t->next;
    tw_wheel_cancel(g.wheel, &t->pause_timer);
    free(t->heap);
    free(t->first);
    free(t);
    g.ntubes--;
}

static bool tube_paused(const struct tube *t)
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

/* ---- output ---- */

static struct out *out_new(size_t cap)
{
    struct out *o = xmalloc(sizeof(*o) + cap);
    o->next = NULL;
    o->len = o->off = 0;
    o->cap = cap;
    o->ready = true;
    return o;
}

static void out_link(struct conn *c, struct out *o)
{
    if (c->out_tail)
        c->out_tail->next = o;
    else
        c->out_head = o;
    c->out_tail = o;
}

/* Appends bytes to the reply stream. */
static void reply_raw(struct conn *c, const void *p, size_t n)
{
    if (c->closed)
        return;
    struct out *o = c->out_tail;
    if (!o || !o->ready || o->cap - o->len < n) {
        o = out_new(n > CHUNK ? n : CHUNK);
        out_link(c, o);
    }
    memcpy(o->data + o->len, p, n);
    o->len += n;
    c->out_bytes += n;
}

static void reply(struct conn *c, const char *s)
{
    reply_raw(c, s, strlen(s));
}

static void replyf(struct conn *c, const char *fmt, ...)
{
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n > 0)
        reply_raw(c, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf));
}

/* A reply that waits for a store write: its own chunk, not ready yet. */
static struct out *reply_held(struct conn *c, const char *s)
{
    size_t n = strlen(s);
    struct out *o = out_new(n < 32 ? 32 : n);
    memcpy(o->data, s, n);
    o->len = n;
    o->ready = false;
    out_link(c, o);
    c->out_bytes += n;
    return o;
}

/* ---- connections ---- */

static void conn_update_events(struct conn *c)
{
    if (c->closed)
        return;
    uint32_t ev = 0;
    if (!c->close_after_flush && c->out_bytes < OUT_CAP)
        ev |= EPOLLIN;
    if (c->out_head && c->out_head->ready)
        ev |= EPOLLOUT;
    if (ev == c->events)
        return;
    struct epoll_event e = {.events = ev, .data.ptr = c};
    epoll_ctl(g.ep, EPOLL_CTL_MOD, c->fd, &e);
    c->events = ev;
}

static void conn_free(struct conn *c)
{
    for (struct out *o = c->out_head, *nx; o; o = nx) {
        nx = o->next;
        free(o);
    }
    free(c->in);
    free(c->watch);
    free(c);
}

static void job_make_ready(struct job *j);
static void job_undate(struct job *j);
static void waiting_remove(struct conn *c);
static void conn_pump(struct conn *c);

static void conn_close(struct conn *c)
{
    if (c->closed)
        return;
    logv(2, "close fd %d", c->fd);
    epoll_ctl(g.ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->closed = true;
    g.cur_conns--;
    if (c->producer)
        g.producers--;
    if (c->worker)
        g.workers--;
    waiting_remove(c);
    while (c->reserved.head) {
        struct job *j = c->reserved.head;
        jl_remove(&c->reserved, j);
        tw_wheel_cancel(g.wheel, &j->timer);
        j->tube->nreserved--;
        g.counts[J_RESERVED]--;
        j->reserver = NULL;
        job_make_ready(j);
        job_undate(j);
    }
    if (c->put_job) {
        job_release(c->put_job);
        c->put_job = NULL;
    }
    if (c->use) {
        c->use->using --;
        tube_maybe_free(c->use);
    }
    for (size_t i = 0; i < c->nwatch; i++) {
        c->watch[i]->watching--;
        tube_maybe_free(c->watch[i]);
    }
    c->use = NULL;
    c->nwatch = 0;
    /* Freed by reap() at the end of the loop iteration, never here: the
     * callers, and later events of the same epoll batch, still hold it. */
    c->dead_next = g.dead;
    g.dead = c;
}

/* Frees the closed connections whose store writes have all come back. */
static void reap(void)
{
    struct conn **pp = &g.dead;
    while (*pp) {
        struct conn *c = *pp;
        if (c->pending_writes == 0) {
            *pp = c->dead_next;
            conn_free(c);
        } else {
            pp = &c->dead_next;
        }
    }
}

/* Writes what is ready; closes the connection on an error. */
static void conn_flush(struct conn *c)
{
    while (!c->closed && c->out_head && c->out_head->ready) {
        struct iovec iov[64];
        int n = 0;
        for (struct out *o = c->out_head; o && o->ready && n < 64;
             o = o->next) {
            iov[n].iov_base = o->data + o->off;
            iov[n].iov_len = o->len - o->off;
            n++;
        }
        ssize_t w = writev(c->fd, iov, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            conn_close(c);
            return;
        }
        c->out_bytes -= (size_t)w;
        while (w > 0) {
            struct out *o = c->out_head;
            size_t left = o->len - o->off;
            if ((size_t)w < left) {
                o->off += (size_t)w;
                break;
            }
            w -= (ssize_t)left;
            c->out_head = o->next;
            if (!c->out_head)
                c->out_tail = NULL;
            free(o);
        }
    }
    if (c->closed)
        return;
    if (c->close_after_flush && !c->out_head && c->pending_writes == 0) {
        conn_close(c);
        return;
    }
    conn_update_events(c);
}

/* ---- job states ---- */

static void job_timer_fn(tw_timer *tm, void *arg);

/* Puts @j (in no list) into its tube's ready queue. */
static void job_make_ready(struct job *j)
{
    j->state = J_READY;
    g.counts[J_READY]++;
    heap_push(j->tube, j);
    if (j->pri < URGENT)
        j->tube->nurgent++;
    g.nready_total++;
    g.queue_dirty = true;
}

/* Takes @j out of whatever list or queue its state keeps it in. */
static void job_unlink(struct job *j)
{
    tw_wheel_cancel(g.wheel, &j->timer);
    g.counts[j->state]--;
    switch (j->state) {
    case J_READY:
        heap_remove(j->tube, j);
        if (j->pri < URGENT)
            j->tube->nurgent--;
        g.nready_total--;
        break;
    case J_DELAYED:
        jl_remove(&j->tube->delayed, j);
        break;
    case J_BURIED:
        jl_remove(&j->tube->buried, j);
        break;
    case J_RESERVED:
        jl_remove(&j->reserver->reserved, j);
        j->tube->nreserved--;
        j->reserver = NULL;
        break;
    }
}

static void job_make_delayed(struct job *j, uint32_t delay_s, uint64_t now)
{
    j->state = J_DELAYED;
    g.counts[J_DELAYED]++;
    j->delay_s = delay_s;
    j->deadline = now + (uint64_t)delay_s * 1000u;
    j->due_wall = wall_ms() + (int64_t)delay_s * 1000;
    jl_push(&j->tube->delayed, j);
    tw_wheel_add(g.wheel, &j->timer, j->deadline);
}

static void job_make_buried(struct job *j)
{
    j->state = J_BURIED;
    g.counts[J_BURIED]++;
    jl_push(&j->tube->buried, j);
}

static void job_free(struct job *j)
{
    struct tube *t = j->tube;
    job_table_remove(j);
    job_release(j);
    tube_maybe_free(t);
}

/* The store record of @j: see store.c for the encoding's purpose. */
/* Version 2 of a job record ends with the node (--node) of the server
 * that holds the job; version 1 (without it) is still read. */
enum { REC_JOB = 'J', REC_MARK = 'M', REC_VERSION = 2 };

static void put_u32(unsigned char **p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        *(*p)++ = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char **p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        *(*p)++ = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}

static uint64_t get_u64(const unsigned char *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

#define REC_HEAD (3 + 4 * 3 + 8 * 3 + 4 * 5 + 1 + 4)

static struct tbd_write *write_new(int kind, struct conn *c)
{
    struct tbd_write *w = calloc(1, sizeof(*w));
    if (!w)
        abort();
    w->kind = kind;
    w->owner = c;
    return w;
}

/* Queues the record of @j (state as a crash should find it). */
static struct tbd_write *job_write(struct job *j, int stored_state,
                                   struct conn *c)
{
    struct tbd_write *w = write_new(TBD_W_SCHED, c);
    w->key_len = (size_t)snprintf(w->key, sizeof(w->key), "j%" PRIu64, j->id);
    if (j->writes < UINT8_MAX)
        j->writes++;
    size_t n = REC_HEAD + j->tube->name_len + j->body_len + 4;
    unsigned char *p = xmalloc(n), *q = p;
    *q++ = REC_JOB;
    *q++ = REC_VERSION;
    *q++ = (unsigned char)stored_state;
    put_u32(&q, j->pri);
    put_u32(&q, j->ttr_s);
    put_u32(&q, j->delay_s);
    put_u64(&q, j->id);
    put_u64(&q, (uint64_t)j->due_wall);
    put_u64(&q, (uint64_t)j->created_wall);
    put_u32(&q, j->reserves);
    put_u32(&q, j->timeouts);
    put_u32(&q, j->releases);
    put_u32(&q, j->buries);
    put_u32(&q, j->kicks);
    *q++ = (unsigned char)j->tube->name_len;
    memcpy(q, j->tube->name, j->tube->name_len);
    q += j->tube->name_len;
    put_u32(&q, j->body_len);
    memcpy(q, j->body, j->body_len);
    q += j->body_len;
    put_u32(&q, g.opt->node);
    w->payload = p;
    w->payload_len = n;
    return w;
}

/*
 * Sends @w to the store with @text as the reply it holds back; without a
 * store the reply goes at once.
 */
static void submit(struct conn *c, struct tbd_write *w, const char *text)
{
    if (!g.store) {
        free(w->payload);
        free(w);
        if (text)
            reply(c, text);
        return;
    }
    if (text)
        w->tag = (uint64_t)(uintptr_t)reply_held(c, text);
    if (c)
        c->pending_writes++;
    tbd_store_submit(g.store, w);
}

static void store_job(struct conn *c, struct job *j, const char *text)
{
    if (!g.store) {
        reply(c, text);
        return;
    }
    int st = j->state == J_RESERVED ? J_READY : j->state;
    submit(c, job_write(j, st, c), text);
}

/* The store key of this server's high-water mark of ids: "m", or with
 * --node N > 0 "m<N>" (each server its own). */
static size_t mark_key(char *buf, size_t len)
{
    if (g.opt->node == 0)
        return (size_t)snprintf(buf, len, "m");
    return (size_t)snprintf(buf, len, "m%" PRIu32, g.opt->node);
}

/* Issues the next job id; raises the stored high-water mark first. */
static uint64_t next_job_id(void)
{
    uint64_t id = g.next_id++;
    if (id > g.id_mark && g.store) {
        g.id_mark = id + ID_BLOCK;
        struct tbd_write *w = write_new(TBD_W_SCHED, NULL);
        w->key_len = mark_key(w->key, sizeof(w->key));
        unsigned char *p = xmalloc(10), *q = p;
        *q++ = REC_MARK;
        *q++ = REC_VERSION;
        put_u64(&q, g.id_mark);
        w->payload = p;
        w->payload_len = 10;
        tbd_store_submit(g.store, w);
    }
    return id;
}

/*
 * A record read back from the store that is not what this server writes
 * (whoever wrote it): counted, and logged with its key (its first 32
 * bytes, bytes outside printable ASCII as '?'), at most UNREADABLE_LOGS
 * a minute, so that a flood of them cannot flood the log.
 */
#define UNREADABLE_LOGS 10
static void unreadable(const char *key, size_t key_len, const char *what)
{
    static uint64_t minute, logged, quiet;
    uint64_t now = mono_ms() / 60000;
    g.unreadable++;
    if (now != minute) {
        if (quiet)
            logv(0,
                 "%" PRIu64 " more unreadable store records not logged "
                 "(twheeld_store_unreadable_total)",
                 quiet);
        minute = now;
        logged = quiet = 0;
    }
    if (logged >= UNREADABLE_LOGS) {
        quiet++;
        return;
    }
    logged++;
    char k[33];
    size_t n = key_len < 32 ? key_len : 32;
    for (size_t i = 0; i < n; i++)
        k[i] = key[i] >= 0x20 && key[i] < 0x7f ? key[i] : '?';
    k[n] = '\0';
    logv(0, "store record %s: %s", k, what);
}

/* The number of @len bytes at @s, decimal digits without a leading zero
 * (but "0"), if it is at most @max; else -1. */
static int64_t key_num(const char *s, size_t len, uint64_t max)
{
    if (len == 0 || len > 20 || (s[0] == '0' && len > 1))
        return -1;
    uint64_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -1;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (max - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    return (int64_t)v;
}

/*
 * --redis: liveness. Each server keeps the record "n<node>" due LIVE_MS
 * ahead of now, rewritten every LIVE_RENEW_MS. When a server dies its
 * record fires LIVE_MS later on the owner of its shard, which takes over
 * the dead server's ready and buried jobs (takeover_start()); the store
 * delivers the record again every TBD_LIVE_RETRY_MS until the takeover
 * is done and cancels it. A server starting again waits until a takeover
 * of its jobs is over before it reads back the records that still name
 * it (live_wait()).
 */
#define LIVE_MS 10000
#define LIVE_RENEW_MS 2000
#define LIVE_GUARD_MS 2000 /* start-up: due this soon counts as run out */
#define LIVE_WAIT_MAX_MS (3 * LIVE_MS)
#define LIVE_LEN 14
/* A fired liveness record due further ahead than this was not written by
 * a server renewing it (LIVE_MS ahead of its clock): removed. */
#define LIVE_AHEAD_MAX_MS (10 * LIVE_MS)
enum { REC_LIVE = 'L' };

static size_t live_key(char *buf, size_t len, uint32_t node)
{
    return (size_t)snprintf(buf, len, "n%" PRIu32, node);
}

/* The payload of this server's liveness record due at @due. */
static unsigned char *live_payload(int64_t due)
{
    unsigned char *p = xmalloc(LIVE_LEN), *q = p;
    *q++ = REC_LIVE;
    *q++ = REC_VERSION;
    put_u32(&q, g.opt->node);
    put_u64(&q, (uint64_t)due);
    return p;
}

/*
 * The node and due time of the liveness record @p (@n bytes) under key
 * @key: true only for a record as live_payload() writes it, under the
 * key live_key() gives its node, due no later than @due_max (a record
 * due far ahead was not written by a server renewing it).
 */
static bool live_parse(const char *key, size_t key_len, const unsigned char *p,
                       size_t n, int64_t due_max, uint32_t *node, int64_t *due)
{
    if (n != LIVE_LEN || p[0] != REC_LIVE || p[1] < 2 || p[1] > REC_VERSION ||
        key_len < 2 || key[0] != 'n')
        return false;
    *node = get_u32(p + 2);
    *due = (int64_t)get_u64(p + 6);
    return key_num(key + 1, key_len - 1, UINT32_MAX) == (int64_t)*node &&
           *due <= due_max;
}

static void live_renew(void)
{
    struct tbd_write *w = write_new(TBD_W_SCHED, NULL);
    w->key_len = live_key(w->key, sizeof(w->key), g.opt->node);
    w->due_ms = wall_ms() + LIVE_MS;
    w->payload = live_payload(w->due_ms);
    w->payload_len = LIVE_LEN;
    tbd_store_submit(g.store, w);
}

static void live_fn(tw_timer *tm, void *arg)
{
    (void)arg;
    live_renew();
    tw_wheel_add(g.wheel, tm, tw_wheel_now(g.wheel) + LIVE_RENEW_MS);
}

/*
 * Start-up with --redis, before the jobs are read back: if this server's
 * previous liveness record ran out (or is about to), another server may
 * be taking its jobs over; wait until that takeover cancelled the record
 * (or until this server's own store fires it: no other server is
 * there), at most LIVE_WAIT_MAX_MS. Then write the record anew.
 */
static void live_wait(void)
{
    char key[24];
    size_t kl = live_key(key, sizeof(key), g.opt->node);
    uint64_t t0 = mono_ms();
    bool said = false;
    for (;;) {
        unsigned char p[LIVE_LEN];
        size_t len = 0;
        int rc = tbd_store_get(g.store, key, kl, p, sizeof(p), &len);
        if (rc == TW_ENOENT)
            break;
        uint32_t node;
        int64_t due;
        if (rc == 0 && !live_parse(key, kl, p, len, INT64_MAX, &node, &due)) {
            /* Not a record a takeover acts on (live_fired()). */
            unreadable(key, kl, "not a liveness record, written anew");
            break;
        }
        if (rc == 0 && due > wall_ms() + LIVE_GUARD_MS)
            break;
        if (tbd_store_fired_has(g.store, key, kl))
            break;
        if (mono_ms() - t0 > LIVE_WAIT_MAX_MS) {
            logv(0,
                 "liveness record %s: no takeover finished in %d ms, "
                 "going on",
                 key, LIVE_WAIT_MAX_MS);
            break;
        }
        if (!said)
            logv(0,
                 "liveness record %s ran out: waiting for the takeover "
                 "of this server's jobs",
                 key);
        said = true;
        usleep(100000);
    }
    int64_t due = wall_ms() + LIVE_MS;
    unsigned char *p = live_payload(due);
    int rc = tbd_store_put(g.store, key, kl, due, p, LIVE_LEN);
    if (rc != 0)
        logv(0, "liveness record %s: %s", key, tw_strerror(rc));
    free(p);
}

/* The id of store key "j<id>" (as job_write() spells it), or 0. */
static uint64_t key_id(const char *key, size_t len)
{
    if (len < 2 || key[0] != 'j')
        return 0;
    int64_t id = key_num(key + 1, len - 1, INT64_MAX);
    return id > 0 ? (uint64_t)id : 0;
}

/* A job record read back from the store (job_write()'s layout). */
struct rec {
    int state;
    uint32_t pri, ttr, delay, body_len;
    uint32_t cnt[5]; /* reserves, timeouts, releases, buries, kicks */
    uint32_t owner;  /* --node of the server that holds it */
    uint64_t id;
    int64_t due, created;
    const char *tube;
    size_t tube_len;
    const unsigned char *body;
};

/* The latest wall-clock time a job record may hold (Unix ms, about the
 * year 285,000): what job_write() writes is far below, and arithmetic on
 * anything below it cannot overflow. */
#define REC_TIME_MAX (INT64_C(1) << 53)

/*
 * Parses the @n bytes at @p into @r; false if they are not a job record
 * as job_write() writes it: lengths that add up, a known state, a tube
 * name a client may send, times in [0, REC_TIME_MAX], an id above 0.
 */
static bool rec_parse(const unsigned char *p, size_t n, struct rec *r)
{
    if (n < REC_HEAD || p[0] != REC_JOB || p[1] < 1 || p[1] > REC_VERSION ||
        p[2] > J_BURIED)
        return false;
    size_t tail = p[1] >= 2 ? 4 : 0; /* the owner */
    const unsigned char *q = p + 3;
    r->state = p[2];
    r->pri = get_u32(q);
    r->ttr = get_u32(q + 4);
    r->delay = get_u32(q + 8);
    q += 12;
    r->id = get_u64(q);
    r->due = (int64_t)get_u64(q + 8);
    r->created = (int64_t)get_u64(q + 16);
    q += 24;
    for (int i = 0; i < 5; i++, q += 4)
        r->cnt[i] = get_u32(q);
    r->tube_len = *q++;
    if ((size_t)(q - p) + r->tube_len + 4 > n ||
        !tbd_tube_name_ok((const char *)q, r->tube_len) || r->due < 0 ||
        r->due > REC_TIME_MAX || r->created < 0 || r->created > REC_TIME_MAX)
        return false;
    r->tube = (const char *)q;
    q += r->tube_len;
    r->body_len = get_u32(q);
    q += 4;
    r->body = q;
    if ((size_t)(q - p) + r->body_len + tail != n || r->id == 0)
        return false;
    r->owner =
        tail ? get_u32(q + r->body_len) : (uint32_t)(r->id >> NODE_SHIFT);
    return true;
}

/* A job (in no table, list or state count) from @r, its body with it
 * when @body; NULL when out of memory. */
static struct job *job_from_rec(const struct rec *r, bool body)
{
    struct tube *t = tube_get(r->tube, r->tube_len);
    struct job *j = t ? job_alloc() : NULL;
    char *b = body && j ? malloc((size_t)r->body_len + 2) : NULL;
    if (!j || (body && !b)) {
        if (j)
            job_release(j);
        if (t)
            tube_maybe_free(t);
        return NULL;
    }
    j->id = r->id;
    j->pri = r->pri;
    j->ttr_s = r->ttr ? r->ttr : 1;
    j->delay_s = r->delay;
    j->due_wall = r->due;
    j->created_wall = r->created;
    j->reserves = r->cnt[0];
    j->timeouts = r->cnt[1];
    j->releases = r->cnt[2];
    j->buries = r->cnt[3];
    j->kicks = r->cnt[4];
    j->body_len = r->body_len;
    j->stored = true;
    j->state = (uint8_t)r->state;
    if (b) {
        memcpy(b, r->body, r->body_len);
        memcpy(b + r->body_len, "\r\n", 2);
        j->body = b;
        g.bodies++;
    }
    j->tube = t;
    tw_timer_init(&j->timer, job_timer_fn, j);
    return j;
}

/* Drops @j's body from memory when the store holds it and nothing here
 * needs it: a delayed or buried job with no write under way. */
static void job_evict(struct job *j)
{
    if (g.store && j->stored && j->writes == 0 && j->body &&
        (j->state == J_DELAYED || j->state == J_BURIED)) {
        free(j->body);
        j->body = NULL;
        g.bodies--;
    }
}

/* A job record @w came back from the store. */
static void job_written(struct tbd_write *w)
{
    struct job *j = job_find(key_id(w->key, w->key_len));
    if (!j)
        return; /* deleted meanwhile */
    if (j->writes > 0 && j->writes < UINT8_MAX)
        j->writes--;
    j->stored |= w->result == 0;
    /* Undated, and no later write (which may date it) under way. */
    if (w->result == 0 && w->due_ms == 0 && j->writes == 0)
        j->timed = false;
    job_evict(j);
}

/* The body of @j, read back from the store, into a new block (body_len
 * bytes and "\r\n"); NULL, logged, when the store does not have it. */
static char *body_from_store(const struct job *j)
{
    char key[24];
    size_t kl = (size_t)snprintf(key, sizeof(key), "j%" PRIu64, j->id);
    size_t cap = REC_HEAD + TBD_TUBE_NAME_MAX + (size_t)j->body_len + 4;
    size_t len = 0;
    unsigned char *p = malloc(cap);
    char *body = malloc((size_t)j->body_len + 2);
    int rc =
        p && body ? tbd_store_get(g.store, key, kl, p, cap, &len) : TW_ENOMEM;
    struct rec r;
    if (rc == 0 && (len > cap || !rec_parse(p, len, &r) || r.id != j->id ||
                    r.body_len != j->body_len))
        rc = TW_EIO;
    if (rc == 0) {
        memcpy(body, r.body, j->body_len);
        memcpy(body + j->body_len, "\r\n", 2);
    } else {
        logv(0, "job %" PRIu64 ": cannot read its body back: %s", j->id,
             tw_strerror(rc));
        free(body);
        body = NULL;
    }
    free(p);
    return body;
}

/* Makes sure @j's body is in memory; false (logged) if it cannot be. */
static bool job_load_body(struct job *j)
{
    if (!j->body) {
        j->body = body_from_store(j);
        g.bodies += j->body != NULL;
    }
    return j->body != NULL;
}

static void store_completions(struct tbd_write *w)
{
    while (w) {
        struct tbd_write *nx = w->next;
        struct conn *c = w->owner;
        if (w->result != 0)
            logv(0, "store write %.*s failed: %s", (int)w->key_len, w->key,
                 tw_strerror(w->result));
        if (w->kind == TBD_W_SCHED && w->key[0] == 'j')
            job_written(w);
        if (w->cold && w->result != 0) {
            /* A delayed job the store did not take: gone (logged). */
            struct tube *t = w->cold;
            t->ncold--;
            g.counts[J_DELAYED]--;
            tube_maybe_free(t);
        }
        if (w->unclaim)
            tbd_store_unclaim(g.store, w->key, w->key_len);
        if (c) {
            struct out *o = (struct out *)(uintptr_t)w->tag;
            if (o) {
                if (w->result != 0 && !w->keep_reply) {
                    static const char e[] = "INTERNAL_ERROR\r\n";
                    c->out_bytes -= o->len;
                    if (o->cap < sizeof(e) - 1) {
                        /* cap is at least 32 (reply_held) */
                        abort();
                    }
                    memcpy(o->data, e, sizeof(e) - 1);
                    o->len = sizeof(e) - 1;
                    c->out_bytes += o->len;
                }
                o->ready = true;
            }
            c->pending_writes--;
            if (!c->closed)
                conn_pump(c);
        }
        free(w->payload);
        free(w);
        w = nx;
    }
}

/* ---- delayed jobs in the store (-b, --redis) ---- */

/*
 * With a store, a delayed job is not in memory: its tube counts it
 * (ncold), the store holds its record with the job's due time and fires
 * it (store.c); fired_jobs() makes it ready here. A command that names a
 * delayed job reads it back from the store (cold_get()).
 */

/*
 * peek-delayed's memory of a tube's delayed jobs in the store: first[]
 * holds, sorted by (due, id), every one up to first_bound (first_known),
 * at most FIRST_MAX. Jobs that leave (fire, are deleted or kicked) stay
 * in it until peek-delayed meets them at its front, reads them back and
 * drops them; each one added (start-up scan, put, release) goes in if it
 * comes before the bound, which then moves down to the last one kept.
 * When first[] runs dry with a finite bound, the query thread refills it
 * (query_done()). FIRST_MAX * 16 bytes a tube with delayed jobs.
 */
#define FIRST_MAX 256

static bool hit_less(struct tbd_hit a, struct tbd_hit b)
{
    return a.due < b.due || (a.due == b.due && a.id < b.id);
}

static void cold_add(struct tube *t, int64_t due, uint64_t id)
{
    struct tbd_hit h = {due, id};
    t->cold_adds++;
    if (!t->first_known || hit_less(t->first_bound, h))
        return;
    if (!t->first) {
        t->first = malloc(FIRST_MAX * sizeof(*t->first));
        if (!t->first) {
            t->first_known = false;
            return;
        }
    }
    uint32_t lo = 0, hi = t->nfirst;
    while (lo < hi) {
        uint32_t mid = (lo + hi) / 2;
        if (hit_less(t->first[mid], h))
            lo = mid + 1;
        else
            hi = mid;
    }
    bool full = t->nfirst == FIRST_MAX;
    if (full && lo == FIRST_MAX) {
        /* It comes after all of them and stays out: the bound moves down
         * to the last one. */
        t->first_bound = t->first[FIRST_MAX - 1];
        return;
    }
    if (full)
        t->nfirst--; /* the last one goes */
    memmove(&t->first[lo + 1], &t->first[lo],
            (t->nfirst - lo) * sizeof(*t->first));
    t->first[lo] = h;
    t->nfirst++;
    if (full)
        t->first_bound = t->first[FIRST_MAX - 1];
}

/* Writes @j (delayed by j->delay_s from now) to the store with its due
 * time, then frees it; @in_table: it is in the job table. */
static void job_go_cold(struct conn *c, struct job *j, bool in_table,
                        const char *text)
{
    struct tube *t = j->tube;
    j->due_wall = wall_ms() + (int64_t)j->delay_s * 1000;
    struct tbd_write *w = job_write(j, J_DELAYED, c);
    w->due_ms = j->due_wall;
    w->cold = t;
    cold_add(t, j->due_wall, j->id);
    t->ncold++;
    g.counts[J_DELAYED]++;
    if (in_table)
        job_table_remove(j);
    job_release(j);
    submit(c, w, text);
}

/* @j, read back from the store (job_from_rec()), joins the jobs in
 * memory as ready; @counted: its tube counts it as delayed here. */
static void cold_ready(struct job *j, bool counted)
{
    struct tube *t = j->tube;
    if (counted && t->ncold) {
        t->ncold--;
        g.counts[J_DELAYED]--;
    }
    job_table_insert(j);
    job_make_ready(j);
}

static void live_fired(const char *key, size_t key_len, const unsigned char *p,
                       size_t n);

/* True when this server issues job id @id (--node: its range). */
static bool own_id(uint64_t id)
{
    return (id >> NODE_SHIFT) == g.opt->node;
}

/* A fired record of job @id that this server must not serve: one in
 * its own range of ids that it has not issued yet (a job of another
 * server cannot have it; served, it would meet the job this server
 * issues with that id). */
static bool fired_squats(uint64_t id)
{
    return own_id(id) && id >= g.next_id;
}

/* The jobs the store fired: ready now (buried if they were, taken over
 * from a dead server), unless already in memory. A record that is not a
 * job record of its key is left in the store (logged, counted). */
static void fired_jobs(void)
{
    if (!g.store)
        return;
    for (struct tbd_fired *f = tbd_store_take_fired(g.store), *nx; f; f = nx) {
        nx = f->next;
        uint64_t id = key_id(f->key, f->key_len);
        struct rec r;
        bool ok = false;
        if (f->key_len && f->key[0] == 'n') {
            live_fired(f->key, f->key_len, f->payload, f->payload_len);
            ok = true;
        } else if (id && job_find(id)) {
            ok = true; /* in memory already */
        } else if (id && rec_parse(f->payload, f->payload_len, &r) &&
                   r.id == id && !fired_squats(id)) {
            ok = true;
            struct job *j = job_from_rec(&r, true);
            if (j) {
                if (r.state == J_BURIED) {
                    /* Taken over from a dead server: buried here. */
                    job_table_insert(j);
                    job_make_buried(j);
                } else {
                    cold_ready(j,
                               r.state == J_DELAYED && r.owner == g.opt->node);
                }
                /* Redis: from now on this server holds it (another may
                 * have taken the put), and the record must not fire on
                 * another server again. */
                if (g.opt->redis)
                    submit(NULL, job_write(j, j->state, NULL), NULL);
            } else
                logv(0, "job %" PRIu64 ": out of memory, left in the store",
                     id);
        }
        if (!ok) {
            unreadable(f->key, f->key_len,
                       "fired, not a job record of its key: left in the "
                       "store");
        }
        free(f);
    }
}

/*
 * A delayed job of this server that the store holds and memory does not,
 * read back (not in the job table, state J_DELAYED, its body loaded,
 * deadline set); NULL if there is none with @id. Free it with
 * job_free_cold() unless it joins memory (cold_ready()).
 */
static struct job *cold_get(uint64_t id)
{
    if (!g.store)
        return NULL;
    char key[24];
    size_t kl = (size_t)snprintf(key, sizeof(key), "j%" PRIu64, id);
    size_t cap = REC_HEAD + TBD_TUBE_NAME_MAX + g.opt->max_job_size + 4;
    size_t len = 0;
    unsigned char *p = malloc(cap);
    struct rec r;
    int64_t now = wall_ms();
    struct job *j = NULL;
    if (p && tbd_store_get(g.store, key, kl, p, cap, &len) == 0 && len <= cap &&
        rec_parse(p, len, &r) && r.id == id && r.owner == g.opt->node &&
        r.state == J_DELAYED && r.due > now)
        j = job_from_rec(&r, true);
    free(p);
    if (j)
        j->deadline = tw_wheel_now(g.wheel) + (uint64_t)(j->due_wall - now);
    return j;
}

static void job_free_cold(struct job *j)
{
    struct tube *t = j->tube;
    job_release(j);
    tube_maybe_free(t);
}

/* The job @id in memory, or read back from the store into memory when
 * it is delayed there: then ready, timed, and *@warmed set. */
static struct job *job_find_warm(uint64_t id, bool *warmed)
{
    *warmed = false;
    struct job *j = job_find(id);
    if (j || !g.store)
        return j;
    fired_jobs();
    j = job_find(id);
    if (j)
        return j;
    j = cold_get(id);
    if (j) {
        j->timed = true;
        cold_ready(j, true);
        *warmed = true;
    }
    return j;
}

/* ---- reserving ---- */

static void waiting_remove(struct conn *c)
{
    if (!c->waiting)
        return;
    c->waiting = false;
    tw_wheel_cancel(g.wheel, &c->wait_timer);
    if (c->w_prev)
        c->w_prev->w_next = c->w_next;
    else
        g.w_head = c->w_next;
    if (c->w_next)
        c->w_next->w_prev = c->w_prev;
    else
        g.w_tail = c->w_prev;
    c->w_next = c->w_prev = NULL;
    g.waiting--;
    for (size_t i = 0; i < c->nwatch; i++)
        c->watch[i]->waiting--;
}

static void reply_job(struct conn *c, const char *word, struct job *j)
{
    /* A peek at a delayed or buried job whose body is in the store. */
    char *tmp = j->body ? NULL : body_from_store(j);
    if (!j->body && !tmp) {
        reply(c, "INTERNAL_ERROR\r\n");
        return;
    }
    replyf(c, "%s %" PRIu64 " %u\r\n", word, j->id, j->body_len);
    reply_raw(c, j->body ? j->body : tmp, (size_t)j->body_len + 2);
    free(tmp);
}

/* Starts (or restarts) @j's TTR: first the DEADLINE_SOON point, then
 * the deadline itself (job_timer_fn()). */
static void arm_ttr(struct job *j, uint64_t now)
{
    j->deadline = now + (uint64_t)j->ttr_s * 1000u;
    j->soon_phase = (uint64_t)j->ttr_s * 1000u > SAFETY_MS;
    tw_wheel_add(g.wheel, &j->timer,
                 j->soon_phase ? j->deadline - SAFETY_MS : j->deadline);
}

/*
 * Redis: the record of a reserved job is due TTR + TAKEOVER_GRACE_MS
 * from now (a ready job, to whichever server the store hands it), so that
 * when this server dies the job comes back ready on another. While it
 * lives, this server releases the job at its TTR and writes it back
 * undated (ttr_ended()), well before the grace runs out; a touch dates it
 * again.
 */
#define TAKEOVER_GRACE_MS 2000

static void lease_write(struct conn *c, struct job *j, const char *text)
{
    struct tbd_write *w = job_write(j, J_READY, c);
    w->due_ms = wall_ms() + (int64_t)j->ttr_s * 1000 + TAKEOVER_GRACE_MS;
    /* Failed, it leaves the job reserved here (logged): only a takeover
     * after a crash is lost. */
    w->keep_reply = true;
    j->timed = true;
    submit(c, w, text);
}

/* Redis: a job in memory whose record may fire on another server (a
 * reserved job's, after lease_write()) is written back undated. */
static void job_undate(struct job *j)
{
    if (g.opt->redis && g.store && j->timed)
        submit(NULL, job_write(j, J_READY, NULL), NULL);
}

static void reserve_job(struct conn *c, struct job *j, uint64_t now)
{
    job_unlink(j);
    j->state = J_RESERVED;
    g.counts[J_RESERVED]++;
    j->reserver = c;
    j->reserves++;
    j->tube->nreserved++;
    jl_push(&c->reserved, j);
    arm_ttr(j, now);
    if (!g.opt->redis || !g.store || !job_load_body(j)) {
        reply_job(c, "RESERVED", j);
        return;
    }
    /* Redis: RESERVED goes once the lease is in Redis, so a job whose
     * RESERVED reached a worker comes back on another server if this one
     * dies. */
    char head[48];
    snprintf(head, sizeof(head), "RESERVED %" PRIu64 " %u\r\n", j->id,
             j->body_len);
    lease_write(c, j, head);
    reply_raw(c, j->body, (size_t)j->body_len + 2);
}

/* The best ready job of the unpaused tubes @c watches. */
static struct job *conn_candidate(struct conn *c)
{
    struct job *best = NULL;
    for (size_t i = 0; i < c->nwatch; i++) {
        struct tube *t = c->watch[i];
        if (!t->nready || tube_paused(t))
            continue;
        if (!best || job_less(t->heap[0], best))
            best = t->heap[0];
    }
    return best;
}

static bool conn_deadline_soon(struct conn *c, uint64_t now)
{
    for (struct job *j = c->reserved.head; j; j = j->l_next)
        if (now + SAFETY_MS >= j->deadline)
            return true;
    return false;
}

/* Gives ready jobs to waiting connections, oldest waiter first. */
static void process_queue(void)
{
    g.queue_dirty = false;
    uint64_t now = tw_wheel_now(g.wheel);
    for (struct conn *c = g.w_head, *nx; c && g.nready_total; c = nx) {
        nx = c->w_next;
        struct job *j = conn_candidate(c);
        if (!j)
            continue;
        waiting_remove(c);
        reserve_job(c, j, now);
        conn_flush(c);
    }
}

static void wait_timeout_fn(tw_timer *tm, void *arg)
{
    (void)tm;
    struct conn *c = arg;
    waiting_remove(c);
    reply(c, "TIMED_OUT\r\n");
    conn_flush(c);
}

static void job_timer_fn(tw_timer *tm, void *arg)
{
    (void)tm;
    struct job *j = arg;
    uint64_t now = tw_wheel_now(g.wheel);
    if (j->state == J_DELAYED) {
        if (!job_load_body(j)) { /* the store failed: try again later */
            tw_wheel_add(g.wheel, &j->timer, now + 1000);
            return;
        }
        jl_remove(&j->tube->delayed, j);
        g.counts[J_DELAYED]--;
        job_make_ready(j);
        return;
    }
    if (j->state != J_RESERVED)
        return;
    struct conn *c = j->reserver;
    if (j->soon_phase) {
        j->soon_phase = false;
        tw_wheel_add(g.wheel, &j->timer, j->deadline);
        if (c->waiting) {
            waiting_remove(c);
            reply(c, "DEADLINE_SOON\r\n");
            conn_flush(c);
        }
        return;
    }
    (void)now;
    /* The TTR ran out: the job goes back to ready, as in beanstalkd. */
    job_unlink(j);
    j->timeouts++;
    g.job_timeouts++;
    job_make_ready(j);
    job_undate(j);
}

/* ---- commands ---- */

static void conn_use(struct conn *c, struct tube *t)
{
    t->using ++;
    struct tube *old = c->use;
    c->use = t;
    if (old) {
        old->using --;
        tube_maybe_free(old);
    }
}

static bool conn_watches(struct conn *c, struct tube *t)
{
    for (size_t i = 0; i < c->nwatch; i++)
        if (c->watch[i] == t)
            return true;
    return false;
}

/* A job @c may delete, bury or touch: reserved by @c. */
static struct job *reserved_by(struct conn *c, uint64_t id)
{
    struct job *j = job_find(id);
    return j && j->state == J_RESERVED && j->reserver == c ? j : NULL;
}

static void cmd_reserve(struct conn *c, int64_t timeout_ms)
{
    if (!c->worker) {
        c->worker = true;
        g.workers++;
    }
    uint64_t now = tw_wheel_now(g.wheel);
    struct job *j = conn_candidate(c);
    if (j) {
        reserve_job(c, j, now);
        return;
    }
    if (conn_deadline_soon(c, now)) {
        reply(c, "DEADLINE_SOON\r\n");
        return;
    }
    if (timeout_ms == 0) {
        reply(c, "TIMED_OUT\r\n");
        return;
    }
    c->waiting = true;
    c->w_next = NULL;
    c->w_prev = g.w_tail;
    if (g.w_tail)
        g.w_tail->w_next = c;
    else
        g.w_head = c;
    g.w_tail = c;
    g.waiting++;
    for (size_t i = 0; i < c->nwatch; i++)
        c->watch[i]->waiting++;
    if (timeout_ms > 0)
        tw_wheel_add(g.wheel, &c->wait_timer, now + (uint64_t)timeout_ms);
}

static void put_finish(struct conn *c)
{
    struct job *j = c->put_job;
    c->put_job = NULL;
    c->in_state = IN_LINE;
    if (memcmp(j->body + j->body_len, "\r\n", 2) != 0) {
        job_release(j);
        reply(c, "EXPECTED_CRLF\r\n");
        return;
    }
    j->id = next_job_id();
    j->created_wall = wall_ms();
    j->tube = c->use;
    g.total_jobs++;
    j->tube->total_jobs++;
    char text[48];
    snprintf(text, sizeof(text), "INSERTED %" PRIu64 "\r\n", j->id);
    if (j->delay_s > 0 && g.store) {
        job_go_cold(c, j, false, text);
        return;
    }
    job_table_insert(j);
    uint64_t now = tw_wheel_now(g.wheel);
    if (j->delay_s > 0)
        job_make_delayed(j, j->delay_s, now);
    else
        job_make_ready(j);
    store_job(c, j, text);
}

static void cmd_put(struct conn *c, const struct tbd_cmd *cmd)
{
    if (!c->producer) {
        c->producer = true;
        g.producers++;
    }
    if (cmd->bytes > g.opt->max_job_size || g.draining) {
        /* As beanstalkd: the body is read and dropped, then the answer. */
        c->in_state = IN_SKIP;
        c->skip_left = cmd->bytes + 2;
        c->skip_reply = cmd->bytes > g.opt->max_job_size ? "JOB_TOO_BIG\r\n"
                                                         : "DRAINING\r\n";
        return;
    }
    struct job *j = job_alloc();
    char *body = j ? malloc(cmd->bytes + 2) : NULL;
    if (j && !body)
        job_release(j);
    if (!body) {
        c->in_state = IN_SKIP;
        c->skip_left = cmd->bytes + 2;
        c->skip_reply = "OUT_OF_MEMORY\r\n";
        return;
    }
    j->pri = cmd->pri;
    j->delay_s = cmd->delay;
    j->ttr_s = cmd->ttr ? cmd->ttr : 1;
    j->body_len = (uint32_t)cmd->bytes;
    j->body = body;
    g.bodies++;
    tw_timer_init(&j->timer, job_timer_fn, j);
    c->put_job = j;
    c->body_got = 0;
    c->in_state = IN_BODY;
}

static void cmd_peek_reply(struct conn *c, struct job *j)
{
    if (!j)
        reply(c, "NOT_FOUND\r\n");
    else
        reply_job(c, "FOUND", j);
}

static void yaml_begin(char **buf, size_t *len, size_t *cap)
{
    *cap = 2048;
    *buf = xmalloc(*cap);
    *len = 0;
}

static void yaml_add(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(*buf + *len, *cap - *len, fmt, ap);
        va_end(ap);
        if (n < 0)
            return;
        if ((size_t)n < *cap - *len) {
            *len += (size_t)n;
            return;
        }
        *cap = (*cap + (size_t)n) * 2;
        char *nb = realloc(*buf, *cap);
        if (!nb)
            abort();
        *buf = nb;
    }
}

static void yaml_send(struct conn *c, char *buf, size_t len)
{
    replyf(c, "OK %zu\r\n", len);
    reply_raw(c, buf, len);
    reply(c, "\r\n");
    free(buf);
}

#define YADD(...) yaml_add(&b, &n, &cap, __VA_ARGS__)

static void cmd_stats_job(struct conn *c, struct job *j, uint64_t now)
{
    char *b;
    size_t n, cap;
    yaml_begin(&b, &n, &cap);
    int64_t age = (wall_ms() - j->created_wall) / 1000;
    uint64_t left = 0;
    if ((j->state == J_DELAYED || j->state == J_RESERVED) && j->deadline > now)
        left = (j->deadline - now) / 1000u;
    YADD("---\nid: %" PRIu64 "\ntube: %s\nstate: %s\npri: %u\nage: %" PRId64
         "\ndelay: %u\nttr: %u\ntime-left: %" PRIu64 "\nfile: 0\n",
         j->id, j->tube->name, state_name[j->state], j->pri,
         age < 0 ? (int64_t)0 : age, j->delay_s, j->ttr_s, left);
    YADD("reserves: %u\ntimeouts: %u\nreleases: %u\nburies: %u\nkicks: %u\n",
         j->reserves, j->timeouts, j->releases, j->buries, j->kicks);
    yaml_send(c, b, n);
}

static void cmd_stats_tube(struct conn *c, struct tube *t, uint64_t now)
{
    char *b;
    size_t n, cap;
    yaml_begin(&b, &n, &cap);
    uint64_t left = t->pause_until > now ? (t->pause_until - now) / 1000u : 0;
    YADD("---\nname: %s\ncurrent-jobs-urgent: %" PRIu64
         "\ncurrent-jobs-ready: %zu\ncurrent-jobs-reserved: %" PRIu64
         "\ncurrent-jobs-delayed: %" PRIu64 "\ncurrent-jobs-buried: %" PRIu64
         "\ntotal-jobs: %" PRIu64 "\n",
         t->name, t->nurgent, t->nready, t->nreserved, t->delayed.n + t->ncold,
         t->buried.n, t->total_jobs);
    YADD("current-using: %" PRIu64 "\ncurrent-watching: %" PRIu64
         "\ncurrent-waiting: %" PRIu64 "\ncmd-delete: %" PRIu64
         "\ncmd-pause-tube: %" PRIu64 "\npause: %u\npause-time-left: %" PRIu64
         "\n",
         t->using, t->watching, t->waiting, t->cmd_delete, t->cmd_pause,
         t->pause_s, left);
    yaml_send(c, b, n);
}

static void cmd_stats(struct conn *c)
{
    static const int order[] = {TBD_PUT,
                                TBD_PEEK,
                                TBD_PEEK_READY,
                                TBD_PEEK_DELAYED,
                                TBD_PEEK_BURIED,
                                TBD_RESERVE,
                                TBD_RESERVE_TIMEOUT,
                                TBD_DELETE,
                                TBD_RELEASE,
                                TBD_USE,
                                TBD_WATCH,
                                TBD_IGNORE,
                                TBD_BURY,
                                TBD_KICK,
                                TBD_TOUCH,
                                TBD_STATS,
                                TBD_STATS_JOB,
                                TBD_STATS_TUBE,
                                TBD_LIST_TUBES,
                                TBD_LIST_TUBE_USED,
                                TBD_LIST_TUBES_WATCHED,
                                TBD_PAUSE_TUBE};
    char *b;
    size_t n, cap;
    yaml_begin(&b, &n, &cap);
    uint64_t urgent = 0;
    for (struct tube *t = g.tubes; t; t = t->next)
        urgent += t->nurgent;
    YADD("---\ncurrent-jobs-urgent: %" PRIu64 "\ncurrent-jobs-ready: %" PRIu64
         "\ncurrent-jobs-reserved: %" PRIu64 "\ncurrent-jobs-delayed: %" PRIu64
         "\ncurrent-jobs-buried: %" PRIu64 "\n",
         urgent, g.counts[J_READY], g.counts[J_RESERVED], g.counts[J_DELAYED],
         g.counts[J_BURIED]);
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        /* As beanstalkd, reserve-job and kick-job have no counter. */
        uint64_t v = g.cmd[order[i]];
        YADD("cmd-%s: %" PRIu64 "\n", tbd_op_name(order[i]), v);
    }
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    uint64_t written = 0, batches = 0, jbytes = 0;
    if (g.store)
        tbd_store_counts(g.store, &written, &batches, &jbytes);
    YADD("job-timeouts: %" PRIu64 "\ntotal-jobs: %" PRIu64
         "\nmax-job-size: %u\ncurrent-tubes: %" PRIu64
         "\ncurrent-connections: %" PRIu64 "\ncurrent-producers: %" PRIu64
         "\ncurrent-workers: %" PRIu64 "\ncurrent-waiting: %" PRIu64
         "\ntotal-connections: %" PRIu64 "\npid: %ld\n",
         g.job_timeouts, g.total_jobs, g.opt->max_job_size, g.ntubes,
         g.cur_conns, g.producers, g.workers, g.waiting, g.total_conns,
         (long)getpid());
    YADD("version: \"%s\"\nrusage-utime: %ld.%06ld\nrusage-stime: "
         "%ld.%06ld\nuptime: %" PRIu64 "\n",
         "twheeld " TBD_VERSION, (long)ru.ru_utime.tv_sec,
         (long)ru.ru_utime.tv_usec, (long)ru.ru_stime.tv_sec,
         (long)ru.ru_stime.tv_usec, (mono_ms() - g.started_mono) / 1000u);
    YADD("binlog-oldest-index: 0\nbinlog-current-index: 0\n"
         "binlog-records-migrated: 0\nbinlog-records-written: %" PRIu64
         "\nbinlog-max-size: 67108864\ndraining: %s\nid: %s\nhostname: "
         "%s\nos: %s\nplatform: %s\n",
         written, g.draining ? "true" : "false", g.server_id, g.uts.nodename,
         g.uts.version, g.uts.machine);
    yaml_send(c, b, n);
}

static void cmd_list(struct conn *c, int op)
{
    char *b;
    size_t n, cap;
    yaml_begin(&b, &n, &cap);
    YADD("---\n");
    if (op == TBD_LIST_TUBES) {
        /* Oldest first: the list is kept newest first. */
        size_t k = 0;
        for (struct tube *t = g.tubes; t; t = t->next)
            k++;
        struct tube **v = xmalloc((k ? k : 1) * sizeof(*v));
        k = 0;
        for (struct tube *t = g.tubes; t; t = t->next)
            v[k++] = t;
        while (k--)
            YADD("- %s\n", v[k]->name);
        free(v);
    } else {
        for (size_t i = 0; i < c->nwatch; i++)
            YADD("- %s\n", c->watch[i]->name);
    }
    yaml_send(c, b, n);
}

/* Kicks @j (buried or delayed) to ready; stores it. */
static bool kick_one(struct job *j)
{
    if (!job_load_body(j))
        return false;
    job_unlink(j);
    j->kicks++;
    job_make_ready(j);
    return true;
}

static void cmd_delete(struct conn *c, uint64_t id)
{
    struct job *j = job_find(id);
    char key[24];
    size_t kl = (size_t)snprintf(key, sizeof(key), "j%" PRIu64, id);
    /* A job whose store record may fire: no delivery of it may reach
     * fired_jobs() from now until its cancel is done (store.c). */
    bool claim = g.store && (!j || j->timed);
    if (claim) {
        tbd_store_claim(g.store, key, kl);
        fired_jobs();
        j = job_find(id);
    }
    struct tube *t;
    if (j && !(j->state == J_RESERVED && j->reserver != c)) {
        t = j->tube;
        j->tube->cmd_delete++;
        job_unlink(j);
        job_free(j);
    } else if (!j && (j = cold_get(id)) != NULL) {
        t = j->tube;
        t->cmd_delete++;
        t->ncold--;
        g.counts[J_DELAYED]--;
        job_free_cold(j);
    } else {
        if (claim)
            tbd_store_unclaim(g.store, key, kl);
        reply(c, "NOT_FOUND\r\n");
        return;
    }
    (void)t;
    if (!g.store) {
        reply(c, "DELETED\r\n");
        return;
    }
    struct tbd_write *w = write_new(TBD_W_CANCEL, c);
    memcpy(w->key, key, kl + 1);
    w->key_len = kl;
    w->unclaim = claim;
    submit(c, w, "DELETED\r\n");
}

/*
 * peek-delayed and kick of delayed jobs with a store: a query on the
 * store's thread (tbd_store_query(): one scan of the store, off the event
 * loop) finds the ids of the tube's delayed jobs due first; their reply
 * waits, in order, in the connection's output meanwhile (query_done()).
 */
enum { Q_PEEK, Q_KICK, Q_TAKE };

/* On the query thread: a delayed job of this server in tube q->tube. */
static bool query_match(const struct tbd_query *q, const void *payload,
                        size_t n, int64_t *due, uint64_t *id)
{
    struct rec r;
    if (!rec_parse(payload, n, &r) || r.state != J_DELAYED || r.due <= q->now ||
        r.owner != q->node || r.tube_len != q->tube_len ||
        memcmp(r.tube, q->tube, r.tube_len) != 0)
        return false;
    *due = r.due;
    *id = r.id;
    return true;
}

static void cold_query(struct conn *c, struct tube *t, int kind, size_t want,
                       struct out *o)
{
    struct tbd_query *q = calloc(1, sizeof(*q));
    if (!q)
        abort();
    q->match = query_match;
    memcpy(q->tube, t->name, t->name_len);
    q->tube_len = t->name_len;
    q->node = g.opt->node;
    q->now = wall_ms();
    q->want = want;
    q->kind = kind;
    q->gen = t->cold_adds;
    q->owner = c;
    q->tag = (uint64_t)(uintptr_t)o;
    c->pending_writes++;
    tbd_store_query(g.store, q);
}

/* A reply of up to @cap bytes whose text comes later (query_done()). */
static struct out *reply_later(struct conn *c, size_t cap)
{
    struct out *o = out_new(cap);
    o->len = 0;
    o->ready = false;
    out_link(c, o);
    return o;
}

static void out_fill(struct conn *c, struct out *o, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(o->data, o->cap, fmt, ap);
    va_end(ap);
    o->len = n < 0 ? 0 : (size_t)n < o->cap ? (size_t)n : o->cap - 1;
    c->out_bytes += o->len;
}

/* peek-delayed with a store. */
static void cold_peek(struct conn *c)
{
    struct tube *t = c->use;
    if (!t->ncold) {
        reply(c, "NOT_FOUND\r\n");
        return;
    }
    fired_jobs();
    while (t->nfirst) {
        struct tbd_hit h = t->first[0];
        struct job *j = job_find(h.id) ? NULL : cold_get(h.id);
        if (j && j->tube == t && j->due_wall == h.due) {
            cmd_peek_reply(c, j);
            job_free_cold(j);
            return;
        }
        if (j)
            job_free_cold(j);
        memmove(&t->first[0], &t->first[1],
                --t->nfirst * sizeof(*t->first)); /* it left */
    }
    if (t->first_known && t->first_bound.due == INT64_MAX) {
        reply(c, "NOT_FOUND\r\n"); /* first[] held all of them */
        return;
    }
    t->first_known = false;
    cold_query(c, t, Q_PEEK, FIRST_MAX,
               reply_later(c, 64 + (size_t)g.opt->max_job_size));
}

/* kick @bound with a store and no buried job in @t: its delayed jobs,
 * those due first first. */
static void cold_kick(struct conn *c, struct tube *t, uint32_t bound)
{
    if (!t->ncold || !bound) {
        reply(c, "KICKED 0\r\n");
        return;
    }
    cold_query(c, t, Q_KICK, bound < t->ncold ? bound : t->ncold,
               reply_later(c, 32));
}

/* Kicks what query @q found; the reply @o waits for the last write. */
static void query_kick(struct conn *c, struct tbd_query *q, struct out *o)
{
    uint32_t k = 0;
    struct tbd_write *last = NULL;
    for (size_t i = 0; i < q->n; i++) {
        if (job_find(q->hits[i].id))
            continue; /* fired meanwhile: ready already */
        struct job *j = cold_get(q->hits[i].id);
        if (!j)
            continue; /* deleted or kicked meanwhile */
        j->timed = true;
        cold_ready(j, true);
        j->kicks++;
        k++;
        /* Each write but the last goes at once; the reply waits for the
         * last, and writes complete in order. */
        if (last)
            submit(c, last, NULL);
        last = job_write(j, J_READY, c);
    }
    out_fill(c, o, "KICKED %u\r\n", k);
    if (last) {
        last->tag = (uint64_t)(uintptr_t)o;
        c->pending_writes++;
        tbd_store_submit(g.store, last);
    } else {
        o->ready = true;
    }
}

/* The queries the store answered. */
/* A peek query's answer: first[] of its tube from it (unless a delayed
 * job was added since the scan), then the first of it still delayed.
 * Returns false when it should be asked again. */
static bool query_peek(struct conn *c, struct tbd_query *q, struct out *o)
{
    struct tube *t = tube_find(q->tube, q->tube_len);
    if (t && t->cold_adds == q->gen && !t->first_known &&
        (t->first || (t->first = malloc(FIRST_MAX * sizeof(*t->first))))) {
        memcpy(t->first, q->hits, q->n * sizeof(*q->hits));
        t->nfirst = (uint32_t)q->n;
        t->first_known = true;
        t->first_bound = q->n < FIRST_MAX
                             ? (struct tbd_hit){INT64_MAX, UINT64_MAX}
                             : q->hits[q->n - 1];
    }
    for (size_t i = 0; t && i < q->n; i++) {
        if (job_find(q->hits[i].id))
            continue; /* fired meanwhile */
        struct job *j = cold_get(q->hits[i].id);
        if (!j)
            continue; /* deleted or kicked meanwhile */
        bool ok = j->tube == t && j->due_wall == q->hits[i].due;
        if (ok) {
            out_fill(c, o, "FOUND %" PRIu64 " %u\r\n", j->id, j->body_len);
            memcpy(o->data + o->len, j->body, (size_t)j->body_len + 2);
            o->len += (size_t)j->body_len + 2;
            c->out_bytes += (size_t)j->body_len + 2;
        }
        job_free_cold(j);
        if (ok)
            return true;
    }
    /* None of them is delayed any more: more may follow if the answer
     * was full. */
    if (t && t->ncold && q->n == q->want)
        return false;
    out_fill(c, o, "NOT_FOUND\r\n");
    return true;
}

/*
 * Takeover (--redis): the ready and buried jobs of a dead server (its
 * liveness record fired here), and those whose record was about to fire
 * anyway (reserved there, or fired there and not yet rewritten).
 */
#define TAKE_MAX 65536 /* ids per query; more: another query */

/* True when the sorted @set of @n nodes holds @node. */
static bool nodes_have(const uint32_t *set, size_t n, uint32_t node)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (set[mid] == node)
            return true;
        if (set[mid] < node)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

/* On the query thread: a job that a server of q->nodes holds, not
 * delayed. */
static bool take_match(const struct tbd_query *q, const void *payload, size_t n,
                       int64_t *due, uint64_t *id)
{
    struct rec r;
    if (!rec_parse(payload, n, &r) ||
        !nodes_have(q->nodes, q->nnodes, r.owner) ||
        (r.state == J_DELAYED && r.due > q->now))
        return false;
    *due = 0;
    *id = r.id;
    return true;
}

/* Sends the takeover query of the nodes that wait, unless one is out:
 * one scan of the store for every dead node at once, however many
 * liveness records fired together. */
static void takeover_next(void)
{
    if (g.take_q || g.ntake_wait == 0)
        return;
    struct tbd_query *q = calloc(1, sizeof(*q));
    if (!q)
        abort();
    q->match = take_match;
    q->nodes = g.take_wait;
    q->nnodes = g.ntake_wait;
    g.take_wait = NULL;
    g.ntake_wait = g.take_wait_cap = 0;
    q->now = wall_ms();
    q->want = TAKE_MAX;
    q->kind = Q_TAKE;
    g.take_q = q;
    /* One line a query, however many records fired. */
    if (q->nnodes == 1)
        logv(0, "node %" PRIu32 " is dead: taking over its jobs", q->nodes[0]);
    else
        logv(0,
             "%zu nodes are dead (%" PRIu32 " to %" PRIu32
             "): taking over their jobs",
             q->nnodes, q->nodes[0], q->nodes[q->nnodes - 1]);
    tbd_store_query(g.store, q);
}

/* Takes over the jobs of @node: it joins the next takeover query, unless
 * this one or the next covers it already. */
static void takeover_start(uint32_t node)
{
    if ((g.take_q && nodes_have(g.take_q->nodes, g.take_q->nnodes, node)) ||
        nodes_have(g.take_wait, g.ntake_wait, node)) {
        takeover_next();
        return;
    }
    if (g.ntake_wait == g.take_wait_cap) {
        size_t ncap = g.take_wait_cap ? 2 * g.take_wait_cap : 16;
        g.take_wait = realloc(g.take_wait, ncap * sizeof(*g.take_wait));
        if (!g.take_wait)
            abort();
        g.take_wait_cap = ncap;
    }
    size_t i = g.ntake_wait;
    while (i > 0 && g.take_wait[i - 1] > node) {
        g.take_wait[i] = g.take_wait[i - 1];
        i--;
    }
    g.take_wait[i] = node;
    g.ntake_wait++;
    takeover_next();
}

/*
 * A liveness record fired here: another server's, it is dead. One that
 * is not a record a server wrote (live_parse()) is removed, logged and
 * counted: a takeover is never started from it, and it does not fire
 * again every TBD_LIVE_RETRY_MS.
 */
static void live_fired(const char *key, size_t key_len, const unsigned char *p,
                       size_t n)
{
    if (!g.opt->redis)
        return;
    uint32_t node;
    int64_t due;
    if (!live_parse(key, key_len, p, n, wall_ms() + LIVE_AHEAD_MAX_MS, &node,
                    &due)) {
        unreadable(key, key_len, "fired, not a liveness record: removed");
        struct tbd_write *w = write_new(TBD_W_CANCEL, NULL);
        memcpy(w->key, key, key_len);
        w->key_len = key_len;
        tbd_store_submit(g.store, w);
        return;
    }
    if (node == g.opt->node) {
        /* This server's own, fired here: it was late renewing it. */
        logv(0, "own liveness record ran out: renewed");
        live_renew();
        return;
    }
    takeover_start(node);
}

/*
 * The answer of takeover_start(): each job still named by the dead
 * server's record is rewritten naming this server and due now, so that
 * the owner of its shard fires it and takes it (fired_jobs(): ready
 * stays ready, buried stays buried). Then the liveness record goes.
 */
static void takeover_done(struct tbd_query *q)
{
    g.take_q = NULL;
    if (q->result != 0) {
        /* Their liveness records fire again (TBD_LIVE_RETRY_MS). */
        logv(0, "takeover of %zu nodes: %s (again later)", q->nnodes,
             tw_strerror(q->result));
        takeover_next();
        return;
    }
    /* Of the nodes, those still dead: not back meanwhile (their record
     * renewed), nor taken over by another server (their record gone). */
    size_t ndead = 0;
    for (size_t i = 0; i < q->nnodes; i++) {
        char lk[24];
        unsigned char lp[LIVE_LEN];
        size_t lkl = live_key(lk, sizeof(lk), q->nodes[i]), ll = 0;
        uint32_t node;
        int64_t due;
        if (tbd_store_get(g.store, lk, lkl, lp, sizeof(lp), &ll) == 0 &&
            live_parse(lk, lkl, lp, ll, wall_ms(), &node, &due))
            q->nodes[ndead++] = q->nodes[i]; /* still sorted */
    }
    q->nnodes = ndead;
    size_t cap = REC_HEAD + TBD_TUBE_NAME_MAX + g.opt->max_job_size + 4;
    unsigned char *p = xmalloc(cap + 4);
    size_t moved = 0;
    for (size_t i = 0; i < q->n && ndead > 0; i++) {
        struct tbd_write *w = write_new(TBD_W_SCHED, NULL);
        w->key_len = (size_t)snprintf(w->key, sizeof(w->key), "j%" PRIu64,
                                      q->hits[i].id);
        size_t len = 0;
        int64_t due;
        uint64_t id;
        if (tbd_store_get(g.store, w->key, w->key_len, p, cap, &len) != 0 ||
            len > cap || !take_match(q, p, len, &due, &id) ||
            id != q->hits[i].id) {
            free(w); /* gone or changed since the scan */
            continue;
        }
        if (p[2] == J_DELAYED) /* fired there: ready */
            p[2] = J_READY;
        if (p[1] < 2) { /* version 1: the owner is appended */
            p[1] = 2;
            len += 4;
        }
        unsigned char *o = p + len - 4;
        put_u32(&o, g.opt->node);
        w->payload = xmalloc(len);
        memcpy(w->payload, p, len);
        w->payload_len = len;
        w->due_ms = wall_ms();
        tbd_store_submit(g.store, w);
        moved++;
    }
    free(p);
    if (ndead == 1)
        logv(0, "node %" PRIu32 ": %zu jobs handed over", q->nodes[0], moved);
    else if (ndead > 1)
        logv(0, "%zu dead nodes: %zu jobs handed over", ndead, moved);
    for (size_t i = 0; i < ndead; i++) {
        if (q->n == q->want) {
            takeover_start(q->nodes[i]); /* more of theirs: again */
            continue;
        }
        struct tbd_write *w = write_new(TBD_W_CANCEL, NULL);
        w->key_len = live_key(w->key, sizeof(w->key), q->nodes[i]);
        tbd_store_submit(g.store, w);
    }
    takeover_next();
}

/* The queries the store answered. */
static void query_done(struct tbd_query *q)
{
    for (struct tbd_query *nx; q; q = nx) {
        nx = q->next;
        if (q->kind == Q_TAKE) {
            takeover_done(q);
            free(q->nodes);
            free(q->hits);
            free(q);
            continue;
        }
        struct conn *c = q->owner;
        struct out *o = (struct out *)(uintptr_t)q->tag;
        c->pending_writes--;
        if (q->result != 0)
            logv(0, "cannot read the delayed jobs back: %s",
                 tw_strerror(q->result));
        if (!c->closed) {
            fired_jobs();
            if (q->kind == Q_KICK) {
                query_kick(c, q, o);
            } else if (q->result != 0) {
                out_fill(c, o, "INTERNAL_ERROR\r\n");
                o->ready = true;
            } else if (query_peek(c, q, o)) {
                o->ready = true;
            } else {
                cold_query(c, tube_find(q->tube, q->tube_len), Q_PEEK,
                           FIRST_MAX, o);
            }
            conn_pump(c);
        }
        free(q->hits);
        free(q);
    }
}

static void run_command(struct conn *c, const struct tbd_cmd *cmd)
{
    uint64_t now = tw_wheel_now(g.wheel);
    if (cmd->op >= 0)
        g.cmd[cmd->op]++;
    logv(3, "fd %d: %s", c->fd, tbd_op_name(cmd->op));
    struct job *j;
    struct tube *t;
    bool warmed;
    switch (cmd->op) {
    case TBD_BAD_FORMAT:
        reply(c, "BAD_FORMAT\r\n");
        break;
    case TBD_UNKNOWN:
        reply(c, "UNKNOWN_COMMAND\r\n");
        break;
    case TBD_PUT:
        cmd_put(c, cmd);
        break;
    case TBD_USE:
        t = tube_get(cmd->tube, cmd->tube_len);
        if (!t) {
            reply(c, "OUT_OF_MEMORY\r\n");
            break;
        }
        conn_use(c, t);
        replyf(c, "USING %s\r\n", t->name);
        break;
    case TBD_RESERVE:
        cmd_reserve(c, -1);
        break;
    case TBD_RESERVE_TIMEOUT:
        cmd_reserve(c, (int64_t)cmd->timeout * 1000);
        break;
    case TBD_RESERVE_JOB:
        j = job_find_warm(cmd->id, &warmed);
        if (!j || j->state == J_RESERVED) {
            reply(c, "NOT_FOUND\r\n");
            break;
        }
        if (!c->worker) {
            c->worker = true;
            g.workers++;
        }
        reserve_job(c, j, now);
        /* It was delayed in the store: ready after a crash (on Redis
         * reserve_job() wrote its lease). */
        if (warmed && !g.opt->redis)
            submit(c, job_write(j, J_READY, c), NULL);
        break;
    case TBD_DELETE:
        cmd_delete(c, cmd->id);
        break;
    case TBD_RELEASE:
    case TBD_BURY:
        j = reserved_by(c, cmd->id);
        if (!j) {
            reply(c, "NOT_FOUND\r\n");
            break;
        }
        job_unlink(j);
        j->pri = cmd->pri;
        if (cmd->op == TBD_BURY) {
            j->buries++;
            job_make_buried(j);
        } else {
            j->releases++;
            if (cmd->delay > 0 && g.store) {
                j->delay_s = cmd->delay;
                job_go_cold(c, j, true, "RELEASED\r\n");
                break;
            }
            if (cmd->delay > 0)
                job_make_delayed(j, cmd->delay, now);
            else
                job_make_ready(j);
        }
        store_job(c, j, cmd->op == TBD_BURY ? "BURIED\r\n" : "RELEASED\r\n");
        break;
    case TBD_TOUCH:
        j = reserved_by(c, cmd->id);
        if (!j) {
            reply(c, "NOT_FOUND\r\n");
            break;
        }
        arm_ttr(j, now);
        if (g.opt->redis && g.store)
            lease_write(c, j, "TOUCHED\r\n");
        else
            reply(c, "TOUCHED\r\n");
        break;
    case TBD_WATCH:
        t = tube_get(cmd->tube, cmd->tube_len);
        if (!t) {
            reply(c, "OUT_OF_MEMORY\r\n");
            break;
        }
        if (!conn_watches(c, t)) {
            struct tube **nw = realloc(c->watch, (c->nwatch + 1) * sizeof(*nw));
            if (!nw) {
                tube_maybe_free(t);
                reply(c, "OUT_OF_MEMORY\r\n");
                break;
            }
            c->watch = nw;
            c->watch[c->nwatch++] = t;
            t->watching++;
        }
        replyf(c, "WATCHING %zu\r\n", c->nwatch);
        break;
    case TBD_IGNORE:
        t = tube_find(cmd->tube, cmd->tube_len);
        if (t && conn_watches(c, t)) {
            if (c->nwatch == 1) {
                reply(c, "NOT_IGNORED\r\n");
                break;
            }
            size_t i = 0;
            while (c->watch[i] != t)
                i++;
            memmove(&c->watch[i], &c->watch[i + 1],
                    (c->nwatch - i - 1) * sizeof(c->watch[0]));
            c->nwatch--;
            t->watching--;
            tube_maybe_free(t);
        }
        replyf(c, "WATCHING %zu\r\n", c->nwatch);
        break;
    case TBD_PEEK:
    case TBD_STATS_JOB:
        j = job_find(cmd->id);
        if (!j && g.store) {
            fired_jobs();
            j = job_find(cmd->id);
        }
        struct job *cold = j ? NULL : cold_get(cmd->id);
        if (cold)
            j = cold;
        if (cmd->op == TBD_PEEK)
            cmd_peek_reply(c, j);
        else if (!j)
            reply(c, "NOT_FOUND\r\n");
        else
            cmd_stats_job(c, j, now);
        if (cold)
            job_free_cold(cold);
        break;
    case TBD_PEEK_READY:
        cmd_peek_reply(c, c->use->nready ? c->use->heap[0] : NULL);
        break;
    case TBD_PEEK_DELAYED: {
        if (g.store) {
            cold_peek(c);
            break;
        }
        /* O(delayed jobs of the tube): the delays themselves live in the
         * wheel, which has no order to read. */
        struct job *best = NULL;
        for (j = c->use->delayed.head; j; j = j->l_next)
            if (!best || j->deadline < best->deadline ||
                (j->deadline == best->deadline && j->id < best->id))
                best = j;
        cmd_peek_reply(c, best);
        break;
    }
    case TBD_PEEK_BURIED:
        cmd_peek_reply(c, c->use->buried.head);
        break;
    case TBD_KICK: {
        t = c->use;
        if (g.store && !t->buried.n) {
            cold_kick(c, t, cmd->bound);
            break;
        }
        uint32_t k = 0;
        struct jlist *l = t->buried.n ? &t->buried : &t->delayed;
        struct tbd_write *last = NULL;
        while (k < cmd->bound && l->head) {
            j = l->head;
            if (!kick_one(j))
                break; /* its body could not be read back (logged) */
            k++;
            if (g.store) {
                /* Each write but the last goes at once; the reply waits
                 * for the last, and writes complete in order. */
                if (last)
                    submit(c, last, NULL);
                last = job_write(j, J_READY, c);
            }
        }
        char text[40];
        snprintf(text, sizeof(text), "KICKED %u\r\n", k);
        if (last)
            submit(c, last, text);
        else
            reply(c, text);
        break;
    }
    case TBD_KICK_JOB:
        j = job_find_warm(cmd->id, &warmed);
        if (warmed) { /* delayed in the store: ready now */
            j->kicks++;
            store_job(c, j, "KICKED\r\n");
            break;
        }
        if (!j || (j->state != J_BURIED && j->state != J_DELAYED)) {
            reply(c, "NOT_FOUND\r\n");
            break;
        }
        if (!kick_one(j)) {
            reply(c, "INTERNAL_ERROR\r\n");
            break;
        }
        store_job(c, j, "KICKED\r\n");
        break;
    case TBD_STATS_TUBE:
        t = tube_find(cmd->tube, cmd->tube_len);
        if (!t)
            reply(c, "NOT_FOUND\r\n");
        else
            cmd_stats_tube(c, t, now);
        break;
    case TBD_STATS:
        cmd_stats(c);
        break;
    case TBD_LIST_TUBES:
    case TBD_LIST_TUBES_WATCHED:
        cmd_list(c, cmd->op);
        break;
    case TBD_LIST_TUBE_USED:
        replyf(c, "USING %s\r\n", c->use->name);
        break;
    case TBD_PAUSE_TUBE:
        t = tube_find(cmd->tube, cmd->tube_len);
        if (!t) {
            reply(c, "NOT_FOUND\r\n");
            break;
        }
        t->cmd_pause++;
        t->pause_s = cmd->delay;
        if (cmd->delay) {
            t->pause_until = now + (uint64_t)cmd->delay * 1000u;
            tw_wheel_add(g.wheel, &t->pause_timer, t->pause_until);
        } else {
            t->pause_until = 0;
            tw_wheel_cancel(g.wheel, &t->pause_timer);
            g.queue_dirty = true;
        }
        reply(c, "PAUSED\r\n");
        break;
    case TBD_QUIT:
        c->close_after_flush = true;
        break;
    }
}

/* ---- input ---- */

/* Finds "\r\n" in [p, p + n); its offset or -1. */
static long find_crlf(const char *p, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++) {
        const char *r = memchr(p + i, '\r', n - 1 - i);
        if (!r)
            return -1;
        i = (size_t)(r - p);
        if (p[i + 1] == '\n')
            return (long)i;
    }
    return -1;
}

/* Runs the buffered input as far as backpressure allows. */
static void conn_process(struct conn *c)
{
    while (!c->closed && !c->close_after_flush && c->out_bytes < OUT_CAP &&
           c->in_off < c->in_len) {
        char *p = c->in + c->in_off;
        size_t avail = c->in_len - c->in_off;
        if (c->in_state == IN_SKIP) {
            size_t k = avail < c->skip_left ? avail : (size_t)c->skip_left;
            c->skip_left -= k;
            c->in_off += k;
            if (c->skip_left == 0) {
                c->in_state = IN_LINE;
                if (c->skip_reply)
                    reply(c, c->skip_reply);
                c->skip_reply = NULL;
            }
            continue;
        }
        if (c->in_state == IN_DISCARD) {
            long e = find_crlf(p, avail);
            if (e < 0) {
                c->in_off += avail - 1;
                break;
            }
            c->in_off += (size_t)e + 2;
            c->in_state = IN_LINE;
            continue;
        }
        if (c->in_state == IN_BODY) {
            struct job *j = c->put_job;
            size_t need = (size_t)j->body_len + 2 - c->body_got;
            size_t k = avail < need ? avail : need;
            memcpy(j->body + c->body_got, p, k);
            c->body_got += k;
            c->in_off += k;
            if (c->body_got == (size_t)j->body_len + 2)
                put_finish(c);
            continue;
        }
        long e = find_crlf(p, avail < TBD_LINE_MAX ? avail : TBD_LINE_MAX);
        if (e < 0) {
            if (avail >= TBD_LINE_MAX) {
                /* No end of line within the longest line: as beanstalkd,
                 * BAD_FORMAT, and the rest of that line is dropped. */
                reply(c, "BAD_FORMAT\r\n");
                c->in_state = IN_DISCARD;
                c->in_off += avail - 1; /* keep a last '\r' */
                continue;
            }
            break;
        }
        struct tbd_cmd cmd;
        tbd_parse(p, (size_t)e, &cmd);
        c->in_off += (size_t)e + 2;
        run_command(c, &cmd);
    }
    if (c->closed)
        return;
    if (c->in_off == c->in_len) {
        c->in_off = c->in_len = 0;
        free(c->in);
        c->in = NULL;
    } else if (c->in_off > 0) {
        memmove(c->in, c->in + c->in_off, c->in_len - c->in_off);
        c->in_len -= c->in_off;
        c->in_off = 0;
    }
}

/*
 * Runs buffered commands and writes replies until neither moves: once a
 * flush makes room, commands held back by backpressure run without
 * waiting for more input (which may never come).
 */
static void conn_pump(struct conn *c)
{
    for (;;) {
        size_t in_before = c->in_len - c->in_off;
        size_t out_before = c->out_bytes;
        if (c->in)
            conn_process(c);
        if (c->closed)
            return;
        conn_flush(c);
        if (c->closed || !c->in || c->in_len == c->in_off ||
            c->out_bytes >= OUT_CAP)
            return;
        /* Stop when neither the input nor the output moved. */
        if (c->in_len - c->in_off == in_before && c->out_bytes >= out_before)
            return;
    }
}

static void conn_readable(struct conn *c)
{
    for (int rounds = 0; rounds < 4 && !c->closed; rounds++) {
        if (c->close_after_flush || c->out_bytes >= OUT_CAP)
            break;
        if (!c->in) {
            c->in = malloc(IN_CAP);
            if (!c->in) {
                conn_close(c);
                return;
            }
        }
        size_t room = IN_CAP - c->in_len;
        if (room == 0)
            break;
        ssize_t r = read(c->fd, c->in + c->in_len, room);
        if (r == 0) {
            conn_close(c);
            return;
        }
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK)
                conn_close(c);
            else
                conn_process(c);
            break;
        }
        c->in_len += (size_t)r;
        conn_process(c);
        if ((size_t)r < room)
            break;
    }
    if (!c->closed) {
        if (c->in && c->in_len == 0) {
            free(c->in);
            c->in = NULL;
        }
        conn_pump(c);
    }
}

static void conn_accept(void)
{
    for (int i = 0; i < 256; i++) {
        int fd = accept4(g.lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                logv(1, "accept: %s", strerror(errno));
            return;
        }
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
        struct conn *c = calloc(1, sizeof(*c));
        struct tube **w = malloc(sizeof(*w));
        if (!c || !w) {
            free(c);
            free(w);
            close(fd);
            continue;
        }
        c->fd = fd;
        c->watch = w;
        c->watch[0] = g.default_tube;
        c->nwatch = 1;
        g.default_tube->watching++;
        conn_use(c, g.default_tube);
        tw_timer_init(&c->wait_timer, wait_timeout_fn, c);
        c->events = EPOLLIN;
        struct epoll_event e = {.events = EPOLLIN, .data.ptr = c};
        if (epoll_ctl(g.ep, EPOLL_CTL_ADD, fd, &e) != 0) {
            close(fd);
            free(w);
            g.default_tube->watching--;
            g.default_tube->using --;
            free(c);
            continue;
        }
        g.cur_conns++;
        g.total_conns++;
        logv(2, "accept fd %d", fd);
    }
}

/* ---- recovery ---- */

struct recover_ctx {
    uint64_t max_id, mark, jobs, cold, bad, others;
    int64_t now_wall;
    int64_t never; /* the due time of an undated record */
};

static void recover_one(void *arg, const char *key, size_t key_len,
                        int64_t due_ms, const void *payload, size_t n)
{
    struct recover_ctx *r = arg;
    const unsigned char *p = payload;
    if (key_len && key[0] == 'm') {
        char mk[24];
        size_t ml = mark_key(mk, sizeof(mk));
        if (key_len != ml || memcmp(key, mk, ml) != 0)
            return; /* another server's */
        /* A mark beyond this server's range of ids would make it issue
         * another's (or wrap around). */
        if (n != 10 || p[0] != REC_MARK || !own_id(get_u64(p + 2))) {
            unreadable(key, key_len,
                       "not a mark of this server's ids, "
                       "skipped");
            return;
        }
        if (get_u64(p + 2) > r->mark)
            r->mark = get_u64(p + 2);
        return;
    }
    if (key_len && key[0] == 'n')
        return; /* a server's liveness record */
    struct rec rc;
    if (!rec_parse(p, n, &rc) || rc.id != key_id(key, key_len) ||
        job_find(rc.id)) {
        r->bad++;
        unreadable(key, key_len, "not a job record of its key, skipped");
        return;
    }
    /* Another server's job (--node): not this one's to serve. */
    if (rc.owner != g.opt->node) {
        r->others++;
        return;
    }
    /* Ids of this server's range only: a job taken over from another
     * server keeps that one's id. */
    if (own_id(rc.id) && rc.id > r->max_id)
        r->max_id = rc.id;
    r->jobs++;
    if (rc.state == J_DELAYED && rc.due > r->now_wall) {
        /* The store fires it; only its tube counts it here. */
        struct tube *t = tube_get(rc.tube, rc.tube_len);
        if (!t) {
            fputs("twheeld: out of memory during recovery\n", stderr);
            exit(1);
        }
        cold_add(t, rc.due, rc.id);
        t->ncold++;
        g.counts[J_DELAYED]++;
        r->cold++;
        return;
    }
    /* Redis: a record that may still fire (a reserved job's, or a fired
     * one's) is written back undated, or another server would take it. */
    bool undate = g.opt->redis && due_ms < r->never;
    /* Buried jobs leave their bodies in the store. */
    struct job *j = job_from_rec(&rc, rc.state != J_BURIED || undate);
    if (!j) {
        fputs("twheeld: out of memory during recovery\n", stderr);
        exit(1);
    }
    job_table_insert(j);
    if (rc.state == J_BURIED)
        job_make_buried(j);
    else
        job_make_ready(j);
    if (undate)
        submit(NULL, job_write(j, j->state, NULL), NULL);
}

/* ---- /metrics (--metrics-port) ---- */

/*
 * A minimal HTTP/1.x endpoint on the event loop: one request per
 * connection (GET /metrics, the Prometheus text format 0.0.4), then the
 * connection is closed. At most MCONN_MAX connections at once (more are
 * closed at accept), each closed after MCONN_MS whatever it has sent, a
 * request of more than MCONN_IN bytes answered 431: a scraper that stalls
 * or floods costs a bounded buffer and never blocks the loop.
 */
#define MCONN_MAX 16
#define MCONN_MS 5000
#define MCONN_IN 2048

struct mconn {
    int fd;
    tw_timer timer;
    size_t in_len, out_len, out_off;
    char *out;
    char in[MCONN_IN];
};

static void mconn_close(struct mconn *m)
{
    tw_wheel_cancel(g.wheel, &m->timer);
    close(m->fd);
    free(m->out);
    free(m);
    g.nmconn--;
}

/* Its time is up: the next event (a hang-up now) closes it; not freed
 * here, as this iteration's events may still name it. */
static void mconn_timeout(tw_timer *t, void *arg)
{
    (void)t;
    shutdown(((struct mconn *)arg)->fd, SHUT_RDWR);
}

/* twheeld's counters, then the store's (tw_durable_metrics()). */
static char *metrics_text(size_t *len)
{
    size_t n, cap;
    char *b;
    yaml_begin(&b, &n, &cap); /* a growing text, as for the YAML replies */
    yaml_add(&b, &n, &cap,
             "# HELP twheeld_jobs Jobs by state.\n# TYPE twheeld_jobs gauge\n");
    for (int i = 0; i < 4; i++)
        yaml_add(&b, &n, &cap, "twheeld_jobs{state=\"%s\"} %" PRIu64 "\n",
                 state_name[i], g.counts[i]);
    yaml_add(&b, &n, &cap,
             "# HELP twheeld_bodies_in_memory Job bodies held in memory (the "
             "other jobs' bodies are read from the store when needed).\n"
             "# TYPE twheeld_bodies_in_memory gauge\n"
             "twheeld_bodies_in_memory %" PRIu64 "\n",
             g.bodies);
    yaml_add(&b, &n, &cap,
             "# HELP twheeld_jobs_total Jobs put since start.\n"
             "# TYPE twheeld_jobs_total counter\ntwheeld_jobs_total %" PRIu64
             "\n# HELP twheeld_job_timeouts_total Reserved jobs whose TTR ran "
             "out.\n# TYPE twheeld_job_timeouts_total counter\n"
             "twheeld_job_timeouts_total %" PRIu64 "\n",
             g.total_jobs, g.job_timeouts);
    yaml_add(&b, &n, &cap,
             "# HELP twheeld_connections Open client connections.\n"
             "# TYPE twheeld_connections gauge\ntwheeld_connections %" PRIu64
             "\n# HELP twheeld_connections_total Client connections accepted.\n"
             "# TYPE twheeld_connections_total counter\n"
             "twheeld_connections_total %" PRIu64 "\n",
             g.cur_conns, g.total_conns);
    yaml_add(&b, &n, &cap,
             "# HELP twheeld_commands_total Commands by name.\n"
             "# TYPE twheeld_commands_total counter\n");
    for (int op = 0; op < TBD_OP_COUNT; op++)
        yaml_add(&b, &n, &cap,
                 "twheeld_commands_total{cmd=\"%s\"} %" PRIu64 "\n",
                 tbd_op_name(op), g.cmd[op]);
    if (g.store) {
        uint64_t written, batches, jbytes;
        tbd_store_counts(g.store, &written, &batches, &jbytes);
        yaml_add(&b, &n, &cap,
                 "# HELP twheeld_store_writes_total Job records written to the "
                 "store.\n# TYPE twheeld_store_writes_total counter\n"
                 "twheeld_store_writes_total %" PRIu64
                 "\n# HELP twheeld_store_batches_total Batches they were "
                 "written in.\n# TYPE twheeld_store_batches_total counter\n"
                 "twheeld_store_batches_total %" PRIu64
                 "\n# HELP twheeld_store_unreadable_total Records read from "
                 "the store that are not what twheeld writes, skipped or "
                 "removed.\n# TYPE twheeld_store_unreadable_total counter\n"
                 "twheeld_store_unreadable_total %" PRIu64 "\n",
                 written, batches, g.unreadable);
        long k = tbd_store_metrics(g.store, b + n, cap - n);
        if (k >= 0 && (size_t)k >= cap - n) {
            cap = n + (size_t)k + 1;
            b = realloc(b, cap);
            if (!b)
                abort();
            k = tbd_store_metrics(g.store, b + n, cap - n);
        }
        if (k >= 0 && (size_t)k < cap - n)
            n += (size_t)k;
    }
    *len = n;
    return b;
}

/* Answers the request in m->in (complete or too long). */
static void mconn_answer(struct mconn *m, bool too_long)
{
    const char *status = "200 OK";
    size_t blen = 0;
    char *body = NULL;
    if (too_long) {
        status = "431 Request Header Fields Too Large";
    } else if (!strncmp(m->in, "GET /metrics ", 13) ||
               !strncmp(m->in, "GET /metrics?", 13)) {
        body = metrics_text(&blen);
    } else if (!strncmp(m->in, "GET ", 4) || !strncmp(m->in, "HEAD ", 5)) {
        status = "404 Not Found";
    } else {
        status = "405 Method Not Allowed";
    }
    char head[256];
    int hl = snprintf(head, sizeof(head),
                      "HTTP/1.1 %s\r\nContent-Type: text/plain; "
                      "version=0.0.4; charset=utf-8\r\nContent-Length: "
                      "%zu\r\nConnection: close\r\n\r\n",
                      status, blen);
    m->out = xmalloc((size_t)hl + blen);
    memcpy(m->out, head, (size_t)hl);
    if (blen)
        memcpy(m->out + hl, body, blen);
    free(body);
    m->out_len = (size_t)hl + blen;
    m->out_off = 0;
    struct epoll_event e = {.events = EPOLLOUT,
                            .data.ptr = (void *)((uintptr_t)m | 1u)};
    epoll_ctl(g.ep, EPOLL_CTL_MOD, m->fd, &e);
}

static void mconn_event(struct mconn *m, uint32_t events)
{
    if (!m->out) {
        ssize_t r = read(m->fd, m->in + m->in_len, MCONN_IN - 1 - m->in_len);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
            mconn_close(m);
            return;
        }
        if (r > 0)
            m->in_len += (size_t)r;
        m->in[m->in_len] = '\0';
        if (strstr(m->in, "\r\n\r\n") || strstr(m->in, "\n\n"))
            mconn_answer(m, false);
        else if (m->in_len == MCONN_IN - 1)
            mconn_answer(m, true);
        return;
    }
    if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
        return;
    ssize_t w = write(m->fd, m->out + m->out_off, m->out_len - m->out_off);
    if (w < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (w > 0)
        m->out_off += (size_t)w;
    if (w <= 0 || m->out_off == m->out_len)
        mconn_close(m);
}

static void metrics_accept(void)
{
    for (;;) {
        int fd = accept4(g.mfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            return;
        struct mconn *m = g.nmconn < MCONN_MAX ? calloc(1, sizeof(*m)) : NULL;
        if (!m) {
            close(fd);
            continue;
        }
        m->fd = fd;
        g.nmconn++;
        tw_timer_init(&m->timer, mconn_timeout, m);
        tw_wheel_add(g.wheel, &m->timer, tw_wheel_now(g.wheel) + MCONN_MS);
        struct epoll_event e = {.events = EPOLLIN,
                                .data.ptr = (void *)((uintptr_t)m | 1u)};
        if (epoll_ctl(g.ep, EPOLL_CTL_ADD, fd, &e) != 0)
            mconn_close(m);
    }
}

/* ---- main loop ---- */

static int listen_on(const char *addr, int port)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE};
    struct addrinfo *res;
    char ps[16];
    snprintf(ps, sizeof(ps), "%d", port);
    int rc = getaddrinfo(addr, ps, &hints, &res);
    if (rc != 0) {
        fprintf(stderr, "twheeld: %s: %s\n", addr ? addr : "*",
                gai_strerror(rc));
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                    0);
        if (fd < 0)
            continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 1024) == 0)
            break;
        close(fd);
        fd = -1;
    }
    if (fd < 0)
        fprintf(stderr, "twheeld: cannot listen on %s:%d: %s\n",
                addr ? addr : "*", port, strerror(errno));
    freeaddrinfo(res);
    return fd;
}

static void report_port(int fd, int port_fd)
{
    if (port_fd < 0)
        return;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    int port = 0;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        if (ss.ss_family == AF_INET)
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        else if (ss.ss_family == AF_INET6)
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    }
    dprintf(port_fd, "%d\n", port);
    close(port_fd);
}

int tbd_serve(const struct tbd_options *opt)
{
    g.opt = opt;
    g.started_mono = mono_ms();
    /* Blocked before any thread starts (the store's), so that only the
     * signalfd sees them. */
    sigset_t ss;
    sigemptyset(&ss);
    sigaddset(&ss, SIGINT);
    sigaddset(&ss, SIGTERM);
    sigaddset(&ss, SIGUSR1);
    sigprocmask(SIG_BLOCK, &ss, NULL);
    signal(SIGPIPE, SIG_IGN);

    uname(&g.uts);
    {
        unsigned char rb[8] = {0};
        FILE *f = fopen("/dev/urandom", "rb");
        if (f) {
            if (fread(rb, 1, sizeof(rb), f) != sizeof(rb))
                memset(rb, 0, sizeof(rb));
            fclose(f);
        }
        for (int i = 0; i < 8; i++)
            snprintf(g.server_id + 2 * i, 3, "%02x", rb[i]);
    }
    g.jcap = 1024;
    g.jobs = calloc(g.jcap, sizeof(*g.jobs));
    if (!g.jobs || tw_wheel_create(&g.wheel, NULL, mono_ms()) != 0) {
        fputs("twheeld: out of memory\n", stderr);
        return 1;
    }
    g.default_tube = tube_get("default", 7);
    g.next_id = ((uint64_t)opt->node << NODE_SHIFT) + 1;
    g.id_mark = g.next_id - 1;

    if (opt->dir || opt->redis) {
        const char *where = opt->dir ? opt->dir : opt->redis;
        char err[256] = "";
        int rc = tbd_store_open(&g.store, opt->dir, opt->redis, opt->redis_ns,
                                opt->fsync_ms, err, sizeof(err));
        if (rc != 0) {
            fprintf(stderr, "twheeld: cannot open %s: %s%s%s\n", where,
                    tw_strerror(rc), err[0] ? ": " : "", err);
            return 1;
        }
        if (opt->redis)
            live_wait();
        struct recover_ctx r = {.now_wall = wall_ms(),
                                .never = tbd_store_never()};
        uint64_t t0 = mono_ms();
        job_table_reserve(tbd_store_keys(g.store));
        long n = tbd_store_recover(g.store, recover_one, &r);
        if (n < 0) {
            fprintf(stderr, "twheeld: cannot read the jobs back from %s: %s\n",
                    where, tw_strerror((int)n));
            tbd_store_close(g.store);
            return 1;
        }
        if (r.mark > g.id_mark)
            g.id_mark = r.mark;
        if (r.max_id > g.id_mark)
            g.id_mark = r.max_id;
        g.next_id = g.id_mark + 1;
        logv(1,
             "%s: %" PRIu64 " jobs recovered in %" PRIu64 " ms (%" PRIu64
             " delayed in the store, %" PRIu64 " unreadable, %" PRIu64
             " of other nodes), next id %" PRIu64,
             where, r.jobs, mono_ms() - t0, r.cold, r.bad, r.others, g.next_id);
    }

    if (opt->redis) {
        tw_timer_init(&g.live_timer, live_fn, NULL);
        tw_wheel_add(g.wheel, &g.live_timer,
                     tw_wheel_now(g.wheel) + LIVE_RENEW_MS);
    }

    g.lfd = listen_on(opt->addr, opt->port);
    if (g.lfd < 0) {
        tbd_store_close(g.store);
        return 1;
    }
    g.mfd = -1;
    if (opt->metrics_port >= 0) {
        g.mfd = listen_on(opt->addr, opt->metrics_port);
        if (g.mfd < 0) {
            close(g.lfd);
            tbd_store_close(g.store);
            return 1;
        }
        report_port(g.mfd, opt->metrics_port_fd);
    }
    report_port(g.lfd, opt->port_fd);

    g.sfd = signalfd(-1, &ss, SFD_NONBLOCK | SFD_CLOEXEC);
    g.ep = epoll_create1(EPOLL_CLOEXEC);
    static int tag_listen, tag_signal, tag_store, tag_metrics;
    struct epoll_event e = {.events = EPOLLIN, .data.ptr = &tag_listen};
    epoll_ctl(g.ep, EPOLL_CTL_ADD, g.lfd, &e);
    if (g.mfd >= 0) {
        e.data.ptr = &tag_metrics;
        epoll_ctl(g.ep, EPOLL_CTL_ADD, g.mfd, &e);
    }
    e.data.ptr = &tag_signal;
    epoll_ctl(g.ep, EPOLL_CTL_ADD, g.sfd, &e);
    if (g.store) {
        e.data.ptr = &tag_store;
        epoll_ctl(g.ep, EPOLL_CTL_ADD, tbd_store_fd(g.store), &e);
    }

    bool running = true;
    struct epoll_event evs[256];
    while (running) {
        uint64_t now = mono_ms();
        uint64_t to = tw_wheel_timeout(g.wheel, now);
        int timeout = to == TW_WHEEL_NO_TIMEOUT ? -1
                      : to > 60000              ? 60000
                                                : (int)to;
        if (g.queue_dirty || (g.store && tbd_store_pending_inline(g.store)))
            timeout = 0;
        int n = epoll_wait(g.ep, evs, 256, timeout);
        if (n < 0 && errno != EINTR) {
            perror("twheeld: epoll_wait");
            break;
        }
        tw_wheel_advance(g.wheel, mono_ms());
        for (int i = 0; i < n; i++) {
            void *p = evs[i].data.ptr;
            if (p == &tag_listen) {
                conn_accept();
            } else if (p == &tag_metrics) {
                metrics_accept();
            } else if ((uintptr_t)p & 1u) {
                mconn_event((struct mconn *)((uintptr_t)p & ~(uintptr_t)1),
                            evs[i].events);
            } else if (p == &tag_signal) {
                struct signalfd_siginfo si;
                while (read(g.sfd, &si, sizeof(si)) == sizeof(si)) {
                    if (si.ssi_signo == SIGUSR1) {
                        g.draining = true;
                        logv(0, "draining: put answers DRAINING");
                    } else {
                        running = false;
                    }
                }
            } else if (p == &tag_store) {
                store_completions(tbd_store_take(g.store));
                fired_jobs();
                query_done(tbd_store_take_queries(g.store));
            } else {
                struct conn *c = p;
                if (c->closed)
                    continue;
                if (evs[i].events & (EPOLLERR | EPOLLHUP) &&
                    !(evs[i].events & EPOLLIN)) {
                    conn_close(c);
                    continue;
                }
                if (evs[i].events & EPOLLOUT)
                    conn_pump(c);
                if (!c->closed && (evs[i].events & (EPOLLIN | EPOLLHUP)))
                    conn_readable(c);
            }
        }
        for (int round = 0; round < 2; round++) {
            if (g.queue_dirty)
                process_queue();
            /* Inline writes: this iteration's batch, then its replies
             * (which may run held-back commands: one more round). */
            if (g.store && tbd_store_pending_inline(g.store))
                store_completions(tbd_store_run_inline(g.store));
        }
        reap();
    }
    logv(0, "shutting down");
    close(g.lfd);
    if (g.mfd >= 0)
        close(g.mfd);
    /* Flush the store: every acknowledged write stays. */
    tbd_store_close(g.store);
    free(g.take_wait);
    return 0;
}
