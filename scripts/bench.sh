#!/usr/bin/env bash
# The main job: builds twheel in Release (build/bench) and runs the benchmark
# suite, printing a table and writing CSV to build/bench/results/.
# Installs the Debian packages it needs first (scripts/deps.sh bench).
#
# Usage: scripts/bench.sh [--full] [--reps R]
#   default  quick mode: 1e6 pending timers, core engines and workloads
#   --full   1e3 .. 1e7 pending timers
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
full=0
reps=5
while (($#)); do
  case $1 in
    --full) full=1 ;;
    --reps) reps=$2; shift ;;
    *) echo "usage: $0 [--full] [--reps R]" >&2; exit 2 ;;
  esac
  shift
done

scripts/deps.sh bench
build=$root/build/bench
out=$build/results
mkdir -p "$out"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTWHEEL_BUILD_TESTS=OFF -DTWHEEL_BUILD_EXAMPLES=OFF >"$build.log" 2>&1 ||
  { cat "$build.log"; exit 1; }
cmake --build "$build" -j2 --target bench_core

if ((full)); then ns=1000,100000,1000000,10000000; else ns=1000000; fi
"$build/bench/bench_core" --n "$ns" --reps "$reps" --csv "$out/core.csv" |
  tee "$out/core.txt"
echo "results: $out"
