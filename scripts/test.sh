#!/usr/bin/env bash
# Runs every twheel test: a gcc Debug build, clang ASan+UBSan, clang TSan,
# the install/consumer check, valgrind memcheck and bounded fuzzing.
# Installs what it needs (Debian packages) first. Exits non-zero on any
# failure. Usage: scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
scripts/deps.sh test
jobs=$(nproc)
failed=0
stages_passed=0
declare -a failed_stages=()

stage() {
  local name=$1
  shift
  echo "=== stage: $name"
  local t0=$SECONDS
  if "$@"; then
    echo "=== stage $name: ok ($((SECONDS - t0)) s)"
    stages_passed=$((stages_passed + 1))
  else
    echo "=== stage $name: FAILED ($((SECONDS - t0)) s)"
    failed=$((failed + 1))
    failed_stages+=("$name")
  fi
}

configure_build() {
  local dir=$1
  shift
  cmake -S "$root" -B "$dir" -G Ninja -DTWHEEL_WERROR=ON "$@" >"$dir.log" 2>&1 ||
    { cat "$dir.log"; return 1; }
  cmake --build "$dir" -j"$jobs"
}

run_ctest() {
  local dir=$1
  shift
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" "$@"
}

debug_stage() {
  configure_build build/ci-debug -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=gcc &&
    run_ctest build/ci-debug
}

asan_stage() {
  configure_build build/ci-asan -DCMAKE_BUILD_TYPE=Asan -DCMAKE_C_COMPILER=clang &&
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
      UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      run_ctest build/ci-asan -LE nosan
}

tsan_stage() {
  configure_build build/ci-tsan -DCMAKE_BUILD_TYPE=Tsan -DCMAKE_C_COMPILER=clang &&
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
      run_ctest build/ci-tsan -L threads
}

install_stage() {
  scripts/test_install.sh "$root/build/ci-install"
}

mkdir -p build
stage debug debug_stage
stage asan-ubsan asan_stage
stage tsan tsan_stage
stage install install_stage
for extra in scripts/test.d/*.sh; do
  [ -e "$extra" ] || continue
  stage "$(basename "$extra" .sh)" bash "$extra"
done

echo "stages: $stages_passed passed, $failed failed"
if ((failed)); then
  echo "failed stages: ${failed_stages[*]}"
  exit 1
fi
