/* SPDX-License-Identifier: MIT */
/*
 * proto.h - the beanstalkd command-line parser of twheeld.
 *
 * tbd_parse() turns one command line (without its "\r\n") into a command
 * and its arguments. It is a pure function: no allocation, no global
 * state, so the fuzz harness calls it on any bytes.
 */
#ifndef TWHEELD_PROTO_H
#define TWHEELD_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TBD_LINE_MAX 224      /* longest command line, "\r\n" included */
#define TBD_TUBE_NAME_MAX 200 /* longest tube name, in bytes */

enum tbd_op {
    TBD_BAD_FORMAT = -2,
    TBD_UNKNOWN = -1,
    TBD_PUT = 0,
    TBD_USE,
    TBD_RESERVE,
    TBD_RESERVE_TIMEOUT,
    TBD_RESERVE_JOB,
    TBD_DELETE,
    TBD_RELEASE,
    TBD_BURY,
    TBD_TOUCH,
    TBD_WATCH,
    TBD_IGNORE,
    TBD_PEEK,
    TBD_PEEK_READY,
    TBD_PEEK_DELAYED,
    TBD_PEEK_BURIED,
    TBD_KICK,
    TBD_KICK_JOB,
    TBD_STATS_JOB,
    TBD_STATS_TUBE,
    TBD_STATS,
    TBD_LIST_TUBES,
    TBD_LIST_TUBE_USED,
    TBD_LIST_TUBES_WATCHED,
    TBD_PAUSE_TUBE,
    TBD_QUIT,
    TBD_OP_COUNT
};

/* A parsed command; which fields are set depends on the op. */
struct tbd_cmd {
    int op;                           /* enum tbd_op */
    uint64_t id;                      /* job id */
    uint32_t pri;                     /* put, release, bury */
    uint32_t delay;                   /* seconds: put, release, pause */
    uint32_t ttr;                     /* seconds: put */
    uint32_t timeout;                 /* reserve-with-timeout */
    uint64_t bytes;                   /* put: body length */
    uint32_t bound;                   /* kick */
    size_t tube_len;                  /* use, watch, ignore, ... */
    char tube[TBD_TUBE_NAME_MAX + 1]; /* NUL-terminated */
};

/*
 * tbd_parse - parse @len bytes at @line (no "\r\n") into *@out.
 * Returns out->op: a command, TBD_UNKNOWN_COMMAND or TBD_BAD_FORMAT.
 */
int tbd_parse(const char *line, size_t len, struct tbd_cmd *out);

/* True when the @len bytes at @name are a tube name a client may send:
 * 1 to TBD_TUBE_NAME_MAX of [A-Za-z0-9-+/;.$_()], not starting with '-'. */
bool tbd_tube_name_ok(const char *name, size_t len);

/* The protocol name of @op ("put", "reserve-with-timeout", ...). */
const char *tbd_op_name(int op);

#endif
