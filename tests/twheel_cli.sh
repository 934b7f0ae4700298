#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The twheel tool against real stores made by tests/twheel_cli_store.c.
# Usage:
#   tests/twheel_cli.sh journal TWHEEL STORE [TWHEELD]
#       a journal: ls (pages, --after, --json), get, stats (--metrics),
#       check; read-only verbs on a directory a live store holds, which
#       goes on undisturbed, and repair refused there; then damage in the
#       middle of the journal: check and repair --dry-run exit 1 and change
#       nothing (ls and stats show what a repair keeps), repair names the
#       dropped key and fixes it, check passes again. Dead letters (a
#       journal of its own): dead (--after), get, stats; rearm and delete
#       refused while a live store holds it, then done. A torn tail (cut,
#       garbled) named by check (exit 3); missing segments; nothing here
#       (exit 3); export and import; a backup of a live journal under load
#       restored; with TWHEELD, twheel jobs on a journal twheeld wrote.
#       --help of each verb, --version, no password in messages; with
#       --json, one whole document with an error when a store does not
#       open (journal, Redis, PostgreSQL on a closed loopback port); due
#       times at the ends of int64 shown as they are by ls, get and dead.
#   TWHEEL=... STORE=... tests/redis_test.sh suite tests/twheel_cli.sh
#       the same verbs on a Redis namespace (redis_test.sh passes "suite"
#       and the server's address), a misspelled namespace, moves from a
#       journal to Redis and back, a backup of a live namespace restored.
set -euo pipefail
py=/usr/bin/python3
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "ok: $*"; }
shape() { $py -c 'import json,sys; print(sorted(json.load(open(sys.argv[1]))))' "$tmp/out"; }
expect_rc() { # WANT CMD...: run CMD, its status must be WANT
  local want=$1 rc=0
  shift
  "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  [ "$rc" = "$want" ] || { cat "$tmp/out" "$tmp/err" >&2; fail "$* exited $rc, want $want"; }
}

if [ "$1" = suite ]; then # from redis_test.sh
  mode=redis addr=$2 tw=$TWHEEL store=$STORE
else
  mode=$1 tw=$2 store=$3 twheeld=${4:-}
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/twcli.XXXXXX")
holder=
cleanup() {
  if [ -n "$holder" ]; then kill -9 "$holder" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

# Import lines whose attempts must survive: a pending timer's next
# delivery, a dead letter's count.
attempts='{"key":"a4","due_ms":4102444800000,"attempt":4,"payload_b64":""}
{"key":"d5","due_ms":1000,"dead":true,"attempt":5,"payload_b64":"eA=="}'
check_attempts() { # BACKEND STORE-ARGS...: a4 and d5 read back
  expect_rc 0 "$tw" "$1" get "${@:2}" a4 --json
  $py -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["attempt"]==4 and d["state"]=="waiting", d' "$tmp/out"
  expect_rc 0 "$tw" "$1" get "${@:2}" d5 --json
  $py -c 'import json,sys; d=json.load(open(sys.argv[1]))
assert d["attempt"]==5 and d["state"]=="dead" and d["payload"]=="x" and d["due_ms"]==1000, d' "$tmp/out"
}
expect_rc 0 "$tw" --help
grep -q '^usage: twheel' "$tmp/out" || fail "--help"
expect_rc 2 "$tw" journal
expect_rc 2 "$tw" nosuch ls x
# No password in any message: a URL's credentials are left out.
expect_rc 2 "$tw" redis check --url redis://u:sekret@127.0.0.1:1
! grep -q sekret "$tmp/out" "$tmp/err" && grep -q 'redis://\*\*\*@127.0.0.1:1' "$tmp/err" ||
  fail "a password shown: $(cat "$tmp/err")"
expect_rc 0 "$tw" --version
grep -Eq '^twheel [0-9]+\.[0-9]+\.[0-9]+' "$tmp/out" || fail "--version: $(cat "$tmp/out")"
expect_rc 0 "$tw" journal --help
grep -q '^usage: twheel journal VERB' "$tmp/out" || fail "journal --help"
for v in ls get stats check repair dead rearm delete export import jobs init; do
  expect_rc 0 "$tw" "$v" --help
  grep -q "^usage: twheel .*$v" "$tmp/out" || fail "$v --help: $(head -1 "$tmp/out")"
  cp "$tmp/out" "$tmp/help-$v"
  expect_rc 0 "$tw" journal "$v" /x --help
  cmp -s "$tmp/out" "$tmp/help-$v" || fail "journal $v --help differs from $v --help"
done
[ "$(cat "$tmp"/help-* | sort -u | grep -c '^usage:')" = 12 ] || fail "verbs share a help text"

# --json when the store does not open (a journal directory missing or a
# file, nothing listening on a loopback port for Redis or PostgreSQL, a
# namespace refused; every verb for some, four verbs for the rest, to
# keep the test short): one whole document per verb, with an "error" field,
# and exit 2 (check of a missing directory: 3, nothing there); rearm and
# delete do not make a missing directory.
mkdir "$tmp/docs"
ndoc=0
json_doc() { # WANT-RC CMD...: its stdout kept for the check below
  expect_rc "$@"
  ndoc=$((ndoc + 1))
  cp "$tmp/out" "$tmp/docs/$ndoc"
  printf '%s\n' "${*:2}" >"$tmp/docs/cmd-$ndoc"
}
: >"$tmp/afile"
closed=(--url 127.0.0.1:1)
pgclosed=(--url "host=127.0.0.1 port=1 connect_timeout=5")
for v in ls get stats check dead rearm delete import repair jobs init; do
  k=(); case $v in get | rearm | delete) k=(somekey) ;; esac
  want=2; [ "$v" = check ] && want=3
  # (import makes a new journal there: moving a store into a new one)
  [ "$v" = import ] || json_doc "$want" "$tw" journal "$v" "$tmp/nodir" "${k[@]}" --json </dev/null
  json_doc 2 "$tw" postgres "$v" "${pgclosed[@]}" "${k[@]}" --json </dev/null
  case $v in ls | check | get | import) ;; *) continue ;; esac
  json_doc 2 "$tw" journal "$v" "$tmp/afile" "${k[@]}" --json </dev/null
  json_doc 2 "$tw" redis "$v" "${closed[@]}" "${k[@]}" --json </dev/null
  json_doc 2 "$tw" redis "$v" "${closed[@]}" --ns "" "${k[@]}" --json </dev/null
  json_doc 2 "$tw" postgres "$v" "${pgclosed[@]}" --ns "" "${k[@]}" --json </dev/null
