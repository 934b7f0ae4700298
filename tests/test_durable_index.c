/* SPDX-License-Identifier: MIT */
/*
 * tests/test_durable_index.c - the journal's ordered index
 * (src/durable_index.c) against a sorted array: random inserts, erases
 * (of entries present and absent) and walks from random positions, with
 * ties in the tick broken by key bytes. Built twice: with the normal walk
 * stack, and with a stack of 2 entries (TW__DX_STACK), so that every walk
 * of a tree deeper than that takes the drop-and-seek-again path.
 */
#include "durable_index.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test.h"

#define KEYS 2000

static char keys[KEYS][16];
static uint64_t tick_of[KEYS]; /* the entry's tick while it is in */
static int in[KEYS];

static void key_fn(void *ctx, uintptr_t h, const unsigned char **k, size_t *l)
{
    (void)ctx;
    *k = (const unsigned char *)keys[h - 1];
    *l = strlen(keys[h - 1]);
}

static int cmp(uint64_t ta, const char *ka, uint64_t tb, const char *kb)
{
    if (ta != tb)
        return ta < tb ? -1 : 1;
    size_t la = strlen(ka), lb = strlen(kb);
    int c = memcmp(ka, kb, la < lb ? la : lb);
    return c ? c : (la > lb) - (la < lb);
}

/* The model's first entry after (@t, @k) (@after) or at or after @t. */
static int model_next(uint64_t t, const char *k, int after)
{
    int best = -1;
    for (int i = 0; i < KEYS; i++) {
        if (!in[i])
            continue;
        int c = cmp(tick_of[i], keys[i], t, k);
        if (after ? c <= 0 : tick_of[i] < t)
            continue;
        if (best < 0 || cmp(tick_of[i], keys[i], tick_of[best], keys[best]) < 0)
            best = i;
    }
    return best;
}

static void check_walk(tw__dx *x, uint64_t t, const char *k, int after,
                       int steps)
{
    tw__dx_iter it;
    if (!after)
        k = ""; /* at or after a tick: from its first key */
    tw__dx_seek(&it, x, t, (const unsigned char *)k, strlen(k), after);
    for (int s = 0; s < steps; s++) {
        int want = model_next(t, k, after);
        uint64_t gt;
        uintptr_t gh;
        bool got = tw__dx_next(&it, &gt, &gh);
        if (want < 0) {
            ASSERT(!got);
            return;
        }
        ASSERT(got);
        ASSERT_EQ(gh, (uintptr_t)want + 1);
        ASSERT_EQ(gt, tick_of[want]);
        t = gt;
        k = keys[want];
        after = 1;
    }
}

/* Usage: test_durable_index [OPS] (default 40,000 random operations; the
 * valgrind stage runs fewer). */
int main(int argc, char **argv)
{
    int ops = argc > 1 ? atoi(argv[1]) : 40000;
    ASSERT(ops > 0);
    srand(12345);
    for (int i = 0; i < KEYS; i++) /* bytes above 0x7f sort last */
        snprintf(keys[i], sizeof keys[i], "%c%04d", i % 3 ? 'k' : 0xe9, i);
    tw__dx *x = tw__dx_new(key_fn, NULL, 42);
    ASSERT_NOT_NULL(x);
    size_t count = 0;
    for (int op = 0; op < ops; op++) {
        int i = rand() % KEYS;
        int r = rand() % 10;
        if (r < 5) {
            if (in[i]) { /* a move: out at the old tick, in at the new */
                ASSERT(tw__dx_erase(x, tick_of[i], (uintptr_t)i + 1));
                count--;
            }
            tick_of[i] = (uint64_t)(rand() % 50); /* many ties */
            ASSERT_EQ(tw__dx_insert(x, tick_of[i], (uintptr_t)i + 1), 0);
            in[i] = 1;
            count++;
        } else if (r < 8) {
            /* An erase at a wrong tick finds nothing. */
            ASSERT(!tw__dx_erase(x, 1000, (uintptr_t)i + 1));
            ASSERT_EQ(tw__dx_erase(x, tick_of[i], (uintptr_t)i + 1),
                      (bool)in[i]);
            count -= (size_t)in[i];
            in[i] = 0;
        } else {
            int j = rand() % KEYS;
            check_walk(x, (uint64_t)(rand() % 52), keys[j], rand() % 2,
                       r == 9 && op % 16 == 0 ? KEYS + 1 : 20);
        }
        ASSERT_EQ(tw__dx_count(x), count);
    }
    check_walk(x, 0, "", 0, KEYS + 1);
    tw__dx_free(x);
    return tw_test_done();
}
