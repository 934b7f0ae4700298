/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_durable.c - durable timers: twheel's journal against a Redis
 * sorted-set delay queue and SQLite in WAL mode, at the same durability
 * (every acknowledged call is on stable storage).
 *
 *   bench_durable twheel sched  DIR THREADS SECONDS [PAYLOAD [BATCH]]
 *   bench_durable twheel isched DIR THREADS SECONDS [PAYLOAD [BATCH]]
 *   bench_durable twheel cancel DIR THREADS SECONDS [PAYLOAD [BATCH]]
 *   bench_durable twheel recover DIR N [PAYLOAD [KEYLEN]]
 *   bench_durable redis  sched  PORT THREADS SECONDS DEPTH [PAYLOAD]
 *   bench_durable redis  fill   PORT THREADS 0 DEPTH [PAYLOAD]
 *   bench_durable redis  cancel PORT THREADS SECONDS DEPTH [PAYLOAD]
 *   bench_durable sqlite sched  FILE THREADS SECONDS [PAYLOAD]
 *
 * sched: each thread schedules fresh 16-byte keys due in one hour, for
 * SECONDS; prints calls/s and the p50/p99 latency of one call (for Redis
 * with DEPTH > 1: of one pipelined batch of DEPTH calls, divided by
 * nothing: the time from sending the batch to its last reply; for twheel
 * with BATCH > 1: of one tw_durable_schedule_many call of BATCH items),
 * and cpu_s, this process's CPU time over the timed run (user + system,
 * all threads; for twheel also the journal's writer thread's work that
 * the run's calls left, until the line is printed).
 * isched: the same with TW_DURABLE_SYNC_INTERVAL (written before the call
 * returns, fdatasync every second: Redis appendfsync everysec's
 * durability).
 * cancel: first schedules cancel_keys() keys per thread with
 * SYNC_NONE, then the threads cancel them with SYNC_GROUP, BATCH per
 * tw_durable_cancel_many call (one: tw_durable_cancel), until SECONDS pass
 * or their keys run out. Redis: fill schedules the same keys (pipelined,
 * DEPTH only picks how many), cancel removes them with a script (ZREM +
 * HDEL), DEPTH calls pipelined per round trip; run fill first (the
 * benchmark script does it with appendfsync no). recover: writes N pending
 * timers, closes, then times tw_durable_open and measures the RSS it added and
 * the journal's bytes. One line of key=value per run, for scripts.
 *
 * TWB_SYNC_SLEEP_US=N in the environment makes a simulated device for the
 * journal runs: the journal's test hook sleeps N us before each fdatasync
 * (with DIR on tmpfs, where fdatasync itself costs next to nothing), so
 * that group commit's policies can be compared without a shared disk's
 * noise. Its figures are of that device, not of a disk.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <twheel/durable.h>

#ifdef TWB_HAVE_SQLITE
#include <sqlite3.h>
#endif

static uint64_t mono_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_durable: %s: %d %s\n", what, rc,
            rc < 0 ? tw_strerror(rc) : "");
    exit(1);
}

static int no_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)t;
    (void)arg;
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Latency samples. */

struct worker {
    pthread_t th;
    int id;
    uint64_t ops;
    uint64_t *lat;
    size_t nlat, caplat;
    uint64_t until;
    size_t first; /* cancel: first key index */
};

