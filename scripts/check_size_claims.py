#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Sizes stated in comments are held to static asserts.

Every "N bytes" or "N-byte" that a comment of the C files given states
(N a whole number: "a job is 184 bytes", "4-byte slots") must have a
_Static_assert whose expression has the number N, in the same file within
WINDOW lines of the claim, or anywhere in its sibling (foo.h for foo.c and
the other way round: a header may describe a struct its .c keeps private).
So a comment that says a job is 168 bytes next to
`_Static_assert(sizeof(struct job) == 176, ...)` fails, and so does a size
that nothing asserts. The assert's message does not count, only its
expression, which the compiler checks.

Not claims, and not looked at: figures derived from others, which a
comment marks as such by a range ("4 to 16 bytes an entry"), a fraction
("5.3 bytes") or "about"/"~" before the number ("about 33 to 51 bytes a
delayed job"), and "@n bytes"-style names of parameters.

Prints each claim without an assert (file:line: the claim) and exits 1 if
there is one.
Usage: scripts/check_size_claims.py [--window N] PATH...  (files or
directories; the format stage runs it on twheeld/)
"""
import argparse
import os
import re
import sys

WINDOW = 40

# A whole number of bytes: not the tail of "5.3", "1,024" or "0x40".
CLAIM = re.compile(r"(?<![\w.,])(\d+)(?:-byte\b|\s+bytes?\b)")
# What before the number makes it a derived figure.
DERIVED = re.compile(r"(?:\bto|\babout|~)\s*$")
ASSERT = re.compile(r"_Static_assert\s*\(")
NUMBER = re.compile(r"(?<![\w.])(\d+)(?![\w.])")


def strip(text):
    """(code, comments): code with comments and literals blanked (lines
    kept), and each comment as (offset, text)."""
    code, comments, i, n = [], [], 0, len(text)
    while i < n:
        if text.startswith("/*", i) or text.startswith("//", i):
            end = "*/" if text[i + 1] == "*" else "\n"
            j = text.find(end, i + 2)
            j = n if j < 0 else j + (2 if end == "*/" else 0)
            comments.append((i, text[i:j]))
            code.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text[i] in "\"'":
            j = i + 1
            while j < n and text[j] != text[i]:
                j += 2 if text[j] == "\\" else 1
            code.append(text[i] + " " * (min(j, n - 1) - i - 1) + text[i])
            i = j + 1
        else:
            code.append(text[i])
            i += 1
    return "".join(code), comments


def asserts(code):
    """(line, numbers of the expression) of each _Static_assert in @code."""
    out = []
    for m in ASSERT.finditer(code):
        depth, j = 1, m.end()
        while j < len(code) and depth:
            depth += {"(": 1, ")": -1}.get(code[j], 0)
            j += 1
        args = code[m.end():j - 1]
        expr = args[:args.rfind(",")] if "," in args else args
        out.append((code.count("\n", 0, m.start()) + 1,
                    set(int(x) for x in NUMBER.findall(expr))))
    return out


def claims(text, comments):
    """(line, N, the claim's words) of each size a comment states."""
    out = []
    for start, com in comments:
        for m in CLAIM.finditer(com):
            if DERIVED.search(com[:m.start()]):
                continue
            line = text.count("\n", 0, start + m.start()) + 1
            near = com[max(0, m.start() - 30):m.end() + 20]
            words = " ".join(re.sub(r"\n\s*\*", " ", near).split())
            out.append((line, int(m.group(1)), words))
    return out


def sibling(path):
    stem, ext = os.path.splitext(path)
    return stem + {".c": ".h", ".h": ".c"}.get(ext, ext)


def files_of(paths):
    for p in paths:
        if os.path.isdir(p):
            for d, _, names in sorted(os.walk(p)):
                for f in sorted(names):
                    if f.endswith((".c", ".h")):
                        yield os.path.join(d, f)
        else:
            yield p


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--window", type=int, default=WINDOW)
    ap.add_argument("paths", nargs="+")
    args = ap.parse_args()
    parsed = {}

    def parse(f):
        if f not in parsed:
            text = open(f, encoding="utf-8", errors="replace").read()
            code, comments = strip(text)
            parsed[f] = (text, comments, asserts(code))
        return parsed[f]

    bad, total = [], 0
    for f in files_of(args.paths):
        text, comments, own = parse(f)
        near = os.path.exists(sibling(f)) and sibling(f) != f
        other = parse(sibling(f))[2] if near else []
        for line, n, words in claims(text, comments):
            total += 1
            ok = any(n in nums and abs(at - line) <= args.window
                     for at, nums in own) or any(n in nums
                                                 for _, nums in other)
            if not ok:
                where = f" or in {os.path.basename(sibling(f))}" if near else ""
                bad.append(f"{f}:{line}: \"{words}\": no _Static_assert of "
                           f"{n} within {args.window} lines{where}")
    for b in bad:
        print(b)
    if bad:
        print(f"size claims: {len(bad)} of {total} sizes stated in comments "
              "are not held by a static assert (add one next to the "
              "comment, or fix the comment)")
        return 1
    print(f"size claims: {total} sizes stated in comments of "
          f"{' '.join(args.paths)}, each held by a static assert")
    return 0


if __name__ == "__main__":
    sys.exit(main())
