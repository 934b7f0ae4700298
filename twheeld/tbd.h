/* SPDX-License-Identifier: MIT */
/*
 * tbd.h - twheeld's internal header: the job model (struct job, tube,
 * conn, server), its constants, and the functions the files of twheeld
 * share (tbd_ names). One thread runs all of them (server.c).
 *
 * There is no global server: the one struct server is tbd_serve()'s
 * (server.c), and it is passed along explicitly. A function takes it as
 * its first parameter (struct server *s), or reaches it from an object it
 * already has: a connection's or a tube's srv back-pointer, set when they
 * are made, or a job's j->tube->srv. Wheel timer callbacks and store
 * callbacks get theirs the same way from their argument.
 */
#ifndef TWHEELD_TBD_H
#define TWHEELD_TBD_H

#include "server.h"
#include "proto.h"
#include "record.h"
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

enum jstate { J_READY, J_DELAYED, J_RESERVED, J_BURIED };
_Static_assert(J_BURIED == REC_STATE_MAX, "record.h: job states");
static const char *const state_name[] = {"ready", "delayed", "reserved",
                                         "buried"};

struct conn;
struct tube;
struct mconn; /* metrics.c */

/*
 * A job: 184 bytes on LP64, from tbd_job_alloc()'s chunks, and its body in a
 * separate block. With a store (-b), the body of a delayed or buried job
 * whose record the store holds is not kept in memory (tbd_job_evict()): it is
 * read back from the store when the job becomes ready or is peeked at
 * (tbd_job_load_body()). Bodies never change, so any record of the job the
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
    struct job *h_next; /* id hash chain; tbd_job_alloc()'s free list */
    uint32_t reserves, timeouts, releases, buries, kicks;
    char *body;     /* body_len bytes, then "\r\n"; NULL when evicted */
    uint64_t token; /* the write token of its record as last written or
                       read (0: none, or a record before version 3) */
};

#if defined(__LP64__)
_Static_assert(sizeof(struct job) == 184, "struct job: 184 bytes on LP64");
#endif

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
    struct jlist buried;
    uint32_t dq; /* its queue of delayed jobs in srv->dq (delayed.c) */
    uint64_t using, watching, waiting;
    uint64_t cmd_delete, cmd_pause;
    uint32_t pause_s;
    uint64_t pause_until; /* monotonic ms; 0 = not paused */
    tw_timer pause_timer;
    struct server *srv; /* its server (set by tbd_tube_get()) */
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
    bool eof;          /* the client shut its side: no more input */
    bool disc_cr;      /* IN_DISCARD: the chunk's last byte read is '\r' */
    uint16_t disc_got; /* IN_DISCARD: bytes read of the current chunk */
    bool repump;       /* on srv->repump: its reserve ended, commands wait */
    bool leasing;      /* --redis: its RESERVED waits for the lease write,
                          and the commands behind it wait too */
    int64_t rsv_timeout_ms; /* its last reserve's timeout (-1: none) */
    uint64_t rsv_start;     /* and when it came (wheel ms) */
    struct conn *rp_next;
    bool producer, worker;
    struct conn *dead_next; /* closed, on srv->dead until freed */
    struct server *srv;     /* its server (set by tbd_conn_accept()) */
};

enum { IN_LINE, IN_BODY, IN_SKIP, IN_DISCARD };
/* What a lease write is for (tbd_write.reserving): none, a reserve, a
 * reserve-job. */
enum { RSV_NONE, RSV_ANY, RSV_BY_ID };

struct server {
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
    struct conn *dead;     /* closed connections, freed by tbd_reap() */
    struct conn *repump;   /* connections whose wait ended (tbd_repump()) */
    uint64_t nready_total; /* ready jobs in all tubes */
    bool queue_dirty;
    bool draining;
    uint64_t cmd[TBD_OP_COUNT];
    uint64_t job_timeouts, total_jobs, total_conns, cur_conns;
    uint64_t producers, workers, waiting;
    uint64_t counts[4];  /* jobs by state (delayed: tbd_dq_total(dq)) */
    struct tbd_dq *dq;   /* every delayed job (delayed.c) */
    struct tube **qtube; /* the tube of each queue of dq */
    uint32_t nqtube;
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
    uint64_t token;      /* the last write token issued (tbd_new_token()) */
    uint64_t live_ok_at; /* --redis: monotonic ms the last liveness
                            renewal that landed was sent */
    struct utsname uts;
    bool running;            /* until a signal stops the server */
    bool standin_on;         /* the stand-in runs this turn (standin.c) */
    struct standin *standin; /* -f 0 on the journal, else NULL */
};

