# SPDX-License-Identifier: MIT
# summary.awk - the headline figures and the targets, each marked MET or
# MISSED (NOT RUN when the run lacks the figures), from results.csv.
# Like is compared with like: core figures are medians beside medians; the
# service table puts the Java peers' best runs beside twheel's figures,
# which bench_service reports as the median of its runs (never above its
# best, so the comparison leans towards the peers), with the number of
# runs.
# Usage: awk -F, -f bench/report/summary.awk results.csv
NR == 1 { next }
{
    key = $1 SUBSEP $2 SUBSEP $3
    med[key] = $5; best[key] = $7; reps[key] = $8; seen_n[$1] = 1
    seen_w[$2] = 1
    if ($2 ~ /^svc_/) { svc_w[$2] = 1; svc_e[$3] = 1 }
}
function m(n, w, e) { return med[n, w, e] + 0 }
function ratio(a, b) { return b > 0 ? a / b : 0 }
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
    printf "\n== Targets\n"
    t = m(big, "churn", "twheel")
    split("heap:3 libuv:2 libevent:2", tg, " ")
    for (i = 1; i <= 3; i++) {
        split(tg[i], pn, ":")
        have = ""
        if (t > 0 && m(big, "churn", pn[1]) > 0)
            have = sprintf("%.2f", ratio(m(big, "churn", pn[1]), t))
        target("churn at 1e6, " pn[1] " / twheel (medians)", have, ">=",
            pn[2], "%.2fx")
    }
    have = ""
    if (m(big, "memory", "twheel") > 0)
        have = sprintf("%.1f", m(big, "memory", "twheel"))
    target("core memory per pending timer at 1e6, twheel (B)", have, "<=",
        48, "%.1f")
    sb = ""
    for (k in med) {
        split(k, f, SUBSEP)
        if (f[2] == "svc_bytes_per_task" && f[3] == "twheel-service")
            sb = sprintf("%.1f", med[k])
    }
    target("service bytes per pending task (B)", sb, "<=", 48, "%.1f")
    for (k in med) {
        split(k, f, SUBSEP)
        if (f[2] == "svc_pairs_1p" && f[3] == "twheel-service") sv = best[k]
        if (f[2] == "svc_pairs_1p" && f[3] == "netty-hwt") nb = best[k]
        if (f[2] == "svc_pairs_1p" && f[3] == "twheel-service-lazy") sl = best[k]
    }
    have = ""
    if (sv > 0 && nb > 0)
        have = sprintf("%.2f", sv / nb)
    target("service / Netty HWT, schedule+cancel pairs, 1 producer (best runs)",
        have, ">=", 5, "%.2fx")
    if (sl > 0 && nb > 0)
        printf "        (with TW_SERVICE_LAZY_CLOCK: %.2fx, best runs)\n", sl / nb
    printf "%d targets: %d MET, %d MISSED, %d NOT RUN\n", ntargets,
        ntargets - missed - notrun, missed, notrun

    printf "\n== Where twheel (hierarchical) is slower than a peer at >= 1e5\n"
    slower = 0
    for (k in med) {
        split(k, f, SUBSEP)
        if (f[1] < 100000 || f[3] == "twheel" || f[2] ~ /^svc_|memory/)
            continue
        if (f[3] != "heap" && f[3] != "libuv" && f[3] != "libevent")
            continue
        t = m(f[1], f[2], "twheel")
        if (t > 0 && t > med[k] + 0) {
            printf "%-8d %-12s twheel %.1f vs %s %.1f (%.2fx slower)\n",
                f[1], f[2], t, f[3], med[k], t / med[k]
            slower++
        }
    }
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

    printf "\n== Service vs Java peers (M ops/s or as named; twheel: median of its runs, Java peers: best run; runs in brackets)\n"
    printf "%-22s", "metric"
    ne = split("twheel-service twheel-service-lazy netty-hwt jdk-stpe netty-hwt-1ms netty-hwt-100ms", es, " ")
    for (i = 1; i <= ne; i++) printf " %20s", es[i]
    printf "\n"
    nw = split("svc_schedule_1p svc_schedule_2p svc_cancel_1p svc_cancel_2p svc_pairs_1p svc_pairs_2p svc_bytes_per_task svc_idle_wakeups", ws, " ")
    for (j = 1; j <= nw; j++) {
        w = ws[j]
        if (!(w in svc_w)) continue
        printf "%-22s", w
        for (i = 1; i <= ne; i++) {
            v = ""
            for (k in med) {
                split(k, f, SUBSEP)
                if (f[2] != w || f[3] != es[i])
                    continue
                # Throughput: the best is the highest; bytes and wake-ups
                # are measured once and shown as they are.
                v = sprintf("%.2f [%d]", best[k], reps[k])
                if (w ~ /bytes|wakeups/)
                    v = sprintf("%.2f [%d]", med[k], reps[k])
            }
            printf " %20s", v == "" ? "-" : v
        }
        printf "\n"
    }
}
