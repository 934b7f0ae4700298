#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs twheel's libFuzzer harnesses one after the other, each for
# FUZZ_SECONDS (default 60) or for a fixed number of runs (FUZZ_RUNS), on a
# working corpus in the build tree seeded from fuzz/corpus/<name>/. Exits
# non-zero on the first failure and leaves the crashing input in
# BINDIR/artifacts/.
# Usage: fuzz/run.sh BINDIR NAME...   (the `fuzz` CMake target calls it)
# Environment: FUZZ_SECONDS  seconds per harness (default 60)
#              FUZZ_RUNS     "NAME=COUNT ...": these harnesses run COUNT
#                            inputs (seeds included) instead, whatever the
#                            machine's speed (scripts/test.d/50-fuzz.sh)
#              FUZZ_ARGS     extra libFuzzer flags
#              FUZZ_UPDATE_SEEDS=1  merge new coverage back into fuzz/corpus/
set -euo pipefail
src=$(cd "$(dirname "$0")" && pwd)
bin=${1:?usage: $0 BINDIR NAME...}
shift
secs=${FUZZ_SECONDS:-60}
mkdir -p "$bin/artifacts"
for name in "$@"; do
  work=$bin/corpus-$name
  seeds=$src/corpus/${name%_tsan} # the TSan build shares its seeds
  # report_signal_unsafe=0: libFuzzer's own crash handler allocates; under
  # TSan that report deadlocked the handler and hung the run instead of
  # saving the crashing input and failing.
  export TSAN_OPTIONS="halt_on_error=1:report_signal_unsafe=0:suppressions=$src/tsan.supp"
  mkdir -p "$work"
  log=$bin/fuzz-$name.log
  runs=
  for nr in ${FUZZ_RUNS:-}; do
    [ "${nr%%=*}" = "$name" ] && runs=${nr#*=}
  done
  if [ -n "$runs" ]; then
    # A fixed amount of work; the outer timeout is a generous bound.
    limit=(-runs="$runs")
    outer=900
    echo "fuzz_$name: $runs runs, corpus $work (+ seeds $seeds)"
  else
    limit=(-max_total_time="$secs")
    outer=$((secs * 2 + 120))
    echo "fuzz_$name: ${secs}s, corpus $work (+ seeds $seeds)"
  fi
  # The outer timeout turns any other hang into a failure.
  t0=$SECONDS
  # shellcheck disable=SC2086
  if ! timeout -k 10 "$outer" "$bin/fuzz_$name" "${limit[@]}" -timeout=20 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$bin/artifacts/" \
    ${FUZZ_ARGS:-} "$work" "$seeds" >"$log" 2>&1; then
    tail -n 60 "$log"
    echo "fuzz_$name: FAILED (log $log)"
    exit 1
  fi
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1 || true)
  echo "fuzz_$name: ok, $execs executions in $((SECONDS - t0)) s, $cov," \
    "$(ls "$work" | wc -l) corpus files"
  if [ "${FUZZ_UPDATE_SEEDS:-0}" = 1 ]; then
    "$bin/fuzz_$name" -merge=1 "$seeds" "$work" >>"$log" 2>&1
    echo "fuzz_$name: seeds now $(ls "$seeds" | wc -l) files"
  fi
done
