/* SPDX-License-Identifier: MIT */
/*
 * tools/twheel/twheel.h - what the files of the twheel tool share: the
 * parsed command line, opening a store, and output helpers (twheel.c),
 * check and repair (check.c), export and import (port.c), postgres init
 * (init.c), --json documents of verbs that could not run (fail.c).
 */
#ifndef TWHEEL_TOOL_H
#define TWHEEL_TOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <twheel/durable.h>

#define PAGE 1000

/* Exit statuses (twheel(1)). */
#define EX_OK 0
#define EX_PROBLEM 1 /* damage, a key not held, not a dead letter */
#define EX_ERROR 2   /* usage or another error */
#define EX_WARN                                                                \
    3 /* check: sound, but a torn tail was ignored or                          \
         nothing is there */

struct opts {
    const char *backend; /* "journal", "redis" or "postgres" */
    const char *verb;
    const char *dir;  /* journal */
    const char *url;  /* redis: host:port[,...]; postgres: conninfo */
    const char *ns;   /* redis or postgres namespace */
    uint32_t shards;  /* redis */
    const char *key;  /* get, rearm, delete */
    const char *file; /* export --out, import --in: NULL = stdout, stdin */
    int64_t at;       /* rearm --at MS */
    bool have_at;
    int64_t from, to; /* ls */
    uint64_t limit;   /* ls, dead: 0 = all */
    bool json, dry_run, metrics, replace;
    const char *after_arg;   /* --after as given */
    tw_durable_cursor after; /* from it: ls DUE,KEY; dead KEY */
};

/* A damage report of an open, copied (cfg.on_damage). */
struct dmg {
    tw_durable_damage d; /* d.key points into @key (NULL if unknown) */
    unsigned char key[TW_DURABLE_KEY_MAX];
};
struct dmg_list {
    struct dmg *v;
    size_t n, cap;
    bool lost; /* out of memory: some reports were not kept */
};
void dmg_collect(void *arg, const tw_durable_damage *d);
void redis_key_text(const tw_durable_damage *r, char *buf, size_t len);

/* twheel.c */
tw_durable *open_store(const struct opts *o, uint32_t flags, int *rc, char *err,
                       size_t err_len, struct dmg_list *dl);
tw_durable *open_readonly(const struct opts *o, int *rc, char *err,
                          size_t err_len, struct dmg_list *dl);
const char *where(const struct opts *o);
bool journal_missing(const struct opts *o);
void open_failed(const struct opts *o, int rc, const char *err);
void json_str(const void *p, size_t n);
void json_str_f(FILE *f, const void *p, size_t n);
void human_str(const void *p, size_t n);
void human_str_f(FILE *f, const void *p, size_t n);
void hex(const void *p, size_t n);
void iso(int64_t ms, char *out, size_t len);
const char *state_name(uint32_t st);

/* fail.c: with --json, @o->verb's whole document with "error": @msg. */
void json_fail(const struct opts *o, const char *msg);

/* help.c: the usage text, or @verb's (NULL: the general one). */
int help(FILE *f, const char *verb, int rc);

/* check.c */
int cmd_check(const struct opts *o);
int cmd_repair(const struct opts *o);

/* init.c */
int cmd_init(const struct opts *o);

/* jobs.c */
int cmd_jobs(const struct opts *o, tw_durable *d);

/* port.c */
int cmd_export(const struct opts *o, tw_durable *d);
int cmd_import(const struct opts *o);

#endif
