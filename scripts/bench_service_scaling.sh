#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# bench_service_scaling.sh - the service's throughput with 1, 2 and 4
# producer threads beside Netty's HashedWheelTimer in the same run
# (bench/history/BENCHMARKS-notebook.md, "Timer service: producers and the exact clock").
#
# Usage: scripts/bench_service_scaling.sh [--tasks N] [--reps R] [--runs K]
#        [--bin PATH]
# Runs K rounds (default 3); each round runs bench_service --throughput
# --exact (R runs, median; default 3) and then TimerBench's Netty rows
# (warm-up + R runs, median), so both see the same load. --bin: another
# bench_service binary (a build of an earlier commit, for before/after).
set -euo pipefail
cd "$(dirname "$0")/.."
tasks=1000000
reps=3
runs=3
bin=build/rel/bench/bench_service
while (($#)); do
  case $1 in
    --tasks) tasks=$2; shift ;;
    --reps) reps=$2; shift ;;
    --runs) runs=$2; shift ;;
    --bin) bin=$2; shift ;;
    *) echo "usage: $0 [--tasks N] [--reps R] [--runs K] [--bin PATH]" >&2
       exit 2 ;;
  esac
  shift
done
[ -x "$bin" ] || { cmake -S . -B build/rel -G Ninja -DCMAKE_BUILD_TYPE=Release \
  >/dev/null && cmake --build build/rel --target bench_service; }
jar=/usr/share/java/netty-common.jar
java=0
if command -v javac >/dev/null && [ -r "$jar" ]; then
  mkdir -p build/java
  javac -d build/java -cp "$jar" bench/peers/java/TimerBench.java
  java=1
fi
for ((k = 1; k <= runs; k++)); do
  echo "== round $k: $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  "$bin" --throughput --exact --producers 1,2,4 --tasks "$tasks" --reps "$reps"
  if ((java)); then
    java -Xms2g -Xmx2g -cp "build/java:$jar" TimerBench --tasks "$tasks" \
      --reps "$reps" --threads 1,2,4 --netty-only 1
  fi
done
