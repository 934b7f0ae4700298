#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs every twheel test. Each stage is a file scripts/test.d/NN-name.sh,
# run in the order of NN (debug, asan-ubsan, tsan, install, fuzz, valgrind,
# format, ...). Installs what it needs (Debian packages) first. Exits
# non-zero if any stage fails.
# Usage: scripts/test.sh [STAGE...]   (names without NN-, e.g. "tsan")
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh test
mkdir -p build
passed=0
failed=()
for f in scripts/test.d/[0-9][0-9]-*.sh; do
  name=$(basename "$f" .sh)
  name=${name#[0-9][0-9]-}
  if (($#)) && [[ " $* " != *" $name "* ]]; then
    continue
  fi
  echo "=== stage: $name"
  t0=$SECONDS
  if bash "$f"; then
    echo "=== stage $name: ok ($((SECONDS - t0)) s)"
    passed=$((passed + 1))
  else
    echo "=== stage $name: FAILED ($((SECONDS - t0)) s)"
    failed+=("$name")
  fi
done
echo "stages: $passed passed, ${#failed[@]} failed"
if ((${#failed[@]})); then
  echo "failed stages: ${failed[*]}"
  exit 1
fi
