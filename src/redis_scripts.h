/* SPDX-License-Identifier: MIT */
/*
 * src/redis_scripts.h - the Lua scripts of the Redis backend and the keys
 * they take. src/redis_scripts.c holds their text and the data model they
 * keep (what each of a shard's keys holds, tokens, versions, quarantine);
 * the backend's other files send them by these ids.
 */
#ifndef TWHEEL_REDIS_SCRIPTS_H
#define TWHEEL_REDIS_SCRIPTS_H

/* The keys of one shard, in the order every script takes them: :d :p :s
 * :v :q :x (tw__redis_key_suffix). */
#define NKEYS 6

/* The scripts that change a shard, sent by EVALSHA (EVAL on NOSCRIPT). */
enum {
    S_SCHED,
    S_CANCEL,
    S_CLAIM,
    S_DONE,
    S_RELEASE,
    S_REARM,
    S_DDEL,
    S_TOUCH,
    S_SCHED_IF,
    S_RESTORE,
    S_COUNT
};

extern const char *const tw__redis_scripts[S_COUNT];
extern const char tw__redis_key_suffix[NKEYS];

/* The read-only scripts of tw_durable_get(), _list_dead(), _list() and
 * _scan(), sent by EVAL (src/redis_query.c). */
extern const char tw__redis_get_script[];
extern const char tw__redis_dead_script[];
extern const char tw__redis_list_script[];
extern const char tw__redis_scan_script[];

#endif
