/* SPDX-License-Identifier: MIT */
/*
 * proto.c - the beanstalkd command-line parser of twheeld.
 *
 * A line is a command name, then its arguments, each after a space, and
 * nothing after the last. A name that takes arguments but stands alone
 * ("delete") is an unknown command, as in beanstalkd, whose matching
 * requires the space; any other mismatch of the argument list (missing,
 * extra, negative, out of range, a bad tube name) is BAD_FORMAT. Numbers
 * are decimal digits only, after one or more spaces; a tube name follows
 * exactly one.
 */
#include "proto.h"

#include <string.h>

/* How a command's arguments are read. */
enum shape {
    S_NONE,    /* no argument */
    S_PUT,     /* pri delay ttr bytes */
    S_TUBE,    /* tube */
    S_ID,      /* id */
    S_TIMEOUT, /* seconds */
    S_RELEASE, /* id pri delay */
    S_BURY,    /* id pri */
    S_KICK,    /* bound */
    S_PAUSE    /* tube delay */
};

static const struct {
    const char *name;
    unsigned char shape;
} cmds[TBD_OP_COUNT] = {
    [TBD_PUT] = {"put", S_PUT},
    [TBD_USE] = {"use", S_TUBE},
    [TBD_RESERVE] = {"reserve", S_NONE},
    [TBD_RESERVE_TIMEOUT] = {"reserve-with-timeout", S_TIMEOUT},
    [TBD_RESERVE_JOB] = {"reserve-job", S_ID},
    [TBD_DELETE] = {"delete", S_ID},
    [TBD_RELEASE] = {"release", S_RELEASE},
    [TBD_BURY] = {"bury", S_BURY},
    [TBD_TOUCH] = {"touch", S_ID},
    [TBD_WATCH] = {"watch", S_TUBE},
    [TBD_IGNORE] = {"ignore", S_TUBE},
    [TBD_PEEK] = {"peek", S_ID},
    [TBD_PEEK_READY] = {"peek-ready", S_NONE},
    [TBD_PEEK_DELAYED] = {"peek-delayed", S_NONE},
    [TBD_PEEK_BURIED] = {"peek-buried", S_NONE},
    [TBD_KICK] = {"kick", S_KICK},
    [TBD_KICK_JOB] = {"kick-job", S_ID},
    [TBD_STATS_JOB] = {"stats-job", S_ID},
    [TBD_STATS_TUBE] = {"stats-tube", S_TUBE},
    [TBD_STATS] = {"stats", S_NONE},
    [TBD_LIST_TUBES] = {"list-tubes", S_NONE},
    [TBD_LIST_TUBE_USED] = {"list-tube-used", S_NONE},
    [TBD_LIST_TUBES_WATCHED] = {"list-tubes-watched", S_NONE},
    [TBD_PAUSE_TUBE] = {"pause-tube", S_PAUSE},
    [TBD_QUIT] = {"quit", S_NONE},
};

const char *tbd_op_name(int op)
{
    if (op < 0 || op >= TBD_OP_COUNT)
        return "?";
    return cmds[op].name;
}

/* A cursor over the argument bytes. */
struct rd {
    const char *p;
    const char *end;
};

/* Reads " <digits>" into *v if it fits in @max; 0 or -1. */
static int rd_num(struct rd *r, uint64_t max, uint64_t *v)
{
    if (r->p >= r->end || *r->p != ' ')
        return -1;
    /* beanstalkd reads numbers with strtoul(), which skips blanks. */
    while (r->p < r->end && *r->p == ' ')
        r->p++;
    const char *start = r->p;
    uint64_t n = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9') {
        unsigned d = (unsigned)(*r->p - '0');
        if (n > (max - d) / 10)
            return -1;
        n = n * 10 + d;
        r->p++;
    }
    if (r->p == start)
        return -1;
    *v = n;
    return 0;
}

