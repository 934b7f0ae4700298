#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: clang ASan+UBSan (unsigned-overflow checks on wheel.c), every
# test that a sanitizer runtime allows (label nosan excluded). This is the
# stage that runs the Redis backend's one-server scenarios that may run
# beside others, the backend-neutral suite on Redis and the one-server
# production setups (TWHEEL_REDIS=ON: hiredis and redis-server come from
# scripts/deps.sh test, so they are never skipped for lack of it); the
# one-server scenarios that run one at a time (about 90 s of waiting on
# servers) run in this tree from the Redis stage (70-redis.sh, in the wait
# lane of scripts/test.sh; lib.sh, serial_redis), as do the scenarios with
# several servers, in the debug tree. twheeld's tests run in this tree
# too, in the twheeld stage (75-twheeld.sh), and the PostgreSQL tests in
# theirs (72-postgres.sh).
# With --build it only builds its tree: scripts/test.sh does that ahead,
# in its background lane (the line below), in the CPU the debug stage's
# tests leave idle; this stage then stops that build and goes on with it.
# Prebuild: background
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$root"
if [ "${1:-}" = --build ]; then
  prebuild build/ci-asan
  asan_build
  exit 0
fi
asan_build
run_ctest build/ci-asan -LE "nosan|twheeld|postgres" -E "$(serial_redis build/ci-asan)"
