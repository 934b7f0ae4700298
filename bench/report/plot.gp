# SPDX-License-Identifier: MIT
# plot.gp - ns per operation against pending timers, one panel per workload,
# one line per engine, from bench_core's CSV. The legend and the workload
# names' meaning sit below the panels, off the data; the x axis spans the
# sizes run (nmin..nmax, given by scripts/bench.sh; default 1e3..1e7).
# Usage: gnuplot -e "csv='results.csv'; out='bench.png'; nmin=1000; nmax=1000000" \
#          bench/report/plot.gp
if (!exists("nmin")) nmin = 1000
if (!exists("nmax")) nmax = 10000000
set terminal pngcairo size 1600,1000 font ",10"
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
set multiplot layout 2,4 title "twheel core vs peers (median of repetitions; lower is better)" \
    margins 0.05, 0.98, 0.22, 0.93 spacing 0.07, 0.12
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
  set title w noenhanced
  set ylabel word(units, i)
  plot for [e in engines] sprintf("< awk -F, '$2==\"%s\" && $3==\"%s\"' %s", w, e, csv) \
       using 1:5 with linespoints lw 2 title e noenhanced
  unset label
}
unset multiplot
