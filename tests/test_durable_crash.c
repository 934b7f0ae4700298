/* SPDX-License-Identifier: MIT */
/*
 * tests/test_durable_crash.c - kill -9 at random moments.
 *
 * The parent runs a child that opens a store (small segments so rotation
 * and compaction happen; SYNC_GROUP, or every other incarnation
 * SYNC_INTERVAL, whose acknowledged calls are written to the kernel and so
 * must survive a kill of the process just as well), and from four threads
 * schedules, replaces and cancels timers due within 200 ms, some of whose
 * callbacks ask for one retry; some schedules and cancels go in batches of
 * 2..8 keys (tw_durable_schedule_many, tw_durable_cancel_many), each item
 * acknowledged by its own result. Before
 * each call the child writes an intent message to a pipe, after it the result;
 * its callback writes a delivery message. Each message is one write() of less
 * than PIPE_BUF bytes, so a kill never tears one. The parent kills the child
 * with SIGKILL a random 2..60 ms after it said it had opened the store, starts
 * another on the same directory, and after the last kill lets a final child run
 * until nothing is pending.
 *
 * Each incarnation's threads use keys of their own, so the operations on a
 * key are sequential and only the last one can be cut off by the kill. The
 * parent then checks, for every key:
 *   - nothing is delivered before its due time, and with the payload of
 *     the version it claims;
 *   - nothing is delivered that was never asked for;
 *   - a version is never delivered with a due time after the ack of a later
 *     replace or cancel of its key, nor in a later incarnation at all;
 *   - a cancel that found nothing pending came after a delivery of the
 *     last acknowledged version;
 *   - the last acknowledged version is delivered (to completion: a retry
 *     version twice) unless an unacknowledged cancel followed it; an
 *     unacknowledged schedule after it may be delivered instead.
 *
 * Usage: test_durable_crash [KILLS]   (default 200)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <twheel/durable.h>

#include "clock_fixture.h" /* now_ms */
#include "test.h"

#define THREADS 4
#define SLOTS 32

enum { M_READY = 1, M_INTENT, M_ACK, M_DELIVER, M_BAD, M_FINISHED };
enum { OP_SCHED = 1, OP_CANCEL };

struct msg {
    uint8_t type, op, retry, pad;
    uint32_t inc, thread, slot, ver, attempt;
    int32_t rc;
    int64_t due, at, rec_due;
};

/* ------------------------------------------------------------------------ */
/* Child. */

static int out_fd;
static uint32_t my_inc;
static tw_durable *store;

static void send_msg(const struct msg *m)
{
    ssize_t k = write(out_fd, m, sizeof *m);
    if (k != (ssize_t)sizeof *m)
        _exit(90);
}

static int child_fire(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)arg;
    struct msg m = {.type = M_DELIVER};
    char key[64], pay[128];
    if (t->key_len >= sizeof key || t->payload_len >= sizeof pay) {
        m.type = M_BAD;
        send_msg(&m);
        return 0;
    }
    memcpy(key, t->key, t->key_len);
    key[t->key_len] = 0;
    memcpy(pay, t->payload, t->payload_len);
    pay[t->payload_len] = 0;
    unsigned inc, th, slot, ver, retry;
    long long due;
    char kcheck[64];
    if (sscanf(pay, "%u %u %u %u %lld %u", &inc, &th, &slot, &ver, &due,
               &retry) != 6) {
        m.type = M_BAD;
        send_msg(&m);
        return 0;
    }
    snprintf(kcheck, sizeof kcheck, "k%u.%u.%u", inc, th, slot);
    if (strcmp(kcheck, key) != 0)
        m.type = M_BAD;
    m.inc = inc;
    m.thread = th;
    m.slot = slot;
    m.ver = ver;
    m.due = due;
    m.rec_due = t->due_ms;
    m.at = now_ms();
    m.attempt = t->attempt;
    m.retry = (uint8_t)retry;
    m.rc = (int32_t)my_inc; /* the incarnation that delivered */
    send_msg(&m);
    return retry && t->attempt == 1 ? 20 : 0;
}

#define BATCH_MAX 8

/* An intent message for a new version of @slot due in 0..199 ms, and its
 * payload into @pay. Returns the payload's length. */
static int sched_intent(struct msg *m, uint32_t th, uint32_t slot,
                        uint32_t *ver, uint64_t r, char *pay, size_t cap)
{
    *m = (struct msg){.type = M_INTENT,
                      .op = OP_SCHED,
                      .inc = my_inc,
                      .thread = th,
                      .slot = slot,
                      .ver = ++ver[slot],
                      .due = now_ms() + (int64_t)((r >> 16) % 200),
                      .retry = (r >> 40) % 5 == 0};
    return snprintf(pay, cap, "%u %u %u %u %lld %u", my_inc, th, slot, m->ver,
                    (long long)m->due, m->retry);
}

