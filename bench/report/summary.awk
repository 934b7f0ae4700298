# SPDX-License-Identifier: MIT
# summary.awk - the headline figures and the targets, each marked MET or
# MISSED (NOT RUN when the run lacks the figures), from results.csv, and
# every row of every round where twheel is slower than a peer; each
# missed target and slower row with the measurements that say why (the
# device's fdatasync latency, items per fdatasync, a server's round trip
# without its store, the memory's floor under a churn pair, CPU and
# run-queue time, the load average when the round started).
# Like is compared with like: every figure is the median of its runs,
# beside the peers' medians of theirs, with the spread (min..max of the
# runs) printed where a round has several; throughput (Mops/s, items/s) is
# better higher, everything else (ns, ms, bytes, wake-ups) lower.
# Usage: awk -F, -f bench/report/summary.awk [-v loads=loads.txt] results.csv
#   loads.txt: "stage name,load average" lines (scripts/bench.sh).
BEGIN {
    if (loads != "")
        while ((getline ln < loads) > 0) {
            i = match(ln, /,[^,]*$/)
            if (!i) continue
            nloads++
            lname[nloads] = substr(ln, 1, i - 1)
            lval[nloads] = substr(ln, i + 1)
        }
}
NR == 1 { next }
{
    key = $1 SUBSEP $2 SUBSEP $3
    med[key] = $5; lo[key] = $6; hi[key] = $7; reps[key] = $8
    unit[key] = $4; seen_n[$1] = 1; seen_w[$2] = 1
    if ($2 ~ /^svc_/) { svc_w[$2] = 1; svc_e[$3] = 1; svc_n = $1 }
    if ($2 ~ /^dur_/) { dur_w[$2] = 1; dur_n[$2] = $1 }
    if ($2 ~ /^redis_/) redis_n = $1
    if ($2 ~ /^bs_(delayed|restart)_/) bs_n = $1
}
# The load average when the first stage whose name matches re started.
function load_of(re,   i) {
    for (i = 1; i <= nloads; i++)
        if (lname[i] ~ re) return lval[i]
    return "?"
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
    if (!ok) {
        nmiss++
        miss_line[nmiss] = sprintf("%s: " fmt " (target %s " fmt ")", what,
            have, op, need)
        miss_why[nmiss] = why
    }
    if (why != "")
        printf "        (%s)\n", why
    why = ""
}
# A ratio target between two medians of one workload: a / b.
# The load average when the stage of workload w started.
function row_load(w) {
    if (w ~ /^svc_/)
        return "load " load_of("^service") " (service), " load_of("^Java") " (Java peers)"
    if (w ~ /^redis_/)
        return "load " load_of("^Redis")
    return "load " load_of("^core")
}
# Its why (printed under it, and under a miss in the list of misses):
# both sides' medians and spreads, and the load of their stage.
function rtarget(what, w, a, b, op, need,   x, y, have) {
    x = mw(w, a); y = mw(w, b); have = ""
    if (x > 0 && y > 0) {
        have = sprintf("%.2f", x / y)
        why = sprintf("%s %g [%s]; %s %g [%s]; %s", a, x, spread(w, a), b, y,
            spread(w, b), row_load(w))
    }
    target(what, have, op, need, "%.2fx")
}
# The bare poller at 100 ms beside twheel at 1 ms precision: context, not
# a target (the targets are the equal-precision cells below).
function redis_context(   x, y) {
    why = "" # a why left by a round not in this run is not the Redis rows'
    x = mw("redis_cpu", "twheel-redis"); y = mw("redis_cpu", "poller-100ms")
    if (x <= 0 || y <= 0) return
    printf "CONTEXT Redis CPU per fired timer, twheel / bare poller: %.2fx (not a target: unequal precision)\n", x / y
    printf "        (twheel %g ms/1000 at p99 %.1f ms; the at-most-once poller polling every 100 ms %g ms/1000 at p99 %.1f ms; load %s)\n",
        x, mw("redis_p99", "twheel-redis"), y, mw("redis_p99", "poller-100ms"),
        load_of("^Redis")
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
    srt[++slower] = sprintf("%d %012d %s %s %s", w ~ /^svc_/ ? 2 : w ~ /^dur_/ ? 3 : w ~ /^bs_/ ? 4 : w ~ /^redis_/ ? 5 : 1, n, w, t, p)
    line[slower] = sprintf("%-9s %-18s %-20s %10.2f  %-16s %10.2f %-8s %.2fx%s", n, w, t, a, p,
        b, u, higher_better(u) ? b / a : a / b,
        ov ? "  (spreads overlap)" : reps[n, w, t] + 0 <= 1 ? "  (one run each)" : "")
    whyr = row_why(n, w)
    if (whyr != "") line[slower] = line[slower] "\n          why: " whyr
}
# The measurements that explain a slower row, where the run has them.
function row_why(n, w,   r) {
    if (w ~ /^bs_put_f0/)
        return sprintf("device fdatasync p50 %.1f us (%.0f/s); %s; load %s",
            mw("dev_fdatasync_bs", "device"), syncs_per_s("dev_fdatasync_bs"),
            bs_rtt(), load_of("^twheeld"))
    if (w ~ /^bs_(put|reserve|ping)/)
        return bs_rtt() "; load " load_of("^twheeld")
    if (w ~ /^bs_late/)
        return sprintf("lateness ms p50 %d / %d, p99 %d / %d, max %d / %d (twheeld / beanstalkd); load %s",
            bs("late_p50_steady", "twheeld"), bs("late_p50_steady", "beanstalkd"),
            bs("late_p99_steady", "twheeld"), bs("late_p99_steady", "beanstalkd"),
            bs("late_max_steady", "twheeld"), bs("late_max_steady", "beanstalkd"),
            load_of("^twheeld"))
    if (w ~ /^bs_delayed/)
        return sprintf("per job: resident %d / %d B, disk %d / %d B (twheeld / beanstalkd)",
            bs("delayed_rss_b_per_job", "twheeld"), bs("delayed_rss_b_per_job", "beanstalkd"),
            bs("delayed_disk_b_per_job", "twheeld"), bs("delayed_disk_b_per_job", "beanstalkd"))
    if (w ~ /^bs_restart/)
        return sprintf("CPU until stats answered: twheeld %.2f s, beanstalkd %.2f s; waiting for a CPU: %.2f s, %.2f s",
            bs("restart_cpu_s", "twheeld"), bs("restart_cpu_s", "beanstalkd"),
            bs("restart_rq_s", "twheeld"), bs("restart_rq_s", "beanstalkd"))
    if (w ~ /^dur_/)
        return sprintf("device fdatasync p50 %.1f us; items per fdatasync at 1 per call: 1 thread %.2f, 4 threads %.2f; load %s",
            mw("dev_fdatasync_dur", "device"), mw("dur_per_sync_1_1t", "twheel-group"),
            mw("dur_per_sync_1", "twheel-group"), load_of("^durable"))
    if (w ~ /^churn/ && n + 0 == big)
        return churn_floor(m(big, "churn", "twheel"), m(big, "churn", "heap"))
    return row_load(w)
}
# Why churn at 1e6 is where it is: the floor under a pair is its
# instructions and cache hits (churn at 1e5, whose 4 MB fit in the
# caches) plus three loads from random lines of 40 MB (the timer
# cancelled, a random pick, and its two list neighbours, which the unlink
# writes), at the best throughput of random loads measured (16 in
# flight); both layouts (8 lists per slot, 1 list) beside the heap in
# alternating runs; and what the wheel's promises cost a pair
# (bench/churn_floor: the bare list operations, then the argument
# checks and the exact count, then the wheel's calls, beside the heap in
# one process, CPU time).
function churn_floor(t, hp,   c5, best, lat, k, f, t8, h8, t1, h1, fl, r) {
    c5 = m(100000, "churn", "twheel"); best = 0; lat = 0
    for (k in med) {
        split(k, f, SUBSEP)
        if (f[2] != "dram_load") continue
        if (f[3] == "chains1") lat = med[k] + 0
        if (best == 0 || med[k] + 0 < best) best = med[k] + 0
    }
    t8 = m(big, "churn_8lists", "twheel"); h8 = m(big, "churn_8lists", "heap")
    t1 = m(big, "churn_1list", "twheel-1list"); h1 = m(big, "churn_1list", "heap")
    if (t <= 0 || hp <= 0) return ""
    r = sprintf("twheel %.1f ns, heap %.1f ns: 3x needs <= %.1f ns", t, hp, hp / 3)
    if (t8 > 0 && h8 > 0 && t1 > 0 && h1 > 0)
        r = r sprintf("; both layouts beside the heap, 3 alternating runs: 8 lists per slot %.1f ns [%s] against %.1f: %.2fx; 1 list per slot %.1f ns [%s] against %.1f: %.2fx",
            t8, spread("churn_8lists", "twheel"), h8, h8 / t8, t1,
            spread("churn_1list", "twheel-1list"), h1, h1 / t1)
    if (c5 > 0 && best > 0) {
        fl = c5 + 3 * best
        r = r sprintf("; memory floor: churn at 1e5 (cache-resident) %.1f ns + 3 random loads of 64 MiB (the timer and its two neighbours) at the best throughput %.1f ns each (latency %.1f ns, one in flight) = %.1f ns: %s", c5, best, lat, fl,
            fl > hp / 3 ? "3x is below the floor on this machine" : "the memory allows 3x")
    }
    return r churn_promises()
}
# The churn_floor rows: heap / each engine, CPU time per pair.
function churn_promises(   hc, l, c, w) {
    hc = m(big, "churn_floor", "heap"); l = m(big, "churn_floor", "lists")
    c = m(big, "churn_floor", "+count"); w = m(big, "churn_floor", "twheel")
    if (hc <= 0 || l <= 0 || c <= 0 || w <= 0) return ""
    return sprintf("; what the promises cost (bench/churn_floor.c, one process, CPU ns per pair, heap %.1f): the bare list operations %.1f = %.2fx the heap; with the argument checks and the exact count of pending timers %.1f = %.2fx; the wheel's calls (those, and a slot's 8 lists, and a pending timer's move) %.1f = %.2fx%s",
        hc, l, hc / l, c, hc / c, w, hc / w,
        hc / l < 3 ? ": 3x is below even the bare list operations here" : "")
}
# The device's fdatasyncs per second from workload w's p50 latency.
function syncs_per_s(w,   us) {
    us = mw(w, "device")
    return us > 0 ? 1e6 / us : 0
}
# One durable target against the device: twheel-group at workload w
# (threads t) against need x threads x fdatasyncs/s. The journal runs one
# fdatasync at a time (two at once on one file each took about twice as
# long on this disk: BENCHMARKS.md, fsync_probe THREADS), so each of its
# syncs is the device's time plus the gap before the next one starts
# (wake-ups, the callers' next appends, the gather).
function device_target(what, w, t, need,   dev, r, have, ips, p50, cyc, d) {
    dev = syncs_per_s("dev_fdatasync_dur"); r = mw(w, "twheel-group")
    have = dev > 0 && r > 0 ? sprintf("%.2f", r / (t * dev)) : ""
    ips = mw("dur_per_sync_" substr(w, 11), "twheel-group")
    p50 = mw("dur_p50_" substr(w, 11), "twheel-group")
    cyc = ips > 0 && r > 0 ? 1e6 * ips / r : 0
    d = mw("dev_fdatasync_dur", "device")
    if (have != "")
        why = sprintf("%d items/s [%s] against %d x %.0f fdatasyncs/s (the probe's p50 %.1f us, preallocated file); %.2f items per fdatasync, so the journal ran %.0f fdatasyncs/s, one at a time: %.1f us each%s; a call took %.1f us at the median; load %s",
            r, spread(w, "twheel-group"), t, dev, d, ips,
            ips > 0 ? r / ips : 0, cyc,
            cyc >= d ? sprintf(" = the probe's %.1f + %.1f us between syncs", d, cyc - d) : sprintf(", less than the probe's %.1f: the disk was busier during the probes than during the runs", d),
            p50, load_of("^durable"))
    target(what, have, ">=", need, "%.2fx")
}
function durable_targets(   g, iv, ca, cr, w, i) {
    printf "-- durable store (twheel's journal; the device's limit measured in the run; 64-byte payloads)\n"
    device_target("SYNC_GROUP 1 per call, 1 thread, items/s / (1 x fdatasyncs/s)",
        "dur_sched_1_1t", 1, 0.75)
    device_target("SYNC_GROUP 1 per call, 4 threads, items/s / (4 x fdatasyncs/s)",
        "dur_sched_1", 4, 0.75)
    g = mw("dur_sched_32", "twheel-group"); iv = mw("dur_sched_32", "twheel-interval")
    ips = mw("dur_per_sync_32", "twheel-group")
    if (g > 0 && iv > 0 && ips > 0)
        why = sprintf("SYNC_GROUP %d/s [%s] = %.1f items per fdatasync (%.1f calls of the 4 threads' at most 4) x %.0f fdatasyncs/s the journal ran; 0.5x SYNC_INTERVAL's %d/s [%s] needs %.0f items per fdatasync at that rate, 4 threads x 32 give at most 128; load %s",
            g, spread("dur_sched_32", "twheel-group"), ips, ips / 32, g / ips,
            iv, spread("dur_sched_32", "twheel-interval"),
            0.5 * iv / (g / ips), load_of("^durable"))
    target("SYNC_GROUP 32 per call / SYNC_INTERVAL 32 per call (4 threads)",
        g > 0 && iv > 0 ? sprintf("%.2f", g / iv) : "", ">=", 0.5, "%.2fx")
    split("1 32", dps, " ")
    for (i = 1; i <= 2; i++) {
        w = "dur_cpu_" dps[i]
        ca = mw(w, "twheel-group"); cr = mw(w, "redis-always")
        if (ca > 0 && cr > 0)
            why = sprintf("CPU us per acknowledged item: SYNC_GROUP %.2f [%s] (the process: callers and writer); Redis always %.2f [%s] (client + server); SYNC_INTERVAL %.2f, Redis everysec %.2f%s",
                ca, spread(w, "twheel-group"), cr, spread(w, "redis-always"),
                mw(w, "twheel-interval"), mw(w, "redis-everysec"),
                sync_cpu_floor(dps[i], cr, 0.2))
        target("CPU per item, SYNC_GROUP / Redis always, " dps[i] " per call (4 threads)",
            ca > 0 && cr > 0 ? sprintf("%.2f", ca / cr) : "", "<=", 0.2, "%.2fx")
    }
}
# The device's part of SYNC_GROUP's CPU per item at @d items per call:
# the caller's CPU per pwrite+fdatasync (fsync_probe) over the items each
# fdatasync carried, against @need x Redis always's @cr; then that plus
# SYNC_INTERVAL's CPU per item (the same calls, none waiting for the
# disk): what SYNC_GROUP costs before its callers wait, and the wait's
# own part (sleeps, wake-ups, the gather), the rest.
function sync_cpu_floor(d, cr, need,   c, ips, f, iv, g) {
    c = mw("dev_fdatasync_cpu_dur", "device")
    ips = mw("dur_per_sync_" d, "twheel-group")
    if (c <= 0 || ips <= 0) return ""
    f = c / ips
    iv = mw("dur_cpu_" d, "twheel-interval"); g = mw("dur_cpu_" d, "twheel-group")
    return sprintf("; floor: one pwrite+fdatasync took %.1f us of the caller's CPU (fsync_probe), %.1f items per fdatasync make %.2f us an item = %.2fx Redis always%s%s",
        c, ips, f, f / cr, f / cr > need ? sprintf(", above the %gx target before any work of the store's own", need) : sprintf(", the store's own work the other %.2f us", g - f),
        iv > 0 ? sprintf("; with SYNC_INTERVAL's %.2f us an item (the same calls, no wait for the disk) %.2f us = %.2fx Redis always%s%s", iv, iv + f, (iv + f) / cr, (iv + f) / cr > need ? sprintf(", above the %gx target", need) : "", g >= iv + f ? sprintf(", the wait itself %.2f us", g - iv - f) : "") : "")
}
# A twheeld round row's two values, twheeld and beanstalkd.
function bs(row, srv) { return mw("bs_" row, srv) }
function bs_rtt() {
    return sprintf("a round trip without the store (use), 1 connection: twheeld %.1f us, beanstalkd %.1f us",
        bs("ping_us_c1", "twheeld"), bs("ping_us_c1", "beanstalkd"))
}
# twheeld / beanstalkd (inv: beanstalkd / twheeld) on a row, >= or <= need.
function bs_target(what, row, op, need, inv,   a, b, have) {
    a = bs(row, "twheeld"); b = bs(row, "beanstalkd"); have = ""
    if (a > 0 && b > 0) have = sprintf("%.2f", inv ? b / a : a / b)
    if (why == "" && have != "")
        why = sprintf("twheeld %g, beanstalkd %g %s", a, b, unit_of("bs_" row))
    target(what, have, op, need, "%.2fx")
}
# The floor on a rate row: what bench/bstalk_floor.c (a server that keeps
# nothing) answered the same client, against beanstalkd's @b and the
# target's factor @need.
function bs_floor(row, b, need,   f) {
    f = bs(row, "floor")
    if (f <= 0 || b <= 0) return ""
    return sprintf("; floor: a server that keeps nothing (bench/bstalk_floor.c) answered %d/s = %.2fx beanstalkd%s",
        f, f / b, f / b < need ? sprintf(", so %gx beanstalkd is above what any server reached with this client here", need) : "")
}
function unit_of(w,   k, f) {
    for (k in unit) {
        split(k, f, SUBSEP)
        if (f[2] == w) return unit[k]
    }
    return ""
}
# The servers' CPU per put on a row (bench_twheeld.sh's cpu_ rows), when
# the run has them.
function bs_cpu(row,   a, b) {
    a = bs("cpu_" row, "twheeld"); b = bs("cpu_" row, "beanstalkd")
    if (a <= 0 || b <= 0) return ""
    return sprintf("; server CPU per put (user + system): twheeld %.1f us, beanstalkd %.1f us", a, b)
}
function twheeld_targets(   dev, a, b, us, c, rows, i, ld) {
    ld = load_of("^twheeld")
    printf "-- twheeld beside beanstalkd (alternating runs, 64-byte bodies; load %s; %s delayed jobs)\n",
        ld, bs_n == "" ? "-" : bs_n
    dev = syncs_per_s("dev_fdatasync_bs"); a = bs("put_f0_c1", "twheeld")
    if (dev > 0 && a > 0)
        why = sprintf("a put took %.1f us (beanstalkd %.1f) against fdatasync p50 %.1f us; %s",
            1e6 / a, bs("put_f0_c1", "beanstalkd") > 0 ? 1e6 / bs("put_f0_c1", "beanstalkd") : 0,
            mw("dev_fdatasync_bs", "device"), bs_rtt())
    if (dev > 0 && a > 0 && bs("put_f0_c1", "floor") > 0)
        why = why sprintf("; floor: a server that only writes and fdatasyncs (bench/bstalk_floor.c -b) answered %d/s = %.2fx the device%s",
            bs("put_f0_c1", "floor"), bs("put_f0_c1", "floor") / dev,
            bs("put_f0_c1", "floor") / dev < 0.75 ? ", so 0.75x is above what any server reached with this client here" : "")
    target("twheeld -f 0 puts, 1 connection / fdatasyncs/s",
        dev > 0 && a > 0 ? sprintf("%.2f", a / dev) : "", ">=", 0.75, "%.2fx")
    for (c = 16; c <= 64; c *= 4) {
        a = bs("put_f0_c" c, "twheeld"); b = bs("put_f0_c" c, "beanstalkd")
        if (dev > 0 && a > 0 && b > 0)
            why = sprintf("twheeld %d/s = %.1f puts per fdatasync time; beanstalkd %d/s = %.2f (device %.0f fdatasyncs/s)%s%s",
                a, a / dev, b, b / dev, dev, bs_cpu("put_f0_c" c),
                bs_floor("put_f0_c" c, b, 5))
        bs_target("twheeld / beanstalkd, -f 0 puts, " c " connections",
            "put_f0_c" c, ">=", 5, 0)
    }
    split("put_f1000_c1 put_f1000_c16 reserve_f1000_c1 reserve_f1000_c16", rows, " ")
    for (i = 1; i <= 4; i++) {
        a = bs(rows[i], "twheeld"); b = bs(rows[i], "beanstalkd")
        if (a > 0 && b > 0)
            why = sprintf("twheeld %d/s, beanstalkd %d/s; %s%s", a, b, bs_rtt(),
                bs_floor(rows[i], b, 2))
        bs_target("twheeld / beanstalkd, " rows[i], rows[i], ">=", 2, 0)
    }
    why = sprintf("resident bytes per delayed job (what the jobs added to the empty server): twheeld %d, beanstalkd %d; in all %d MB and %d MB",
        bs("delayed_rss_b_per_job", "twheeld"), bs("delayed_rss_b_per_job", "beanstalkd"),
        bs("delayed_rss_mb", "twheeld"), bs("delayed_rss_mb", "beanstalkd"))
    bs_target("twheeld / beanstalkd, resident memory the delayed jobs added",
        "delayed_rss_b_per_job", "<=", 0.5, 0)
    why = sprintf("disk in all (preallocated files included) per delayed job: twheeld %d B, beanstalkd %d B; in all %d MB and %d MB",
        bs("delayed_disk_b_per_job", "twheeld"), bs("delayed_disk_b_per_job", "beanstalkd"),
        bs("delayed_disk_mb", "twheeld"), bs("delayed_disk_mb", "beanstalkd"))
    bs_target("twheeld / beanstalkd, disk with the delayed jobs",
        "delayed_disk_b_per_job", "<=", 0.5, 0)
    if (bs("restart_s", "twheeld") > 0)
        why = sprintf("until stats answers: twheeld %.2f s (CPU %.2f s, waiting for a CPU %.2f s), beanstalkd %.2f s (CPU %.2f s, waiting %.2f s)",
            bs("restart_s", "twheeld"), bs("restart_cpu_s", "twheeld"),
            bs("restart_rq_s", "twheeld"), bs("restart_s", "beanstalkd"),
            bs("restart_cpu_s", "beanstalkd"), bs("restart_rq_s", "beanstalkd"))
    bs_target("beanstalkd / twheeld, restart after kill -9 until stats answers",
        "restart_s", ">=", 2, 1)
    a = bs("late_p99_steady", "twheeld"); b = bs("late_p99_steady", "beanstalkd")
    have = ""
    if (("1", "bs_late_p99_steady", "twheeld") in med &&
        ("1", "bs_late_p99_steady", "beanstalkd") in med) {
        have = sprintf("%d", a)
        why = sprintf("p99 twheeld %d ms [%s], beanstalkd %d ms [%s]; p50 %d and %d ms; max %d and %d ms; load %s",
            a, spread("bs_late_p99_steady", "twheeld"), b,
            spread("bs_late_p99_steady", "beanstalkd"),
            bs("late_p50_steady", "twheeld"), bs("late_p50_steady", "beanstalkd"),
            bs("late_max_steady", "twheeld"), bs("late_max_steady", "beanstalkd"),
            load_of("^twheeld"))
    }
    target("lateness p99 of delayed jobs put at a steady rate, twheeld (ms) <= beanstalkd's",
        have, "<=", b, "%d")
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
        if (pn[1] == "heap") why = churn_floor(t, m(big, "churn", "heap"))
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
    durable_targets()
    twheeld_targets()
    printf "-- Redis backend (%s timers per run)\n", redis_n == "" ? "-" : redis_n
    redis_context()
    rtarget("p99 lateness, poller / twheel", "redis_p99", "poller-100ms",
        "twheel-redis", ">=", 10)
    for (gi = 5; gi <= 100; gi += 95) {
        rtarget("Redis CPU at equal precision, G " gi " ms, twheel / lease-poller",
            "redis_cpu", "twgap-" gi "ms", "lpoller-" gi "ms", "<=", 0.8)
        rtarget("p99 lateness at equal precision, G " gi " ms, lease-poller / twheel",
            "redis_p99", "lpoller-" gi "ms", "twgap-" gi "ms", ">=", 1)
    }
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
            # Like with like: every call on stable storage, or synced
            # within a second.
            if (e == "redis-always") slower_row(n, w, "twheel-group", e)
            if (e == "redis-everysec") slower_row(n, w, "twheel-interval", e)
        } else if (w ~ /^redis_/) {
            if (e ~ /^poller/) slower_row(n, w, "twheel-redis", e)
            if (e ~ /^lpoller-/) slower_row(n, w, "twgap-" substr(e, 9), e)
        } else if (w ~ /^bs_/) {
            if (e != "beanstalkd" || w ~ /_rq_s$/) continue
            slower_row(n, w, "twheeld", e)
        } else if (w ~ /^(dev|dram)_/) {
            continue
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

    printf "\n== Targets missed, and why (measured in this run)\n"
    for (i = 1; i <= nmiss; i++) {
        print miss_line[i]
        if (miss_why[i] != "") print "    why: " miss_why[i]
    }
    if (!nmiss) printf "none\n"
    if (nloads) {
        printf "\n== Load average (1 min) when each stage started\n"
        for (i = 1; i <= nloads; i++) printf "%-60s %s\n", lname[i], lval[i]
    }

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

    printf "\n== Durable store: items/s, CPU us per item, items per fdatasync (median [min..max] of its runs)\n"
    printf "device: fdatasync p50 %.1f us on a preallocated file = %.0f fdatasyncs/s (median of the probes beside the runs)\n",
        mw("dev_fdatasync_dur", "device"), syncs_per_s("dev_fdatasync_dur")
    printf "%-22s %22s %22s %22s %22s\n", "row", "twheel-group",
        "twheel-interval", "redis-always", "redis-everysec"
    split("twheel-group twheel-interval redis-always redis-everysec", de, " ")
    nr = split("dur_sched_1_1t dur_sched_1 dur_sched_32 dur_cpu_1_1t dur_cpu_1 dur_cpu_32 dur_per_sync_1_1t dur_per_sync_1 dur_per_sync_32 dur_p50_1_1t dur_p50_1 dur_p50_32", drow, " ")
    for (i = 1; i <= nr; i++) {
        w = drow[i]
        if (!(w in dur_w)) continue
        printf "%-22s", w
        for (j = 1; j <= 4; j++)
            printf " %22s", cell(w, de[j], w ~ /sched/ ? "%d [%d..%d]" : "%.2f [%.2f..%.2f]")
        printf "\n"
    }
    printf "(dur_sched_D: items/s, D items per call, 4 threads (_1t: 1 thread); dur_cpu: CPU us per acknowledged item (Redis: client + server); dur_per_sync: items per fdatasync; dur_p50: us per call. SYNC_GROUP and Redis always: every acknowledged call on stable storage; SYNC_INTERVAL and Redis everysec: written, synced within 1 s)\n"

    printf "\n== twheeld beside beanstalkd (median [min..max] of alternating runs; the delayed jobs one run; 64-byte bodies)\n"
    printf "%-22s %22s %22s %8s %-8s %s\n", "row", "twheeld", "beanstalkd", "ratio", "unit", "floor (bstalk_floor)"
    nr = split("ping_us_c1 put_f0_c1 put_f0_c16 put_f0_c64 put_f1000_c1 put_f1000_c16 reserve_f1000_c1 reserve_f1000_c16 late_p50_steady late_p99_steady late_max_steady delayed_rss_mb delayed_disk_mb delayed_rss_b_per_job delayed_disk_b_per_job restart_s restart_cpu_s restart_rq_s", brow, " ")
    for (i = 1; i <= nr; i++) {
        a = bs(brow[i], "twheeld"); b = bs(brow[i], "beanstalkd")
        u = unit_of("bs_" brow[i])
        if (u == "") continue
        printf "%-22s %22s %22s %8s %-8s %s\n", brow[i],
            cell("bs_" brow[i], "twheeld", "%g [%g..%g]"),
            cell("bs_" brow[i], "beanstalkd", "%g [%g..%g]"),
            (b > 0 ? sprintf("%.2fx", a / b) : "-"), u,
            (bs(brow[i], "floor") > 0 ? cell("bs_" brow[i], "floor", "%g [%g..%g]") : "")
    }
    if (mw("dev_fdatasync_bs", "device") > 0)
        printf "device: fdatasync p50 %.1f us = %.0f fdatasyncs/s (median of the probes before and after the fdatasync rows)\n",
            mw("dev_fdatasync_bs", "device"), syncs_per_s("dev_fdatasync_bs")

    printf "\n== Redis backend against the sorted-set poller (median [min..max] of its runs)\n"
    printf "%-34s %24s %24s\n", "metric", "twheel-redis", "poller-100ms"
    printf "%-34s %24s %24s\n", "Redis CPU ms per 1000 fired timers",
        cell("redis_cpu", "twheel-redis", "%.2f [%.2f..%.2f]"),
        cell("redis_cpu", "poller-100ms", "%.2f [%.2f..%.2f]")
    printf "%-34s %24s %24s\n", "p99 lateness, ms",
        cell("redis_p99", "twheel-redis", "%.2f [%.2f..%.2f]"),
        cell("redis_p99", "poller-100ms", "%.2f [%.2f..%.2f]")
    printf "\n== At equal precision: twheel with check gap G beside the lease-poller polling every G\n"
    printf "%-34s %24s %24s\n", "metric", "twheel", "lease-poller"
    for (gi = 5; gi <= 100; gi += 95) {
        printf "%-34s %24s %24s\n", "G " gi " ms: Redis CPU ms/1000",
            cell("redis_cpu", "twgap-" gi "ms", "%.2f [%.2f..%.2f]"),
            cell("redis_cpu", "lpoller-" gi "ms", "%.2f [%.2f..%.2f]")
        printf "%-34s %24s %24s\n", "G " gi " ms: p99 lateness, ms",
            cell("redis_p99", "twgap-" gi "ms", "%.2f [%.2f..%.2f]"),
            cell("redis_p99", "lpoller-" gi "ms", "%.2f [%.2f..%.2f]")
    }
}
