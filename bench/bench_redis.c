/* SPDX-License-Identifier: MIT */
/*
 * bench/bench_redis.c - durable timers on Redis against a sorted-set
 * poller on the same Redis. scripts/bench_redis.sh starts the server and
 * runs every mode side by side.
 *
 *   bench_redis sched SEEDS NODES THREADS N   (SPREAD_MS=S: dues over S ms)
 *       NODES processes x THREADS threads schedule N timers each (due far
 *       beyond the horizon), then cancel them: schedules/s and cancels/s.
 *   bench_redis fire SEEDS REDIS_PID N WINDOW_MS
 *       one twheel node: N timers due evenly over WINDOW_MS; lateness of
 *       each delivery, Redis CPU for loading and for firing.
 *   bench_redis poll SEEDS REDIS_PID N WINDOW_MS INTERVAL_MS
 *       the common approach: ZADD+HSET per timer (one Lua call, pipelined),
 *       and a poller that runs a Lua ZRANGEBYSCORE+ZREM+HDEL every
 *       INTERVAL_MS; lateness and Redis CPU the same way. It deletes the
 *       due timers before any callback runs: a poller that dies, or loses
 *       the reply, drops them, and nothing fences a stale poller.
 *   bench_redis scripts
 *       every Lua script above and the backend's, by name (for
 *       scripts/redis_slowlog.py).
 *   bench_redis idle SEEDS REDIS_PID NODES SECONDS
 *       NODES twheel node processes on one namespace with nothing due
 *       (SHARDS shards, default 1024): Redis CPU per second of their
 *       claims (and ownership rounds), measured over SECONDS.
 * OWNER_LEASE_MS=L (fire, idle): twheel with fenced shard ownership, a
 * shard lease of L ms (cfg.redis_shard_lease_ms). CHECK_GAP_MS=G (fire):
 * at most one batch of claim checks every G ms (cfg.redis_check_gap_ms).
 * HORIZON_MS=H (fire): claim H ms ahead (cfg.horizon_ms; 0: 2,000).
 * LATE_DUMP=FILE (fire): each delivery's lateness (us) into FILE, in the
 * order of delivery.
 *   bench_redis lpoll SEEDS REDIS_PID N WINDOW_MS INTERVAL_MS
 *       the same poller with the guarantees twheel gives (minus its
 *       precision): each poll moves the due timers into an active set
 *       with a lease (score: the lease's end) and a token per timer, and
 *       gives back the leases that ran out; after the callbacks, one
 *       completion script per batch removes each timer whose token is
 *       still the one it was claimed with. The anchor for twheel's Redis
 *       CPU per fired timer.
 */
#define _GNU_SOURCE

#include <dirent.h>
#include <hiredis/hiredis.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "redis_scripts.h" /* the backend's scripts (mode "scripts") */
#include "twheel/durable.h"

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static void sleep_us(int64_t us)
{
    if (us <= 0)
        return;
    struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* The CPU time of a process in ms, to the ns: the sum over its threads
 * of the first field of /proc/PID/task/TID/schedstat (time on a CPU);
 * -1 when that cannot be read (then utime + stime, in clock ticks). */
static double sched_cpu_ms(int pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *dir = opendir(path);
    if (!dir)
        return -1;
    unsigned long long sum = 0;
    bool any = false;
    for (struct dirent *e; (e = readdir(dir)) != NULL;) {
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        char p2[320];
        snprintf(p2, sizeof p2, "/proc/%d/task/%s/schedstat", pid, e->d_name);
        FILE *f = fopen(p2, "r");
        unsigned long long ns;
        if (f && fscanf(f, "%llu", &ns) == 1) {
            sum += ns;
            any = true;
        }
        if (f)
            fclose(f);
    }
    closedir(dir);
    return any ? (double)sum / 1e6 : -1;
}

/* The CPU time of a process, in ms (sched_cpu_ms(), else utime + stime). */
static double cpu_ms(int pid)
{
    double ms = sched_cpu_ms(pid);
    if (ms >= 0)
        return ms;
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    if (!p ||
        sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
               &ut, &st) != 2)
        return -1;
    return (double)(ut + st) * 1000.0 / (double)sysconf(_SC_CLK_TCK);
}

static int cmp64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* This process's utime + stime, in ms. */
static double self_cpu_ms(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000.0 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000.0;
}

/* CPU of a phase: Redis's and this process's, in ms. */
struct cpu {
    double redis, node;
};

