/* SPDX-License-Identifier: MIT */
/*
 * bench_pg - twheel's side of the PostgreSQL round (scripts/bench_pg.sh),
 * and graphile-worker's SQL interface from the same C client.
 *
 *   bench_pg rate SYS URL SECONDS CELL...   (CELL = CONNSxPER_TX)
 *     timers scheduled per second, each due in an hour (nothing fires;
 *     PG_RATE_DUE_MS in the environment: due that many ms ahead),
 *     CONNS threads each with its own connection, PER_TX timers a
 *     transaction, for SECONDS per cell; SYS is
 *       twheel-sql  SELECT twheel.schedule(...) from libpq: one a
 *                   statement (its own transaction), or 32 in one
 *                   twheel.schedule_many(...) (one INSERT, one
 *                   transaction)
 *       twheel-api  tw_durable_schedule() / tw_durable_schedule_many()
 *                   on handles opened with cfg.postgres (a handle's pool
 *                   has 4 connections: CONNS / 4 handles, at least 1)
 *       gw-sql      graphile_worker.add_job(...) / add_jobs(ARRAY[...])
 *       twheel-sql-nonotify  as twheel-sql, through copies of
 *                   twheel.schedule and schedule_many without their
 *                   NOTIFY (twb.schedule_nn, twb.schedule_many_nn, made
 *                   by scripts/bench_pg.sh): what the NOTIFY costs
 *       floor       the least PostgreSQL does for the same rows: the same
 *                   keys, dues and payloads in one plain INSERT (one row,
 *                   or the 32 in one multi-row INSERT) into twb.floor, a
 *                   bare table with what twheel.timers needs to be safe
 *                   and claimable (a primary key on (ns, key), an index
 *                   on (ns, due, key); made by scripts/bench_pg.sh), no
 *                   function, no version, no NOTIFY
 *     one line a cell: "pgrate sys=S conns=C per_tx=P timers=N secs=T
 *     rate=R"
 *   bench_pg fire URL PMPID RATE SECONDS LEAD_MS DRAIN_MS
 *     a handle fires while a feeder connection schedules RATE timers a
 *     second for SECONDS (32 per transaction through twheel.schedule_many,
 *     every 32 / RATE s, at once when it falls behind), each due LEAD_MS
 *     after its transaction is sent; waits for them at most DRAIN_MS
 *     past the last one's due time; prints "pgfire sys=twheel
 *     timers=N fed_per_s=F delivered=D p50_ms= p99_ms= max_ms=
 *     db_cpu_s= db_us_per_timer=": lateness of the callbacks by
 *     CLOCK_REALTIME, and the server's CPU (the postmaster PMPID, its
 *     reaped children and its live children, from /proc) over the run
 *   bench_pg load URL N   N timers due in an hour (32 a transaction)
 *   bench_pg setup URL    open and close a handle (installs the schema)
 *
 * Payloads are the same small JSON object for every system
 * ({"d": due_ms, "i": sequence}), built by the server from the
 * parameters. Keys carry the process id and the time, so runs never
 * replace each other's rows.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <inttypes.h>
#include <libpq-fe.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <twheel/durable.h>
#include <unistd.h>

#define HOUR_MS 3600000
#define BATCH 32

static const char *const sql_one[] = {
    /* twheel-sql */
    "SELECT twheel.schedule('bench', convert_to($1 || $3::bigint, 'UTF8'),"
    " $2::bigint, convert_to(json_build_object('d', $2::bigint, 'i',"
    " $3::bigint)::text, 'UTF8'))",
    /* gw-sql */
    "SELECT graphile_worker.add_job('bench', json_build_object('d',"
    " $2::bigint, 'i', $3::bigint), run_at := to_timestamp($2::bigint /"
    " 1000.0), job_key := nullif($1, $1))",
    /* twheel-api: no statement of its own */
    NULL,
    /* twheel-sql-nonotify: twb.schedule_nn, made by scripts/bench_pg.sh
     * from twheel.schedule without its pg_notify() (a diagnosis) */
    "SELECT twb.schedule_nn('bench', convert_to($1 || $3::bigint, 'UTF8'),"
    " $2::bigint, convert_to(json_build_object('d', $2::bigint, 'i',"
    " $3::bigint)::text, 'UTF8'))",
    /* floor: the same rows into a bare table (made by scripts/bench_pg.sh) */
    "INSERT INTO twb.floor VALUES ('bench', convert_to($1 || $3::bigint,"
    " 'UTF8'), $2::bigint, convert_to(json_build_object('d', $2::bigint,"
    " 'i', $3::bigint)::text, 'UTF8'))",
};
/* 32 a transaction, one statement: twheel.schedule_many (one INSERT of
 * the batch), graphile-worker's add_jobs; the peers' Node APIs use their
 * own batch inserts too (bench/peers/pg/peer.js). */
