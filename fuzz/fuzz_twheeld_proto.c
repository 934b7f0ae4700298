/* SPDX-License-Identifier: MIT */
/*
 * fuzz/fuzz_twheeld_proto.c - twheeld's command-line parser on any bytes.
 *
 * Every input is parsed as one line. Besides memory safety (ASan, UBSan)
 * the harness checks: the result is a known command, UNKNOWN or
 * BAD_FORMAT; a tube name is 1..200 allowed bytes not starting with '-';
 * and a command that parsed, written back in its canonical form, parses
 * to the same command with the same arguments.
 */
#include "fuzz.h"
#include "proto.h"

#include <string.h>

static int print_cmd(const struct tbd_cmd *c, char *buf, size_t n)
{
    const char *name = tbd_op_name(c->op);
    switch (c->op) {
    case TBD_PUT:
        return snprintf(buf, n, "%s %u %u %u %" PRIu64, name, c->pri, c->delay,
                        c->ttr, c->bytes);
    case TBD_USE:
    case TBD_WATCH:
    case TBD_IGNORE:
    case TBD_STATS_TUBE:
        return snprintf(buf, n, "%s %s", name, c->tube);
    case TBD_RESERVE_TIMEOUT:
        return snprintf(buf, n, "%s %u", name, c->timeout);
    case TBD_RESERVE_JOB:
    case TBD_DELETE:
    case TBD_TOUCH:
    case TBD_PEEK:
    case TBD_KICK_JOB:
    case TBD_STATS_JOB:
        return snprintf(buf, n, "%s %" PRIu64, name, c->id);
    case TBD_RELEASE:
        return snprintf(buf, n, "%s %" PRIu64 " %u %u", name, c->id, c->pri,
                        c->delay);
    case TBD_BURY:
        return snprintf(buf, n, "%s %" PRIu64 " %u", name, c->id, c->pri);
    case TBD_KICK:
        return snprintf(buf, n, "%s %u", name, c->bound);
    case TBD_PAUSE_TUBE:
        return snprintf(buf, n, "%s %s %u", name, c->tube, c->delay);
    default:
        return snprintf(buf, n, "%s", name);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct tbd_cmd a, b;
    int op = tbd_parse((const char *)data, size, &a);
    FZ_CHECK(op == a.op, "return %d, op %d", op, a.op);
    FZ_CHECK(op >= TBD_BAD_FORMAT && op < TBD_OP_COUNT, "op %d", op);
    if (op < 0)
        return 0;
    if (a.tube_len) {
        FZ_CHECK(a.tube_len <= TBD_TUBE_NAME_MAX, "tube %zu", a.tube_len);
        FZ_CHECK(strlen(a.tube) == a.tube_len, "tube NUL");
        FZ_CHECK(a.tube[0] != '-', "tube starts with -");
    }
    char line[512];
    int n = print_cmd(&a, line, sizeof(line));
    FZ_CHECK(n > 0 && (size_t)n < sizeof(line), "print %d", n);
    FZ_CHECK(tbd_parse(line, (size_t)n, &b) == op, "reparse of %s", line);
    FZ_CHECK(a.id == b.id && a.pri == b.pri && a.delay == b.delay &&
                 a.ttr == b.ttr && a.timeout == b.timeout &&
                 a.bytes == b.bytes && a.bound == b.bound &&
                 a.tube_len == b.tube_len &&
                 memcmp(a.tube, b.tube, a.tube_len) == 0,
             "reparse of %s differs", line);
    return 0;
}
