/* SPDX-License-Identifier: MIT */
/*
 * wheel.c - the single-threaded timing wheel behind twheel/wheel.h.
 *
 * Algorithm
 * ---------
 * The wheel has L levels of S = 2^b slots. Level k has a granularity of
 * 2^(k*b) ticks. A timer that expires at E while the wheel's time is `now`
 * goes to the level of the highest bit in which E and now differ
 * (E ^ now), in the slot named by E's digit at that level:
 *
 *     k = msb(E ^ now) / b,   slot = (E >> k*b) & (S - 1)
 *
 * Because every bit above level k is equal in E and now, and E > now, the
 * slot's digit is larger than now's digit at that level: every occupied
 * slot lies ahead of the clock, so nothing needs "remaining rounds", and
 * the first tick at which a slot must be looked at is known exactly: the
 * start of its granule. At that tick its timers are either due (E == tick)
 * or re-placed at a lower level ("cascade"), relative to the new time.
 *
 * With the default L = ceil(64 / b) the levels cover every uint64_t, so
 * deadlines up to UINT64_MAX are exact. With fewer levels (levels = 1 is
 * Netty's HashedWheelTimer) the top level keeps timers of later rounds in
 * the same slot. Each top-level slot then remembers a lower bound of the
 * expiries it holds (slotmin), so visits of a slot that has nothing due in
 * the current round are skipped instead of walked.
 *
 * Finding work: every level has an occupancy bitmap (a small tree of 64-bit
 * words when S > 64), and a 64-bit word records which levels are occupied.
 * The earliest event is always in the lowest occupied level (a lower level's
 * event keeps all higher digits of now, a higher level's needs one of them
 * to change), at its first occupied slot after now's digit. So an advance
 * visits only non-empty slots, whatever number of ticks it crosses.
 *
 * Timers due at or before `now` when they are added go to a "due" list that
 * the next advance runs first (sorted by expiry if they came out of order),
 * which keeps both rules: nothing runs inside add, and a callback cannot
 * make the current advance run forever.
 *
 * Memory-level parallelism: each slot holds TW_WHEEL_CHAINS independent
 * lists; a new timer joins the one that a hash of its address block (16
 * KiB, TW_WHEEL_CHAIN_BLOCK) names, so timers close in memory share a list
 * and the blocks spread over all of them. Cascading or firing a slot walks
 * all chains in turn, so that several cache misses are in flight at once
 * instead of one pointer chase. (Dealt round-robin by the count of adds,
 * a timer's list neighbour was about 100 timers away when a program arms
 * and cancels its timers in memory order, at irregular distances that the
 * hardware prefetcher does not follow; by address block, it is about 13
 * away for nine timers in ten.)
 *
 * Small populations: a new wheel's slots hold one list each (an eighth of
 * the table: 16 KiB for the default shape). The first time the pending
 * count reaches a quarter of the wide table's list heads (4,096 for the
 * default), tw_wheel_add() allocates the wide table and moves each slot's
 * list into its first chain. That is the only allocation after
 * tw_wheel_create(); if it fails, nothing changes (the add succeeds, the
 * slots keep one list) and it is tried again at twice the count. The hot
 * paths are compiled once per table width (the width is a constant in
 * each), so a wide wheel runs the same code as a table that was always
 * wide; a narrow one's adds take a short path of their own (add_narrow).
 * Wide tables of at most TW_WIDE_AT_CREATE bytes are allocated at once.
 *
 * Levels for the default S = 256 (b = 8), L = 8:
 *
 *     level  granularity (ticks)  one level spans      bits
 *       0    1                    256                  0..7
 *       1    256                  65,536               8..15
 *       2    65,536               16,777,216           16..23
 *       3    2^24                 2^32                 24..31
 *      ...
 *       7    2^56                 2^64                 56..63
 *
 * Why 256 slots and 8 chains: the cost of expiry is dominated by the cache
 * lines of timers touched, once when a timer is placed, once per cascade
 * and once when it runs. More chains let more of those misses overlap;
 * more slots per level mean fewer cascades for the same deadlines
 * but multiply the table (8 levels x 256 slots x 8 chains x 8 bytes =
 * 128 KiB once wide). The measurements behind this choice are in
 * bench/history/BENCHMARKS-notebook.md, "Core wheel: layout and the add
 * path" ("Slots per level and lists per slot").
 *
 * A level-0 slot that is not a rounds level holds only timers due at its
 * tick, so its visit hands its chains over to the fire loop as they are:
 * the only timer touched before its callback is each chain's first. A
 * cascade puts a timer in its target slot's first list while that list is
 * empty, so a slot that one cascade filled with one timer is handed over
 * by looking at its first list and one OR of the others. The table of list
 * heads is 64-byte aligned: a wide slot's 8 heads are one cache line.
 *
 * The hint (no visit is due before it) is exact after an advance: adds
 * only lower it to their own slot's tick, and a cancel that empties a
 * list clears the flag that says so. An advance in 1-tick steps then
 * starts from the hint instead of searching the bitmaps again.
 *
 * Windows (tw_wheel_add_window): the tick chosen in [earliest, latest] is
 * the one with the most trailing zero bits. It is unique in the window, so
 * windows that contain the same coarse boundary share it, and a timer whose
 * low digits are zero runs straight from the visit of the level it was
 * placed in, without cascading.
 */
#include "twheel/wheel.h"

#include "common.h" /* the allocator */

#include <assert.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#ifndef TW_WHEEL_CHAINS
#define TW_WHEEL_CHAINS 8
#endif
#if TW_WHEEL_CHAINS < 1 || TW_WHEEL_CHAINS > 64 ||                             \
    (TW_WHEEL_CHAINS & (TW_WHEEL_CHAINS - 1)) != 0
#error "TW_WHEEL_CHAINS must be a power of two between 1 and 64"
#endif

#ifndef TW_WHEEL_DEFAULT_SLOTS
#define TW_WHEEL_DEFAULT_SLOTS 256
#endif
#if TW_WHEEL_DEFAULT_SLOTS < 1 || TW_WHEEL_DEFAULT_SLOTS > (1 << 30) ||        \
    (TW_WHEEL_DEFAULT_SLOTS & (TW_WHEEL_DEFAULT_SLOTS - 1)) != 0
#error "TW_WHEEL_DEFAULT_SLOTS must be a power of two between 1 and 2^30"
#endif

#ifndef TW_WHEEL_CHAIN_BLOCK
#define TW_WHEEL_CHAIN_BLOCK 14
#endif
#if TW_WHEEL_CHAIN_BLOCK < 0 || TW_WHEEL_CHAIN_BLOCK > 31
#error "TW_WHEEL_CHAIN_BLOCK must be between 0 and 31"
#endif

/* A visit of level 1 moves its timers into level-0 slots, where they run
 * within 256 ticks, while the lines the visit touched are still cached:
 * spreading them over a slot's lists buys no overlap of misses there, and
 * a slot whose timers are in one list is handed over and fired by the
 * one-list paths (hand_over(), fire_chains() with one chain), about 23
 * instructions per expired timer fewer at 1e6 timers (217.4 to 194.6:
 * bench/history/BENCHMARKS-notebook.md, "Core wheel: one-tick expiry in
 * 59 ns at 1e6", "What changed"). So
 * runs of 2^TW_WHEEL_FIRE_RUN_SHIFT moved timers (4,096: 256 KiB of lines,
 * within a second-level cache) share a list, and a visit that moves more
 * still deals its runs over the lists, for the misses of a large slot. */
#ifndef TW_WHEEL_FIRE_RUN_SHIFT
#define TW_WHEEL_FIRE_RUN_SHIFT 12
#endif

#define TW_MAX_SLOTS (UINT32_C(1) << 30)
#define TW_BM_MAX_LAYERS 6 /* 64^5 = 2^30 bits need 5 layers */
#define K TW_WHEEL_CHAINS
#define K_SHIFT ((unsigned)__builtin_ctz(K)) /* log2(K) */
#define TW_WIDE_AT_CREATE 4096 /* bytes: smaller wide tables come at once */

/* The invariant checkers used by the tests (also in src/wheel_internal.h). */
int tw__wheel_check(const tw_wheel *w);
int tw__wheel_check_full(const tw_wheel *w);
/* For tests: slots marked occupied whose lists are all empty (left so by
 * tw_wheel_cancel_inline() until a visit); also in src/wheel_internal.h. */