static const char *const sql_many[] = {
    "SELECT cardinality(twheel.schedule_many('bench', ARRAY(SELECT"
    " convert_to($1 || i, 'UTF8') FROM unnest($3::bigint[]) AS i),"
    " $2::bigint[], ARRAY(SELECT convert_to(json_build_object('d', d, 'i',"
    " i)::text, 'UTF8') FROM unnest($2::bigint[], $3::bigint[]) AS u(d, i))))",
    "SELECT graphile_worker.add_jobs(array_agg(ROW('bench',"
    " json_build_object('d', d, 'i', i), NULL, to_timestamp(d / 1000.0),"
    " NULL, nullif($1, $1), NULL, NULL)::graphile_worker.job_spec))"
    " FROM unnest($2::bigint[], $3::bigint[]) AS u(d, i)",
    NULL,
    "SELECT cardinality(twb.schedule_many_nn('bench', ARRAY(SELECT"
    " convert_to($1 || i, 'UTF8') FROM unnest($3::bigint[]) AS i),"
    " $2::bigint[], ARRAY(SELECT convert_to(json_build_object('d', d, 'i',"
    " i)::text, 'UTF8') FROM unnest($2::bigint[], $3::bigint[]) AS u(d, i))))",
    "INSERT INTO twb.floor SELECT 'bench', convert_to($1 || i, 'UTF8'), d,"
    " convert_to(json_build_object('d', d, 'i', i)::text, 'UTF8')"
    " FROM unnest($2::bigint[], $3::bigint[]) AS u(d, i)",
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Fields 3.. of /proc/PID/stat (after the command's closing paren). */
static int stat_fields(const char *pid, long long f[15])
{
    char path[64], buf[1024], *p;
    snprintf(path, sizeof path, "/proc/%s/stat", pid);
    FILE *fp = fopen(path, "r");
    if (!fp)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, fp);
    fclose(fp);
    buf[n] = 0;
    p = strrchr(buf, ')');
    if (!p)
        return -1;
    p += 2;
    for (int i = 0; i < 15; i++) {
        while (*p == ' ')
            p++;
        if (i == 0) { /* the state letter */
            f[0] = 0;
            p++;
            continue;
        }
        f[i] = strtoll(p, &p, 10);
    }
    return 0;
}

/* The server's CPU so far, s: the postmaster's (user, system and its
 * reaped children's) plus every live child's (user + system). */
static double db_cpu_s(const char *pm)
{
    long long f[15];
    double hz = (double)sysconf(_SC_CLK_TCK), t;
    if (stat_fields(pm, f) != 0)
        return 0;
    t = (double)(f[11] + f[12] + f[13] + f[14]) / hz;
    DIR *d = opendir("/proc");
    struct dirent *e;
    long long pmv = atoll(pm);
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        if (stat_fields(e->d_name, f) == 0 && f[1] == pmv)
            t += (double)(f[11] + f[12]) / hz;
    }
    if (d)
        closedir(d);
    return t;
}

static PGconn *connect_or_die(const char *url)
{
    PGconn *c = PQconnectdb(url);
    if (PQstatus(c) != CONNECTION_OK) {
        fprintf(stderr, "bench_pg: connect: %s", PQerrorMessage(c));
        exit(1);
    }
    return c;
}

/* Run one statement of the batch: the key prefix, due and sequence
 * (one) or arrays of them (many, n items). */
