#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Durable timers side by side: twheel's journal (SYNC_GROUP), Redis as a
# sorted-set delay queue (appendonly yes, appendfsync always, then
# everysec), SQLite in WAL mode with synchronous=FULL. Builds Release in
# build/bench-durable, starts its own redis-server on 127.0.0.1 with a random
# free port and a temporary directory, and writes every result line to
# build/bench-durable/results.txt plus a Markdown table to stdout.
#
# Usage: scripts/bench_durable.sh [--secs S] [--batch B] [--big]
#   --secs S  seconds per throughput run (default 3)
#   --batch B items per tw_durable_schedule_many call and Redis calls
#             pipelined per round trip in the batched runs (default 32)
#   --big     also recover 1e7 pending timers (about 1.2 GB of journal and
#             1 GB of RAM; a minute or two)
#   --paired R  instead of the runs above: for schedules and for cancels,
#             each thread count and items per call (1 and B), R rounds of
#             twheel SYNC_GROUP, Redis always and Redis everysec one right
#             after the other (one redis-server, switched with CONFIG SET
#             appendfsync; the keys a cancel run removes are put in first
#             with appendfsync no), and the median of the R per-round
#             ratios, so that a slow minute of the shared disk falls on both
#             sides of a ratio
set -euo pipefail
cd "$(dirname "$0")/.."
secs=3
batch=32
big=0
paired=0
while (($#)); do
  case $1 in
    --secs) secs=$2; shift ;;
    --batch) batch=$2; shift ;;
    --big) big=1 ;;
    --paired) paired=$2; shift ;;
    *) echo "usage: $0 [--secs S] [--batch B] [--big] [--paired R]" >&2; exit 2 ;;
  esac
  shift
done
scripts/deps.sh bench
out=build/bench-durable
mkdir -p "$out"
cmake -S . -B "$out" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTWHEEL_WERROR=ON \
  -DTWHEEL_BUILD_TESTS=OFF -DTWHEEL_BUILD_EXAMPLES=OFF >"$out/cmake.log"