size_t tw__wheel_stale_slots(const tw_wheel *w);
/* For tests: widen a narrow table when the count reaches @n (see widen();
 * 0 changes nothing); returns the lists per slot. */
unsigned tw__wheel_widen_at(tw_wheel *w, size_t n);
/* One callback for every timer, and the adds for such a wheel (also in
 * src/wheel_internal.h). */
void tw__wheel_set_fire(tw_wheel *w, tw_timer_fn fire, void *arg);
int tw__wheel_add_any(tw_wheel *w, tw_timer *t, uint64_t expires);
int tw__wheel_add_window_any(tw_wheel *w, tw_timer *t, uint64_t earliest,
                             uint64_t latest);

/* Per-level addresses, precomputed so that placing a timer is a few
 * instructions. */
struct level {
    tw_timer **heads; /* [slot][chain] */
    uint64_t *bm;     /* occupancy tree */
    unsigned shift;   /* k * b: log2 of the level's granularity */
};

struct tw_wheel {
    /* First, so that tw_wheel_cancel_inline() finds it in wheel.h: its
     * tw__removes counts the timers cancelled, moved or run, ever; pending
     * timers (due list included) = adds - tw__removes. */
    struct tw__wheel_head head;
    /* The addresses of the table of list heads and just past it, for
     * in_heads(); here, so that the hot fields below share their cache
     * lines as they did when these two were part of the head. */
    uintptr_t heads_lo, heads_end;
    /* tw__wheel_set_fire(): one callback for every timer, whose tw__fn
     * this wheel then never reads (NULL: each timer's own). */
    tw_timer_fn fire;
    void *fire_arg;
    uint64_t now;
    uint64_t hint;      /* no slot needs a visit before this tick */
    uint32_t hint_ok;   /* hint is next_event()'s tick (advance_loop) */
    uint32_t exact_ok;  /* !rounds: an advance may leave hint_ok set */
    uint64_t adds;      /* timers added, ever; its low bits deal chains */
    uint64_t level_map; /* bit k: level k has an occupied slot */
    tw_timer **heads;   /* [level][slot][chain], 64-byte aligned */
    void *heads_mem;    /* its allocation (see heads_alloc) */
    size_t grow_at;     /* widen the table when count reaches this */
    uint32_t cshift;    /* log2 of the lists per slot: 0 or log2(K) */
    uint32_t fast_k;    /* tw_wheel_add's fast path takes levels below */
    uint64_t *slotmin;  /* [slot]: lower bound of expiries, rounds level */
    tw_timer *due;      /* timers added with expires <= now */
    uint64_t due_min;   /* lower bound of the due list's expiries */
    uint64_t mask;      /* S - 1 */
    uint32_t bits;      /* b */
    uint32_t levels;    /* L */
    uint32_t rounds;    /* 1 if the top level keeps later rounds */
    uint32_t rounds_k;  /* that level's index, or 64 when there is none */
    uint32_t bm_layers; /* layers of a level's bitmap tree */
    uint32_t bm_off[TW_BM_MAX_LAYERS]; /* word offset of each layer */
    uint32_t bm_len[TW_BM_MAX_LAYERS]; /* words in each layer */
    uint8_t level_of_msb[64];          /* msb(E ^ now) -> level */
    /* msb(E ^ now) -> that level when it is below fast_k, else NULL: the
     * one load that tw_wheel_add's inline path needs to find a level. */
    const struct level *fast_lv[64];
    struct level lv[64];
    unsigned char due_sorted; /* due list ascending from head */
};

/* ------------------------------------------------------------------------ */
/* Small helpers. */

static inline unsigned ctz64(uint64_t x)
{
    return (unsigned)__builtin_ctzll(x); /* callers guarantee x != 0 */
}

static inline unsigned msb64(uint64_t x)
{
    return 63u - (unsigned)__builtin_clzll(x); /* callers guarantee x != 0 */
}

/* x with its lowest @shift bits cleared; 0 when @shift >= 64. */
static inline uint64_t floor_pow2(uint64_t x, unsigned shift)
{
    return shift >= 64 ? 0 : (x >> shift) << shift;
}

static inline uint64_t digit_of(const tw_wheel *w, uint64_t x, unsigned k)
{
    return (x >> (k * w->bits)) & w->mask;
}

/* The start of slot @slot's granule at level @k in the revolution of that
 * level that contains now. */
static inline uint64_t slot_tick(const tw_wheel *w, unsigned k, uint64_t slot)
{
    unsigned gshift = k * w->bits;
    return floor_pow2(w->now, gshift + w->bits) | (slot << gshift);
}

/* Pending timers, the due list included. */
static inline size_t pending(const tw_wheel *w)
{
    return (size_t)(w->adds - w->head.tw__removes); /* removes <= adds */
}

static inline int is_rounds_level(const tw_wheel *w, unsigned k)
{
    return k == w->rounds_k;
}

/* @C is the table's lists per slot (1 or K), a constant where it is hot. */
static inline tw_timer **slot_heads(const tw_wheel *w, unsigned k,
                                    uint64_t slot, unsigned C)
{
    return w->lv[k].heads + (size_t)slot * C;
}

static inline unsigned chains_of(const tw_wheel *w)
{
    return 1u << w->cshift;
}

static inline uint64_t *level_bitmap(const tw_wheel *w, unsigned k)
{
    return w->lv[k].bm;
}

/* The list of a wide slot that timer @t joins when it is added: a hash of
 * the address block (2^TW_WHEEL_CHAIN_BLOCK bytes) that holds @t. A
 * cascade deals its own (see visit_slot()). Timers
 * that lie close together in memory share a list, so a list's neighbours
 * are near each other when the timers were armed in memory order (a
 * cancel in that order then finds its neighbour a few timers ahead, where
 * the prefetcher has been), and the blocks spread over the lists (the
 * hash, not the block number's low bits, so that objects at any
 * power-of-two stride still do), which keeps the walks of a slot's lists
 * overlapping. */
static inline size_t chain_of(const tw_timer *t)
{
#if K == 1
    (void)t;
    return 0;
#else
    uint32_t block = (uint32_t)((uintptr_t)t >> TW_WHEEL_CHAIN_BLOCK);
    /* The low 32 bits of a product that cannot wrap, their top bits. */
    uint64_t x = (uint64_t)block * UINT64_C(0x9E3779B1);
    return (uint32_t)x >> (32 - K_SHIFT);
#endif
}

/* ------------------------------------------------------------------------ */
/* Occupancy bitmaps: a tree of words, layer 0 = one bit per slot, each
 * higher layer one bit per non-zero word of the layer below. */

/* Layer-0 word @i of level @k's bitmap became non-zero: set the bits
 * above it and the level's bit. Out of line: most marks find the word
 * already non-zero, and the common paths keep no stack frame. */
__attribute__((noinline)) static void word_filled(tw_wheel *w, unsigned k,
                                                  uint64_t i)
{
    uint64_t *bm = w->lv[k].bm;
    for (unsigned l = 1; l < w->bm_layers; l++) {
        uint64_t *word = &bm[w->bm_off[l] + (i >> 6)];
        uint64_t was = *word;
        *word = was | (UINT64_C(1) << (i & 63));
        if (was != 0)
            break; /* the layers above already know this word is set */
        i >>= 6;
    }
    w->level_map |= UINT64_C(1) << k;
}

/* Clear bit @i of layer @from and, while words become 0, the bits above. */
static void bm_clear_from(const tw_wheel *w, uint64_t *bm, unsigned from,
                          uint64_t i)
{
    for (unsigned l = from; l < w->bm_layers; l++) {
        uint64_t *word = &bm[w->bm_off[l] + (i >> 6)];
        *word &= ~(UINT64_C(1) << (i & 63));
        if (*word != 0)
            return;
        i >>= 6;
    }
}

static inline int bm_test(const tw_wheel *w, const uint64_t *bm, uint64_t i)
{
    (void)w;
    return (int)((bm[i >> 6] >> (i & 63)) & 1); /* layer 0 is at offset 0 */
}

static inline int bm_empty(const tw_wheel *w, const uint64_t *bm)
{
    return bm[w->bm_off[w->bm_layers - 1]] == 0;
}