static struct cpu cpu_now(int pid)
{
    return (struct cpu){cpu_ms(pid), self_cpu_ms()};
}

static void report_late(const char *name, int64_t *late, size_t n,
                        size_t expect, struct cpu c0, struct cpu c1,
                        struct cpu c2)
{
    qsort(late, n, sizeof *late, cmp64);
    double k = 1000.0 / (double)expect;
    printf("%-16s timers %zu delivered %zu  lateness ms p50 %.2f p99 %.2f "
           "max %.2f  redis cpu ms/1000 timers: load %.1f fire %.1f total "
           "%.1f  node cpu: load %.1f fire %.1f total %.1f\n",
           name, expect, n, n ? late[n / 2] / 1000.0 : -1,
           n ? late[n * 99 / 100] / 1000.0 : -1, n ? late[n - 1] / 1000.0 : -1,
           (c1.redis - c0.redis) * k, (c2.redis - c1.redis) * k,
           (c2.redis - c0.redis) * k, (c1.node - c0.node) * k,
           (c2.node - c1.node) * k, (c2.node - c0.node) * k);
}

/* ------------------------------------------------------------------------ */

static int nop_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)t;
    (void)arg;
    return 0;
}

struct worker {
    tw_durable *d;
    int node, th, lo, hi, op;
    int64_t due;
    int errors, batch, spread;
};

/* Timer @i's due time: w->due, or with SPREAD_MS=S, spread over S ms
 * after it (i ms apart, modulo S). */
static int64_t due_of(const struct worker *w, int i)
{
    return w->due + (w->spread > 0 ? i % w->spread : 0);
}

/* Schedules of keys lo..hi-1 by tw_durable_schedule_many, @batch at a
 * time. */
static void sched_many(struct worker *w)
{
    tw_durable_item *it = calloc((size_t)w->batch, sizeof *it);
    char(*k)[48] = calloc((size_t)w->batch, sizeof *k);
    if (!it || !k)
        exit(1);
    for (int i = w->lo; i < w->hi; i += w->batch) {
        int m = w->hi - i < w->batch ? w->hi - i : w->batch;
        for (int j = 0; j < m; j++) {
            int n = snprintf(k[j], sizeof k[j], "n%d-%d", w->node, i + j);
            it[j] = (tw_durable_item){k[j],
                                      (size_t)n,
                                      due_of(w, i + j),
                                      "payload-32-bytes-..............",
                                      32,
                                      0};
        }
        tw_durable_schedule_many(w->d, it, (size_t)m);
        for (int j = 0; j < m; j++)
            w->errors += it[j].result != 0;
    }
    free(it);
    free(k);
}

static void *worker_main(void *arg)
{
    struct worker *w = arg;
    char k[48];
    if (w->batch > 1 && !w->op) {
        sched_many(w);
        return NULL;
    }
    for (int i = w->lo; i < w->hi; i++) {
        int n = snprintf(k, sizeof k, "n%d-%d", w->node, i);
        int rc =
            w->op ? tw_durable_cancel(w->d, k, (size_t)n)
                  : tw_durable_schedule(w->d, k, (size_t)n, due_of(w, i),
                                        "payload-32-bytes-..............", 32);
        if (rc)
            w->errors++;
    }
    return NULL;
}

