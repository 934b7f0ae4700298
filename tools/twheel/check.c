/* SPDX-License-Identifier: MIT */
/*
 * tools/twheel/check.c - twheel's check and repair: what the open of a
 * store found damaged, what it ignored (a torn tail) or dropped (with
 * TW_DURABLE_REPAIR), and what each dropped record did to its key; and
 * "nothing here" for a store that holds nothing.
 *
 * The library reports what an open ignores through cfg.on_damage (one
 * report for the bytes, then one per record whose header can be read in
 * them); dmg_collect() keeps them, and this file prints them.
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "twheel.h"

void dmg_collect(void *arg, const tw_durable_damage *d)
{
    struct dmg_list *l = arg;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        struct dmg *v = realloc(l->v, cap * sizeof *v);
        if (!v) {
            l->lost = true;
            return;
        }
        l->v = v;
        l->cap = cap;
    }
    struct dmg *m = &l->v[l->n++];
    m->d = *d;
    if (d->key) {
        memcpy(m->key, d->key, d->key_len);
        m->d.key = m->key;
    }
}

static const char *kind_name(uint32_t k)
{
    return k == TW_DURABLE_DAMAGE_TAIL      ? "torn_tail"
           : k == TW_DURABLE_DAMAGE_SKIPPED ? "damaged_records"
           : k == TW_DURABLE_DAMAGE_SEGMENT ? "bad_segment"
           : k == TW_DURABLE_DAMAGE_MISSING ? "missing_segment"
                                            : "record";
}

/* What a record's loss did to its key, judged by looking the key up in
 * the store as the open left it (@d NULL: not judged). */
static const char *outcome(tw_durable *d, const tw_durable_damage *r,
                           tw_durable_info *in)
{
    if (!d || !r->key)
        return NULL;
    memset(in, 0, sizeof *in);
    int rc = tw_durable_get(d, r->key, r->key_len, in, NULL, 0);
    bool sched = !strcmp(r->record, "schedule") || !strcmp(r->record, "dead");
    if (rc && rc != TW_ENOENT)
        return "unknown";
    if (sched && !rc && in->state != TW_DURABLE_DEAD &&
        !strcmp(r->record, "dead"))
        return "back"; /* its move to the dead letters is lost */
    if (sched)
        return rc ? "dropped" : "older";
    if (!strcmp(r->record, "fire"))
        return "attempt";
    return rc ? "none" : "back";
}

static const char *outcome_text(const char *oc, const char *record)
{
    return !strcmp(oc, "dropped") ? "dropped: no other version of it is kept"
           : !strcmp(oc, "older") ? "an older version of it is kept"
           : !strcmp(oc, "back") && !strcmp(record, "dead")
               ? "pending again: its move to the dead letters is lost"
           : !strcmp(oc, "back") ? "pending again: its cancel or completion "
                                   "is lost"
           : !strcmp(oc, "attempt")
               ? "kept; one delivery attempt is not counted"
           : !strcmp(oc, "none") ? "no change: the key is not held either way"
                                 : "could not be looked up";
}

static void json_record(const struct dmg *m, const char *oc,
                        const tw_durable_info *in, bool first)
{
    const tw_durable_damage *r = &m->d;
    printf("%s{\"offset\":%" PRIu64 ",\"record\":\"%s\",\"key\":",
           first ? "" : ",", r->offset, r->record);
    if (r->key) {
        json_str(r->key, r->key_len);
        printf(",\"key_hex\":\"");
        hex(r->key, r->key_len);
        printf("\"");
    } else {
        printf("null,\"key_hex\":null");
    }
    printf(",\"due_ms\":%" PRId64, r->due_ms);
    if (oc) {
        printf(",\"outcome\":\"%s\"", oc);
        if (!strcmp(oc, "older") || !strcmp(oc, "back") ||
            !strcmp(oc, "attempt"))
            printf(",\"now\":{\"state\":\"%s\",\"due_ms\":%" PRId64 "}",
                   state_name(in->state), in->due_ms);
    }
    putchar('}');
}

