# SPDX-License-Identifier: MIT
# redis_csv.awk - bench_redis's fire and poll lines (several runs of each)
# into results.csv rows: n = timers, workloads redis_cpu (Redis CPU ms per
# 1000 fired timers, loading and firing) and redis_p99 (p99 lateness of
# the callbacks, ms); engines twheel-redis and poller-<interval>ms; the
# median, min and max of the runs.
# Usage: awk -f bench/report/redis_csv.awk redis.txt
function med(a, n,   i, j, t) {
    for (i = 2; i <= n; i++)
        for (j = i; j > 1 && a[j - 1] > a[j]; j--) {
            t = a[j]; a[j] = a[j - 1]; a[j - 1] = t
        }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
function add(e, w, val,   k) {
    k = e SUBSEP w
    if (!(k in cnt))
        keys[++nk] = k
    x[k, ++cnt[k]] = val + 0
}
/ timers [0-9]+ delivered / {
    e = $1 == "poll" ? "poller-" $2 "ms" : "twheel-redis"
    for (i = 1; i <= NF; i++) {
        if ($i == "timers" && $(i + 1) ~ /^[0-9]+$/) ntim = $(i + 1)
        if ($i == "p99") p99 = $(i + 1)
        if ($i == "total" && !got) { total = $(i + 1); got = 1 }
    }
    got = 0
    add(e, "redis_p99", p99)
    add(e, "redis_cpu", total)
    if ($0 ~ /delivered/) {
        split($0, dd, "delivered ")
        split(dd[2], d2, " ")
        if (d2[1] + 0 < ntim + 0) short[e] = 1
    }
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
        printf "%d,%s,%s,%s,%.2f,%.2f,%.2f,%d,,,%s\n", ntim, f[2], f[1],
            f[2] == "redis_cpu" ? "ms/1000" : "ms", med(a, n), lo, hi, n,
            short[f[1]] ? "some timers not delivered" : ""
    }
}
