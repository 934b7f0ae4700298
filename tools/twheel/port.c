/* SPDX-License-Identifier: MIT */
/*
 * tools/twheel/port.c - twheel export and import: every timer and dead
 * letter of a store as JSON lines, and those lines put back into a store
 * of either backend (tw_durable_scan() out, tw_durable_restore() in).
 *
 * One object a line:
 *   {"key":"t001","key_b64":"dDAwMQ==","due_ms":1796651283885,
 *    "dead":false,"attempt":1,"payload_b64":"cDE="}
 * key_b64 and payload_b64 are the exact bytes (standard base64, padded);
 * "key" is the key as the tool's other JSON shows it (code points are
 * bytes), for people and jq, and is read by import only when key_b64 is
 * missing. attempt: a pending timer's next delivery, or the attempts a
 * dead letter had. Lines come in no particular order (a scan's).
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "twheel.h"

static const char b64[] =
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static void b64_put(FILE *f, const void *p, size_t n)
{
    const unsigned char *s = p;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)s[i + 1] << 8;
        if (i + 2 < n)
            v |= s[i + 2];
        char o[4] = {b64[v >> 18], b64[(v >> 12) & 63],
                     i + 1 < n ? b64[(v >> 6) & 63] : '=',
                     i + 2 < n ? b64[v & 63] : '='};
        fwrite(o, 1, 4, f);
    }
}

/* Decode @n chars of base64 at @s into @out (room for n / 4 * 3);
 * returns the bytes, or -1 if it is not base64. */
static long b64_get(const char *s, size_t n, unsigned char *out)
{
    if (n % 4)
        return -1;
    long len = 0;
    for (size_t i = 0; i < n; i += 4) {
        uint32_t v = 0;
        int pad = 0;
        for (int j = 0; j < 4; j++) {
            const char *c = s[i + j] ? strchr(b64, s[i + j]) : NULL;
            if (s[i + j] == '=' && i + 4 == n && j >= 2)
                pad++;
            else if (!c || pad)
                return -1;
            v = v << 6 | (uint32_t)(c ? c - b64 : 0);
        }
        unsigned char b[3] = {(unsigned char)(v >> 16), (unsigned char)(v >> 8),
                              (unsigned char)v};
        memcpy(out + len, b, (size_t)(3 - pad));
        len += 3 - pad;
    }
    return len;
}

/* ------------------------------------------------------------------------ */
/* Export. */

struct exp {
    FILE *f;
    uint64_t timers, dead;
};

static int export_one(void *arg, const tw_durable_scanned *t)
{
    struct exp *x = arg;
    bool dead = t->state == TW_DURABLE_DEAD;
    fputs("{\"key\":", x->f);
    json_str_f(x->f, t->key, t->key_len);
    fputs(",\"key_b64\":\"", x->f);
    b64_put(x->f, t->key, t->key_len);
    fprintf(x->f,
            "\",\"due_ms\":%" PRId64 ",\"dead\":%s,\"attempt\":%" PRIu32
            ",\"payload_b64\":\"",
            t->due_ms, dead ? "true" : "false", t->attempt);
    b64_put(x->f, t->payload, t->payload_len);
    fputs("\"}\n", x->f);
    *(dead ? &x->dead : &x->timers) += 1;
    return ferror(x->f) ? TW_EIO : 0;
}

/* Into @o->file through a temporary file beside it, synced and renamed:
 * the file is whole or absent. */
int cmd_export(const struct opts *o, tw_durable *d)
{
    char tmp[4096];
    struct exp x = {.f = stdout};
    if (o->file) {
        snprintf(tmp, sizeof tmp, "%s.tmp%ld", o->file, (long)getpid());
        if (!(x.f = fopen(tmp, "w"))) {
            fprintf(stderr, "twheel: %s: %s\n", tmp, strerror(errno));
            return EX_ERROR;
        }
    }
    long n = tw_durable_scan(d, export_one, &x);
    int bad = n < 0 || fflush(x.f) != 0;
    if (o->file) {
        bad |= fsync(fileno(x.f)) != 0;
        bad |= fclose(x.f) != 0;
        if (!bad && rename(tmp, o->file) != 0)
            bad = 1;
        if (bad)
            unlink(tmp);
    }
    if (bad) {
        fprintf(stderr, "twheel: export: %s\n",
                n < 0 ? tw_strerror((int)n) : strerror(errno));
        return EX_ERROR;
    }
    if (o->file)
        fprintf(stderr,
                "twheel: exported %" PRIu64 " pending timers and %" PRIu64
                " dead letters into %s\n",
                x.timers, x.dead, o->file);
    return EX_OK;
}

/* ------------------------------------------------------------------------ */
/* Import. */