static void sample(struct worker *w, uint64_t ns)
{
    if (w->nlat == w->caplat) {
        w->caplat = w->caplat ? w->caplat * 2 : 4096;
        w->lat = realloc(w->lat, w->caplat * sizeof *w->lat);
        if (!w->lat)
            die("realloc", 0);
    }
    w->lat[w->nlat++] = ns;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* This process's CPU time (user + system, every thread: the callers and,
 * for twheel, the journal's writer), in seconds. */
static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_stime.tv_sec +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

static double run_cpu0; /* cpu_s() when the timed threads started */

static void report(const char *sys, const char *op, int threads, int depth,
                   struct worker *w, double secs)
{
    uint64_t ops = 0;
    size_t n = 0;
    for (int i = 0; i < threads; i++) {
        ops += w[i].ops;
        n += w[i].nlat;
    }
    uint64_t *all = malloc((n ? n : 1) * sizeof *all);
    size_t k = 0;
    for (int i = 0; i < threads; i++) {
        memcpy(all + k, w[i].lat, w[i].nlat * sizeof *all);
        k += w[i].nlat;
        free(w[i].lat);
    }
    qsort(all, n, sizeof *all, cmp_u64);
    double cpu = cpu_s() - run_cpu0;
    double p50 = n ? (double)all[n / 2] / 1000 : 0;
    double p99 = n ? (double)all[n * 99 / 100] / 1000 : 0;
    printf("system=%s op=%s threads=%d depth=%d ops=%" PRIu64
           " secs=%.2f ops_per_s=%.0f p50_us=%.1f p99_us=%.1f cpu_s=%.3f\n",
           sys, op, threads, depth, ops, secs, (double)ops / secs, p50, p99,
           cpu);
    free(all);
}

/* ------------------------------------------------------------------------ */
/* twheel. */

static tw_durable *store;
static char payload[4096];
static size_t payload_len = 64;

/* A 16-byte key (plus NUL): "t" + 2 digits of thread + "-" + 12 digits. */
static void key_of(char *k, int thread, uint64_t i)
{
    char tmp[48];
    snprintf(tmp, sizeof tmp, "t%02d-%012" PRIu64, thread % 100,
             i % UINT64_C(1000000000000));
    memcpy(k, tmp, 16);
    k[16] = 0;
}

static int tw_batch = 1;

static void *tw_sched_main(void *p)
{
    struct worker *w = p;
    int64_t due = wall_ms() + 3600 * 1000;
    size_t n = (size_t)tw_batch;
    char(*k)[17] = malloc(n * sizeof *k);
    tw_durable_item *it = malloc(n * sizeof *it);
    if (!k || !it)
        die("malloc", 0);
    for (uint64_t i = 0;;) {
        for (size_t j = 0; j < n; j++, i++) {
            key_of(k[j], w->id, i);
            it[j] = (tw_durable_item){.key = k[j],
                                      .key_len = 16,
                                      .due_ms = due,
                                      .payload = payload,
                                      .payload_len = payload_len};
        }
        uint64_t t0 = mono_ns();
        int rc = n == 1 ? tw_durable_schedule(store, k[0], 16, due, payload,
                                              payload_len)
                        : tw_durable_schedule_many(store, it, n);
        uint64_t t1 = mono_ns();
        if (rc)
            die("schedule", rc);
        sample(w, t1 - t0);
        w->ops += n;
        if (t1 >= w->until)
            break;
    }
    free(k);
    free(it);
    return NULL;
}

/* Keys per thread of a cancel run: enough for two seconds or so at the
 * rates seen here (one per call: tens of thousands a second; batched: up
 * to a million for twheel, a hundred thousand for Redis, whose fill is
 * slow). */
static uint64_t cancel_keys(int threads, int batch, bool redis)
{
    uint64_t total = batch == 1 ? 40000u : redis ? 240000u : 1200000u;
    return total / (uint64_t)threads + 20000u;
}

static uint64_t ncancel_keys;

static void *tw_cancel_main(void *p)
{
    struct worker *w = p;
    size_t n = (size_t)tw_batch;
    char(*k)[17] = malloc(n * sizeof *k);
    tw_durable_item *it = malloc(n * sizeof *it);
    if (!k || !it)
        die("malloc", 0);
    for (uint64_t i = 0; i + n <= ncancel_keys;) {
        for (size_t j = 0; j < n; j++, i++) {
            key_of(k[j], w->id, i);
            it[j] = (tw_durable_item){.key = k[j], .key_len = 16};
        }
        uint64_t t0 = mono_ns();
        int rc = n == 1 ? tw_durable_cancel(store, k[0], 16)
                        : tw_durable_cancel_many(store, it, n);
        uint64_t t1 = mono_ns();
        if (rc)
            die("cancel", rc);
        sample(w, t1 - t0);
        w->ops += n;
        if (t1 >= w->until)
            break;
    }
    free(k);
    free(it);
    return NULL;
}

/* The journal's fault hook (src/journal.h): called before each write and
 * fdatasync; used here only for TWB_SYNC_SLEEP_US. */
extern int (*tw__journal_fault)(int op);
static long sync_sleep_ns;

static int sync_sleep(int op)
{
    if (op == 's') {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += sync_sleep_ns;
        ts.tv_sec += ts.tv_nsec / 1000000000;
        ts.tv_nsec %= 1000000000;
        while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) ==
               EINTR)
            ;
    }
    return 0;
}

