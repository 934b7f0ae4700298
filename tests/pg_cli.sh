#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The twheel tool on a PostgreSQL namespace (run by tests/pg_test.sh, which
# sets TW_PG_URL and TW_PG_BIN): --json documents when the store does not
# open (no schema, an empty namespace, nothing listening); init (installs,
# idempotent, starts no node, refuses a newer schema); timers and a dead
# letter written by SQL, then ls, get, stats, check, dead, export, delete
# and import through `twheel postgres`, each output and exit status
# checked; due times at the ends of bigint shown as they are.
# Usage: tests/pg_cli.sh TWHEEL_BINARY
set -euo pipefail
tw=$1
psql=("$TW_PG_BIN/psql" -qAtX -v ON_ERROR_STOP=1 "$TW_PG_URL")
fail() { echo "pg_cli: $*" >&2; exit 1; }
u=(--url "$TW_PG_URL" --ns cli)
out=$(mktemp)
trap 'rm -f "$out" "$out.x" "$out.ls" "$out.err"' EXIT

# run WANT_STATUS ARGS...: twheel postgres ARGS into $out.
run() {
  local want=$1 rc=0
  shift
  "$tw" postgres "$@" >"$out" 2>&1 || rc=$?
  [ "$rc" = "$want" ] || fail "twheel postgres $*: exit $rc, not $want: $(cat "$out")"
}

# json WANT ARGS...: twheel postgres ARGS --json, its stdout into $out:
# one JSON document.
json() {
  local want=$1 rc=0
  shift
  "$tw" postgres "$@" --json >"$out" 2>"$out.err" || rc=$?
  [ "$rc" = "$want" ] || fail "twheel postgres $* --json: exit $rc, not $want: $(cat "$out" "$out.err")"
  python3 -m json.tool "$out" >/dev/null || fail "twheel postgres $*: not one JSON document: $(cat "$out")"
}
# jq_ok EXPR: a Python assertion on the document d in $out.
jq_ok() {
  python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert $1, d" "$out" ||
    fail "$1: $(cat "$out")"
}

# Before any store opened the database writable: no schema, said so, and
# with --json in one document (check: nothing there, exit 3).
run 2 stats "${u[@]}"
grep -q "no schema twheel" "$out" || fail "stats without a schema: $(cat "$out")"
json 3 check "${u[@]}"
jq_ok 'd["status"] == "missing" and not d["ok"] and "no schema twheel" in d["problem"]'
for v in ls stats dead; do
  json 2 "$v" "${u[@]}"
  jq_ok '"no schema twheel" in d["error"]'
done
json 2 get k "${u[@]}"
jq_ok 'not d["found"] and d["key"] == "k" and d["error"]'
# A namespace refused at open (empty), a server not reachable: the same.
json 2 check --url "$TW_PG_URL" --ns ""
jq_ok 'd["status"] == "error" and "namespace" in d["error"]'
json 2 ls --url "host=127.0.0.1 port=1 connect_timeout=5"
jq_ok 'd["timers"] == [] and "unreachable" in d["error"]'

# init installs the schema without starting a node; run again it
# changes nothing; a timer due now is left unclaimed by it.
run 0 init "${u[@]}"
grep -q "schema twheel installed" "$out" || fail "init: $(cat "$out")"
[ "$("${psql[@]}" -c "SELECT max(v) FROM twheel.version")" = 1 ] || fail "init: no version row"
"${psql[@]}" -c "SELECT twheel.schedule('cli', 'now', 0, 'x')" >/dev/null
json 0 init "${u[@]}"
jq_ok 'd["ok"] and not d["installed"] and not d["upgraded"] and d["error"] is None'
run 0 init "${u[@]}"
grep -q "up to date: nothing to do" "$out" || fail "init again: $(cat "$out")"
[ "$("${psql[@]}" -c "SELECT attempts, owner IS NULL FROM twheel.timers WHERE ns = 'cli'")" = "0|t" ] ||
  fail "init claimed a timer"
"${psql[@]}" -c "DELETE FROM twheel.timers WHERE ns = 'cli'"
run 3 check "${u[@]}"
# A schema newer than the library: refused, both versions named.
"${psql[@]}" -c "UPDATE twheel.version SET v = 99"
json 2 init "${u[@]}"
jq_ok '"version 99" in d["error"] and "knows 1" in d["error"]'
"${psql[@]}" -c "UPDATE twheel.version SET v = 1"
# Not for the other backends.
run 2 init --url 127.0.0.1:1

