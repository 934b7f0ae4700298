#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: clang TSan, the tests labelled threads but not redis (the
# Redis scenarios run once, under ASan+UBSan and in the Redis stage), and
# the shared semantic suite on one redis-server (redis_suite), so that the
# Redis backend's threads are under TSan too.
# With --build it only builds its tree: scripts/test.sh does that ahead,
# in its background lane (the line below), while the stages before this
# one wait on servers.
# Prebuild: background
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$root"
# Only what these tests run: the programs of tests/ and examples/ (and the
# libraries they link). The benchmarks, twheeld, the twheel tool and the
# shared library run in no test here; the ASan+UBSan stage builds them with
# the same compiler and -Werror.
tsan_build() {
  configure_tree build/ci-tsan -DCMAKE_BUILD_TYPE=Tsan -DCMAKE_C_COMPILER=clang \
    -DTWHEEL_REDIS=ON
  cmake --build build/ci-tsan -j"$jobs" --target tests/all examples/all
}
if [ "${1:-}" = --build ]; then
  prebuild build/ci-tsan
  locked build/ci-tsan tsan_build
  exit 0
fi
locked build/ci-tsan tsan_build
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  run_ctest build/ci-tsan -L threads -LE redis
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  run_ctest build/ci-tsan -R '^redis_suite$' --no-tests=error
