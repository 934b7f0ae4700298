#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Source-based coverage (llvm-cov) reached by the fuzz harnesses' corpora:
# builds each harness with the replay driver, -fprofile-instr-generate and
# -fcoverage-mapping, replays the seed corpus (and the working corpus of a
# fuzz build, if given) and prints llvm-cov's report for the library code.
# Usage: fuzz/coverage.sh [FUZZ_BUILD_DIR]   (e.g. build/fuzz after
#        `cmake --build build/fuzz --target fuzz`)
set -euo pipefail
cd "$(dirname "$0")/.."
fuzzdir=${1:-}
out=build/fuzz-coverage
mkdir -p "$out"
llvm_cov=$(command -v llvm-cov-14 || command -v llvm-cov)
llvm_profdata=$(command -v llvm-profdata-14 || command -v llvm-profdata)
flags=(-O1 -g -fprofile-instr-generate -fcoverage-mapping -Iinclude -Isrc
  -DTWHEEL_STATIC -pthread)
for name in wheel service; do
  srcs=(src/wheel.c src/common.c)
  [ "$name" = service ] && srcs+=(src/service.c)
  clang "${flags[@]}" -o "$out/cov_$name" "${srcs[@]}" "fuzz/fuzz_$name.c" \
    fuzz/replay_main.c
  dirs=("fuzz/corpus/$name")
  if [ -n "$fuzzdir" ] && [ -d "$fuzzdir/fuzz/corpus-$name" ]; then
    dirs+=("$fuzzdir/fuzz/corpus-$name")
  fi
  rm -f "$out/$name"-*.profraw
  LLVM_PROFILE_FILE="$out/$name-%p.profraw" "$out/cov_$name" "${dirs[@]}"
  "$llvm_profdata" merge -sparse "$out/$name"-*.profraw -o "$out/$name.profdata"
  echo "== fuzz_$name: corpus ${dirs[*]}"
  "$llvm_cov" report "$out/cov_$name" -instr-profile="$out/$name.profdata" \
    "${srcs[@]}"
done
