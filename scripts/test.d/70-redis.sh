#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: durable timers on Redis against real redis-server processes:
# one server (semantics, the backend-neutral suite, unreachable, kill -9
# with appendfsync always) and
# 3-master clusters (3 nodes sharing 100,000 timers, kill -9 of a node,
# slot migration, failover to a replica with WAIT, a master stopped with
# SIGSTOP); and servers set up as in production (tests/redis_prod.sh:
# passwords, ACL users, Unix socket, databases, TLS, a TLS cluster,
# Sentinel). Each scenario starts and stops its own servers
# (tests/redis_test.sh, tests/redis_prod.sh). The one-server scenarios and
# the backend-neutral suite also run under ASan+UBSan (20-asan-ubsan.sh)
# and TSan (30-tsan.sh), which build the Redis backend when hiredis is
# there.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$root"
if ! command -v redis-server >/dev/null || ! command -v openssl >/dev/null ||
  ! pkg-config --exists hiredis openssl; then
  echo "redis stage: redis-server, openssl, hiredis or libssl-dev missing (scripts/deps.sh test)" >&2
  exit 1
fi
export TWHEEL_REDIS_CLUSTER_TESTS=1
configure_build build/ci-redis -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=gcc \
  -DTWHEEL_REDIS=ON -DTWHEEL_REDIS_TLS=ON -DTWHEEL_BUILD_BENCH=OFF
# Serially: the scenarios measure lateness and kill servers.
ctest --test-dir build/ci-redis --output-on-failure -L redis -j1