/* One line as read: the fields import uses (others are ignored). */
struct item {
    unsigned char key[TW_DURABLE_KEY_MAX];
    size_t key_len;
    unsigned char *payload; /* into the line's decode buffer */
    size_t payload_len;
    int64_t due_ms;
    uint32_t attempt;
    bool dead, have_key, have_due, have_b64key;
};

static const char *ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
        p++;
    return p;
}

/* A JSON string at @p (after its quote) decoded into @out (room for as
 * many bytes as the string has chars): \u escapes must be <= 0xff, each
 * one byte (the tool's own strings). Returns the end, or NULL. */
static const char *jstring(const char *p, unsigned char *out, size_t *len)
{
    static const char esc[] = "\"\"\\\\//b\bf\fn\nr\rt\t";
    size_t n = 0;
    for (; *p && *p != '"'; p++) {
        if (*p != '\\') {
            out[n++] = (unsigned char)*p;
            continue;
        }
        p++;
        const char *e = *p ? strchr(esc, *p) : NULL;
        if (*p == 'u') {
            unsigned v;
            if (sscanf(p + 1, "%4x", &v) != 1 || v > 0xff)
                return NULL;
            out[n++] = (unsigned char)v;
            p += 4;
        } else if (e && (e - esc) % 2 == 0) {
            out[n++] = (unsigned char)e[1];
        } else {
            return NULL;
        }
    }
    *len = n;
    return *p == '"' ? p + 1 : NULL;
}

/* String field @name's decoded value @v (@n bytes) into @it. */
static bool str_field(const char *name, const unsigned char *v, size_t n,
                      struct item *it)
{
    long k;
    if (!strcmp(name, "key_b64")) {
        unsigned char tmp[TW_DURABLE_KEY_MAX + 3];
        if (n > (TW_DURABLE_KEY_MAX + 2) / 3 * 4 ||
            (k = b64_get((const char *)v, n, tmp)) < 1 ||
            k > (long)TW_DURABLE_KEY_MAX)
            return false;
        memcpy(it->key, tmp, (size_t)k);
        it->key_len = (size_t)k;
        it->have_key = it->have_b64key = true;
    } else if (!strcmp(name, "key") && !it->have_b64key) {
        if (!n || n > TW_DURABLE_KEY_MAX)
            return false;
        memcpy(it->key, v, n);
        it->key_len = n;
        it->have_key = true;
    } else if (!strcmp(name, "payload_b64")) {
        if ((k = b64_get((const char *)v, n, it->payload)) < 0 ||
            k > (long)TW_DURABLE_PAYLOAD_MAX)
            return false;
        it->payload_len = (size_t)k;
    }
    return true;
}

/* Field @name's value at @p into @it (@buf: room for a decoded string).
 * Returns the end of the value, or NULL. */
static const char *field(const char *name, const char *p, unsigned char *buf,
                         struct item *it)
{
    size_t n;
    if (*p == '"') {
        p = jstring(p + 1, buf, &n);
        return p && str_field(name, buf, n, it) ? p : NULL;
    }
    if (!strncmp(p, "true", 4) || !strncmp(p, "false", 5)) {
        if (!strcmp(name, "dead"))
            it->dead = *p == 't';
        return p + (*p == 't' ? 4 : 5);
    }
    if (!strncmp(p, "null", 4))
        return p + 4;
    char *end;
    errno = 0;
    long long v = strtoll(p, &end, 10);
    if (end == p || errno || *end == '.' || *end == 'e' || *end == 'E')
        return NULL;
    if (!strcmp(name, "due_ms"))
        it->due_ms = v, it->have_due = true;
    else if (!strcmp(name, "attempt") && v >= 0 && v <= UINT32_MAX)
        it->attempt = (uint32_t)v;
    else if (!strcmp(name, "attempt"))
        return NULL;
    return end;
}

/* One line of an export into @it; @buf, @pay: room for the line's
 * length. false if it is not one. */
static bool parse_line(const char *p, unsigned char *buf, unsigned char *pay,
                       struct item *it)
{
    memset(it, 0, sizeof *it);
    it->payload = pay;
    p = ws(p);
    if (*p++ != '{')
        return false;
    for (p = ws(p); *p != '}';) {
        char name[32];
        size_t n;
        if (*p != '"' || !(p = jstring(p + 1, buf, &n)) || n >= sizeof name)
            return false;
        memcpy(name, buf, n);
        name[n] = 0;
        p = ws(p);
        if (*p++ != ':' || !(p = field(name, ws(p), buf, it)))
            return false;
        p = ws(p);
        if (*p == ',')
            p = ws(p + 1);
        else if (*p != '}')
            return false;
    }
    return *ws(p + 1) == 0 && it->have_key && it->have_due;
}

struct imp {
    uint64_t timers, dead, held, replaced;
};

