# SPDX-License-Identifier: MIT
# doxyfilter.awk - Doxygen's input filter for include/twheel/*.h. The
# headers keep plain C comments in the kernel-doc manner; this turns them
# into Doxygen's form on the fly (the files themselves are not changed):
#   - the file's first comment block (after the SPDX line) documents the
#     file (\file);
#   - a block comment directly above a declaration documents it (/**), and
#     a comment after a member or macro on its line documents that (/**<);
#     comments followed by a blank line stay plain (section notes);
#   - in documentation, "name - " at the start of a block is dropped,
#     "@arg:" at the start of a line becomes a list item, "@arg" becomes
#     \p arg, and backslashes, '#', '<', '>' and '%' are escaped;
#   - kernel-doc blocks (/**) get the same treatment; a struct's "@field:"
#     lines also document the fields that have no comment of their own;
#   - C's same-name typedefs are left out (typedef struct X X; and the
#     typedef of typedef struct X {...} X;): struct X is the documented name.
# Usage: awk -f doxyfilter.awk FILE.h
{ line[NR] = $0 }

function escape(s) {
    gsub(/\\/, "\\\\", s)
    gsub(/#/, "\\#", s)
    gsub(/</, "\\<", s)
    gsub(/>/, "\\>", s)
    gsub(/%/, "\\%", s)
    return s
}

# Doxygen markup for the text of one documentation line (no delimiters).
function doc_text(s, first_text) {
    s = escape(s)
    if (first_text)
        sub(/^( \* | *)(DOC: *|struct |union |enum )?[A-Za-z_][A-Za-z0-9_.\/]*(\(\))? - /, "&@@", s)
    if (first_text && s ~ /@@/) {
        sub(/(DOC: *|struct |union |enum )?[A-Za-z_][A-Za-z0-9_.\/]*(\(\))? - @@/, "", s)
    }
    if (s ~ /^ \* @[A-Za-z_][A-Za-z0-9_]*:/) {
        field = substr(s, 5)
        sub(/:.*/, "", field)
        fdoc[field] = substr(s, 5 + length(field) + 1)
        while (match(fdoc[field], /@[A-Za-z_][A-Za-z0-9_]*/))
            fdoc[field] = substr(fdoc[field], 1, RSTART - 1) "\\p " \
                substr(fdoc[field], RSTART + 1)
        sub(/^ \* @/, " * - @", s)
    }
    while (match(s, /@[A-Za-z_][A-Za-z0-9_]*/))
        s = substr(s, 1, RSTART - 1) "\\p " substr(s, RSTART + 1)
    return s
}

function is_decl(s) {
    if (s ~ /^[ \t]*$/) return 0
    if (s ~ /^[ \t]*\/[*\/]/) return 0
    if (s ~ /^[ \t]*#[ \t]*(if|ifdef|ifndef|endif|else|elif|include|undef)/)
        return 0
    if (s ~ /^[ \t]*}/) return 0
    return 1
}

# The member a line inside a struct declares, or "".
function member(s,    m) {
    if (s !~ /;[ \t]*$/ || s ~ /^[ \t]*(typedef|struct [A-Za-z_0-9]+;)/)
        return ""
    if (match(s, /\(\*[ \t]*[A-Za-z_][A-Za-z0-9_]*\)/))
        m = substr(s, RSTART + 2, RLENGTH - 3)
    else if (match(s, /[A-Za-z_][A-Za-z0-9_]*(\[[^]]*\])?[ \t]*;/)) {
        m = substr(s, RSTART, RLENGTH)
        sub(/[[ \t;].*/, "", m)
    }
    gsub(/[ \t*]/, "", m)
    return m
}

END {
    seen_file = 0
    depth = 0
    i = 1
    while (i <= NR) {
        s = line[i]
        # Same-name typedefs: struct X is the name documented.
        if (s ~ /^typedef struct [A-Za-z_0-9]+ [A-Za-z_0-9]+;/) {
            split(s, w, /[ ;]+/)
            if (w[3] == w[4]) { print ""; i++; continue }
        }
        if (s ~ /^typedef struct [A-Za-z_0-9]+ \{/) {
            split(s, w, /[ ]+/)
            tname = w[3]
            sub(/^typedef /, "", s)
        }
        if (tname != "" && s ~ "^} *" tname ";") {
            sub("^} *" tname ";", "};", s)
            tname = ""
        }
        if (s ~ /\{[ \t]*$/) depth++
        if (s ~ /^[ \t]*}/) { depth--; if (depth == 0) delete fdoc }
        # A field with no comment of its own, documented in the struct's
        # block by "@field:".
        if (depth > 0 && index(s, "/*") == 0 && (m = member(s)) != "" && (m in fdoc)) {
            print s " /**<" fdoc[m] " */"
            i++
            continue
        }
        # A block comment starting its line (plain or kernel-doc).
        if (s ~ /^[ \t]*\/\*/ && s !~ /^[ \t]*\/\*\*</) {
            j = i
            while (j <= NR && line[j] !~ /\*\//) j++
            spdx = (s ~ /SPDX-License-Identifier/)
            if (!spdx && !seen_file) {
                seen_file = 1
                sub(/\/\*\*?/, "/** \\file", s)
                doc = 1
                line[i] = s
            } else if (!spdx && (is_decl(line[j + 1]) || s ~ /^[ \t]*\/\*\*/)) {
                sub(/\/\*\*?/, "/**", s)
                if (depth == 0) delete fdoc
                doc = 1
                line[i] = s
            } else {
                doc = 0
            }
            for (k = i; k <= j; k++) {
                if (!doc) { print line[k]; continue }
                t = line[k]
                # Keep the delimiters out of the escaping.
                pre = ""; post = ""
                if (k == i) { match(t, /\/\*\*( \\file)?/); pre = substr(t, 1, RSTART + RLENGTH - 1); t = substr(t, RSTART + RLENGTH) }
                if (k == j) { p = index(t, "*/"); post = substr(t, p); t = substr(t, 1, p - 1) }
                first = (k == i && t ~ /[A-Za-z]/) || (k == i + 1 && line[i] ~ /\*\*( \\file)?[ \t]*$/)
                print pre doc_text(t, first) post
            }
            i = j + 1
            continue
        }
        # A comment after code on the same line documents that code.
        p = index(s, "/*")
        if (p > 1 && substr(s, 1, p - 1) ~ /[^ \t]/ && substr(s, p, 3) != "/**") {
            code = substr(s, 1, p - 1)
            rest = substr(s, p + 2)
            if (index(rest, "*/")) {
                q = index(rest, "*/")
                print code "/**<" doc_text(substr(rest, 1, q - 1), 0) substr(rest, q)
                i++
                continue
            }
            print code "/**<" doc_text(rest, 0)
            i++
            while (i <= NR && line[i] !~ /\*\//) { print doc_text(line[i], 0); i++ }
            if (i <= NR) {
                q = index(line[i], "*/")
                print doc_text(substr(line[i], 1, q - 1), 0) substr(line[i], q)
                i++
            }
            continue
        }
        print s
        i++
    }
}
