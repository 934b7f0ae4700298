#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs every twheel test. Each stage is a file scripts/test.d/NN-name.sh
# (debug, asan-ubsan, tsan, install, docs, fuzz, valgrind, redis, twheeld,
# format, spdx). Installs what it needs (Debian packages) first. Exits
# non-zero if any stage fails.
#
# Three lanes. The stages with real-time bounds or real servers (the
# foreground: every stage without a "# Lane:" line) run one after the
# other in the order of NN, at normal CPU priority. The stages that mostly
# wait on real servers and fault timelines (those with a "# Lane: wait"
# line: Redis, PostgreSQL, twheeld; a third to a half of a core in all)
# run one after the other in a second lane beside the foreground, at the
# same priority, from the start: each takes its build tree's lock
# (scripts/test.d/lib.sh), so it starts once the foreground stage that
# builds that tree has built it, and runs its tests on it while the
# foreground goes on with the next stage. The stages that only compute,
# with no clock in any of their checks (those with "# Lane: background":
# the install check, the API reference, the fuzz runs with their fixed
# input counts, format, spdx), run one after the other in a third lane at
# the lowest CPU priority from the start (SCHED_IDLE, which
# a waking normal task preempts at once, where a nice 19 task may finish
# its slice first; nice 19 where chrt cannot set it): they
# take the CPU the other two leave idle (their stages wait on servers and
# sleeps for about half their time) and give it back whenever a
# test wants it. A stage with a "# Prebuild: background" line is first run
# with --build in that lane too: it compiles the stage's tree ahead, in
# the CPU the stages before it leave idle; when the stage comes, it finds
# its tree built, or stops that build and goes on with it at its own
# priority (a head start, never a wait: scripts/test.d/lib.sh, locked).
# Once the foreground and the wait lane are done, what is left of the
# background lane goes back to the priority of this script (where it may:
# root). The wait lane's and the background lane's output are printed
# after the foreground's (each stage's last line as it ends).
# TWHEEL_TEST_LANES=1 runs every stage in the foreground, in the order of
# NN.
#
# Ends with a table of each stage's wall time, its CPU time (user + system
# of all its processes) and the load average at its end, and the whole
# run's.
# Usage: scripts/test.sh [STAGE...]   (names without NN-, e.g. "tsan")
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test
mkdir -p build/lanes
# What a run left behind (the process groups of its head starts, named in
# build/*.prebuild, are gone or another's now).
rm -f build/lanes/* build/*.prebuild
: >build/lanes/rows

# cpu_ticks PID: user + system time of PID's waited-for children, in
# clock ticks (/proc/PID/stat fields 16 and 17: cutime, cstime; the
# command name, field 2, is bash: no blanks).
cpu_ticks() {
  local f
  read -r -a f </proc/"$1"/stat
  echo $((f[15] + f[16]))
}
hz=$(getconf CLK_TCK)

# run_stage FILE [LANE [--build]]: runs one stage (or only its build: the
# row NAME:build, "built", or "stopped" when it failed or the stage itself
# stopped it to build at its own priority), appends its row to
# build/lanes/rows ("name result wall cpu load...").
run_stage() {
  local f=$1 lane=${2:-} arg=${3:-} name t0 c0 me=$BASHPID result wall cpu load
  name=$(basename "$f" .sh)
  name=${name#[0-9][0-9]-}${arg:+:build}
  echo "=== stage: $name${lane:+ ($lane)}"
  t0=$SECONDS
  c0=$(cpu_ticks "$me")
  if [ -z "$arg" ]; then
    if bash "$f"; then result=ok; else result=FAILED; fi
  else
    # In a process group of its own, which the stage stops when it wants
    # its tree (scripts/test.d/lib.sh, locked).
    if setsid -f -w bash "$f" "$arg"; then result=built; else result=stopped; fi
  fi
  wall=$((SECONDS - t0))
  cpu=$((($(cpu_ticks "$me") - c0) / hz))
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  echo "=== stage $name: $result ($wall s wall, $cpu s CPU, load average $load)"
  printf '%-12s %-7s %6d %6d   %s%s\n' "$name" "$result" "$wall" "$cpu" \
    "$load" "${lane:+   ($lane)}" >>build/lanes/rows
}

fg=()
wt=()
bg=()
pre=()
for f in scripts/test.d/[0-9][0-9]-*.sh; do
  name=$(basename "$f" .sh)
  name=${name#[0-9][0-9]-}
  if (($#)) && [[ " $* " != *" $name "* ]]; then
    continue
  fi
  if [ "${TWHEEL_TEST_LANES:-2}" = 1 ]; then
    fg+=("$f")
  elif grep -q '^# Lane: background' "$f"; then
    bg+=("$f")
  else
    # The wait lane's prebuilds first (twheeld's: a fetch of clients,
    # seconds of CPU): its stages come sooner than their places in NN.
    if grep -q '^# Lane: wait' "$f"; then
      wt+=("$f")
      grep -q '^# Prebuild: background' "$f" && pre=("$f" "${pre[@]}")
    else
      fg+=("$f")
      grep -q '^# Prebuild: background' "$f" && pre+=("$f")
    fi
  fi
done

bgpid=
if ((${#bg[@]} + ${#pre[@]})); then
  (
    # Lowest priority while the foreground and the wait lane run (not at
    # all when they have nothing to run, or are done already).
    if ((${#fg[@]} + ${#wt[@]})) && [ ! -e build/lanes/fg-done ]; then
      renice -n 19 -p "$BASHPID" >/dev/null
      chrt --idle -p 0 "$BASHPID" 2>/dev/null || true
    fi
    # A prebuild that fails is not a stage's failure: the stage itself
    # builds again and reports it.
    for f in "${pre[@]}"; do
      run_stage "$f" "background, --build only" --build \
        >"build/lanes/$(basename "$f" .sh)-build.log" 2>&1 </dev/null
    done
    for f in "${bg[@]}"; do
      run_stage "$f" background >"build/lanes/$(basename "$f" .sh).log" 2>&1 </dev/null
      tail -1 "build/lanes/$(basename "$f" .sh).log"
    done
  ) &
  bgpid=$!
fi
# The wait lane: each stage in a subshell of its own, as below.
wtpid=
if ((${#wt[@]})); then
  (
    for f in "${wt[@]}"; do
      (run_stage "$f" wait) >"build/lanes/$(basename "$f" .sh).log" 2>&1 </dev/null
      tail -1 "build/lanes/$(basename "$f" .sh).log"
    done
  ) &
  wtpid=$!
fi
# Each in a subshell of its own: its CPU time is that subshell's
# children's alone (this shell also reaps the other lanes).
for f in "${fg[@]}"; do
  (run_stage "$f")
done
if [ -n "$wtpid" ]; then
  wait "$wtpid" || true
  for f in "${wt[@]}"; do
    echo "=== output of the wait-lane stage $(basename "$f" .sh):"
    cat "build/lanes/$(basename "$f" .sh).log"
  done
fi
# descendants PID: every process below PID.
descendants() {
  local p
  for p in $(pgrep -P "$1"); do
    echo "$p"
    descendants "$p"
  done
}
touch build/lanes/fg-done
if [ -n "$bgpid" ]; then
  for p in "$bgpid" $(descendants "$bgpid"); do
    chrt --other -p 0 "$p" 2>/dev/null || true
    renice -n "$(nice)" -p "$p" >/dev/null 2>&1 || true
  done
  wait "$bgpid" || true
  for f in "${bg[@]}"; do
    echo "=== output of the background stage $(basename "$f" .sh):"
    cat "build/lanes/$(basename "$f" .sh).log"
  done
fi

echo "stage        result   wall s  CPU s   load average (1, 5, 15 min) at end"
cat build/lanes/rows
total=$SECONDS
printf 'all stages: %d min %02d s wall, %d s CPU\n' $((total / 60)) \
  $((total % 60)) $(($(cpu_ticks $$) / hz))
passed=$(grep -c ' ok ' build/lanes/rows || true)
failed=$(awk '$2 == "FAILED" { print $1 }' build/lanes/rows | xargs)
echo "stages: $passed passed, $(wc -w <<<"$failed") failed"
if [ -n "$failed" ]; then
  echo "failed stages: $failed"
  exit 1
fi
