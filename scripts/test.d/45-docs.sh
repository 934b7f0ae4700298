#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: the paths the Markdown names, and the API reference (Doxygen,
# from include/twheel/*.h and docs/).
# Any Doxygen warning fails it, an undocumented public name among them.
# Computes only: scripts/test.sh runs it in its background lane.
# Lane: background
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$root"
# Every examples/, docs/, bench/, scripts/, src/ or include/ path that a
# Markdown file names exists.
scripts/check_md_paths.sh "$root"
dir=build/ci-docs
mkdir -p build
cmake -S "$root" -B "$dir" -G Ninja -DTWHEEL_BUILD_TESTS=OFF -DTWHEEL_DOCS_WERROR=ON \
  -DTWHEEL_BUILD_BENCH=OFF -DTWHEEL_BUILD_EXAMPLES=OFF >"$dir.log" 2>&1 ||
  { cat "$dir.log"; exit 1; }
if ! cmake --build "$dir" --target docs >>"$dir.log" 2>&1; then
  cat "$dir.log"
  echo "docs: Doxygen warnings (each fails the build):"
  cat "$dir/docs/warnings.log"
  exit 1
fi
# Every public function has a page of its own, not a link to its header's
# (tw__ names are private, as Doxygen's EXCLUDE_SYMBOLS says).
man3=$dir/docs/man/man3
missing=0
for name in $(sed -n 's/^TW_EXTERN[^(]*[ *]\([a-z_0-9]*\)(.*/\1/p' include/twheel/*.h |
  grep -v '^tw__'); do
  if [ ! -f "$man3/$name.3" ] || head -1 "$man3/$name.3" | grep -q '^\.so'; then
    echo "docs: no man page of its own for $name"
    missing=1
  fi
done
[ "$missing" = 0 ] || exit 1
# kernel-doc's markers are typeset, never shown: no "@key" or "%CONST" left
# in a page's text (they become italic and bold).
if grep -nE '(^|[^A-Za-z0-9_])[@%][A-Za-z_]' "$man3"/*.3; then
  echo "docs: man pages show kernel-doc markers literally (above)"
  exit 1
fi
echo "docs: $(find "$dir/docs/man/man3" -name '*.3' | wc -l) man pages," \
  "HTML in $dir/docs/html, no warnings"
