/* SPDX-License-Identifier: MIT */
/*
 * tests/test_durable_list_build.c - the journal's first listing builds its
 * ordered index in steps and lets go of the store's lock between them. A
 * test hook runs between the steps and changes the store there: cancels,
 * moves to new due times, and enough new keys that the key table grows
 * while the build walks it. The listing must still be exactly the store's
 * timers, each once, in (due, key) order.
 */
#define _GNU_SOURCE
#include "durable_fixture.h"
#include "durable_hooks.h"

#define OLD 20000
#define NEW 40000
#define ALL (OLD + NEW)

static int64_t due[ALL]; /* 0: not in the store */
static int hook_calls;
static size_t nb_first, nb_last;
static bool grew_mid_walk;
static int next_new = OLD;
static uint64_t rnd_state = 88172645463325252u;

static uint64_t rnd(void)
{
    rnd_state ^= rnd_state << 13;
    rnd_state ^= rnd_state >> 7;
    rnd_state ^= rnd_state << 17;
    return rnd_state;
}

static int key_of(int i, char *k, size_t len)
{
    return snprintf(k, len, i < OLD ? "k%05d" : "n%05d", i < OLD ? i : i - OLD);
}

static int fire_none(tw_durable *d, const tw_durable_timer *t, void *arg)
{
    (void)d;
    (void)t;
    (void)arg;
    return 0;
}

static void set(tw_durable *d, int i, int64_t when)
{
    char k[16];
    int kl = key_of(i, k, sizeof k);
    ASSERT_EQ(tw_durable_schedule(d, k, (size_t)kl, when, "p", 1), 0);
    due[i] = when;
}

static void drop(tw_durable *d, int i)
{
    char k[16];
    int kl = key_of(i, k, sizeof k);
    ASSERT_EQ(tw_durable_cancel(d, k, (size_t)kl), due[i] ? 0 : TW_ENOENT);
    due[i] = 0;
}

static void between_steps(struct tw_durable *d)
{
    size_t nb, nold;
    tw__durable_table(d, &nb, &nold);
    if (hook_calls == 0)
        nb_first = nb;
    nb_last = nb;
    grew_mid_walk |= nold != 0;
    int64_t base = 1700000000000 + 3600000;
    /* New keys: the first call adds them until the table has begun to
     * grow (it grows a few buckets per schedule, so the steps after it
     * walk both tables), the later calls 300 each. */
    for (int k = 0; next_new < ALL && (hook_calls ? k < 300 : !nold); k++) {
        set(d, next_new++, base + (int64_t)(rnd() % 100000));
        tw__durable_table(d, &nb, &nold);
    }
    /* Every time: keys cancelled, moved and put back, old and new. */
    for (int n = 0; n < 200; n++) {
        int i = (int)(rnd() % (unsigned)next_new);
        switch (rnd() % 3) {
        case 0:
            if (due[i])
                drop(d, i);
            break;
        default:
            set(d, i, base + (int64_t)(rnd() % 100000));
            break;
        }
    }
    hook_calls++;
}

static int cmp_want(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    if (due[x] != due[y])
        return due[x] < due[y] ? -1 : 1;
    char kx[16], ky[16];
    key_of(x, kx, sizeof kx);
    key_of(y, ky, sizeof ky);
    return strcmp(kx, ky);
}

static void test_build_in_steps(void)
{
    char dir[256];
    df_new_dir(dir, sizeof dir, NULL);
    tw_durable_config c = df_cfg(dir, fire_none);
    c.sync = TW_DURABLE_SYNC_NONE;
    c.segment_bytes = 0;
    tw_durable *d = df_open(&c);
    int64_t base = 1700000000000 + 3600000;
    for (int i = 0; i < OLD; i++)
        set(d, i, base + (int64_t)(rnd() % 100000));
    tw__durable_index_hook = between_steps;
    static tw_durable_entry e[1000];
    static char kb[1000 * 8];
    tw_durable_cursor cur = TW_DURABLE_CURSOR_INIT;
    /* The first call builds the index (the hook runs between steps). */
    int n = tw_durable_list(d, 0, INT64_MAX, &cur, e, 1000, kb, sizeof kb);
    tw__durable_index_hook = NULL;
    ASSERT_GT(hook_calls, 10);
    ASSERT(grew_mid_walk);
    ASSERT_GT(nb_last, nb_first);
    static int want[ALL];
    size_t nwant = 0;
    for (int i = 0; i < ALL; i++)
        if (due[i])
            want[nwant++] = i;
    qsort(want, nwant, sizeof want[0], cmp_want);
    size_t got = 0;
    for (;;) {
        ASSERT_GE(n, 0);
        for (int j = 0; j < n; j++, got++) {
            ASSERT_LT(got, nwant);
            char k[16];
            int kl = key_of(want[got], k, sizeof k);
            if (e[j].key_len != (size_t)kl || memcmp(e[j].key, k, (size_t)kl) ||
                e[j].due_ms != due[want[got]])
                TW_TEST_FAIL_("entry %zu: %.*s at %lld, want %s at %lld", got,
                              (int)e[j].key_len, (const char *)e[j].key,
                              (long long)e[j].due_ms, k,
                              (long long)due[want[got]]);
        }
        if (cur.done)
            break;
        n = tw_durable_list(d, 0, INT64_MAX, &cur, e, 1000, kb, sizeof kb);
    }
    ASSERT_EQ(got, nwant);
    ASSERT_EQ(df_pending(d), nwant);
    ASSERT_EQ(tw_durable_close(d), 0);
    df_rm_dir(dir);
}

int main(void)
{
    RUN_TEST(test_build_in_steps);
    return tw_test_done();
}
