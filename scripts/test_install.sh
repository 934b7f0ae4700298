#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The install check, as a user would meet twheel:
#  1. configure with one prefix, install with --prefix into another (the
#     relocated case); check the SONAME, the version file (0.1 refused), the
#     man pages; build consumers with pkg-config and with find_package, also
#     as on a machine without hiredis's development files (no hiredis.pc);
#  2. build every example alone against that install with pkg-config only
#     (copied out of the tree, so no include can reach back into it), run
#     the event-loop ones and ask each for --help;
#  3. twheel as a subproject (add_subdirectory): the parent's build type and
#     cache stay as they were, nothing of twheel's is installed unless asked;
#  4. the Debian package (cpack -G DEB), installed with dpkg into a scratch
#     root, a consumer built against it and run.
# Usage: scripts/test_install.sh WORKDIR
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
work=${1:?usage: $0 WORKDIR}
rm -rf "$work"
mkdir -p "$work"
work=$(cd "$work" && pwd)
prefix=$work/prefix
step() { echo "install check: $*"; }
fail() {
  echo "install check FAILED: $*" >&2
  exit 1
}

# 1. Configured for /nonexistent, installed into $prefix.
cmake -S "$root" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTWHEEL_WERROR=ON -DTWHEEL_BUILD_TESTS=OFF -DTWHEEL_BUILD_BENCH=OFF \
  -DTWHEEL_BUILD_EXAMPLES=OFF -DTWHEEL_BUILD_DOCS=ON -DTWHEEL_DOCS_WERROR=OFF \
  -DCMAKE_INSTALL_PREFIX=/nonexistent/twheel >"$work/build.log" 2>&1 ||
  { cat "$work/build.log"; exit 1; }
cmake --build "$work/build" >>"$work/build.log" 2>&1 ||
  { cat "$work/build.log"; exit 1; }
cmake --install "$work/build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name twheel.pc)")
libdir=$(dirname "$libdir")
soname=$(readelf -d "$libdir/libtwheel.so" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = "libtwheel.so.0.2" ] || fail "SONAME is '$soname'"
man3=$prefix/share/man/man3
grep -q '^tw_wheel_add \\- ' "$man3/tw_wheel_add.3" 2>/dev/null &&
  grep -q 'tw_wheel_add' "$man3/twheel_wheel.h.3" ||
  fail "no man page for tw_wheel_add"
[ -f "$prefix/share/doc/twheel/html/index.html" ] || fail "no HTML reference"
[ -f "$prefix/share/doc/twheel/LICENSE" ] || fail "no LICENSE installed"
"$prefix/bin/twheel" --help | grep -q '^usage: twheel' ||
  fail "no twheel tool installed, or its --help failed"
grep -q '^\.TH TWHEEL 1' "$prefix/share/man/man1/twheel.1" 2>/dev/null ||
  fail "no man page twheel(1)"
# man finds section 3 in the prefix; twheel(1) names only pages and guides
# the install has; the systemd unit runs twheeld from the prefix's sbin,
# not from the prefix of the configure.
if command -v man >/dev/null; then
  MANPATH= man -M "$prefix/share/man" 3 tw_wheel_add 2>/dev/null |
    grep -q 'tw_wheel_add' || fail "man -M $prefix/share/man 3 tw_wheel_add"
fi
see=$(sed -n '/^\.SH SEE ALSO/,$p' "$prefix/share/man/man1/twheel.1")
for page in $(echo "$see" | sed -n 's/^\.BR \([a-z_.]*\) (3).*/\1/p'); do
  [ -f "$man3/$page.3" ] || fail "twheel(1) names $page(3), which is not installed"
done
echo "$see" | grep -qF "$prefix/share/doc/twheel/guide" ||
  fail "twheel(1) does not name the installed guides: $see"
for g in durable.md redis.md postgres.md; do
  [ -f "$prefix/share/doc/twheel/guide/$g" ] || fail "guide $g not installed"
