#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: builds the libFuzzer harnesses (clang, ASan+UBSan, unsigned
# overflow checks on the wheel; the service harness also under TSan) and
# runs each for FUZZ_SECONDS (default 35) from the seed corpus in
# fuzz/corpus/. Longer runs:
#   FUZZ_SECONDS=3600 cmake --build build/fuzz --target fuzz
# Usage: scripts/test.d/fuzz.sh [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
dir=${1:-build/ci-fuzz}
mkdir -p "$(dirname "$dir")"
cmake -S . -B "$dir" -G Ninja -DCMAKE_C_COMPILER=clang -DTWHEEL_WERROR=ON \
  -DTWHEEL_BUILD_FUZZ=ON -DTWHEEL_BUILD_TESTS=OFF -DTWHEEL_BUILD_BENCH=OFF \
  -DTWHEEL_BUILD_EXAMPLES=OFF >"$dir.log" 2>&1 || { cat "$dir.log"; exit 1; }
FUZZ_SECONDS=${FUZZ_SECONDS:-35} cmake --build "$dir" --target fuzz
