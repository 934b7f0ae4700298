#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: durable timers on PostgreSQL, in the debug stage's build tree
# (build/ci-debug): the backend-neutral suite (pg_suite) and what only
# this backend does (pg_backend: SQL transactions rolled back and
# committed, SQL cancels, hostile rows, a fleet of three handles, the
# server restarted with -m immediate). Each test makes its own server
# (tests/pg_test.sh: initdb into a temporary directory, a free port on
# 127.0.0.1, always stopped). A stage of its own, not part of the debug
# stage: it needs the server's binaries (scripts/deps.sh test installs
# postgresql), and a missing server must fail here rather than be
# skipped quietly. About 40 s.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$root"
if ! pkg-config --exists libpq; then
  echo "postgres stage: libpq-dev missing (scripts/deps.sh test)" >&2
  exit 1
fi
debug_build
out=$(ctest --test-dir build/ci-debug --output-on-failure -L postgres -j1) ||
  { echo "$out"; exit 1; }
echo "$out"
if grep -q "Skipped\|No tests were found" <<<"$out"; then
  echo "postgres stage: a test was skipped or none found (the server's binaries: scripts/deps.sh test)" >&2
  exit 1
fi