static void sched_node(const char *seeds, int node, int threads, int n,
                       int go_fd, int out_fd)
{
    tw_durable_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.redis = seeds;
    cfg.redis_namespace = "bench";
    cfg.fire = nop_fire;
    cfg.wait_replicas =
        getenv("WAIT_REPLICAS") ? (uint32_t)atoi(getenv("WAIT_REPLICAS")) : 0;
    tw_durable *d;
    if (tw_durable_open(&d, &cfg)) {
        fprintf(stderr, "open failed\n");
        _exit(1);
    }
    int batch = getenv("BATCH") ? atoi(getenv("BATCH")) : 1;
    int spread = getenv("SPREAD_MS") ? atoi(getenv("SPREAD_MS")) : 0;
    char c;
    if (read(go_fd, &c, 1) != 1)
        _exit(1);
    double secs[2] = {1, 1};
    int errors = 0;
    int ops = getenv("KEEP") ? 1 : 2; /* KEEP: leave the timers pending */
    for (int op = 0; op < ops; op++) {
        pthread_t th[256];
        struct worker w[256];
        int64_t t0 = now_us();
        for (int i = 0; i < threads; i++) {
            w[i] = (struct worker){d,
                                   node,
                                   i,
                                   n * i / threads,
                                   n * (i + 1) / threads,
                                   op,
                                   (now_us() / 1000) + 3600 * 1000,
                                   0,
                                   batch,
                                   spread};
            pthread_create(&th[i], NULL, worker_main, &w[i]);
        }
        for (int i = 0; i < threads; i++) {
            pthread_join(th[i], NULL);
            errors += w[i].errors;
        }
        secs[op] = (double)(now_us() - t0) / 1e6;
    }
    tw_durable_close(d);
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
                 (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
    char line[160];
    int len = snprintf(line, sizeof line, "%f %f %d %f\n", secs[0], secs[1],
                       errors, cpu);
    if (write(out_fd, line, (size_t)len) != len)
        _exit(1);
    _exit(0);
}

static void sched_mode(const char *seeds, int nodes, int threads, int n)
{
    int go[2], out[2];
    if (pipe(go) || pipe(out))
        exit(1);
    fflush(NULL);
    for (int i = 0; i < nodes; i++)
        if (fork() == 0)
            sched_node(seeds, i, threads, n, go[0], out[1]);
    close(out[1]);
    close(go[0]);
    sleep_us(300000); /* every node connected */
    int rpid = getenv("REDIS_PID") ? atoi(getenv("REDIS_PID")) : 0;
    double r0 = rpid ? cpu_ms(rpid) : 0;
    for (int i = 0; i < nodes; i++)
        if (write(go[1], "g", 1) != 1)
            exit(1);
    double s0 = 0, s1 = 0, cpu = 0;
    int errors = 0;
    FILE *f = fdopen(out[0], "r");
    for (int i = 0; i < nodes; i++) {
        double a, b, u;
        int e;
        if (fscanf(f, "%lf %lf %d %lf", &a, &b, &e, &u) != 4) {
            int st;
            pid_t p = wait(&st);
            fprintf(stderr, "a node failed: pid %d status 0x%x\n", (int)p, st);
            exit(1);
        }
        cpu += u;
        s0 = a > s0 ? a : s0;
        s1 = b > s1 ? b : s1;
        errors += e;
    }
    while (wait(NULL) > 0)
        ;
    double rcpu = rpid ? cpu_ms(rpid) - r0 : 0;
    double total = (double)nodes * n;
    const char *w = getenv("WAIT_REPLICAS");
    bool keep = getenv("KEEP") != NULL;
    const char *b = getenv("BATCH");
    printf("sched%-9s nodes %d threads %d batch %s: schedules/s %.0f  "
           "cancels/s %.0f  errors %d  node cpu us per call %.1f  redis cpu "
           "us per call %.1f\n",
           w && atoi(w) > 0 ? " WAIT 1" : "", nodes, threads, b ? b : "1",
           total / s0, keep ? 0.0 : total / s1, errors,
           cpu * 1e6 / (total * (keep ? 1 : 2)),
           rcpu * 1e3 / (total * (keep ? 1 : 2)));
}

/* ------------------------------------------------------------------------ */

static _Atomic size_t nlate;
static size_t nlate_max;
static int64_t *late;

/* LATE_DUMP=FILE (fire): each delivery's lateness in us, in the order
 * of delivery, one a line (where in the run the late ones are). */
static void dump_late(const int64_t *l, size_t n)
{
    const char *path = getenv("LATE_DUMP");
    FILE *f = path ? fopen(path, "w") : NULL;
    for (size_t i = 0; f && i < n; i++)
        fprintf(f, "%lld\n", (long long)l[i]);
    if (f)
        fclose(f);
}

static int late_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    size_t i = nlate++;
    if (i < nlate_max)
        late[i] = now_us() - t->due_ms * 1000;
    return 0;
}

struct loader {
    tw_durable *d;
    int lo, hi, n, batch;
    int64_t start_ms, window_ms;
};

/* Timers lo..hi-1 ("f<i>", due evenly over the window): one call each, or
 * @batch per tw_durable_schedule_many. */
