# SPDX-License-Identifier: MIT
# rounds_csv.awk - the durable and Redis rounds' output (several runs of
# each system) into results.csv rows, each the median, min and max of its
# runs:
#   bench_durable "system=S op=sched threads=T depth=D ... ops_per_s=X":
#     n = D (items per call), workload dur_sched_D, engine S, items/s;
#   bench_redis "twheel ..." / "poll 100 ms ..." lines: n = timers,
#     workloads redis_cpu (Redis CPU ms per 1000 fired timers, loading and
#     firing) and redis_p99 (p99 lateness of the callbacks, ms), engines
#     twheel-redis and poller-<interval>ms.
# Usage: awk -f bench/report/rounds_csv.awk durable.txt redis.txt
function med(a, n,   i, j, t) {
    for (i = 2; i <= n; i++)
        for (j = i; j > 1 && a[j - 1] > a[j]; j--) {
            t = a[j]; a[j] = a[j - 1]; a[j - 1] = t
        }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
# One run's figure: row (n, workload, engine), its unit, note and value.
function add(n, w, e, u, note, val,   k) {
    k = n SUBSEP w SUBSEP e
    if (!(k in cnt)) {
        keys[++nk] = k
        unit[k] = u
        notes[k] = note
    }
    x[k, ++cnt[k]] = val + 0
}
/^system=/ {
    delete v
    for (i = 1; i <= NF; i++) {
        split($i, kv, "=")
        v[kv[1]] = kv[2]
    }
    if (v["op"] == "sched")
        add(v["depth"], "dur_sched_" v["depth"], v["system"], "items/s",
            v["threads"] " threads", v["ops_per_s"])
    next
}
/ timers [0-9]+ delivered / {
    e = $1 == "poll" ? "poller-" $2 "ms" : "twheel-redis"
    got = 0
    for (i = 1; i <= NF; i++) {
        if ($i == "timers" && $(i + 1) ~ /^[0-9]+$/) ntim = $(i + 1)
        if ($i == "delivered") dlv = $(i + 1)
        if ($i == "p99") p99 = $(i + 1)
        if ($i == "total" && !got) { total = $(i + 1); got = 1 }
    }
    note = dlv + 0 < ntim + 0 ? "some timers not delivered" : ""
    add(ntim, "redis_cpu", e, "ms/1000", note, total)
    add(ntim, "redis_p99", e, "ms", note, p99)
}
END {
    for (q = 1; q <= nk; q++) {
        k = keys[q]
        split(k, f, SUBSEP)
        n = cnt[k]
        lo = hi = x[k, 1]
        for (i = 1; i <= n; i++) {
            a[i] = x[k, i]
            if (a[i] < lo) lo = a[i]
            if (a[i] > hi) hi = a[i]
        }
        printf "%s,%s,%s,%s,%.2f,%.2f,%.2f,%d,,,%s\n", f[1], f[2], f[3],
            unit[k], med(a, n), lo, hi, n, notes[k]
    }
}
