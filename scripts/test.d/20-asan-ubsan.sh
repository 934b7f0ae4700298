#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: clang ASan+UBSan (unsigned-overflow checks on wheel.c), every
# test that a sanitizer runtime allows (label nosan excluded). This is the
# one stage that runs the Redis backend's one-server scenarios, the
# backend-neutral suite on Redis and the one-server production setups
# (TWHEEL_REDIS=ON: hiredis and redis-server come from scripts/deps.sh
# test, so they are never skipped for lack of it); the scenarios with
# several servers run in the Redis stage (70-redis.sh). twheeld's tests
# run in this tree too, in the twheeld stage (75-twheeld.sh).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$root"
asan_build
run_ctest build/ci-asan -LE "nosan|twheeld"