static void *load_main(void *arg)
{
    struct loader *l = arg;
    int b = l->batch > 1 ? l->batch : 1;
    tw_durable_item *it = calloc((size_t)b, sizeof *it);
    char(*k)[32] = calloc((size_t)b, sizeof *k);
    if (!it || !k)
        exit(1);
    for (int i = l->lo; i < l->hi; i += b) {
        int m = l->hi - i < b ? l->hi - i : b;
        for (int j = 0; j < m; j++) {
            int kn = snprintf(k[j], sizeof k[j], "f%d", i + j);
            it[j] = (tw_durable_item){k[j],
                                      (size_t)kn,
                                      l->start_ms + (int64_t)(i + j) *
                                                        l->window_ms / l->n,
                                      "payload-32-bytes-..............",
                                      32,
                                      0};
        }
        if (b == 1)
            tw_durable_schedule(l->d, it[0].key, it[0].key_len, it[0].due_ms,
                                it[0].payload, it[0].payload_len);
        else
            tw_durable_schedule_many(l->d, it, (size_t)m);
    }
    free(it);
    free(k);
    return NULL;
}

static uint32_t owner_lease(void)
{
    const char *e = getenv("OWNER_LEASE_MS");
    return e ? (uint32_t)atoi(e) : 0;
}

static void fire_mode(const char *seeds, int pid, int n, int window_ms)
{
    late = calloc((size_t)n, sizeof *late);
    nlate_max = (size_t)n;
    tw_durable_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.redis = seeds;
    cfg.redis_namespace = "fire";
    cfg.fire = late_fire;
    cfg.shards = getenv("SHARDS") ? (uint32_t)atoi(getenv("SHARDS")) : 0;
    cfg.redis_shard_lease_ms = owner_lease();
    cfg.horizon_ms =
        getenv("HORIZON_MS") ? (uint32_t)atoi(getenv("HORIZON_MS")) : 0;
    cfg.redis_check_gap_ms =
        getenv("CHECK_GAP_MS") ? (uint32_t)atoi(getenv("CHECK_GAP_MS")) : 0;
    tw_durable *d;
    if (tw_durable_open(&d, &cfg))
        exit(1);
    int64_t start_ms = now_us() / 1000 + 3000 + n / 20;
    int batch = getenv("LOAD_BATCH") ? atoi(getenv("LOAD_BATCH")) : 1;
    struct cpu c0 = cpu_now(pid);
    pthread_t th[32];
    struct loader l[32];
    for (int i = 0; i < 32; i++) {
        l[i] = (struct loader){d,     n * i / 32, n * (i + 1) / 32, n,
                               batch, start_ms,   window_ms};
        pthread_create(&th[i], NULL, load_main, &l[i]);
    }
    for (int i = 0; i < 32; i++)
        pthread_join(th[i], NULL);
    struct cpu c1 = cpu_now(pid);
    int64_t end = (start_ms + window_ms + 5000) * 1000;
    while (nlate < (size_t)n && now_us() < end)
        sleep_us(10000);
    struct cpu c2 = cpu_now(pid);
    tw_durable_close(d);
    size_t got = nlate < nlate_max ? nlate : nlate_max;
    dump_late(late, got);
    char name[32];
    snprintf(name, sizeof name, "twheel%s %ush b%d",
             cfg.redis_shard_lease_ms ? " own" : "",
             cfg.shards ? cfg.shards : 64, batch);
    report_late(name, late, got, (size_t)n, c0, c1, c2);
}

static const char poll_script[] =
    "local ks=redis.call('ZRANGEBYSCORE',KEYS[1],'-inf',ARGV[1],'LIMIT',0,"
    "ARGV[2])\n"
    "if #ks==0 then return {} end\n"
    "redis.call('ZREM',KEYS[1],unpack(ks))\n"
    "local ps=redis.call('HMGET',KEYS[2],unpack(ks))\n"
    "redis.call('HDEL',KEYS[2],unpack(ks))\n"
    "local out={}\n"
    "for i=1,#ks do out[#out+1]=ks[i]; out[#out+1]=ps[i] end\n"
    "return out\n";
static const char add_script[] = "redis.call('ZADD',KEYS[1],ARGV[1],ARGV[2])\n"
                                 "redis.call('HSET',KEYS[2],ARGV[2],ARGV[3])\n"
                                 "return 1\n";

/* A poller's connection to SEEDS ("host:port"). */
static redisContext *poll_connect(const char *seeds)
{
    char host[64];
    int port;
    if (sscanf(seeds, "%63[^:]:%d", host, &port) != 2)
        exit(2);
    redisContext *c = redisConnect(host, port);
    if (!c || c->err)
        exit(1);
    return c;
}

