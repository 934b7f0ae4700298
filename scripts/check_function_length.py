#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""The house's size rules, checked: no function longer than MAX_FN lines
(from the line of its opening brace to that of its closing one) and no
file longer than MAX_FILE lines, in the C files of the directories given.
A function is a top-level "{" ... "}" whose opening line is not a struct,
union, enum or initializer; the text is clang-formatted, so a function's
braces sit in column 0.
An allow-list (--allow FILE: "PATH[:FUNCTION] reason" a line) names the
places let over the limits, each with its reason; an entry that is no
longer over them fails too, so the list only shrinks.
Usage: check_function_length.py [--max-fn N] [--max-file N] [--allow F]
       DIR..."""
import argparse
import os
import re
import sys

NOT_FN = re.compile(r"^(static\s+)?(const\s+)?(struct|union|enum)\b[^(]*$|=")


def functions(path):
    """(name, first line, lines) of each function of @path."""
    lines = open(path, encoding="utf-8").read().split("\n")
    out, start, head = [], None, ""
    for i, line in enumerate(lines):
        if start is None and line == "{":
            j = i - 1
            while j > 0 and lines[j - 1] and not lines[j - 1].startswith(
                    ("}", "/*", " *", "#")) and not lines[j].startswith("("):
                if lines[j].startswith(" ") or lines[j - 1].endswith(","):
                    j -= 1
                else:
                    break
            head = " ".join(lines[j:i])
            start = i
        elif start is not None and line.startswith("}"):
            if not NOT_FN.search(head.split("(")[0]) and "(" in head:
                name = head.split("(")[0].split()[-1].lstrip("*")
                out.append((name, start + 1, i - start + 1))
            start = None
    return out, len(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-fn", type=int, default=60)
    ap.add_argument("--max-file", type=int, default=1200)
    ap.add_argument("--allow")
    ap.add_argument("dirs", nargs="+")
    a = ap.parse_args()
    allow = {}
    if a.allow:
        for line in open(a.allow, encoding="utf-8"):
            if line.strip() and not line.startswith("#"):
                where, _, why = line.strip().partition(" ")
                allow[where] = why.strip()
    used = set()
    bad, nfn, nfile = [], 0, 0
    for d in a.dirs:
        for f in sorted(os.listdir(d)):
            if not f.endswith((".c", ".h")):
                continue
            p = os.path.join(d, f)
            fns, n = functions(p)
            nfile += 1
            if n - 1 > a.max_file and p in allow:
                used.add(p)
            elif n - 1 > a.max_file:
                bad.append("%s: %d lines (at most %d)" % (p, n - 1,
                                                           a.max_file))
            for name, line, length in fns:
                nfn += 1
                if length > a.max_fn and "%s:%s" % (p, name) in allow:
                    used.add("%s:%s" % (p, name))
                elif length > a.max_fn:
                    bad.append("%s:%d: %s() is %d lines (at most %d)" %
                               (p, line, name, length, a.max_fn))
    for where in allow:
        d = where.split(":")[0]
        if any(d.startswith(x.rstrip("/") + "/") for x in a.dirs) and \
                where not in used:
            bad.append("%s: allowed over the limits but no longer is: "
                       "take it off %s" % (where, a.allow))
    for b in bad:
        print(b)
    print("sizes: %d functions in %d files of %s, %s" %
          (nfn, nfile, " ".join(a.dirs),
           "%d over the limits" % len(bad) if bad else
           "each at most %d lines, each file at most %d%s" %
           (a.max_fn, a.max_file,
            " (%d allowed over, with reasons)" % len(used) if used else "")))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