/* tw_durable_schedule_many() (or with @cancel, tw_durable_cancel_many())
 * of 2..BATCH_MAX distinct slots from @slot on: one op in flight per key,
 * like the single calls. */
static void child_batch(uint32_t th, uint32_t slot, uint32_t *ver,
                        uint64_t *rng, bool cancel)
{
    size_t n = 2 + (size_t)(tw_test_rand(rng) % (BATCH_MAX - 1));
    struct msg m[BATCH_MAX];
    tw_durable_item it[BATCH_MAX];
    char key[BATCH_MAX][64], pay[BATCH_MAX][128];
    for (size_t i = 0; i < n; i++) {
        uint32_t sl = (slot + (uint32_t)i) % SLOTS;
        int pl = 0;
        if (cancel)
            m[i] = (struct msg){.type = M_INTENT,
                                .op = OP_CANCEL,
                                .inc = my_inc,
                                .thread = th,
                                .slot = sl};
        else
            pl = sched_intent(&m[i], th, sl, ver, tw_test_rand(rng), pay[i],
                              sizeof pay[i]);
        int kl = snprintf(key[i], sizeof key[i], "k%u.%u.%u", my_inc, th, sl);
        it[i] = (tw_durable_item){.key = key[i],
                                  .key_len = (size_t)kl,
                                  .due_ms = m[i].due,
                                  .payload = pay[i],
                                  .payload_len = (size_t)pl};
        send_msg(&m[i]);
    }
    if (cancel)
        tw_durable_cancel_many(store, it, n);
    else
        tw_durable_schedule_many(store, it, n);
    int64_t at = now_ms();
    for (size_t i = 0; i < n; i++) {
        m[i].type = M_ACK;
        m[i].rc = it[i].result;
        m[i].at = at;
        send_msg(&m[i]);
    }
}

static void *child_worker(void *p)
{
    uint32_t th = (uint32_t)(uintptr_t)p;
    uint64_t rng = ((uint64_t)my_inc << 32) ^ th ^ (uint64_t)getpid();
    uint32_t ver[SLOTS] = {0};
    for (;;) {
        uint64_t r = tw_test_rand(&rng);
        uint32_t slot = (uint32_t)(r % SLOTS);
        char key[64];
        int kl = snprintf(key, sizeof key, "k%u.%u.%u", my_inc, th, slot);
        int pick = (int)((r >> 8) % 100);
        struct msg m;
        if (pick < 55) {
            char pay[128];
            int pl = sched_intent(&m, th, slot, ver, r, pay, sizeof pay);
            send_msg(&m);
            m.rc = tw_durable_schedule(store, key, (size_t)kl, m.due, pay,
                                       (size_t)pl);
        } else if (pick < 70) {
            child_batch(th, slot, ver, &rng, false);
            continue;
        } else if (pick < 78) {
            child_batch(th, slot, ver, &rng, true);
            continue;
        } else {
            m = (struct msg){.type = M_INTENT,
                             .op = OP_CANCEL,
                             .inc = my_inc,
                             .thread = th,
                             .slot = slot};
            send_msg(&m);
            m.rc = tw_durable_cancel(store, key, (size_t)kl);
        }
        m.type = M_ACK;
        m.at = now_ms();
        send_msg(&m);
    }
    return NULL;
}

static void child_main(const char *dir, uint32_t inc, bool final)
{
    my_inc = inc;
    tw_durable_config c;
    memset(&c, 0, sizeof c);
    c.dir = dir;
    c.fire = child_fire;
    c.segment_bytes = 64 * 1024;
    c.executor_threads = inc % 3 == 1 ? 2 : 0;
    if (inc % 2 == 1) {
        c.sync = TW_DURABLE_SYNC_INTERVAL;
        c.sync_interval_ms = 20;
    }
    int rc = tw_durable_open(&store, &c);
    if (rc) {
        fprintf(stderr, "child %u: open: %s\n", inc, tw_strerror(rc));
        _exit(91);
    }
    struct msg m = {.type = M_READY, .inc = inc};
    send_msg(&m);
    if (final) {
        int64_t t0 = now_ms();
        for (;;) {
            tw_durable_stats st;
            tw_durable_stats_get(store, &st);
            if (st.pending == 0 && now_ms() - t0 > 100)
                break;
            usleep(5000);
        }
        tw_durable_close(store);
        m.type = M_FINISHED;
        send_msg(&m);
        /* No exit handlers: under valgrind, a leak check here would see
         * the parent's bookkeeping copied into the child. */
        raise(SIGKILL);
    }
    pthread_t t[THREADS];
    for (uint32_t i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, child_worker, (void *)(uintptr_t)i);
    for (;;)
        pause();
}

/* ------------------------------------------------------------------------ */
/* Parent: what it heard. */