/* A poller's load: timers "f<i>" due evenly over the window into
 * PREFIX:z and PREFIX:h by the add script @sha, 1000 per pipeline. */
static void poll_load(redisContext *c, const char *sha, const char *prefix,
                      int64_t *due, int n, int64_t start_ms, int window_ms)
{
    for (int i = 0; i < n; i += 1000) {
        int m = n - i < 1000 ? n - i : 1000;
        for (int j = i; j < i + m; j++) {
            due[j] = start_ms + (int64_t)j * window_ms / n;
            redisAppendCommand(c, "EVALSHA %s 2 %s:z %s:h %lld f%d %s", sha,
                               prefix, prefix, (long long)due[j], j,
                               "payload-32-bytes-..............");
        }
        for (int j = 0; j < m; j++) {
            void *rep;
            if (redisGetReply(c, &rep) != REDIS_OK)
                exit(1);
            freeReplyObject(rep);
        }
    }
}

/* A poller's run: its connection, its timers' due times, Redis's and
 * this process's CPU at its start and after its load. */
struct poller {
    redisContext *c;
    int64_t *due;
    int64_t start_ms, end_us;
    int pid, n;
    struct cpu c0, c1;
};

/* Connect, size the run and load @nsrc scripts @src into @sha. */
static void poller_begin(struct poller *p, const char *seeds, int pid, int n,
                         const char *const *src, char (*sha)[41], int nsrc)
{
    p->c = poll_connect(seeds);
    p->pid = pid;
    p->n = n;
    late = calloc((size_t)n, sizeof *late);
    p->due = calloc((size_t)n, sizeof *p->due);
    if (!late || !p->due)
        exit(1);
    p->start_ms = now_us() / 1000 + 3000 + n / 20;
    p->c0 = cpu_now(pid);
    for (int i = 0; i < nsrc; i++) {
        redisReply *r = redisCommand(p->c, "SCRIPT LOAD %s", src[i]);
        if (!r || r->type != REDIS_REPLY_STRING)
            exit(1);
        memcpy(sha[i], r->str, 41);
        freeReplyObject(r);
    }
}

/* Load the timers into PREFIX:z and PREFIX:h by the add script @sha. */
static void poller_load(struct poller *p, const char *sha, const char *prefix,
                        int window_ms)
{
    poll_load(p->c, sha, prefix, p->due, p->n, p->start_ms, window_ms);
    p->c1 = cpu_now(p->pid);
    p->end_us = (p->start_ms + window_ms + 5000) * 1000;
}

/* The report of a poller "@kind @interval_ms ms", and its end. */
static void poller_end(struct poller *p, const char *kind, int interval_ms)
{
    struct cpu c2 = cpu_now(p->pid);
    redisFree(p->c);
    char name[32];
    snprintf(name, sizeof name, "%s %d ms", kind, interval_ms);
    report_late(name, late, nlate, (size_t)p->n, p->c0, p->c1, c2);
    free(p->due);
}

static void poll_mode(const char *seeds, int pid, int n, int window_ms,
                      int interval_ms)
{
    struct poller p;
    const char *src[2] = {add_script, poll_script};
    char sha[2][41];
    poller_begin(&p, seeds, pid, n, src, sha, 2);
    poller_load(&p, sha[0], "pq", window_ms);
    redisContext *c = p.c;
    int64_t *due = p.due;
    redisReply *r;
    int64_t next = now_us();
    while (nlate < (size_t)n && now_us() < p.end_us) {
        sleep_us(next - now_us());
        next += (int64_t)interval_ms * 1000;
        for (;;) {
            r = redisCommand(c, "EVALSHA %s 2 pq:z pq:h %lld 1000", sha[1],
                             (long long)(now_us() / 1000));
            if (!r || r->type != REDIS_REPLY_ARRAY)
                exit(1);
            int64_t t = now_us();
            for (size_t i = 0; i + 1 < r->elements; i += 2) {
                int id = atoi(r->element[i]->str + 1);
                late[nlate++] = t - due[id] * 1000;
            }
            size_t got = r->elements / 2;
            freeReplyObject(r);
            if (got < 1000)
                break;
        }
    }
    poller_end(&p, "poll", interval_ms);
}

/* The lease-poller. KEYS: z (due), h (payloads), a (active: key -> lease
 * end), t (key -> token), c (the last token). ARGV: now lease max. */
