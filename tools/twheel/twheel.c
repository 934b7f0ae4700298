/* SPDX-License-Identifier: MIT */
/*
 * tools/twheel/twheel.c - look inside a durable store: list, look up,
 * count, check and repair the timers of a journal directory or a Redis
 * namespace (twheel(1)). Uses only the public headers.
 *
 * This file: the command line, opening a store, output helpers, and the
 * verbs ls, get, stats, dead, rearm and delete; check.c has check and
 * repair, port.c export and import, jobs.c twheeld's jobs, init.c
 * postgres init, fail.c each verb's --json document when it could not
 * run, help.c the help texts (twheel.h: what they share).
 *
 * Read-only verbs (ls, get, stats, check, dead, export, jobs, and repair
 * --dry-run) open the store with TW_DURABLE_READONLY: no lock is taken
 * and nothing is written, so a store that another process holds keeps
 * running undisturbed, and nothing is ever delivered. repair opens with
 * TW_DURABLE_REPAIR and TW_DURABLE_NOFIRE, and rearm, delete (of a dead
 * letter) and import with TW_DURABLE_NOFIRE, which takes the directory's
 * lock: a live store's directory is refused (TW_EBUSY). A Redis namespace
 * is shared by design: rearm, delete and each imported timer are one
 * atomic script each, made through a handle that claims and delivers
 * nothing, beside the live nodes.
 *
 * Exit status (EX_* in twheel.h): 0 done; 1 damage found (check, repair
 * --dry-run, and ls, stats, dead, export of a damaged journal), the key
 * is not held (get), is not a dead letter (rearm, delete) or is held
 * already (import); 2 usage or other errors; 3 check: sound but a torn
 * tail was ignored, or nothing is there.
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <time.h>

#include "twheel.h"

static int no_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)t;
    (void)arg;
    return 0; /* read-only and no-fire handles deliver nothing */
}

/* Open @o's store with @flags; on failure a message and 0. */
tw_durable *open_store(const struct opts *o, uint32_t flags, int *rc, char *err,
                       size_t err_len, struct dmg_list *dl)
{
    tw_durable_config c;
    memset(&c, 0, sizeof c);
    c.fire = no_fire;
    c.flags = flags;
    c.errbuf = err;
    c.errbuf_len = err_len;
    c.on_damage = dl ? dmg_collect : NULL;
    /* import writes without an fdatasync a line: the close makes it all
     * durable (and its failure fails the import); a new segment is synced
     * whole before the next one is begun in every mode. */
    if (!strcmp(o->verb, "import"))
        c.sync = TW_DURABLE_SYNC_NONE;
    c.on_damage_arg = dl;
    err[0] = '\0';
    if (!strcmp(o->backend, "journal")) {
        c.dir = o->dir;
    } else if (!strcmp(o->backend, "postgres")) {
        c.postgres = o->url; /* a password: PGPASSWORD or ~/.pgpass */
        c.postgres_namespace = o->ns;
    } else {
        c.redis = o->url;
        /* Kept out of the command line (ps shows it) and of messages. */
        c.redis_user = getenv("TWHEEL_REDIS_USER");
        c.redis_password = getenv("TWHEEL_REDIS_PASSWORD");
        c.redis_namespace = o->ns;
        c.shards = o->shards;
    }
    tw_durable *d = NULL;
    *rc = tw_durable_open(&d, &c);
    return *rc ? NULL : d;
}

/* @o's store as messages name it: the directory, or the Redis address
 * with its credentials (user:password@ of a URL) left out. */
const char *where(const struct opts *o)
{
    static char shown[1024];
    if (o->dir)
        return o->dir;
    if (strstr(o->url, "password=") || strstr(o->url, "password ="))
        return "(a connection string with a password, not shown)";
    const char *s = strstr(o->url, "://");
    const char *at = s ? strrchr(s, '@') : NULL;
    if (!at)
        return o->url;
    snprintf(shown, sizeof shown, "%.*s***%s", (int)(s + 3 - o->url), o->url,
             at);
    return shown;
}

/* A journal's directory that is not there: "nothing here", not a key. */
bool journal_missing(const struct opts *o)
{
    struct stat st;
    return o->dir && stat(o->dir, &st) != 0 && errno == ENOENT;
}