static int send_batch(PGconn *c, const char *stmt, const char *prefix,
                      int64_t due, int64_t seq, int n)
{
    char d[24 * BATCH + 4], s[24 * BATCH + 4];
    const char *v[3] = {prefix, d, s};
    if (n == 1) {
        snprintf(d, sizeof d, "%" PRId64, due);
        snprintf(s, sizeof s, "%" PRId64, seq);
    } else {
        size_t a = 0, b = 0;
        for (int i = 0; i < n; i++) {
            a += (size_t)snprintf(d + a, sizeof d - a, "%c%" PRId64,
                                  i ? ',' : '{', due + i);
            b += (size_t)snprintf(s + b, sizeof s - b, "%c%" PRId64,
                                  i ? ',' : '{', seq + i);
        }
        snprintf(d + a, sizeof d - a, "}");
        snprintf(s + b, sizeof s - b, "}");
    }
    PGresult *r = PQexecPrepared(c, stmt, 3, v, NULL, NULL, 0);
    int ok = PQresultStatus(r) == PGRES_TUPLES_OK ||
             PQresultStatus(r) == PGRES_COMMAND_OK; /* floor: an INSERT */
    if (!ok)
        fprintf(stderr, "bench_pg: %s", PQerrorMessage(c));
    PQclear(r);
    return ok ? 0 : -1;
}

struct worker {
    int sys; /* 0 twheel-sql, 1 gw-sql, 2 twheel-api, 3 -sql-nonotify,
              * 4 floor */
    const char *url;
    int per_tx, id, cell; /* cell: the cell's number in this process */
    double secs, end;
    pthread_barrier_t *go; /* every worker connected: the clock starts */
    tw_durable *d;
    long long done;
    pthread_t th;
};

/* How far ahead the rate rows' timers are due: PG_RATE_DUE_MS (ms) from
 * the environment, default an hour (a timer due within 2 s NOTIFYs the
 * nodes at commit; one due later does not). */
static int64_t rate_due_ms(void)
{
    const char *e = getenv("PG_RATE_DUE_MS");
    long long v = e ? atoll(e) : 0;
    return v > 0 ? (int64_t)v : HOUR_MS;
}

static void *sql_worker(void *arg)
{
    struct worker *w = arg;
    PGconn *c = connect_or_die(w->url);
    const char *stmt = w->per_tx == 1 ? sql_one[w->sys] : sql_many[w->sys];
    PGresult *r = PQprepare(c, "s", stmt, 3, NULL);
    if (PQresultStatus(r) != PGRES_COMMAND_OK) {
        fprintf(stderr, "bench_pg: prepare: %s", PQerrorMessage(c));
        exit(1);
    }
    PQclear(r);
    char prefix[64];
    /* Unique a cell: the floor's plain INSERT refuses a key twice. */
    snprintf(prefix, sizeof prefix, "k%ld.%d.%d.%d.", (long)getpid(), w->cell,
             w->id, (int)time(NULL));
    pthread_barrier_wait(w->go);
    w->end = mono_s() + w->secs;
    while (mono_s() < w->end) {
        if (send_batch(c, "s", prefix, (int64_t)now_ms() + rate_due_ms(),
                       w->done, w->per_tx) != 0)
            exit(1);
        w->done += w->per_tx;
    }
    PQfinish(c);
    return NULL;
}

static void *api_worker(void *arg)
{
    struct worker *w = arg;
    tw_durable_item it[BATCH];
    char keys[BATCH][64], pay[BATCH][64];
    /* One schedule first, not counted: its pool connection is made. */
    int rc = tw_durable_schedule(w->d, "warm", 4, (int64_t)now_ms() + HOUR_MS,
                                 "", 0);
    pthread_barrier_wait(w->go);
    w->end = mono_s() + w->secs;
    while (rc == 0 && mono_s() < w->end) {
        int64_t due = (int64_t)now_ms() + rate_due_ms();
        for (int i = 0; i < w->per_tx; i++) {
            it[i].key = keys[i];
            it[i].key_len =
                (size_t)snprintf(keys[i], sizeof keys[i], "a%ld.%d.%lld",
                                 (long)getpid(), w->id, w->done + i);
            it[i].payload = pay[i];
            it[i].payload_len = (size_t)snprintf(
                pay[i], sizeof pay[i], "{\"d\": %" PRId64 ", \"i\": %lld}", due,
                w->done + i);
            it[i].due_ms = due;
        }
        rc = w->per_tx == 1
                 ? tw_durable_schedule(w->d, it[0].key, it[0].key_len, due,
                                       it[0].payload, it[0].payload_len)
                 : tw_durable_schedule_many(w->d, it, (size_t)w->per_tx);
        if (rc == 0)
            w->done += w->per_tx;
    }
    if (rc != 0) {
        fprintf(stderr, "bench_pg: schedule: %s\n", tw_strerror(rc));
        exit(1);
    }
    return NULL;
}

