# SPDX-License-Identifier: MIT
# plot.gp - ns per operation against pending timers, one panel per workload,
# one line per engine, from bench_core's CSV.
# Usage: gnuplot -e "csv='core.csv'; out='bench.png'" bench/report/plot.gp
set terminal pngcairo size 1600,900 font ",10"
set output out
set datafile separator ","
set logscale xy
set xrange [500:2e7]
set format x "10^{%L}"
set format y "%g"
set xlabel "pending timers"
set key top left font ",8"
set grid
engines = "twheel twheel-netty heap libuv libevent"
wls = "add add_rand cancel_rand churn expire_1 expire_jump idle memory"
units = "ns/op ns/op ns/op ns/pair ns/timer ns/timer ns/op B/timer"
set multiplot layout 2,4 title "twheel core vs peers (median of repetitions; lower is better)"
do for [i = 1:words(wls)] {
  w = word(wls, i)
  set title w noenhanced
  set ylabel word(units, i)
  plot for [e in engines] sprintf("< awk -F, '$2==\"%s\" && $3==\"%s\"' %s", w, e, csv) \
       using 1:5 with linespoints lw 2 title e
}
unset multiplot
