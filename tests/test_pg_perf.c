/* SPDX-License-Identifier: MIT */
/*
 * tests/test_pg_perf.c - the PostgreSQL backend's wake-ups and completions
 * that keep its commits cheap, on a real server (tests/pg_test.sh makes
 * and starts it; TW_PG_URL):
 *   - a timer due more than PG_NOTIFY_MS (2 s) ahead is scheduled without
 *     a NOTIFY (a listener sees only the near one's), and is still
 *     delivered on time: the nodes' poll found it before its due time;
 *   - completions in batches (src/durable_pg_batch.c): 300 timers falling
 *     due together complete in far fewer transactions than timers; one
 *     replaced by SQL while the batch was delivered keeps its new due time
 *     and payload (the batch's fence per row), the other 299 are gone.
 * A node killed mid-batch and a server killed with completions not yet
 * flushed are covered by tests/test_durable_pg.c (test_kill_node,
 * test_restart: every timer delivered again, none lost).
 * Real clocks; every wait is for a state, bounded by PGF_WAIT_MS.
 */
#define _GNU_SOURCE
#include <stdatomic.h>

#include "pg_fixture.h"

#define LATE_MS 500 /* generous bound on lateness (a loaded machine) */
#define NB 300      /* timers of the batch test */

static PGconn *side; /* the callback's own connection (the replace) */
static atomic_int fired_far, fired_b[NB];
static atomic_llong far_late;

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    char k[64];
    snprintf(k, sizeof k, "%.*s", (int)t->key_len, (const char *)t->key);
    int n;
    if (!strcmp(k, "far")) {
        atomic_store(&far_late, (long long)(now_ms() - t->due_ms));
        atomic_fetch_add(&fired_far, 1);
    } else if (sscanf(k, "b-%d", &n) == 1 && n >= 0 && n < NB) {
        /* The first of the batch replaces b-150, claimed with it. */
        if (n == 0)
            pgf_sql(side, PGRES_TUPLES_OK,
                    "SELECT twheel.schedule('batch', 'b-150', now() +"
                    " interval '1 hour', 'kept')");
        atomic_fetch_add(&fired_b[n], 1);
    }
    return 0;
}

/* A far timer sends no NOTIFY, a near one does; the far one is still
 * delivered on time, found by the node's poll. */
static void test_far_no_notify(void)
{
    tw_durable *d = pgf_open("far", on_fire, NULL, 0);
    PGconn *c = pgf_client(), *l = pgf_client();
    pgf_sql(l, PGRES_COMMAND_OK, "LISTEN twheel");
    pgf_sql(c, PGRES_TUPLES_OK,
            "SELECT twheel.schedule('far', 'far', now() + interval '3.5 s')");
    /* Committed after the far one: its NOTIFY comes after any of the
     * far one's (the server sends them in commit order). */
    pgf_sql(c, PGRES_TUPLES_OK,
            "SELECT twheel.schedule('far', 'near', now() + interval '1 s')");
    int n = 0;
    for (int i = 0; i < PGF_WAIT_MS && !n; i++, sleep_ms(1))
        n = pgf_notifies(l, "far");
    sleep_ms(100);
    n += pgf_notifies(l, "far");
    ASSERT_EQ(n, 1);
    for (int i = 0; i < PGF_WAIT_MS && !atomic_load(&fired_far); i++)
        sleep_ms(1);
    ASSERT_EQ(atomic_load(&fired_far), 1);
    long long late = atomic_load(&far_late);
    fprintf(stderr, "  far: delivered %lld ms after its due time\n", late);
    ASSERT(late >= 0 && late < LATE_MS);
    ASSERT_EQ(tw_durable_close(d), 0);
    PQfinish(c);
    PQfinish(l);
}

/* 300 timers due together: completed in batches (far fewer write
 * transactions than timers), each fenced by its claim's version. */
static void test_batch_fence(void)
{
    tw_durable *d = pgf_open("batch", on_fire, NULL, 0);
    PGconn *c = pgf_client();
    side = pgf_client();
    long long x0 = pgf_num(c, "SELECT txid_current()");
    pgf_sql(c, PGRES_TUPLES_OK,
            "SELECT count(twheel.schedule('batch', 'b-' || lpad(i::text, 3,"
            " '0'), now() + interval '300 ms', '')) FROM"
            " generate_series(0, 299) i");
    int all = 0;
    for (int w = 0; w < PGF_WAIT_MS && all < NB; w++, sleep_ms(1)) {
        all = 0;
        for (int i = 0; i < NB; i++)
            all += atomic_load(&fired_b[i]) > 0;
    }
    ASSERT_EQ(all, NB);
    tw_durable_stats s;
    for (int w = 0; w < PGF_WAIT_MS; w++, sleep_ms(1))
        if (!tw_durable_stats_get(d, &s) && s.pending <= 1 && !s.running)
            break;
    ASSERT_EQ(s.pending, 1);
    long long xids = pgf_num(c, "SELECT txid_current()") - x0;
    fprintf(stderr, "  batch: %d timers, %lld write transactions\n", NB, xids);
    ASSERT(xids < NB / 2);
    ASSERT_EQ(pgf_num(c, "SELECT count(*) FROM twheel.timers WHERE ns ="
                         " 'batch' AND key = 'b-150' AND payload = 'kept'"
                         " AND owner IS NULL AND due > (extract(epoch FROM"
                         " now()) * 1000 + 3000000)"),
              1);
    int again = 0;
    for (int i = 0; i < NB; i++)
        again += atomic_load(&fired_b[i]) != 1;
    ASSERT_EQ(again, 0);
    ASSERT_EQ(tw_durable_close(d), 0);
    PQfinish(side);
    PQfinish(c);
}

int main(void)
{
    pgf_init();
    RUN_TEST(test_far_no_notify);
    RUN_TEST(test_batch_fence);
    return 0;
}
