#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The twheel tool on a PostgreSQL namespace (run by tests/pg_test.sh, which
# sets TW_PG_URL and TW_PG_BIN): timers and a dead letter written by SQL,
# then ls, get, stats, check, dead, export, delete and import through
# `twheel postgres`, each output and exit status checked.
# Usage: tests/pg_cli.sh TWHEEL_BINARY
set -euo pipefail
tw=$1
psql=("$TW_PG_BIN/psql" -qAtX -v ON_ERROR_STOP=1 "$TW_PG_URL")
fail() { echo "pg_cli: $*" >&2; exit 1; }
u=(--url "$TW_PG_URL" --ns cli)
out=$(mktemp)
trap 'rm -f "$out" "$out.x"' EXIT

# run WANT_STATUS ARGS...: twheel postgres ARGS into $out.
run() {
  local want=$1 rc=0
  shift
  "$tw" postgres "$@" >"$out" 2>&1 || rc=$?
  [ "$rc" = "$want" ] || fail "twheel postgres $*: exit $rc, not $want: $(cat "$out")"
}

# Before any store opened the database writable: no schema, said so.
run 2 stats "${u[@]}"
grep -q "no schema twheel" "$out" || fail "stats without a schema: $(cat "$out")"
# An import (a writable open) installs it; an empty one imports nothing.
run 0 import "${u[@]}" --in /dev/null
run 3 check "${u[@]}"

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
# A password in a connection string never shows in a message.
run 2 stats --url "host=127.0.0.1 port=1 password=sekrit connect_timeout=2" --ns x
! grep -q sekrit "$out" || fail "a password shown: $(cat "$out")"
echo "pg_cli: ok"
