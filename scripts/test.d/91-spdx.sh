#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: every tracked source, header, script and CMake file names its
# license (MIT, see LICENSE) in an SPDX line: the first line, or the second
# after a shebang. C files: /* SPDX-License-Identifier: MIT */; CMake,
# shell, awk and gnuplot files: # SPDX-License-Identifier: MIT.
# Computes only: scripts/test.sh runs it in its background lane.
# Lane: background
set -euo pipefail
cd "$(dirname "$0")/../.."
spdx='SPDX-License-Identifier: MIT'
missing=()
n=0
while IFS= read -r f; do
  [ -f "$f" ] || continue # deleted in the work tree, not yet committed
  n=$((n + 1))
  if head -1 "$f" | grep -q '^#!'; then
    line=$(sed -n 2p "$f")
  else
    line=$(head -1 "$f")
  fi
  case $f in
    *.c | *.h | *.inc | *.java) want="/* $spdx */" ;;
    *) want="# $spdx" ;;
  esac
  [ "$line" = "$want" ] || missing+=("$f")
done < <(git ls-files '*.c' '*.h' '*.inc' '*.java' '*.sh' '*.awk' '*.gp' \
  '*.cmake' '*.cmake.in' '*CMakeLists.txt' '*.pc.in' .ci/run)
if ((${#missing[@]})); then
  echo "spdx: these files lack the line \"$spdx\" at the top:"
  printf '  %s\n' "${missing[@]}"
  exit 1
fi
echo "spdx: $n files carry the MIT SPDX line"