static void human_record(const struct opts *o, const struct dmg *m,
                         const char *oc)
{
    const tw_durable_damage *r = &m->d;
    printf("%s:   offset %" PRIu64 ": %s record of ", where(o), r->offset,
           r->record);
    if (r->key) {
        human_str(r->key, r->key_len);
    } else {
        printf("(key cut off)");
    }
    if (r->due_ms) {
        char when[40];
        iso(r->due_ms, when, sizeof when);
        printf(" due %s", when);
    }
    if (oc)
        printf(": %s", outcome_text(oc, r->record));
    putchar('\n');
}

static void human_range(const struct opts *o, const tw_durable_damage *r,
                        bool done)
{
    char seg[32];
    snprintf(seg, sizeof seg, "%010" PRIu32 ".twj", r->segment);
    const char *what =
        r->kind == TW_DURABLE_DAMAGE_TAIL
            ? (done ? "torn tail cut" : "torn tail ignored")
        : r->kind == TW_DURABLE_DAMAGE_SKIPPED
            ? (done ? "damaged records dropped"
                    : "damaged records (a repair drops them)")
        : r->kind == TW_DURABLE_DAMAGE_SEGMENT
            ? (done ? "segment with a bad header dropped"
                    : "segment with a bad header (a repair drops it)")
            : "segments missing";
    if (r->kind == TW_DURABLE_DAMAGE_MISSING) {
        printf("%s: %s: %" PRIu64 " from %s on%s\n", where(o), what, r->records,
               seg, done ? ", passed over" : " (a repair passes over them)");
        return;
    }
    printf("%s: %s: %s offset %" PRIu64 ", %" PRIu64 " bytes, %" PRIu64
           " record%s readable%s\n",
           where(o), what, seg, r->offset, r->bytes, r->records,
           r->records == 1 ? "" : "s",
           r->kind == TW_DURABLE_DAMAGE_TAIL && !done
               ? " (a write cut short by a crash, or one a live store is "
                 "making now; the next read-write open cuts it)"
               : "");
}

/* The type a key of shard keys' suffix @c must have. */
static const char *want_type(const tw_durable_damage *r)
{
    char c = r->key_len ? ((const char *)r->key)[r->key_len - 1] : 0;
    return c == 'd' || c == 'x'   ? "zset"
           : c == 'p' || c == 'q' ? "hash"
                                  : "string";
}

/* A Redis key of the wrong type (TW_DURABLE_DAMAGE_REDIS_KEY) as one
 * line of text, into @buf. */
void redis_key_text(const tw_durable_damage *r, char *buf, size_t len)
{
    snprintf(buf, len,
             "shard %" PRIu32 ": key %.*s is a %s, not a %s (the store sets "
             "it aside at its next write to the shard)",
             r->segment, (int)r->key_len, (const char *)r->key, r->record,
             want_type(r));
}

static void redis_key_report(const struct opts *o, const tw_durable_damage *r,
                             bool first)
{
    char text[TW_DURABLE_KEY_MAX + 200];
    redis_key_text(r, text, sizeof text);
    if (!o->json) {
        printf("%s: wrong type: %s\n", where(o), text);
        return;
    }
    printf("%s{\"kind\":\"wrong_type\",\"shard\":%" PRIu32 ",\"key\":",
           first ? "" : ",", r->segment);
    json_str(r->key, r->key_len);
    printf(",\"type\":\"%s\",\"want\":\"%s\"}", r->record, want_type(r));
}

/* Print the reports of @l; @d: the store the open left, to judge each
 * lost record by (NULL: not judged); @done: the open wrote (a repair). */