cmake --build "$out" --target bench_durable >/dev/null
bin=$out/bench/bench_durable
work=$(mktemp -d "$PWD/$out/work.XXXXXX")
redis_pid=
cleanup() {
  if [ -n "$redis_pid" ]; then kill "$redis_pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
res=$out/results.txt
{
  echo "# $(date -u +%FT%TZ) commit $(git rev-parse --short HEAD)$(git diff --quiet || echo -dirty)"
  echo "# $(nproc) cores, $(uname -r), $(df -T "$work" | awk 'NR==2 {print $2}') on $(df "$work" | awk 'NR==2 {print $1}')"
  echo "# $(redis-server --version | cut -d' ' -f1-3)"
} >"$res"
run() { "$@" | tee -a "$res"; }

start_redis() { # $1 = always|everysec
  local dir=$work/redis-$1
  mkdir -p "$dir"
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    port=$((20000 + RANDOM % 40000))
    redis-server --bind 127.0.0.1 --port "$port" --dir "$dir" \
      --appendonly yes --appendfsync "$1" --save '' --logfile "$dir/log" &
    redis_pid=$!
    for _ in $(seq 50); do
      if redis-cli -p "$port" ping >/dev/null 2>&1; then return 0; fi
      if ! kill -0 "$redis_pid" 2>/dev/null; then break; fi
      sleep 0.1
    done
    kill "$redis_pid" 2>/dev/null || true
    wait "$redis_pid" 2>/dev/null || true
  done
  echo "cannot start redis-server" >&2
  exit 1
}
stop_redis() {
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
  wait "$redis_pid" 2>/dev/null || true
  redis_pid=
}

# --paired R: twheel and Redis at the same threads and items per call, one
# right after the other, R rounds; ratios per round, then their median.
if ((paired)); then
  start_redis always
  for op in sched cancel; do
  for depth in 1 "$batch"; do
    for t in 1 4 16; do
      for ((r = 1; r <= paired; r++)); do
        "$bin" twheel "$op" "$work/p$t" "$t" "$secs" 64 "$depth" |
          sed "s/^system=/round=$r system=/" | tee -a "$res"
        rm -rf "${work:?}/p$t"
        for mode in always everysec; do
          if [ "$op" = cancel ]; then
            redis-cli -p "$port" flushall >/dev/null
            redis-cli -p "$port" config set appendfsync no >/dev/null
            "$bin" redis fill "$port" "$t" 0 "$depth"
          fi
          redis-cli -p "$port" config set appendfsync "$mode" >/dev/null
          "$bin" redis "$op" "$port" "$t" "$secs" "$depth" |
            sed "s/^system=redis/round=$r system=redis-$mode/" | tee -a "$res"
        done
        redis-cli -p "$port" flushall >/dev/null
      done
    done
  done
  done
  stop_redis
  echo
  echo "| op | threads | items per call | twheel items/s (median) | / Redis always, median of $paired rounds (target 5x) | per round | / Redis everysec (target 1x) | per round |"
  echo "|---|---:|---:|---:|---:|---|---:|---|"
  awk '/^round=/ && / op=(sched|cancel) / {
    for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    k = v["op"] " " v["threads"] " " v["depth"]; r = v["round"]
    if (!(k in seen)) { seen[k] = 1; keys[++nk] = k }
    x[v["system"] " " k " " r] = v["ops_per_s"]; if (r > nr) nr = r
  }
  function med(a, n,   i, j, t) {
    for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) {
      t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  END {
    for (q = 1; q <= nk; q++) {
      k = keys[q]; split(k, kd, " "); la = ""; le = ""
      for (r = 1; r <= nr; r++) {
        tw[r] = x["twheel " k " " r]
        ra[r] = tw[r] / x["redis-always " k " " r]
        re[r] = tw[r] / x["redis-everysec " k " " r]
        la = la sprintf("%s%.1f", r > 1 ? ", " : "", ra[r])
        le = le sprintf("%s%.1f", r > 1 ? ", " : "", re[r])
      }
      ma = med(ra, nr); me = med(re, nr); mt = med(tw, nr)
      printf "| %s | %d | %d | %d | %.1fx %s | %s | %.1fx %s | %s |\n", kd[1], kd[2], kd[3],
        mt, ma, (ma >= 5 ? "MET" : "MISSED"), la, me, (me >= 1 ? "MET" : "MISSED"), le
    }
  }' "$res"
  exit 0
fi

# sched: SYNC_GROUP (fdatasync before every acknowledgement); isched:
# TW_DURABLE_SYNC_INTERVAL (fdatasync once a second), Redis everysec's
# durability. One item per call, then --batch items per call.
for op in sched isched; do
  for depth in 1 "$batch"; do
    for t in 1 4 16; do
      run "$bin" twheel "$op" "$work/$op$t" "$t" "$secs" 64 "$depth"
      rm -rf "${work:?}/$op$t"
    done
  done
done
for depth in 1 "$batch"; do
  for t in 1 4 16; do
    run "$bin" twheel cancel "$work/c$t" "$t" "$secs" 64 "$depth"
    rm -rf "$work/c$t"
  done
done
run "$bin" twheel recover "$work/r6" 1000000 64
echo "# twheel 1e6: $(du -sb "$work/r6" | awk '{printf "%.1f", $1 / 1e6}') B/timer of disk allocated (segments are preallocated whole)" | tee -a "$res"
rm -rf "$work/r6"
if ((big)); then
  run "$bin" twheel recover "$work/r7" 10000000 64
  rm -rf "$work/r7"
fi

for mode in always everysec; do
  start_redis "$mode"
  for t in 1 4 16; do
    "$bin" redis sched "$port" "$t" "$secs" 1 |
      sed "s/^system=redis/system=redis-$mode/" | tee -a "$res"
  done
  for t in 1 4 16; do
    "$bin" redis sched "$port" "$t" "$secs" "$batch" |
      sed "s/^system=redis/system=redis-$mode/" | tee -a "$res"
  done
  n=$(redis-cli -p "$port" zcard tw:due)
  mem=$(redis-cli -p "$port" info memory | awk -F: '/^used_memory:/ {print $2+0}')
  aof=$(du -sb "$work/redis-$mode" | cut -f1)
  echo "# redis-$mode: $n timers, used_memory $(awk -v m="$mem" -v n="$n" 'BEGIN {printf "%.1f", m / n}') B/timer, disk $(awk -v m="$aof" -v n="$n" 'BEGIN {printf "%.1f", m / n}') B/timer" | tee -a "$res"
  for depth in 1 "$batch"; do
    for t in 1 4 16; do
      redis-cli -p "$port" flushall >/dev/null
      redis-cli -p "$port" config set appendfsync no >/dev/null
      "$bin" redis fill "$port" "$t" 0 "$depth"
      redis-cli -p "$port" config set appendfsync "$mode" >/dev/null
      "$bin" redis cancel "$port" "$t" "$secs" "$depth" |
        sed "s/^system=redis/system=redis-$mode/" | tee -a "$res"
    done
  done
  stop_redis
done
for t in 1 4 16; do
  run "$bin" sqlite sched "$work/sq$t.db" "$t" "$secs"
done

echo
echo "| system | op | threads | items per call (pipelined per round trip) | items/s | p50 us | p99 us |"
echo "|---|---|---:|---:|---:|---:|---:|"
awk '/^system=/ && !/op=recover/ {
  for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
  printf "| %s | %s | %s | %s | %s | %s | %s |\n", v["system"], v["op"],
    v["threads"], v["depth"], v["ops_per_s"], v["p50_us"], v["p99_us"]
}' "$res"

# The targets: twheel SYNC_GROUP against Redis always (5x) and everysec
# (1x) at the same threads and items per call; SYNC_INTERVAL against
# everysec (the same durability).
echo
echo "| twheel | op | threads | items per call | twheel items/s | / Redis always (target 5x) | / Redis everysec (target 1x) |"
echo "|---|---|---:|---:|---:|---:|---:|"
awk '/^system=/ && / op=(sched|cancel) / {
  for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
  r[v["system"] " " v["op"] " " v["threads"] " " v["depth"]] = v["ops_per_s"]
}
END {
  split("twheel sched,twheel cancel,twheel-interval sched", sys, ",")
  for (s = 1; s <= 3; s++) for (d = 1; d <= 2; d++) for (t = 1; t <= 3; t++) {
    th = t == 1 ? 1 : t == 2 ? 4 : 16; dp = d == 1 ? 1 : '"$batch"'
    split(sys[s], so, " ")
    k = sys[s] " " th " " dp; a = r["redis-always " so[2] " " th " " dp]
    e = r["redis-everysec " so[2] " " th " " dp]
    if (!(k in r) || !a || !e) continue
    if (s < 3)
      va = sprintf("%.1fx %s", r[k] / a, r[k] / a >= 5 ? "MET" : "MISSED")
    else
      va = sprintf("%.1fx (less durable: no target)", r[k] / a)
    printf "| %s | %s | %d | %d | %d | %s | %.1fx %s |\n", so[1], so[2], th, dp,
      r[k], va, r[k] / e, (r[k] / e >= 1 ? "MET" : "MISSED")
  }
}' "$res"
