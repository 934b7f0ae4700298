/* SPDX-License-Identifier: MIT */
/*
 * tools/twheel/init.c - twheel postgres init: install the schema twheel
 * (tables and SQL functions), or bring an older one up to the library's
 * version, without starting a node: what tw_durable_open() does to the
 * database, done once by an operator (a role that may create the schema)
 * before nodes that may not.
 *
 * It opens the namespace with TW_DURABLE_NOFIRE (the install, under the
 * library's advisory lock, and the privilege checks of open; no firing
 * thread, nothing claimed or delivered) and closes it. A read-only open
 * before it tells whether the schema was there already. Run again, it
 * changes nothing (exit 0); a schema newer than the library is refused by
 * open, with both versions in the message (exit 2).
 */
#include <stdbool.h>
#include <string.h>

#include "twheel.h"

int cmd_init(const struct opts *o)
{
    char err[512];
    int rc;
    if (strcmp(o->backend, "postgres")) {
        const char *m = "init is for postgres (a journal or a Redis "
                        "namespace is made by its first open)";
        fprintf(stderr, "twheel: %s\n", m);
        json_fail(o, m);
        return EX_ERROR;
    }
    tw_durable *d =
        open_store(o, TW_DURABLE_READONLY, &rc, err, sizeof err, NULL);
    /* There already, not there (TW_ENOENT), or of another version. */
    bool there = d != NULL, installed = !d && rc == TW_ENOENT;
    tw_durable_close(d);
    d = open_store(o, TW_DURABLE_NOFIRE, &rc, err, sizeof err, NULL);
    if (!d) {
        open_failed(o, rc, err);
        return EX_ERROR;
    }
    rc = tw_durable_close(d);
    if (rc) {
        open_failed(o, rc, "close");
        return EX_ERROR;
    }
    if (o->json)
        printf("{\"ok\":true,\"installed\":%s,\"upgraded\":%s,"
               "\"error\":null}\n",
               installed ? "true" : "false",
               !there && !installed ? "true" : "false");
    else
        printf("%s: schema twheel %s\n", where(o),
               there       ? "up to date: nothing to do"
               : installed ? "installed"
                           : "brought up to this library's version");
    return EX_OK;
}