/* The first set bit at or after @i, or -1. */
static int64_t bm_next(const tw_wheel *w, const uint64_t *bm, uint64_t i)
{
    unsigned l = 0;
    for (;;) {
        uint64_t wi = i >> 6;
        if (wi >= w->bm_len[l])
            return -1;
        uint64_t word = bm[w->bm_off[l] + wi] & (~UINT64_C(0) << (i & 63));
        if (word != 0) {
            i = (wi << 6) | ctz64(word);
            break;
        }
        if (l + 1 == w->bm_layers)
            return -1;
        i = wi + 1;
        l++;
    }
    while (l > 0) {
        l--;
        /* The bit found says this word is non-zero. */
        i = (i << 6) | ctz64(bm[w->bm_off[l] + i]);
    }
    return (int64_t)i;
}

/* ------------------------------------------------------------------------ */
/* Lists. A timer's pprev points at whatever points at it: a slot head, the
 * due list head, a local list head of advance_loop() or run_due() (the
 * chains being fired), or the previous timer's next field. */

static inline void list_push(tw_timer **head, tw_timer *t)
{
    tw_timer *first = *head;
    t->tw__next = first;
    if (first != NULL)
        first->tw__pprev = &t->tw__next;
    *head = t;
    t->tw__pprev = head;
}

static inline int in_heads(const tw_wheel *w, tw_timer **p)
{
    uintptr_t a = (uintptr_t)p;
    return a >= w->heads_lo && a < w->heads_end;
}

static int slot_empty(tw_timer *const *h, unsigned C)
{
    for (unsigned c = 0; c < C; c++)
        if (h[c] != NULL)
            return 0;
    return 1;
}

/* Mark slot (k, slot) occupied in the bitmaps. */
static inline void slot_filled(tw_wheel *w, unsigned k, uint64_t slot)
{
    uint64_t *word = &level_bitmap(w, k)[slot >> 6]; /* layer 0 */
    uint64_t was = *word;
    *word = was | (UINT64_C(1) << (slot & 63));
    if (was == 0)
        word_filled(w, k, slot >> 6);
}

/* The layers above a bitmap word that became 0, and the level map. */
__attribute__((noinline)) static void word_emptied(tw_wheel *w, unsigned k,
                                                   uint64_t slot)
{
    uint64_t *bm = level_bitmap(w, k);
    if (w->bm_layers > 1)
        bm_clear_from(w, bm, 1, slot >> 6);
    if (bm_empty(w, bm))
        w->level_map &= ~(UINT64_C(1) << k);
}

/* Mark slot (k, slot) empty in the bitmaps. */
static inline void slot_emptied(tw_wheel *w, unsigned k, uint64_t slot)
{
    uint64_t *word = &level_bitmap(w, k)[slot >> 6]; /* layer 0 */
    *word &= ~(UINT64_C(1) << (slot & 63));
    if (*word == 0)
        word_emptied(w, k, slot);
    if (is_rounds_level(w, k))
        w->slotmin[slot] = UINT64_MAX;
}

/* The chain whose head is *@head became empty: maybe the whole slot is. */
__attribute__((noinline)) static void chain_emptied(tw_wheel *w,
                                                    tw_timer **head)
{
    size_t idx = (size_t)(head - w->heads) >> w->cshift;
    w->hint_ok = 0;
    tw_timer **h = w->heads + (idx << w->cshift);
    if (slot_empty(h, chains_of(w)))
        slot_emptied(w, (unsigned)(idx >> w->bits), idx & w->mask);
}

/* Unlink pending @t. Its tw__next is left as it was: a timer that is not
 * pending has no list, and every link writes tw__next first. */
static inline void timer_unlink(tw_wheel *w, tw_timer *t)
{
    tw_timer **pprev = t->tw__pprev;
    tw_timer *next = t->tw__next;
    *pprev = next;
    t->tw__pprev = NULL;
    w->head.tw__removes++;
    if (next != NULL)
        next->tw__pprev = pprev;
    else if (in_heads(w, pprev))
        chain_emptied(w, pprev);
}

/* Forward: the first tick after now at which rounds slot @slot has work. */
static uint64_t rounds_slot_tick(const tw_wheel *w, unsigned k, uint64_t slot);

__attribute__((noinline)) static void timer_unlink_cold(tw_wheel *w,
                                                        tw_timer *t)
{
    timer_unlink(w, t);
}

/* Put @t (not linked, expires > now) into its level and slot. Returns the
 * tick at which that slot will next be visited. */
__attribute__((always_inline)) static inline uint64_t
place(tw_wheel *w, tw_timer *t, unsigned C)
{
    uint64_t e = t->tw__expires;
    unsigned k = w->level_of_msb[msb64(e ^ w->now)];
    unsigned gshift = w->lv[k].shift; /* < 64: (L - 1) * b < 64 */
    uint64_t slot = (e >> gshift) & w->mask;
    tw_timer **h = slot_heads(w, k, slot, C);
    slot_filled(w, k, slot);
    if (C == 1) {
        list_push(h, t);
    } else {
        list_push(&h[chain_of(t)], t);
    }
    if (is_rounds_level(w, k)) {
        if (e < w->slotmin[slot])
            w->slotmin[slot] = e;
        return rounds_slot_tick(w, k, slot);
    }
    /* Every digit above k is now's, digit k is the slot: the visit is at
     * the start of e's granule. */
    return (e >> gshift) << gshift;
}

__attribute__((noinline)) static void due_push(tw_wheel *w, tw_timer *t)
{
    uint64_t e = t->tw__expires;
    if (w->due == NULL) {
        w->due_sorted = 1;
        w->due_min = e;
    } else {
        if (e > w->due->tw__expires)
            w->due_sorted = 0;
        if (e < w->due_min)
            w->due_min = e;
    }
    list_push(&w->due, t);
    /* The due list runs in the next advance: tw_wheel_advance() then
     * finds now >= hint without looking at the list. */
    w->hint = 0;
    w->hint_ok = 0;
}

/* The shape of a wheel, worked out from its configuration before any
 * memory is taken. */
struct wheel_size {
    uint32_t bits, levels, rounds;
    uint32_t bm_layers;                /* layers of one level's bitmap */
    uint32_t bm_off[TW_BM_MAX_LAYERS]; /* word offset of each layer */
    uint32_t bm_len[TW_BM_MAX_LAYERS]; /* words in each layer */
    size_t bm_words;                   /* words of one level's bitmap */
    int wide;                          /* K lists a slot from the start */
    size_t heads_bytes;                /* the table allocated by create */
    size_t bm_bytes, min_bytes, total; /* total: the wheel's own block */
};

/* Sizing: levels and slot bits from @cfg, then the bitmap tree and the
 * bytes of each array. Returns 0 or TW_EINVAL. */
static int wheel_sizing(const tw_wheel_config *cfg, struct wheel_size *z)
{
    uint32_t slots = TW_WHEEL_DEFAULT_SLOTS, levels = 0, bits = 0;
    if (cfg != NULL) {
        if (cfg->slots > TW_MAX_SLOTS || cfg->levels > 64)
            return TW_EINVAL;
        if (cfg->slots != 0)
            slots = cfg->slots;
        levels = cfg->levels;
    }
    while ((UINT32_C(1) << bits) < slots)
        bits++;
    uint32_t need = bits == 0 ? 1 : (64 + bits - 1) / bits;
    if (levels == 0 || levels > need)
        levels = need;
    memset(z, 0, sizeof(*z));
    z->bits = bits;
    z->levels = levels;
    z->rounds = (uint64_t)levels * bits < 64;

    /* Layer 0 has a bit per slot, each layer above a bit per word below. */
    for (uint64_t nbits = UINT64_C(1) << bits;;) {
        uint64_t words = (nbits + 63) / 64;
        z->bm_off[z->bm_layers] = (uint32_t)z->bm_words;
        z->bm_len[z->bm_layers] = (uint32_t)words;
        z->bm_words += words;
        z->bm_layers++;
        if (words == 1)
            break;
        nbits = words;
    }
    /* Sizes are far from overflowing size_t: at most 64 * 2^30 * 64 heads. */
    z->wide = K == 1 || ((size_t)levels << bits) * K * sizeof(tw_timer *) <=
                            TW_WIDE_AT_CREATE;
    z->heads_bytes = (((size_t)levels << bits) << (z->wide ? K_SHIFT : 0)) *
                     sizeof(tw_timer *);
    z->bm_bytes = (size_t)levels * z->bm_words * sizeof(uint64_t);
    z->min_bytes = z->rounds ? ((size_t)1 << bits) * sizeof(uint64_t) : 0;
    z->total = sizeof(tw_wheel) + z->bm_bytes + z->min_bytes;
    return 0;
}

