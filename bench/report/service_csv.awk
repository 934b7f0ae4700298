# SPDX-License-Identifier: MIT
# service_csv.awk - turns bench_service's table into results.csv rows
# (n,workload,engine,unit,median,min,max,reps,speedup_vs_heap,
# fired_fraction,note). bench_service reports the median of its runs.
# REPS is how many runs bench_service took the median of (1 with --quick,
# else 3); the min and max columns hold that median too.
# Usage: awk -v n=TASKS -v reps=REPS -f bench/report/service_csv.awk service.txt
function row(w, e, unit, v) {
    printf "%d,%s,%s,%s,%s,%s,%s,%d,,,median of bench_service's runs\n",
        n, w, e, unit, v, v, v, reps ? reps : 1
}
{
    eng = $0 ~ /lazy clock/ ? "twheel-service-lazy" : "twheel-service"
    w = ""
    if ($0 ~ /^schedule \(fresh pool/) w = "svc_schedule"
    else if ($0 ~ /^cancel \(pending tasks/) w = "svc_cancel"
    else if ($0 ~ /^schedule\+cancel pairs/) w = "svc_pairs"
    if (w != "" && $NF ~ /^[0-9.]+$/ && $(NF - 1) ~ /^[0-9.]+$/) {
        row(w "_1p", eng, "Mops/s", $(NF - 1))
        row(w "_2p", eng, "Mops/s", $NF)
    }
    if ($0 ~ /^allocated bytes per pending task/)
        row("svc_bytes_per_task", "twheel-service", "B/task", $NF)
    if ($0 ~ /^resident bytes per pending task/)
        row("svc_rss_per_task", "twheel-service", "B/task", $NF)
    if ($0 ~ /^idle wake-ups\/s, nothing pending/)
        row("svc_idle_wakeups", "twheel-service", "wakeups/s", $NF)
}
