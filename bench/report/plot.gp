# SPDX-License-Identifier: MIT
# plot.gp - the main job's results.csv: the core wheel (ns per operation
# against pending timers, one panel per workload, one line per engine), then
# one panel each for the service against the Java peers, the durable store
# against Redis, and the Redis backend against the sorted-set poller
# (Redis CPU and p99 lateness): medians, with the spread of the runs
# (min..max) as error bars. A round missing from the CSV leaves its panel
# empty (have_svc, have_dur, have_redis = 0, set by scripts/bench.sh). The legend and the workload
# names' meaning sit below the panels, off the data; the x axis spans the
# sizes run (nmin..nmax, given by scripts/bench.sh; default 1e3..1e7).
# Usage: gnuplot -e "csv='results.csv'; out='bench.png'; nmin=1000; nmax=1000000" \
#          bench/report/plot.gp
if (!exists("nmin")) nmin = 1000
if (!exists("nmax")) nmax = 10000000
if (!exists("have_core")) have_core = 1
if (!exists("have_svc")) have_svc = 1
if (!exists("have_dur")) have_dur = 1
if (!exists("have_redis")) have_redis = 1
set terminal pngcairo size 1600,1400 font ",10"
set output out
set datafile separator ","
set logscale xy
# Half a decade of room on each side of the sizes run.
set xrange [nmin / 3.0 : nmax * 3.0]
set format x "10^{%L}"
set format y "%g"
set xlabel "pending timers"
set grid
engines = "twheel twheel-netty heap libuv libevent"
wls = "add add_rand cancel_rand churn expire_1 expire_jump idle memory"
units = "ns/op ns/op ns/op ns/pair ns/timer ns/timer ns/op B/timer"
set multiplot layout 3,4 title "twheel vs peers, one run of scripts/bench.sh (medians; error bars: min..max of the runs)" \
    margins 0.05, 0.98, 0.17, 0.95 spacing 0.07, 0.09
# The legend once, in a row under the panels: each engine's name in its
# line's colour (the panels draw the engines in this order).
unset key
do for [i = 1:words(engines)] {
  set label 10 + i sprintf("\342\224\201\342\224\201 %s", word(engines, i)) \
    at screen 0.25 + 0.11 * (i - 1), 0.125 left font ",12" textcolor lt i noenhanced
}
# What each workload does (bench_core --list).
set label 1 at screen 0.05, 0.085 left font ",10" \
  "add: add N timers, array order;  add\\_rand: the same in random order;  cancel\\_rand: cancel N pending timers, random order;  churn: N pending, cancel one + add one, 2^{20} times"
set label 2 at screen 0.05, 0.055 left font ",10" \
  "expire\\_1: advance 1 tick at a time until all fired;  expire\\_jump: one advance past every deadline;  idle: 60 s idle timeouts, N/1000 re-arms per tick;  memory: bytes allocated per pending timer"
set label 3 at screen 0.05, 0.025 left font ",9" \
  "twheel: hierarchical wheel (default);  twheel-netty: one level with rounds (levels = 1), as Netty's HashedWheelTimer;  heap: binary heap baseline;  libuv, libevent: their own timers"
do for [i = 1:words(wls)] {
  w = word(wls, i)
  set title "core: " . w . " (lower is better)" noenhanced
  set ylabel word(units, i)
  if (have_core) {
    plot for [e in engines] sprintf("< awk -F, '$2==\"%s\" && $3==\"%s\"' %s", w, e, csv) \
         using 1:5 with linespoints lw 2 title e noenhanced
  } else {
    set multiplot next
  }
  unset label
}

# The other rounds: categories on x, each engine a point with error bars,
# shifted a little so that they do not overlap; a key in each panel. The
# awk filters below print columns separated by spaces.
set datafile separator whitespace
unset logscale x
unset format x
set format x "%g"
set key top left font ",8" noenhanced
set xlabel ""
# Service: M operations/s (higher is better).
swl = "svc_schedule_1p svc_schedule_2p svc_cancel_1p svc_cancel_2p svc_pairs_1p svc_pairs_2p"
seng = "twheel-service twheel-service-lazy netty-hwt jdk-stpe"
set title "service: M ops/s (higher is better)"
set ylabel "M ops/s"
set logscale y
set xrange [0.5 : 6.5]
set xtics ("sched 1p" 1, "sched 2p" 2, "cancel 1p" 3, "cancel 2p" 4, "pairs 1p" 5, "pairs 2p" 6) font ",8"
if (have_svc) {
  plot for [j = 1:words(seng)] sprintf("< awk -F, -v e=%s -v wl='%s' 'BEGIN { n = split(wl, a, \" \"); for (i = 1; i <= n; i++) x[a[i]] = i } $3 == e && ($2 in x) { print x[$2], $5, $6, $7 }' %s", word(seng, j), swl, csv) \
       using ($1 - 0.24 + 0.16 * j):2:3:4 with yerrorbars pt 7 ps 0.8 lw 1.5 title word(seng, j)
} else {
  set multiplot next
}
# Durable: items scheduled per second, 1 and 32 per call.
deng = "twheel-group twheel-interval redis-always redis-everysec"
set title "durable: items scheduled/s (higher is better)"
set ylabel "items/s"
set xrange [0.5 : 2.5]
set xtics ("1 per call" 1, "32 per call" 2) font ",8"
if (have_dur) {
  plot for [j = 1:words(deng)] sprintf("< awk -F, -v e=%s '$3 == e && $2 ~ /^dur_sched_[0-9]+$/ { print ($1 == 1 ? 1 : 2), $5, $6, $7 }' %s", word(deng, j), csv) \
       using ($1 - 0.24 + 0.16 * j):2:3:4 with yerrorbars pt 7 ps 0.8 lw 1.5 title word(deng, j)
} else {
  set multiplot next
}
# Redis backend: Redis CPU per 1000 fired timers, and p99 lateness.
set xrange [0.5 : 2.5]
set xtics ("twheel" 1, "poller 100 ms" 2) font ",8"
set key off
do for [m in "redis_cpu redis_p99"] {
  set title (m eq "redis_cpu" ? "Redis: Redis CPU per 1000 timers" : "Redis: p99 lateness") . " (lower is better)"
  set ylabel (m eq "redis_cpu" ? "ms / 1000 timers" : "ms")
  if (have_redis) {
    plot sprintf("< awk -F, '$2 == \"%s\" { print ($3 == \"twheel-redis\" ? 1 : 2), $5, $6, $7 }' %s", m, csv) \
         using 1:2:3:4 with yerrorbars pt 7 ps 1 lw 2 notitle
  } else {
    set multiplot next
  }
}
unset multiplot