#define LIVE_RENEW_MS                                                          \
    2000 /* --redis: the liveness record's renewal (live.c)                    \
          */

/* What recovery (recover.c) counts while it reads the store back. */
struct recover_ctx {
    struct server *srv; /* the server it reads back into */
    uint64_t max_id, mark, jobs, delayed, bad, others;
    int64_t now_wall;
    int64_t never; /* the due time of an undated record */
};

/* server.c: one turn of the event loop (by whichever thread holds it:
 * standin.c). */
void tbd_turn(struct server *s);

/* standin.c: the loop's stand-in while the loop's thread is in a slow
 * fdatasync (start: on the loop's thread, which then holds the loop; its
 * eventfd goes into the epoll set with @tag, and tbd_standin_woken()
 * drains it). */
bool tbd_standin_start(struct server *s, void *tag);
void tbd_standin_woken(struct server *s);
void tbd_standin_stop(struct server *s);

/* util.c */
uint64_t tbd_mono_ns(void);
uint64_t tbd_mono_ms(void);
int64_t tbd_wall_ms(void);
int64_t tbd_wall_ms_up(void);
uint64_t tbd_secs_left(uint64_t deadline);
void tbd_url_redact(const char *url, char *out, size_t n);
void tbd_logv(struct server *s, int level, const char *fmt, ...);
void *tbd_xmalloc(size_t n);
void tbd_jl_push(struct jlist *l, struct job *j);
void tbd_jl_remove(struct jlist *l, struct job *j);

/* job.c */
struct job *tbd_job_alloc(void);
void tbd_job_release(struct server *s, struct job *j);
struct job *tbd_job_find(struct server *s, uint64_t id);
void tbd_job_table_insert(struct job *j);
void tbd_job_table_reserve(struct server *s, uint64_t n);
void tbd_job_table_remove(struct job *j);
void tbd_job_make_ready(struct job *j);
void tbd_job_unlink(struct job *j);
void tbd_job_make_buried(struct job *j);
void tbd_job_free(struct job *j);
void tbd_job_evict(struct job *j);
char *tbd_body_from_store(const struct job *j);
bool tbd_job_load_body(struct job *j);

/* tube.c */
bool tbd_job_less(const struct job *a, const struct job *b);
void tbd_heap_push(struct tube *t, struct job *j);
void tbd_heap_remove(struct tube *t, struct job *j);
struct tube *tbd_tube_find(struct server *s, const char *name, size_t len);
struct tube *tbd_tube_get(struct server *s, const char *name, size_t len);
void tbd_tube_maybe_free(struct tube *t);
bool tbd_tube_paused(const struct tube *t);

/* conn.c */
struct out *tbd_out_new(size_t cap);
void tbd_out_link(struct conn *c, struct out *o);
void tbd_reply_raw(struct conn *c, const void *p, size_t n);
void tbd_reply(struct conn *c, const char *s);
void tbd_replyf(struct conn *c, const char *fmt, ...);
struct out *tbd_reply_held(struct conn *c, const char *s);
void tbd_conn_close(struct conn *c);
void tbd_reap(struct server *s);
void tbd_conn_flush(struct conn *c);
void tbd_conn_pump(struct conn *c);
void tbd_conn_readable(struct conn *c);
void tbd_conn_accept(struct server *s);
void tbd_repump(struct server *s);

/* bridge.c */
struct tbd_write *tbd_write_new(int kind, struct conn *c);
struct tbd_write *tbd_job_write(struct job *j, int stored_state,
                                struct conn *c);
void tbd_submit(struct server *s, struct conn *c, struct tbd_write *w,
                const char *text);