void open_failed(const struct opts *o, int rc, const char *err)
{
    char msg[1400];
    if (rc == TW_ENOENT && journal_missing(o))
        snprintf(msg, sizeof msg, "%s: no such directory", where(o));
    else
        snprintf(msg, sizeof msg, "%s: %s%s%s", where(o), tw_strerror(rc),
                 err[0] ? ": " : "", err);
    fprintf(stderr, "twheel: %s\n", msg);
    json_fail(o, msg);
    if (rc == TW_EBUSY)
        fprintf(stderr,
                "twheel: %s is held by a live store; stop it "
                "first (read-only verbs work while it runs)\n",
                where(o));
}

/* ------------------------------------------------------------------------ */
/* Output. */

/* Bytes as a JSON string: printable ASCII as is, others escaped; a byte
 * above 0x7f becomes \u00XX (so the string's code points are the bytes). */
void json_str_f(FILE *f, const void *p, size_t n)
{
    const unsigned char *s = p;
    putc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned c = s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20 || c >= 0x7f)
            fprintf(f, "\\u%04x", c);
        else
            putc((int)c, f);
    }
    putc('"', f);
}

void json_str(const void *p, size_t n)
{
    json_str_f(stdout, p, n);
}

/* Bytes for a terminal: printable ASCII as is, others as \xHH. */
void human_str_f(FILE *f, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++) {
        unsigned c = s[i];
        if (c < 0x20 || c >= 0x7f || c == '\\')
            fprintf(f, "\\x%02x", c);
        else
            putc((int)c, f);
    }
}

void human_str(const void *p, size_t n)
{
    human_str_f(stdout, p, n);
}

void hex(const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i++)
        printf("%02x", s[i]);
}

/* Unix ms as UTC ISO 8601. */
void iso(int64_t ms, char *out, size_t len)
{
    /* Floor division: INT64_MIN - 999 would overflow. */
    int64_t sec = ms / 1000, frac = ms % 1000;
    if (frac < 0)
        sec--, frac += 1000;
    time_t t = (time_t)sec;
    struct tm tm;
    if (!gmtime_r(&t, &tm)) {
        snprintf(out, len, "?");
        return;
    }
    size_t n = strftime(out, len, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, len - n, ".%03dZ", (int)frac);
}

/* The fields a listed entry shows in JSON, its object left open. */
static void json_entry(const tw_durable_entry *e, const char *when, bool first)
{
    printf("%s\n{\"key\":", first ? "" : ",");
    json_str(e->key, e->key_len);
    printf(",\"key_hex\":\"");
    hex(e->key, e->key_len);
    printf("\",\"due_ms\":%" PRId64 ",\"due\":\"%s\"", e->due_ms, when);
}

const char *state_name(uint32_t st)
{
    return st == TW_DURABLE_DUE    ? "due"
           : st == TW_DURABLE_DEAD ? "dead"
                                   : "waiting";
}

/* ------------------------------------------------------------------------ */
/* Verbs. */

/* A call of @o->verb that failed before any output: the message, and
 * with --json the verb's document with the error in it. */
static void verb_failed(const struct opts *o, int rc)
{
    char msg[128];
    snprintf(msg, sizeof msg, "%s: %s", o->verb, tw_strerror(rc));
    fprintf(stderr, "twheel: %s\n", msg);
    json_fail(o, msg);
}

/* A listing (of @verb) that failed part way: the message, and with
 * --json the document closed whole, with the error in it. */
static int list_failed(const struct opts *o, const char *verb, int rc,
                       uint64_t shown)
{
    fprintf(stderr, "twheel: %s: %s\n", verb, tw_strerror(rc));
    if (o->json) {
        printf("\n],\"count\":%" PRIu64 ",\"more\":false,\"after\":null,"
               "\"error\":",
               shown);
        json_str(tw_strerror(rc), strlen(tw_strerror(rc)));
        puts("}");
    }
    return EX_ERROR;
}

/* The end of a listing of @shown entries: where to resume, as
 * --after [DUE,]KEY (the due only when @with_due: ls pages by (due, key),
 * dead by key). Keys with bytes a shell cannot pass are printed in hex
 * only in JSON. */