static void print_reports(const struct opts *o, const struct dmg_list *l,
                          tw_durable *d, bool done)
{
    bool first = true, open_range = false, first_rec = true;
    if (o->json)
        printf(",\"ignored\":[");
    for (size_t i = 0; i < l->n; i++) {
        const struct dmg *m = &l->v[i];
        tw_durable_info in;
        if (m->d.kind == TW_DURABLE_DAMAGE_REDIS_KEY) {
            redis_key_report(o, &m->d, first);
            first = false;
            continue;
        }
        if (m->d.kind == TW_DURABLE_DAMAGE_RECORD) {
            const char *oc = outcome(d, &m->d, &in);
            if (o->json)
                json_record(m, oc, &in, first_rec);
            else
                human_record(o, m, oc);
            first_rec = false;
            continue;
        }
        if (!o->json) {
            human_range(o, &m->d, done);
            continue;
        }
        printf("%s%s{\"kind\":\"%s\",\"segment\":\"%010" PRIu32
               ".twj\",\"offset\":%" PRIu64 ",\"bytes\":%" PRIu64
               ",\"records\":%" PRIu64 ",\"keys\":[",
               open_range ? "]}" : "", first ? "" : ",", kind_name(m->d.kind),
               m->d.segment, m->d.offset, m->d.bytes, m->d.records);
        first = false, open_range = true, first_rec = true;
    }
    if (o->json)
        printf("%s]", open_range ? "]}" : "");
    else if (l->lost)
        printf("%s: (out of memory: some reports are left out)\n", where(o));
}

static bool has_kind(const struct dmg_list *l, uint32_t kind)
{
    for (size_t i = 0; i < l->n; i++)
        if (l->v[i].d.kind == kind)
            return true;
    return false;
}

#define WRONG_SHARD                                                            \
    "a record in a shard the key does not hash to (a copy made by hand or "    \
    "by a bug; a store's next claim of it sets it aside as w:<key>)"

/* Listed entry @e: the same key and due time as the one before (@prev,
 * @plen, @pdue; a second record of a key lies in another shard) or not
 * found where the key hashes to (the one record is in another shard):
 * into @why, EX_PROBLEM; else EX_OK. */
static int one_entry(tw_durable *d, const tw_durable_entry *e, char *prev,
                     size_t *plen, int64_t *pdue, char *why, size_t len)
{
    const char *k = e->key;
    int kl = (int)e->key_len;
    if (*plen == e->key_len && *pdue == e->due_ms &&
        !memcmp(prev, k, e->key_len)) {
        snprintf(why, len, "timer %.*s: listed twice: " WRONG_SHARD, kl, k);
        return EX_PROBLEM;
    }
    memcpy(prev, k, e->key_len);
    *plen = e->key_len;
    *pdue = e->due_ms;
    tw_durable_info in;
    int rc = tw_durable_get(d, k, e->key_len, &in, NULL, 0);
    /* A listing's due time is exact below 2^53; Redis orders and lists
     * larger ones as doubles. */
    int64_t due = in.due_ms > 0 ? in.due_ms : 0;
    if (rc == TW_ENOENT)
        snprintf(why, len,
                 "timer %.*s: listed, but not where its key "
                 "hashes to: " WRONG_SHARD,
                 kl, k);
    else if (rc || (double)due != (double)e->due_ms)
        snprintf(why, len, "timer %.*s: %s", kl, k,
                 rc ? tw_strerror(rc) : "due time differs");
    return rc || (double)due != (double)e->due_ms ? EX_PROBLEM : EX_OK;
}

/* Every listed timer must read back (get) with the same due time, once. */
static int walk_all(tw_durable *d, uint64_t *count, char *why, size_t len)
{
    static tw_durable_entry e[PAGE];
    static char kb[PAGE * 64 + TW_DURABLE_KEY_MAX], prev[TW_DURABLE_KEY_MAX];
    size_t plen = 0;
    int64_t pdue = 0;
    tw_durable_cursor c = TW_DURABLE_CURSOR_INIT;
    *count = 0;
    while (!c.done) {
        int n = tw_durable_list(d, INT64_MIN, INT64_MAX, &c, e, PAGE, kb,
                                sizeof kb);
        if (n < 0) {
            snprintf(why, len, "list: %s", tw_strerror(n));
            return EX_ERROR;
        }
        for (int i = 0; i < n; i++) {
            int rc = one_entry(d, &e[i], prev, &plen, &pdue, why, len);
            if (rc)
                return rc;
        }
        *count += (uint64_t)n;
    }
    return EX_OK;
}

/* What check found, for its one report shape. */
struct check_res {
    const char *status; /* sound, torn_tail, empty, missing, damaged */
    uint64_t timers, dead;
    char problem[512]; /* "" = none */
    int rc;
};

