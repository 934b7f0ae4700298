#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# twheeld against beanstalkd, same machine, same workload, same run
# (bench/bench_bstalk.c). Prints one line per measurement.
# Usage: scripts/bench_twheeld.sh BUILD_DIR [SECONDS] [DELAYED_JOBS]
#   BUILD_DIR holds twheeld/twheeld and bench/bench_bstalk (Release).
#   ONLY=many: only the many-delayed-jobs rows (memory, disk, restart).
#   ONLY=rates: only the other rows (puts/s, reserve+delete/s, lateness).
set -euo pipefail
cd "$(dirname "$0")/.."
b=${1:?usage: $0 BUILD_DIR [SECONDS] [DELAYED_JOBS]}
secs=${2:-5}
njobs=${3:-1000000}
tw=$b/twheeld/twheeld
load=$b/bench/bench_bstalk
work=$(mktemp -d "$PWD/build/bench-twheeld.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# Until a connection to port $1 succeeds, polled every 50 ms by one
# process (a new interpreter per poll took a CPU of its own from the server
# it waited for: twheeld listens only once its jobs are back).
wait_up() {
  python3 - "$1" <<'PY'
import socket, sys, time
end = time.monotonic() + 300
while time.monotonic() < end:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.05)
sys.exit(1)
PY
}
# start NAME DIR FLAGS...: starts a server, sets $P (port) and $PID.
start() {
  local name=$1 dir=$2
  shift 2
  P=$(port)
  mkdir -p "$dir"
  if [ "$name" = twheeld ]; then
    "$tw" -l 127.0.0.1 -p "$P" -b "$dir" "$@" 2>/dev/null &
  else
    beanstalkd -l 127.0.0.1 -p "$P" -b "$dir" "$@" &
  fi
  PID=$!
  pids+=("$PID")
  wait_up "$P"
}
stop() { kill "$1"; wait "$1" 2>/dev/null || true; }
rss() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }

echo "# $(date -u +%F) $(nproc) cores; twheeld $("$tw" -v | cut -d' ' -f2), beanstalkd $(beanstalkd -v 2>&1 | cut -d' ' -f2)"
for srv in beanstalkd twheeld; do
  if [ "${ONLY:-all}" != many ]; then
  # Reply after fdatasync: beanstalkd -f 0, twheeld -f 0.
  for c in 1 64; do
    start "$srv" "$work/$srv-f0-$c" -f 0
    echo "$srv -f 0 $("$load" -p "$P" -c "$c" -t "$secs" put)"
    stop "$PID"
  done
  # Once-a-second sync.
  start "$srv" "$work/$srv-f1000" -f 1000
  echo "$srv -f 1000 $("$load" -p "$P" -c 1 -t "$secs" put)"
  echo "$srv -f 1000 $("$load" -p "$P" -c 64 -d 16 -t "$secs" put)"
  echo "$srv -f 1000 $("$load" -p "$P" -c 1 -t "$secs" reserve)"
  echo "$srv -f 1000 $("$load" -p "$P" -c 16 -t "$secs" reserve)"
  stop "$PID"
  # Lateness of delayed jobs becoming ready (delays of 1, 2 or 3 s):
  # puts pipelined 64 deep (each second's jobs due in a burst as dense
  # as the server took the puts), then one at a time per connection.
  for d in 64 1; do
    start "$srv" "$work/$srv-late-$d" -f 1000
    echo "$srv -f 1000 $("$load" -p "$P" -c 8 -d "$d" -n 20000 -D 3 late)"
    stop "$PID"
  done
  fi
  [ "${ONLY:-all}" = rates ] && continue
  # Many delayed jobs: memory, disk, restart after kill -9.
  start "$srv" "$work/$srv-many" -f 1000
  echo "$srv -f 1000 $("$load" -p "$P" -c 8 -d 256 -n "$njobs" -D 86400 delayed)"
  sleep 2 # the once-a-second sync
  echo "$srv $njobs delayed: RSS $(($(rss "$PID") / 1024)) MB, disk $(du -sm "$work/$srv-many" | cut -f1) MB"
  kill -9 "$PID"
  wait "$PID" 2>/dev/null || true
  t0=$(date +%s.%N)
  start "$srv" "$work/$srv-many" -f 1000
  # Until the first reply to a command: beanstalkd listens (and accepts
  # connections) before it reads its binlog back, so a connect alone
  # says nothing.
  n=$(python3 -c "
import socket
s=socket.create_connection(('127.0.0.1',$P)); s.sendall(b'stats\r\n')
d=b''
while b'draining' not in d: d+=s.recv(65536)
print([l for l in d.decode().splitlines() if l.startswith('current-jobs-delayed')][0])")
  t1=$(date +%s.%N)
  # The CPU time the server used until then (user + system) and how long
  # its threads waited for a CPU (schedstat, ns on a run queue): on a
  # machine that other work shares, the wall time is mostly that wait.
  cpu=$(awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$PID/stat")
  rq=$(cat /proc/"$PID"/task/*/schedstat | awk '{w += $2} END {printf "%.2f", w / 1e9}')
  echo "$srv restart after kill -9: answering in $(echo "$t1 - $t0" | bc) s (CPU $cpu s, waiting for a CPU $rq s), $n, RSS $(($(rss "$PID") / 1024)) MB"
  # Then until peek-delayed answers (twheeld reads delayed jobs from the
  # store's ordered listing, built at its first use).
  python3 -c "
import socket
s=socket.create_connection(('127.0.0.1',$P)); s.sendall(b'peek-delayed\r\n')
d=b''
while b'\r\n' not in d: d+=s.recv(65536)
assert d.startswith(b'FOUND'), d"
  t2=$(date +%s.%N)
  echo "$srv restart after kill -9: peek-delayed answers in $(echo "$t2 - $t0" | bc) s, RSS $(($(rss "$PID") / 1024)) MB"
  stop "$PID"
done