done
json_doc 2 "$tw" journal import "$tmp/j-new" --in "$tmp/no-such-file" --json
# Each stdout: one JSON object (what python3 -m json.tool reads) with the
# error in it (check: also its problem).
$py - "$tmp/docs" "$ndoc" <<'PY' || fail "--json of a store that did not open"
import glob, json, os, sys
n = 0
for f in glob.glob(sys.argv[1] + "/[0-9]*"):
    cmd = open(os.path.join(sys.argv[1], "cmd-" + os.path.basename(f))).read()
    try:
        d = json.load(open(f))
    except ValueError:
        sys.exit("not one JSON document: %s: %r" % (cmd, open(f).read()))
    if not isinstance(d, dict) or not (d.get("error") or d.get("problem")):
        sys.exit("no error: %s: %r" % (cmd, d))
    n += 1
assert n == int(sys.argv[2]), n
PY
[ ! -e "$tmp/nodir" ] || fail "a verb made the missing directory"
step "--json of every verb when the store does not open: one document, the error in it"

# Due times at the ends of int64 and around 1970: get, ls (text and
# --json: the same real value), dead and export agree; no overflow in
# the dates (UBSan in the asan-ubsan tree).
ext="$tmp/extremes"
printf '%s\n' \
  '{"key":"min","due_ms":-9223372036854775808,"payload_b64":""}' \
  '{"key":"neg","due_ms":-1001,"payload_b64":""}' \
  '{"key":"zero","due_ms":0,"payload_b64":""}' \
  '{"key":"max","due_ms":9223372036854775807,"payload_b64":""}' \
  '{"key":"big","due_ms":9007199254740993,"payload_b64":""}' \
  '{"key":"dmin","due_ms":-9223372036854775808,"dead":true,"attempt":2,"payload_b64":""}' \
  '{"key":"dneg","due_ms":-1,"dead":true,"attempt":3,"payload_b64":""}' >"$tmp/ext.jsonl"
expect_rc 0 "$tw" journal import "$ext" --in "$tmp/ext.jsonl"
expect_rc 0 "$tw" journal ls "$ext" --json
cp "$tmp/out" "$tmp/ls.json"
expect_rc 0 "$tw" journal ls "$ext"
cp "$tmp/out" "$tmp/ls.txt"
expect_rc 0 "$tw" journal dead "$ext" --json
cp "$tmp/out" "$tmp/dead.json"
expect_rc 0 "$tw" journal dead "$ext"
cp "$tmp/out" "$tmp/dead.txt"
$py - "$tmp" <<'PY' || fail "extreme due times: $(cat "$tmp/ls.json" "$tmp/ls.txt" "$tmp/dead.json" "$tmp/dead.txt")"
import json, sys
t = sys.argv[1]
want = {"min": -2**63, "neg": -1001, "zero": 0, "max": 2**63 - 1, "big": 2**53 + 1}
ls = json.load(open(t + "/ls.json"))["timers"]
assert {e["key"]: e["due_ms"] for e in ls} == want, ls
assert [e["key"] for e in ls] == ["min", "neg", "zero", "big", "max"], ls
text = [l.split() for l in open(t + "/ls.txt")]
assert [(w[0], w[-1]) for w in text] == [(e["due"], e["key"]) for e in ls], text
assert ls[1]["due"] == "1969-12-31T23:59:58.999Z" and ls[2]["due"] == "1970-01-01T00:00:00.000Z", ls
dead = json.load(open(t + "/dead.json"))["dead"]
assert {e["key"]: (e["due_ms"], e["attempts"]) for e in dead} == {"dmin": (-2**63, 2), "dneg": (-1, 3)}, dead
text = [l.split() for l in open(t + "/dead.txt")]
assert [(w[0], w[-1]) for w in text] == [(e["due"], e["key"]) for e in dead], text
PY
for k in min max neg; do
  expect_rc 0 "$tw" journal get "$ext" "$k" --json
  $py -c 'import json,sys; d=json.load(open(sys.argv[1])); l=json.load(open(sys.argv[2]))["timers"]
assert [e["due_ms"] for e in l if e["key"]==d["key"]] == [d["due_ms"]], (d, l)' "$tmp/out" "$tmp/ls.json"
  expect_rc 0 "$tw" journal get "$ext" "$k"
done
step "due times at the ends of int64: ls, get and dead show the real value, text and JSON alike"

if [ "$mode" = redis ]; then
  ns=twcli$$
  "$store" redis "$addr" "$ns" 30
  r=(--url "$addr" --ns "$ns" --shards 8)
  expect_rc 0 "$tw" redis ls "${r[@]}"
  [ "$(wc -l <"$tmp/out")" = 32 ] || fail "redis ls: $(wc -l <"$tmp/out") lines"
  head -1 "$tmp/out" | grep -q ' t000$' || fail "redis ls order"
  grep -q 'bin\\x01\\xff$' "$tmp/out" || fail "redis ls: binary key"
  expect_rc 0 "$tw" redis ls "${r[@]}" --json --limit 7
  $py -c 'import json,sys; d=json.load(open(sys.argv[1]));
assert d["count"]==7 and d["more"] and d["after"]["key"]=="t006", d' "$tmp/out"
  expect_rc 0 "$tw" redis ls "${r[@]}" --after "$($py -c 'import json,sys