static void list_end(const struct opts *o, const tw_durable_cursor *c,
                     uint64_t shown, bool with_due)
{
    if (o->json) {
        printf("\n],\"count\":%" PRIu64 ",\"more\":%s", shown,
               c->done ? "false" : "true");
        if (!c->done) {
            printf(",\"after\":{");
            if (with_due)
                printf("\"due_ms\":%" PRId64 ",", c->due_ms);
            printf("\"key\":");
            json_str(c->key, c->key_len);
            printf(",\"key_hex\":\"");
            hex(c->key, c->key_len);
            printf("\"}");
        } else {
            printf(",\"after\":null"); /* one shape: null at the end */
        }
        puts("}");
    } else if (!c->done) {
        printf("(more: --after ");
        if (with_due)
            printf("%" PRId64 ",", c->due_ms);
        human_str(c->key, c->key_len);
        puts(")");
    }
}

/* A listing orders and returns dues before 1970 as 0 (the wheel's
 * time), and Redis those of 2^53 ms and more as doubles: such an entry's
 * own due, read back, so that ls shows what get and export show (the
 * listed one if the timer went since). */
static int64_t real_due(tw_durable *d, const tw_durable_entry *e)
{
    tw_durable_info in;
    if (e->due_ms > 0 && e->due_ms < (INT64_C(1) << 53))
        return e->due_ms;
    if (tw_durable_get(d, e->key, e->key_len, &in, NULL, 0) ||
        in.state == TW_DURABLE_DEAD)
        return e->due_ms;
    return in.due_ms;
}

static int cmd_ls(const struct opts *o, tw_durable *d)
{
    static tw_durable_entry e[PAGE];
    static char kb[PAGE * 64 + TW_DURABLE_KEY_MAX];
    tw_durable_cursor c = o->after;
    uint64_t shown = 0;
    bool first = true;
    if (o->json)
        fputs("{\"timers\":[", stdout);
    while (!c.done && (!o->limit || shown < o->limit)) {
        size_t want = PAGE;
        if (o->limit && o->limit - shown < want)
            want = (size_t)(o->limit - shown);
        int n = tw_durable_list(d, o->from, o->to, &c, e, want, kb, sizeof kb);
        if (n < 0)
            return list_failed(o, "list", n, shown);
        for (int i = 0; i < n; i++, shown++) {
            char when[40];
            tw_durable_entry x = e[i];
            x.due_ms = real_due(d, &e[i]);
            iso(x.due_ms, when, sizeof when);
            if (o->json) {
                json_entry(&x, when, first);
                printf(",\"state\":\"%s\"}", state_name(e[i].state));
            } else {
                printf("%s  %-7s  ", when, state_name(e[i].state));
                human_str(e[i].key, e[i].key_len);
                putchar('\n');
            }
            first = false;
        }
    }
    list_end(o, &c, shown, true);
    return 0;
}

/* get --json: one shape, found or not (null fields when not). */
static void get_json(const struct opts *o, const tw_durable_info *in,
                     const char *buf, const char *when)
{
    size_t kl = strlen(o->key);
    printf("{\"found\":%s,\"key\":", in ? "true" : "false");
    json_str(o->key, kl);
    printf(",\"key_hex\":\"");
    hex(o->key, kl);
    if (!in) {
        puts("\",\"due_ms\":null,\"due\":null,\"state\":null,\"attempt\":"
             "null,\"payload_len\":null,\"payload\":null,\"payload_hex\":"
             "null}");
        return;
    }
    printf("\",\"due_ms\":%" PRId64 ",\"due\":\"%s\",\"state\":\"%s\","
           "\"attempt\":%" PRIu32 ",\"payload_len\":%zu,\"payload\":",
           in->due_ms, when, state_name(in->state), in->attempt,
           in->payload_len);
    json_str(buf, in->payload_len);
    printf(",\"payload_hex\":\"");
    hex(buf, in->payload_len);
    puts("\"}");
}