static void check_line(const struct opts *o, const struct check_res *r)
{
    const char *w = where(o);
    if (!strcmp(r->status, "damaged"))
        printf("%s: damaged: %s\n", w, r->problem);
    else if (!strcmp(r->status, "missing"))
        printf("%s: nothing here: %s\n", w,
               o->dir ? "no such directory"
                      : "no schema twheel in this database (twheel postgres "
                        "init installs it)");
    else if (!strcmp(r->status, "empty") && o->dir)
        printf("%s: nothing here: no journal segment in this directory "
               "(is it the store's?)\n",
               w);
    else if (!strcmp(r->status, "empty"))
        printf("%s: nothing here: namespace %s holds no timer and no dead "
               "letter (a typo in --ns? --shards must be the stores' too)\n",
               w, o->ns ? o->ns : "tw");
    else
        printf("%s: %s, %" PRIu64 " pending timers, each read back, %" PRIu64
               " dead letters\n",
               w,
               r->rc ? "sound but not whole: a torn tail was ignored (above); "
                       "every record before it read and checked"
                     : "ok: every record read and checked",
               r->timers, r->dead);
    if (!strcmp(r->status, "damaged") && o->dir)
        printf("%s: see what a repair would drop: twheel journal repair %s "
               "--dry-run\n",
               w, w);
}

static void check_print(const struct opts *o, const struct check_res *r,
                        const struct dmg_list *l, tw_durable *d)
{
    if (!o->json) {
        print_reports(o, l, d, false);
        check_line(o, r);
        return;
    }
    printf("{\"ok\":%s,\"status\":\"%s\",\"timers\":%" PRIu64
           ",\"dead\":%" PRIu64 ",\"problem\":",
           r->rc ? "false" : "true", r->status, r->timers, r->dead);
    if (r->problem[0])
        json_str(r->problem, strlen(r->problem));
    else
        printf("null");
    print_reports(o, l, d, false);
    puts("}");
}

/* Keys of the wrong type (Redis) are damage: exit 1, the first named
 * in the problem (all of them in the reports). */
static void check_redis_keys(const struct dmg_list *l, struct check_res *r)
{
    for (size_t i = 0; i < l->n; i++) {
        if (l->v[i].d.kind != TW_DURABLE_DAMAGE_REDIS_KEY)
            continue;
        redis_key_text(&l->v[i].d, r->problem, sizeof r->problem);
        r->rc = EX_PROBLEM;
        r->timers = 0;
        return;
    }
}

/* Read everything, change nothing (a read-only open). */
int cmd_check(const struct opts *o)
{
    struct check_res r = {.status = "sound"};
    struct dmg_list l = {0};
    int rc;
    tw_durable *d = NULL;
    if (journal_missing(o)) {
        r.status = "missing", r.rc = EX_WARN;
        snprintf(r.problem, sizeof r.problem, "no such directory");
    } else if (!(d = open_readonly(o, &rc, r.problem, sizeof r.problem, &l))) {
        if (rc == TW_ENOENT && !strcmp(o->backend, "postgres")) {
            r.status = "missing", r.rc = EX_WARN; /* no schema twheel */
        } else if (rc != TW_EIO) {
            open_failed(o, rc, r.problem);
            free(l.v);
            return EX_ERROR;
        } else {
            r.status = "damaged", r.rc = EX_PROBLEM;
        }
    } else {
        tw_durable_stats s;
        r.rc = walk_all(d, &r.timers, r.problem, sizeof r.problem);
        if (!r.rc && (rc = tw_durable_stats_get(d, &s)))
            snprintf(r.problem, sizeof r.problem, "stats: %s", tw_strerror(rc)),
                r.rc = EX_ERROR;
        if (!r.rc && s.pending != r.timers)
            snprintf(r.problem, sizeof r.problem,
                     "%" PRIu64 " pending, %" PRIu64 " listed", s.pending,
                     r.timers),
                r.rc = EX_PROBLEM;
        r.dead = r.rc ? 0 : s.dead;
        /* PostgreSQL: rows a node set aside (twheel.quarantine). */
        if (!r.rc && s.quarantined && !strcmp(o->backend, "postgres"))
            snprintf(r.problem, sizeof r.problem,
                     "%" PRIu64 " rows set aside in twheel.quarantine, "
                     "never delivered",
                     s.quarantined),
                r.rc = EX_PROBLEM;
        check_redis_keys(&l, &r);
        if (r.rc)
            r.status = "damaged";
        else if (o->dir ? s.segments == 0 : !s.pending && !s.dead)
            r.status = "empty", r.rc = EX_WARN;
        else if (has_kind(&l, TW_DURABLE_DAMAGE_TAIL))
            r.status = "torn_tail", r.rc = EX_WARN;
    }
    check_print(o, &r, &l, d);
    tw_durable_close(d);
    free(l.v);
    return r.rc;
}