d=json.load(open(sys.argv[1]))["after"]; print("%d,%s" % (d["due_ms"], d["key"]))' "$tmp/out")" --limit 1
  grep -q ' t007$' "$tmp/out" || fail "redis ls --after"
  expect_rc 0 "$tw" redis get "${r[@]}" t005
  grep -q 'payload:  2 bytes: p5' "$tmp/out" || fail "redis get"
  expect_rc 1 "$tw" redis get "${r[@]}" nosuch
  expect_rc 0 "$tw" redis stats "${r[@]}" --json
  $py -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["pending"]==32, d' "$tmp/out"
  expect_rc 0 "$tw" redis check "${r[@]}"
  grep -q '32 pending timers' "$tmp/out" || fail "redis check"
  expect_rc 2 "$tw" redis repair "${r[@]}"
  # A typo in --ns: nothing here, exit 3, not "ok, 0 pending".
  expect_rc 3 "$tw" redis check --url "$addr" --ns "typo$ns" --shards 8
  grep -q "nothing here: namespace typo$ns holds no timer" "$tmp/out" || fail "redis check --ns typo: $(cat "$tmp/out")"
  expect_rc 3 "$tw" redis check --url "$addr" --ns "typo$ns" --json
  $py -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["status"]=="empty" and not d["ok"], d' "$tmp/out"
  expect_rc 0 "$tw" redis stats --url "$addr" --ns "typo$ns"
  grep -q 'nothing here' "$tmp/err" || fail "redis stats --ns typo warns"
  # The namespace records its shard count: another --shards is refused
  # with both numbers; without --shards the recorded count is used.
  expect_rc 2 "$tw" redis ls --url "$addr" --ns "$ns" --shards 16
  grep -q 'has 8 shards, this open asked for 16' "$tmp/err" ||
    fail "redis ls --shards 16: $(cat "$tmp/err")"
  expect_rc 0 "$tw" redis ls --url "$addr" --ns "$ns"
  [ "$(wc -l <"$tmp/out")" = 32 ] || fail "redis ls without --shards: $(wc -l <"$tmp/out") lines"
  # A key of the wrong type: ls, check and stats name its shard and key
  # and exit 1; --json prints a whole document.
  bad=twbad$$
  "$store" redis "$addr" "$bad" 30
  rcli=(redis-cli -h "${addr%:*}" -p "${addr##*:}")
  "${rcli[@]}" del "{$bad:3}:d" >/dev/null
  "${rcli[@]}" set "{$bad:3}:d" junk >/dev/null
  want="shard 3: key {$bad:3}:d is a string, not a zset"
  expect_rc 1 "$tw" redis ls --url "$addr" --ns "$bad"
  grep -qF "$want" "$tmp/err" || fail "redis ls, wrong type: $(cat "$tmp/err")"
  expect_rc 1 "$tw" redis ls --url "$addr" --ns "$bad" --json
  $py -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["error"], d' "$tmp/out"
  expect_rc 1 "$tw" redis check --url "$addr" --ns "$bad"
  grep -qF "damaged: $want" "$tmp/out" || fail "redis check, wrong type: $(cat "$tmp/out")"
  expect_rc 1 "$tw" redis check --url "$addr" --ns "$bad" --json
  $py -c 'import json,sys; d=json.load(open(sys.argv[1]))
