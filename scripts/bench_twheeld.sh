#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# twheeld against beanstalkd, same machine, same workload, same run
# (bench/bench_bstalk.c). Prints one line per measurement.
# Usage: scripts/bench_twheeld.sh BUILD_DIR [SECONDS] [DELAYED_JOBS]
#   BUILD_DIR holds twheeld/twheeld and bench/bench_bstalk (Release).
#   ONLY=many: only the many-delayed-jobs rows (memory, disk, restart).
#   ONLY=rates: only the other rows (puts/s, reserve+delete/s, lateness).
#   ONLY=main: the main job's round (scripts/bench.sh): both servers up
#     side by side, every row run on one then the other, REPS times over
#     (default 3), SECONDS per timed row, DELAYED_JOBS delayed jobs (one
#     run); lines "bstalk srv=S row=R value=V unit=U" for results.csv
#     beside each program's own line. FSYNC_PROBE (bench/fsync_probe's
#     path): the device's fdatasync latency on a preallocated file is
#     probed before and after the fdatasync rows ("system=device" lines).
#   ONLY=f1000, f0, steady, disk: one part of the main job's round, the
#     same lines: the once-a-second sync rows; the reply-after-fdatasync
#     puts (F0_CONNS connection counts, default "1 16 64"); the steady
#     lateness (STEADY_RATE puts/s, default 1000); the delayed jobs'
#     memory, disk and restart.
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
# launch NAME DIR FLAGS...: starts a server on port $P, sets $PID.
launch() {
  local name=$1 dir=$2
  shift 2
  mkdir -p "$dir"
  if [ "$name" = twheeld ]; then
    "$tw" -l 127.0.0.1 -p "$P" -b "$dir" "$@" 2>/dev/null &
  else
    beanstalkd -l 127.0.0.1 -p "$P" -b "$dir" "$@" &
  fi
  PID=$!
  pids+=("$PID")
}
# start NAME DIR FLAGS...: starts a server, sets $P (port) and $PID,
# returns once it accepts connections.
start() {
  P=$(port)
  launch "$@"
  wait_up "$P"
}
stop() { kill "$1"; wait "$1" 2>/dev/null || true; }
rss() { awk '/VmRSS/ {print $2}' "/proc/$1/status"; }

