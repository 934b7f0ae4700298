#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: the test suite under valgrind memcheck, in the debug stage's
# gcc Debug tree without sanitizers (build/ci-debug, built once, configured
# here with valgrind as CTest's emulator: its tests' commands change, no
# compile does). Every test runs through valgrind (CTest's emulator
# hook); any memcheck error or any byte lost or still reachable fails the
# test, but blocks a shared library's constructors allocated before main
# (tests/valgrind.supp says why). test_wheel_diff (10^6 random operations
# per configuration, minutes under valgrind's ~30-50x slowdown) is excluded from the CTest run and run
# here with 20,000 operations per configuration instead, and the journal
# index's model tests (45 s each under valgrind) with 4,000 of their
# 40,000 operations, and test_durable_crash (35 s under valgrind) with 50
# of its 200 kill -9s (all 200 run in the debug, ASan and TSan stages).
# idle_server is
# excluded too: it is a shell script that loads a real server for seconds,
# and CTest's emulator hook only wraps executables it builds. Valgrind runs
# a process's threads on one core: two tests run at once, except those
# with real-time cases, which run one at a time (below). Only the
# tests whose command CTest runs through valgrind run here: those started
# by a script (the Redis scenarios, twheeld's drivers, the examples fed by
# sh -c) would run their programs without it, and run in the debug, ASan
# and Redis stages instead.
# test_clock_wall preloads libfaketime and is not registered while the
# emulator is set.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$root"
dir=build/ci-debug
exclude='^(test_wheel_diff|test_durable_index|test_durable_index_deep|test_durable_crash|idle_server)$'
vg="valgrind;--tool=memcheck;--error-exitcode=99;--leak-check=full"
vg+=";--show-leak-kinds=all;--errors-for-leak-kinds=all;--num-callers=30"
vg+=";--fair-sched=yes;--suppressions=$root/tests/valgrind.supp"
# The tree with valgrind as CTest's emulator, and its CTest runs, with the
# tree's run lock held alone: the Redis stage (in scripts/test.sh's wait
# lane) runs its tests in this tree without the emulator, beside the
# foreground stages (lib.sh, tree_runs).
vg_ctests() {
  local pair one
  debug_build "-DCMAKE_CROSSCOMPILING_EMULATOR=$vg"
  # Two at a time (a valgrind process keeps one core busy, so two use both
  # cores), but the tests with real-time cases that need a core to
  # themselves run afterwards, one at a time: test_service and
  # test_service_xchg (its real-time cases), test_service_window
  # (lateness), test_service_tsc (the TSC estimate against the clock),
  # test_clock (the lazy clock on a busy thread), test_repeated_threads
  # (periods on the real service).
  alone='test_service test_service_xchg test_service_window test_service_tsc
    test_clock test_repeated_threads'
  read -r pair one < <(ctest --test-dir "$dir" --show-only=json-v1 |
    EXCLUDE="$exclude" ALONE="$alone" python3 -c '
import json, os, re, sys
names = [t["name"] for t in json.load(sys.stdin)["tests"]
         if t.get("command", [""])[0].endswith("valgrind")
         and not re.match(os.environ["EXCLUDE"], t["name"])]
alone = os.environ["ALONE"].split()
rx = lambda ns: "^(" + "|".join(ns) + ")$"
print(rx([n for n in names if n not in alone]), rx([n for n in names if n in alone]))')
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" -R "$pair" --timeout 300
  ctest --test-dir "$dir" --output-on-failure -j1 -R "$one" --timeout 300 \
    --no-tests=error
}
tree_runs build/ci-debug -x vg_ctests
vgargs=()
IFS=';' read -r -a vgargs <<<"$vg"
# The shortened runs, in two lanes side by side (none has a real-time
# bound): test_durable_crash's kills beside the three model tests.
"${vgargs[@]}" "$dir/tests/test_durable_crash" 50 &
crash=$!
"${vgargs[@]}" "$dir/tests/test_wheel_diff" 20000
echo "valgrind: test_wheel_diff ran with 20000 operations per configuration"
for t in test_durable_index test_durable_index_deep; do
  "${vgargs[@]}" "$dir/tests/$t" 4000
done
echo "valgrind: test_durable_index(_deep) ran with 4000 operations each"
wait "$crash"
echo "valgrind: test_durable_crash ran with 50 kills"
