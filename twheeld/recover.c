/* SPDX-License-Identifier: MIT */
/*
 * recover.c - twheeld: recovery at start-up: reading the store back.
 */
#define _GNU_SOURCE
#include "tbd.h"

/* ---- recovery ---- */

/* A high-water mark record "m..." (tbd_next_job_id()). */
static void recover_mark(struct recover_ctx *r, const char *key, size_t key_len,
                         const unsigned char *p, size_t n)
{
    struct server *s = r->srv;
    char mk[24];
    size_t ml = tbd_mark_key(s, mk, sizeof(mk));
    if (key_len != ml || memcmp(key, mk, ml) != 0)
        return; /* another server's */
    /* A mark beyond this server's range of ids would make it issue
     * another's (or wrap around). */
    if (n != MARK_LEN || p[0] != REC_MARK ||
        !tbd_own_id(s, tbd_get_u64(p + 2))) {
        tbd_unreadable(s, key, key_len,
                       "not a mark of this server's ids, "
                       "skipped");
        return;
    }
    if (tbd_get_u64(p + 2) > r->mark)
        r->mark = tbd_get_u64(p + 2);
}

void tbd_recover_one(void *arg, const char *key, size_t key_len, int64_t due_ms,
                     const void *payload, size_t n)
{
    struct recover_ctx *r = arg;
    struct server *s = r->srv;
    const unsigned char *p = payload;
    if (key_len && key[0] == 'm') {
        recover_mark(r, key, key_len, p, n);
        return;
    }
    if (key_len && key[0] == 'n')
        return; /* a server's liveness record */
    struct rec rc;
    /* A second record of one job (a copy in another shard) is skipped
     * like any other record that is not what this server writes. */
    if (!tbd_rec_parse(p, n, &rc) || rc.id != tbd_key_id(key, key_len) ||
        tbd_job_find(s, rc.id) || tbd_delayed_has(s, rc.id)) {
        r->bad++;
        tbd_unreadable(s, key, key_len, "not a job record of its key, skipped");
        return;
    }
    /* Another server's job (--node): not this one's to serve. */
    if (rc.owner != s->opt->node) {
        r->others++;
        return;
    }
    /* Ids of this server's range only: a job taken over from another
     * server keeps that one's id. */
    if (tbd_own_id(s, rc.id) && rc.id > r->max_id)
        r->max_id = rc.id;
    r->jobs++;
    if (rc.state == J_DELAYED && rc.due > r->now_wall) {
        /* The store fires it; only its tube counts it here. */
        struct tube *t = tbd_tube_get(s, rc.tube, rc.tube_len);
        if (!t) {
            fputs("twheeld: out of memory during recovery\n", stderr);
            exit(1);
        }
        tbd_delayed_recovered(t, rc.id, rc.due);
        r->delayed++;
        return;
    }
    /* Redis: a record that may still fire (a reserved job's, or a fired
     * one's) is written back undated, or another server would take it. */
    bool undate = s->opt->redis && due_ms < r->never;
    /* Buried jobs leave their bodies in the store. */
    struct job *j = tbd_job_from_rec(s, &rc, rc.state != J_BURIED || undate);
    if (!j) {
        fputs("twheeld: out of memory during recovery\n", stderr);
        exit(1);
    }
    tbd_job_table_insert(j);
    if (rc.state == J_BURIED)
        tbd_job_make_buried(j);
    else
        tbd_job_make_ready(j);
    if (undate)
        tbd_submit(s, NULL, tbd_job_write(j, j->state, NULL), NULL);
}

/* Reads every job of this server back from the store into memory (which
 * holds none of them); ids go on above every id seen. Returns 0 or the
 * store's TW_E* code. @where names the store in the log. */
int tbd_recover_all(struct server *s, const char *where)
{
    struct recover_ctx r = {
        .srv = s, .now_wall = tbd_wall_ms(), .never = tbd_store_never()};
    uint64_t t0 = tbd_mono_ms();
    long n = tbd_store_recover(s->store, tbd_recover_one, &r);
    if (n < 0)
        return (int)n;
    if (r.mark > s->id_mark)
        s->id_mark = r.mark;
    if (r.max_id > s->id_mark)
        s->id_mark = r.max_id;
    if (s->id_mark + 1 > s->next_id)
        s->next_id = s->id_mark + 1;
    tbd_logv(s, 1,
             "%s: %" PRIu64 " jobs recovered in %" PRIu64 " ms (%" PRIu64
             " delayed in the store, %" PRIu64 " unreadable, %" PRIu64
             " of other nodes), next id %" PRIu64,
             where, r.jobs, tbd_mono_ms() - t0, r.delayed, r.bad, r.others,
             s->next_id);
    return 0;
}

/* Forgets every job in memory (the store keeps their records): the
 * reserved ones leave their connections, the delayed entries go. */
void tbd_forget_jobs(struct server *s)
{
    for (size_t i = 0; i < s->jcap; i++) {
        while (s->jobs[i]) {
            struct job *j = s->jobs[i];
            tbd_job_unlink(j);
            tbd_job_free(j);
        }
    }
    tbd_delayed_forget(s);
}