# many SRV DIR NJOBS: NJOBS delayed jobs (delays up to a day) into a
# fresh server, its memory and disk, then kill -9 and a restart timed
# until `stats` answers. Sets REPLY_* for the caller.
many() {
  local srv=$1 dir=$2 njobs=$3 rss0
  start "$srv" "$dir" -f 1000
  sleep 1
  rss0=$(rss "$PID")
  echo "$srv -f 1000 $("$load" -p "$P" -c 8 -d 256 -n "$njobs" -D 86400 delayed)"
  sleep 2 # the once-a-second sync
  REPLY_RSS=$(($(rss "$PID") / 1024))
  REPLY_DISK=$(du -sm "$dir" | cut -f1)
  # Per job: the memory the jobs added to the empty server; the disk in
  # all (both servers preallocate their files, so what an empty one
  # holds says nothing of what a job costs), kB -> bytes.
  REPLY_RSS_PER=$((($(rss "$PID") - rss0) * 1024 / njobs))
  REPLY_DISK_PER=$(($(du -sk "$dir" | cut -f1) * 1024 / njobs))
  echo "$srv $njobs delayed: RSS $REPLY_RSS MB, disk $REPLY_DISK MB"
  kill -9 "$PID"
  wait "$PID" 2>/dev/null || true
  P=$(port)
  t0=$(date +%s.%N)
  launch "$srv" "$dir" -f 1000
  # One client, started with the server: it connects as soon as the
  # server listens, then times the first reply to `stats` and, on the
  # same connection, the reply to `peek-delayed` (from t0). beanstalkd
  # listens (and accepts connections) before it reads its binlog back,
  # so a connect alone says nothing. (The script once started a second
  # Python interpreter for peek-delayed, which added 1.3 to 2.1 s to
  # both servers.)
  read -r t1 t2 n < <(python3 - "$P" "$t0" <<'PY'
import socket, sys, time
port, t0 = int(sys.argv[1]), float(sys.argv[2])
end = time.monotonic() + 300
while True:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=300)
        break
    except OSError:
        if time.monotonic() > end:
            sys.exit(1)
        time.sleep(0.05)
def ask(cmd, done):
    s.sendall(cmd)
    d = b""
    while not done(d):
        c = s.recv(65536)
        if not c:
            sys.exit(1)
        d += c
    return d
d = ask(b"stats\r\n", lambda d: b"draining" in d)
t1 = time.time()
n = [l for l in d.decode().splitlines()
     if l.startswith("current-jobs-delayed")][0].split()[1]
d = ask(b"peek-delayed\r\n", lambda d: b"\r\n" in d)
t2 = time.time()
assert d.startswith(b"FOUND"), d
print("%.2f %.2f %s" % (t1 - t0, t2 - t0, n))
PY
)
  # The CPU time the server used until then (user + system) and how long
  # its threads waited for a CPU (schedstat, ns on a run queue): on a
  # machine that other work shares, the wall time is mostly that wait.
  cpu=$(awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$PID/stat")
  rq=$(cat /proc/"$PID"/task/*/schedstat | awk '{w += $2} END {printf "%.2f", w / 1e9}')
  REPLY_T1=$t1 REPLY_CPU=$cpu REPLY_RQ=$rq
  echo "$srv restart after kill -9: answering stats in $t1 s, peek-delayed in $t2 s (CPU $cpu s, waiting for a CPU $rq s until then), current-jobs-delayed $n, RSS $(($(rss "$PID") / 1024)) MB"
  stop "$PID"
}

# row NAME SRV UNIT LINE: the line a program printed, then the row's
# value (the rate after "=") as a results line.
row() {
  local name=$1 srv=$2 unit=$3 line=$4 v
  echo "$srv $line"
  v=$(sed -n 's/.*= \([0-9.]*\)\/s.*/\1/p' <<<"$line")
  echo "bstalk srv=$srv row=$name value=$v unit=$unit"
}
# probe: with FSYNC_PROBE set, 300 fdatasyncs of 112 bytes on a
# preallocated file in the work directory, as one "system=device" line.
probe() {
  [ -n "${FSYNC_PROBE:-}" ] || return 0
  mkdir -p "$work/probe"
  "$FSYNC_PROBE" "$work/probe" 300 112 fallocate | awk '/^file=fallocate/ {
    for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    printf "system=device op=fdatasync at=twheeld p50_us=%s p99_us=%s\n",
      v["p50_us"], v["p99_us"] }'
}
# both FLAGS...: a beanstalkd and a twheeld with FLAGS, side by side for
# the rows that follow (ports in $BP and $TP, pids in $BPID and $TPID).
both() {
  start beanstalkd "$work/b$blk" "$@"
  BP=$P BPID=$PID
  start twheeld "$work/t$blk" "$@"
  TP=$P TPID=$PID
  blk=$((blk + 1))
}
# on_both NAME UNIT ARGS...: the load generator with ARGS on each server
# in turn (beanstalkd first), one row line each; then on the floor server
# (bench/bstalk_floor.c: keeps nothing, answers at once) when it runs.
on_both() {
  local name=$1 unit=$2
  shift 2
  row "$name" beanstalkd "$unit" "$("$load" -p "$BP" "$@")"
  row "$name" twheeld "$unit" "$("$load" -p "$TP" "$@")"
  if [ -n "${FP:-}" ]; then
    row "$name" floor "$unit" "$("$load" -p "$FP" "$@")"
  fi
}
# The floor server on a port of its own ($FP, pid $FPID), when built;
# ARGS: its own (-b DIR: the floor under a reply after fdatasync).
floor_start() {
  FP=
  [ -x "$b/bench/bstalk_floor" ] || return 0
  FP=$(port)
  "$b/bench/bstalk_floor" -p "$FP" "$@" &
  FPID=$!
  pids+=("$FPID")
  wait_up "$FP"
}
# The main job's rounds: both servers up at once, each row run on one and
# then the other, $reps times over, so that a busy second of the shared
# machine falls on both.
# Once-a-second sync: a request through each server's loop alone (no
# job, no disk), puts, then reserve+delete of the jobs put.
round_f1000() {
  local srv c r line port
  both -f 1000
  floor_start
  for srv in beanstalkd twheeld ${FP:+floor}; do
    port=$BP
    [ "$srv" = twheeld ] && port=$TP
    [ "$srv" = floor ] && port=$FP
    line=$("$load" -p "$port" -c 1 -t "$secs" ping)
    echo "$srv $line"
    echo "bstalk srv=$srv row=ping_us_c1 value=$(sed 's/.*mean \([0-9.]*\) us.*/\1/' <<<"$line") unit=us"
  done
  for r in $(seq "$reps"); do
    for c in 1 16; do
      on_both "put_f1000_c$c" puts/s -c "$c" -t "$secs" put
    done
  done
  for r in $(seq "$reps"); do
    for c in 1 16; do
      on_both "reserve_f1000_c$c" jobs/s -c "$c" -t "$secs" reserve
    done
  done
  stop "$BPID"
  stop "$TPID"
  if [ -n "$FP" ]; then
    stop "$FPID"
    FP=
  fi
}
# ticks PID: the CPU time (user + system) process PID used so far, in
# clock ticks.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# on_both_cpu NAME ARGS...: on_both for puts, and each server's CPU time
# per put (user + system, all its threads) as row cpu_NAME in us/put.
on_both_cpu() {
  local name=$1 srv pid port t0 line n
  shift
  for srv in beanstalkd twheeld ${FP:+floor}; do
    pid=$BPID port=$BP
    [ "$srv" = twheeld ] && pid=$TPID port=$TP
    [ "$srv" = floor ] && pid=$FPID port=$FP
    t0=$(ticks "$pid")
    line=$("$load" -p "$port" "$@")
    row "$name" "$srv" puts/s "$line"
    n=$(sed -n 's/.*bodies: \([0-9]*\) in .*/\1/p' <<<"$line")
    echo "bstalk srv=$srv row=cpu_$name value=$(awk -v a="$t0" -v b="$(ticks "$pid")" \
      -v n="$n" -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", (n > 0 ? (b - a) / hz * 1e6 / n : 0) }') unit=us/put"
  done
}
# Reply after fdatasync, with the device's limit probed before and after
# (F0_CONNS: the connection counts, default "1 16 64"); each server's
# CPU per put beside (on a shared machine the wall-clock rate of a disk
# other work also syncs on says little of the server's own cost); and
# the floor server with -b (one pwrite and one fdatasync per loop turn's
# puts, nothing else): what any server reaches with this client and
# disk when its replies wait for an fdatasync.
round_f0() {
  local c r
  probe
  both -f 0
  mkdir -p "$work/floor-f0"
  floor_start -b "$work/floor-f0"
  for r in $(seq "$reps"); do
    for c in ${F0_CONNS:-1 16 64}; do
      on_both_cpu "put_f0_c$c" -c "$c" -t "$secs" put
    done
  done
  stop "$BPID"
  stop "$TPID"
  if [ -n "$FP" ]; then
    stop "$FPID"
    FP=
  fi
  probe
}
# Lateness of delayed jobs put at a steady rate (delays of 1 s, puts one
# at a time on 4 connections, 4 more reserving).
round_steady() {
  local srv r line port
  both -f 1000
  for r in $(seq "$reps"); do
    for srv in beanstalkd twheeld; do
      port=$BP
      [ "$srv" = twheeld ] && port=$TP
      line=$("$load" -p "$port" -c 4 -n "$steady_rate" -r "$steady_rate" -D 1 steady)
      echo "$srv $line"
      echo "bstalk srv=$srv row=late_p99_steady value=$(sed 's/.* p99 \([0-9]*\) .*/\1/' <<<"$line") unit=ms"
      echo "bstalk srv=$srv row=late_p50_steady value=$(sed 's/.* p50 \([0-9]*\) .*/\1/' <<<"$line") unit=ms"
      echo "bstalk srv=$srv row=late_max_steady value=$(sed 's/.* max \([0-9]*\) .*/\1/' <<<"$line") unit=ms"
    done
  done
  stop "$BPID"
  stop "$TPID"
}
# Many delayed jobs, one server at a time (memory, disk and restart).
round_many() {
  local srv
  for srv in beanstalkd twheeld; do
    many "$srv" "$work/$srv-many" "$njobs"
    echo "bstalk srv=$srv row=delayed_rss_mb value=$REPLY_RSS unit=MB"
    echo "bstalk srv=$srv row=delayed_disk_mb value=$REPLY_DISK unit=MB"
    echo "bstalk srv=$srv row=delayed_rss_b_per_job value=$REPLY_RSS_PER unit=B/job"
    echo "bstalk srv=$srv row=delayed_disk_b_per_job value=$REPLY_DISK_PER unit=B/job"
    echo "bstalk srv=$srv row=restart_s value=$REPLY_T1 unit=s"
    echo "bstalk srv=$srv row=restart_cpu_s value=$REPLY_CPU unit=s"
    echo "bstalk srv=$srv row=restart_rq_s value=$REPLY_RQ unit=s"
    rm -rf "${work:?}/$srv-many"
  done
}
main_round() {
  round_f1000
  round_f0
  round_steady
  round_many
}
reps=${REPS:-3}
steady_rate=${STEADY_RATE:-1000}

echo "# $(date -u +%F) $(nproc) cores; twheeld $("$tw" -v | cut -d' ' -f2), beanstalkd $(beanstalkd -v 2>&1 | cut -d' ' -f2)"
blk=0
case "${ONLY:-all}" in
main | f1000 | f0 | steady | disk)
  echo "# $njobs delayed jobs; steady lateness at $steady_rate puts/s; load average $(cut -d' ' -f1-3 /proc/loadavg)"
  case "$ONLY" in
  main) main_round ;;
  f1000) round_f1000 ;;
  f0) round_f0 ;;
  steady) round_steady ;;
  disk) round_many ;;
  esac
  echo "# load average at the end $(cut -d' ' -f1-3 /proc/loadavg)"
  exit 0
  ;;
esac
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
  many "$srv" "$work/$srv-many" "$njobs"
done