done
unit=$prefix/lib/systemd/system/twheeld.service
grep -qF "ExecStart=$prefix/sbin/twheeld " "$unit" && [ -x "$prefix/sbin/twheeld" ] ||
  fail "twheeld.service: $(grep ExecStart "$unit" 2>&1)"
step "relocated install in $prefix: SONAME $soname, man pages (man 3 tw_wheel_add), HTML, LICENSE, twheel(1) and what it names, the unit's ExecStart"

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
    printf("consumer: fired %d, version %x (%s)\n", fired, tw_version(),
           tw_version_string());
    return fired == 1 && tw_version() == TW_VERSION_HEX ? 0 : 1;
}
C

# The Redis backend (and its TLS) are built when their libraries are
# there, and configure says so.
grep -q 'twheel: Redis backend ON' "$work/build.log" ||
  fail "configure did not say the Redis backend is built"
grep -q 'Redis TLS ON' "$work/build.log" || fail "configure did not say TLS is built"

# pkg-config, shared library: the paths must point into $prefix.
export PKG_CONFIG_PATH=$libdir/pkgconfig
inc=$(pkg-config --variable=includedir twheel)
[ -f "$inc/twheel/wheel.h" ] || fail "pkg-config's includedir $inc has no twheel/wheel.h"
cc -std=c11 -Wall -Werror "$work/consumer.c" -o "$work/consumer_pc" \
  $(pkg-config --cflags --libs twheel)
LD_LIBRARY_PATH=$libdir "$work/consumer_pc"

# Each installed public header alone gives what every part of twheel
# shares (twheel/base.h): the version, the TW_E* codes and their messages.
for h in "$inc"/twheel/*.h; do
  printf '#include <twheel/%s>\n%s\n' "${h##*/}" \
    'int main(void) { return TW_VERSION_HEX != TW_VERSION_HEX || !tw_strerror(TW_EINVAL) || TW_ESTALE >= 0; }' \
    >"$work/one_header.c"
  cc -std=c11 -Wall -Werror "$work/one_header.c" -o "$work/one_header" \
    $(pkg-config --cflags --libs twheel) ||
    fail "twheel/${h##*/} alone lacks the version or the error codes"
done
[ -f "$inc/twheel/base.h" ] || fail "twheel/base.h is not installed"

# A machine without hiredis's (or OpenSSL's) development files: with
# PKG_CONFIG_LIBDIR only twheel.pc is visible. The shared library's
# consumers need neither; only a static link names them (Libs.private).
# No internal define of twheel's build reaches a consumer's flags.
nodev=(env PKG_CONFIG_LIBDIR="$libdir/pkgconfig" PKG_CONFIG_PATH=)
flags=$("${nodev[@]}" pkg-config --cflags --libs twheel) ||
  fail "pkg-config twheel needs another module: $flags"
cflags=$("${nodev[@]}" pkg-config --cflags twheel)
[ "$(echo $cflags)" = "-I$inc" ] || fail "pkg-config --cflags twheel: '$cflags'"
case $("${nodev[@]}" pkg-config --static --libs twheel) in
  *-lhiredis*-lssl*) ;;
  *) fail "pkg-config --static --libs twheel lacks -lhiredis -lssl" ;;
esac
if grep -rq '_FILE_OFFSET_BITS\|hiredis.h\|PkgConfig::' "$libdir/cmake/twheel"; then
  fail "the CMake package leaks an internal define or a pkg-config module"
fi
cc -std=c11 -Wall -Werror "$work/consumer.c" -o "$work/consumer_nodev" $flags
LD_LIBRARY_PATH=$libdir "$work/consumer_nodev"

# find_package(twheel 0.2), shared and static; 0.1 must be refused.
cmake_consumer() { # DIR VERSION
  mkdir -p "$1"
  cp "$work/consumer.c" "$1/"
  cat >"$1/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.16)
project(consumer C)
find_package(twheel $2 REQUIRED)
add_executable(consumer consumer.c)
target_link_libraries(consumer PRIVATE twheel::twheel)
add_executable(consumer_static consumer.c)
target_link_libraries(consumer_static PRIVATE twheel::twheel_static)
CM
  cmake -S "$1" -B "$1/build" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
    >"$1.log" 2>&1
}
# Configured as on a machine without hiredis.pc (find_package must not
# look for it).
PKG_CONFIG_LIBDIR=$work/empty cmake_consumer "$work/cm" 0.2 ||
  { cat "$work/cm.log"; exit 1; }
