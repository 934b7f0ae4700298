#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: durable timers on PostgreSQL, under ASan+UBSan in the tree
# of the asan-ubsan stage (build/ci-asan, built once): the
# backend-neutral suite (pg_suite) and what only
# this backend does (pg_backend: SQL transactions rolled back and
# committed, SQL cancels, hostile rows, a fleet of three handles, the
# server restarted with -m immediate), and three node processes under
# continuous load while nodes are killed, the server is restarted and
# the primary fails over to a streaming standby (pg_fleet_kill,
# _restart, _sync, _async). Each test makes its own server (and
# standby) (tests/pg_test.sh: initdb into a temporary directory, free
# ports on 127.0.0.1, always stopped). A stage of its own (the debug and
# asan-ubsan stages leave label postgres out, so the tests run once): it
# needs the server's binaries (scripts/deps.sh test installs postgresql),
# a missing server must fail here rather than be skipped quietly, and the
# tests run one at a time (lateness, a server restart). About 92 to 106 s
# (87 to 101 s of tests) at a load average of 9 to 15 on 2 cores, 42 to
# 49 s of it the pg_fleet tests (the ASan tree is built by the asan-ubsan stage before).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$root"
if ! pkg-config --exists libpq; then
  echo "postgres stage: libpq-dev missing (scripts/deps.sh test)" >&2
  exit 1
fi
asan_build
out=$(ctest --test-dir build/ci-asan --output-on-failure -L postgres -j1) ||
  { echo "$out"; exit 1; }
echo "$out"
if grep -q "Skipped\|No tests were found" <<<"$out"; then
  echo "postgres stage: a test was skipped or none found (the server's binaries: scripts/deps.sh test)" >&2
  exit 1
fi