static const char lpoll_script[] =
    "local now,lease,max=tonumber(ARGV[1]),tonumber(ARGV[2]),ARGV[3]\n"
    "local ex=redis.call('ZRANGEBYSCORE',KEYS[3],'-inf',now,'LIMIT',0,max)\n"
    "if #ex>0 then\n"
    " local z={}\n"
    " for i=1,#ex do z[2*i-1]=now; z[2*i]=ex[i] end\n"
    " redis.call('ZREM',KEYS[3],unpack(ex))\n"
    " redis.call('ZADD',KEYS[1],unpack(z))\n"
    "end\n"
    "local ks=redis.call('ZRANGEBYSCORE',KEYS[1],'-inf',now,'LIMIT',0,max)\n"
    "if #ks==0 then return {} end\n"
    "local t=tonumber(redis.call('INCRBY',KEYS[5],#ks))-#ks\n"
    "local za,th,out={},{},{}\n"
    "local ps=redis.call('HMGET',KEYS[2],unpack(ks))\n"
    "for i=1,#ks do\n"
    " za[2*i-1]=now+lease; za[2*i]=ks[i]\n"
    " th[2*i-1]=ks[i]; th[2*i]=t+i\n"
    " out[3*i-2]=ks[i]; out[3*i-1]=t+i; out[3*i]=ps[i]\n"
    "end\n"
    "redis.call('ZREM',KEYS[1],unpack(ks))\n"
    "redis.call('ZADD',KEYS[3],unpack(za))\n"
    "redis.call('HSET',KEYS[4],unpack(th))\n"
    "return out\n";
/* ARGV: n, n keys, n tokens: a key is done when its token is still the
 * one it was claimed with. */
static const char ldone_script[] =
    "local n=tonumber(ARGV[1])\n"
    "local cur=redis.call('HMGET',KEYS[4],unpack(ARGV,2,1+n))\n"
    "local fin={}\n"
    "for i=1,n do\n"
    " if cur[i]==ARGV[1+n+i] then fin[#fin+1]=ARGV[1+i] end\n"
    "end\n"
    "if #fin==0 then return 0 end\n"
    "redis.call('ZREM',KEYS[3],unpack(fin))\n"
    "redis.call('HDEL',KEYS[2],unpack(fin))\n"
    "redis.call('HDEL',KEYS[4],unpack(fin))\n"
    "return #fin\n";

/* The lease-poller's callbacks for the claims of @r (the lateness of
 * each), then their one completion by the done script @sha; how many. */
static size_t lpoll_done(redisContext *c, const char *sha, redisReply *r,
                         const int64_t *due)
{
    static const char *av[2 * 1000 + 9]; /* 9 fixed, 1000 keys, tokens */
    static size_t al[2 * 1000 + 9];
    static char num[1000 + 1][24];
    size_t got = r->elements / 3;
    const char *head[9] = {"EVALSHA", sha,    "5",    "lp:z",   "lp:h",
                           "lp:a",    "lp:t", "lp:c", num[1000]};
    memcpy(av, head, sizeof head);
    for (int k = 0; k < 8; k++)
        al[k] = strlen(av[k]);
    al[8] = (size_t)snprintf(num[1000], 24, "%zu", got);
    int64_t t = now_us();
    for (size_t i = 0; i < got; i++) {
        redisReply *k = r->element[3 * i];
        int id = atoi(k->str + 1);
        late[nlate++] = t - due[id] * 1000;
        av[9 + i] = k->str;
        al[9 + i] = k->len;
        av[9 + got + i] = num[i];
        al[9 + got + i] = (size_t)snprintf(num[i], 24, "%lld",
                                           r->element[3 * i + 1]->integer);
    }
    if (got) {
        redisReply *dr = redisCommandArgv(c, (int)(9 + 2 * got), av, al);
        if (!dr || dr->type != REDIS_REPLY_INTEGER ||
            dr->integer != (long long)got)
            exit(1);
        freeReplyObject(dr);
    }
    return got;
}

