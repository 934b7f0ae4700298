/* SPDX-License-Identifier: MIT */
/*
 * src/durable_metrics.c - tw_durable_metrics(): the store's counters
 * (tw_durable_stats_get()) in the Prometheus text format 0.0.4 or the
 * OpenMetrics 1.0 text format, into a caller's buffer or a FILE *.
 *
 * The two formats differ here only in how a counter family is named (the
 * Prometheus format names the family as its sample, name_total; OpenMetrics
 * names it without the suffix) and in OpenMetrics' closing "# EOF". The
 * text is written in pieces through one writer that either copies into
 * the buffer (counting what did not fit, as snprintf does) or writes to
 * the FILE, so nothing is allocated.
 */
#include "twheel/durable.h"

#include <inttypes.h>
#include <stdbool.h>
#include <string.h>

#include "durable_backend.h"

struct mout {
    char *buf;
    size_t len, pos; /* pos counts every byte, also those that did not fit */
    FILE *f;
    bool err;
    bool om; /* OpenMetrics */
    const char *labels;
};

static void put(struct mout *o, const char *s, size_t n)
{
    if (o->f) {
        if (n && fwrite(s, 1, n, o->f) != n)
            o->err = true;
    } else if (o->pos < o->len) {
        size_t room = o->len - o->pos;
        memcpy(o->buf + o->pos, s, n < room ? n : room);
    }
    o->pos += n;
}

static void puts_(struct mout *o, const char *s)
{
    put(o, s, strlen(s));
}

static void put_u64(struct mout *o, uint64_t v)
{
    char b[24];
    int n = snprintf(b, sizeof b, "%" PRIu64, v);
    put(o, b, (size_t)n);
}

/* @us microseconds as seconds, exactly (six decimals). */
static void put_secs(struct mout *o, uint64_t us)
{
    char b[32];
    int n = snprintf(b, sizeof b, "%" PRIu64 ".%06" PRIu64, us / 1000000u,
                     us % 1000000u);
    put(o, b, (size_t)n);
}

static void head(struct mout *o, const char *name, const char *suffix,
                 const char *type, const char *help)
{
    puts_(o, "# HELP ");
    puts_(o, name);
    puts_(o, suffix);
    puts_(o, " ");
    puts_(o, help);
    puts_(o, "\n# TYPE ");
    puts_(o, name);
    puts_(o, suffix);
    puts_(o, " ");
    puts_(o, type);
    puts_(o, "\n");
}

/* "name[suffix]{labels[,extra]} " */
static void sample(struct mout *o, const char *name, const char *suffix,
                   const char *extra)
{
    puts_(o, name);
    puts_(o, suffix);
    if (o->labels || extra) {
        puts_(o, "{");
        if (o->labels)
            puts_(o, o->labels);
        if (o->labels && extra)
            puts_(o, ",");
        if (extra)
            puts_(o, extra);
        puts_(o, "}");
    }
    puts_(o, " ");
}

static void gauge(struct mout *o, const char *name, const char *help,
                  uint64_t v)
{
    head(o, name, "", "gauge", help);
    sample(o, name, "", NULL);
    put_u64(o, v);
    puts_(o, "\n");
}

static void counter(struct mout *o, const char *name, const char *help,
                    uint64_t v)
{
    head(o, name, o->om ? "" : "_total", "counter", help);
    sample(o, name, "_total", NULL);
    put_u64(o, v);
    puts_(o, "\n");
}

/* Bucket i of late_hist counts [2^(i-1), 2^i) us (bucket 0: under 1 us),
 * so through bucket i every lateness is at most 2^i - 1 us: that is its
 * "le", exact for whole microseconds. The last bucket is +Inf. */
static void lateness(struct mout *o, const tw_durable_stats *s)
{
    static const char name[] = "twheel_durable_lateness_seconds";
    head(o, name, "", "histogram",
         "How late deliveries started after their due time.");
    uint64_t cum = 0;
    for (unsigned i = 0; i < TW_LATE_BUCKETS; i++) {
        cum += s->late_hist[i];
        char le[48];
        if (i == TW_LATE_BUCKETS - 1) {
            snprintf(le, sizeof le, "le=\"+Inf\"");
        } else {
            uint64_t us = ((uint64_t)1 << i) - 1;
            snprintf(le, sizeof le, "le=\"%" PRIu64 ".%06" PRIu64 "\"",
                     us / 1000000u, us % 1000000u);
        }
        sample(o, name, "_bucket", le);
        put_u64(o, cum);
        puts_(o, "\n");
    }
    sample(o, name, "_sum", NULL);
    put_secs(o, s->late_sum_us);
    puts_(o, "\n");
    sample(o, name, "_count", NULL);
    put_u64(o, cum);
    puts_(o, "\n");
}

