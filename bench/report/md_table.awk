# SPDX-License-Identifier: MIT
# md_table.awk - the core rows of results.csv as one Markdown table per
# number of pending timers: median (speed-up over the heap), '*' capped
# run, '~' one run only (see bench_core.c).
# Usage: awk -F, -f bench/report/md_table.awk results.csv
NR == 1 || $2 ~ /^svc_/ { next }
{
    if (!($1 in seen_n)) { seen_n[$1] = 1; ns[++nn] = $1 }
    if (!($2 in seen_w)) { seen_w[$2] = 1; ws[++nw] = $2; unit[$2] = $4 }
    if (!($3 in seen_e)) { seen_e[$3] = 1; es[++ne] = $3 }
    mark = ($11 ~ /^capped/ ? "\\*" : "") ($11 ~ /one run/ ? "~" : "")
    cell[$1, $2, $3] = sprintf("%.1f%s", $5, mark)
    if ($9 != "" && $3 != "heap" && $2 != "memory")
        cell[$1, $2, $3] = cell[$1, $2, $3] sprintf(" (%.2fx)", $9)
}
END {
    for (i = 1; i <= nn; i++) {
        printf "\n**%s pending timers**\n\n| workload | unit |", ns[i]
        for (k = 1; k <= ne; k++) printf " %s |", es[k]
        printf "\n|---|---|"
        for (k = 1; k <= ne; k++) printf "---|"
        printf "\n"
        for (j = 1; j <= nw; j++) {
            if (!((ns[i], ws[j], es[1]) in cell) && !((ns[i], ws[j], "heap") in cell))
                continue
            printf "| %s | %s |", ws[j], unit[ws[j]]
            for (k = 1; k <= ne; k++) {
                c = (ns[i], ws[j], es[k]) in cell ? cell[ns[i], ws[j], es[k]] : "-"
                printf " %s |", c
            }
            printf "\n"
        }
    }
}
