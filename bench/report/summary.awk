# SPDX-License-Identifier: MIT
# summary.awk - the headline figures and the targets, each marked MET or
# MISSED (NOT RUN when the run lacks the figures), from results.csv, and
# every row of every round where twheel is slower than a peer.
# Like is compared with like: every figure is the median of its runs,
# beside the peers' medians of theirs, with the spread (min..max of the
# runs) printed where a round has several; throughput (Mops/s, items/s) is
# better higher, everything else (ns, ms, bytes, wake-ups) lower.
# Usage: awk -F, -f bench/report/summary.awk results.csv
NR == 1 { next }
{
    key = $1 SUBSEP $2 SUBSEP $3
    med[key] = $5; lo[key] = $6; hi[key] = $7; reps[key] = $8
    unit[key] = $4; seen_n[$1] = 1; seen_w[$2] = 1
    if ($2 ~ /^svc_/) { svc_w[$2] = 1; svc_e[$3] = 1; svc_n = $1 }
    if ($2 ~ /^dur_/) { dur_w[$2] = 1; dur_n[$2] = $1 }
    if ($2 ~ /^redis_/) redis_n = $1
}
# (Every read checks membership first: reading med[k] would create k.)
function m(n, w, e) { return ((n, w, e) in med) ? med[n, w, e] + 0 : 0 }
function ratio(a, b) { return b > 0 ? a / b : 0 }
function higher_better(u) { return u ~ /\/s$/ }
# The median of workload w, engine e, whatever its n (service, durable and
# Redis rows have one n each).
function mw(w, e,   k, f) {
    for (k in med) {
        split(k, f, SUBSEP)
        if (f[2] == w && f[3] == e) return med[k] + 0
    }
    return 0
}
function spread(w, e,   k, f) {
    for (k in med) {
        split(k, f, SUBSEP)
        if (f[2] == w && f[3] == e)
            return reps[k] > 1 ? sprintf("%g..%g, %d runs", lo[k], hi[k], reps[k]) : "1 run"
    }
    return "-"
}
# Workload w, engine e as "median [min..max]" in format fmt; "-" if absent.
function cell(w, e, fmt,   k, f) {
    for (k in med) {
        split(k, f, SUBSEP)
        if (f[2] == w && f[3] == e) return sprintf(fmt, med[k], lo[k], hi[k])
    }
    return "-"
}
# One target line: what, the figure, the target, and the verdict.
function target(what, have, op, need, fmt) {
    ntargets++
    if (have == "") {
        printf "%-7s %s: not in this run (target %s " fmt ")\n", "NOT RUN",
            what, op, need
        notrun++
        return
    }
    ok = op == ">=" ? have + 0 >= need : have + 0 <= need
    if (!ok) missed++
    printf "%-7s %s: " fmt " (target %s " fmt ")\n", ok ? "MET" : "MISSED",
        what, have, op, need
}
# A ratio target between two medians of one workload: a / b.
function rtarget(what, w, a, b, op, need,   x, y, have) {
    x = mw(w, a); y = mw(w, b); have = ""
    if (x > 0 && y > 0) have = sprintf("%.2f", x / y)
    target(what, have, op, need, "%.2fx")
    if (have != "")
        printf "        (%s %g [%s]; %s %g [%s])\n", a, x, spread(w, a), b, y,
            spread(w, b)
}
# One "slower" line when twheel engine t is behind peer p on row (n, w).
# (The spreads overlap when neither side's runs all beat the other's.)
function slower_row(n, w, t, p,   a, b, u, worse, ov) {
    if (!((n, w, t) in med) || !((n, w, p) in med)) return
    a = med[n, w, t]; b = med[n, w, p]; u = unit[n, w, t]
    if (a + 0 <= 0 || b + 0 <= 0) return
    worse = higher_better(u) ? a + 0 < b + 0 : a + 0 > b + 0
    if (!worse) return
    ov = hi[n, w, t] + 0 >= lo[n, w, p] + 0 && hi[n, w, p] + 0 >= lo[n, w, t] + 0
    # Kept to be printed in order: round (core, service, durable, Redis),
    # then size, row and engines.
    srt[++slower] = sprintf("%d %012d %s %s %s", w ~ /^svc_/ ? 2 : w ~ /^dur_/ ? 3 : w ~ /^redis_/ ? 4 : 1, n, w, t, p)
    line[slower] = sprintf("%-9s %-18s %-20s %10.2f  %-16s %10.2f %-8s %.2fx%s", n, w, t, a, p,
        b, u, higher_better(u) ? b / a : a / b, ov ? "  (spreads overlap)" : "")
}
END {
    big = 1000000
    printf "== Headline (1e6 pending timers, medians of the same run)\n"
    split("heap libuv libevent", peers, " ")
    for (i = 1; i <= 3; i++) {
        p = peers[i]
        if (m(big, "churn", p) > 0 && m(big, "churn", "twheel") > 0)
            printf "churn (cancel+add): twheel %.1f ns, %s %.1f ns: %.2fx\n",
                m(big, "churn", "twheel"), p, m(big, "churn", p),
                ratio(m(big, "churn", p), m(big, "churn", "twheel"))
    }

    printf "\n== Targets (every figure a median; spreads in brackets)\n"
    printf "-- core wheel\n"
    t = m(big, "churn", "twheel")
    split("heap:3 libuv:2 libevent:2", tg, " ")
    for (i = 1; i <= 3; i++) {
        split(tg[i], pn, ":")
        have = ""
        if (t > 0 && m(big, "churn", pn[1]) > 0)
            have = sprintf("%.2f", ratio(m(big, "churn", pn[1]), t))
        target("churn at 1e6, " pn[1] " / twheel", have, ">=", pn[2], "%.2fx")
    }
    have = ""
    if (m(big, "memory", "twheel") > 0)
        have = sprintf("%.1f", m(big, "memory", "twheel"))
    target("core memory per pending timer at 1e6, twheel (B)", have, "<=",
        48, "%.1f")
    printf "-- service (%s tasks per run)\n", svc_n == "" ? "-" : svc_n
    have = mw("svc_bytes_per_task", "twheel-service")
    target("service bytes per pending task (B)",
        have > 0 ? sprintf("%.1f", have) : "", "<=", 48, "%.1f")
    rtarget("service / Netty HWT, schedule+cancel pairs, 1 producer",
        "svc_pairs_1p", "twheel-service", "netty-hwt", ">=", 4)
    rtarget("service / Netty HWT, schedule+cancel pairs, 2 producers",
        "svc_pairs_2p", "twheel-service", "netty-hwt", ">=", 6)
    printf "-- durable store (items/s scheduled, 4 threads)\n"
    split("1 32", dps, " ")
    for (i = 1; i <= 2; i++) {
        w = "dur_sched_" dps[i]
        rtarget("journal SYNC_GROUP / Redis always, " dps[i] " per call", w,
            "twheel-group", "redis-always", ">=", 5)
        rtarget("journal SYNC_GROUP / Redis everysec, " dps[i] " per call", w,
            "twheel-group", "redis-everysec", ">=", 1)
        rtarget("journal SYNC_INTERVAL / Redis everysec, " dps[i] " per call", w,
            "twheel-interval", "redis-everysec", ">=", 1)
    }
    printf "-- Redis backend (%s timers per run)\n", redis_n == "" ? "-" : redis_n
    rtarget("Redis CPU per fired timer, twheel / poller", "redis_cpu",
        "twheel-redis", "poller-100ms", "<=", 1)
    rtarget("p99 lateness, poller / twheel", "redis_p99", "poller-100ms",
        "twheel-redis", ">=", 10)
    printf "%d targets: %d MET, %d MISSED, %d NOT RUN\n", ntargets,
        ntargets - missed - notrun, missed, notrun

    printf "\n== Where twheel is slower than a peer (every row of every round, medians)\n"
    printf "%-9s %-18s %-20s %10s  %-16s %10s %-8s %s\n", "n", "row", "twheel",
        "median", "peer", "median", "unit", "factor"
    slower = 0
    for (k in med) {
        split(k, f, SUBSEP)
        n = f[1]; w = f[2]; e = f[3]
        if (w ~ /^svc_/) {
            if (e != "netty-hwt" && e != "jdk-stpe") continue
            slower_row(n, w, "twheel-service", e)
            slower_row(n, w, "twheel-service-lazy", e)
        } else if (w ~ /^dur_/) {
            if (e !~ /^redis-/) continue
            slower_row(n, w, "twheel-group", e)
            slower_row(n, w, "twheel-interval", e)
        } else if (w ~ /^redis_/) {
            if (e !~ /^poller/) continue
            slower_row(n, w, "twheel-redis", e)
        } else {
            if (e != "heap" && e != "libuv" && e != "libevent") continue
            slower_row(n, w, "twheel", e)
        }
    }
    for (i = 2; i <= slower; i++)
        for (j = i; j > 1 && srt[j - 1] > srt[j]; j--) {
            t = srt[j]; srt[j] = srt[j - 1]; srt[j - 1] = t
            t = line[j]; line[j] = line[j - 1]; line[j - 1] = t
        }
    for (i = 1; i <= slower; i++) print line[i]
    if (!slower) printf "none\n"

    printf "\n== Memory (bytes per pending timer or task; target <= 48)\n"
    for (n in seen_n)
        if (n + 0 == big && m(n, "memory", "twheel") > 0)
            printf "core twheel %.1f, heap %.1f, libuv %.1f, libevent %.1f\n",
                m(n, "memory", "twheel"), m(n, "memory", "heap"),
                m(n, "memory", "libuv"), m(n, "memory", "libevent")
    for (k in med) {
        split(k, f, SUBSEP)
        if (f[2] == "svc_bytes_per_task")
            printf "service %s: %.1f (%d tasks)\n", f[3], med[k], f[1]
    }

    printf "\n== Service vs Java peers (M ops/s or as named; every engine: median [min..max] of its runs)\n"
    printf "%-20s", "metric"
    ne = split("twheel-service twheel-service-lazy netty-hwt jdk-stpe netty-hwt-1ms netty-hwt-100ms", es, " ")
    for (i = 1; i <= ne; i++) printf " %23s", es[i]
    printf "\n"
    nw = split("svc_schedule_1p svc_schedule_2p svc_cancel_1p svc_cancel_2p svc_pairs_1p svc_pairs_2p svc_bytes_per_task svc_idle_wakeups", ws, " ")
    for (j = 1; j <= nw; j++) {
        w = ws[j]
        if (!(w in svc_w)) continue
        printf "%-20s", w
        for (i = 1; i <= ne; i++) {
            v = ""
            for (k in med) {
                split(k, f, SUBSEP)
                if (f[2] != w || f[3] != es[i])
                    continue
                v = sprintf("%.1f [%.1f..%.1f]", med[k], lo[k], hi[k])
                if (reps[k] <= 1 || w ~ /bytes|wakeups/)
                    v = sprintf("%.2f", med[k])
            }
            printf " %23s", v == "" ? "-" : v
        }
        printf "\n"
    }

    printf "\n== Durable store: items scheduled per second, 4 threads (median [min..max] of its runs)\n"
    printf "%-14s %22s %22s %22s %22s\n", "items per call", "twheel-group",
        "twheel-interval", "redis-always", "redis-everysec"
    split("twheel-group twheel-interval redis-always redis-everysec", de, " ")
    for (i = 1; i <= 2; i++) {
        w = "dur_sched_" dps[i]
        if (!(w in dur_w)) continue
        printf "%-14s", dps[i]
        for (j = 1; j <= 4; j++) printf " %22s", cell(w, de[j], "%d [%d..%d]")
        printf "\n"
    }
    printf "(SYNC_GROUP and Redis always: every acknowledged call on stable storage; SYNC_INTERVAL and Redis everysec: written, synced within 1 s)\n"

    printf "\n== Redis backend against the sorted-set poller (median [min..max] of its runs)\n"
    printf "%-34s %24s %24s\n", "metric", "twheel-redis", "poller-100ms"
    printf "%-34s %24s %24s\n", "Redis CPU ms per 1000 fired timers",
        cell("redis_cpu", "twheel-redis", "%.2f [%.2f..%.2f]"),
        cell("redis_cpu", "poller-100ms", "%.2f [%.2f..%.2f]")
    printf "%-34s %24s %24s\n", "p99 lateness, ms",
        cell("redis_p99", "twheel-redis", "%.2f [%.2f..%.2f]"),
        cell("redis_p99", "poller-100ms", "%.2f [%.2f..%.2f]")
}
