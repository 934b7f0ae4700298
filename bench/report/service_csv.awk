# SPDX-License-Identifier: MIT
# service_csv.awk - turns bench_service's table into results.csv rows
# (n,workload,engine,unit,median,min,max,reps,speedup_vs_heap,
# fired_fraction,note). bench_service reports the median of its runs.
# REPS is how many runs bench_service took the median of; the throughput
# rows come from its "spread" lines (median, min and max of those runs),
# the memory and wake-up rows are measured once (min = max = the figure).
# Usage: awk -v n=TASKS -v reps=REPS -f bench/report/service_csv.awk service.txt
function row(w, e, unit, v) {
    printf "%d,%s,%s,%s,%s,%s,%s,1,,,measured once\n", n, w, e, unit, v, v, v
}
{
    eng = $0 ~ /lazy clock/ ? "twheel-service-lazy" : "twheel-service"
    # spread METRIC exact|lazy PRODUCERS median min max; "schedule" is a
    # fresh service, as the Java peers' (schedule_grown is no row).
    if ($1 == "spread" && $2 != "schedule_grown" && NF == 7) {
        e = $3 == "lazy" ? "twheel-service-lazy" : "twheel-service"
        printf "%d,svc_%s_%dp,%s,Mops/s,%s,%s,%s,%d,,,median of bench_service's runs\n",
            n, $2, $4, e, $5, $6, $7, reps ? reps : 1
    }
    if ($0 ~ /^allocated bytes per pending task/)
        row("svc_bytes_per_task", "twheel-service", "B/task", $NF)
    if ($0 ~ /^resident bytes per pending task/)
        row("svc_rss_per_task", "twheel-service", "B/task", $NF)
    if ($0 ~ /^idle wake-ups\/s, nothing pending/)
        row("svc_idle_wakeups", "twheel-service", "wakeups/s", $NF)
}