static void tw_open(const char *dir, uint32_t sync)
{
    const char *sim = getenv("TWB_SYNC_SLEEP_US");
    if (sim && atol(sim) > 0) {
        sync_sleep_ns = atol(sim) * 1000;
        tw__journal_fault = sync_sleep;
    }
    tw_durable_config c;
    memset(&c, 0, sizeof c);
    c.dir = dir;
    c.fire = no_fire;
    c.sync = sync;
    int rc = tw_durable_open(&store, &c);
    if (rc)
        die("open", rc);
}

static void run_threads(int threads, double secs, void *(*fn)(void *),
                        struct worker *w)
{
    uint64_t until = mono_ns() + (uint64_t)(secs * 1e9);
    run_cpu0 = cpu_s();
    for (int i = 0; i < threads; i++) {
        w[i].id = i;
        w[i].until = until;
        pthread_create(&w[i].th, NULL, fn, &w[i]);
    }
    for (int i = 0; i < threads; i++)
        pthread_join(w[i].th, NULL);
}

static long rss_kib(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, res = 0;
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2)
            res = 0;
        fclose(f);
    }
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

static int bench_twheel(int argc, char **argv)
{
    const char *op = argv[2], *dir = argv[3];
    if (strcmp(op, "recover") == 0) {
        uint64_t n = strtoull(argv[4], NULL, 10);
        if (argc > 5)
            payload_len = strtoul(argv[5], NULL, 10);
        /* Keys of klen bytes: the counter's last digits, or after padding
         * (klen 1 to 64; digits enough for n keys are the caller's). */
        size_t klen = argc > 6 ? strtoul(argv[6], NULL, 10) : 16;
        if (klen < 1 || klen > 64)
            die("key length", 0);
        /* Fill in a child, so that this process's heap is fresh. */
        pid_t pid = fork();
        if (pid == 0) {
            tw_open(dir, TW_DURABLE_SYNC_NONE);
            int64_t due = wall_ms() + 24 * 3600 * 1000;
            char k[17], kk[64];
            memset(kk, 'p', sizeof kk);
            for (uint64_t i = 0; i < n; i++) {
                key_of(k, 0, i);
                if (klen <= 16)
                    memcpy(kk, k + 16 - klen, klen);
                else
                    memcpy(kk + klen - 16, k, 16);
                int rc = tw_durable_schedule(store, kk, klen,
                                             due + (int64_t)(i % 100000),
                                             payload, payload_len);
                if (rc)
                    die("schedule", rc);
            }
            tw_durable_close(store);
            _exit(0);
        }
        int status;
        if (pid < 0 || waitpid(pid, &status, 0) != pid || status != 0)
            die("fill", 0);
        long rss0 = rss_kib();
        uint64_t t0 = mono_ns();
        tw_open(dir, TW_DURABLE_SYNC_GROUP);
        double open_s = (double)(mono_ns() - t0) / 1e9;
        long rss1 = rss_kib();
        tw_durable_stats st;
        tw_durable_stats_get(store, &st);
        printf("system=twheel op=recover pending=%" PRIu64
               " open_s=%.3f recovery_us=%" PRIu64
               " rss_bytes_per_timer=%.1f journal_bytes_per_timer=%.1f "
               "segments=%" PRIu64 " key=%zu payload=%zu\n",
               st.recovered, open_s, st.recovery_us,
               (double)(rss1 - rss0) * 1024 / (double)st.recovered,
               (double)st.journal_bytes / (double)st.recovered, st.segments,
               klen, payload_len);
        tw_durable_close(store);
        return 0;
    }
    int threads = atoi(argv[4]);
    double secs = atof(argv[5]);
    if (argc > 6)
        payload_len = strtoul(argv[6], NULL, 10);
    if (argc > 7 && atoi(argv[7]) > 1)
        tw_batch = atoi(argv[7]);
    struct worker *w = calloc((size_t)threads, sizeof *w);
    bool interval = strcmp(op, "isched") == 0;
    if (strcmp(op, "sched") == 0 || interval) {
        tw_open(dir,
                interval ? TW_DURABLE_SYNC_INTERVAL : TW_DURABLE_SYNC_GROUP);
        uint64_t t0 = mono_ns();
        run_threads(threads, secs, tw_sched_main, w);
        double el = (double)(mono_ns() - t0) / 1e9;
        tw_durable_stats st;
        tw_durable_stats_get(store, &st);
        report(interval ? "twheel-interval" : "twheel", "sched", threads,
               tw_batch, w, el);
        printf("  syncs=%" PRIu64 " schedules_per_sync=%.1f\n", st.syncs,
               (double)st.pending / (double)(st.syncs ? st.syncs : 1));
    } else {
        tw_open(dir, TW_DURABLE_SYNC_NONE);
        int64_t due = wall_ms() + 3600 * 1000;
        char k[17];
        ncancel_keys = cancel_keys(threads, tw_batch, false);
        for (int t = 0; t < threads; t++)
            for (uint64_t i = 0; i < ncancel_keys; i++) {
                key_of(k, t, i);
                int rc = tw_durable_schedule(store, k, 16, due, payload,
                                             payload_len);
                if (rc)
                    die("schedule", rc);
            }
        tw_durable_close(store);
        tw_open(dir, TW_DURABLE_SYNC_GROUP);
        uint64_t t0 = mono_ns();
        run_threads(threads, secs, tw_cancel_main, w);
        report("twheel", "cancel", threads, tw_batch, w,
               (double)(mono_ns() - t0) / 1e9);
    }
    tw_durable_close(store);
    free(w);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* Redis: a sorted set of due times plus a hash of payloads, one Lua script
 * per schedule (ZADD + HSET), over plain RESP on loopback. */

static int redis_port;
static int redis_depth;
static char script_sha[41];

static int redis_connect(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)redis_port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0)
        die("connect to redis", -errno);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static void send_all(int fd, const char *p, size_t n)
{
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k <= 0)
            die("write to redis", -errno);
        p += k;
        n -= (size_t)k;
    }
}

