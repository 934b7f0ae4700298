#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Measures the core wheel's two compile-time layout knobs side by side:
# slots per level (TW_WHEEL_DEFAULT_SLOTS) and lists per slot
# (TW_WHEEL_CHAINS). Builds bench_core once per variant, then runs the
# variants interleaved, ROUNDS times, and prints the median of each.
# Usage: bench/tune_wheel.sh [ROUNDS]   (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
variants=("1 64" "2 64" "4 64" "8 64" "4 256" "8 256" "8 1024")
workloads=add,add_rand,cancel,cancel_rand,expire_1,expire_jump
scripts/deps.sh bench >/dev/null
# Never run next to scripts/bench.sh: both would measure each other.
mkdir -p build/bench
exec 9>build/bench/.lock
flock 9
for v in "${variants[@]}"; do
  set -- $v
  d=build/tune-k$1-s$2
  cmake -S . -B "$d" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTWHEEL_BUILD_TESTS=OFF \
    -DTWHEEL_BUILD_EXAMPLES=OFF \
    "-DCMAKE_C_FLAGS=-DTW_WHEEL_CHAINS=$1 -DTW_WHEEL_DEFAULT_SLOTS=$2" >/dev/null
  cmake --build "$d" --target bench_core >/dev/null
done
out=$(mktemp)
for ((r = 1; r <= rounds; r++)); do
  for v in "${variants[@]}"; do
    set -- $v
    ./build/tune-k$1-s$2/bench/bench_core --n 1000000 --reps 3 --engines twheel \
      --workloads "$workloads" 2>/dev/null |
      awk -v k="$1" -v s="$2" '/^(add|cancel|expire)/ {print k, s, $1, $3}' >>"$out"
  done
done
echo "median ns per op or per expired timer, 1,000,000 timers, $rounds rounds"
printf "%-6s %-6s" chains slots
for w in ${workloads//,/ }; do printf " %12s" "$w"; done
echo
for v in "${variants[@]}"; do
  set -- $v
  printf "%-6s %-6s" "$1" "$2"
  for w in ${workloads//,/ }; do
    m=$(awk -v k="$1" -v s="$2" -v w="$w" '$1==k && $2==s && $3==w {print $4}' "$out" |
      sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')
    printf " %12s" "$m"
  done
  echo
done
rm -f "$out"
