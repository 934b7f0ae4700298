/* SPDX-License-Identifier: MIT */
/*
 * stats.c - twheeld: stats, stats-job, stats-tube and list-tubes (YAML
 * replies).
 */
#define _GNU_SOURCE
#include "tbd.h"

#include "delayq.h"

void tbd_yaml_begin(char **buf, size_t *len, size_t *cap)
{
    *cap = 2048;
    *buf = tbd_xmalloc(*cap);
    *len = 0;
}

void tbd_yaml_add(char **buf, size_t *len, size_t *cap, const char *fmt, ...)
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
    tbd_replyf(c, "OK %zu\r\n", len);
    tbd_reply_raw(c, buf, len);
    tbd_reply(c, "\r\n");
    free(buf);
}

#define YADD(...) tbd_yaml_add(&b, &n, &cap, __VA_ARGS__)

void tbd_cmd_stats_job(struct conn *c, struct job *j, uint64_t now)
{
    (void)now;
    char *b;
    size_t n, cap;
    tbd_yaml_begin(&b, &n, &cap);
    int64_t age = (tbd_wall_ms() - j->created_wall) / 1000;
    uint64_t left = 0;
    if (j->state == J_DELAYED || j->state == J_RESERVED)
        left = tbd_secs_left(j->deadline);
    YADD("---\nid: %" PRIu64 "\ntube: %s\nstate: %s\npri: %u\nage: %" PRId64
         "\ndelay: %u\nttr: %u\ntime-left: %" PRIu64 "\nfile: 0\n",
         j->id, j->tube->name, state_name[j->state], j->pri,
         age < 0 ? (int64_t)0 : age, j->delay_s, j->ttr_s, left);
    YADD("reserves: %u\ntimeouts: %u\nreleases: %u\nburies: %u\nkicks: %u\n",
         j->reserves, j->timeouts, j->releases, j->buries, j->kicks);
    yaml_send(c, b, n);
}

void tbd_cmd_stats_tube(struct conn *c, struct tube *t, uint64_t now)
{
    struct server *s = t->srv;
    char *b;
    size_t n, cap;
    tbd_yaml_begin(&b, &n, &cap);
    (void)now;
    uint64_t left = t->pause_until ? tbd_secs_left(t->pause_until) : 0;
    YADD("---\nname: %s\ncurrent-jobs-urgent: %" PRIu64
         "\ncurrent-jobs-ready: %zu\ncurrent-jobs-reserved: %" PRIu64
         "\ncurrent-jobs-delayed: %" PRIu64 "\ncurrent-jobs-buried: %" PRIu64
         "\ntotal-jobs: %" PRIu64 "\n",
         t->name, t->nurgent, t->nready, t->nreserved,
         tbd_dq_count(s->dq, t->dq), t->buried.n, t->total_jobs);
    YADD("current-using: %" PRIu64 "\ncurrent-watching: %" PRIu64
         "\ncurrent-waiting: %" PRIu64 "\ncmd-delete: %" PRIu64
         "\ncmd-pause-tube: %" PRIu64 "\npause: %u\npause-time-left: %" PRIu64
         "\n",
         t->using, t->watching, t->waiting, t->cmd_delete, t->cmd_pause,
         t->pause_s, left);
    yaml_send(c, b, n);
}

/* The cmd-* lines of stats, in beanstalkd's order. */
static void stats_cmds(struct server *s, char **bp, size_t *np, size_t *capp)
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
    char *b = *bp;
    size_t n = *np, cap = *capp;
    for (size_t i = 0; i < sizeof(order) / sizeof(order[0]); i++) {
        /* As beanstalkd, reserve-job and kick-job have no counter. */
        uint64_t v = s->cmd[order[i]];
        YADD("cmd-%s: %" PRIu64 "\n", tbd_op_name(order[i]), v);
    }
    *bp = b;
    *np = n;
    *capp = cap;
}

void tbd_cmd_stats(struct conn *c)
{
    struct server *s = c->srv;
    char *b;
    size_t n, cap;
    tbd_yaml_begin(&b, &n, &cap);
    uint64_t urgent = 0;
    for (struct tube *t = s->tubes; t; t = t->next)
        urgent += t->nurgent;
    YADD("---\ncurrent-jobs-urgent: %" PRIu64 "\ncurrent-jobs-ready: %" PRIu64
         "\ncurrent-jobs-reserved: %" PRIu64 "\ncurrent-jobs-delayed: %" PRIu64
         "\ncurrent-jobs-buried: %" PRIu64 "\n",
         urgent, s->counts[J_READY], s->counts[J_RESERVED], tbd_dq_total(s->dq),
         s->counts[J_BURIED]);
    stats_cmds(s, &b, &n, &cap);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    uint64_t written = 0, batches = 0;
    /* Not the journal's bytes: stats never waits for the store's lock
     * (a segment being made holds it for its fsync). */
    if (s->store)
        tbd_store_counts(s->store, &written, &batches, NULL);
    YADD("job-timeouts: %" PRIu64 "\ntotal-jobs: %" PRIu64
         "\nmax-job-size: %u\ncurrent-tubes: %" PRIu64
         "\ncurrent-connections: %" PRIu64 "\ncurrent-producers: %" PRIu64
         "\ncurrent-workers: %" PRIu64 "\ncurrent-waiting: %" PRIu64
         "\ntotal-connections: %" PRIu64 "\npid: %ld\n",
         s->job_timeouts, s->total_jobs, s->opt->max_job_size, s->ntubes,
         s->cur_conns, s->producers, s->workers, s->waiting, s->total_conns,
         (long)getpid());
    YADD("version: \"%s\"\nrusage-utime: %ld.%06ld\nrusage-stime: "
         "%ld.%06ld\nuptime: %" PRIu64 "\n",
         "twheeld " TBD_VERSION, (long)ru.ru_utime.tv_sec,
         (long)ru.ru_utime.tv_usec, (long)ru.ru_stime.tv_sec,
         (long)ru.ru_stime.tv_usec, (tbd_mono_ms() - s->started_mono) / 1000u);
    YADD("binlog-oldest-index: 0\nbinlog-current-index: 0\n"
         "binlog-records-migrated: 0\nbinlog-records-written: %" PRIu64
         "\nbinlog-max-size: 67108864\ndraining: %s\nid: %s\nhostname: "
         "%s\nos: %s\nplatform: %s\n",
         written, s->draining ? "true" : "false", s->server_id, s->uts.nodename,
         s->uts.version, s->uts.machine);
    yaml_send(c, b, n);
}

void tbd_cmd_list(struct conn *c, int op)
{
    struct server *s = c->srv;
    char *b;
    size_t n, cap;
    tbd_yaml_begin(&b, &n, &cap);
    YADD("---\n");
    if (op == TBD_LIST_TUBES) {
        /* Oldest first: the list is kept newest first. */
        size_t k = 0;
        for (struct tube *t = s->tubes; t; t = t->next)
            k++;
        struct tube **v = tbd_xmalloc((k ? k : 1) * sizeof(*v));
        k = 0;
        for (struct tube *t = s->tubes; t; t = t->next)
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