static size_t cmd(char *buf, int argc, const char **argv, const size_t *lens)
{
    size_t o = (size_t)sprintf(buf, "*%d\r\n", argc);
    for (int i = 0; i < argc; i++) {
        o += (size_t)sprintf(buf + o, "$%zu\r\n", lens[i]);
        memcpy(buf + o, argv[i], lens[i]);
        o += lens[i];
        buf[o++] = '\r';
        buf[o++] = '\n';
    }
    return o;
}

/* Read @n replies (simple strings, integers, bulk strings, errors). */
struct rbuf {
    char b[1 << 16];
    size_t lo, hi;
};

static int rgetc(int fd, struct rbuf *r)
{
    if (r->lo == r->hi) {
        ssize_t k = read(fd, r->b, sizeof r->b);
        if (k <= 0)
            die("read from redis", -errno);
        r->lo = 0;
        r->hi = (size_t)k;
    }
    return (unsigned char)r->b[r->lo++];
}

static void rline(int fd, struct rbuf *r, char *line, size_t cap)
{
    size_t n = 0;
    int c;
    while ((c = rgetc(fd, r)) != '\n')
        if (c != '\r' && n + 1 < cap)
            line[n++] = (char)c;
    line[n] = 0;
}

static void read_reply(int fd, struct rbuf *r, char *out, size_t cap)
{
    char line[256];
    rline(fd, r, line, sizeof line);
    if (line[0] == '-') {
        fprintf(stderr, "redis: %s\n", line);
        exit(1);
    }
    if (line[0] == '$') {
        long len = atol(line + 1);
        size_t n = 0;
        for (long i = 0; i < len + 2; i++) {
            int c = rgetc(fd, r);
            if (i < len && n + 1 < cap)
                out[n++] = (char)c;
        }
        if (out)
            out[n] = 0;
    } else if (out && cap) {
        size_t n = strlen(line + 1);
        if (n >= cap)
            n = cap - 1;
        memcpy(out, line + 1, n);
        out[n] = 0;
    }
}

static const char *lua =
    "redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1]) "
    "redis.call('HSET', KEYS[2], ARGV[1], ARGV[3]) return 1";

/* Append to @buf the schedule script call for thread @t's key @i, due at
 * @due (decimal); returns its length. */
static size_t sched_cmd(char *buf, int t, uint64_t i, const char *due)
{
    char k[17];
    key_of(k, t, i);
    const char *av[] = {"EVALSHA", script_sha, "2", "tw:due",
                        "tw:pay",  k,          due, payload};
    size_t lens[] = {7, 40, 1, 6, 6, 16, strlen(due), payload_len};
    return cmd(buf, 8, av, lens);
}