static void render(struct mout *o, const tw_durable_stats *s)
{
    gauge(o, "twheel_durable_pending",
          "Timers the store holds: scheduled, not yet completed or "
          "cancelled.",
          s->pending);
    gauge(o, "twheel_durable_backlog",
          "Due timers whose delivery has not started.", s->backlog);
    gauge(o, "twheel_durable_running", "Callbacks running now.", s->running);
    gauge(o, "twheel_durable_dead",
          "Dead letters: timers the retry policy gave up on.", s->dead);
    counter(o, "twheel_durable_fired",
            "Deliveries whose callback returned 0 or less (done).", s->fired);
    counter(o, "twheel_durable_retried",
            "Deliveries whose callback asked for a retry.", s->retried);
    counter(o, "twheel_durable_cancelled", "Successful cancels.", s->cancelled);
    counter(o, "twheel_durable_syncs", "fdatasync calls of the journal.",
            s->syncs);
    counter(o, "twheel_durable_errors",
            "Redis: error replies to the store's claims, claim checks and "
            "completions (e.g. a permission taken away after open).",
            s->errors);
    gauge(o, "twheel_durable_journal_bytes",
          "Bytes of the journal's segments on disk.", s->journal_bytes);
    gauge(o, "twheel_durable_segments", "Journal segment files on disk.",
          s->segments);
    gauge(o, "twheel_durable_recovered",
          "Pending timers found by the last open.", s->recovered);
    head(o, "twheel_durable_recovery_seconds", "", "gauge",
         "How long the last open's replay took.");
    sample(o, "twheel_durable_recovery_seconds", "", NULL);
    put_secs(o, s->recovery_us);
    puts_(o, "\n");
    lateness(o, s);
    if (o->om)
        puts_(o, "# EOF\n");
}

static bool name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* name="value"(,name="value")*, values with \\, \" and \n escapes only. */
static bool labels_ok(const char *p)
{
    if (!p)
        return true;
    for (;;) {
        if (!name_start(*p))
            return false;
        while (name_start(*p) || (*p >= '0' && *p <= '9'))
            p++;
        if (*p++ != '=' || *p++ != '"')
            return false;
        while (*p != '"') {
            if (!*p || *p == '\n')
                return false;
            if (*p == '\\' && p[1] != '\\' && p[1] != '"' && p[1] != 'n')
                return false;
            p += *p == '\\' ? 2 : 1;
        }
        p++;
        if (!*p)
            return true;
        if (*p++ != ',')
            return false;
    }
}

static int run(tw_durable *d, const char *labels, unsigned flags,
               struct mout *o)
{
    if (!d || (flags & ~TW_DURABLE_METRICS_OPENMETRICS) || !labels_ok(labels))
        return TW_EINVAL;
    if (atomic_load_explicit(&d->closing, memory_order_acquire))
        return TW_ESHUTDOWN;
    tw_durable_stats s;
    int rc = tw_durable_stats_get(d, &s);
    if (rc)
        return rc;
    o->om = flags & TW_DURABLE_METRICS_OPENMETRICS;
    o->labels = labels;
    render(o, &s);
    return 0;
}

long tw_durable_metrics(tw_durable *d, const char *labels, unsigned flags,
                        char *buf, size_t len)
{
    if (len && !buf)
        return TW_EINVAL;
    struct mout o = {.buf = buf, .len = len ? len - 1 : 0};
    int rc = run(d, labels, flags, &o);
    if (rc)
        return rc;
    if (len)
        buf[o.pos < o.len ? o.pos : o.len] = '\0';
    return (long)o.pos;
}

int tw_durable_metrics_fprint(tw_durable *d, const char *labels, unsigned flags,
                              FILE *f)
{
    if (!f)
        return TW_EINVAL;
    struct mout o = {.f = f};
    int rc = run(d, labels, flags, &o);
    if (!rc && (o.err || fflush(f) != 0))
        rc = TW_EIO;
    return rc;
}
