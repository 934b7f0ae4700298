/* SPDX-License-Identifier: MIT */
/*
 * tests/test_durable_semantics.c - tests/durable_semantics.c on one
 * backend. Usage:
 *   test_durable_semantics                 the journal, in a temp directory
 *   test_durable_semantics suite ADDRESS   Redis (tests/redis_test.sh runs
 *                                          it; TW_SEM_REDIS may name the
 *                                          address instead; TW_SEM_PASSWORD
 *                                          and TW_SEM_TLS_CA, _CERT, _KEY
 *                                          set the password and TLS files,
 *                                          TW_SEM_SHARD_LEASE_MS turns on
 *                                          shard ownership)
 */
#define _GNU_SOURCE

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "durable_semantics.h"

#define STORES 64
static char names[STORES][160];
static int nnames;

static const char *keep(const char *fmt, const char *a, const char *b)
{
    if (nnames >= STORES)
        abort();
    snprintf(names[nnames], sizeof names[nnames], fmt, a, b);
    return names[nnames++];
}

static void journal_setup(tw_durable_config *cfg, const char *store, void *arg)
{
    cfg->dir = keep("%s/%s", (const char *)arg, store);
}

static char ns_prefix[64];

static void redis_setup(tw_durable_config *cfg, const char *store, void *arg)
{
    cfg->redis = arg;
    cfg->redis_namespace = keep("%s%s", ns_prefix, store);
    cfg->shards = 8;
    cfg->horizon_ms = 300; /* the claimer runs every 75 ms of real time */
    /* A server set up as in production (tests/redis_prod.sh tls-cluster). */
    cfg->redis_password = getenv("TW_SEM_PASSWORD");
    cfg->redis_tls_ca_file = getenv("TW_SEM_TLS_CA");
    cfg->redis_tls_cert_file = getenv("TW_SEM_TLS_CERT");
    cfg->redis_tls_key_file = getenv("TW_SEM_TLS_KEY");
    /* Fenced shard ownership on (the redis_suite_owner test). */
    const char *lease = getenv("TW_SEM_SHARD_LEASE_MS");
    cfg->redis_shard_lease_ms = lease ? (uint32_t)atoi(lease) : 0;
}

/* PostgreSQL (tests/pg_test.sh sets TW_PG_URL): a namespace per store. */
static void pg_setup(tw_durable_config *cfg, const char *store, void *arg)
{
    cfg->postgres = arg;
    cfg->postgres_namespace = keep("%s%s", ns_prefix, store);
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "postgres")) {
        const char *url = getenv("TW_PG_URL");
#ifndef TWHEEL_HAVE_POSTGRES
        fprintf(stderr, "built without the PostgreSQL backend: skipped\n");
        return 77;
#endif
        if (!url)
            return 77;
        snprintf(ns_prefix, sizeof ns_prefix, "twsem%ld-", (long)getpid());
        tw_sem_backend b = {"postgres", pg_setup, (void *)url, 0};
        return tw_sem_run(&b);
    }
    const char *redis = getenv("TW_SEM_REDIS");
    if (argc >= 3 && !strcmp(argv[1], "suite"))
        redis = argv[2];
    if (redis) {
#ifndef TWHEEL_HAVE_REDIS
        fprintf(stderr, "built without the Redis backend: skipped\n");
        return 77;
#endif
        /* A namespace of our own: a rerun on the same server starts empty. */
        snprintf(ns_prefix, sizeof ns_prefix, "twsem%ld-", (long)getpid());
        tw_sem_backend b = {"redis", redis_setup, (void *)redis,
                            TW_SEM_KNOWN_DONE_LAG};
        return tw_sem_run(&b);
    }
    char tmpl[] = "/tmp/twsem.XXXXXX";
    if (!mkdtemp(tmpl))
        abort();
    tw_sem_backend b = {"journal", journal_setup, tmpl, 0};
    int rc = tw_sem_run(&b);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpl);
    if (system(cmd) != 0)
        abort();
    return rc;
}
