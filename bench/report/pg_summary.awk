# SPDX-License-Identifier: MIT
# pg_summary.awk - the PostgreSQL round (scripts/bench_pg.sh) from its
# lines: the medians of its runs with their spread, the ratios and the
# targets of the round, each MET or MISSED (NOT RUN without the figures),
# and the load average beside each set of rows. With -v csv=1, results.csv
# rows instead (scripts/bench.sh): n = 1, workloads pg_rate_<C>x<P>
# (timers/s), pg_cpu (the server's CPU us per fired timer), pg_p99 (ms),
# pg_bytes and pg_rows (per pending timer), engine the system.
#   pgrate sys=S conns=C per_tx=P ... rate=R
#   pgfire sys=S timers=N fed_per_s=F delivered=D p50_ms= p99_ms= max_ms=
#     db_cpu_s= db_us_per_timer=
#   pgsize sys=S ... rows_per_timer=R bytes_per_timer=B
#   pgfloor rows_per_claim=R timers=N db_cpu_s= db_us_per_timer=
#   pgload at=A load=L      pgserver version=V ...
# Usage: awk -f bench/report/pg_summary.awk [-v csv=1] pg.txt
function fields(   i, kv) {
    delete v
    for (i = 2; i <= NF; i++) {
        split($i, kv, "=")
        v[kv[1]] = kv[2]
    }
}
function add(w, e, u, val,   k) {
    k = w SUBSEP e
    if (!(k in cnt)) { keys[++nk] = k; unit[k] = u }
    x[k, ++cnt[k]] = val + 0
}
# Median (and lo, hi) of row k into mm, lo, hi.
function stat(k,   i, j, t, n, a) {
    n = cnt[k]
    for (i = 1; i <= n; i++) a[i] = x[k, i]
    for (i = 2; i <= n; i++)
        for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    lo = a[1]; hi = a[n]
    mm = n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    return mm
}
function has(w, e) { return (w SUBSEP e) in cnt }
function med(w, e) { return has(w, e) ? stat(w SUBSEP e) : 0 }
function cell(w, e, fmt) {
    if (!has(w, e)) return "-"
    stat(w SUBSEP e)
    return cnt[w SUBSEP e] > 1 ? sprintf(fmt " [" fmt ".." fmt "]", mm, lo, hi) : sprintf(fmt, mm)
}
function target(what, have, op, need, fmt,   ok) {
    ntargets++
    if (have == "") {
        printf "NOT RUN %s (target %s " fmt ")\n", what, op, need
        notrun++
        return
    }
    ok = op == ">=" ? have + 0 >= need : have + 0 <= need
    if (!ok) missed++
    printf "%-7s %s: " fmt " (target %s " fmt ")\n", ok ? "MET" : "MISSED", what, have, op, need
}
/^pgserver / { fields(); pgver = v["version"] }
/^pgload / { fields(); nl++; lat[nl] = v["at"]; lval[nl] = v["load"] }
/^pgrate / {
    fields()
    add("pg_rate_" v["conns"] "x" v["per_tx"], v["sys"], "timers/s", v["rate"])
}
/^pgfire / {
    fields()
    add("pg_cpu", v["sys"], "us/timer", v["db_us_per_timer"])
    add("pg_p99", v["sys"], "ms", v["p99_ms"])
    add("pg_p50", v["sys"], "ms", v["p50_ms"])
    add("pg_delivered", v["sys"], "fraction", v["timers"] > 0 ? v["delivered"] / v["timers"] : 0)
    add("pg_fed", v["sys"], "timers/s", v["fed_per_s"])
}
/^pgwait / {
    fields()
    k = v["sys"] " " v["cell"]
    if (!(k in nwe)) wk[++nwk] = k
    if (!((k, v["event"]) in wn)) wev[k, ++nwe[k]] = v["event"]
    wn[k, v["event"]] += v["n"]
}
/^pgfloor / {
    fields()
    add("pg_floor_" v["rows_per_claim"], "floor", "us/timer", v["db_us_per_timer"])
}
/^pgsize / {
    fields()
    add("pg_bytes", v["sys"], "B/timer", v["bytes_per_timer"])
    add("pg_rows", v["sys"], "rows/timer", v["rows_per_timer"])
}
function loads(re,   i, s) {
    s = ""
    for (i = 1; i <= nl; i++)
        if (lat[i] ~ re) s = s (s == "" ? "" : ", ") lval[i]
    return s == "" ? "?" : s
}
function csv_out(   q, k, f) {
    for (q = 1; q <= nk; q++) {
        k = keys[q]
        split(k, f, SUBSEP)
        stat(k)
        printf "1,%s,%s,%s,%.2f,%.2f,%.2f,%d,,,PostgreSQL %s\n", f[1], f[2],
            unit[k], mm, lo, hi, cnt[k], pgver
    }
}
function rates(   i, j, w) {
    split("twheel-sql twheel-api gw-sql gw-node boss-node", es, " ")
    printf "-- timers scheduled per second, due in an hour (median [min..max]; load %s)\n", loads("^rates")
    printf "(twheel-sql, gw-sql: SQL functions from a C libpq client; twheel-api: the C API; gw-node, boss-node: the peers' Node APIs; 32 a transaction: one statement for SQL and the peers, tw_durable_schedule_many for the API)\n"
    printf "%-12s", "conns x tx"
    for (i = 1; i <= 5; i++) printf " %21s", es[i]
    printf " %21s %21s\n", "(sql, no NOTIFY)", "(floor)"
    split("1x1 1x32 16x1 16x32", cs, " ")
    for (j = 1; j <= 4; j++) {
        w = "pg_rate_" cs[j]
        printf "%-12s", cs[j]
        for (i = 1; i <= 5; i++) printf " %21s", cell(w, es[i], "%d")
        printf " %21s %21s\n", cell(w, "twheel-sql-nonotify", "%d"), cell(w, "floor", "%d")
    }
    if (has("pg_rate_1x32", "floor"))
        printf "(floor: the same rows, 32 in one plain multi-row INSERT from the same client into a bare table with a primary key on (ns, key) and an index on (ns, due, key): no function, no version, no NOTIFY)\n"
    waits()
}
# PG_WAITS=1: the wait events sampled during extra 1x32 and 16x32 runs,
# summed over the runs, the most seen first.
function waits(   i, j, k, e, n, t, s) {
    if (!nwk) return
    printf "-- wait events of the backends doing a statement, sampled every 10 ms, summed over the runs (PG_WAITS=1; samples, CPU: running)\n"
    for (i = 1; i <= nwk; i++) {
        k = wk[i]; n = 0
        for (j = 1; j <= nwe[k]; j++) { e[++n] = wev[k, j] }
        for (j = 2; j <= n; j++)
            for (t = j; t > 1 && wn[k, e[t - 1]] < wn[k, e[t]]; t--) { s = e[t]; e[t] = e[t - 1]; e[t - 1] = s }
        printf "%s:", k
        for (j = 1; j <= n; j++) printf "%s %s %d", (j > 1 ? "," : ""), e[j], wn[k, e[j]]
        printf "\n"
    }
}
function rate_targets(   j, w, tw, tn, p, pn, t, have, ts, ps) {
    split("1x1 1x32 16x1 16x32", cs, " ")
    for (j = 1; j <= 4; j++) {
        w = "pg_rate_" cs[j]
        tw = 0; p = 0
        split("twheel-sql twheel-api", ts, " ")
        for (t = 1; t <= 2; t++) if (med(w, ts[t]) > tw) { tw = med(w, ts[t]); tn = ts[t] }
        split("gw-sql gw-node boss-node", ps, " ")
        for (t = 1; t <= 3; t++) if (med(w, ps[t]) > p) { p = med(w, ps[t]); pn = ps[t] }
        have = tw > 0 && p > 0 ? sprintf("%.2f", tw / p) : ""
        if (have == "") {
            target("scheduled/s, " cs[j] " (connections x a transaction), twheel / the faster peer", "", ">=", 2, "%.2fx")
            continue
        }
        target(sprintf("scheduled/s, %s conns x %s a transaction, twheel (%s %d/s) / the faster peer (%s %d/s)",
            substr(cs[j], 1, index(cs[j], "x") - 1), substr(cs[j], index(cs[j], "x") + 1),
            tn, tw, pn, p), have, ">=", 2, "%.2fx")
        if (has(w, "floor"))
            printf "        (floor, a plain INSERT of the same rows into a bare table: %d/s; twheel %.2fx of it, the faster peer %.2fx: 2x the peer would be %.2fx the floor)\n",
                med(w, "floor"), tw / med(w, "floor"), p / med(w, "floor"), 2 * p / med(w, "floor")
        if (has(w, "twheel-sql-nonotify"))
            printf "        (twheel.schedule without its NOTIFY: %d/s, %.2fx twheel-sql's; the peer without NOTIFY: pg-boss)\n",
                med(w, "twheel-sql-nonotify"),
                (med(w, "twheel-sql") > 0 ? med(w, "twheel-sql-nonotify") / med(w, "twheel-sql") : 0)
    }
}
function fire_table(   i, e) {
    printf "-- firing: 2,000 timers/s asked, each due 0.5 s after it is scheduled (median [min..max]; load %s)\n", loads("^fire")
    printf "%-10s %18s %18s %24s %24s %22s\n", "system", "fed/s", "delivered",
        "p50 ms", "p99 ms", "server CPU us/timer"
    split("twheel gw gw-poll10 boss", fs, " ")
    for (i = 1; i <= 4; i++) {
        e = fs[i]
        if (!has("pg_p99", e)) continue
        printf "%-10s %18s %18s %24s %24s %22s\n", e, cell("pg_fed", e, "%d"),
            cell("pg_delivered", e, "%.2f"), cell("pg_p50", e, "%.1f"),
            cell("pg_p99", e, "%.1f"), cell("pg_cpu", e, "%.0f")
    }
    printf "(gw: graphile-worker run(), concurrency 10, pollInterval 2000 ms (its default); gw-poll10: pollInterval 10 ms; boss: pg-boss work(), pollingIntervalSeconds 0.5 (its least; default 2), batchSize 2000; twheel: one handle, default settings)\n"
}
function fire_targets(   t, g, b, best, have, p) {
    t = med("pg_cpu", "twheel"); g = med("pg_cpu", "gw"); b = med("pg_cpu", "boss")
    best = g > 0 && (b <= 0 || g < b) ? g : b
    have = t > 0 && best > 0 ? sprintf("%.2f", t / best) : ""
    target(sprintf("server CPU per fired timer at 2,000/s, twheel (%.0f us) / the lower peer's (gw %.0f, boss %.0f us)", t, g, b),
        have, "<=", 0.5, "%.2fx")
    have = has("pg_p99", "twheel") ? sprintf("%.1f", med("pg_p99", "twheel")) : ""
    target("p99 lateness at 2,000/s, twheel (ms)", have, "<=", 10, "%.1f")
    g = med("pg_p99", "gw"); b = med("pg_p99", "boss")
    p = g > 0 && (b <= 0 || g < b) ? g : b
    target(sprintf("p99 lateness, twheel (ms) no worse than either peer (gw %.1f, boss %.1f ms)", g, b),
        have == "" || p <= 0 ? "" : have, "<=", p, "%.1f")
    if (has("pg_delivered", "twheel"))
        printf "        (delivered by the drain limit: twheel %.2f, gw %.2f, boss %.2f of the timers; fed twheel %d/s, gw %d/s, boss %d/s: a backlog shows as lateness of seconds)\n",
            med("pg_delivered", "twheel"), med("pg_delivered", "gw"), med("pg_delivered", "boss"),
            med("pg_fed", "twheel"), med("pg_fed", "gw"), med("pg_fed", "boss")
    if (has("pg_floor_11", "floor"))
        printf "        (floor: the INSERT, claim UPDATE and DELETE alone from pgbench, server CPU a timer: %.0f us at 32 rows a claim, %.0f at 11, %.0f at 4 (a claim every 16, 5.5, 2 ms at 2,000/s): %.2fx, %.2fx, %.2fx the lower peer's)\n",
            med("pg_floor_32", "floor"), med("pg_floor_11", "floor"), med("pg_floor_4", "floor"),
            (best > 0 ? med("pg_floor_32", "floor") / best : 0),
            (best > 0 ? med("pg_floor_11", "floor") / best : 0),
            (best > 0 ? med("pg_floor_4", "floor") / best : 0)
    if (has("pg_p99", "gw-poll10"))
        printf "        (at graphile-worker's 10 ms poll: gw-poll10 p99 %.1f ms, %.0f us of server CPU a timer)\n",
            med("pg_p99", "gw-poll10"), med("pg_cpu", "gw-poll10")
}
function floors(   i, r) {
    if (!has("pg_floor_11", "floor")) return
    printf "-- floor: server CPU us a timer of one INSERT (32 rows), a claim UPDATE and a DELETE (R rows each) alone, from pgbench (median [min..max]; load %s)\n", loads("^floor")
    split("32 11 4", rs, " ")
    for (i = 1; i <= 3; i++) {
        r = rs[i]
        printf "R = %-6s %s\n", r, cell("pg_floor_" r, "floor", "%.0f")
    }
}
function sizes(   i, e) {
    printf "-- per pending timer: what %s timers added to each system's tables (load %s)\n",
        "the", loads("^sizes")
    split("twheel gw boss", ss, " ")
    for (i = 1; i <= 3; i++) {
        e = ss[i]
        if (!has("pg_bytes", e)) continue
        printf "%-10s rows %.2f, bytes %.1f (tables, their indexes and TOAST: pg_total_relation_size)\n",
            e, med("pg_rows", e), med("pg_bytes", e)
    }
}
# Every row where twheel's better figure is behind a peer's (rate: higher
# is better; CPU, lateness, bytes: lower).
function slower(   j, w, t, p, tv, pv, n, hb, rows, peers) {
    printf "-- where twheel is slower than a peer (medians)\n"
    split("pg_rate_1x1 pg_rate_1x32 pg_rate_16x1 pg_rate_16x32 pg_cpu pg_p99 pg_bytes", rows, " ")
    for (j = 1; j <= 7; j++) {
        w = rows[j]; hb = w ~ /^pg_rate/
        tv = 0
        if (hb) {
            tv = med(w, "twheel-sql") > med(w, "twheel-api") ? med(w, "twheel-sql") : med(w, "twheel-api")
            split("gw-sql gw-node boss-node", peers, " ")
        } else {
            tv = med(w, "twheel")
            split("gw gw-poll10 boss", peers, " ")
        }
        if (tv <= 0) continue
        for (p = 1; p <= 3; p++) {
            pv = med(w, peers[p])
            if (pv <= 0 || (hb ? tv >= pv : tv <= pv)) continue
            printf "%-14s twheel %10.1f  %-10s %10.1f  %.2fx\n", w, tv, peers[p], pv,
                hb ? pv / tv : tv / pv
            n++
        }
    }
    if (!n) printf "none\n"
}
END {
    if (csv) { csv_out(); exit }
    printf "\n== PostgreSQL round: twheel beside graphile-worker and pg-boss (PostgreSQL %s, synchronous_commit on, fsync on)\n", pgver
    rates()
    fire_table()
    sizes()
    floors()
    printf "-- targets\n"
    rate_targets()
    fire_targets()
    printf "%d PostgreSQL targets: %d MET, %d MISSED, %d NOT RUN\n", ntargets,
        ntargets - missed - notrun, missed, notrun
    slower()
}