static int cmd_get(const struct opts *o, tw_durable *d)
{
    size_t kl = strlen(o->key);
    tw_durable_info in;
    char *buf = NULL;
    int rc;
    /* The payload may change between the calls: ask until it fits. */
    for (size_t cap = 256;;) {
        char *nb = realloc(buf, cap);
        if (!nb) {
            free(buf);
            fputs("twheel: out of memory\n", stderr);
            return 2;
        }
        buf = nb;
        rc = tw_durable_get(d, o->key, kl, &in, buf, cap);
        if (rc || in.payload_len <= cap)
            break;
        cap = in.payload_len;
    }
    if (rc == TW_ENOENT) {
        if (o->json)
            get_json(o, NULL, NULL, NULL);
        else
            printf("%s: not held (never scheduled, cancelled, or done)\n",
                   o->key);
        free(buf);
        return 1;
    }
    if (rc) {
        verb_failed(o, rc);
        free(buf);
        return 2;
    }
    char when[40];
    iso(in.due_ms, when, sizeof when);
    if (o->json) {
        get_json(o, &in, buf, when);
    } else {
        printf("key:      ");
        human_str(o->key, kl);
        printf("\ndue:      %s (%" PRId64 " ms)\nstate:    %s\n"
               "attempt:  %" PRIu32 "\npayload:  %zu bytes: ",
               when, in.due_ms, state_name(in.state), in.attempt,
               in.payload_len);
        human_str(buf, in.payload_len);
        putchar('\n');
    }
    free(buf);
    return 0;
}

static int cmd_stats(const struct opts *o, tw_durable *d)
{
    if (o->metrics) {
        int rc = tw_durable_metrics_fprint(d, NULL, 0, stdout);
        if (rc)
            fprintf(stderr, "twheel: metrics: %s\n", tw_strerror(rc));
        return rc ? 2 : 0;
    }
    tw_durable_stats s;
    int rc = tw_durable_stats_get(d, &s);
    if (rc) {
        verb_failed(o, rc);
        return 2;
    }
    if (o->dir ? s.segments == 0 : !s.pending && !s.dead)
        fprintf(stderr, "twheel: warning: %s: nothing here (%s)\n", where(o),
                o->dir ? "no journal segment in this directory"
                       : "no timer and no dead letter in this namespace");
    static const char *const names[] = {
        "pending",       "backlog",   "dead",       "segments",
        "journal_bytes", "recovered", "recovery_us"};
    uint64_t v[] = {s.pending,       s.backlog,   s.dead,       s.segments,
                    s.journal_bytes, s.recovered, s.recovery_us};
    size_t n = sizeof v / sizeof *v;
    if (strcmp(o->backend, "journal"))
        n = 3; /* the rest describe a journal */
    for (size_t i = 0; i < n; i++) {
        if (o->json)
            printf("%s\"%s\":%" PRIu64, i ? "," : "{", names[i], v[i]);
        else
            printf("%-14s %" PRIu64 "\n", names[i], v[i]);
    }
    if (o->json)
        puts("}");
    return 0;
}

static int cmd_dead(const struct opts *o, tw_durable *d)
{
    static tw_durable_entry e[PAGE];
    static char kb[PAGE * 64 + TW_DURABLE_KEY_MAX];
    tw_durable_cursor c = o->after; /* --after KEY, or the start */
    uint64_t shown = 0;
    if (o->json)
        fputs("{\"dead\":[", stdout);
    while (!c.done && (!o->limit || shown < o->limit)) {
        size_t want = PAGE;
        if (o->limit && o->limit - shown < want)
            want = (size_t)(o->limit - shown);
        int n = tw_durable_list_dead(d, &c, e, want, kb, sizeof kb);
        if (n < 0)
            return list_failed(o, "dead", n, shown);
        for (int i = 0; i < n; i++, shown++) {
            tw_durable_info in;
            memset(&in, 0, sizeof in);
            /* Gone since the listing (re-armed, deleted): attempts 0.
             * Else its own due (a listing shows one before 1970 as 0). */
            tw_durable_entry x = e[i];
            if (!tw_durable_get(d, e[i].key, e[i].key_len, &in, NULL, 0) &&
                in.state == TW_DURABLE_DEAD)
                x.due_ms = in.due_ms;
            char when[40];
            iso(x.due_ms, when, sizeof when);
            if (o->json) {
                json_entry(&x, when, !shown);
                printf(",\"attempts\":%" PRIu32 ",\"payload_len\":%zu}",
                       in.attempt, in.payload_len);
            } else {
                printf("%s  attempts %-5" PRIu32 "  ", when, in.attempt);
                human_str(e[i].key, e[i].key_len);
                putchar('\n');
            }
        }
    }
    list_end(o, &c, shown, false);
    return 0;
}