# Timers by SQL, far in the future, and a dead letter.
"${psql[@]}" -c "SELECT twheel.schedule('cli', 'a', now() + interval '1 day', 'pa'),
  twheel.schedule('cli', 'b', now() + interval '2 days', 'pb'),
  twheel.schedule('cli', 'c'::bytea, 4102444800000, 'pc'::bytea)" >/dev/null
"${psql[@]}" -c "INSERT INTO twheel.dead (ns, key, due, payload, attempts)
  VALUES ('cli', 'd', 0, 'pd', 3)"

run 0 ls "${u[@]}"
[ "$(awk '{print $NF}' "$out" | tr '\n' ' ')" = "a b c " ] ||
  [ "$(grep -o '[abc]$' "$out" | tr '\n' ' ')" = "a b c " ] ||
  fail "ls: $(cat "$out")"
run 0 get b "${u[@]}" --json
grep -q '"payload":"pb"' "$out" || fail "get: $(cat "$out")"
run 1 get nope "${u[@]}"
run 0 stats "${u[@]}" --json
grep -q '"pending":3' "$out" && grep -q '"dead":1' "$out" || fail "stats: $(cat "$out")"
run 0 check "${u[@]}"
grep -q "3 pending timers" "$out" || fail "check: $(cat "$out")"
run 0 dead "${u[@]}"
grep -q "d" "$out" || fail "dead: $(cat "$out")"
run 0 export "${u[@]}" --out "$out.x"
[ "$(wc -l <"$out.x")" = 4 ] || fail "export: $(cat "$out.x")"
run 0 delete d "${u[@]}"
run 1 delete d "${u[@]}"
# The export into another namespace: the same timers and dead letter.
run 0 import --url "$TW_PG_URL" --ns cli2 --in "$out.x"
run 0 stats --url "$TW_PG_URL" --ns cli2 --json
grep -q '"pending":3' "$out" && grep -q '"dead":1' "$out" || fail "import: $(cat "$out")"
# Due times at the ends of bigint and before 1970, written by SQL: ls
# shows the real value in text and JSON alike, as get and export do;
# dead shows a dead letter's own due time.
"${psql[@]}" -c "INSERT INTO twheel.timers (ns, key, due, payload) VALUES
  ('x', 'min', -9223372036854775808, ''), ('x', 'neg', -1001, ''),
  ('x', 'max', 9223372036854775807, '')"
"${psql[@]}" -c "INSERT INTO twheel.dead (ns, key, due, payload, attempts)
  VALUES ('x', 'dneg', -1, '', 2)"
x=(--url "$TW_PG_URL" --ns x)
json 0 ls "${x[@]}"
cp "$out" "$out.ls"
jq_ok '[(e["key"], e["due_ms"]) for e in d["timers"]] == [("min", -2**63), ("neg", -1001), ("max", 2**63 - 1)]'
jq_ok 'd["timers"][1]["due"] == "1969-12-31T23:59:58.999Z"'
run 0 ls "${x[@]}"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))["timers"]
t=[l.split() for l in open(sys.argv[2])]
assert [(w[0], w[-1]) for w in t] == [(e["due"], e["key"]) for e in d], (t, d)' "$out.ls" "$out" ||
  fail "ls text and JSON differ: $(cat "$out" "$out.ls")"
for k in min max neg; do
  json 0 get "$k" "${x[@]}"
  python3 -c 'import json,sys; g=json.load(open(sys.argv[1])); l=json.load(open(sys.argv[2]))["timers"]
assert [(e["due_ms"], e["due"]) for e in l if e["key"] == g["key"]] == [(g["due_ms"], g["due"])], (g, l)' "$out" "$out.ls" ||
    fail "get $k and ls differ: $(cat "$out")"
  run 0 get "$k" "${x[@]}"
done
json 0 dead "${x[@]}"
jq_ok '[(e["key"], e["due_ms"]) for e in d["dead"]] == [("dneg", -1)]'
run 0 export "${x[@]}"
grep -q '"due_ms":-9223372036854775808' "$out" || fail "export: $(cat "$out")"
rm -f "$out.ls"

# A password in a connection string never shows in a message.
run 2 stats --url "host=127.0.0.1 port=1 password=sekrit connect_timeout=2" --ns x
! grep -q sekrit "$out" || fail "a password shown: $(cat "$out")"
echo "pg_cli: ok"
