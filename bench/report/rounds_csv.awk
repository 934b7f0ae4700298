# SPDX-License-Identifier: MIT
# rounds_csv.awk - the durable, twheeld and Redis rounds' output (several
# runs of each system) into results.csv rows, each the median, min and max
# of its runs:
#   bench_durable "system=S op=sched threads=T depth=D ... ops_per_s=X
#     cpu_s=C [srv_cpu_s=R]": n = D (items per call), workload dur_sched_D
#     (4 threads; other thread counts dur_sched_D_Tt), engine S, items/s;
#     dur_cpu_D[_Tt], CPU us per acknowledged item ((C + R) / items: the
#     process's, plus the server's for Redis); dur_p50_D[_Tt], the median
#     latency of one call (us); the "  syncs=N" line after
#     it: dur_per_sync_D[_Tt], items per fdatasync;
#   "system=device op=fdatasync at=A p50_us=X" (scripts/bench.sh's
#     fdatasync_probe): n = 1, workload dev_fdatasync_dur (the durable
#     round's probes) or dev_fdatasync_bs (at=twheeld), engine device, us;
#     with cpu_us=C also dev_fdatasync_cpu_dur (_bs): the caller's CPU us
#     per call;
#   scripts/bench_twheeld.sh ONLY=main "bstalk srv=S row=R value=V unit=U":
#     n = the -v delayed count for the delayed_* and restart_* rows, else
#     1; workload bs_R, engine S (twheeld, beanstalkd);
#   bench_redis "twheel ..." / "poll 100 ms ..." lines: n = timers,
#     workloads redis_cpu (Redis CPU ms per 1000 fired timers, loading and
#     firing) and redis_p99 (p99 lateness of the callbacks, ms), engines
#     twheel-redis and poller-<interval>ms; the equal-precision cells of
#     scripts/bench.sh's Redis round ("twgap G ms ...", "lpoll G ms ...")
#     as twgap-<G>ms and lpoller-<G>ms.
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
function fields(   i, kv) {
    delete v
    for (i = 1; i <= NF; i++) {
        split($i, kv, "=")
        v[kv[1]] = kv[2]
    }
}
/^system=device / {
    fields()
    add(1, v["at"] == "twheeld" ? "dev_fdatasync_bs" : "dev_fdatasync_dur",
        "device", "us", "fdatasync p50 on a preallocated file", v["p50_us"])
    if (v["cpu_us"] != "")
        add(1, v["at"] == "twheeld" ? "dev_fdatasync_cpu_bs" : "dev_fdatasync_cpu_dur",
            "device", "us", "caller CPU per pwrite+fdatasync", v["cpu_us"])
    next
}
/^system=/ {
    fields()
    last_w = ""
    if (v["op"] != "sched")
        next
    sfx = v["threads"] == 4 ? "" : "_" v["threads"] "t"
    add(v["depth"], "dur_sched_" v["depth"] sfx, v["system"], "items/s",
        v["threads"] " threads", v["ops_per_s"])
    if (v["ops"] + 0 > 0 && "cpu_s" in v)
        add(v["depth"], "dur_cpu_" v["depth"] sfx, v["system"], "us/item",
            v["threads"] " threads", (v["cpu_s"] + v["srv_cpu_s"]) * 1e6 / v["ops"])
    add(v["depth"], "dur_p50_" v["depth"] sfx, v["system"], "us",
        v["threads"] " threads", v["p50_us"])
    # Items per fdatasync: SYNC_GROUP's (the interval's syncs are a clock's).
    if (v["system"] == "twheel-group")
        last_w = v["depth"] sfx
    last_n = v["depth"]; last_e = v["system"]
    last_ops = v["ops"]; last_t = v["threads"]
    next
}
/^  syncs=/ && last_w != "" {
    split($1, kv, "=")
    if (kv[2] + 0 > 0)
        add(last_n, "dur_per_sync_" last_w, last_e, "items/sync",
            last_t " threads", last_ops / kv[2])
    last_w = ""
    next
}
/^bstalk / {
    fields()
    bn = v["row"] ~ /^(delayed|restart)_/ ? delayed : 1
    if (v["value"] != "")
        add(bn, "bs_" v["row"], v["srv"], v["unit"], "", v["value"])
    next
}
/ timers [0-9]+ delivered / {
    e = $1 == "poll" ? "poller-" $2 "ms" : $1 == "lpoll" ? "lpoller-" $2 "ms" : \
        $1 == "twgap" ? "twgap-" $2 "ms" : "twheel-redis"
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