cmake --build "$work/cm/build" >/dev/null
"$work/cm/build/consumer"
"$work/cm/build/consumer_static"
if cmake_consumer "$work/cm01" 0.1; then
  fail "find_package(twheel 0.1) accepted version 0.2"
fi
step "consumers: pkg-config and find_package(twheel 0.2) ok without hiredis.pc; no internal define; 0.1 refused"

# 2. The examples, alone, against the install.
ex=$work/examples
mkdir -p "$ex/bin"
cp -r "$root/examples/quickstart.c" "$root/examples/election.c" \
  "$root"/examples/hello_*.c \
  "$root/examples/loops" "$root/examples/idle_server" "$ex/"
build_example() { # SOURCE [PKG...]
  local src=$1 name
  shift
  name=$(basename "$src" .c)
  cc -std=c11 -Wall -Wextra -Werror "$ex/$src" -o "$ex/bin/$name" \
    $(pkg-config --cflags --libs twheel "$@")
  out=$(LD_LIBRARY_PATH=$libdir "$ex/bin/$name" --help) ||
    fail "$name --help exited $?"
  case $out in "usage: $name"*) ;; *) fail "$name --help: no usage" ;; esac
}
build_example quickstart.c
build_example election.c
build_example hello_service.c
build_example hello_repeated.c
build_example hello_durable.c
build_example idle_server/idle_server.c
build_example idle_server/idle_load.c
build_example idle_server/idle_stall.c
# README: a program linked against a private prefix finds the library at
# run time only through an rpath (or LD_LIBRARY_PATH).
if "$ex/bin/hello_service" --help >/dev/null 2>&1; then
  fail "hello_service ran without an rpath or LD_LIBRARY_PATH"
fi
cc -std=c11 "$ex/hello_service.c" -o "$ex/bin/hello_rpath" \
  $(pkg-config --cflags --libs twheel) \
  -Wl,-rpath,"$(pkg-config --variable=libdir twheel)"
"$ex/bin/hello_rpath" >"$ex/hello_rpath.out" ||
  fail "hello_service with an rpath: $(tail -1 "$ex/hello_rpath.out")"
build_example loops/epoll_loop.c
build_example loops/uv_loop.c libuv
build_example loops/event_loop.c libevent
build_example loops/uring_loop.c liburing
for l in epoll_loop uv_loop event_loop; do
  LD_LIBRARY_PATH=$libdir "$ex/bin/$l" >"$ex/$l.out" || fail "$l: $(tail -1 "$ex/$l.out")"
done
rc=0
LD_LIBRARY_PATH=$libdir "$ex/bin/uring_loop" >"$ex/uring_loop.out" || rc=$?
case $rc in
  0) ;;
  77) step "uring_loop: io_uring not allowed here, compile-tested only" ;;
  *) fail "uring_loop: $(tail -1 "$ex/uring_loop.out")" ;;
esac
step "$(ls "$ex/bin" | grep -vc "^hello_rpath$") examples built with pkg-config only; --help exits 0; loops ran; an rpath finds the private prefix"

# 3. As a subproject of a parent with its own settings.
sub=$work/parent
mkdir -p "$sub"
cp "$work/consumer.c" "$sub/"
cat >"$sub/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.16)
project(parent C)
add_subdirectory("$root" twheel)
add_executable(consumer consumer.c)
target_link_libraries(consumer PRIVATE twheel::twheel_static)
install(TARGETS consumer)
CM
cmake -S "$sub" -B "$sub/build" -G Ninja -DCMAKE_INSTALL_PREFIX="$sub/inst" \
  >"$sub.log" 2>&1 || { cat "$sub.log"; exit 1; }
