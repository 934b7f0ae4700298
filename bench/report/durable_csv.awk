# SPDX-License-Identifier: MIT
# durable_csv.awk - bench_durable's "system=... op=sched ..." lines (several
# runs of each system and items per call) into results.csv rows: n = items
# per call, workload dur_sched_<items>, engine the system, items/s as the
# median, min and max of its runs.
# Usage: awk -f bench/report/durable_csv.awk durable.txt
function med(a, n,   i, j, t) {
    for (i = 2; i <= n; i++)
        for (j = i; j > 1 && a[j - 1] > a[j]; j--) {
            t = a[j]; a[j] = a[j - 1]; a[j - 1] = t
        }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
}
/^system=/ {
    delete v
    for (i = 1; i <= NF; i++) {
        split($i, kv, "=")
        v[kv[1]] = kv[2]
    }
    if (v["op"] != "sched")
        next
    k = v["system"] SUBSEP v["depth"] SUBSEP v["threads"]
    if (!(k in cnt))
        keys[++nk] = k
    x[k, ++cnt[k]] = v["ops_per_s"] + 0
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
        printf "%d,dur_sched_%d,%s,items/s,%.0f,%.0f,%.0f,%d,,,%d threads\n",
            f[2], f[2], f[1], med(a, n), lo, hi, n, f[3]
    }
}