struct op {
    uint8_t op, retry, acked;
    int32_t rc;
    uint32_t ver;
    int64_t due, t_ack;
    uint64_t ack_seq;
};

struct dl {
    uint32_t ver, attempt, inc;
    int64_t due, rec_due, at;
    uint64_t seq;
};

struct keylog {
    struct op *ops;
    size_t nops, capops;
    struct dl *dls;
    size_t ndls, capdls;
};

static struct keylog *keys; /* [inc][thread][slot] */
static uint32_t max_inc;
static uint64_t seq;
static uint64_t n_acked, n_delivered;

static struct keylog *key_of(uint32_t inc, uint32_t th, uint32_t slot)
{
    ASSERT_LE(inc, max_inc);
    ASSERT_LT(th, THREADS);
    ASSERT_LT(slot, SLOTS);
    return &keys[((size_t)inc * THREADS + th) * SLOTS + slot];
}

static void handle(const struct msg *m)
{
    seq++;
    if (m->type == M_BAD)
        TW_TEST_FAIL_("a delivery with a damaged key or payload (inc %u)",
                      m->inc);
    if (m->type == M_READY || m->type == M_FINISHED)
        return;
    struct keylog *k = key_of(m->inc, m->thread, m->slot);
    if (m->type == M_INTENT) {
        if (k->nops == k->capops) {
            k->capops = k->capops ? 2 * k->capops : 8;
            k->ops = realloc(k->ops, k->capops * sizeof *k->ops);
        }
        k->ops[k->nops++] = (struct op){
            .op = m->op, .retry = m->retry, .ver = m->ver, .due = m->due};
    } else if (m->type == M_ACK) {
        ASSERT(k->nops > 0);
        struct op *o = &k->ops[k->nops - 1];
        ASSERT_EQ(o->op, m->op);
        o->acked = 1;
        o->rc = m->rc;
        o->t_ack = m->at;
        o->ack_seq = seq;
        n_acked++;
        if (o->op == OP_SCHED && o->rc != 0)
            TW_TEST_FAIL_("schedule failed: %s", tw_strerror(o->rc));
        if (o->op == OP_CANCEL && o->rc != 0 && o->rc != TW_ENOENT)
            TW_TEST_FAIL_("cancel failed: %s", tw_strerror(o->rc));
    } else if (m->type == M_DELIVER) {
        if (k->ndls == k->capdls) {
            k->capdls = k->capdls ? 2 * k->capdls : 4;
            k->dls = realloc(k->dls, k->capdls * sizeof *k->dls);
        }
        k->dls[k->ndls++] = (struct dl){.ver = m->ver,
                                        .attempt = m->attempt,
                                        .inc = (uint32_t)m->rc,
                                        .due = m->due,
                                        .rec_due = m->rec_due,
                                        .at = m->at,
                                        .seq = seq};
        n_delivered++;
        if (m->at < m->rec_due || m->rec_due < m->due)
            TW_TEST_FAIL_("k%u.%u.%u v%u delivered at %lld, due %lld "
                          "(record %lld): early",
                          m->inc, m->thread, m->slot, m->ver, (long long)m->at,
                          (long long)m->due, (long long)m->rec_due);
    }
}

static bool delivered(const struct keylog *k, uint32_t ver, bool retry,
                      uint64_t before_seq)
{
    for (size_t i = 0; i < k->ndls; i++)
        if (k->dls[i].ver == ver && k->dls[i].seq < before_seq &&
            (!retry || k->dls[i].attempt >= 2))
            return true;
    return false;
}