/* A zeroed slot-head table of @bytes, aligned to 64 bytes so that the 8
 * lists of a wide slot share one cache line; *@mem receives the block to
 * free. NULL when out of memory. */
static tw_timer **heads_alloc(size_t bytes, void **mem)
{
    char *p = tw__calloc(1, bytes + 63);
    *mem = p;
    if (p == NULL)
        return NULL;
    return (tw_timer **)(void *)(p + ((64 - (uintptr_t)p % 64) % 64));
}

/* Point every level at its part of the slot-head table @heads (allocated
 * as @mem), which has 2^@cshift lists per slot. */
static void set_heads(tw_wheel *w, tw_timer **heads, void *mem, unsigned cshift)
{
    w->heads = heads;
    w->heads_mem = mem;
    w->cshift = cshift;
    w->heads_lo = (uintptr_t)heads;
    w->heads_end =
        (uintptr_t)(heads + (((size_t)w->levels << w->bits) << cshift));
    for (unsigned k = 0; k < w->levels; k++)
        w->lv[k].heads = heads + (((size_t)k << w->bits) << cshift);
}

/* Fill fast_lv from level_of_msb and fast_k. */
static void set_fast_lv(tw_wheel *w)
{
    for (unsigned m = 0; m < 64; m++) {
        unsigned k = w->level_of_msb[m];
        w->fast_lv[m] = k < w->fast_k ? &w->lv[k] : NULL;
    }
}

/* Layout: carve the zeroed block @mem into the wheel and its arrays, in
 * that order, and set every field; @heads is the zeroed slot-head table. */
static tw_wheel *wheel_layout(char *mem, tw_timer **heads, void *heads_mem,
                              const struct wheel_size *z, uint64_t now)
{
    tw_wheel *w = (tw_wheel *)(void *)mem;
    uint32_t bits = z->bits, levels = z->levels;
    uint64_t *bitmap = (uint64_t *)(void *)(mem + sizeof(tw_wheel));
    w->slotmin = NULL;
    if (z->rounds) {
        w->slotmin = bitmap + z->bm_bytes / sizeof(uint64_t);
        for (size_t i = 0; i < ((size_t)1 << bits); i++)
            w->slotmin[i] = UINT64_MAX;
    }
    /* calloc's zero bits are NULL heads on every platform twheel targets;
     * not writing them keeps a large wheel's untouched pages unmapped.
     * adds, removes, level_map and due start at the same zeros. */
    w->now = now;
    w->hint = UINT64_MAX;
    w->due_min = UINT64_MAX;
    w->due_sorted = 1;
    w->mask = ((uint64_t)1 << bits) - 1;
    w->bits = bits;
    w->levels = levels;
    w->rounds = z->rounds;
    w->exact_ok = !z->rounds;
    w->rounds_k = z->rounds ? levels - 1 : 64;
    w->bm_layers = z->bm_layers;
    memcpy(w->bm_off, z->bm_off, sizeof(z->bm_off));
    memcpy(w->bm_len, z->bm_len, sizeof(z->bm_len));
    /* A wide table of at most 4 KiB is cheap: such a wheel starts wide. */
    set_heads(w, heads, heads_mem, z->wide ? K_SHIFT : 0);
    /* Else widen when the wide table costs at most 32 bytes a timer. */
    w->grow_at = z->wide ? SIZE_MAX : (((size_t)levels << bits) * K) / 4;
    w->fast_k = z->wide ? w->rounds_k : 0;
    for (unsigned k = 0; k < levels; k++) {
        w->lv[k].bm = bitmap + (size_t)k * z->bm_words;
        w->lv[k].shift = k * bits;
    }
    for (unsigned m = 0; m < 64; m++) {
        unsigned k = bits == 0 ? 0 : m / bits;
        w->level_of_msb[m] = (uint8_t)(k >= levels ? levels - 1 : k);
    }
    set_fast_lv(w);
    return w;
}

int tw_wheel_create(tw_wheel **out, const tw_wheel_config *cfg, uint64_t now)
{
    struct wheel_size z;
    if (out == NULL)
        return TW_EINVAL;
    int rc = wheel_sizing(cfg, &z);
    if (rc != 0)
        return rc;
    char *mem = tw__calloc(1, z.total);
    if (mem == NULL)
        return TW_ENOMEM;
    void *heads_mem;
    tw_timer **heads = heads_alloc(z.heads_bytes, &heads_mem);
    if (heads == NULL) {
        tw__free(mem);
        return TW_ENOMEM;
    }
    *out = wheel_layout(mem, heads, heads_mem, &z, now);
    return 0;
}

void tw_wheel_destroy(tw_wheel *w)
{
    if (w == NULL)
        return;
    tw__free(w->heads_mem);
    tw__free(w); /* one allocation holds the wheel and its other arrays */
}

void tw__wheel_set_fire(tw_wheel *w, tw_timer_fn fire, void *arg)
{
    w->fire = fire;
    w->fire_arg = arg;
}

void tw_timer_init(tw_timer *t, tw_timer_fn fn, void *arg)
{
    t->tw__next = NULL;
    t->tw__pprev = NULL;
    t->tw__expires = 0;
    t->tw__fn = fn;
    t->tw__arg = arg;
}

bool tw_timer_pending(const tw_timer *t)
{
    return t->tw__pprev != NULL;
}

uint64_t tw_timer_expires(const tw_timer *t)
{
    return t->tw__expires;
}

uint64_t tw_wheel_now(const tw_wheel *w)
{
    return w->now;
}

size_t tw_wheel_count(const tw_wheel *w)
{
    return pending(w);
}

/* ------------------------------------------------------------------------ */
/* add / cancel */

/* tw_wheel_add() put the first timer in a list of slot @slot of level @lv:
 * mark the slot occupied unless another of its lists is in use. Out of
 * line: most adds join a list that is not empty, whose slot is marked. */
__attribute__((noinline)) static int
add_first(tw_wheel *w, const struct level *lv, uint64_t slot)
{
    const uint64_t *bm = lv->bm;
    if (!((bm[slot >> 6] >> (slot & 63)) & 1))
        slot_filled(w, (unsigned)(lv - w->lv), slot);
    return 0;
}

/*
 * Widen the slot-head table from one list a slot to K: each occupied slot's
 * list becomes its first chain. Nothing changes if the allocation fails;
 * the next try is at twice the count. Called from tw_wheel_add() only,
 * never inside a slot visit, so no caller holds a pointer into the table
 * but the first timer of each list.
 */
__attribute__((noinline)) static void widen(tw_wheel *w)
{
    size_t slots = (size_t)w->levels << w->bits;
    void *mem;
    tw_timer **wide = heads_alloc(slots * K * sizeof(*wide), &mem);
    if (wide == NULL) {
        size_t n = pending(w);
        w->grow_at = n > SIZE_MAX / 2 ? SIZE_MAX : n * 2;
        return;
    }
    for (unsigned k = 0; k < w->levels; k++) {
        const uint64_t *bm = level_bitmap(w, k);
        for (int64_t s = bm_next(w, bm, 0); s >= 0;
             s = bm_next(w, bm, (uint64_t)s + 1)) {
            tw_timer **to =
                wide + ((((size_t)k << w->bits) + (size_t)s) << K_SHIFT);
            *to = *slot_heads(w, k, (uint64_t)s, 1);
            if (*to != NULL) /* else emptied by tw_wheel_cancel_inline() */
                (*to)->tw__pprev = to;
        }
    }
    tw__free(w->heads_mem);
    set_heads(w, wide, mem, K_SHIFT);
    w->grow_at = SIZE_MAX;
    w->fast_k = w->rounds_k;
    set_fast_lv(w);
}

unsigned tw__wheel_widen_at(tw_wheel *w, size_t n)
{
    if (w->cshift == 0 && K > 1 && n != 0)
        w->grow_at = n;
    return chains_of(w);
}

/* tw_wheel_add() for a move, a timer already due, the rounds level or a
 * narrow table. */
