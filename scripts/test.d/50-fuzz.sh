#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: builds the libFuzzer harnesses (clang, ASan+UBSan, unsigned
# overflow checks on the wheel; the service harness also under TSan) and
# runs each from the seed corpus in fuzz/corpus/ for a fixed number of
# inputs, the same work on any machine: about what 35 s gave each harness
# on the 2-core CI machine for the wheel and service harnesses (their
# coverage still grows at the end), and for the journal and twheeld parser
# harnesses, whose coverage stops growing early (journal: at the seeds;
# parser: after ~200,000 of 17 million inputs in 35 s), a few times what
# they needed. With FUZZ_SECONDS set, each runs that long instead. Longer
# runs:
#   FUZZ_SECONDS=3600 cmake --build build/fuzz --target fuzz
# Usage: scripts/test.d/50-fuzz.sh [BUILD_DIR]
# A fixed number of inputs, no clock: scripts/test.sh runs it in its
# background lane.
# Lane: background
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build/ci-fuzz}
mkdir -p "$(dirname "$dir")"
cmake -S . -B "$dir" -G Ninja -DCMAKE_C_COMPILER=clang -DTWHEEL_WERROR=ON \
  -DTWHEEL_BUILD_FUZZ=ON -DTWHEEL_BUILD_TESTS=OFF -DTWHEEL_BUILD_BENCH=OFF \
  -DTWHEEL_BUILD_EXAMPLES=OFF -DTWHEEL_BUILD_DOCS=OFF >"$dir.log" 2>&1 ||
  { cat "$dir.log"; exit 1; }
if [ -n "${FUZZ_SECONDS:-}" ]; then
  exec cmake --build "$dir" --target fuzz
fi
export FUZZ_RUNS="wheel=90000 service=8000 service_tsan=6000 journal=300000
  twheeld_proto=1000000 twheeld_record=1000000"
# A fixed number of inputs is the same work however many run at once: the
# harnesses run in two lanes side by side (what the fuzz target runs one
# after the other, fuzz/run.sh on each), balanced by their times here
# (service_tsan ~65 s, journal ~10 s, twheeld_proto ~3 s, twheeld_record
# ~3 s; wheel ~40 s,
# service ~45 s). A harness alone keeps about one core busy: the service
# harnesses' threads mostly wait on each other.
# Only the harnesses (fuzz/all: their own ASan+UBSan and TSan builds of
# the library): the tree's plain library, twheeld and the twheel tool run
# in no harness, and the asan-ubsan stage compiles them with clang and
# -Werror; the API reference is the docs stage's.
cmake --build "$dir" -j"$(nproc)" --target fuzz/all
fuzz/run.sh "$dir/fuzz" service_tsan journal twheeld_proto twheeld_record &
lane1=$!
rc=0
fuzz/run.sh "$dir/fuzz" wheel service || rc=$?
wait "$lane1" || rc=$?
exit "$rc"
