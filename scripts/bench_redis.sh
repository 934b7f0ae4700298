#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Durable timers on Redis against a sorted-set poller, side by side on one
# redis-server that this script starts (127.0.0.1, a free port, a temporary
# directory, no persistence) and always stops.
# Usage: scripts/bench_redis.sh [BUILD_DIR]   (a Release build; made if
# missing). TIMERS (default 20000) and WINDOW_MS (10000) size the firing
# runs; SCHED_N (default 100000 per node) the schedule runs.
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
tmp=$(mktemp -d "${TMPDIR:-/tmp}/twbench.XXXXXX")
pid=
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
for _ in $(seq 50); do
  port=$((10000 + RANDOM % 20000))
  (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null || break
done
redis-server --port "$port" --bind 127.0.0.1 --dir "$tmp" --save '' \
  --appendonly no --logfile "$tmp/log" &
pid=$!
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
seeds=127.0.0.1:$port
echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# redis $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'), one server, no persistence"
"$bin" sched "$seeds" 1 64 "$sched_n"
redis-cli -p "$port" flushall >/dev/null
"$bin" sched "$seeds" 2 64 "$sched_n"
redis-cli -p "$port" flushall >/dev/null
"$bin" fire "$seeds" "$pid" "$timers" "$window"
redis-cli -p "$port" flushall >/dev/null
"$bin" poll "$seeds" "$pid" "$timers" "$window" 100
redis-cli -p "$port" flushall >/dev/null
"$bin" poll "$seeds" "$pid" "$timers" "$window" 1000
