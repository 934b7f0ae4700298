#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Every path under examples/, docs/, bench/, scripts/, src/ or include/
# that a Markdown file of the repository names must exist (a file or a
# directory; a name with * or [..] must match something). Prints each
# missing one as FILE:LINE: PATH and exits 1 if there is any.
# Usage: scripts/check_md_paths.sh [ROOT]   (the CI's docs stage runs it)
set -euo pipefail
cd "${1:-$(dirname "$0")/..}"
bad=0
checked=0
while IFS= read -r md; do
  # FILE:LINE:MATCH for every path-like word not inside a longer path or a
  # URL (the character before it is none of [A-Za-z0-9_./-]).
  while IFS=: read -r line match; do
    p=${match#?}
    [[ $match =~ ^(examples|docs|bench|scripts|src|include)/ ]] && p=$match
    # Trailing punctuation of the sentence is not part of the path.
    while [[ $p =~ [.,:\;]$ ]]; do p=${p%?}; done
    checked=$((checked + 1))
    if [[ $p == *[*[]* ]]; then
      compgen -G "$p" >/dev/null && continue
    elif [ -e "$p" ]; then
      continue
    fi
    echo "$md:$line: $p does not exist"
    bad=1
  done < <(grep -noE '(^|[^A-Za-z0-9_./-])(examples|docs|bench|scripts|src|include)/[A-Za-z0-9_.*+/[-]*[]A-Za-z0-9_*/-]?' "$md" |
    sed 's/^\([0-9]*\):/\1:/')
done < <(git ls-files '*.md' 2>/dev/null || find . -name '*.md' -not -path './build*')
if ((bad)); then
  echo "check_md_paths: Markdown names paths that do not exist (above)"
  exit 1
fi
echo "check_md_paths: $checked paths named in Markdown, all present"
