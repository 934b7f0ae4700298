#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Installs the beanstalkd clients from the npm registry that twheeld's
# client test drives (tests/twheeld/test_clients.py), jackd and fivebeans,
# at pinned versions,
# into a git-ignored directory (default build/npm-clients). The Debian
# client (ruby-beaneater) comes from scripts/deps.sh.
# Usage: scripts/twheeld-clients.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build/npm-clients}
mkdir -p "$dir"
if [ -f "$dir/node_modules/jackd/package.json" ] &&
  [ -f "$dir/node_modules/fivebeans/package.json" ]; then
  exit 0
fi
command -v npm >/dev/null || { echo "npm is not installed" >&2; exit 1; }
npm install --silent --no-audit --no-fund --prefix "$dir" jackd@2.2.2 \
  fivebeans@1.5.0 >&2