static void repair_print(const struct opts *o, const char *damage,
                         uint64_t kept, const struct dmg_list *l, tw_durable *d)
{
    bool repaired = damage && !o->dry_run;
    if (o->json) {
        printf("{\"ok\":%s,\"repaired\":%s,\"dry_run\":%s,\"damage\":",
               damage && o->dry_run ? "false" : "true",
               repaired ? "true" : "false", o->dry_run ? "true" : "false");
        if (damage)
            json_str(damage, strlen(damage));
        else
            printf("null");
        printf(",\"kept\":%" PRIu64, kept);
        print_reports(o, l, d, repaired);
        puts("}");
        return;
    }
    print_reports(o, l, d, repaired);
    const char *w = where(o);
    if (!damage)
        printf("%s: no damage, nothing to repair%s\n", w,
               l->n ? " (a torn tail is cut by the store's next open)" : "");
    else if (o->dry_run)
        printf("%s: damaged: %s\na repair would drop the damaged records "
               "(above) and keep %" PRIu64
               " pending timers (run: twheel journal repair %s)\n",
               w, damage, kept, w);
    else
        printf("%s: repaired (%s); %" PRIu64 " pending timers kept\n", w,
               damage, kept);
}

/* The repair itself (or its dry run): open with TW_DURABLE_REPAIR, judge
 * each dropped record by the store that is left. */
static int repair_open(const struct opts *o, const char *damage)
{
    char err[512];
    struct dmg_list l = {0};
    int rc;
    uint32_t flags = TW_DURABLE_REPAIR |
                     (o->dry_run ? TW_DURABLE_READONLY : TW_DURABLE_NOFIRE);
    tw_durable *d = open_store(o, flags, &rc, err, sizeof err, &l);
    if (!d) {
        open_failed(o, rc, err);
        free(l.v);
        return EX_ERROR;
    }
    tw_durable_stats s;
    uint64_t kept = tw_durable_stats_get(d, &s) == 0 ? s.pending : 0;
    repair_print(o, damage, kept, &l, d);
    free(l.v);
    rc = tw_durable_close(d);
    if (rc) {
        fprintf(stderr, "twheel: %s: close: %s\n", where(o), tw_strerror(rc));
        return EX_ERROR;
    }
    return o->dry_run ? EX_PROBLEM : EX_OK;
}

int cmd_repair(const struct opts *o)
{
    char err[512];
    struct dmg_list l = {0};
    int rc;
    if (!o->dir) {
        const char *m = "repair is for journals (a server keeps its own data)";
        fprintf(stderr, "twheel: %s\n", m);
        json_fail(o, m);
        return EX_ERROR;
    }
    if (journal_missing(o)) {
        open_failed(o, TW_ENOENT, "");
        return EX_ERROR;
    }
    tw_durable *d =
        open_store(o, TW_DURABLE_READONLY, &rc, err, sizeof err, &l);
    if (d) {
        tw_durable_stats s;
        uint64_t kept = tw_durable_stats_get(d, &s) == 0 ? s.pending : 0;
        repair_print(o, NULL, kept, &l, d);
        tw_durable_close(d);
        free(l.v);
        return EX_OK;
    }
    free(l.v);
    if (rc != TW_EIO) {
        open_failed(o, rc, err);
        return EX_ERROR;
    }
    return repair_open(o, err);
}
