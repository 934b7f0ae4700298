#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: clang ASan+UBSan (unsigned-overflow checks on wheel.c), every
# test that a sanitizer runtime allows (label nosan excluded).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$root"
configure_build build/ci-asan -DCMAKE_BUILD_TYPE=Asan -DCMAKE_C_COMPILER=clang
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_ctest build/ci-asan -LE nosan
