#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Durable timers on Redis against a sorted-set poller, side by side on one
# redis-server that this script starts (127.0.0.1, a free port, a temporary
# directory, no persistence) and always stops.
# Usage: scripts/bench_redis.sh [BUILD_DIR]   (a Release build; made if
# missing). TIMERS (default 20000) and WINDOW_MS (10000) size the firing
# runs; SCHED_N (default 100000 per node) the schedule runs; REPS (default
# 3) runs of each schedule and firing figure, of which the median is
# printed (by schedules/s, resp. Redis CPU total). FIRE_ONLY=1: only the
# firing runs (twheel, twheel with shard ownership (a 5 s shard lease),
# the lease-poller and the bare poller, 100 ms), at TIMERS over WINDOW_MS
# (SHARDS: twheel's shards). IDLE_ONLY=1: only Redis's CPU with nothing
# due, 1024 shards, 1 and 4 nodes, without and with ownership. CELLS=1:
# only Redis CPU at equal precision, twheel's check gap G beside the
# lease-poller polling every G (G = 5 and 100 ms; 2,000/s at 8 and 64
# shards, 20,000/s at 64 shards; WINDOW_MS long; CELL_LIST="G:RATE:SHARDS
# ...": other cells). SLOWLOG=1: one run of
# one cell (G, RATE, SHARDS; default 100 ms, 2,000/s, 64 shards) for each
# side with Redis's SLOWLOG recording every command: calls and time per
# 1,000 timers by command and by script (scripts/redis_slowlog.py).
# SCRIPT_COST=1: Redis CPU of a SCHED, an idle CLAIM and a CLAIM of 12
# timers, with and without the claim's per-timer ZADD
# (scripts/redis_script_cost.py; median of REPS runs is not taken: each
# run prints its own).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/bench-redis}
if [ ! -x "$build/bench/bench_redis" ]; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTWHEEL_REDIS=ON \
    -DTWHEEL_BUILD_TESTS=OFF >/dev/null