cache=$sub/build/CMakeCache.txt
bt=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$cache")
[ -z "$bt" ] || fail "subproject: parent's CMAKE_BUILD_TYPE set to '$bt'"
if grep -q '_ASAN\|_TSAN' "$cache"; then
  fail "subproject: sanitizer flags written into the parent's cache"
fi
cmake --build "$sub/build" >/dev/null
"$sub/build/consumer"
cmake --install "$sub/build" >/dev/null
[ -z "$(find "$sub/inst" -name '*twheel*')" ] ||
  fail "subproject: twheel installed files without TWHEEL_INSTALL"
[ ! -d "$sub/build/twheel/tests" ] || fail "subproject: tests were added"
# Asked for, its install rules come back (and CPack stays the parent's).
cmake -S "$sub" -B "$sub/build" -DTWHEEL_INSTALL=ON >>"$sub.log" 2>&1 ||
  { cat "$sub.log"; exit 1; }
cmake --build "$sub/build" >/dev/null
cmake --install "$sub/build" >/dev/null
[ -f "$sub/inst/include/twheel/wheel.h" ] ||
  fail "subproject with TWHEEL_INSTALL=ON: headers not installed"
[ ! -f "$sub/build/CPackConfig.cmake" ] ||
  fail "subproject: twheel wrote the parent's CPack configuration"
step "subproject: parent's build type and cache untouched; installs only with TWHEEL_INSTALL=ON"

# 4. The Debian package, installed by dpkg into a scratch root. Built in
# the tree of step 1 configured again for /usr: no compile command names
# the prefix, so nothing is compiled twice; GNUInstallDirs recomputes the
# directories it had chosen for the old prefix (lib/<multiarch> under
# /usr), and the installed files are the same as from a tree configured
# for /usr from the start.
deb=$work/deb
mkdir -p "$deb"
cmake -S "$root" -B "$work/build" -DCMAKE_INSTALL_PREFIX=/usr >"$deb.log" 2>&1 ||
  { cat "$deb.log"; exit 1; }
grep -q '^CMAKE_INSTALL_LIBDIR:PATH=lib/' "$work/build/CMakeCache.txt" ||
  fail "configured again for /usr, the library directory stayed $(sed -n 's/^CMAKE_INSTALL_LIBDIR:PATH=//p' "$work/build/CMakeCache.txt")"
cmake --build "$work/build" >>"$deb.log" 2>&1 || { cat "$deb.log"; exit 1; }
(cd "$work/build" && cpack -G DEB >>"$deb.log" 2>&1) || { cat "$deb.log"; exit 1; }
pkg=$(ls "$work"/build/twheel_*.deb)
dpkg-deb -f "$pkg" Package Version Depends
# The runtime libraries of the Redis backend are declared.
for dep in libhiredis libssl; do
  dpkg-deb -f "$pkg" Depends | grep -q "$dep" || fail "the package does not depend on $dep"
done
r=$deb/root
mkdir -p "$r/var/lib/dpkg/info" "$r/var/lib/dpkg/updates"
touch "$r/var/lib/dpkg/status"
# A real dpkg install, into a scratch root with its own database (the
# system's is left alone): --force-depends as that database knows no libc6;
# the maintainer scripts (ldconfig) run outside the root, which needs root.
if [ "$(id -u)" = 0 ]; then
  dpkg --root="$r" --force-script-chrootless --force-depends --log=/dev/null \
    -i "$pkg" >"$deb/dpkg.log" 2>&1 || { cat "$deb/dpkg.log"; fail "dpkg -i"; }
  dpkg --root="$r" -L twheel | grep -q '/usr/share/man/man3/tw_wheel_add.3' ||
    fail "the package has no man pages"
  how="installed by dpkg -i"
else
  dpkg -x "$pkg" "$r"
  how="unpacked by dpkg -x (not root)"
fi
usrlib=$(dirname "$(find "$r/usr" -name twheel.pc)")
usrlib=$(dirname "$usrlib")
PKG_CONFIG_PATH=$usrlib/pkgconfig cc -std=c11 -Wall -Werror \
  "$work/consumer.c" -o "$deb/consumer" \
  $(PKG_CONFIG_PATH=$usrlib/pkgconfig pkg-config --cflags --libs twheel)