/* rearm and delete: a handle that delivers nothing (journal: holding the
 * directory's lock, so a live store's directory is refused). */
static int cmd_dead_op(const struct opts *o)
{
    char err[512] = "";
    int rc = TW_ENOENT;
    /* A missing journal directory is not made (it holds no dead letter). */
    tw_durable *d = journal_missing(o) ? NULL
                                       : open_store(o, TW_DURABLE_NOFIRE, &rc,
                                                    err, sizeof err, NULL);
    if (!d) {
        open_failed(o, rc, err);
        return 2;
    }
    bool rearm = !strcmp(o->verb, "rearm");
    int64_t at = o->at;
    if (rearm && !o->have_at) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        at = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    }
    size_t kl = strlen(o->key);
    rc = rearm ? tw_durable_rearm(d, o->key, kl, at)
               : tw_durable_dead_delete(d, o->key, kl);
    int cr = tw_durable_close(d);
    if (!rc)
        rc = cr;
    if (rc && rc != TW_ENOENT) {
        verb_failed(o, rc);
        return 2;
    }
    char when[40];
    iso(at, when, sizeof when);
    if (o->json) { /* one shape: ok false when it was not a dead letter */
        printf("{\"ok\":%s,\"dead\":%s,\"key\":", rc ? "false" : "true",
               rc ? "false" : "true");
        json_str(o->key, kl);
        printf(",\"key_hex\":\"");
        hex(o->key, kl);
        if (rearm && !rc)
            printf("\",\"due_ms\":%" PRId64 ",\"due\":\"%s\"}\n", at, when);
        else
            puts("\",\"due_ms\":null,\"due\":null}");
    } else if (rc) {
        printf("%s: not a dead letter\n", o->key);
    } else {
        human_str(o->key, kl);
        if (rearm)
            printf(": re-armed, due %s (%" PRId64 " ms)\n", when, at);
        else
            puts(": deleted");
    }
    return rc ? EX_PROBLEM : EX_OK;
}

/* ------------------------------------------------------------------------ */
/* Arguments. */

static bool num(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end)
        return false;
    *out = v;
    return true;
}

/* dead --after KEY: the cursor after dead letter KEY. */
static bool parse_after_key(const char *s, tw_durable_cursor *c)
{
    size_t kl = strlen(s);
    if (!kl || kl > TW_DURABLE_KEY_MAX)
        return false;
    memset(c, 0, sizeof *c);
    c->key_len = (uint32_t)kl;
    memcpy(c->key, s, kl);
    return true;
}

static bool parse_after(const char *s, tw_durable_cursor *c)
{
    const char *comma = strchr(s, ',');
    char n[32];
    if (!comma || comma == s || (size_t)(comma - s) >= sizeof n)
        return false;
    memcpy(n, s, (size_t)(comma - s));
    n[comma - s] = '\0';
    int64_t due;
    size_t kl = strlen(comma + 1);
    if (!num(n, &due) || !kl || kl > TW_DURABLE_KEY_MAX)
        return false;
    memset(c, 0, sizeof *c);
    c->due_ms = due;
    c->key_len = (uint32_t)kl;
    memcpy(c->key, comma + 1, kl);
    return true;
}

/* Options that take no value; the rest take one. */
static bool flag_opt(const char *a, struct opts *o)
{
    bool *f = !strcmp(a, "--json")      ? &o->json
              : !strcmp(a, "--dry-run") ? &o->dry_run
              : !strcmp(a, "--metrics") ? &o->metrics
              : !strcmp(a, "--replace") ? &o->replace
                                        : NULL;
    if (f)
        *f = true;
    return f != NULL;
}

