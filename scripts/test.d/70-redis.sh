#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: durable timers on Redis with several real redis-server
# processes, in the debug stage's build tree (build/ci-debug, built once):
# 3-master clusters (3 nodes sharing 100,000 timers, kill -9 of a node,
# slot migration, failover to a replica with WAIT, a master stopped with
# SIGSTOP, many timers), fenced shard ownership under faults (a master
# killed while nodes join and leave, a wall clock stepped +-2 s and +-3 s,
# a graceful join and leave under load, callbacks holding the executor
# threads, a master stopped while the nodes own shards and a node killed
# meanwhile; about 85 s of the stage's 3 min) and servers set up as in
# production
# (tests/redis_prod.sh: ACL users on a cluster, a TLS cluster, Sentinel).
# Each scenario starts and stops its own servers (tests/redis_test.sh,
# tests/redis_prod.sh). The one-server scenarios (semantics, the
# backend-neutral suite, unreachable, kill -9 with appendfsync always,
# garbage, passwords, TLS) run once per CI run, under ASan+UBSan: those
# that run one at a time here, in the asan-ubsan stage's tree after the
# several-server ones (lib.sh, serial_redis), the others in that stage
# (20-asan-ubsan.sh).
# Its tests mostly wait (about a third of a core): scripts/test.sh runs it
# in its wait lane, beside the foreground stages, on the tree the debug
# stage builds (whichever comes first builds it, under its lock); its run
# lock is held until its tests end, so that the valgrind stage does not
# set CTest's emulator in the tree meanwhile (lib.sh, tree_runs).
# Lane: wait
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$root"
if ! command -v redis-server >/dev/null || ! command -v openssl >/dev/null ||
  ! pkg-config --exists hiredis openssl; then
  echo "redis stage: redis-server, openssl, hiredis or libssl-dev missing (scripts/deps.sh test)" >&2
  exit 1
fi
# Two at a time, but the scenarios that measure lateness or kill, stop or
# step servers on a timeline one at a time (RUN_SERIAL in
# tests/CMakeLists.txt). Skipped tests (exit 77) fail the stage.
redis_tests() {
  local out
  debug_build
  out=$(ctest --test-dir build/ci-debug --output-on-failure -L redis-multi -j"$jobs") ||
    { echo "$out"; return 1; }
  echo "$out"
  if grep -q "Skipped" <<<"$out"; then
    echo "redis stage: a test was skipped" >&2
    return 1
  fi
}
tree_runs build/ci-debug -s redis_tests
# The one-server scenarios that run one at a time, under ASan+UBSan.
redis_asan_tests() {
  local out
  asan_build
  out=$(ctest --test-dir build/ci-asan --output-on-failure -j1 --no-tests=error \
    -R "$(serial_redis build/ci-asan)") || { echo "$out"; return 1; }
  echo "$out"
  if grep -q "Skipped" <<<"$out"; then
    echo "redis stage: a test was skipped" >&2
    return 1
  fi
}
redis_asan_tests