LD_LIBRARY_PATH=$usrlib "$deb/consumer"
step "$(basename "$pkg") $how, consumer built and run"

# 5. TWHEEL_LTO=ON: the static library carries GCC's LTO code beside its
# machine code. A consumer linked without -flto uses the machine code (a
# call to tw_wheel_add and to tw_wheel_cancel remains); one built and
# linked with -flto gets both inlined into its loops (no call left).
lto=$work/lto
cmake -S "$root" -B "$lto/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTWHEEL_WERROR=ON -DTWHEEL_BUILD_TESTS=OFF -DTWHEEL_BUILD_BENCH=OFF \
  -DTWHEEL_BUILD_EXAMPLES=OFF -DTWHEEL_LTO=ON \
  -DCMAKE_INSTALL_PREFIX="$lto/prefix" >"$lto.log" 2>&1 || { cat "$lto.log"; exit 1; }
cmake --build "$lto/build" >>"$lto.log" 2>&1 || { cat "$lto.log"; exit 1; }
cmake --install "$lto/build" >/dev/null
cat >"$lto/cancel_loop.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <twheel/wheel.h>

static void on_fire(tw_timer *t, void *arg)
{
    (void)t;
    (void)arg;
}

int main(void)
{
    enum { N = 1000 };
    tw_wheel *w;
    tw_timer *t = malloc(N * sizeof *t);
    if (t == NULL || tw_wheel_create(&w, NULL, 0) != 0)
        return 1;
    for (int i = 0; i < N; i++) {
        tw_timer_init(&t[i], on_fire, NULL);
        if (tw_wheel_add(w, &t[i], 1 + (uint64_t)i * 7) != 0)
            return 1;
    }
    int n = 0;
    for (int i = 0; i < N; i++)
        n += tw_wheel_cancel(w, &t[i]);
    size_t left = tw_wheel_count(w);
    printf("cancel_loop: cancelled %d, %zu left\n", n, left);
    tw_wheel_destroy(w);
    free(t);
    return n == N && left == 0 ? 0 : 1;
}
C
archive=$(find "$lto/prefix" -name libtwheel.a)
for mode in plain lto; do
  flag=
  [ "$mode" = lto ] && flag=-flto
  cc -std=c11 -O2 -Wall -Werror $flag -DTWHEEL_STATIC -I"$lto/prefix/include" \
    "$lto/cancel_loop.c" "$archive" -lpthread -o "$lto/cancel_loop_$mode"
  "$lto/cancel_loop_$mode"
  for fn in tw_wheel_add tw_wheel_cancel; do
    calls=$(objdump -d "$lto/cancel_loop_$mode" | grep -c "call.*<$fn[.>]" || true)
    if [ "$mode" = plain ]; then
      [ "$calls" -ge 1 ] || fail "LTO library, consumer without -flto: no call to $fn"
    else
      [ "$calls" -eq 0 ] || fail "LTO library, consumer with -flto: $fn not inlined ($calls calls)"
    fi
  done
done
# Another compiler is refused at configure time, with the reason.
if command -v clang >/dev/null; then
  if cmake -S "$root" -B "$lto/clang" -G Ninja -DCMAKE_C_COMPILER=clang \
    -DTWHEEL_LTO=ON -DTWHEEL_BUILD_TESTS=OFF -DTWHEEL_BUILD_BENCH=OFF \
    -DTWHEEL_BUILD_EXAMPLES=OFF >"$lto/clang.log" 2>&1; then
    fail "TWHEEL_LTO=ON with clang was accepted"
  fi
  grep -q 'TWHEEL_LTO=ON needs GCC' "$lto/clang.log" ||
    fail "TWHEEL_LTO=ON with clang: no reason given ($(tail -1 "$lto/clang.log"))"
fi
step "TWHEEL_LTO=ON: static library links without -flto; with -flto tw_wheel_add and tw_wheel_cancel are inlined; clang refused"
echo "install check: ok"
