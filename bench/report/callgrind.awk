# SPDX-License-Identifier: MIT
# callgrind.awk - per-operation instruction and simulated cache-miss counts
# from the dumps bench_core --callgrind 1 makes under valgrind, one dump per
# run, named "engine/workload/n" (the dump's trigger).
# Usage: awk -f bench/report/callgrind.awk ops.txt cg.out.*
# ops.txt holds bench_core's "callgrind engine/workload/n ops=N" lines.
# Prints CSV rows without a header: n,workload,engine,ops,Ir_per_op,
# D1_miss_per_op,LL_miss_per_op.
FNR == 1 { label = "" }
/^callgrind / { sub(/^ops=/, "", $3); ops[$2] = $3; next }
/^desc: Trigger: Client Request: / { label = $NF; next }
/^events: / { for (i = 2; i <= NF; i++) col[$i] = i; next }
/^summary: / && label != "" && (label in ops) && ops[label] > 0 {
    split(label, f, "/")
    o = ops[label]
    d1 = $(col["D1mr"]) + $(col["D1mw"])
    ll = $(col["DLmr"]) + $(col["DLmw"])
    printf "%s,%s,%s,%s,%.1f,%.2f,%.2f\n", f[3], f[2], f[1], o,
        $(col["Ir"]) / o, d1 / o, ll / o
}