__attribute__((noinline)) static int add_slow(tw_wheel *w, tw_timer *t,
                                              uint64_t expires)
{
    if (t->tw__pprev != NULL)
        timer_unlink_cold(w, t); /* a move */
    t->tw__expires = expires;
    if (expires <= w->now) {
        due_push(w, t);
    } else {
        uint64_t visit = w->cshift != 0 ? place(w, t, K) : place(w, t, 1);
        if (visit < w->hint)
            w->hint = visit;
    }
    w->adds++;
    if (pending(w) >= w->grow_at)
        widen(w);
    return 0;
}

/* tw_wheel_add()'s common case for a narrow table: not a move, not due, not
 * the rounds level. */
__attribute__((noinline)) static int add_narrow(tw_wheel *w, tw_timer *t,
                                                uint64_t expires, unsigned k)
{
    unsigned gshift = w->lv[k].shift;
    uint64_t slot = (expires >> gshift) & w->mask;
    t->tw__expires = expires;
    list_push(slot_heads(w, k, slot, 1), t);
    uint64_t visit = (expires >> gshift) << gshift;
    if (visit < w->hint)
        w->hint = visit;
    slot_filled(w, k, slot);
    w->adds++;
    if (pending(w) >= w->grow_at)
        widen(w);
    return 0;
}

/* tw_wheel_add() of valid arguments in every case that add_common() does
 * not take: a move, a due timer, the rounds level or a narrow table, and
 * the first timer of a list (add_common() found the list empty). */
__attribute__((noinline)) static int add_rest(tw_wheel *w, tw_timer *t,
                                              uint64_t expires)
{
    uint64_t now = w->now;
    if (t->tw__pprev != NULL || expires <= now)
        return add_slow(w, t, expires);
    unsigned k = w->level_of_msb[msb64(expires ^ now)];
    if (k >= w->fast_k) /* the rounds level, or a narrow table */
        return k != w->rounds_k ? add_narrow(w, t, expires, k)
                                : add_slow(w, t, expires);
    /* The first timer of its list: add_common() read this head (the same
     * level, slot and list) and found it empty. */
    const struct level *lv = &w->lv[k];
    unsigned gshift = lv->shift;
    uint64_t g = expires >> gshift;
    uint64_t slot = g & w->mask;
    t->tw__expires = expires;
    /* Every digit above k is now's: the visit is at the start of the
     * granule of @expires. */
    uint64_t visit = g << gshift;
    if (visit < w->hint)
        w->hint = visit;
    w->adds++;
    tw_timer **head = lv->heads + ((size_t)slot << K_SHIFT) + chain_of(t);
    *head = t;
    t->tw__next = NULL;
    t->tw__pprev = head;
    return add_first(w, lv, slot);
}

/*
 * The common add, small enough for a compiler to inline where it sees the
 * body (link-time optimisation): a timer that is not pending, not due, for
 * a level below the rounds level of a wide table, that joins a list which
 * is not empty. Anything else goes to add_rest() before a byte is written.
 *
 * Such an add leaves the hint alone: a non-empty list of a level that is
 * not a rounds level lies in an occupied slot whose timers share its
 * visit tick (the start of their granule), and the hint is never after an
 * occupied slot's visit (tw__wheel_check holds it to next_event()), so the
 * new timer's visit cannot be before the hint.
 */
static inline __attribute__((always_inline)) int
add_common(tw_wheel *w, tw_timer *t, uint64_t expires, bool known_idle)
{
    uint64_t now = w->now;
    /* @known_idle: the caller vouches that @t is not pending, so this
     * path reads nothing of @t (see tw_wheel_add_unchecked). */
    if (__builtin_expect(
            (!known_idle && t->tw__pprev != NULL) || expires <= now, 0))
        goto rest;
    const struct level *lv = w->fast_lv[msb64(expires ^ now)];
    if (__builtin_expect(lv == NULL, 0)) /* rounds level, narrow table */
        goto rest;
    uint64_t slot = (expires >> lv->shift) & w->mask;
    tw_timer **head = lv->heads + ((size_t)slot << K_SHIFT) + chain_of(t);
    tw_timer *first = *head;
    if (__builtin_expect(first == NULL, 0)) /* an unmarked slot, a visit */
        goto rest;
    w->adds++;
    t->tw__expires = expires;
    t->tw__pprev = head;
    *head = t;
    t->tw__next = first;
    first->tw__pprev = &t->tw__next;
    return 0;
rest:
    return add_rest(w, t, expires);
}

/* "inline": with link-time optimisation, gcc inlines a function declared
 * inline up to a larger size than one that is not (max-inline-insns-single
 * instead of -auto); the common add is above the second limit. The header
 * declares tw_wheel_add without it, so this is an external definition
 * (C11 6.7.4p7) that may call static functions; clang's pedantic warning
 * about static functions in inline ones is meant for inline definitions. */
#if defined(__clang__)
#pragma clang diagnostic push
#pragma clang diagnostic ignored "-Wstatic-in-inline"
#endif
inline int tw_wheel_add(tw_wheel *w, tw_timer *t, uint64_t expires)
{
    if (w == NULL || t == NULL || t->tw__fn == NULL)
        return TW_EINVAL;
    return add_common(w, t, expires, false);
}

/* tw_wheel_add() without its reads of @t: the first access to a timer that
 * is not in the cache is then a write, which does not hold up the
 * instructions after it the way a read does. The preconditions are checked
 * only when NDEBUG is not defined. */
inline int tw_wheel_add_unchecked(tw_wheel *w, tw_timer *t, uint64_t expires)
{
    assert(w != NULL && t != NULL && t->tw__fn != NULL && t->tw__pprev == NULL);
    return add_common(w, t, expires, true);
}
#if defined(__clang__)
#pragma clang diagnostic pop
#endif

/* For a wheel with one callback for all timers (tw__wheel_set_fire),
 * whose timers' tw__fn may hold anything: never read here. */
int tw__wheel_add_any(tw_wheel *w, tw_timer *t, uint64_t expires)
{
    return add_common(w, t, expires, false);
}

/* The tick in [@a, @b] (a < b) with the most trailing zero bits. */
static uint64_t coarsest_in(uint64_t a, uint64_t b)
{
    /* Above bit d the two agree; b has bit d set and a has it clear. */
    unsigned d = msb64(a ^ b);
    uint64_t below = d == 63 ? ~UINT64_C(0) : (UINT64_C(2) << d) - 1;
    if ((a & below) == 0)
        return a; /* a is the common prefix itself: a multiple of 2^(d+1) */
    return (b >> d) << d; /* the prefix with bit d set: in (a, b] */
}

int tw_wheel_add_window(tw_wheel *w, tw_timer *t, uint64_t earliest,
                        uint64_t latest)
{
    if (w == NULL || t == NULL || t->tw__fn == NULL || latest < earliest)
        return TW_EINVAL;
    return tw__wheel_add_window_any(w, t, earliest, latest);
}

int tw__wheel_add_window_any(tw_wheel *w, tw_timer *t, uint64_t earliest,
                             uint64_t latest)
{
    if (earliest <= w->now || earliest == latest)
        return add_common(w, t, earliest, false);
    return add_common(w, t, coarsest_in(earliest, latest), false);
}

bool tw_wheel_cancel(tw_wheel *w, tw_timer *t)
{
    /* @t before @w: the read of @t between the two tests keeps them apart
     * (combined, they cost two flags and an OR). */
    if (t == NULL || t->tw__pprev == NULL || w == NULL)
        return false;
    /* Both neighbours are written: ask for their lines now rather than
     * when the stores reach the cache. */
    __builtin_prefetch(t->tw__pprev, 1);
    if (t->tw__next != NULL)
        __builtin_prefetch(t->tw__next, 1);
    timer_unlink(w, t);
    return true;
}

/* ------------------------------------------------------------------------ */
/* Finding the next event. */

/* The first tick after now at which rounds-level slot @slot has work. */
static uint64_t rounds_slot_tick(const tw_wheel *w, unsigned k, uint64_t slot)
{
    unsigned gshift = k * w->bits;      /* granule: 2^gshift ticks */
    unsigned rshift = gshift + w->bits; /* revolution, < 64 here */
    uint64_t t = slot_tick(w, k, slot);
    if (t <= w->now) {
        /* Next revolution; an occupied slot guarantees it exists (some
         * expiry >= it), so this cannot wrap. */
        t += UINT64_C(1) << rshift;
    }
    uint64_t gmin = floor_pow2(w->slotmin[slot], gshift);
    return gmin > t ? gmin : t;
}

