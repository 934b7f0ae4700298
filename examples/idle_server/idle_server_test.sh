#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# End-to-end test of idle_server, driven by idle_load over
# loopback. Usage: idle_server_test.sh IDLE_SERVER IDLE_LOAD [IDLE_STALL]
#
# Timing bounds (for a loaded 2-core machine): a silent connection must be
# closed not before --idle after its last byte (exact: no slack at all) and
# no later than idle + tick + 1 s after its echo arrived. When only timing
# bounds are missed (idle_load exit 3), the run is repeated once with every
# duration doubled; a wrong close (exit 1) fails at once.
set -uo pipefail
server=${1:?usage: $0 IDLE_SERVER IDLE_LOAD}
load=${2:?usage: $0 IDLE_SERVER IDLE_LOAD}
stall=${3:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

fail() {
  echo "FAIL: $*"
  exit 1
}

# 1. Unusable options: exit code 2 and a message on stderr.
for args in "--idle 5" "--idle 0s" "--idle 2m" "--tick 0ms" "--port 65536" \
  "--port -1" "--port" "--bogus" "--host 300.1.1.1" "--host" \
  "--tick 2s --idle 1s" "--max-conns 0" "--stats 1h" "--idle=1x" \
  "--workers 0" "--workers 65" "--slack 2s --idle 1s" "--slack 1x"; do
  # shellcheck disable=SC2086
  "$server" $args >"$work/out" 2>"$work/err"
  rc=$?
  [ "$rc" -eq 2 ] || fail "idle_server $args: exit $rc, want 2"
  [ -s "$work/err" ] || fail "idle_server $args: no message"
  [ ! -s "$work/out" ] || fail "idle_server $args: wrote to stdout"
done
"$load" --conns 0 >/dev/null 2>&1
[ $? -eq 2 ] || fail "idle_load --conns 0 must exit 2"
echo "ok: bad options exit 2"

# 2. SIGINT and SIGTERM stop it cleanly (exit 0, a final line). Idle with
# no connection for half a second, it must not have woken at all before the
# signal (wakeups=1: the signal itself): the loop never polls.
for sig in INT TERM; do
  "$server" --port 0 >"$work/sig" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    grep -q '^listening on 127.0.0.1:[0-9]' "$work/sig" && break
    sleep 0.05
  done
  grep -q '^listening on' "$work/sig" || fail "no 'listening on' line"
  sleep 0.5
  kill -"$sig" "$pid"
  wait "$pid"
  rc=$?
  [ "$rc" -eq 0 ] || fail "SIG$sig: exit $rc"
  grep -q "^stopping on SIG$sig" "$work/sig" || fail "SIG$sig: not logged"
  grep -q '^final: held=0 .* wakeups=1 ' "$work/sig" ||
    fail "SIG$sig: no final line, or woke up without a cause"
done
echo "ok: SIGINT and SIGTERM exit 0; no wake-up while idle"

# Runs idle_load against a fresh server; repeats once with doubled
# durations if only timing bounds were missed. $1 idle ms, $2 tick ms,
# $3 output file, then idle_load options; after "--" server options.
check() {
  local idle=$1 tick=$2 out=$3 rc
  shift 3
  local -a opts=() srv=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do opts+=("$1"); shift; done
  [ $# -gt 0 ] && shift
  srv=("$@")
  for attempt in 1 2; do
    "$load" --idle "${idle}ms" --tick "${tick}ms" --slack $((idle / 2))ms \
      --max-time 120s "${opts[@]}" -- \
      "${srv[@]}" --port 0 --idle "${idle}ms" --tick "${tick}ms" \
      --stats 500ms >"$out" 2>&1
    rc=$?
    cat "$out"
    [ "$rc" -ne 3 ] && break
    echo "timing bounds missed (loaded machine?): retrying with doubled durations"
    idle=$((idle * 2))
    tick=$((tick * 2))
  done
  return "$rc"
}

# 3. The main run: 1,000 connections, a fifth active, 2 s idle, 100 ms tick,
# plus 10 clients that flood without reading (half of them reset mid-write).
check 2000 100 "$work/main" --conns 1000 --active 20 --flood 10 -- "$server" ||
  fail "main run"
grep -q '^silent: 800 closed, 0 early, 0 late' "$work/main" ||
  fail "main run: not every silent connection closed in time"
grep -q '^active: 200 open, 0 closed' "$work/main" ||
  fail "main run: an active connection was closed"
echo "ok: 1000 connections, idle 2 s"

# 3b. --slack: idle timers are windows (idle .. idle + slack); the load
# tool allows idle + tick + idle / 2, more than the 500 ms of slack.
check 2000 100 "$work/slack" --conns 300 --active 20 -- "$server" \
  --slack 500ms || fail "--slack run"
grep -q '^silent: 240 closed, 0 early, 0 late' "$work/slack" ||
  fail "--slack run: not every silent connection closed in time"
grep -q '^active: 60 open, 0 closed' "$work/slack" ||
  fail "--slack run: an active connection was closed"
echo "ok: 300 connections, idle 2 s, slack 500 ms"

# 4. --max-conns: the rest is refused, the held ones are served as before.
check 1000 50 "$work/max" --conns 100 --active 20 --allow-refused -- \
  "$server" --max-conns 30 || fail "--max-conns run"
grep -q '^opened: 30 in .*(70 refused, 0 failed)' "$work/max" ||
  fail "--max-conns 30 did not hold exactly 30"
echo "ok: --max-conns refuses the rest"

# 5. Out of file descriptors (ulimit -n 40): new connections are refused,
# the others keep being served.
check 1000 50 "$work/emfile" --conns 100 --active 20 --allow-refused -- \
  sh -c 'ulimit -n 40 && exec "$0" "$@"' "$server" || fail "EMFILE run"
grep -Eq '^opened: [1-9][0-9]* in .*\([1-9][0-9]* refused, 0 failed\)' \
  "$work/emfile" || fail "EMFILE: expected some held and some refused"
echo "ok: out of descriptors refuses new connections, serves the others"

# 6. Several worker processes on one port (SO_REUSEPORT), each with its own
# wheel, driven by two load processes: the same guarantees hold.
check 1000 50 "$work/workers" --conns 600 --procs 2 --active 20 -- \
  "$server" --workers 3 || fail "--workers run"
[ "$(grep -c '^server: w[0-2]: final: held=0 ' "$work/workers")" -eq 3 ] ||
  fail "--workers 3: not three clean workers"
grep -q '^server: final: workers=3 exit=0' "$work/workers" ||
  fail "--workers 3: the parent did not exit cleanly"
echo "ok: 3 workers, 2 load processes"

# 7. A stall with more clients ready than one epoll_wait returns (1,024):
# the server is stopped (SIGSTOP), 1,500 clients send a byte half an idle
# later, the server continues at 1.25 idle. Every one of them must be kept
# (none had been silent for --idle); the 500 silent ones must be closed.
# idle_stall exits 3 when it was itself delayed too long to judge: then
# once more with every duration doubled.
if [ -n "$stall" ]; then
  idle=1000
  for attempt in 1 2; do
    "$server" --port 0 --idle "${idle}ms" --tick 50ms >"$work/stall.srv" 2>&1 &
    pid=$!
    for _ in $(seq 100); do
      grep -q '^listening on 127.0.0.1:[0-9]' "$work/stall.srv" && break
      sleep 0.05
    done
    port=$(sed -n 's/^listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$work/stall.srv")
    [ -n "$port" ] || fail "stall: no 'listening on' line"
    "$stall" --port "$port" --pid "$pid" --idle "${idle}ms" --active 1500 \
      --silent 500 >"$work/stall" 2>&1
    rc=$?
    kill -CONT "$pid" 2>/dev/null
    kill -TERM "$pid"
    wait "$pid"
    cat "$work/stall"
    [ "$rc" -ne 3 ] && break
    echo "stall: inconclusive (loaded machine?): retrying with doubled idle"
    idle=$((idle * 2))
  done
  [ "$rc" -eq 0 ] || fail "stall: exit $rc"
  grep -q '^active: 1500 open, 0 closed' "$work/stall" ||
    fail "stall: a client that sent within --idle was closed"
  echo "ok: a stall with 1500 ready clients closes none of them"
fi
echo "all ok"