fi
cmake --build "$build" --target bench_redis >/dev/null
bin=$build/bench/bench_redis
timers=${TIMERS:-20000}
window=${WINDOW_MS:-10000}
sched_n=${SCHED_N:-100000}
reps=${REPS:-3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/twbench.XXXXXX")
pid=
others=()
cleanup() {
  for p in $pid "${others[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
for _ in $(seq 50); do
  port=$((10000 + RANDOM % 12000))
  ok=1
  for p in $port $((port + 1)) $((port + 2)) $((port + 3)) $((port + 4)) \
    $((port + 10002)) $((port + 10003)) $((port + 10004)); do
    if (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then ok=0; fi
  done
  ((ok)) && break
done
redis-server --port "$port" --bind 127.0.0.1 --dir "$tmp" --save '' \
  --appendonly no --logfile "$tmp/log" &
pid=$!
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
seeds=127.0.0.1:$port
echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'), one server, no persistence; median of $reps runs"
export REDIS_PID=$pid
# median FIELD CMD...: run CMD $reps times (FLUSHALL after each), print the
# line whose FIELD-th word is the median.
median() {
  local field=$1 out=()
  shift
  for _ in $(seq "$reps"); do
    out+=("$("$@")")
    redis-cli -p "$port" flushall >/dev/null
  done
  printf '%s\n' "${out[@]}" | sort -k"$field","$field"g | sed -n "$(((reps + 1) / 2))p"
}
if [ -n "${IDLE_ONLY:-}" ]; then
  for n in 1 4; do
    median 8 "$bin" idle "$seeds" "$pid" "$n" 10
    median 9 env OWNER_LEASE_MS=5000 "$bin" idle "$seeds" "$pid" "$n" 10
  done
  exit 0
fi
if [ -n "${SCRIPT_COST:-}" ]; then
  for _ in $(seq "$reps"); do
    scripts/redis_script_cost.py "$port" "$pid" "$bin"
  done
  exit 0
fi
if [ -n "${SLOWLOG:-}" ]; then
  g=${G:-100} rate=${RATE:-2000} shards=${SHARDS:-64}
  n=$((rate * window / 1000))
  redis-cli -p "$port" config set slowlog-log-slower-than 0 >/dev/null
  redis-cli -p "$port" config set slowlog-max-len 1000000 >/dev/null
  echo "# SLOWLOG: G $g ms, $rate/s, $shards shards, $n timers; per 1,000 timers"
  for side in fire lpoll; do
    redis-cli -p "$port" slowlog reset >/dev/null
    if [ "$side" = fire ]; then
      env LOAD_BATCH=500 SHARDS="$shards" CHECK_GAP_MS="$g" \
        "$bin" fire "$seeds" "$pid" "$n" "$window"
    else
      "$bin" lpoll "$seeds" "$pid" "$n" "$window" "$g"
    fi
    redis-cli -p "$port" --json slowlog get 1000000 |
      scripts/redis_slowlog.py "$n" "$bin"
    redis-cli -p "$port" flushall >/dev/null
  done
  exit 0
fi
if [ -n "${CELLS:-}" ]; then
  # Redis CPU at equal precision (issue 41): twheel with a check gap of G
  # ms beside the lease-poller polling every G ms, G = 5 and 100, at
  # 2,000 timers/s (8 and 64 shards) and 20,000/s (64 shards), over
  # WINDOW_MS; loaded by tw_durable_schedule_many (500 a call).
  cells="5:2000:8 5:2000:64 5:20000:64 100:2000:8 100:2000:64 100:20000:64"
  for c in ${CELL_LIST:-$cells}; do
    g=${c%%:*} cell=${c#*:}
    rate=${cell%:*} shards=${cell#*:}
    n=$((rate * window / 1000))
    echo "# cell: G $g ms, $rate/s, $shards shards, $n timers"
    median 25 env LOAD_BATCH=500 SHARDS="$shards" CHECK_GAP_MS="$g" \
      "$bin" fire "$seeds" "$pid" "$n" "$window"
    median 25 "$bin" lpoll "$seeds" "$pid" "$n" "$window" "$g"
  done
  exit 0
fi
if [ -n "${FIRE_ONLY:-}" ]; then
  median 25 env LOAD_BATCH=500 "$bin" fire "$seeds" "$pid" "$timers" "$window"
  median 26 env LOAD_BATCH=500 OWNER_LEASE_MS=5000 "$bin" fire "$seeds" "$pid" "$timers" "$window"
  median 25 "$bin" lpoll "$seeds" "$pid" "$timers" "$window" 100
  median 25 "$bin" poll "$seeds" "$pid" "$timers" "$window" 100
  exit 0
fi
# Schedules: one call per timer from 64 threads, then batches of 4096
# (tw_durable_schedule_many) from 2 threads; one node, then two.
median 9 "$bin" sched "$seeds" 1 64 "$sched_n"
median 9 env KEEP=1 BATCH=4096 "$bin" sched "$seeds" 1 2 $((sched_n * 4))
median 9 "$bin" sched "$seeds" 2 64 "$sched_n"
median 9 env KEEP=1 BATCH=4096 "$bin" sched "$seeds" 2 2 $((sched_n * 2))
# Redis memory per pending timer (key "n0-<i>", 32-byte payload).
mem0=$(redis-cli -p "$port" info memory | sed -n 's/^used_memory:\([0-9]*\).*/\1/p')
KEEP=1 "$bin" sched "$seeds" 1 64 "$sched_n" >/dev/null
mem1=$(redis-cli -p "$port" info memory | sed -n 's/^used_memory:\([0-9]*\).*/\1/p')
echo "memory         $sched_n pending timers (11-byte keys, 32-byte payloads): $(((mem1 - mem0) / sched_n)) bytes each in Redis (used_memory)"
redis-cli -p "$port" flushall >/dev/null
# Firing: twheel loaded one call per timer (32 threads) and by
# tw_durable_schedule_many (500 per call), then the pollers.
median 25 "$bin" fire "$seeds" "$pid" "$timers" "$window"
median 25 env LOAD_BATCH=500 "$bin" fire "$seeds" "$pid" "$timers" "$window"
median 25 "$bin" lpoll "$seeds" "$pid" "$timers" "$window" 100
median 25 "$bin" poll "$seeds" "$pid" "$timers" "$window" 100
median 25 "$bin" poll "$seeds" "$pid" "$timers" "$window" 1000

# WAIT for one replica: the same schedules with a replica attached.
rport=$((port + 1))
mkdir -p "$tmp/r"
redis-server --port "$rport" --bind 127.0.0.1 --dir "$tmp/r" --save '' \
  --appendonly no --logfile "$tmp/r/log" --replicaof 127.0.0.1 "$port" &
others+=($!)
until redis-cli -p "$port" info replication | grep -q "slave0:.*state=online"; do sleep 0.05; done
redis-cli -p "$port" flushall >/dev/null
"$bin" sched "$seeds" 1 64 "$sched_n"
redis-cli -p "$port" flushall >/dev/null
WAIT_REPLICAS=1 "$bin" sched "$seeds" 1 64 "$sched_n"
redis-cli -p "$port" flushall >/dev/null
KEEP=1 BATCH=4096 "$bin" sched "$seeds" 1 2 $((sched_n * 4))
redis-cli -p "$port" flushall >/dev/null
WAIT_REPLICAS=1 KEEP=1 BATCH=4096 "$bin" sched "$seeds" 1 2 $((sched_n * 4))
kill -9 "${others[@]}" 2>/dev/null || true

# A 3-master cluster on this machine: schedules from one node and two.
cbase=$((port + 2))
addrs=()
for i in 0 1 2; do
  p=$((cbase + i))
  mkdir -p "$tmp/c$p"
  redis-server --port "$p" --bind 127.0.0.1 --dir "$tmp/c$p" --save '' \
    --appendonly no --logfile "$tmp/c$p/log" --cluster-enabled yes \
    --cluster-config-file nodes.conf &
  others+=($!)
  addrs+=(127.0.0.1:$p)
done
for a in "${addrs[@]}"; do
  until redis-cli -p "${a#*:}" ping >/dev/null 2>&1; do sleep 0.05; done
done
redis-cli --cluster create "${addrs[@]}" --cluster-yes >/dev/null
for a in "${addrs[@]}"; do
  until redis-cli -p "${a#*:}" cluster info | grep -q cluster_state:ok; do sleep 0.05; done
done
echo "# 3-master cluster (redis cpu: not measured)"
unset REDIS_PID
"$bin" sched "${addrs[0]}" 1 64 "$sched_n"
"$bin" sched "${addrs[0]}" 2 64 "$sched_n"
KEEP=1 BATCH=4096 "$bin" sched "${addrs[0]}" 1 2 $((sched_n * 4))