assert d["status"]=="damaged" and not d["ok"], d
w=d["ignored"][0]
assert (w["kind"], w["shard"], w["type"], w["want"])==("wrong_type", 3, "string", "zset"), d' "$tmp/out"
  expect_rc 1 "$tw" redis stats --url "$addr" --ns "$bad" --json
  $py -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/out"
  step "redis: a key of the wrong type named by shard and key, exit 1"
  # A record copied into a shard its key does not hash to: check names
  # it, beside its real timer and after that one is deleted (before: ok
  # with the copy counted as a timer, then "No such timer").
  cp=twcp$$
  "$store" redis "$addr" "$cp" 30
  s=$($py -c 'h=1469598103934665603
for b in b"t005": h=((h^b)*1099511628211)%(1<<64)
print(h%8)')
  w=$(((s + 1) % 8))
  v=$("${rcli[@]}" hget "{$cp:$s}:p" t005)
  sc=$("${rcli[@]}" zscore "{$cp:$s}:d" t005)
  "${rcli[@]}" hset "{$cp:$w}:p" t005 "$v" >/dev/null
  "${rcli[@]}" zadd "{$cp:$w}:d" "$sc" t005 >/dev/null
  expect_rc 1 "$tw" redis check --url "$addr" --ns "$cp"
  grep -qF "timer t005: listed twice: a record in a shard the key does not hash to" "$tmp/out" ||
    fail "redis check, a copy: $(cat "$tmp/out")"
  "${rcli[@]}" zrem "{$cp:$s}:d" t005 >/dev/null
  "${rcli[@]}" hdel "{$cp:$s}:p" t005 >/dev/null
  expect_rc 1 "$tw" redis check --url "$addr" --ns "$cp"
  grep -qF "timer t005: listed, but not where its key hashes to" "$tmp/out" ||
    fail "redis check, a copy alone: $(cat "$tmp/out")"
  step "redis: a record in a shard its key does not hash to named, exit 1"
  # Read-only: nothing was claimed or changed by any of it.
  expect_rc 0 "$tw" redis ls "${r[@]}" --json
  $py -c 'import json,sys; d=json.load(open(sys.argv[1]))
assert d["count"]==32 and all(t["state"]=="waiting" for t in d["timers"]), d' "$tmp/out"
  step "redis: ls, get, stats, check; repair refused"
  # Dead letters: listed, counted, re-armed and deleted beside the store.
  expect_rc 0 "$tw" redis dead "${r[@]}"
  [ "$(wc -l <"$tmp/out")" = 2 ] && head -1 "$tmp/out" | grep -q 'attempts 1 *dead-a$' ||
    fail "redis dead: $(cat "$tmp/out")"
  expect_rc 0 "$tw" redis stats "${r[@]}" --json
  $py -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["dead"]==2 and d["pending"]==32, d' "$tmp/out"
  expect_rc 0 "$tw" redis get "${r[@]}" dead-b
  grep -q 'state:    dead' "$tmp/out" || fail "redis get of a dead letter"
  expect_rc 0 "$tw" redis rearm "${r[@]}" dead-a --at 4102444800000
  expect_rc 1 "$tw" redis rearm "${r[@]}" dead-a
  expect_rc 0 "$tw" redis delete "${r[@]}" dead-b --json
  $py -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"], d' "$tmp/out"
  expect_rc 1 "$tw" redis delete "${r[@]}" dead-b
  expect_rc 0 "$tw" redis dead "${r[@]}" --json
  $py -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["count"]==0, d' "$tmp/out"
  expect_rc 0 "$tw" redis get "${r[@]}" dead-a --json
  $py -c 'import json,sys; d=json.load(open(sys.argv[1]))
assert d["state"]=="waiting" and d["attempt"]==1 and d["due_ms"]==4102444800000, d' "$tmp/out"
  # A password from the environment is used (this server has none: AUTH
  # is refused) and never shown.
  TWHEEL_REDIS_PASSWORD=sekret2 expect_rc 2 "$tw" redis check "${r[@]}"
  grep -q 'refused the credentials' "$tmp/err" && ! grep -q sekret2 "$tmp/out" "$tmp/err" ||
    fail "TWHEEL_REDIS_PASSWORD: $(cat "$tmp/err")"
  step "redis: dead, rearm, delete; TWHEEL_REDIS_PASSWORD used, not shown"
  # A journal moved to Redis and back: export, import into an empty
  # namespace, export again: the same lines; and that namespace's export
  # into a journal gives them once more.
  "$store" make "$tmp/rj" 20
  expect_rc 0 "$tw" journal export "$tmp/rj" --out "$tmp/e1"
  r2=(--url "$addr" --ns "port$ns" --shards 8)
  expect_rc 0 "$tw" redis import "${r2[@]}" --in "$tmp/e1"
  grep -q 'imported 21 pending timers and 2 dead letters' "$tmp/out" || fail "redis import: $(cat "$tmp/out")"
  expect_rc 0 "$tw" redis export "${r2[@]}" --out "$tmp/e2"
  cmp <(sort "$tmp/e1") <(sort "$tmp/e2") || fail "journal -> redis -> export differs"
  cmp <("$tw" journal ls "$tmp/rj") <("$tw" redis ls "${r2[@]}") || fail "ls after redis import differs"
  expect_rc 1 "$tw" redis import "${r2[@]}" --in "$tmp/e1"
  grep -q 'held already' "$tmp/err" || fail "redis import of held keys"
  echo "$attempts" | expect_rc 0 "$tw" redis import "${r2[@]}"
  check_attempts redis "${r2[@]}"
  expect_rc 0 "$tw" redis export "${r[@]}" --out "$tmp/e3" # the suite's namespace
  expect_rc 0 "$tw" journal import "$tmp/rj2" --in "$tmp/e3"
  expect_rc 0 "$tw" journal export "$tmp/rj2" --out "$tmp/e4"
  cmp <(sort "$tmp/e3") <(sort "$tmp/e4") || fail "redis -> journal -> export differs"
  step "export and import: journal -> redis -> export, redis -> journal -> export the same"
  # Backing up a live namespace: export while a node schedules under load
  # (and fires), then the node killed: the backup, restored into a
  # journal, holds every timer acknowledged before the export began.
  "$store" rload "$addr" "live$ns" 1000000 >"$tmp/acked" &
  holder=$!
  for _ in $(seq 600); do
    [ "$(wc -l <"$tmp/acked")" -ge 300 ] && break
    sleep 0.05
  done
  before=$(wc -l <"$tmp/acked")
  [ "$before" -ge 300 ] || fail "the loader acknowledged $before timers"
  expect_rc 0 "$tw" redis export --url "$addr" --ns "live$ns" --shards 8 --out "$tmp/backup"
  kill -9 "$holder"
  { wait "$holder"; } 2>/dev/null || true
  holder=
  expect_rc 0 "$tw" journal import "$tmp/rrestored" --in "$tmp/backup" --replace
  expect_rc 0 "$tw" journal export "$tmp/rrestored"
  $py -c 'import base64,json,sys
have={json.loads(l)["key"]: json.loads(l) for l in open(sys.argv[1])}
acked=open(sys.argv[2]).read().split("\n")[:int(sys.argv[3])]
miss=[k for k in acked if k not in have]
assert not miss, "%d of %d acknowledged timers missing: %s" % (len(miss), len(acked), miss[:5])' "$tmp/out" "$tmp/acked" "$before"
  step "backup of a live namespace under load: every timer acknowledged before it ($before) restored"
  exit 0
fi

dir=$tmp/j
"$store" make "$dir" 50
expect_rc 0 "$tw" journal ls "$dir"
[ "$(wc -l <"$tmp/out")" = 51 ] || fail "ls: $(wc -l <"$tmp/out") lines"
head -1 "$tmp/out" | grep -q 'waiting  t000$' || fail "ls order: $(head -1 "$tmp/out")"
tail -1 "$tmp/out" | grep -q 'bin\\x01\\xff$' || fail "ls: binary key"
expect_rc 0 "$tw" journal ls "$dir" --json
$py -c 'import json,sys; d=json.load(open(sys.argv[1])); t=d["timers"]
assert d["count"]==51 and not d["more"] and len(t)==51, d
assert [x["due_ms"] for x in t]==sorted(x["due_ms"] for x in t)
assert t[-1]["key"]=="bin\x01\xff" and t[-1]["key_hex"]=="62696e01ff", t[-1]' "$tmp/out"
expect_rc 0 "$tw" journal ls "$dir" --limit 10
[ "$(wc -l <"$tmp/out")" = 11 ] || fail "ls --limit"
after=$(tail -1 "$tmp/out" | sed -n 's/^(more: --after \(.*\))$/\1/p')
[ -n "$after" ] || fail "ls --limit: no resume line"
expect_rc 0 "$tw" journal ls "$dir" --after "$after" --limit 1
grep -q ' t010$' "$tmp/out" || fail "ls --after: $(cat "$tmp/out")"
from=$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["timers"][40]["due_ms"])' <(
  "$tw" journal ls "$dir" --json))
expect_rc 0 "$tw" journal ls "$dir" --from "$from" --to $((from + 2000))
[ "$(wc -l <"$tmp/out")" = 2 ] && head -1 "$tmp/out" | grep -q ' t040$' || fail "ls --from --to"
step "journal ls: order, pages, --after, --from/--to, --json, binary keys"

