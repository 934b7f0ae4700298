#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs twheel into a scratch prefix and builds a tiny consumer against
# it twice: with pkg-config and with CMake's find_package(twheel).
# Usage: scripts/test_install.sh WORKDIR
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=${1:?usage: $0 WORKDIR}
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
cmake -S "$root" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTWHEEL_WERROR=ON -DTWHEEL_BUILD_TESTS=OFF -DTWHEEL_BUILD_BENCH=OFF \
  -DTWHEEL_BUILD_EXAMPLES=OFF -DCMAKE_INSTALL_PREFIX="$prefix" >/dev/null
cmake --build "$work/build" >/dev/null
cmake --install "$work/build" >/dev/null

cat >"$work/consumer.c" <<'C'
#include <stdio.h>
#include <twheel/wheel.h>

static int fired;
static void on_fire(tw_timer *t, void *arg)
{
    (void)t;
    (void)arg;
    fired++;
}

int main(void)
{
    tw_wheel *w;
    tw_timer t;
    if (tw_wheel_create(&w, NULL, 0) != 0)
        return 1;
    tw_timer_init(&t, on_fire, NULL);
    if (tw_wheel_add(w, &t, 10) != 0)
        return 1;
    tw_wheel_advance(w, 10);
    tw_wheel_destroy(w);
    printf("consumer: fired %d, version %x\n", fired, tw_version());
    return fired == 1 ? 0 : 1;
}
C

# 1. pkg-config, shared library.
libdir=$(ls -d "$prefix"/lib*/pkgconfig | head -1)
export PKG_CONFIG_PATH=$libdir
cc -std=c11 -Wall -Werror "$work/consumer.c" -o "$work/consumer_pc" \
  $(pkg-config --cflags --libs twheel)
LD_LIBRARY_PATH=$(dirname "$libdir") "$work/consumer_pc"

# 2. find_package(twheel).
mkdir -p "$work/cm"
cp "$work/consumer.c" "$work/cm/"
cat >"$work/cm/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.16)
project(consumer C)
find_package(twheel 0.1 REQUIRED)
add_executable(consumer consumer.c)
target_link_libraries(consumer PRIVATE twheel::twheel)
add_executable(consumer_static consumer.c)
target_link_libraries(consumer_static PRIVATE twheel::twheel_static)
CM
cmake -S "$work/cm" -B "$work/cm/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$work/cm/build" >/dev/null
"$work/cm/build/consumer"
"$work/cm/build/consumer_static"
echo "install check: ok"