/* Option @a with value @v (NULL if none): false if bad. */
static bool value_opt(const char *a, const char *v, struct opts *o)
{
    int64_t x;
    if (!v)
        return false;
    if (!strcmp(a, "--url"))
        o->url = v;
    else if (!strcmp(a, "--ns"))
        o->ns = v;
    else if (!strcmp(a, "--out") || !strcmp(a, "--in"))
        o->file = v;
    else if (!strcmp(a, "--shards") && num(v, &x) && x > 0 && x <= 1 << 20)
        o->shards = (uint32_t)x;
    else if (!strcmp(a, "--from") && num(v, &o->from))
        ;
    else if (!strcmp(a, "--to") && num(v, &o->to))
        ;
    else if (!strcmp(a, "--limit") && num(v, &x) && x > 0)
        o->limit = (uint64_t)x;
    else if (!strcmp(a, "--after"))
        o->after_arg = v; /* ls: DUE,KEY; dead: KEY (checked by main) */
    else if (!strcmp(a, "--at") && num(v, &o->at))
        o->have_at = true;
    else
        return false;
    return true;
}

/* BACKEND VERB [DIR] [KEY] into @o; as parse(). */
static int positionals(struct opts *o, const char **pos, int npos, bool help)
{
    bool backend =
        npos > 0 && (!strcmp(pos[0], "journal") || !strcmp(pos[0], "redis") ||
                     !strcmp(pos[0], "postgres"));
    o->backend = backend ? pos[0] : NULL;
    o->verb = npos > 1 && backend ? pos[1] : npos > 0 ? pos[0] : NULL;
    if (help)
        return 1;
    if (npos < 2 || !backend)
        return -1;
    bool journal = !strcmp(o->backend, "journal");
    if (!journal && !o->url) {
        fprintf(stderr, "twheel: %s: --url %s is required\n", o->backend,
                strcmp(o->backend, "redis") ? "CONNINFO" : "HOST:PORT");
        return -1;
    }
    bool keyed = !strcmp(o->verb, "get") || !strcmp(o->verb, "rearm") ||
                 !strcmp(o->verb, "delete");
    int want = (journal ? 3 : 2) + keyed;
    if (npos != want)
        return -1;
    if (journal)
        o->dir = pos[2];
    if (keyed)
        o->key = pos[want - 1];
    return 0;
}

/* Returns 0, -1 (usage), 1 (--help: o->verb is the verb asked about, or
 * NULL) or 2 (--version). */
static int parse(int argc, char **argv, struct opts *o)
{
    memset(o, 0, sizeof *o);
    o->from = INT64_MIN;
    o->to = INT64_MAX;
    const char *pos[4];
    int npos = 0;
    bool help = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h"))
            help = true;
        else if (!strcmp(a, "--version"))
            return 2;
        else if (flag_opt(a, o))
            ;
        else if (a[0] == '-' && a[1] == '-') {
            if (!value_opt(a, i + 1 < argc ? argv[i + 1] : NULL, o)) {
                fprintf(stderr, "twheel: bad option or value: %s\n", a);
                return -1;
            }
            i++;
        } else if (npos < 4)
            pos[npos++] = a;
        else
            return -1;
    }
    return positionals(o, pos, npos, help);
}

/* A fingerprint of the names of @dir's files (0 if it cannot be read). */
static uint64_t listing(const char *dir)
{
    DIR *d = opendir(dir);
    uint64_t h = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        uint64_t x = 1469598103934665603ull;
        for (const char *p = e->d_name; *p; p++)
            x = (x ^ (unsigned char)*p) * 1099511628211ull;
        h += x; /* in any order */
    }
    if (d)
        closedir(d);
    return h;
}

/* A read-only open of a live journal races its compaction, which may
 * delete the oldest segment between the open's listing of the directory
 * and its read of that segment: an open that fails while the directory's
 * files change is tried again, up to five times. */
tw_durable *open_readonly(const struct opts *o, int *rc, char *err,
                          size_t err_len, struct dmg_list *dl)
{
    for (int i = 0;; i++) {
        uint64_t before = o->dir ? listing(o->dir) : 0;
        tw_durable *d =
            open_store(o, TW_DURABLE_READONLY, rc, err, err_len, dl);
        bool raced = !d && o->dir && (*rc == TW_EIO || *rc == TW_ENOENT) &&
                     !journal_missing(o) && listing(o->dir) != before;
        if (!raced || i == 4)
            return d;
        if (dl)
            dl->n = 0;
        nanosleep(&(struct timespec){0, 20000000}, NULL);
    }
}