/* A cancel: 1 if the key was there (it always is in these runs). */
static const char *lua_cancel =
    "if redis.call('ZREM', KEYS[1], ARGV[1]) == 0 then return 0 end "
    "redis.call('HDEL', KEYS[2], ARGV[1]) return 1";
static char cancel_sha[41];

/* Schedules every key the cancel run of the same THREADS and DEPTH will
 * cancel, 1000 per round trip, from this thread. */
static void redis_fill(int threads)
{
    int fd = redis_connect();
    struct rbuf *r = calloc(1, sizeof *r);
    char *buf = malloc(1000 * (payload_len + 256));
    char due[24];
    snprintf(due, sizeof due, "%lld", (long long)(wall_ms() + 3600 * 1000));
    for (int t = 0; t < threads; t++)
        for (uint64_t i = 0; i < ncancel_keys;) {
            size_t o = 0;
            int m = 0;
            for (; m < 1000 && i < ncancel_keys; m++, i++)
                o += sched_cmd(buf + o, t, i, due);
            send_all(fd, buf, o);
            for (int j = 0; j < m; j++)
                read_reply(fd, r, NULL, 0);
        }
    close(fd);
    free(buf);
    free(r);
}

static bool redis_cancel; /* the workers cancel instead of scheduling */

/* One worker: DEPTH schedules (or cancels of keys redis_fill() put in)
 * per round trip, until the run's end (or its keys run out). */
static void *redis_main(void *p)
{
    struct worker *w = p;
    int fd = redis_connect();
    struct rbuf *r = calloc(1, sizeof *r);
    char *buf = malloc((size_t)redis_depth * (payload_len + 256));
    char due[24], reply[16];
    snprintf(due, sizeof due, "%lld", (long long)(wall_ms() + 3600 * 1000));
    for (uint64_t i = 0;
         !redis_cancel || i + (uint64_t)redis_depth <= ncancel_keys;) {
        size_t o = 0;
        for (int j = 0; j < redis_depth; j++, i++) {
            if (!redis_cancel) {
                o += sched_cmd(buf + o, w->id, i, due);
                continue;
            }
            char k[17];
            key_of(k, w->id, i);
            const char *av[] = {"EVALSHA", cancel_sha, "2",
                                "tw:due",  "tw:pay",   k};
            size_t lens[] = {7, 40, 1, 6, 6, 16};
            o += cmd(buf + o, 6, av, lens);
        }
        uint64_t t0 = mono_ns();
        send_all(fd, buf, o);
        for (int j = 0; j < redis_depth; j++) {
            read_reply(fd, r, reply, sizeof reply);
            if (redis_cancel && strcmp(reply, "1") != 0)
                die("redis cancel found no key", 0);
        }
        uint64_t t1 = mono_ns();
        sample(w, t1 - t0);
        w->ops += (uint64_t)redis_depth;
        if (t1 >= w->until)
            break;
    }
    close(fd);
    free(buf);
    free(r);
    return NULL;
}

static int bench_redis(int argc, char **argv)
{
    const char *op = argv[2];
    redis_port = atoi(argv[3]);
    int threads = atoi(argv[4]);
    double secs = atof(argv[5]);
    redis_depth = atoi(argv[6]);
    if (argc > 7)
        payload_len = strtoul(argv[7], NULL, 10);
    if (threads < 1 || redis_depth < 1)
        die("threads and depth must be positive", 0);
    int fd = redis_connect();
    struct rbuf *r = calloc(1, sizeof *r);
    char buf[1024];
    const char *av[] = {"SCRIPT", "LOAD", lua};
    size_t lens[] = {6, 4, strlen(lua)};
    send_all(fd, buf, cmd(buf, 3, av, lens));
    read_reply(fd, r, script_sha, sizeof script_sha);
    const char *avc[] = {"SCRIPT", "LOAD", lua_cancel};
    size_t lensc[] = {6, 4, strlen(lua_cancel)};
    send_all(fd, buf, cmd(buf, 3, avc, lensc));
    read_reply(fd, r, cancel_sha, sizeof cancel_sha);
    close(fd);
    free(r);
    ncancel_keys = cancel_keys(threads, redis_depth, true);
    if (strcmp(op, "fill") == 0) {
        redis_fill(threads);
        return 0;
    }
    redis_cancel = strcmp(op, "cancel") == 0;
    struct worker *w = calloc((size_t)threads, sizeof *w);
    uint64_t t0 = mono_ns();
    run_threads(threads, secs, redis_main, w);
    report("redis", redis_cancel ? "cancel" : "sched", threads, redis_depth, w,
           (double)(mono_ns() - t0) / 1e9);
    free(w);
    return 0;
}