/*
 * The next tick after now at which some slot needs a visit. Returns 0 and
 * sets *tick, or -1 when the wheel (due list aside) is empty.
 */
static int next_event_slow(const tw_wheel *w, uint64_t *tick)
{
    if (w->level_map == 0)
        return -1;
    unsigned k = ctz64(w->level_map);
    const uint64_t *bm = level_bitmap(w, k);
    if (!is_rounds_level(w, k)) {
        /* Every occupied slot lies after now's digit (see the top). */
        int64_t slot = bm_next(w, bm, digit_of(w, w->now, k) + 1);
        *tick = slot_tick(w, k, (uint64_t)slot);
        return 0;
    }
    /* Rounds level: walk occupied slots from now's digit onwards; the first
     * one with something due in this revolution is the earliest event. */
    uint64_t d = digit_of(w, w->now, k);
    int64_t slot = bm_next(w, bm, d + 1);
    while (slot >= 0) {
        uint64_t t = rounds_slot_tick(w, k, (uint64_t)slot);
        if (t == slot_tick(w, k, (uint64_t)slot)) {
            *tick = t;
            return 0;
        }
        slot = bm_next(w, bm, (uint64_t)slot + 1);
    }
    /* Nothing in the rest of this revolution: the minimum over all. */
    uint64_t best = UINT64_MAX;
    for (slot = bm_next(w, bm, 0); slot >= 0;
         slot = bm_next(w, bm, (uint64_t)slot + 1)) {
        uint64_t t = rounds_slot_tick(w, k, (uint64_t)slot);
        if (t < best)
            best = t;
    }
    *tick = best;
    return 0;
}

/* The common case first: the next occupied level-0 slot lies in the same
 * bitmap word as now's digit. Level 0 holds the earliest events whenever it
 * is occupied (see the top), so this is exact. */
static inline int next_event(const tw_wheel *w, uint64_t *tick)
{
    if ((w->level_map & 1) && !is_rounds_level(w, 0)) {
        uint64_t d = (w->now & w->mask) + 1;
        if (d <= w->mask) {
            const uint64_t *bm = w->lv[0].bm;
            uint64_t word = bm[d >> 6] & (~UINT64_C(0) << (d & 63));
            if (word != 0) {
                *tick = (w->now & ~w->mask) | (d & ~UINT64_C(63)) | ctz64(word);
                return 0;
            }
            /* A later word (65 to 4,096 slots): the layer above says
             * which. */
            if (w->bm_layers == 2) {
                uint64_t sum = bm[w->bm_off[1]] & (~UINT64_C(1) << (d >> 6));
                if (sum != 0) {
                    uint64_t wi = ctz64(sum);
                    *tick = (w->now & ~w->mask) | (wi << 6) | ctz64(bm[wi]);
                    return 0;
                }
            }
        }
    }
    return next_event_slow(w, tick);
}

uint64_t tw_wheel_next_expiry(const tw_wheel *w)
{
    uint64_t t;
    if (w->due != NULL)
        return w->due_min;
    /* Slots emptied by tw_wheel_cancel_inline() stay marked until a visit:
     * with no timer pending, none of them is work. */
    if (next_event(w, &t) != 0 || pending(w) == 0)
        return UINT64_MAX;
    return t;
}

uint64_t tw_wheel_timeout(const tw_wheel *w, uint64_t now)
{
    uint64_t next = tw_wheel_next_expiry(w);
    if (next == UINT64_MAX && pending(w) == 0)
        return TW_WHEEL_NO_TIMEOUT;
    /* A timer may expire at UINT64_MAX itself: with now == 0 the wait
     * would read as the sentinel, so it is reported one tick short (a
     * wake-up early is always allowed). */
    if (next <= now)
        return 0;
    uint64_t dt = next - now;
    return dt == TW_WHEEL_NO_TIMEOUT ? dt - 1 : dt;
}

/* ------------------------------------------------------------------------ */
/* advance */

/* Stable merge sort of a singly linked run by expiry; pprev fixed later. */
static tw_timer *sort_run(tw_timer *head, size_t n)
{
    if (n < 2)
        return head;
    size_t half = n / 2;
    tw_timer *mid = head;
    for (size_t i = 1; i < half; i++)
        mid = mid->tw__next;
    tw_timer *right = mid->tw__next;
    mid->tw__next = NULL;
    tw_timer *a = sort_run(head, half);
    tw_timer *b = sort_run(right, n - half);
    tw_timer *out = NULL, **tail = &out;
    while (a != NULL && b != NULL) {
        if (b->tw__expires < a->tw__expires) {
            *tail = b;
            b = b->tw__next;
        } else {
            *tail = a;
            a = a->tw__next;
        }
        tail = &(*tail)->tw__next;
    }
    *tail = a != NULL ? a : b;
    return out;
}

/*
 * Run every timer in the local chains @fl. Callbacks may cancel or move
 * timers that are still in @fl: their pprev fields point into it. Chains are
 * taken in turn so that the next timer of each is fetched while the others
 * run.
 */
__attribute__((always_inline)) static inline size_t
fire_chains(tw_wheel *w, tw_timer **fl, unsigned n)
{
    size_t ran = 0;
    unsigned c = 0;
    while (n > 0) {
        tw_timer *t = fl[c];
        if (t == NULL) {
            /* Chain c is done (or a callback cancelled its rest): the last
             * chain takes its place, its first timer's pprev following. */
            if (c != --n) {
                fl[c] = fl[n];
                if (fl[c] != NULL)
                    fl[c]->tw__pprev = &fl[c];
            } else {
                c = 0;
            }
            continue;
        }
        tw_timer *next = t->tw__next;
        fl[c] = next;
        if (next != NULL)
            next->tw__pprev = &fl[c];
        t->tw__pprev = NULL; /* not pending; tw__next is left as it is */
        w->head.tw__removes++;
        if (w->fire == NULL)
            t->tw__fn(t, t->tw__arg);
        else /* one callback for the wheel (tw__wheel_set_fire) */
            w->fire(t, w->fire_arg);
        ran++;
        if (++c >= n)
            c = 0;
    }
    return ran;
}

/* Run the due list (timers added with expires <= now). */
static size_t run_due(tw_wheel *w)
{
    tw_timer *fl[1];
    fl[0] = w->due;
    w->due = NULL;
    w->due_min = UINT64_MAX;
    if (!w->due_sorted) {
        size_t n = 0;
        for (tw_timer *t = fl[0]; t != NULL; t = t->tw__next)
            n++;
        fl[0] = sort_run(fl[0], n);
        tw_timer **pp = &fl[0];
        for (tw_timer *t = fl[0]; t != NULL; t = t->tw__next) {
            t->tw__pprev = pp;
            pp = &t->tw__next;
        }
    } else {
        fl[0]->tw__pprev = &fl[0];
    }
    w->due_sorted = 1;
    return fire_chains(w, fl, 1);
}

/*
 * A level-0 slot (not a rounds level) holds only timers due now: its digit
 * and every digit above are now's. Its non-empty chains become the fire
 * chains @fl as they are, so only the first timer of each is touched here.
 * Returns how many chains @fl received.
 */
__attribute__((always_inline)) static inline unsigned
hand_over(tw_wheel *w, uint64_t slot, tw_timer **fl, unsigned C)
{
    tw_timer **h = slot_heads(w, 0, slot, C);
    unsigned n = 0;
    uintptr_t rest = 0;
    for (unsigned c = 1; c < C; c++)
        rest |= (uintptr_t)h[c];
    if (rest == 0) {
        /* A slot filled by one cascade timer has only its first list. */
        fl[0] = h[0];
        h[0] = NULL;
        slot_emptied(w, 0, slot);
        if (fl[0] == NULL)
            return 0; /* emptied by tw_wheel_cancel_inline() */
        fl[0]->tw__pprev = &fl[0];
        return 1;
    }
    /* Without a branch per chain: which chains are empty is random. */
    for (unsigned c = 0; c < C; c++) {
        tw_timer *t = h[c];
        fl[n] = t;
        n += t != NULL;
        h[c] = NULL;
    }
    for (unsigned i = 0; i < n; i++)
        fl[i]->tw__pprev = &fl[i];
    slot_emptied(w, 0, slot);
    return n;
}