static void check_key(uint32_t inc, uint32_t th, uint32_t slot)
{
    struct keylog *k = key_of(inc, th, slot);
    char name[64];
    snprintf(name, sizeof name, "k%u.%u.%u", inc, th, slot);
    /* Every delivery is of a version asked for, with its due time and not
     * after a later replace or cancel took effect. */
    for (size_t i = 0; i < k->ndls; i++) {
        struct dl *d = &k->dls[i];
        size_t j = 0;
        while (j < k->nops &&
               !(k->ops[j].op == OP_SCHED && k->ops[j].ver == d->ver))
            j++;
        if (j == k->nops)
            TW_TEST_FAIL_("%s v%u delivered but never scheduled", name, d->ver);
        if (k->ops[j].due != d->due)
            TW_TEST_FAIL_("%s v%u delivered with another payload", name,
                          d->ver);
        for (size_t l = j + 1; l < k->nops; l++) {
            struct op *o = &k->ops[l];
            if (!o->acked || o->rc != 0)
                continue;
            if (d->rec_due > o->t_ack)
                TW_TEST_FAIL_("%s v%u (due %lld) delivered after a later "
                              "%s was acknowledged at %lld",
                              name, d->ver, (long long)d->rec_due,
                              o->op == OP_CANCEL ? "cancel" : "replace",
                              (long long)o->t_ack);
            if (d->inc > inc)
                TW_TEST_FAIL_("%s v%u came back in incarnation %u after a "
                              "later acknowledged %s",
                              name, d->ver, d->inc,
                              o->op == OP_CANCEL ? "cancel" : "replace");
        }
    }
    /* Walk the operations: what is pending after each acknowledged one. */
    int64_t cur = -1; /* index of the op whose version is pending */
    for (size_t i = 0; i < k->nops; i++) {
        struct op *o = &k->ops[i];
        if (!o->acked) {
            ASSERT_EQ(i, k->nops - 1); /* only the last can be cut off */
            break;
        }
        if (o->op == OP_SCHED) {
            cur = (int64_t)i;
        } else if (o->rc == TW_ENOENT) {
            if (cur >= 0 &&
                !delivered(k, k->ops[cur].ver, k->ops[cur].retry, o->ack_seq))
                TW_TEST_FAIL_("%s: cancel found nothing, but v%u was never "
                              "delivered: lost",
                              name, k->ops[cur].ver);
            cur = -1;
        } else {
            cur = -1;
        }
    }
    if (cur < 0)
        return;
    struct op *last = &k->ops[k->nops - 1];
    if (!last->acked && last->op == OP_CANCEL)
        return; /* may or may not have taken effect */
    if (delivered(k, k->ops[cur].ver, k->ops[cur].retry, UINT64_MAX))
        return;
    if (!last->acked && last->op == OP_SCHED &&
        delivered(k, last->ver, last->retry, UINT64_MAX))
        return;
    TW_TEST_FAIL_("%s v%u (due %lld) acknowledged but never delivered", name,
                  k->ops[cur].ver, (long long)k->ops[cur].due);
}

/* Run one child; kill it @kill_ms after it is ready (-1: let it finish). */
static void run_child(const char *dir, uint32_t inc, int kill_ms)
{
    int p[2];
    ASSERT_EQ(pipe(p), 0);
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        out_fd = p[1];
        child_main(dir, inc, kill_ms < 0);
    }
    close(p[1]);
    struct msg m;
    size_t have = 0;
    int64_t kill_at = INT64_MAX;
    bool killed = false, finished = false;
    for (;;) {
        int timeout = -1;
        if (!killed && kill_at != INT64_MAX) {
            int64_t left = kill_at - now_ms();
            if (left <= 0) {
                kill(pid, SIGKILL);
                killed = true;
            } else {
                timeout = (int)left;
            }
        }
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        if (poll(&pf, 1, timeout) == 0)
            continue;
        ssize_t k = read(p[0], (char *)&m + have, sizeof m - have);
        if (k < 0 && errno == EINTR)
            continue;
        ASSERT(k >= 0);
        if (k == 0)
            break; /* every writer is gone */
        have += (size_t)k;
        if (have < sizeof m)
            continue;
        have = 0;
        handle(&m);
        if (m.type == M_READY && kill_ms >= 0)
            kill_at = now_ms() + kill_ms;
        if (m.type == M_FINISHED)
            finished = true;
    }
    ASSERT_EQ(have, 0);
    close(p[0]);
    int status;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    if (!(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL))
        TW_TEST_FAIL_("child %u ended with status %d", inc, status);
    if (kill_ms < 0)
        ASSERT(finished);
}

int main(int argc, char **argv)
{
    uint32_t kills = argc > 1 ? (uint32_t)strtoul(argv[1], NULL, 10) : 200;
    char dir[] = "/tmp/tw_durable_crash_XXXXXX";
    ASSERT_NOT_NULL(mkdtemp(dir));
    max_inc = kills;
    keys = calloc((size_t)(kills + 1) * THREADS * SLOTS, sizeof *keys);
    ASSERT_NOT_NULL(keys);
    uint64_t rng = (uint64_t)time(NULL);
    int64_t t0 = now_ms();
    for (uint32_t inc = 0; inc < kills; inc++)
        run_child(dir, inc, 2 + (int)(tw_test_rand(&rng) % 59));
    run_child(dir, kills, -1);
    for (uint32_t inc = 0; inc <= kills; inc++)
        for (uint32_t th = 0; th < THREADS; th++)
            for (uint32_t s = 0; s < SLOTS; s++)
                check_key(inc, th, s);
    printf("%u kills in %.1f s: %" PRIu64 " acknowledged calls, %" PRIu64
           " deliveries checked\n",
           kills, (double)(now_ms() - t0) / 1000, n_acked, n_delivered);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ASSERT_EQ(system(cmd), 0);
    for (size_t i = 0; i < (size_t)(kills + 1) * THREADS * SLOTS; i++) {
        free(keys[i].ops);
        free(keys[i].dls);
    }
    free(keys);
    return 0;
}