/* ------------------------------------------------------------------------ */
/* SQLite in WAL mode, synchronous=FULL: one row per timer, an index on the
 * due time, one transaction per call, one connection per thread. */

#ifdef TWB_HAVE_SQLITE
static const char *sqlite_file;

static void *sqlite_main(void *p)
{
    struct worker *w = p;
    sqlite3 *db;
    if (sqlite3_open(sqlite_file, &db) != SQLITE_OK)
        die("sqlite3_open", 0);
    sqlite3_busy_timeout(db, 60000);
    sqlite3_exec(db, "PRAGMA synchronous=FULL", NULL, NULL, NULL);
    sqlite3_stmt *st;
    if (sqlite3_prepare_v2(db,
                           "INSERT OR REPLACE INTO timers(key, due, payload) "
                           "VALUES(?, ?, ?)",
                           -1, &st, NULL) != SQLITE_OK)
        die(sqlite3_errmsg(db), 0);
    int64_t due = wall_ms() + 3600 * 1000;
    char k[17];
    for (uint64_t i = 0;; i++) {
        key_of(k, w->id, i);
        uint64_t t0 = mono_ns();
        sqlite3_bind_text(st, 1, k, 16, SQLITE_STATIC);
        sqlite3_bind_int64(st, 2, due);
        sqlite3_bind_blob(st, 3, payload, (int)payload_len, SQLITE_STATIC);
        if (sqlite3_step(st) != SQLITE_DONE)
            die(sqlite3_errmsg(db), 0);
        sqlite3_reset(st);
        uint64_t t1 = mono_ns();
        sample(w, t1 - t0);
        w->ops++;
        if (t1 >= w->until)
            break;
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return NULL;
}

static int bench_sqlite(int argc, char **argv)
{
    sqlite_file = argv[3];
    int threads = atoi(argv[4]);
    double secs = atof(argv[5]);
    if (argc > 6)
        payload_len = strtoul(argv[6], NULL, 10);
    sqlite3 *db;
    if (sqlite3_open(sqlite_file, &db) != SQLITE_OK)
        die("sqlite3_open", 0);
    sqlite3_exec(db,
                 "PRAGMA journal_mode=WAL;"
                 "CREATE TABLE IF NOT EXISTS timers(key TEXT PRIMARY KEY, "
                 "due INTEGER, payload BLOB);"
                 "CREATE INDEX IF NOT EXISTS timers_due ON timers(due);",
                 NULL, NULL, NULL);
    sqlite3_close(db);
    struct worker *w = calloc((size_t)threads, sizeof *w);
    uint64_t t0 = mono_ns();
    run_threads(threads, secs, sqlite_main, w);
    report("sqlite", "sched", threads, 1, w, (double)(mono_ns() - t0) / 1e9);
    free(w);
    return 0;
}
#endif

int main(int argc, char **argv)
{
    memset(payload, 'p', sizeof payload);
    if (argc >= 5 && strcmp(argv[1], "twheel") == 0)
        return bench_twheel(argc, argv);
    if (argc >= 7 && strcmp(argv[1], "redis") == 0)
        return bench_redis(argc, argv);
#ifdef TWB_HAVE_SQLITE
    if (argc >= 6 && strcmp(argv[1], "sqlite") == 0)
        return bench_sqlite(argc, argv);
#endif
    int help = argc == 2 && strcmp(argv[1], "--help") == 0;
    fprintf(
        help ? stdout : stderr,
        "usage: bench_durable twheel sched|isched|cancel DIR THREADS SECONDS "
        "[PAYLOAD [BATCH]]\n"
        "       bench_durable twheel recover DIR N [PAYLOAD [KEYLEN]]\n"
        "       bench_durable redis sched|fill|cancel PORT THREADS SECONDS "
        "DEPTH [PAYLOAD]\n"
        "       bench_durable sqlite sched FILE THREADS SECONDS "
        "[PAYLOAD]\n");
    return help ? 0 : 2;
}