/*
 * Move @t (expiring at @e, unlinked) from a slot being visited at tick @now
 * to its lower level: a visit's granule holds now, so the level of
 * e ^ now is below the visited one and never the rounds level, and the
 * caller's own next_event() finds the slot; @chain picks the list. @from
 * is the visited level when it is 1 or 2 (a constant), else 0: from level
 * 1 every timer goes to level 0 (e and now differ only in the low digit),
 * from level 2 to level 1 or 0, whose heads the caller read once (@heads0,
 * @heads1; a store through a timer's pprev could otherwise be a level's
 * heads field, read again each time).
 */
__attribute__((always_inline)) static inline void
cascade(tw_wheel *w, tw_timer *t, uint64_t e, uint64_t now, uint64_t mask,
        unsigned chain, unsigned C, unsigned from, tw_timer **heads0,
        tw_timer **heads1)
{
    unsigned k = 0;
    uint64_t slot = e & mask;
    tw_timer **h = heads0 + (size_t)slot * C;
    if (from == 2) {
        /* To level 1 unless e and now differ only in the low digit. */
        unsigned bits = w->bits;
        if ((e ^ now) >> bits) {
            k = 1;
            slot = (e >> bits) & mask;
            h = heads1 + (size_t)slot * C;
        }
    } else if (from != 1) {
        k = w->level_of_msb[msb64(e ^ now)];
        const struct level *lv = &w->lv[k];
        slot = (e >> lv->shift) & mask;
        h = lv->heads + (size_t)slot * C;
    }
    if (from == 1) {
        /* @t runs within a revolution of level 0, where its callback
         * and arg are read: when they lie in the timer's next cache
         * line, fetch it now, while the walk keeps other misses in
         * flight, not then, alone. */
        __builtin_prefetch((const char *)t + sizeof(*t) - 1);
    }
    /* The slot's first list while it is empty (hand_over() checks that one
     * alone first), else the next in turn; a slot whose first list is not
     * empty is marked already. */
    if (h[0] != NULL) {
        list_push(h + (chain & (C - 1)), t);
    } else {
        list_push(h, t);
        slot_filled(w, k, slot);
    }
}

/*
 * The walk of visit_slot(): the @n chains @chain of a slot of a level with
 * granularity 2^@gshift, whose heads @h are empty now. Timers expiring now
 * join the fire chains @fl (dealt round-robin by *@nfire); in a rounds
 * level (@rounds, a constant) timers of later rounds go back into @h
 * (their least expiry into *@newmin); all others move to a lower level
 * (@from: the level when it is 1 or 2, a constant). The chains are
 * walked in turn, the next timer of each prefetched, so that their cache
 * misses overlap. Returns whether a timer went back into @h.
 */
__attribute__((always_inline)) static inline int
walk_chains(tw_wheel *w, tw_timer **chain, unsigned n, tw_timer **fl,
            unsigned *nfire, tw_timer **h, uint64_t now, unsigned gshift,
            uint64_t *newmin, unsigned C, int rounds, unsigned from)
{
    int kept = 0;
    unsigned moved = 0; /* deals the chains of the cascade's targets */
    uint64_t mask = w->mask;
    tw_timer **heads0 = w->lv[0].heads;
    tw_timer **heads1 = w->levels > 1 ? w->lv[1].heads : heads0;
    while (n > 0) {
        for (unsigned i = 0; i < n;) {
            tw_timer *t = chain[i];
            tw_timer *next = t->tw__next;
            if (next != NULL) {
                chain[i++] = next;
                __builtin_prefetch(next, 1);
            } else {
                chain[i] = chain[--n]; /* this chain is done */
            }
            uint64_t e = t->tw__expires;
            if (e == now) {
                if (*nfire < K)
                    fl[*nfire] = NULL; /* a chain's first use */
                list_push(&fl[*nfire & (K - 1)], t);
                ++*nfire;
            } else if (rounds && (e >> gshift) != (now >> gshift)) {
                /* A later round: back into the same slot. */
                list_push(&h[i & (C - 1)], t);
                kept = 1;
                if (e < *newmin)
                    *newmin = e;
            } else {
                /* Into level 0 (from level 1), runs of
                 * 2^TW_WHEEL_FIRE_RUN_SHIFT moved timers share a list;
                 * else each next list in turn (see the macro). */
                unsigned deal =
                    from == 1 ? moved >> TW_WHEEL_FIRE_RUN_SHIFT : moved;
                moved++;
                cascade(w, t, e, now, mask, deal, C, from, heads0, heads1);
            }
        }
    }
    return kept;
}

/*
 * Visit slot (@k, @slot) at tick w->now (the start of its granule): timers
 * expiring now join the fire chains @fl (dealt round-robin by *@nfire),
 * timers of later rounds stay, all others move to a lower level
 * (walk_chains()).
 */
__attribute__((always_inline)) static inline void
visit_slot(tw_wheel *w, unsigned k, uint64_t slot, tw_timer **fl,
           unsigned *nfire, unsigned C)
{
    tw_timer **h = slot_heads(w, k, slot, C);
    tw_timer *chain[K];
    unsigned n = 0;
    int rounds = is_rounds_level(w, k);
    unsigned gshift = w->lv[k].shift;
    uint64_t now = w->now, newmin = UINT64_MAX;
    int kept = 0;

    if (rounds && floor_pow2(w->slotmin[slot], gshift) > now)
        return; /* nothing of this round here: skip the walk */
    if (k == 0 && !rounds && *nfire == 0) {
        *nfire = hand_over(w, slot, fl, C);
        return;
    }
    for (unsigned c = 0; c < C; c++) {
        if (h[c] != NULL)
            chain[n++] = h[c];
        h[c] = NULL;
    }
    slot_emptied(w, k, slot);

    /* The same walk compiled four times, so that the tests that do not
     * change within a slot are constants in its loop. */
    if (rounds)
        kept = walk_chains(w, chain, n, fl, nfire, h, now, gshift, &newmin, C,
                           1, 0);
    else if (k == 1)
        walk_chains(w, chain, n, fl, nfire, h, now, gshift, &newmin, C, 0, 1);
    else if (k == 2)
        walk_chains(w, chain, n, fl, nfire, h, now, gshift, &newmin, C, 0, 2);
    else
        walk_chains(w, chain, n, fl, nfire, h, now, gshift, &newmin, C, 0, 0);
    if (kept) {
        slot_filled(w, k, slot);
        w->slotmin[slot] = newmin;
    }
}

/* The slot loop of advance_work() for a table of @C lists a slot. Returns
 * 1 when done, 0 when a callback widened a narrow table (the caller goes on
 * with the wide loop). */
__attribute__((always_inline)) static inline int
advance_loop(tw_wheel *w, uint64_t now, size_t *ran, unsigned C)
{
    /* An exact hint saves the first search: the last advance left it, and
     * since then adds only lowered it to their slot's tick, no slot became
     * empty (chain_emptied) and now moved only short of it. */
    int exact = w->hint_ok; /* never set with an empty wheel's UINT64_MAX */
    w->hint_ok = 0;         /* until the loop leaves a fresh hint */
    for (;;) {
        uint64_t t = w->hint;
        if (!exact && next_event(w, &t) != 0) {
            w->hint = UINT64_MAX;
            break;
        }
        exact = 0;
        if (t > now) {
            w->hint = t;
            w->hint_ok = w->exact_ok;
            break;
        }
        w->now = t;
        /* Levels whose granule starts at t, highest first, so that a
         * cascade never lands in a slot that was already looked at. */
        /* t > now >= 0, so t != 0; the table caps the level at L - 1. */
        unsigned top = w->level_of_msb[ctz64(t)];
        tw_timer *fl[K]; /* entries below min(nfire, K) are in use */
        unsigned nfire = 0;
        if (top == 0 && !is_rounds_level(w, 0)) {
            /* The common tick: only level 0 starts a granule at t, so t
             * came from its bitmap and slot t & mask is marked (occupied,
             * or emptied by tw_wheel_cancel_inline()). */
            nfire = hand_over(w, t & w->mask, fl, C);
        }
        for (unsigned k = nfire == 0 ? top + 1 : 0; k > 0;) {
            k--;
            if (!(w->level_map & (UINT64_C(1) << k)))
                continue;
            uint64_t slot = digit_of(w, t, k);
            if (bm_test(w, level_bitmap(w, k), slot))
                visit_slot(w, k, slot, fl, &nfire, C);
        }
        /* list_push left each chain's head pointing at its fl entry. */
        /* One chain is the common case: a constant there. */
        if (nfire == 1)
            *ran += fire_chains(w, fl, 1);
        else
            *ran += fire_chains(w, fl, nfire < K ? nfire : K);
        if (C == 1 && w->cshift != 0)
            return 0;
    }
    w->now = now;
    return 1;
}