static int nop_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d, (void)t, (void)arg;
    return 0;
}

static tw_durable *open_handle(const char *url, tw_durable_fire_fn fn,
                               void *arg)
{
    char err[256] = "";
    tw_durable_config cfg = {0};
    tw_durable *d;
    cfg.postgres = url;
    cfg.postgres_namespace = "bench";
    cfg.fire = fn;
    cfg.fire_arg = arg;
    cfg.errbuf = err;
    cfg.errbuf_len = sizeof err;
    if (getenv("PG_EXECUTORS")) /* callbacks on N threads (default: 0) */
        cfg.executor_threads = (uint32_t)atoi(getenv("PG_EXECUTORS"));
    int rc = tw_durable_open(&d, &cfg);
    if (rc != 0) {
        fprintf(stderr, "bench_pg: open: %s: %s\n", tw_strerror(rc), err);
        exit(1);
    }
    return d;
}

static void rate_cell(int sys, const char *name, const char *url, double secs,
                      int conns, int per_tx)
{
    struct worker w[64];
    tw_durable *h[16] = {0};
    int nh = sys == 2 ? (conns + 3) / 4 : 0;
    long long n = 0;
    pthread_barrier_t go;
    static int cells;
    cells++;
    for (int i = 0; i < nh; i++)
        h[i] = open_handle(url, nop_fire, NULL);
    pthread_barrier_init(&go, NULL, (unsigned)conns + 1);
    for (int i = 0; i < conns; i++) {
        w[i] = (struct worker){.sys = sys,
                               .url = url,
                               .per_tx = per_tx,
                               .id = i,
                               .cell = cells,
                               .secs = secs,
                               .go = &go,
                               .d = nh ? h[i % nh] : NULL};
        pthread_create(&w[i].th, NULL, sys == 2 ? api_worker : sql_worker,
                       &w[i]);
    }
    pthread_barrier_wait(&go); /* every connection made */
    double t0 = mono_s();
    for (int i = 0; i < conns; i++) {
        pthread_join(w[i].th, NULL);
        n += w[i].done;
    }
    double t = mono_s() - t0;
    pthread_barrier_destroy(&go);
    for (int i = 0; i < nh; i++)
        tw_durable_close(h[i]);
    printf("pgrate sys=%s conns=%d per_tx=%d timers=%lld secs=%.3f "
           "rate=%.0f\n",
           name, conns, per_tx, n, t, (double)n / t);
    fflush(stdout);
}

static int cmd_rate(int argc, char **argv)
{
    static const char *const names[] = {"twheel-sql", "gw-sql", "twheel-api",
                                        "twheel-sql-nonotify", "floor"};
    int sys = -1;
    for (int i = 0; i < 5; i++)
        if (strcmp(argv[2], names[i]) == 0)
            sys = i;
    if (sys < 0 || argc < 6)
        return 2;
    for (int i = 5; i < argc; i++) {
        int conns, per_tx;
        if (sscanf(argv[i], "%dx%d", &conns, &per_tx) != 2 || conns < 1 ||
            conns > 64 || (per_tx != 1 && per_tx != BATCH))
            return 2;
        rate_cell(sys, names[sys], argv[3], atof(argv[4]), conns, per_tx);
    }
    return 0;
}

struct firelog {
    _Atomic size_t n;
    size_t cap;
    double *late;
};

