#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# CI stage: every C source and header in the tree follows .clang-format
# (fix with: clang-format -i $(git ls-files '*.c' '*.h')), and every
# function that a comment in src/ or include/ names as name() exists
# (scripts/check_comment_names.py), and the house's sizes hold
# (scripts/check_function_length.py): functions of at most 60 lines
# everywhere, files of at most 1,200 lines in src/ and tools/ and 800 in
# twheeld/, but for the places scripts/size-allow.txt names with reasons;
# and every size a comment of twheeld/ states ("a job: 184 bytes") is held
# by a static assert next to it (scripts/check_size_claims.py).
# Computes only: scripts/test.sh runs it in its background lane.
# Lane: background
set -euo pipefail
cd "$(dirname "$0")/../.."
files=$(git ls-files '*.c' '*.h' 2>/dev/null || find . -name '*.[ch]' -not -path './build*')
clang-format --dry-run --Werror $files
echo "format: $(echo "$files" | wc -w) files clean"
scripts/check_comment_names.py .
scripts/check_function_length.py --max-fn 60 --max-file 800 twheeld
scripts/check_function_length.py --max-fn 60 --max-file 1200 \
  --allow scripts/size-allow.txt src tools/twheel
scripts/check_size_claims.py twheeld
# ... and can fail: a comment that says 168 bytes beside an assert of 176
# is refused.
t=$(mktemp -d)
trap 'rm -rf "$t"' EXIT
printf '%s\n' '/* A job: 168 bytes on LP64. */' 'struct job { char b[176]; };' \
  '_Static_assert(sizeof(struct job) == 176, "a job is 176 bytes");' >"$t/job.h"
if scripts/check_size_claims.py "$t" >"$t/out"; then
  echo "format: check_size_claims.py let a wrong size pass"
  exit 1
fi
grep -q 'job.h:1: .*no _Static_assert of 168' "$t/out"
