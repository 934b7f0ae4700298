/* SPDX-License-Identifier: MIT */
/*
 * src/durable_journal_damage.c - the journal open's reports of what its
 * replay ignored or dropped (cfg.on_damage, twheel/durable.h): a torn
 * tail, damaged records skipped by a repair, a segment dropped for its
 * bad header, a missing segment; and, for the bytes of each, the records
 * whose headers can still be read, read without their checksum.
 *
 * Reports only: nothing here changes what the replay keeps.
 */
#include "twheel/durable.h"

#include <string.h>

#include "durable_journal.h"

/* What the header at @p (@n bytes left in the range) says, without its
 * checksum: 0 when it cannot be a record header, else the record's full
 * size (which may run past @n: a record cut short) and its key (NULL when
 * the key runs past @n) and type in *@d. */
static size_t read_header(const unsigned char *p, size_t n,
                          tw_durable_damage *d)
{
    static const char *const names[] = {NULL,   "schedule", "cancel",
                                        "done", "fire",     "dead"};
    if (n < JR_REC_HDR)
        return 0;
    uint32_t len = tw__jr_get32(p + JR_RH_LEN);
    uint8_t type = p[JR_RH_TYPE];
    uint16_t key_len = tw__jr_get16(p + JR_RH_KEY_LEN);
    if (type < JR_SCHED || type > JR_DEAD || p[JR_RH_PAD] != 0 ||
        key_len == 0 || key_len > TW_DURABLE_KEY_MAX || len > JR_MAX_BODY)
        return 0;
    bool body = type == JR_SCHED || type == JR_DEAD;
    if (body ? len < JR_SCHED_FIXED + key_len : len != key_len)
        return 0;
    size_t key_at = JR_REC_HDR + (body ? JR_SCHED_FIXED : 0);
    d->record = names[type];
    d->key = key_at + key_len <= n ? p + key_at : NULL;
    d->key_len = key_len;
    d->due_ms = body && JR_REC_HDR + 8 <= n
                    ? (int64_t)tw__jr_get64(p + JR_REC_HDR + JR_B_DUE)
                    : 0;
    return JR_REC_HDR + (size_t)len;
}

/* Walk the record headers of bytes [@from, @to) of @p; report each one
 * when @report, else only count them. Returns the count. */
static uint64_t walk(const tw_durable_config *cfg, const unsigned char *p,
                     size_t from, size_t to, tw_durable_damage *d, bool report)
{
    uint64_t count = 0;
    /* A segment dropped for its header: its records begin after it. */
    size_t o0 = d->kind == TW_DURABLE_DAMAGE_SEGMENT && from < JR_SEG_HDR
                    ? JR_SEG_HDR
                    : from;
    for (size_t o = o0; o < to;) {
        tw_durable_damage r = *d;
        size_t sz = read_header(p + o, to - o, &r);
        if (!sz)
            break;
        count++;
        if (report) {
            r.kind = TW_DURABLE_DAMAGE_RECORD;
            r.offset = o;
            r.bytes = sz < to - o ? sz : to - o;
            r.records = 1;
            cfg->on_damage(cfg->on_damage_arg, &r);
        }
        o += sz;
    }
    return count;
}

void tw__journal_report_bytes(const tw_durable_config *cfg, uint32_t kind,
                              uint32_t segment, const unsigned char *p,
                              size_t from, size_t to, bool trim)
{
    if (!cfg->on_damage)
        return;
    while (trim && to > from && p[to - 1] == 0)
        to--; /* the file's preallocated zeros */
    if (to <= from)
        return;
    tw_durable_damage d;
    memset(&d, 0, sizeof d);
    d.kind = kind;
    d.segment = segment;
    d.offset = from;
    d.bytes = to - from;
    d.records = walk(cfg, p, from, to, &d, false);
    cfg->on_damage(cfg->on_damage_arg, &d);
    (void)walk(cfg, p, from, to, &d, true);
}

void tw__journal_report_missing(const tw_durable_config *cfg, uint32_t first,
                                uint32_t count)
{
    if (!cfg->on_damage || !count)
        return;
    tw_durable_damage d;
    memset(&d, 0, sizeof d);
    d.kind = TW_DURABLE_DAMAGE_MISSING;
    d.segment = first;
    d.records = count;
    cfg->on_damage(cfg->on_damage_arg, &d);
}
