# SPDX-License-Identifier: MIT
# Writes one man page (section 3) per public function of twheel's headers,
# from the comment block right above each TW_EXTERN declaration: NAME from
# its "name - summary" line (or the block's first sentence), SYNOPSIS from
# the declaration, DESCRIPTION from the rest of the block (kernel-doc
# "@arg:" lines become a tagged list, "@arg" and "%CONST" in the text
# italic and bold), SEE ALSO the header's page.
# Usage: awk -v outdir=DIR -v version=X.Y.Z -f man_functions.awk HEADERS...
# Prints the names it wrote, one per line.

function esc(s) {
    gsub(/\\/, "\\e", s)
    if (s ~ /^[.']/)
        s = "\\&" s
    return s
}

# esc() and kernel-doc's inline markers: "@name" (a parameter or field) in
# italics, as man pages set arguments; "%NAME" (a constant) in bold.
function text(s,    out) {
    s = esc(s)
    out = ""
    while (match(s, /[@%][A-Za-z_][A-Za-z0-9_]*/)) {
        out = out substr(s, 1, RSTART - 1) \
            (substr(s, RSTART, 1) == "@" ? "\\fI" : "\\fB") \
            substr(s, RSTART + 1, RLENGTH - 1) "\\fP"
        s = substr(s, RSTART + RLENGTH)
    }
    return out s
}

function flush_page(    name, f, hdr, i, line, summary, start, m, rest, lead) {
    if (decl !~ /\(/)
        return
    name = decl
    sub(/^TW_EXTERN[ \t]+/, "", name)
    if (match(name, /[A-Za-z_][A-Za-z_0-9]*[ \t]*\(/) == 0)
        return
    name = substr(name, RSTART, RLENGTH)
    sub(/[ \t]*\($/, "", name)
    hdr = FILENAME
    sub(/^.*\//, "", hdr)
    summary = ""
    start = 1
    if (ncom > 0 && index(com[1], name " - ") == 1) {
        summary = substr(com[1], length(name) + 4)
        start = 2
        # The summary runs on until a blank line or an @arg line.
        while (start <= ncom && com[start] != "" &&
           com[start] !~ /^@[A-Za-z_0-9.]+:/) {
            summary = summary " " com[start]
            start++
        }
    } else if (ncom > 0) {
        summary = com[1]
        start = 2
    }
    # NAME takes the first sentence; the rest opens the description.
    lead = ""
    if (match(summary, /\.( |$)/)) {
        lead = substr(summary, RSTART + RLENGTH)
        summary = substr(summary, 1, RSTART)
    }
    f = outdir "/" name ".3"
    printf ".TH %s 3 \"\" \"twheel %s\" \"twheel manual\"\n", name,
        version > f
    print ".SH NAME" > f
    printf "%s \\- %s\n", name, text(summary) > f
    print ".SH SYNOPSIS" > f
    print ".nf" > f
    printf ".B #include <twheel/%s>\n", hdr > f
    print ".PP" > f
    n = split(decl, dl, "\n")
    for (i = 1; i <= n; i++) {
        line = dl[i]
        sub(/^TW_EXTERN[ \t]+/, "", line)
        if (i > 1) {
            sub(/^[ \t]+/, "", line)
            line = "    " line
        }
        print esc(line) > f
    }
    print ".fi" > f
    print ".SH DESCRIPTION" > f
    if (lead != "")
        print text(lead) > f
    for (i = start; i <= ncom; i++) {
        line = com[i]
        if (line == "") {
            print ".PP" > f
        } else if (match(line, /^@[A-Za-z_0-9.]+:/)) {
            m = substr(line, 2, RLENGTH - 2)
            rest = substr(line, RLENGTH + 1)
            sub(/^[ \t]+/, "", rest)
            print ".TP" > f
            printf ".I %s\n", m > f
            if (rest != "")
                print text(rest) > f
        } else if (line ~ /^(Context|Return|Returns):/) {
            print ".PP" > f
            print text(line) > f
        } else {
            print text(line) > f
        }
    }
    print ".SH SEE ALSO" > f
    printf ".BR twheel_%s (3)\n", hdr > f
    close(f)
    print name
}

FNR == 1 { incom = 0; ncom = 0; indecl = 0; decl = "" }

indecl {
    decl = decl "\n" $0
    if ($0 ~ /;[ \t]*$/) {
        indecl = 0
        flush_page()
        ncom = 0
    }
    next
}

incom {
    line = $0
    done = line ~ /\*\//
    sub(/\*\/.*$/, "", line)
    sub(/^[ \t]*\*[ \t]*/, "", line)
    sub(/[ \t]+$/, "", line)
    if (!(done && line == "") || ncom > 0)
        com[++ncom] = line
    if (done) {
        incom = 0
        while (ncom > 0 && com[ncom] == "")
            ncom--
    }
    next
}

/^\/\*/ {
    ncom = 0
    line = $0
    if (line ~ /\*\//) {
        # A one-line comment: its text is the whole description.
        sub(/^\/\*+[ \t]*/, "", line)
        sub(/[ \t]*\*\/.*$/, "", line)
        com[++ncom] = line
        next
    }
    sub(/^\/\*+[ \t]*/, "", line)
    if (line != "")
        com[++ncom] = line
    incom = 1
    next
}

/^TW_EXTERN/ {
    decl = $0
    if ($0 ~ /;[ \t]*$/) {
        flush_page()
        ncom = 0
    } else {
        indecl = 1
    }
    next
}

/^[ \t]*$/ { next }

{ ncom = 0 }