static void lpoll_mode(const char *seeds, int pid, int n, int window_ms,
                       int interval_ms)
{
    struct poller p;
    char sha[3][41];
    const char *src[3] = {add_script, lpoll_script, ldone_script};
    poller_begin(&p, seeds, pid, n, src, sha, 3);
    poller_load(&p, sha[0], "lp", window_ms);
    int64_t next = now_us();
    while (nlate < (size_t)n && now_us() < p.end_us) {
        sleep_us(next - now_us());
        next += (int64_t)interval_ms * 1000;
        for (;;) {
            redisReply *r = redisCommand(
                p.c, "EVALSHA %s 5 lp:z lp:h lp:a lp:t lp:c %lld 30000 1000",
                sha[1], (long long)(now_us() / 1000));
            if (!r || r->type != REDIS_REPLY_ARRAY)
                exit(1);
            size_t got = lpoll_done(p.c, sha[2], r, p.due);
            freeReplyObject(r);
            if (got < 1000)
                break;
        }
    }
    poller_end(&p, "lpoll", interval_ms);
}

static void idle_mode(const char *seeds, int pid, int nodes, int secs)
{
    int go[2];
    if (pipe(go))
        exit(1);
    fflush(NULL);
    pid_t kids[64];
    for (int i = 0; i < nodes && i < 64; i++) {
        kids[i] = fork();
        if (kids[i] == 0) {
            close(go[1]);
            tw_durable_config cfg;
            memset(&cfg, 0, sizeof cfg);
            cfg.redis = seeds;
            cfg.redis_namespace = "idle";
            cfg.fire = nop_fire;
            cfg.shards =
                getenv("SHARDS") ? (uint32_t)atoi(getenv("SHARDS")) : 1024;
            cfg.redis_shard_lease_ms = owner_lease();
            tw_durable *d;
            if (tw_durable_open(&d, &cfg))
                _exit(1);
            char c;
            while (read(go[0], &c, 1) > 0) /* until the parent closes it */
                ;
            tw_durable_close(d);
            _exit(0);
        }
    }
    close(go[0]);
    sleep_us(3000000); /* every node open, ownership settled */
    double r0 = cpu_ms(pid);
    sleep_us((int64_t)secs * 1000000);
    double r1 = cpu_ms(pid);
    close(go[1]);
    while (wait(NULL) > 0)
        ;
    printf("idle%-4s %d nodes, %s shards: redis cpu %.1f ms/s\n",
           owner_lease() ? " own" : "", nodes,
           getenv("SHARDS") ? getenv("SHARDS") : "1024",
           (r1 - r0) / (double)secs);
}

/* "scripts": each Lua script the modes send, as its name, a NUL, its
 * text, a NUL (scripts/redis_slowlog.py names SLOWLOG's digests by
 * them). */
static void scripts_mode(void)
{
    static const char *const names[S_COUNT] = {
        "SCHED", "CANCEL", "CLAIM", "DONE",     "RELEASE",
        "REARM", "DDEL",   "TOUCH", "SCHED_IF", "RESTORE"};
    for (int i = 0; i < S_COUNT; i++)
        printf("%s%c%s%c", names[i], 0, tw__redis_scripts[i], 0);
    printf("poll%c%s%cpoll-add%c%s%c", 0, poll_script, 0, 0, add_script, 0);
    printf("lpoll%c%s%clpoll-done%c%s%c", 0, lpoll_script, 0, 0, ldone_script,
           0);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc == 2 && !strcmp(argv[1], "scripts"))
        scripts_mode();
    else if (argc >= 6 && !strcmp(argv[1], "sched"))
        sched_mode(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    else if (argc >= 6 && !strcmp(argv[1], "fire"))
        fire_mode(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    else if (argc >= 7 && !strcmp(argv[1], "poll"))
        poll_mode(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]),
                  atoi(argv[6]));
    else if (argc >= 6 && !strcmp(argv[1], "idle"))
        idle_mode(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
    else if (argc >= 7 && !strcmp(argv[1], "lpoll"))
        lpoll_mode(argv[2], atoi(argv[3]), atoi(argv[4]), atoi(argv[5]),
                   atoi(argv[6]));
    else {
        int help = argc == 2 && strcmp(argv[1], "--help") == 0;
        fprintf(help ? stdout : stderr,
                "usage: bench_redis sched SEEDS NODES THREADS N\n"
                "       bench_redis fire SEEDS REDIS_PID N WINDOW_MS\n"
                "       bench_redis poll SEEDS REDIS_PID N WINDOW_MS "
                "INTERVAL_MS\n"
                "       bench_redis idle SEEDS REDIS_PID NODES SECONDS\n"
                "       bench_redis lpoll SEEDS REDIS_PID N WINDOW_MS "
                "INTERVAL_MS\n"
                "(bench/bench_redis.c says what each mode measures)\n");
        return help ? 0 : 2;
    }
    return 0;
}