void tbd_store_job(struct conn *c, struct job *j, const char *text);
size_t tbd_mark_key(struct server *s, char *buf, size_t len);
uint64_t tbd_next_job_id(struct server *s);
void tbd_unreadable(struct server *s, const char *key, size_t key_len,
                    const char *what);
struct job *tbd_job_from_rec(struct server *s, const struct rec *r, bool body);
uint64_t tbd_new_token(struct server *s);
void tbd_fence_raw(struct server *s, struct tbd_write *w,
                   const unsigned char *p, size_t n);
struct tbd_write *tbd_job_cancel_write(struct job *j, struct conn *c);
void tbd_store_completions(struct server *s, struct tbd_write *w);

/* live.c */
void tbd_live_fn(tw_timer *tm, void *arg);
void tbd_live_wait(struct server *s);
void tbd_live_check(struct server *s);
void tbd_live_fired(struct server *s, const char *key, size_t key_len,
                    const unsigned char *p, size_t n);
void tbd_takeover_done(struct server *s, struct tbd_query *q);

/* delayed.c */
void tbd_delayed_recovered(struct tube *t, uint64_t id, int64_t due);
bool tbd_delayed_has(struct server *s, uint64_t id);
void tbd_job_delay(struct conn *c, struct job *j, uint32_t delay_s,
                   bool in_table, const char *text);
void tbd_job_cool(struct job *j, bool ok);
struct job *tbd_job_lookup(struct server *s, uint64_t id, bool *cold, int *err);
void tbd_job_warm(struct job *j);
void tbd_job_free_cold(struct job *j);
void tbd_job_fenced(struct server *s, uint64_t id);
struct job *tbd_delayed_first(struct tube *t, bool *cold, int *err);
void tbd_delayed_sweep(struct server *s);
void tbd_delayed_forget(struct server *s);
bool tbd_own_id(struct server *s, uint64_t id);
void tbd_fired_jobs(struct server *s);
void tbd_query_done(struct server *s, struct tbd_query *q);

/* reserve.c */
void tbd_waiting_remove(struct conn *c);
void tbd_reply_job(struct conn *c, const char *word, struct job *j);
void tbd_arm_ttr(struct job *j, uint64_t now);
void tbd_lease_write(struct conn *c, struct job *j, const char *text);
void tbd_job_undate(struct job *j);
void tbd_reserve_job(struct conn *c, struct job *j, uint64_t now, int how);
void tbd_lease_done(struct conn *c, struct out *o, const struct tbd_write *w,
                    bool fenced);
struct job *tbd_conn_candidate(struct conn *c);
bool tbd_conn_deadline_soon(struct conn *c, uint64_t now);
void tbd_process_queue(struct server *s);
void tbd_wait_timeout_fn(tw_timer *tm, void *arg);
void tbd_job_timer_fn(tw_timer *tm, void *arg);

/* cmd.c */
void tbd_conn_use(struct conn *c, struct tube *t);
void tbd_put_finish(struct conn *c);
void tbd_cmd_peek_reply(struct conn *c, struct job *j);
void tbd_cmd_delete(struct conn *c, uint64_t id);
void tbd_cmd_reserve(struct conn *c, int64_t timeout_ms);
void tbd_run_command(struct conn *c, const struct tbd_cmd *cmd);

/* stats.c */
void tbd_yaml_begin(char **buf, size_t *len, size_t *cap);
void tbd_yaml_add(char **buf, size_t *len, size_t *cap, const char *fmt, ...);
void tbd_cmd_stats_job(struct conn *c, struct job *j, uint64_t now);
void tbd_cmd_stats_tube(struct conn *c, struct tube *t, uint64_t now);
void tbd_cmd_stats(struct conn *c);
void tbd_cmd_list(struct conn *c, int op);

/* recover.c */
void tbd_recover_one(void *arg, const char *key, size_t key_len, int64_t due_ms,
                     const void *payload, size_t n);
int tbd_recover_all(struct server *s, const char *where);
void tbd_forget_jobs(struct server *s);

/* metrics.c */
void tbd_mconn_event(struct mconn *m, uint32_t events);
void tbd_metrics_accept(struct server *s);

#endif
