#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: twheeld, the beanstalkd-compatible server. Its protocol against
# a real beanstalkd (one session, 102 malformed lines), kill -9 under load
# with -b, 10,000 idle connections and a client that never reads, and three
# real clients (ruby-beaneater from Debian, jackd and fivebeans from npm) with the same
# transcript on twheeld and beanstalkd, /metrics parsed by prometheus_client,
# two servers on one redis-server namespace with kill -9 of each. Needs
# scripts/deps.sh test; the npm clients go to build/npm-clients
# (git-ignored). The server and tools run under ASan+UBSan: the tests run
# in the asan-ubsan stage's tree, once: two at a time, but those with a
# real-time bound, one at a time (RUN_SERIAL in tests/CMakeLists.txt: the
# protocol test's TTR timings against a real beanstalkd, the limits test's
# bound on serving with 10,000 connections open, the findings timed to the
# millisecond, the hostile records' takeover bound). The chaos
# test (about 85 s of waits for liveness records and leases) runs beside
# the others. With --build it only fetches the npm clients: scripts/test.sh
# does that ahead, in its background lane (the line below); the stage
# waits for a fetch under way (the lock), which takes the network more
# than the CPU. Its tests mostly wait (on servers, liveness records,
# leases): scripts/test.sh runs it in its wait lane, beside the foreground
# stages, on the tree the asan-ubsan stage builds
# (whichever comes first builds it, under its lock).
# Lane: wait
# Prebuild: background
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$root"
for tool in beanstalkd redis-server ruby node npm python3; do
  command -v "$tool" >/dev/null ||
    { echo "twheeld stage: $tool missing (scripts/deps.sh test)" >&2; exit 1; }
done
ruby -e "require 'beaneater'" ||
  { echo "twheeld stage: ruby-beaneater missing" >&2; exit 1; }
mkdir -p build
flock build/npm-clients.lock scripts/twheeld-clients.sh build/npm-clients
[ "${1:-}" != --build ] || exit 0
# The asan-ubsan stage's tree (built once; that stage leaves these tests
# here).
asan_build
# Skipped tests (exit 77) fail the stage: every part must run here.
out=$(ctest --test-dir build/ci-asan --output-on-failure -L twheeld -j"$jobs") ||
  { echo "$out"; exit 1; }
echo "$out"
if grep -q "Not Run\|Skipped" <<<"$out"; then
  echo "twheeld stage: a test was skipped" >&2
  exit 1
fi
