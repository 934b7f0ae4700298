#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: scripts/test_install.sh: a relocated install, consumers by
# pkg-config and find_package, the examples built alone, twheel as a
# subproject, the Debian package installed by dpkg.
# No clock in its checks (it builds, installs and runs consumers once):
# scripts/test.sh runs it in its background lane.
# Lane: background
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$root"
scripts/test_install.sh "$root/build/ci-install"