static int rd_u32(struct rd *r, uint32_t *v)
{
    uint64_t n;
    if (rd_num(r, UINT32_MAX, &n) != 0)
        return -1;
    *v = (uint32_t)n;
    return 0;
}

static int name_char(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
           (c >= '0' && c <= '9') || (c != 0 && strchr("-+/;.$_()", c));
}

bool tbd_tube_name_ok(const char *name, size_t len)
{
    if (len == 0 || len > TBD_TUBE_NAME_MAX || *name == '-')
        return false;
    for (size_t i = 0; i < len; i++)
        if (!name_char((unsigned char)name[i]))
            return false;
    return true;
}

/* Reads " <tube name>" up to the next space or the end. */
static int rd_tube(struct rd *r, struct tbd_cmd *out)
{
    if (r->p >= r->end || *r->p != ' ')
        return -1;
    r->p++;
    const char *start = r->p;
    while (r->p < r->end && *r->p != ' ') {
        if (!name_char((unsigned char)*r->p))
            return -1;
        r->p++;
    }
    size_t n = (size_t)(r->p - start);
    if (!tbd_tube_name_ok(start, n))
        return -1;
    memcpy(out->tube, start, n);
    out->tube[n] = '\0';
    out->tube_len = n;
    return 0;
}

static int parse_args(int shape, struct rd *r, struct tbd_cmd *c)
{
    switch (shape) {
    case S_NONE:
        return 0;
    case S_PUT:
        if (rd_u32(r, &c->pri) || rd_u32(r, &c->delay) || rd_u32(r, &c->ttr))
            return -1;
        return rd_num(r, UINT32_MAX, &c->bytes);
    case S_TUBE:
        return rd_tube(r, c);
    case S_ID:
        return rd_num(r, UINT64_MAX, &c->id);
    case S_TIMEOUT:
        return rd_u32(r, &c->timeout);
    case S_RELEASE:
        if (rd_num(r, UINT64_MAX, &c->id) || rd_u32(r, &c->pri))
            return -1;
        return rd_u32(r, &c->delay);
    case S_BURY:
        if (rd_num(r, UINT64_MAX, &c->id))
            return -1;
        return rd_u32(r, &c->pri);
    case S_KICK:
        return rd_u32(r, &c->bound);
    case S_PAUSE:
        if (rd_tube(r, c))
            return -1;
        return rd_u32(r, &c->delay);
    default:
        return -1;
    }
}

int tbd_parse(const char *line, size_t len, struct tbd_cmd *out)
{
    memset(out, 0, sizeof(*out));
    /* A command that takes arguments: its name and a space. */
    for (int op = 0; op < TBD_OP_COUNT; op++) {
        int shape = cmds[op].shape;
        size_t nl = strlen(cmds[op].name);
        if (shape == S_NONE || len <= nl || line[nl] != ' ' ||
            memcmp(line, cmds[op].name, nl) != 0)
            continue;
        struct rd r = {line + nl, line + len};
        if (parse_args(shape, &r, out) != 0 || r.p != r.end)
            return out->op = TBD_BAD_FORMAT;
        return out->op = op;
    }
    /* One without: matched as a prefix, longest name first, so
     * "stats-job" alone is "stats" with trailing bytes, BAD_FORMAT, as in
     * beanstalkd; "quit" ignores what follows it. */
    int best = -1;
    size_t best_len = 0;
    for (int op = 0; op < TBD_OP_COUNT; op++) {
        size_t nl = strlen(cmds[op].name);
        if (cmds[op].shape != S_NONE || len < nl || nl <= best_len ||
            memcmp(line, cmds[op].name, nl) != 0)
            continue;
        best = op;
        best_len = nl;
    }
    if (best >= 0) {
        if (best_len == len || best == TBD_QUIT)
            return out->op = best;
        return out->op = TBD_BAD_FORMAT;
    }
    if (len == 10 && memcmp(line, "pause-tube", 10) == 0)
        return out->op = TBD_BAD_FORMAT;
    return out->op = TBD_UNKNOWN;
}
