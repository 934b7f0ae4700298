#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: gcc Debug build, every test.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$root"
configure_build build/ci-debug -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=gcc
run_ctest build/ci-debug