/* The part of tw_wheel_advance() that has work to do; kept out of line so
 * that the common call with nothing due stays a few instructions. */
__attribute__((noinline)) static size_t advance_work(tw_wheel *w, uint64_t now)
{
    size_t ran = 0;
    if (w->due != NULL)
        ran += run_due(w);
    if (w->cshift != 0 || !advance_loop(w, now, &ran, 1))
        advance_loop(w, now, &ran, K);
    if (w->due != NULL) {
        /* Callbacks added due timers: the loop's hint must not hide them
         * (see due_push). */
        w->hint = 0;
        w->hint_ok = 0;
    }
    return ran;
}

/*
 * advance_work() for the commonest visit of a wheel advanced one tick at a
 * time: @now is the exact hint (hint_ok), a tick that starts no granule
 * above level 0, of a wide table, with the due list empty (the hint would
 * be 0). Its one visit is the level-0 slot of @now, marked occupied (and
 * empty only if tw_wheel_cancel_inline() emptied it), whose timers all run
 * now; then the next event is the new exact hint, as at the end of
 * advance_loop(). The same steps as advance_work(), without its loop over
 * levels and the frame that the walks need.
 */
__attribute__((noinline)) static size_t advance_tick(tw_wheel *w, uint64_t now)
{
    tw_timer *fl[K];
    w->hint_ok = 0; /* until a fresh hint is left, as in advance_loop() */
    w->now = now;
    unsigned n = hand_over(w, now & w->mask, fl, K);
    size_t ran = n == 1 ? fire_chains(w, fl, 1) : fire_chains(w, fl, n);
    if (w->due != NULL) {
        w->hint = 0; /* callbacks added due timers (see due_push) */
        return ran;
    }
    uint64_t t;
    if (next_event(w, &t) != 0) {
        w->hint = UINT64_MAX;
    } else {
        w->hint = t; /* after now: every occupied slot lies ahead */
        w->hint_ok = w->exact_ok;
    }
    return ran;
}

size_t tw_wheel_advance(tw_wheel *w, uint64_t now)
{
    /* The hint is 0 while the due list is not empty (due_push), so one
     * test covers both. */
    if (now < w->hint) {
        /* The common call of an event loop: nothing to do yet. */
        if (now > w->now)
            w->now = now;
        return 0;
    }
    if (now < w->now)
        return 0;
    if (now == w->hint && w->hint_ok && (now & w->mask) != 0 && w->cshift != 0)
        return advance_tick(w, now);
    return advance_work(w, now);
}

/* ------------------------------------------------------------------------ */
/* Invariant checkers: 0 if the wheel is consistent, else the line number of
 * the first broken rule. For tests only. tw__wheel_check costs
 * O(timers + occupied slots); tw__wheel_check_full also scans every slot
 * head and bitmap word. */

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond))                                                           \
            return __LINE__;                                                   \
    } while (0)

static int check_list(const tw_wheel *w, tw_timer *const *head, size_t *n)
{
    tw_timer *const *pp = head;
    for (tw_timer *t = *head; t != NULL; t = t->tw__next) {
        CHECK(t->tw__pprev == (tw_timer **)pp);
        CHECK(w->fire != NULL || t->tw__fn != NULL);
        pp = &t->tw__next;
        (*n)++;
    }
    return 0;
}

static int check_slot(const tw_wheel *w, unsigned k, uint64_t s, size_t *n)
{
    unsigned C = chains_of(w);
    tw_timer *const *h = slot_heads(w, k, s, C);
    int rounds = is_rounds_level(w, k), r;
    unsigned gshift = k * w->bits;
    /* Marked and empty: emptied by tw_wheel_cancel_inline(). */
    for (unsigned c = 0; c < C; c++) {
        if ((r = check_list(w, &h[c], n)) != 0)
            return r;
        for (tw_timer *t = h[c]; t != NULL; t = t->tw__next) {
            uint64_t e = t->tw__expires;
            CHECK(e > w->now);
            CHECK(digit_of(w, e, k) == s);
            if (rounds) {
                CHECK((e >> gshift) > (w->now >> gshift));
                CHECK(w->slotmin[s] <= e);
            } else {
                CHECK(w->level_of_msb[msb64(e ^ w->now)] == k);
                CHECK(s > digit_of(w, w->now, k));
            }
        }
    }
    return 0;
}

int tw__wheel_check(const tw_wheel *w)
{
    size_t n = 0;
    int r;
    if ((r = check_list(w, &w->due, &n)) != 0)
        return r;
    uint64_t seen_min = UINT64_MAX, prev = 0;
    for (tw_timer *t = w->due; t != NULL; t = t->tw__next) {
        CHECK(t->tw__expires <= w->now);
        CHECK(!w->due_sorted || t->tw__expires >= prev);
        prev = t->tw__expires;
        if (t->tw__expires < seen_min)
            seen_min = t->tw__expires;
    }
    CHECK(w->due == NULL || w->due_min <= seen_min);
    CHECK(w->due == NULL || (w->hint == 0 && !w->hint_ok));
    for (unsigned k = 0; k < w->levels; k++) {
        const uint64_t *bm = level_bitmap(w, k);
        int used = !bm_empty(w, bm);
        CHECK(used == !!(w->level_map & (UINT64_C(1) << k)));
        for (int64_t s = bm_next(w, bm, 0); s >= 0;
             s = bm_next(w, bm, (uint64_t)s + 1))
            if ((r = check_slot(w, k, (uint64_t)s, &n)) != 0)
                return r;
    }
    CHECK(w->levels == 64 || (w->level_map >> w->levels) == 0);
    for (unsigned m = 0; m < 64; m++) {
        unsigned k = w->level_of_msb[m];
        CHECK(w->fast_lv[m] == (k < w->fast_k ? &w->lv[k] : NULL));
    }
    uint64_t next;
    if (next_event(w, &next) == 0) {
        CHECK(next > w->now);
        CHECK(w->hint <= next); /* the fast path never skips work */
        CHECK(!w->hint_ok || w->hint == next);
    } else {
        CHECK(!w->hint_ok);
    }
    /* Every timer was found through the bitmaps: none hides elsewhere. */
    CHECK(n == pending(w));
    return 0;
}

int tw__wheel_check_full(const tw_wheel *w)
{
    int r = tw__wheel_check(w);
    if (r != 0)
        return r;
    for (unsigned k = 0; k < w->levels; k++) {
        const uint64_t *bm = level_bitmap(w, k);
        /* Every occupied slot is marked; a marked one may be empty
         * (tw_wheel_cancel_inline() does not unmark). */
        for (uint64_t s = 0; s <= w->mask; s++)
            CHECK(bm_test(w, bm, s) ||
                  slot_empty(slot_heads(w, k, s, chains_of(w)), chains_of(w)));
        /* Upper bitmap layers summarise the layer below exactly. */
        for (unsigned l = 1; l < w->bm_layers; l++)
            for (uint32_t i = 0; i < w->bm_len[l - 1]; i++) {
                int nz = bm[w->bm_off[l - 1] + i] != 0;
                int bit = (int)((bm[w->bm_off[l] + (i >> 6)] >> (i & 63)) & 1);
                CHECK(nz == bit);
            }
        for (uint64_t s = 0; s <= w->mask && is_rounds_level(w, k); s++)
            CHECK(bm_test(w, bm, s) || w->slotmin[s] == UINT64_MAX);
    }
    return 0;
}

size_t tw__wheel_stale_slots(const tw_wheel *w)
{
    size_t n = 0;
    for (unsigned k = 0; k < w->levels; k++)
        for (uint64_t s = 0; s <= w->mask; s++)
            n += bm_test(w, level_bitmap(w, k), s) &&
                 slot_empty(slot_heads(w, k, s, chains_of(w)), chains_of(w));
    return n;
}
