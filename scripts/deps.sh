#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs the Debian packages twheel's scripts need, if any are missing.
# Usage: scripts/deps.sh test|bench|all
set -euo pipefail
group=${1:-all}
test_pkgs=(cmake ninja-build gcc clang clang-format libclang-rt-14-dev llvm-14 valgrind
  pkg-config faketime procps libuv1-dev libevent-dev liburing-dev doxygen
  dpkg-dev libhiredis-dev libssl-dev openssl redis-server redis-tools
  python3-prometheus-client beanstalkd ruby ruby-beaneater nodejs
  libpq-dev postgresql)
bench_pkgs=(cmake ninja-build gcc pkg-config libuv1-dev libevent-dev
  redis-server redis-tools libhiredis-dev libssl-dev libsqlite3-dev
  gnuplot-nox default-jdk-headless libnetty-java procps beanstalkd
  libpq-dev postgresql nodejs)
case $group in
  test) pkgs=("${test_pkgs[@]}") ;;
  bench) pkgs=("${bench_pkgs[@]}") ;;
  all) pkgs=("${test_pkgs[@]}" "${bench_pkgs[@]}") ;;
  *) echo "usage: $0 test|bench|all" >&2; exit 2 ;;
esac
missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done
# npm: Debian's package, unless a nodejs that bundles it is installed.
if ! command -v npm >/dev/null; then
  missing+=(npm)
fi
if ((${#missing[@]})); then
  echo "installing: ${missing[*]}"
  sudo_cmd=()
  if [ "$(id -u)" != 0 ]; then sudo_cmd=(sudo); fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -qq
  "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