static int on_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    struct firelog *fl = arg;
    double late = now_ms() - (double)t->due_ms;
    size_t i = atomic_fetch_add(&fl->n, 1);
    (void)d;
    if (i < fl->cap)
        fl->late[i] = late;
    return 0;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Feed @total timers at up to @rate a second, 32 a transaction, each due
 * @lead ms after its batch is sent (a feeder that falls behind sends at
 * once, so the lateness is the firing's alone); returns the rate fed. */
static double feed(PGconn *c, long total, double rate, int lead)
{
    double every = BATCH * 1e3 / rate, t0 = now_ms();
    char prefix[64];
    snprintf(prefix, sizeof prefix, "f%ld.%d.", (long)getpid(),
             (int)time(NULL));
    for (long k = 0, sent = 0; sent < total; k++) {
        double at = t0 + (double)k * every, wait = at - now_ms();
        if (wait > 0)
            usleep((useconds_t)(wait * 1e3));
        int m = total - sent < BATCH ? (int)(total - sent) : BATCH;
        if (send_batch(c, "many", prefix, (int64_t)now_ms() + lead, sent, m) !=
            0)
            exit(1);
        sent += m;
    }
    return (double)total * 1e3 / (now_ms() - t0);
}

static int cmd_fire(int argc, char **argv)
{
    if (argc != 8)
        return 2;
    const char *url = argv[2], *pm = argv[3];
    double rate = atof(argv[4]), secs = atof(argv[5]);
    int lead = atoi(argv[6]), drain = atoi(argv[7]);
    long total = (long)(rate * secs);
    struct firelog fl = {.cap = (size_t)total};
    fl.late = calloc(fl.cap + 1, sizeof *fl.late);
    tw_durable *d = open_handle(url, on_fire, &fl);
    PGconn *c = connect_or_die(url);
    PQclear(PQprepare(c, "many", sql_many[0], 3, NULL));
    double c0 = db_cpu_s(pm);
    double fed = feed(c, total, rate, lead), t1 = mono_s();
    /* Every timer delivered, or DRAIN_MS past the last one's due time. */
    while (atomic_load(&fl.n) < fl.cap && mono_s() < t1 + (lead + drain) / 1e3)
        usleep(2000);
    double cpu = db_cpu_s(pm) - c0;
    tw_durable_close(d);
    PQfinish(c);
    size_t n = atomic_load(&fl.n) < fl.cap ? atomic_load(&fl.n) : fl.cap;
    qsort(fl.late, n, sizeof *fl.late, cmp_d);
    printf("pgfire sys=twheel timers=%ld fed_per_s=%.0f delivered=%zu "
           "p50_ms=%.2f p99_ms=%.2f max_ms=%.2f db_cpu_s=%.2f "
           "db_us_per_timer=%.1f\n",
           total, fed, n, n ? fl.late[n / 2] : 0.0,
           n ? fl.late[(size_t)((double)n * 0.99)] : 0.0,
           n ? fl.late[n - 1] : 0.0, cpu, n ? cpu * 1e6 / (double)n : 0.0);
    free(fl.late);
    return 0;
}

static int cmd_load(int argc, char **argv)
{
    if (argc != 4)
        return 2;
    PGconn *c = connect_or_die(argv[2]);
    long n = atol(argv[3]);
    char prefix[64];
    PQclear(PQprepare(c, "many", sql_many[0], 3, NULL));
    snprintf(prefix, sizeof prefix, "l%ld.", (long)getpid());
    for (long i = 0; i < n; i += BATCH)
        if (send_batch(c, "many", prefix, (int64_t)now_ms() + HOUR_MS, i,
                       n - i < BATCH ? (int)(n - i) : BATCH) != 0)
            return 1;
    PQfinish(c);
    return 0;
}

int main(int argc, char **argv)
{
    int rc = 2;
    if (argc >= 2 && strcmp(argv[1], "rate") == 0)
        rc = cmd_rate(argc, argv);
    else if (argc >= 2 && strcmp(argv[1], "fire") == 0)
        rc = cmd_fire(argc, argv);
    else if (argc >= 2 && strcmp(argv[1], "load") == 0)
        rc = cmd_load(argc, argv);
    else if (argc == 3 && strcmp(argv[1], "setup") == 0)
        rc = tw_durable_close(open_handle(argv[2], nop_fire, NULL)) ? 1 : 0;
    if (rc == 2)
        fprintf(stderr,
                "usage: bench_pg rate twheel-sql|twheel-api|gw-sql URL SECONDS "
                "CONNSxPER_TX...\n"
                "       bench_pg fire URL POSTMASTER_PID RATE SECONDS LEAD_MS "
                "DRAIN_MS\n"
                "       bench_pg load URL N\n"
                "       bench_pg setup URL\n");
    return rc;
}