expect_rc 0 "$tw" journal get "$dir" t007
grep -q 'payload:  2 bytes: p7' "$tmp/out" && grep -q 'attempt:  1' "$tmp/out" || fail "get"
expect_rc 0 "$tw" journal get "$dir" t007 --json
$py -c 'import json,sys; d=json.load(open(sys.argv[1]))
assert d["found"] and d["payload"]=="p7" and d["state"]=="waiting", d' "$tmp/out"
get_shape=$(shape)
expect_rc 1 "$tw" journal get "$dir" nosuch
expect_rc 1 "$tw" journal get "$dir" nosuch --json
[ "$(shape)" = "$get_shape" ] || fail "get --json: two shapes"
expect_rc 0 "$tw" journal stats "$dir"
grep -q '^pending *51$' "$tmp/out" || fail "stats"
expect_rc 0 "$tw" journal stats "$dir" --metrics
grep -q '^twheel_durable_pending 51$' "$tmp/out" || fail "stats --metrics"
expect_rc 0 "$tw" journal check "$dir"
grep -q 'ok: .* 51 pending timers' "$tmp/out" || fail "check"
expect_rc 2 "$tw" journal ls "$tmp/nosuch"
[ ! -e "$tmp/nosuch" ] || fail "ls made a directory"
step "journal get, stats (--metrics), check; a missing directory is not made"

# Dead letters, in a journal of their own.
dd=$tmp/d
"$store" make "$dd" 3
expect_rc 0 "$tw" journal dead "$dd"
[ "$(wc -l <"$tmp/out")" = 2 ] && head -1 "$tmp/out" | grep -q 'attempts 1 *dead-a$' ||
  fail "dead: $(cat "$tmp/out")"
expect_rc 0 "$tw" journal dead "$dd" --json
$py -c 'import json,sys; d=json.load(open(sys.argv[1]))
assert d["count"]==2 and [x["key"] for x in d["dead"]]==["dead-a","dead-b"], d
assert d["dead"][0]["attempts"]==1 and d["dead"][0]["payload_len"]==2, d' "$tmp/out"
expect_rc 0 "$tw" journal dead "$dd" --limit 1
[ "$(wc -l <"$tmp/out")" = 2 ] && grep -q '^(more: --after dead-a)$' "$tmp/out" || fail "dead --limit"
expect_rc 0 "$tw" journal dead "$dd" --after dead-a
[ "$(wc -l <"$tmp/out")" = 1 ] && grep -q ' dead-b$' "$tmp/out" || fail "dead --after: $(cat "$tmp/out")"
expect_rc 0 "$tw" journal dead "$dd" --limit 1 --json
$py -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["more"] and d["after"]["key"]=="dead-a", d' "$tmp/out"
dead_shape=$(shape)
expect_rc 0 "$tw" journal dead "$dd" --json
$py -c 'import json,sys; d=json.load(open(sys.argv[1])); assert not d["more"] and d["after"] is None, d' "$tmp/out"
[ "$(shape)" = "$dead_shape" ] || fail "dead --json: two shapes"
expect_rc 0 "$tw" journal ls "$dd" --json --limit 1
ls_shape=$(shape)
expect_rc 0 "$tw" journal ls "$dd" --json
[ "$(shape)" = "$ls_shape" ] || fail "ls --json: two shapes"
expect_rc 0 "$tw" journal get "$dd" dead-a
grep -q 'state:    dead' "$tmp/out" || fail "get of a dead letter"
expect_rc 0 "$tw" journal stats "$dd"
grep -q '^dead *2$' "$tmp/out" && grep -q '^pending *4$' "$tmp/out" || fail "stats: dead"
expect_rc 0 "$tw" journal stats "$dd" --metrics
grep -q '^twheel_durable_dead 2$' "$tmp/out" || fail "stats --metrics: dead"
coproc HOLD { exec "$store" hold "$dd" 3; }
holder=$HOLD_PID
read -r line <&"${HOLD[0]}"
[ "$line" = held ] || fail "holder: $line"
expect_rc 0 "$tw" journal dead "$dd"
[ "$(wc -l <"$tmp/out")" = 2 ] || fail "dead of a live store"
expect_rc 2 "$tw" journal rearm "$dd" dead-a
grep -q 'held by a live store' "$tmp/err" || fail "rearm of a live store: $(cat "$tmp/err")"
expect_rc 2 "$tw" journal delete "$dd" dead-b
grep -q 'held by a live store' "$tmp/err" || fail "delete of a live store"
echo go >&"${HOLD[1]}"
wait "$holder" || fail "the live store was disturbed"
holder=
expect_rc 1 "$tw" journal rearm "$dd" t000 # pending, not dead
expect_rc 1 "$tw" journal delete "$dd" nosuch
expect_rc 2 "$tw" journal rearm "$dd" dead-a --at soon
expect_rc 1 "$tw" journal rearm "$dd" t000 --json
notdead_shape=$(shape)
expect_rc 0 "$tw" journal rearm "$dd" dead-a --at 4102444800000 --json
$py -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["ok"] and d["due_ms"]==4102444800000, d' "$tmp/out"
[ "$(shape)" = "$notdead_shape" ] || fail "rearm --json: two shapes"
expect_rc 0 "$tw" journal get "$dd" dead-a --json
$py -c 'import json,sys; d=json.load(open(sys.argv[1]))
assert d["state"]=="waiting" and d["attempt"]==1 and d["payload"]=="da", d' "$tmp/out"
expect_rc 0 "$tw" journal delete "$dd" dead-b
grep -q '^dead-b: deleted$' "$tmp/out" || fail "delete"
expect_rc 0 "$tw" journal dead "$dd" --json
$py -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["count"]==0, d' "$tmp/out"
expect_rc 0 "$tw" journal stats "$dd"
grep -q '^dead *0$' "$tmp/out" || fail "stats after rearm and delete"
step "dead letters: dead, get, stats; rearm and delete refused on a live store, then done"