/* Keys of a Redis namespace of the wrong type, each named on stderr;
 * true if there is one (exit 1). */
static bool redis_keys_warn(const struct opts *o, const struct dmg_list *l)
{
    bool any = false;
    for (size_t i = 0; i < l->n; i++) {
        char text[TW_DURABLE_KEY_MAX + 200];
        if (l->v[i].d.kind != TW_DURABLE_DAMAGE_REDIS_KEY)
            continue;
        redis_key_text(&l->v[i].d, text, sizeof text);
        fprintf(stderr, "twheel: warning: %s: damaged: %s\n", where(o), text);
        any = true;
    }
    return any;
}

/* The verbs that open the store read-only and look. */
static int read_verb(const struct opts *o,
                     int (*fn)(const struct opts *, tw_durable *))
{
    char err[512];
    int rc;
    struct dmg_list dl = {0};
    tw_durable *d = open_readonly(o, &rc, err, sizeof err, o->dir ? NULL : &dl);
    bool keys_bad = redis_keys_warn(o, &dl), damaged = false;
    free(dl.v);
    if (!d && rc == TW_EIO && o->dir && fn != cmd_get) {
        /* Damage in the middle: show what a repair would keep. */
        char e2[512];
        d = open_store(o, TW_DURABLE_READONLY | TW_DURABLE_REPAIR, &rc, e2,
                       sizeof e2, NULL);
        if (d)
            fprintf(stderr,
                    "twheel: warning: %s: damaged: %s; showing what a "
                    "repair would keep (twheel journal repair %s --dry-run "
                    "names what it drops)\n",
                    where(o), err, where(o));
        damaged = d != NULL;
    }
    if (!d) {
        open_failed(o, rc, err);
        return EX_ERROR;
    }
    int res = fn(o, d);
    tw_durable_close(d);
    return keys_bad ? EX_PROBLEM : res ? res : damaged ? EX_PROBLEM : EX_OK;
}

int main(int argc, char **argv)
{
    struct opts o;
    int p = parse(argc, argv, &o);
    if (p == 2)
        return printf("twheel %d.%d.%d (libtwheel %s)\n", TW_VERSION_MAJOR,
                      TW_VERSION_MINOR, TW_VERSION_PATCH, tw_version_string()),
               EX_OK;
    if (p == 1)
        return help(stdout, o.verb, EX_OK);
    if (p < 0)
        return help(stderr, o.verb, EX_ERROR);
    if (o.after_arg && strcmp(o.verb, "jobs") != 0 && /* jobs: an id */
        !(strcmp(o.verb, "dead") ? parse_after(o.after_arg, &o.after)
                                 : parse_after_key(o.after_arg, &o.after))) {
        fprintf(stderr, "twheel: bad --after: %s (ls: DUE,KEY; dead: KEY)\n",
                o.after_arg);
        return EX_ERROR;
    }
    if (o.key && (!*o.key || strlen(o.key) > TW_DURABLE_KEY_MAX)) {
        fputs("twheel: a key is 1 to 1024 bytes\n", stderr);
        return EX_ERROR;
    }
    if (!strcmp(o.verb, "repair"))
        return cmd_repair(&o);
    if (!strcmp(o.verb, "check"))
        return cmd_check(&o);
    if (!strcmp(o.verb, "rearm") || !strcmp(o.verb, "delete"))
        return cmd_dead_op(&o);
    if (!strcmp(o.verb, "import"))
        return cmd_import(&o);
    if (!strcmp(o.verb, "init"))
        return cmd_init(&o);
    int (*fn)(const struct opts *, tw_durable *) =
        !strcmp(o.verb, "ls")       ? cmd_ls
        : !strcmp(o.verb, "get")    ? cmd_get
        : !strcmp(o.verb, "stats")  ? cmd_stats
        : !strcmp(o.verb, "dead")   ? cmd_dead
        : !strcmp(o.verb, "export") ? cmd_export
        : !strcmp(o.verb, "jobs")   ? cmd_jobs
                                    : NULL;
    if (!fn)
        return help(stderr, NULL, EX_ERROR);
    return read_verb(&o, fn);
}
