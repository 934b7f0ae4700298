#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Redis commands per fired timer of `bench_redis fire` with shard
# ownership, counted by Redis itself (INFO commandstats), for one or more
# builds side by side on one redis-server that this script starts
# (127.0.0.1, a free port, no persistence) and always stops. The builds
# take turns, REPS (default 3) rounds; each run is preceded by CONFIG
# RESETSTAT and followed by FLUSHALL. Counts do not depend on the load of
# the machine the way CPU times do; the usec that Redis reports per
# command do, less than /proc's totals.
# Usage: scripts/bench_redis_calls.sh BUILD_DIR...   (Release builds with
# bench/bench_redis). TIMERS (default 20000), WINDOW_MS (10000), SHARDS
# (64), OWNER_LEASE_MS (5000; 0: without ownership). A BUILD_DIR@G
# argument runs that build with cfg.redis_check_gap_ms = G (a check batch
# at most every G ms; the default 4). POLLER=1: each round
# also runs the lease-poller (`bench_redis lpoll`, 100 ms, of the first
# build) after the builds, counted the same way. IDLE=1: instead,
# `bench_redis idle` (nothing due, SHARDS default 1024, NODES node
# processes, default 1, 10 s measured), calls per second of the run.
# Prints one line per run: the build, the bench's own line, then per 1000
# fired timers: the calls of each command and the usec inside EVALSHA and
# in all commands.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: $0 BUILD_DIR..." >&2; exit 2; }
timers=${TIMERS:-20000}
window=${WINDOW_MS:-10000}
reps=${REPS:-3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/twcalls.XXXXXX")
pid=
cleanup() {
  [ -n "$pid" ] && kill -9 "$pid" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
for _ in $(seq 50); do
  port=$((10000 + RANDOM % 12000))
  (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null || break
done
redis-server --port "$port" --bind 127.0.0.1 --dir "$tmp" --save '' \
  --appendonly no --logfile "$tmp/log" &
pid=$!
until redis-cli -p "$port" ping >/dev/null 2>&1; do sleep 0.05; done
echo "# $(date -u +%FT%TZ) $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# TIMERS=$timers WINDOW_MS=$window SHARDS=${SHARDS:-64} OWNER_LEASE_MS=${OWNER_LEASE_MS:-5000}"
runs=("$@")
[ -n "${POLLER:-}" ] && runs+=(lpoll)
for _ in $(seq "$reps"); do
  for b in "${runs[@]}"; do
    redis-cli -p "$port" config resetstat >/dev/null
    t0=$(date +%s.%N)
    if [ -n "${IDLE:-}" ]; then
      line=$(env OWNER_LEASE_MS="${OWNER_LEASE_MS:-5000}" \
        SHARDS="${SHARDS:-1024}" "${b%@*}/bench/bench_redis" idle \
        "127.0.0.1:$port" "$pid" "${NODES:-1}" 10)
    elif [ "$b" = lpoll ]; then
      line=$("${1%@*}/bench/bench_redis" lpoll "127.0.0.1:$port" "$pid" "$timers" \
        "$window" 100)
    else
      gap=0
      [[ "$b" == *@* ]] && gap=${b##*@}
      line=$(env LOAD_BATCH=500 OWNER_LEASE_MS="${OWNER_LEASE_MS:-5000}" \
        CHECK_GAP_MS="$gap" \
        SHARDS="${SHARDS:-64}" "${b%@*}/bench/bench_redis" fire \
        "127.0.0.1:$port" "$pid" "$timers" "$window")
    fi
    stats=$(redis-cli -p "$port" info commandstats | tr -d '\r')
    secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')
    redis-cli -p "$port" flushall >/dev/null
    echo "$b: $line"
    [ -n "${IDLE:-}" ] && { echo "$stats" | awk -v s="$secs" -F'[:=,]' '
      /^cmdstat_/ && $1 !~ /(config|info)/ { tc += $3; tu += $5 }
      /^cmdstat_evalsha:/ { ec = $3; eu = $5 }
      END { printf "  per second: evalsha %.1f calls %.0f usec; all %.1f calls\n",
                   ec / s, eu / s, tc / s }'; continue; }
    echo "$stats" | awk -v n="$timers" -F'[:=,]' '
      /^cmdstat_/ { sub("cmdstat_", "", $1); calls[$1] = $3; usec[$1] = $5;
                    tc += $3; tu += $5 }
      END { k = 1000 / n; s = "  per 1000 timers: calls";
            for (c in calls) if (c !~ /^(config|info)/)
              s = s sprintf(" %s %.1f", c, calls[c] * k);
            printf "%s; all %.1f; usec evalsha %.0f, all %.0f\n", s, tc * k,
                   usec["evalsha"] * k, tu * k }'
  done
done
