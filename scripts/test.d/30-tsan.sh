#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: clang TSan, the tests labelled threads but not redis (the
# Redis scenarios run once, under ASan+UBSan and in the Redis stage), and
# the shared semantic suite on one redis-server (redis_suite), so that the
# Redis backend's threads are under TSan too.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$root"
configure_build build/ci-tsan -DCMAKE_BUILD_TYPE=Tsan -DCMAKE_C_COMPILER=clang \
  -DTWHEEL_REDIS=ON
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  run_ctest build/ci-tsan -L threads -LE redis
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  run_ctest build/ci-tsan -R '^redis_suite$' --no-tests=error
