#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: install into a scratch prefix and build consumers against it.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
cd "$root"
scripts/test_install.sh "$root/build/ci-install"
