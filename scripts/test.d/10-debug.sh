#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: gcc Debug build (with the Redis backend), every test but the
# Redis and twheeld ones: the one-server Redis scenarios run under
# ASan+UBSan (20-asan-ubsan.sh, 70-redis.sh), the others in the Redis
# stage (70-redis.sh) on this same build tree; twheeld's in its stage
# (75-twheeld.sh), on the ASan+UBSan tree; PostgreSQL's in its stage
# (72-postgres.sh).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$root"
debug_tests() {
  debug_build
  run_ctest build/ci-debug -LE "redis|twheeld|postgres"
}
# Its configuration kept while its tests run (lib.sh, tree_runs).
tree_runs build/ci-debug -s debug_tests
