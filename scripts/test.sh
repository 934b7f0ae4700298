#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs every twheel test. Each stage is a file scripts/test.d/NN-name.sh,
# run in the order of NN (debug, asan-ubsan, tsan, install, docs, fuzz,
# valgrind, redis, twheeld, format, spdx). Installs what it needs (Debian
# packages) first. Exits non-zero if any stage fails. Ends with a table of
# each stage's wall time, its CPU time (user + system of all its
# processes) and the load average at its end, and the whole run's.
# Usage: scripts/test.sh [STAGE...]   (names without NN-, e.g. "tsan")
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test
mkdir -p build

# cpu_ticks: user + system time of this shell's waited-for children, in
# clock ticks (/proc/self/stat fields 16 and 17: cutime, cstime).
cpu_ticks() {
  local f
  read -r -a f </proc/$$/stat
  # The command name (field 2) has no blanks here: bash.
  echo $((f[15] + f[16]))
}
hz=$(getconf CLK_TCK)
t_start=0 # deps.sh included
passed=0
failed=()
rows=()
for f in scripts/test.d/[0-9][0-9]-*.sh; do
  name=$(basename "$f" .sh)
  name=${name#[0-9][0-9]-}
  if (($#)) && [[ " $* " != *" $name "* ]]; then
    continue
  fi
  echo "=== stage: $name"
  t0=$SECONDS
  c0=$(cpu_ticks)
  if bash "$f"; then
    result=ok
    passed=$((passed + 1))
  else
    result=FAILED
    failed+=("$name")
  fi
  wall=$((SECONDS - t0))
  cpu=$((($(cpu_ticks) - c0) / hz))
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  rows+=("$(printf '%-12s %-6s %6d %6d   %s' "$name" "$result" "$wall" "$cpu" "$load")")
  echo "=== stage $name: $result ($wall s wall, $cpu s CPU, load average $load)"
done
echo "stage        result  wall s  CPU s   load average (1, 5, 15 min) at end"
printf '%s\n' "${rows[@]}"
total=$((SECONDS - t_start))
printf 'all stages: %d min %02d s wall, %d s CPU\n' $((total / 60)) \
  $((total % 60)) $(($(cpu_ticks) / hz))
echo "stages: $passed passed, ${#failed[@]} failed"
if ((${#failed[@]})); then
  echo "failed stages: ${failed[*]}"
  exit 1
fi