# A live store holds the directory: read-only verbs work and leave it be.
coproc HOLD { exec "$store" hold "$dir" 50; }
holder=$HOLD_PID
read -r line <&"${HOLD[0]}"
[ "$line" = held ] || fail "holder: $line"
expect_rc 0 "$tw" journal ls "$dir"
grep -q ' held-1$' "$tmp/out" || fail "ls of a live store"
expect_rc 0 "$tw" journal check "$dir"
expect_rc 0 "$tw" journal get "$dir" held-1
expect_rc 0 "$tw" journal stats "$dir"
expect_rc 0 "$tw" journal repair "$dir"   # no damage: nothing to repair
grep -q 'nothing to repair' "$tmp/out" || fail "repair of a sound live store"
# Damage in the middle of the journal while the store runs: repair refuses.
seg=$(ls "$dir" | grep -v LOCK | sort | head -1)
cp "$dir/$seg" "$tmp/seg.orig"
$py -c 'import sys; f=open(sys.argv[1],"r+b"); f.seek(100); b=f.read(1); f.seek(100)
f.write(bytes([b[0]^0xff]))' "$dir/$seg"
expect_rc 2 "$tw" journal repair "$dir"
grep -q 'held by a live store' "$tmp/err" || fail "repair of a live store: $(cat "$tmp/err")"
echo go >&"${HOLD[1]}"
wait "$holder" || fail "the live store was disturbed"
holder=
step "live store: ls, get, stats, check work; repair refused; the store ran on"

