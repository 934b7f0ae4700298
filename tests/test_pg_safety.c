/* SPDX-License-Identifier: MIT */
/*
 * tests/test_pg_safety.c - the PostgreSQL backend under hostile
 * conditions, on a real server (tests/pg_test.sh; TW_PG_URL):
 *   - locked: application transactions hold the row locks of timers whose
 *     callbacks ran: other timers are still delivered and calls through
 *     the handle still return, and each blocked completion gets in once
 *     the locks go (the timer is not delivered again);
 * Real clocks; every wait is for a state with a documented bound.
 * Usage: test_pg_safety [CASE...] (none: all).
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "pg_fixture.h"

/* Keys "hold*" wait in their callback until released. */
static atomic_int held, release;

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    if (t->key_len >= 4 && !memcmp(t->key, "hold", 4)) {
        atomic_fetch_add(&held, 1);
        while (!atomic_load(&release))
            pgf_sleep_ms(1);
    }
    pgf_note(t->key, t->key_len);
    return 0;
}

/* Rows of @ns left in twheel.timers. */
static long long rows(PGconn *c, const char *ns)
{
    return pgf_num(c, "SELECT count(*) FROM twheel.timers WHERE ns = '%s'", ns);
}

/* Finding 12: four deliveries on four executor threads; while their
 * callbacks run, four application transactions lock their rows (two
 * with SELECT ... FOR UPDATE, two with a cancel) and stay open. Then
 * the callbacks return: their completions must not hold the node.
 * Bounds: "other", due at once, delivered within 2 s; a schedule
 * through the handle returns within 2 s (before: both waited for the
 * transactions, ended here by idle_in_transaction_session_timeout after
 * 8 s). After the transactions end (two roll back, two commit their
 * cancels), every row is gone within 5 s and no "hold" key was
 * delivered twice. */
static void locked(void)
{
    const char *ns = "lk12";
    tw_durable *d = pgf_open(ns, on_fire, NULL, 4);
    PGconn *c = pgf_client(), *app[4];
    pgf_sql(c, PGRES_TUPLES_OK,
            "SELECT twheel.schedule('%s', 'hold' || i, now(), '') FROM"
            " generate_series(1, 4) i",
            ns);
    for (int i = 0; i < PGF_WAIT_MS && atomic_load(&held) < 4; i++)
        pgf_sleep_ms(1);
    ASSERT_EQ(atomic_load(&held), 4);
    for (int i = 0; i < 4; i++) {
        app[i] = pgf_client();
        pgf_sql(app[i], PGRES_COMMAND_OK,
                "BEGIN; SET LOCAL idle_in_transaction_session_timeout = '8s'");
        if (i < 2)
            pgf_sql(app[i], PGRES_TUPLES_OK,
                    "SELECT 1 FROM twheel.timers WHERE ns = '%s' AND"
                    " key = 'hold%d' FOR UPDATE",
                    ns, i + 1);
        else
            pgf_sql(app[i], PGRES_TUPLES_OK,
                    "SELECT twheel.cancel('%s', 'hold%d')", ns, i + 1);
    }
    atomic_store(&release, 1);
    pgf_sleep_ms(100); /* the completions meet the locks */
    int64_t t0 = pgf_wall_ms(), m0 = pgf_mono_ms();
    pgf_sql(c, PGRES_TUPLES_OK,
            "SELECT twheel.schedule('%s', 'other', now(),"
            " '')",
            ns);
    bool came = pgf_wait_count_ms("other", 1, 2000);
    int64_t at = 0;
    pgf_count("other", &at);
    int64_t m1 = pgf_mono_ms();
    int rc = tw_durable_schedule(d, "mine", 4, pgf_wall_ms(), "", 0);
    int64_t call = pgf_mono_ms() - m1;
    fprintf(stderr,
            "  locked: other %s %lld ms after due; a schedule"
            " took %lld ms (rc %d)\n",
            came ? "delivered" : "NOT delivered",
            came ? (long long)(at - t0) : (long long)(pgf_mono_ms() - m0),
            (long long)call, rc);
    ASSERT(came);
    ASSERT_EQ(rc, 0);
    ASSERT_LT(call, 2000);
    pgf_wait_count("mine", 1);
    for (int i = 0; i < 4; i++) {
        pgf_sql(app[i], PGRES_COMMAND_OK, i < 2 ? "ROLLBACK" : "COMMIT");
        PQfinish(app[i]);
    }
    int64_t end = pgf_mono_ms() + 5000;
    while (rows(c, ns) && pgf_mono_ms() < end)
        pgf_sleep_ms(10);
    if (rows(c, ns)) {
        PGresult *r = PQexec(c, "SELECT key, ver, owner, lease_until FROM"
                                " twheel.timers WHERE ns = 'lk12'");
        for (int i = 0; i < PQntuples(r); i++)
            fprintf(stderr, "  left: %s %s %s %s\n", PQgetvalue(r, i, 0),
                    PQgetvalue(r, i, 1), PQgetvalue(r, i, 2),
                    PQgetvalue(r, i, 3));
        PQclear(r);
    }
    ASSERT_EQ(rows(c, ns), 0);
    for (int i = 1; i <= 4; i++) {
        char k[8];
        snprintf(k, sizeof k, "hold%d", i);
        ASSERT_EQ(pgf_count(k, NULL), 1);
    }
    PQfinish(c);
    ASSERT_EQ(tw_durable_close(d), 0);
}

static const struct {
    const char *name;
    void (*fn)(void);
} cases[] = {
    {"locked", locked},
};

int main(int argc, char **argv)
{
    pgf_init();
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bool run = argc < 2;
        for (int a = 1; a < argc; a++)
            run |= !strcmp(argv[a], cases[i].name);
        if (!run)
            continue;
        int64_t t0 = pgf_mono_ms();
        fprintf(stderr, "%s\n", cases[i].name);
        cases[i].fn();
        fprintf(stderr, "%s: ok (%lld ms)\n", cases[i].name,
                (long long)(pgf_mono_ms() - t0));
    }
    return 0;
}
