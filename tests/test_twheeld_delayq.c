/* SPDX-License-Identifier: MIT */
/*
 * test_twheeld_delayq - twheeld's index of delayed jobs (twheeld/delayq.c)
 * against a brute-force model: random adds, removals and queue churn, the
 * invariants checked at every step, the first job of each queue and every
 * lookup compared with the model's.
 */
#include "delayq.h"
#include "test.h"
#include "twheel/wheel.h"

#define NQ 5
#define MAXJ 3000

struct mjob {
    uint64_t id;
    int64_t due;
    uint32_t q;
};

static struct mjob model[MAXJ];
static size_t nmodel;
static uint64_t rng = 88172645463325252ull;

static uint64_t rnd(void)
{
    return tw_test_rand(&rng);
}

static bool model_first(uint32_t q, uint64_t *id, int64_t *due)
{
    const struct mjob *best = NULL;
    for (size_t i = 0; i < nmodel; i++) {
        const struct mjob *m = &model[i];
        if (m->q == q && (!best || m->due < best->due ||
                          (m->due == best->due && m->id < best->id)))
            best = m;
    }
    if (best) {
        *id = best->id;
        *due = best->due;
    }
    return best != NULL;
}

static void compare(struct tbd_dq *dq, const uint32_t *qs)
{
    ASSERT(tbd_dq_check(dq));
    ASSERT_EQ(tbd_dq_total(dq), nmodel);
    for (int k = 0; k < NQ; k++) {
        uint64_t a = 0, b = 0;
        int64_t da = 0, db = 0;
        bool ha = tbd_dq_first(dq, qs[k], &a, &da);
        bool hb = model_first(qs[k], &b, &db);
        ASSERT_EQ(ha, hb);
        if (ha) {
            ASSERT_EQ(a, b);
            ASSERT_EQ(da, db);
        }
    }
}

static void step(struct tbd_dq *dq, const uint32_t *qs)
{
    uint64_t r = rnd() % 10;
    if (r < 6 && nmodel < MAXJ) {
        /* Ids collide now and then (refused), due times often. */
        struct mjob m = {1 + rnd() % (4 * MAXJ), (int64_t)(rnd() % 50) - 10,
                         qs[rnd() % NQ]};
        bool held = tbd_dq_get(dq, m.id, NULL, NULL);
        int rc = tbd_dq_add(dq, m.q, m.id, m.due);
        ASSERT_EQ(rc, held ? TW_EINVAL : 0);
        if (!held)
            model[nmodel++] = m;
    } else if (nmodel > 0) {
        size_t i = rnd() % nmodel;
        uint32_t q = 0;
        int64_t due = 0;
        ASSERT(tbd_dq_get(dq, model[i].id, &q, &due));
        ASSERT_EQ(q, model[i].q);
        ASSERT_EQ(due, model[i].due);
        ASSERT(tbd_dq_remove(dq, model[i].id));
        ASSERT(!tbd_dq_remove(dq, model[i].id));
        model[i] = model[--nmodel];
    }
}

static void test_random_against_model(void)
{
    struct tbd_dq *dq;
    uint32_t qs[NQ];
    ASSERT_EQ(tbd_dq_new(&dq), 0);
    for (int k = 0; k < NQ; k++)
        ASSERT_EQ(tbd_dq_queue_new(dq, &qs[k]), 0);
    for (int i = 0; i < 40000; i++) {
        step(dq, qs);
        if (i % 97 == 0)
            compare(dq, qs);
    }
    /* Drain in due order through the first of each queue. */
    while (nmodel) {
        compare(dq, qs);
        uint64_t id;
        int64_t due;
        uint32_t q = qs[rnd() % NQ];
        if (!tbd_dq_first(dq, q, &id, &due))
            continue;
        ASSERT(tbd_dq_remove(dq, id));
        for (size_t i = 0; i < nmodel; i++)
            if (model[i].id == id)
                model[i] = model[--nmodel];
    }
    compare(dq, qs);
    tbd_dq_free(dq);
}

static void test_bad_input_and_queue_reuse(void)
{
    struct tbd_dq *dq;
    uint32_t a, b, c;
    ASSERT_EQ(tbd_dq_new(&dq), 0);
    ASSERT_EQ(tbd_dq_queue_new(dq, &a), 0);
    ASSERT_EQ(tbd_dq_queue_new(dq, &b), 0);
    ASSERT_EQ(tbd_dq_add(dq, a, 0, 5), TW_EINVAL); /* id 0 */
    ASSERT_EQ(tbd_dq_add(dq, 7, 1, 5), TW_EINVAL); /* no such queue */
    ASSERT_EQ(tbd_dq_add(dq, a, 1, 5), 0);
    ASSERT_EQ(tbd_dq_add(dq, b, 1, 6), TW_EINVAL); /* held */
    ASSERT(!tbd_dq_get(dq, 0, NULL, NULL));
    ASSERT(!tbd_dq_remove(dq, 2));
    ASSERT_EQ(tbd_dq_count(dq, a), 1);
    ASSERT_EQ(tbd_dq_count(dq, b), 0);
    tbd_dq_queue_free(dq, b);
    ASSERT_EQ(tbd_dq_add(dq, b, 3, 5), TW_EINVAL); /* freed */
    ASSERT_EQ(tbd_dq_queue_new(dq, &c), 0);
    ASSERT_EQ(c, b); /* its number is reused */
    ASSERT(tbd_dq_check(dq));
    tbd_dq_free(dq);
    tbd_dq_free(NULL);
}

/* A million entries: what the server's memory per delayed job rests on. */
static void test_bytes_per_job(void)
{
    struct tbd_dq *dq;
    uint32_t q;
    ASSERT_EQ(tbd_dq_new(&dq), 0);
    ASSERT_EQ(tbd_dq_queue_new(dq, &q), 0);
    for (uint64_t id = 1; id <= 1000000; id++)
        ASSERT_EQ(tbd_dq_add(dq, q, id, (int64_t)(rnd() % 100000)), 0);
    size_t bytes = tbd_dq_bytes(dq);
    fprintf(stderr, "1e6 delayed jobs: %zu bytes, %.1f a job\n", bytes,
            (double)bytes / 1e6);
    ASSERT_LE(bytes, 52u * 1000000u);
    int64_t last = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t id;
        int64_t due;
        ASSERT(tbd_dq_first(dq, q, &id, &due));
        ASSERT_LE(last, due);
        last = due;
        ASSERT(tbd_dq_remove(dq, id));
    }
    tbd_dq_free(dq);
}

int main(void)
{
    RUN_TEST(test_bad_input_and_queue_reuse);
    RUN_TEST(test_random_against_model);
    RUN_TEST(test_bytes_per_job);
    return tw_test_done();
}