# The damage: found, reported with its place, dry run changes nothing.
sum() { (cd "$dir" && ls -l --time-style=+%s; md5sum ./*) | md5sum; }
before=$(sum)
expect_rc 1 "$tw" journal check "$dir"
grep -q "damaged: .*$seg offset [0-9]*: corrupt record" "$tmp/out" || fail "check: $(cat "$tmp/out")"
expect_rc 1 "$tw" journal check "$dir" --json
$py -c 'import json,sys; d=json.load(open(sys.argv[1])); assert not d["ok"] and d["status"]=="damaged", d' "$tmp/out"
damaged_shape=$(shape)
expect_rc 1 "$tw" journal repair "$dir" --dry-run
keep=$(sed -n 's/.*keep \([0-9]*\) pending timers.*/\1/p' "$tmp/out")
[ -n "$keep" ] && [ "$keep" -lt 53 ] && [ "$keep" -gt 40 ] || fail "dry run: $(cat "$tmp/out")"
grep -q "offset 70: schedule record of t001 .*: dropped" "$tmp/out" || fail "dry run names t001: $(cat "$tmp/out")"
# ls and stats of the damaged journal show what a repair would keep, warn,
# and exit 1; get refuses it.
expect_rc 1 "$tw" journal ls "$dir"
[ "$(wc -l <"$tmp/out")" = "$keep" ] && grep -q "warning: .*damaged: .*$seg offset 70" "$tmp/err" ||
  fail "ls of a damaged journal: $(cat "$tmp/err")"
expect_rc 1 "$tw" journal stats "$dir" --json
$py -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["pending"]==int(sys.argv[2]), d' "$tmp/out" "$keep"
expect_rc 2 "$tw" journal get "$dir" t000
[ "$(sum)" = "$before" ] || fail "check, the dry run, ls or stats changed the directory"
expect_rc 0 "$tw" journal repair "$dir"
grep -q "repaired .* $keep pending timers kept" "$tmp/out" || fail "repair: $(cat "$tmp/out")"
grep -q "damaged records dropped: $seg offset 70, 38 bytes, 1 record" "$tmp/out" &&
  grep -q "offset 70: schedule record of t001 .*: dropped: no other version" "$tmp/out" ||
  fail "repair names the dropped key: $(cat "$tmp/out")"
expect_rc 0 "$tw" journal check "$dir"
grep -q "$keep pending timers" "$tmp/out" || fail "check after repair"
step "damage: check exits 1 with its place, dry run changes nothing, repair keeps $keep"

# A torn tail: the newest segment cut in the middle of its last record, or
# that record garbled. check reads the rest, names the file, offset and
# bytes it ignored and the record's key, and exits 3; --json has the
# same shape as for a sound journal or a damaged one.
lastrec() { # DIR: "SEGMENT OFFSET SIZE" of the newest segment's last record
  $py -c 'import os,struct,sys; d=sys.argv[1]
seg=sorted(f for f in os.listdir(d) if f.endswith(".twj"))[-1]
b=open(os.path.join(d,seg),"rb").read(); o=32; last=None
while o+16<=len(b):
    n=struct.unpack_from("<I",b,o+4)[0]
    if n==0: break
    last=(o,16+n); o+=16+n
print(seg,*last)' "$1"
}
for cut in cut garble; do
  tj=$tmp/torn-$cut
  "$store" make "$tj" 20
  read -r tseg toff tsize < <(lastrec "$tj")
  expect_rc 0 "$tw" journal check "$tj" --json
  sound_shape=$(shape)
  if [ $cut = cut ]; then
    truncate -s $((toff + 20)) "$tj/$tseg"
    want="torn tail ignored: $tseg offset $toff, 20 bytes, 1 record"
  else
    $py -c 'import sys; f=open(sys.argv[1],"r+b"); f.seek(int(sys.argv[2])); f.write(b"X")' \
      "$tj/$tseg" $((toff + tsize - 1))
    want="torn tail ignored: $tseg offset $toff, $tsize bytes, 1 record"
  fi
  expect_rc 3 "$tw" journal check "$tj"
  grep -q "$want" "$tmp/out" || fail "check, $cut: $(cat "$tmp/out")"
  grep -q 'sound but not whole' "$tmp/out" || fail "check, $cut: status line"
  if [ $cut = garble ]; then # a dead letter's DEAD record: pending again
    grep -q "offset $toff: dead record of dead-[ab] .*: pending again: its move to the dead letters is lost" "$tmp/out" ||
      fail "check, garble: the record's key: $(cat "$tmp/out")"
  fi
  expect_rc 3 "$tw" journal check "$tj" --json
  [ "$(shape)" = "$sound_shape" ] && [ "$(shape)" = "$damaged_shape" ] ||
    fail "check --json shape: $(shape) vs $sound_shape, $damaged_shape"
  $py -c 'import json,sys; d=json.load(open(sys.argv[1])); i=d["ignored"][0]
assert not d["ok"] and d["status"]=="torn_tail", d
assert i["kind"]=="torn_tail" and i["segment"]==sys.argv[2] and i["offset"]==int(sys.argv[3]), d
assert i["records"]==1 and i["keys"][0]["record"]=="dead", d
assert sys.argv[4]=="cut" or i["keys"][0]["outcome"]=="back", d' "$tmp/out" "$tseg" "$toff" "$cut"
  expect_rc 0 "$tw" journal repair "$tj" # no damage: the next open cuts it
  grep -q "$want" "$tmp/out" && grep -q 'nothing to repair' "$tmp/out" || fail "repair, $cut: $(cat "$tmp/out")"
done
step "torn tail (cut, garbled): check names segment, offset, bytes and the record, exit 3, one JSON shape"

# Missing segments, in a journal of many (a load of 8 KiB segments, old
# ones compacted: it has a MANIFEST). A read-only open leaves a segment
# older than the MANIFEST's oldest (a crash between the MANIFEST's write
# and that segment's deletion) where it is; a dry run names missing
# segments and writes nothing (no new MANIFEST either); repair passes
# over them.
mj=$tmp/many
"$store" load "$mj" 600 >/dev/null
segs=($(cd "$mj" && ls ./*.twj | sort))
[ "${#segs[@]}" -ge 5 ] && [ -f "$mj/MANIFEST" ] || fail "load: ${#segs[@]} segments"
oldest=$(basename "${segs[0]}" .twj)
stale=$(printf '%010d.twj' $((10#$oldest - 1)))
cp -a "$mj" "$tmp/many2"
cp "$mj/$oldest.twj" "$tmp/many2/$stale"
expect_rc 0 "$tw" journal check "$tmp/many2"
[ -f "$tmp/many2/$stale" ] || fail "a read-only check deleted $stale"
mid=$(basename "${segs[3]}")
rm "$tmp/many2/$mid"
sum2() { (cd "$tmp/many2" && ls -l --time-style=+%s; md5sum ./*) | md5sum; }
before2=$(sum2)
expect_rc 1 "$tw" journal check "$tmp/many2"
grep -q "segment $((10#${mid%.twj})) is missing" "$tmp/out" || fail "check of a missing segment: $(cat "$tmp/out")"
expect_rc 1 "$tw" journal repair "$tmp/many2" --dry-run
grep -q "segments missing: 1 from $mid on" "$tmp/out" || fail "dry run of a missing segment: $(cat "$tmp/out")"
rm "$tmp/many2/$oldest.twj" # the oldest the MANIFEST names, too
before2=$(sum2)
expect_rc 1 "$tw" journal repair "$tmp/many2" --dry-run
grep -q "segments missing: 1 from $oldest.twj on" "$tmp/out" || fail "dry run of a missing oldest segment: $(cat "$tmp/out")"
[ "$(sum2)" = "$before2" ] || fail "the dry run changed the directory"
expect_rc 0 "$tw" journal repair "$tmp/many2"
grep -q "segments missing: 1 from $mid on, passed over" "$tmp/out" || fail "repair of missing segments: $(cat "$tmp/out")"
expect_rc 0 "$tw" journal check "$tmp/many2"
step "missing segments: read-only opens delete nothing; dry run names them and writes nothing; repair passes over them"

# Nothing here: a missing directory, one without a segment.
expect_rc 3 "$tw" journal check "$tmp/nosuch"
grep -q 'nothing here: no such directory' "$tmp/out" || fail "check of a missing directory"
[ ! -e "$tmp/nosuch" ] || fail "check made a directory"
expect_rc 2 "$tw" journal stats "$tmp/nosuch"
grep -q 'no such directory' "$tmp/err" && ! grep -q 'no such key' "$tmp/err" || fail "stats of a missing directory: $(cat "$tmp/err")"
mkdir "$tmp/empty"
expect_rc 3 "$tw" journal check "$tmp/empty" --json
[ "$(shape)" = "$sound_shape" ] || fail "check --json shape, empty"
$py -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["status"]=="empty", d' "$tmp/out"
expect_rc 0 "$tw" journal stats "$tmp/empty"
grep -q 'nothing here' "$tmp/err" || fail "stats of an empty directory warns"
step "nothing here: check exits 3 on a missing or empty directory; stats warns"

# Export and import: a journal exported, imported into an empty one, and
# exported again gives the same lines and the same ls; keys held already
# are refused unless --replace; a bad line is named.
pj=$tmp/port
"$store" make "$pj" 30
expect_rc 0 "$tw" journal export "$pj" --out "$tmp/e1"
[ "$(wc -l <"$tmp/e1")" = 33 ] || fail "export: $(wc -l <"$tmp/e1") lines"
$py -c 'import base64,json,sys; L=[json.loads(l) for l in open(sys.argv[1])]
t={x["key"]: x for x in L}
assert base64.b64decode(t["t007"]["payload_b64"])==b"p7" and not t["t007"]["dead"], t["t007"]
assert t["t007"]["attempt"]==1 and t["dead-a"]["dead"] and t["dead-a"]["attempt"]==1, t
assert base64.b64decode(t["bin\x01\xff"]["key_b64"])==b"bin\x01\xff"' "$tmp/e1"
expect_rc 0 "$tw" journal import "$tmp/port2" --in "$tmp/e1"
grep -q 'imported 31 pending timers and 2 dead letters' "$tmp/out" || fail "import: $(cat "$tmp/out")"
expect_rc 0 "$tw" journal export "$tmp/port2" --out "$tmp/e2"
cmp <(sort "$tmp/e1") <(sort "$tmp/e2") || fail "export, import, export differ"
cmp <("$tw" journal ls "$pj") <("$tw" journal ls "$tmp/port2") || fail "ls after import differs"
cmp <("$tw" journal dead "$pj") <("$tw" journal dead "$tmp/port2") || fail "dead after import differs"
expect_rc 1 "$tw" journal import "$tmp/port2" --in "$tmp/e1"
grep -q 'line 8: t007: held already' "$tmp/err" && grep -q '33 keys held already' "$tmp/out" ||
  fail "import of held keys: $(cat "$tmp/out" "$tmp/err")"
expect_rc 0 "$tw" journal import "$tmp/port2" --in "$tmp/e1" --replace --json
$py -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["replaced"]==33 and d["held"]==0, d' "$tmp/out"
printf '%s\n' "$(head -1 "$tmp/e1")" '{"key_b64":"!!","due_ms":1}' >"$tmp/bad"
expect_rc 2 "$tw" journal import "$tmp/port3" --in "$tmp/bad"
grep -q 'line 2: not a line of twheel export' "$tmp/err" || fail "bad line: $(cat "$tmp/err")"
expect_rc 1 "$tw" journal import "$tmp/port2" <"$tmp/e1" # stdin
# Attempts survive: a pending timer's next delivery, a dead letter's count
# (attempts and check_attempts at the top).
echo "$attempts" | expect_rc 0 "$tw" journal import "$tmp/port4"
check_attempts journal "$tmp/port4"
step "export, import into an empty journal: the same lines, ls and dead; held keys, --replace, bad lines"

# Backing up a live store: export while a process schedules under load
# (old segments compacted and deleted meanwhile), then the process killed;
# the backup restores every timer acknowledged before the export began.
bj=$tmp/live
"$store" load "$bj" 1000000 >"$tmp/acked" &
holder=$!
for _ in $(seq 600); do
  [ "$(wc -l <"$tmp/acked")" -ge 300 ] && break
  sleep 0.05
done
before=$(wc -l <"$tmp/acked")
[ "$before" -ge 300 ] || fail "the loader acknowledged $before timers"
expect_rc 0 "$tw" journal export "$bj" --out "$tmp/backup"
kill -9 "$holder"
{ wait "$holder"; } 2>/dev/null || true
holder=
expect_rc 0 "$tw" journal import "$tmp/restored" --in "$tmp/backup"
expect_rc 0 "$tw" journal export "$tmp/restored"
$py -c 'import base64,json,sys
have={json.loads(l)["key"]: json.loads(l) for l in open(sys.argv[1])}
acked=open(sys.argv[2]).read().split("\n")[:int(sys.argv[3])]
miss=[k for k in acked if k not in have]
assert not miss, "%d of %d acknowledged timers missing: %s" % (len(miss), len(acked), miss[:5])
assert base64.b64decode(have[acked[-1]]["payload_b64"])==b"x"*200' "$tmp/out" "$tmp/acked" "$before"
step "backup of a live journal under load: every timer acknowledged before it ($before) restored"

# twheeld's jobs decoded: a server puts three jobs in two tubes (one
# delayed, one buried) into its journal and stops; twheel jobs shows each.
if [ -n "$twheeld" ]; then
  port=$($py -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  mkdir -p "$tmp/tbd" # twheeld, as beanstalkd, wants it to exist
  "$twheeld" -l 127.0.0.1 -p "$port" -b "$tmp/tbd" 2>"$tmp/tbd.log" &
  holder=$!
  $py - "$port" <<'PY' || fail "twheeld: $(cat "$tmp/tbd.log")"
import socket, sys, time
for _ in range(200):
    try:
        s = socket.create_connection(("127.0.0.1", int(sys.argv[1]))); break
    except OSError:
        time.sleep(0.05)
f = s.makefile("rwb")
def cmd(c, body=None):
    f.write(c.encode() + b"\r\n")
    if body is not None:
        f.write(body + b"\r\n")
    f.flush()
    return f.readline().decode().strip()
assert cmd("use emails") == "USING emails"
assert cmd("put 10 0 60 5", b"hello") == "INSERTED 1"
assert cmd("put 5 3600 30 3", b"a\x01b") == "INSERTED 2"
assert cmd("use default") == "USING default"
assert cmd("put 1 0 60 2", b"hi") == "INSERTED 3"
assert cmd("reserve-with-timeout 0").startswith("RESERVED 3 ")
f.readline()
assert cmd("bury 3 7") == "BURIED"
PY
  kill "$holder"
  wait "$holder" || fail "twheeld exit: $(cat "$tmp/tbd.log")"
  holder=
  expect_rc 0 "$tw" journal jobs "$tmp/tbd"
  grep -Eq '^2 +delayed +emails +pri 5 .*body 3 bytes: a\\x01b$' "$tmp/out" &&
    grep -Eq '^3 +buried +default +pri 7 .* 1/0/0/1/0 .*body 2 bytes: hi$' "$tmp/out" ||
    fail "jobs: $(cat "$tmp/out")"
  expect_rc 0 "$tw" journal jobs "$tmp/tbd" --json
  $py -c 'import json,sys; d=json.load(open(sys.argv[1])); j={x["id"]: x for x in d["jobs"]}
assert d["count"]==3 and d["unreadable"]==0 and d["id_marks"]==1, d
assert j[1]["state"]=="ready" and j[1]["tube"]=="emails" and j[1]["body"]=="hello" and j[1]["ttr_s"]==60, j[1]
assert j[2]["delay_s"]==3600 and j[2]["due_ms"]>0 and j[2]["body"]=="a\x01b", j[2]' "$tmp/out"
  step "twheel jobs: twheeld's jobs decoded (state, tube, priority, counters, body)"
  # Pages: two, then the rest, by id.
  expect_rc 0 "$tw" journal jobs "$tmp/tbd" --limit 2 --json
  $py -c 'import json,sys; d=json.load(open(sys.argv[1]))
assert sorted(x["id"] for x in d["jobs"])==[1,2] and d["after"]==2, d' "$tmp/out"
  expect_rc 0 "$tw" journal jobs "$tmp/tbd" --limit 2 --after 2 --json
  $py -c 'import json,sys; d=json.load(open(sys.argv[1]))
assert [x["id"] for x in d["jobs"]]==[3] and d["after"] is None, d' "$tmp/out"
  expect_rc 0 "$tw" journal jobs "$tmp/tbd" --limit 1
  grep -q '^(more: --after 1)$' "$tmp/out" || fail "jobs page: $(cat "$tmp/out")"
  expect_rc 2 "$tw" journal jobs "$tmp/tbd" --after x
  step "twheel jobs --limit/--after: pages by id"
fi
