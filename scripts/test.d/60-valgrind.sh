#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: the test suite under valgrind memcheck, in the debug stage's
# gcc Debug tree without sanitizers (build/ci-debug, built once, configured
# here with valgrind as CTest's emulator: its tests' commands change, no
# compile does). Every test runs through valgrind (CTest's emulator
# hook); any memcheck error or any byte lost or still reachable fails the
# test. test_wheel_diff (10^6 random operations per configuration, minutes
# under valgrind's ~30-50x slowdown) is excluded from the CTest run and run
# here with 20,000 operations per configuration instead, and the journal
# index's model tests (45 s each under valgrind) with 4,000 of their
# 40,000 operations, and test_durable_crash (35 s under valgrind) with 50
# of its 200 kill -9s (all 200 run in the debug, ASan and TSan stages).
# idle_server is
# excluded too: it is a shell script that loads a real server for seconds,
# and CTest's emulator hook only wraps executables it builds. Tests run one
# at a time: valgrind runs a process's threads on one core, and the
# real-time cases of test_service need that core to themselves. Only the
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
vg+=";--fair-sched=yes"
debug_build "-DCMAKE_CROSSCOMPILING_EMULATOR=$vg"
wrapped=$(ctest --test-dir "$dir" --show-only=json-v1 | python3 -c '
import json, sys
names = [t["name"] for t in json.load(sys.stdin)["tests"]
         if t.get("command", [""])[0].endswith("valgrind")]
print("^(" + "|".join(names) + ")$")')
ctest --test-dir "$dir" --output-on-failure -j1 -R "$wrapped" -E "$exclude" \
  --timeout 300
vgargs=()
IFS=';' read -r -a vgargs <<<"$vg"
"${vgargs[@]}" "$dir/tests/test_wheel_diff" 20000
echo "valgrind: test_wheel_diff ran with 20000 operations per configuration"
for t in test_durable_index test_durable_index_deep; do
  "${vgargs[@]}" "$dir/tests/$t" 4000
done
echo "valgrind: test_durable_index(_deep) ran with 4000 operations each"
"${vgargs[@]}" "$dir/tests/test_durable_crash" 50
echo "valgrind: test_durable_crash ran with 50 kills"