/* Restore @it into @d: with @replace, a key held already is cancelled (or
 * deleted, a dead letter) and restored again. */
static int restore_one(tw_durable *d, const struct item *it, bool replace,
                       struct imp *r)
{
    tw_durable_scanned t = {
        .key = it->key,
        .key_len = it->key_len,
        .payload = it->payload,
        .payload_len = it->payload_len,
        .due_ms = it->due_ms,
        .attempt = it->attempt,
        .state = it->dead ? TW_DURABLE_DEAD : TW_DURABLE_WAITING,
    };
    int rc = tw_durable_restore(d, &t);
    for (int i = 0; rc == TW_EEXIST && replace && i < 3; i++) {
        int c = tw_durable_cancel(d, it->key, it->key_len);
        if (c == TW_ENOENT)
            c = tw_durable_dead_delete(d, it->key, it->key_len);
        if (c && c != TW_ENOENT)
            return c;
        rc = tw_durable_restore(d, &t);
        r->replaced += rc == 0;
    }
    if (!rc)
        *(it->dead ? &r->dead : &r->timers) += 1;
    return rc;
}

static void import_print(const struct opts *o, const struct imp *r, int rc)
{
    if (o->json) {
        printf("{\"ok\":%s,\"timers\":%" PRIu64 ",\"dead\":%" PRIu64
               ",\"held\":%" PRIu64 ",\"replaced\":%" PRIu64 "}\n",
               rc ? "false" : "true", r->timers, r->dead, r->held, r->replaced);
        return;
    }
    printf("%s: imported %" PRIu64 " pending timers and %" PRIu64
           " dead letters (%" PRIu64 " replaced)",
           where(o), r->timers, r->dead, r->replaced);
    if (r->held)
        printf("; %" PRIu64 " keys held already, left as they were "
               "(--replace replaces them)",
               r->held);
    putchar('\n');
}

/* The lines of @in into @d; EX_OK, EX_PROBLEM (keys held already) or
 * EX_ERROR (a bad line or a failed restore: the lines before it are in). */
static int import_lines(const struct opts *o, FILE *in, tw_durable *d,
                        struct imp *r)
{
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    unsigned char *buf = NULL, *pay = NULL;
    ssize_t len;
    int res = EX_OK;
    while (res != EX_ERROR && (len = getline(&line, &cap, in)) > 0) {
        lineno++;
        if (!*ws(line))
            continue;
        struct item it;
        unsigned char *b = realloc(buf, (size_t)len + 1);
        unsigned char *p = b ? realloc(pay, (size_t)len + 1) : NULL;
        buf = b ? b : buf, pay = p ? p : pay;
        if (!b || !p) {
            fputs("twheel: out of memory\n", stderr);
            res = EX_ERROR;
        } else if (!parse_line(line, buf, pay, &it)) {
            fprintf(stderr, "twheel: line %zu: not a line of twheel export\n",
                    lineno);
            res = EX_ERROR;
        } else {
            int rc = restore_one(d, &it, o->replace, r);
            if (rc == TW_EEXIST) {
                fprintf(stderr, "twheel: line %zu: ", lineno);
                fflush(stderr);
                human_str_f(stderr, it.key, it.key_len);
                fputs(": held already, left as it is\n", stderr);
                r->held++, res = EX_PROBLEM;
            } else if (rc) {
                fprintf(stderr, "twheel: line %zu: %s\n", lineno,
                        tw_strerror(rc));
                res = EX_ERROR;
            }
        }
    }
    if (res != EX_ERROR && ferror(in)) {
        fprintf(stderr, "twheel: read: %s\n", strerror(errno));
        res = EX_ERROR;
    }
    free(line), free(buf), free(pay);
    return res;
}

int cmd_import(const struct opts *o)
{
    FILE *in = o->file ? fopen(o->file, "r") : stdin;
    if (!in) {
        char m[1200];
        snprintf(m, sizeof m, "%s: %s", o->file, strerror(errno));
        fprintf(stderr, "twheel: %s\n", m);
        json_fail(o, m);
        return EX_ERROR;
    }
    char err[512];
    int rc;
    tw_durable *d =
        open_store(o, TW_DURABLE_NOFIRE, &rc, err, sizeof err, NULL);
    if (!d) {
        open_failed(o, rc, err);
        if (o->file)
            fclose(in);
        return EX_ERROR;
    }
    struct imp r = {0};
    int res = import_lines(o, in, d, &r);
    if (o->file)
        fclose(in);
    rc = tw_durable_close(d);
    if (rc) {
        fprintf(stderr, "twheel: %s: close: %s\n", where(o), tw_strerror(rc));
        res = EX_ERROR;
    }
    import_print(o, &r, res);
    return res;
}
