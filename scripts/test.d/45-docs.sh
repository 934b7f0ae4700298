#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: the API reference (Doxygen, from include/twheel/*.h and docs/).
# Any Doxygen warning fails it, an undocumented public name among them.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$root"
dir=build/ci-docs
mkdir -p build
cmake -S "$root" -B "$dir" -G Ninja -DTWHEEL_BUILD_TESTS=OFF \
  -DTWHEEL_BUILD_BENCH=OFF -DTWHEEL_BUILD_EXAMPLES=OFF >"$dir.log" 2>&1 ||
  { cat "$dir.log"; exit 1; }
if ! cmake --build "$dir" --target docs >>"$dir.log" 2>&1; then
  cat "$dir.log"
  echo "docs: Doxygen warnings (each fails the build):"
  cat "$dir/docs/warnings.log"
  exit 1
fi
echo "docs: $(find "$dir/docs/man/man3" -name '*.3' | wc -l) man pages," \
  "HTML in $dir/docs/html, no warnings"
