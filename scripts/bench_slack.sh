#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Exact deadlines against deadline windows (slack) in the timer service, and
# the cost of a task run against a baseline commit. Release build in
# build/bench-slack; bench/history/BENCHMARKS-notebook.md ("Deadline windows ...") quotes it.
#
# Usage: scripts/bench_slack.sh [--reps R] [--baseline REF] [-- ARGS...]
#   bench_slack ARGS...  R times (default 1): wake-ups, timer-thread CPU
#                        and lateness, exact and slack side by side
#   --baseline REF       also bench_run_cost (without and with --lazy)
#                        built against commit REF's library (from git
#                        archive), alternating with this tree's, R times
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
reps=1
base=
args=()
while (($#)); do
  case $1 in
    --reps) reps=$2; shift ;;
    --baseline) base=$2; shift ;;
    --) shift; args=("$@"); break ;;
    *) echo "usage: $0 [--reps R] [--baseline REF] [-- ARGS...]" >&2; exit 2 ;;
  esac
  shift
done
build=$root/build/bench-slack
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j2 --target bench_slack bench_run_cost >/dev/null
echo "commit $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (dirty)')"
if [[ -n $base ]]; then
  bdir=$build/baseline
  rm -rf "$bdir" && mkdir -p "$bdir/src"
  git archive "$base" | tar -x -C "$bdir/src"
  cmake -S "$bdir/src" -B "$bdir/build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_TESTING=OFF >/dev/null
  cmake --build "$bdir/build" -j2 --target twheel_static >/dev/null
  cc -O2 -std=c11 -DTWHEEL_STATIC -I"$bdir/src/include" -Itests \
    bench/bench_run_cost.c "$bdir/build/libtwheel.a" -lpthread \
    -o "$bdir/bench_run_cost"
  for ((r = 0; r < reps; r++)); do
    for lazy in "" --lazy; do
      echo "baseline $(git rev-parse --short "$base"):" \
        "$("$bdir/bench_run_cost" $lazy)"
      echo "this tree: $("$build/bench/bench_run_cost" $lazy)"
    done
  done
fi
for ((r = 0; r < reps; r++)); do
  "$build/bench/bench_slack" "${args[@]}"
done
