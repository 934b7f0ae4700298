#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Shared by the CI stages in scripts/test.d: configure and build a tree,
# run CTest in it. Sourced, not run.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
jobs=$(nproc)

# configure_tree DIR CMAKE_ARGS...: configure with -Werror, without the
# API reference in the build (the docs stage builds it on its own).
configure_tree() {
  local dir=$1
  shift
  mkdir -p "$(dirname "$dir")"
  cmake -S "$root" -B "$dir" -G Ninja -DTWHEEL_WERROR=ON -DTWHEEL_BUILD_DOCS=OFF \
    "$@" >"$dir.log" 2>&1 ||
    { cat "$dir.log"; return 1; }
}

# locked DIR CMD...: CMD with the lock of tree DIR held. The background
# lane of scripts/test.sh may be building the same tree ahead, at the
# lowest CPU priority (a stage's "# Prebuild: background", run with
# --build, which calls prebuild first): a head start, never a wait. A
# stage that wants its tree stops that build (its process group, named
# in DIR.prebuild; ninja removes the outputs of the commands it was
# running) and goes on from where it got, at its own priority; a
# prebuild that comes after the stage took its tree does nothing.
locked() {
  local dir=$1
  shift
  mkdir -p "$(dirname "$dir")" "$root/build/lanes"
  if [ -s "$dir.prebuild" ] && [ "$(cat "$dir.prebuild")" != $$ ]; then
    kill -TERM -- "-$(cat "$dir.prebuild")" 2>/dev/null || true
    rm -f "$dir.prebuild"
  fi
  [ -s "$dir.prebuild" ] || touch "$root/build/lanes/$(basename "$dir").wanted"
  (
    flock 9
    "$@"
  ) 9>"$dir.lock"
}

# prebuild DIR: this process builds DIR ahead for a later stage (it leads
# its process group: scripts/test.sh starts it with setsid), unless that
# stage has taken it already (scripts/test.sh clears build/lanes/ at its
# start); locked DIR stops it.
prebuild() {
  [ ! -e "$root/build/lanes/$(basename "$1").wanted" ] || exit 0
  echo $$ >"$1.prebuild"
  # shellcheck disable=SC2064 # $1 now
  trap "rm -f '$1.prebuild'" EXIT
}

# configure_build DIR CMAKE_ARGS...: configure with -Werror and build.
configure_build() {
  locked "$1" _configure_build "$@"
}
_configure_build() {
  configure_tree "$@"
  cmake --build "$1" -j"$jobs"
}

# tree_runs DIR -s|-x CMD...: CMD with the run lock of tree DIR held
# shared (-s: CMD configures the tree as every stage does and runs tests
# in it) or exclusive (-x: CMD configures it otherwise, as the valgrind
# stage does with CTest's emulator, and runs tests in it). The stages of
# scripts/test.sh's wait lane run beside the foreground's, so a tree's
# tests may run while another stage configures it anew: this keeps a
# stage's configuration and its tests together. Taken before the tree's
# lock (locked), never inside it.
tree_runs() {
  local dir=$1 mode=$2
  shift 2
  mkdir -p "$(dirname "$dir")"
  (
    flock "$mode" 8
    "$@"
  ) 8>"$dir.runs.lock"
}

# debug_build [CMAKE_ARGS...]: the gcc Debug tree build/ci-debug with the
# Redis backend, TLS and the several-server Redis scenarios, shared by the
# debug, valgrind and Redis stages (the later ones find it built and only
# run their tests). The valgrind stage passes its CTest emulator (valgrind);
# without one given, none is set, so every other stage's tests run as they
# are. Neither changes a compile command: nothing is rebuilt.
debug_build() {
  configure_build build/ci-debug -DCMAKE_BUILD_TYPE=Debug \
    -DCMAKE_C_COMPILER=gcc -DTWHEEL_REDIS=ON -DTWHEEL_REDIS_TLS=ON \
    -DTWHEEL_REDIS_CLUSTER_TESTS=ON -DCMAKE_CROSSCOMPILING_EMULATOR= "$@"
}

# asan_build: the clang ASan+UBSan tree build/ci-asan with the Redis
# backend, shared by the asan-ubsan and twheeld stages (the second finds
# it built and only runs the twheeld tests in it).
asan_build() {
  configure_build build/ci-asan -DCMAKE_BUILD_TYPE=Asan \
    -DCMAKE_C_COMPILER=clang -DTWHEEL_REDIS=ON
}

# serial_redis DIR: a CTest regex naming the one-server Redis scenarios
# of tree DIR that run one at a time (RUN_SERIAL in tests/CMakeLists.txt:
# they bound lateness or ages, or stop and kill servers on a timeline;
# twheeld's are its stage's). The asan-ubsan stage leaves them to the
# Redis stage, which runs them in this tree from scripts/test.sh's wait
# lane: waiting on servers, they hold no core.
serial_redis() {
  ctest --test-dir "$1" --show-only=json-v1 | python3 -c '
import json, sys
names = []
for t in json.load(sys.stdin)["tests"]:
    p = {x["name"]: x["value"] for x in t.get("properties", [])}
    labels = p.get("LABELS", [])
    if (p.get("RUN_SERIAL") and not p.get("DISABLED") and "redis" in labels
            and not {"redis-multi", "twheeld", "nosan"} & set(labels)):
        names.append(t["name"])
print("^(" + "|".join(names) + ")$" if names else "^$")'
}

# The sanitizers' settings for a test run in that tree.
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

# run_ctest DIR CTEST_ARGS...
run_ctest() {
  local dir=$1
  shift
  ctest --test-dir "$dir" --output-on-failure -j"$jobs" "$@"
}
