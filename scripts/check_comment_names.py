#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Comments in src/ and include/ name functions that exist and state the
sizes the code asserts.

Every function a comment names as `name()` exists.

A name counts as existing when the C code of the library, its tool or its
server (src/, include/, tools/, twheeld/; comments and strings left out)
has it followed by "(": a definition, a declaration, a function-like macro
or a call, which the compiler has checked against a declaration (so the
libc and POSIX functions that the code calls count too). Names that only comments use and that are not ours (libc, POSIX,
Linux, other projects) are listed in ALLOWED below. Prints each stale name
with the places that name it and exits 1 if there is one.
A size a comment states ("a node is 40 bytes", "sizeof(tw_timer) is 40
bytes") is checked where the code asserts it: for each
`_Static_assert(sizeof(T) == N` or `sizeof(struct T) == N`, every comment
of the file that defines T that names T (or the last word of its name,
"node" for dx_node) followed within two words by "M bytes" must say M = N.
Usage: scripts/check_comment_names.py [ROOT]   (the format stage runs it)
"""
import re
import subprocess
import sys

# Functions outside this tree that comments name without the code calling
# them; each is someone else's.
ALLOWED = {
    "dlclose",  # POSIX
    "uv_backend_timeout",  # libuv, which the wheel's API follows
    "uv_err_name",
    "uv_replace_allocator",
    "pv",  # a Lua function inside the Redis scripts (src/redis_scripts.c)
}

# Names still in comments of files under other work; each entry goes when
# its comment is fixed.
KNOWN_STALE: set = set()

# Where the functions that library comments may name live: a name that
# only a test or benchmark has (advance() in a test) does not count.
LIBRARY = ("src/", "include/", "tools/", "twheeld/")

NAME_CALL = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*\(")
# "_list()" after "tw_durable_get()," stands for tw_durable_list(): names
# that begin with "_" are such suffixes, and not looked at.
NAME_IN_COMMENT = re.compile(r"\b([A-Za-z][A-Za-z0-9_]*)\(\)")


def split(text):
    """(code, comments) of a C file: comments and literals cut out."""
    code, comments = [], []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            comments.append(text[i:j])
            code.append(" ")
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            comments.append(text[i:j])
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            code.append(c + c)
            i = j + 1
        else:
            code.append(c)
            i += 1
    return "".join(code), comments


SIZE_ASSERT = re.compile(
    r"_Static_assert\s*\([^;]*?\bsizeof\s*\(\s*(?:struct\s+)?(\w+)\s*\)"
    r"\s*==\s*(\d+)", re.S)


def size_claims(texts):
    """Stale sizes: (file, type, asserted, stated) where a comment of the
    file that defines the type states another size than its assert."""
    asserted = {}
    for f, (code, _) in texts.items():
        for name, n in SIZE_ASSERT.findall(code):
            asserted[name] = int(n)
    bad = []
    for name, n in sorted(asserted.items()):
        define = re.compile(r"\bstruct\s+" + name + r"\s*\{")
        nouns = {name, name.rsplit("_", 1)[-1]}
        said = re.compile(r"\b(?:" + "|".join(sorted(nouns)) + r")s?\b\W+"
                          r"(?:\w+\W+){0,2}?(\d+) bytes", re.I)
        for f, (code, comments) in texts.items():
            if not define.search(code) and not re.search(
                    r"\btypedef\s+struct\s+\w+\s+" + name + r"\s*;", code):
                continue
            for com in comments:
                for m in said.findall(" ".join(com.split())):
                    if int(m) != n:
                        bad.append((f, name, n, int(m)))
    return bad, len(asserted)


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else "."
    files = subprocess.run(["git", "-C", root, "ls-files", "*.c", "*.h"],
                           check=True, capture_output=True,
                           text=True).stdout.split()
    known = set()
    named = {}
    texts = {}
    for f in files:
        with open(f"{root}/{f}", encoding="utf-8", errors="replace") as fh:
            code, comments = split(fh.read())
        if f.startswith(("src/", "include/")):
            texts[f] = (code, comments)
        if f.startswith(LIBRARY):
            known.update(NAME_CALL.findall(code))
        if f.startswith(("src/", "include/")):
            for com in comments:
                for name in NAME_IN_COMMENT.findall(com):
                    named.setdefault(name, set()).add(f)
    stale = {k: v for k, v in named.items()
             if k not in known and k not in ALLOWED and k not in KNOWN_STALE}
    for name in sorted(stale):
        print(f"comments name {name}(), which exists nowhere in the tree: "
              + ", ".join(sorted(stale[name])))
    gone = sorted(k for k in KNOWN_STALE if k not in named or k in known)
    for name in gone:
        print(f"{name}() is no longer stale: remove it from KNOWN_STALE")
    bad, nsizes = size_claims(texts)
    for f, name, n, m in bad:
        print(f"{f}: a comment says {name} is {m} bytes; the code asserts {n}")
    if stale or gone or bad:
        return 1
    print(f"comment names: {len(named)} functions named in comments of src/ "
          f"and include/, each exists; {nsizes} asserted sizes, every "
          "comment agrees")
    return 0


if __name__ == "__main__":
    sys.exit(main())
