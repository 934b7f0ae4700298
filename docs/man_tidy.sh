#!/bin/sh
# SPDX-License-Identifier: MIT
# Tidies Doxygen's man3 directory for installing: keeps a page for every
# public tw_ / TW_ name (each a link to its header's page), renames the
# header pages to twheel_<header>.3 (wheel.h.3 -> twheel_wheel.h.3) and
# the guides to twheel_guide_*.3, and drops the links Doxygen makes for
# struct fields (tick_ns.3, flags.3, ...), names too generic for a system
# man directory. Usage: man_tidy.sh MAN3_DIR
set -eu
cd "${1:?usage: $0 MAN3_DIR}"
for f in *.3; do
  case $f in
    tw_* | TW_*) ;;
    *.h.3 | guide_*.3) mv "$f" "twheel_$f" ;;
    *) rm -f "$f" ;;
  esac
done
for f in tw_*.3 TW_*.3; do
  [ -f "$f" ] || continue
  if head -1 "$f" | grep -q '^\.so man3/'; then
    sed -i '1s|^\.so man3/\(.*\.h\.3\)$|.so man3/twheel_\1|' "$f"
  fi
done
