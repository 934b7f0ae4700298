#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The main job: builds twheel in Release (build/bench) and runs five rounds,
# each beside its peers in the same run: the core wheel against a binary
# heap, libuv and libevent (bench_core), with the memory's floor under a
# churn pair (dram_probe) and the wheel built with one list per slot
# (bench_core_1list); the timer service (bench_service) against Netty's
# HashedWheelTimer and Java's ScheduledThreadPoolExecutor
# (bench/peers/java); the durable journal (SYNC_GROUP, SYNC_INTERVAL)
# judged against the disk's own limit measured in the run (fsync_probe:
# fdatasync on a preallocated file), with Redis appendfsync always and
# everysec beside it (bench_durable); twheeld against beanstalkd
# (scripts/bench_twheeld.sh ONLY=main, our load generator bench_bstalk);
# the Redis backend against a sorted-set poller (bench_redis); the
# PostgreSQL backend beside graphile-worker and pg-boss (scripts/bench_pg.sh,
# bench/report/pg_summary.awk). The servers
# run on 127.0.0.1 (free ports, directories under build/) and are always
# stopped.
# Prints the tables and writes build/bench/results/: results.csv (every
# figure), *.txt (each program's own output), bench.png (gnuplot),
# machine.txt, summary.txt (verdicts). Installs the Debian packages it
# needs first (scripts/deps.sh bench).
#
# Usage: scripts/bench.sh [--full] [--reps R] [--no-java] [--instr]
#                         [--delayed N]
#                         [--rounds core,service,durable,twheeld,redis,pg]
#   default  quick mode (sized for 6 minutes on 2 quiet cores from a fresh
#            clone; on 2026-12-07, at load 10-18, it took 15 min):
#            1e3 and 1e5 pending timers with every workload, 1e6 with
#            add/cancel/churn/memory for twheel and the heap, churn and
#            memory for libuv and libevent, expiry for twheel and the heap;
#            the service and the Java peers with 1,000,000 tasks, 3 runs
#            each (a run then spans many scheduler time slices); the durable
#            round, 3 runs of 1 s per system, one item per call and 32; the
#            twheeld round, one run of 1 s per row and server, as many
#            delayed jobs as the time left allows (--delayed); the Redis
#            round, 1 run each of 5,000 timers over 2 s beside the
#            sorted-set poller, 3 at equal precision beside the
#            lease-poller (G = 5 and 100 ms); the
#            PostgreSQL round, one run of 0.25 s per scheduling cell and
#            1 s of firing at 2,000/s, 2,000 pending timers for the sizes
#            (about 85 s at load 15-17; PG_REPS=3 for medians of 3;
#            scripts/bench_pg.sh alone runs 3 of longer ones)
#   --full   1e3, 1e5, 1e6 and 1e7 pending timers, every workload (about
#            50 minutes); implies --instr
#   --rounds only the rounds named (default all six)
#   --delayed N  delayed jobs in the twheeld round's memory, disk and
#            restart rows, the same for both servers (default: what the
#            time left in the budget allows, 50,000 to 1,000,000; a
#            million takes beanstalkd about 40 s to take and 10 s to read
#            back on 2 cores)
#   --instr  also count instructions and simulated cache misses per
#            operation under callgrind (noise-free; about a minute)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
full=0
reps=5
java=1
instr=0
rounds=core,service,durable,twheeld,redis,pg
delayed=auto
budget=360 # seconds: the quick run's target, Debian installs included
t_script=$SECONDS
while (($#)); do
  case $1 in
    --full) full=1; instr=1 ;;
    --instr) instr=1 ;;
    --reps) reps=$2; shift ;;
    --no-java) java=0 ;;
    --rounds) rounds=$2; shift ;;
    --delayed) delayed=$2; shift ;;
    *) echo "usage: $0 [--full] [--reps R] [--no-java] [--instr]" \
      "[--delayed N] [--rounds core,service,durable,twheeld,redis,pg]" >&2
      exit 2 ;;
  esac
  shift
done

has() { [[ ",$rounds," == *",$1,"* ]]; }
has service || java=0
scripts/deps.sh bench
build=$root/build/bench
out=$build/results
mkdir -p "$out"
# One run at a time: a second one would clobber the results and skew both.
exec 9>"$build/.lock"
if ! flock -n 9; then
  echo "another scripts/bench.sh is running; waiting for it"
  flock 9
fi
rm -rf "$out"/results.csv "$out"/instr.csv "$out"/*.txt "$out"/bench.png \
  "$out"/callgrind
# redis-server processes started here, each stopped on any exit.
redis_pids=()
redis_dirs=()
stop_all_redis() {
  local p
  for p in "${redis_pids[@]}"; do
    kill "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
  redis_pids=()
  ((${#redis_dirs[@]})) && rm -rf "${redis_dirs[@]}"
  redis_dirs=()
}
trap stop_all_redis EXIT
# A signal ends the script through exit, so the EXIT trap runs too.
trap 'exit 130' INT
trap 'exit 143' TERM
# start_redis DIR ARGS...: a redis-server on a free loopback port (set in
# $rport, its pid in $rpid) with its files in DIR.
start_redis() {
  local dir=$1 try
  shift
  mkdir -p "$dir"
  redis_dirs+=("$dir")
  for try in 1 2 3 4 5 6 7 8 9 10; do
    rport=$((20000 + RANDOM % 40000))
    if (exec 3<>"/dev/tcp/127.0.0.1/$rport") 2>/dev/null; then continue; fi
    redis-server --bind 127.0.0.1 --port "$rport" --dir "$dir" --save '' \
      --logfile "$dir/log" "$@" &
    rpid=$!
    redis_pids+=("$rpid")
    for _ in $(seq 50); do
      if redis-cli -p "$rport" ping >/dev/null 2>&1; then return 0; fi
      kill -0 "$rpid" 2>/dev/null || break
      sleep 0.1
    done
  done
  echo "cannot start redis-server (log: $dir/log)" >&2
  return 1
}
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTWHEEL_BUILD_TESTS=OFF -DTWHEEL_BUILD_EXAMPLES=OFF >"$build.log" 2>&1 ||
  { cat "$build.log"; exit 1; }
targets=(bench_core bench_service)
has core && targets+=(bench_core_1list dram_probe churn_floor)
has durable && targets+=(bench_durable fsync_probe)
has twheeld && targets+=(twheeld bench_bstalk bstalk_floor fsync_probe)
# bench_redis exists when hiredis was found (scripts/deps.sh installs it).
if has redis && grep -q '^build bench/bench_redis:' "$build/build.ninja"; then
  targets+=(bench_redis)
fi
# bench_pg exists when libpq was found (scripts/deps.sh installs it).
if has pg && grep -q '^build bench/bench_pg:' "$build/build.ninja"; then
  targets+=(bench_pg)
fi
echo ">>> building ${targets[*]} ($((SECONDS - t_script)) s since the start," \
  "$((budget - SECONDS + t_script)) s of the ${budget} s budget left)"
cmake --build "$build" -j2 --target "${targets[@]}"
csv=$out/results.csv
echo "n,workload,engine,unit,median,min,max,reps,speedup_vs_heap,fired_fraction,note" >"$csv"
t_start=$SECONDS

# Progress: one line per stage with the time spent so far and an estimate
# of what is left (each stage's typical share of the run on 2 cores, in
# quick mode its seconds on the quiet run of 2026-12-08 00:01 UTC; the
# estimate scales with how long the run has taken so far).
stages=()
weights=()
plan() { stages+=("$1"); weights+=("$2"); }
if ! has core; then
  :
elif ((full)); then
  plan "core, 1e3..1e7 timers, every engine" 2400
else
  plan "core, 1e3 and 1e5 timers" 16
  plan "core, 1e6 timers, add/cancel/churn/memory" 35
  plan "core, 1e6 timers, expiry (twheel and heap)" 18
fi
has core && plan "core churn floor (one list per slot, DRAM probe)" 7
has service && plan "service (bench_service)" $((full ? 120 : 6))
((java)) && plan "Java peers (Netty HWT, JDK STPE)" $((full ? 300 : 31))
has durable && plan "durable store (device limit, journal, Redis always/everysec)" 30
has twheeld && plan "twheeld beside beanstalkd" 85
has redis && plan "Redis backend (twheel, sorted-set poller, lease-poller at equal precision)" 96
has pg && plan "PostgreSQL backend beside graphile-worker and pg-boss" 30
((instr)) && plan "callgrind counts" 60
plan "summary and plot" 2
stage_no=0
done_w=0
stage() { # NAME: announce the next stage
  local total_w=0 w left elapsed=$((SECONDS - t_start))
  if ((stage_no > 0)); then done_w=$((done_w + weights[stage_no - 1])); fi
  for w in "${weights[@]}"; do total_w=$((total_w + w)); done
  if ((done_w > 0 && elapsed > 0)); then
    left=$(((total_w - done_w) * elapsed / done_w))
  else
    left=$((total_w - done_w))
  fi
  stage_no=$((stage_no + 1))
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  local b=$((budget - SECONDS + t_script)) bs
  bs="$b s of the $budget s budget left"
  ((b < 0)) && bs="$((-b)) s over the $budget s budget"
  printf '\n>>> stage %d/%d: %s (%d s elapsed, about %d s left; %s; load average %s)\n' \
    "$stage_no" "${#stages[@]}" "$1" "$elapsed" "$left" "$bs" "$load"
  # The load average at the start of each stage, for the summary.
  echo "$1,$load" >>"$out/loads.txt"
}

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    "($(git status --short -- src include 2>/dev/null | wc -l) files in" \
    "src/ and include/ differ from it)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
  echo "memory: $(free -g | awk '/^Mem:/ {print $2}') GiB"
  echo "kernel: $(uname -sr)"
  echo "compiler: $(cc --version | head -1)"
  echo "libuv: $(pkg-config --modversion libuv 2>/dev/null || echo none)"
  echo "libevent: $(pkg-config --modversion libevent 2>/dev/null || echo none)"
  echo "java: $(java -version 2>&1 | head -1 || echo none)"
  echo "netty: $(dpkg-query -W -f='${Version}' libnetty-java 2>/dev/null || echo none)"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/machine.txt"
cat "$out/machine.txt"

# 1. The core wheel and the C peers.
core=("$build/bench/bench_core" --reps "$reps" --csv "$csv")
# The service rows: 1,000,000 tasks (a run of 200,000 lasted 2-7 ms, less
# than a scheduler time slice, so one preemption halved a figure), twheel's
# median of 3 runs beside the Java peers' median of 3 (--full: 5), each
# with its spread.
svc_args=(--quick --tasks 1000000 --reps 3)
tasks=1000000
idle_ms=1000
if ! has core; then
  :
elif ((full)); then
  stage "core, 1e3..1e7 timers, every engine"
  "${core[@]}" --n 1000,100000,1000000,10000000 --workloads all \
    --cap-ms 10000 | tee "$out/core.txt"
else
  stage "core, 1e3 and 1e5 timers"
  "${core[@]}" --n 1000,100000 --workloads all --cap-ms 1000 |
    tee "$out/core.txt"
  # At 1e6 the peers take seconds a run: quick mode runs every add and
  # cancel workload at 1e6 for twheel and the heap, libuv and libevent
  # only where they have a target (churn, memory) and with 3 runs (they
  # took 75 of this stage's 82 s with all six workloads and 5 runs; their
  # churn is 12-15x twheel's, against a 2x target), and the expiry
  # workloads for twheel and the heap only (--full: all of them).
  stage "core, 1e6 timers, add/cancel/churn/memory"
  "${core[@]}" --n 1000000 --cap-ms 1000 --engines twheel,heap \
    --workloads add,add_rand,cancel,cancel_rand,churn,memory |
    tee -a "$out/core.txt"
  "$build/bench/bench_core" --reps 3 --csv "$csv" --n 1000000 --cap-ms 1000 \
    --engines libuv,libevent --workloads churn,memory | tee -a "$out/core.txt"
  stage "core, 1e6 timers, expiry (twheel and heap)"
  "${core[@]}" --n 1000000 --cap-ms 1000 --engines twheel,heap \
    --workloads expire_1,expire_jump | tee -a "$out/core.txt"
fi
# Churn at 1e6 with the wheel's slots holding one list each instead of 8
# (the same src/wheel.c built with TW_WHEEL_CHAINS=1), and the memory's
# floor under a churn pair: a load from a random line of 64 MiB (more
# than the 40 MB of 1e6 timers), one in flight (latency) and 2..16
# independent ones (what out-of-order execution can overlap).
if has core; then
  stage "core churn floor (one list per slot, DRAM probe)"
  # Both layouts beside the heap in the same processes, 3 alternating
  # runs: workloads churn_8lists (twheel, heap) and churn_1list
  # (twheel-1list, heap), medians of the runs.
  floor_csv=$build/floor.csv
  rm -f "$floor_csv"
  for r in 1 2 3; do
    "$build/bench/bench_core" --reps 1 --csv "$floor_csv.8" --n 1000000 \
      --cap-ms 1000 --engines twheel,heap --workloads churn >/dev/null
    "$build/bench/bench_core_1list" --reps 1 --csv "$floor_csv.1" \
      --n 1000000 --cap-ms 1000 --engines twheel-1list,heap \
      --workloads churn >/dev/null
  done
  awk -F, 'FNR == 1 && /^n,/ { next }
    { w = FILENAME ~ /\.8$/ ? "churn_8lists" : "churn_1list"
      k = $1 SUBSEP w SUBSEP $3; if (!(k in c)) { ks[++nk] = k; u[k] = $4 }
      v[k, ++c[k]] = $5 }
    END { for (q = 1; q <= nk; q++) { k = ks[q]; n = c[k]
        for (i = 1; i <= n; i++) a[i] = v[k, i] + 0
        for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) {
          t = a[j]; a[j] = a[j-1]; a[j-1] = t }
        split(k, f, SUBSEP)
        printf "%s,%s,%s,%s,%.2f,%.2f,%.2f,%d,,,alternating runs\n", f[1],
          f[2], f[3], u[k], a[int((n + 1) / 2)], a[1], a[n], n } }' \
    "$floor_csv.8" "$floor_csv.1" | tee "$out/churn_layouts.csv" >>"$csv"
  rm -f "$floor_csv".*
  # What the wheel's promises cost a churn pair (bench/churn_floor.c):
  # the bare list operations, then the checks, the exact count and the
  # wheel's calls, beside the heap, in one process, engines taking turns;
  # CPU time per pair, medians of 5.
  "$build/bench/churn_floor" 1000000 5 | tee "$out/churn_floor.txt"
  awk 'NR > 2 && NF >= 7 { m = $4; lo = $5; hi = $5
         sub(/^\[/, "", lo); sub(/\.\..*/, "", lo); sub(/.*\.\./, "", hi)
         sub(/\]$/, "", hi)
         printf "1000000,churn_floor,%s,ns/pair,%s,%s,%s,5,,,CPU time\n", $1,
           m, lo, hi }' "$out/churn_floor.txt" >>"$csv"
  "$build/bench/dram_probe" 64 1000000 | tee "$out/dram.txt"
  awk '{ for (i = 2; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
         printf "%d,dram_load,chains%d,ns/load,%s,%s,%s,1,,,%s MiB random lines\n",
           v["mib"], v["chains"], v["ns_per_load"], v["ns_per_load"],
           v["ns_per_load"], v["mib"] }' "$out/dram.txt" >>"$csv"
fi
((full)) && svc_args=(--tasks 1000000 --reps 3) && idle_ms=3000

# 2. The service (its own program; the median of its 3 runs per row)
if has service; then
  stage "service (bench_service)"
  "$build/bench/bench_service" "${svc_args[@]}" | tee "$out/service.txt"
  awk -v n="$tasks" -v reps=3 -f bench/report/service_csv.awk \
    "$out/service.txt" >>"$csv"
fi

# 3. ... and its Java peers.
((java)) && stage "Java peers (Netty HWT, JDK STPE)"
if ((!java)); then
  :
elif command -v javac >/dev/null && command -v java >/dev/null &&
  [ -r /usr/share/java/netty-common.jar ]; then
  mkdir -p "$build/java"
  javac -d "$build/java" -cp /usr/share/java/netty-common.jar \
    bench/peers/java/TimerBench.java
  java -Xms2g -Xmx2g -cp "$build/java:/usr/share/java/netty-common.jar" \
    TimerBench --tasks "$tasks" --reps "$((full ? reps : 3))" --idle-ms "$idle_ms" \
    --csv "$csv" |
    tee "$out/java.txt"
else
  echo "java: skipped (needs javac, java and /usr/share/java/netty-common.jar;" \
    "scripts/deps.sh bench installs them)" | tee "$out/java.txt"
fi

# fdatasync_probe TAG DIR [COUNT]: the device's limit, measured in the run: the
# latency of one small pwrite + fdatasync on a preallocated file (as the
# journal's segments are), COUNT (default 300) calls of 112 bytes, and the
# caller's CPU time per call, as a "system=device" line.
fdatasync_probe() {
  mkdir -p "$2"
  "$build/bench/fsync_probe" "$2" "${3:-300}" 112 fallocate |
    tee -a "$out/fsync_probe.txt" |
    awk -v tag="$1" '/^file=fallocate/ { for (i = 1; i <= NF; i++) {
      split($i, kv, "="); v[kv[1]] = kv[2] }
      printf "system=device op=fdatasync at=%s p50_us=%s p99_us=%s cpu_us=%s\n",
        tag, v["p50_us"], v["p99_us"], v["cpu_us"] }'
}
# cpu_of PID: a process's CPU time so far (user + system), in seconds.
cpu_of() {
  awk -v hz="$(getconf CLK_TCK)" '{ printf "%.3f", ($14 + $15) / hz }' \
    "/proc/$1/stat"
}

# 3b. The durable store, judged against the device's limit measured in
# the same run (fdatasync latency on a preallocated file, probed before
# each set of runs and after the last; the median of the probes): twheel's journal with TW_DURABLE_SYNC_GROUP (every
# call fdatasync'ed before it returns), 1 and 4 threads one item per
# call, and 4 threads 32 per call, beside TW_DURABLE_SYNC_INTERVAL
# (written, fdatasync'ed every second: the CPU's limit) on the same
# code. Redis (a sorted-set delay queue, appendonly yes, appendfsync
# always and everysec, one redis-server switched with CONFIG SET; 32
# pipelined per round trip) runs beside it as context, and for the CPU
# per acknowledged item: the process's CPU / items for twheel, client
# plus server for Redis. 64-byte payloads, fresh 16-byte keys; 3 runs of
# 1 s of each, interleaved, so a slow second of the shared disk falls on
# every side; medians and spreads go to the CSV.
if has durable; then
  stage "durable store (device limit, journal, Redis always/everysec)"
  dwork=$build/durable-work
  rm -rf "$dwork"
  start_redis "$dwork/redis" --appendonly yes --appendfsync always
  dbin=$build/bench/bench_durable
  # twheel_run NAME OP THREADS DEPTH: one run of the journal.
  twheel_run() {
    "$dbin" twheel "$2" "$dwork/j" "$3" 1 64 "$4" |
      sed "s/^system=twheel[a-z-]* /system=$1 /"
    rm -rf "${dwork:?}/j"
  }
  {
    for depth in 1 32; do
      for r in 1 2 3; do
        fdatasync_probe "$depth/$r" "$dwork" 200
        ((depth == 1)) && twheel_run twheel-group sched 1 1
        twheel_run twheel-group sched 4 "$depth"
        twheel_run twheel-interval isched 4 "$depth"
        for mode in always everysec; do
          redis-cli -p "$rport" config set appendfsync "$mode" >/dev/null
          c0=$(cpu_of "$rpid")
          line=$("$dbin" redis sched "$rport" 4 1 "$depth")
          echo "${line/#system=redis /system=redis-$mode } srv_cpu_s=$(awk \
            -v a="$c0" -v b="$(cpu_of "$rpid")" 'BEGIN { printf "%.3f", b - a }')"
          redis-cli -p "$rport" flushall >/dev/null
        done
      done
    done
    fdatasync_probe after "$dwork" 200
  } | grep -E '^(system=|  syncs=)' | tee "$out/durable.txt" &
  wait $! # (in the background so that a signal stops the servers at once)
  stop_all_redis
  rm -rf "$dwork"
  awk -f bench/report/rounds_csv.awk "$out/durable.txt" >>"$csv"
fi

# 3c. twheeld beside beanstalkd (scripts/bench_twheeld.sh ONLY=main): both
# servers up side by side, each row run of 1 s on one then the other, 3
# times over; our load generator (bench_bstalk), 64-byte bodies: puts
# with the reply after fdatasync (-f 0; the device's limit probed before
# and after those rows), puts and reserve+delete with -f 1000, the
# lateness of delayed jobs put at a steady rate; then, one server at a
# time, $delayed delayed jobs (memory and disk per job, restart after
# kill -9 until `stats` answers).
if has twheeld; then
  stage "twheeld beside beanstalkd"
  if [ "$delayed" = auto ]; then
    # What the budget leaves after this round's other rows (about 80 s)
    # and the rounds after it (on the quiet run of 2026-12-08 00:01 UTC:
    # Redis 96 s, PostgreSQL 30 s, the summary 2 s): 100,000 delayed jobs
    # cost both servers about 7 s on 2 cores (beanstalkd's puts and
    # restart the most), times the load average over the cores.
    after=5
    has redis && after=$((after + 96))
    has pg && after=$((after + 30))
    left=$((budget - SECONDS + t_script - 80 - after))
    per100k=$(awk -v l="$(cut -d' ' -f1 /proc/loadavg)" -v c="$(nproc)" \
      'BEGIN { f = l / c; if (f < 1) f = 1; printf "%d", 7 * f + 0.5 }')
    delayed=$((left > 0 ? left * 100000 / per100k / 50000 * 50000 : 0))
    ((delayed < 50000)) && delayed=50000
    ((delayed > 1000000)) && delayed=1000000
    echo "delayed jobs: $delayed (about $left s of the budget for them," \
      "about $per100k s per 100,000 at this load)"
  fi
  if command -v beanstalkd >/dev/null; then
    FSYNC_PROBE=$build/bench/fsync_probe ONLY=main \
      scripts/bench_twheeld.sh "$build" 1 "$delayed" |
      tee "$out/twheeld.txt" &
    wait $!
    awk -f bench/report/rounds_csv.awk -v delayed="$delayed" \
      "$out/twheeld.txt" >>"$csv"
  else
    echo "twheeld: skipped (needs beanstalkd; scripts/deps.sh bench" \
      "installs it)" | tee "$out/twheeld.txt"
  fi
fi

# ---- HOOK: Redis CPU at equal precision (scripts/bench_redis.sh) --------
# The Redis round's cells "Redis CPU at equal precision" (twheel's Redis
# backend beside a same-guarantee lease-poller polling as often as
# twheel's precision) go in this function. It runs inside the Redis round
# below, after the sorted-set poller's runs, with the round's
# redis-server up ($rport on 127.0.0.1, its pid $rpid, flushed) and
# $build/bench/bench_redis built; whatever it prints goes to redis.txt and
# through bench/report/rounds_csv.awk into results.csv (lines in the form
# bench_redis prints, "... timers N delivered D ... p99 P ... total T",
# become redis_cpu and redis_p99 rows; the engine is named by the line's
# first words), and bench/report/summary.awk prints and judges them (its
# "Redis backend" targets). Until then it measures nothing.
redis_equal_precision() {
  # Redis CPU at equal precision: twheel with a check gap of G ms beside
  # the lease-poller (at least once, as twheel: a claimed timer's lease
  # ends and it is claimed again) polling every G ms, G = 5 and 100, the
  # same 5,000 timers over 2 s (2,500/s), 64 shards, 3 runs each,
  # interleaved. twheel's lines are renamed "twgap G ms" so that
  # rounds_csv.awk files them as engine twgap-Gms (lpoll: lpoller-Gms).
  local g r
  for g in 5 100; do
    for r in 1 2 3; do
      SHARDS=64 CHECK_GAP_MS=$g LOAD_BATCH=500 "$build/bench/bench_redis" \
        fire "127.0.0.1:$rport" "$rpid" 5000 2000 |
        sed -E "s/^.* timers ([0-9]+) delivered/twgap $g ms timers \\1 delivered/"
      redis-cli -p "$rport" flushall >/dev/null
      "$build/bench/bench_redis" lpoll "127.0.0.1:$rport" "$rpid" 5000 2000 "$g"
      redis-cli -p "$rport" flushall >/dev/null
    done
  done
}
# ---- end of HOOK --------------------------------------------------------

# 3d. The Redis backend against the sorted-set poller most Redis delay
# queues use (ZADD + HSET per timer, a Lua ZRANGEBYSCORE + ZREM + HDEL every
# 100 ms), on one redis-server without persistence: 5,000 timers due over
# 2 s, 3 runs of each, interleaved; Redis CPU per 1000 fired timers (from
# /proc, loading and firing) and the p99 lateness of the callbacks.
if has redis; then
  stage "Redis backend (twheel, sorted-set poller, lease-poller at equal precision)"
  if [ -x "$build/bench/bench_redis" ]; then
    rwork=$build/redis-work
    rm -rf "$rwork"
    start_redis "$rwork" --appendonly no
    {
      # One run of each in quick mode: its target (p99 lateness, the
      # poller's over twheel's, >= 10x) was met 76x on the quiet run of
      # 2026-12-08 00:01 UTC, and its CPU row is context only; the runs at
      # equal precision below keep 3 each.
      for r in $(seq "$((full ? 3 : 1))"); do
        "$build/bench/bench_redis" fire "127.0.0.1:$rport" "$rpid" 5000 2000
        redis-cli -p "$rport" flushall >/dev/null
        "$build/bench/bench_redis" poll "127.0.0.1:$rport" "$rpid" 5000 2000 100
        redis-cli -p "$rport" flushall >/dev/null
      done
      redis_equal_precision
    } | tee "$out/redis.txt" &
    wait $!
    stop_all_redis
    awk -f bench/report/rounds_csv.awk "$out/redis.txt" >>"$csv"
  else
    echo "redis: skipped (bench_redis needs hiredis; scripts/deps.sh bench" \
      "installs libhiredis-dev)" | tee "$out/redis.txt"
  fi
fi

# 3e. The PostgreSQL backend beside graphile-worker and pg-boss
# (scripts/bench_pg.sh: its own server on 127.0.0.1, synchronous_commit
# on; the peers installed by npm ci into build/bench/pg-peers, kept
# between runs): scheduling rates, the server's CPU per fired timer and
# p99 lateness at 2,000/s, bytes per pending timer. Short here, one run
# (PG_REPS and the other PG_* of the environment override it); its rows
# go to results.csv and its
# targets to the summary (bench/report/pg_summary.awk).
if has pg; then
  stage "PostgreSQL backend beside graphile-worker and pg-boss"
  if [ -x "$build/bench/bench_pg" ]; then
    PG_OUT=$out/pg_lines.txt PG_RATE_S=${PG_RATE_S:-0.25} \
      PG_FIRE_S=${PG_FIRE_S:-1} PG_DRAIN_MS=${PG_DRAIN_MS:-1500} \
      PG_SIZE_N=${PG_SIZE_N:-2000} PG_POLL10=${PG_POLL10:-0} \
      scripts/bench_pg.sh "$build" "${PG_REPS:-1}" | tee "$out/pg.txt" &
    wait $!
    awk -v csv=1 -f bench/report/pg_summary.awk "$out/pg_lines.txt" >>"$csv"
  else
    echo "pg: skipped (bench_pg needs libpq; scripts/deps.sh bench" \
      "installs libpq-dev)" | tee "$out/pg.txt"
  fi
fi

# 4. Instruction and cache-miss counts: the same code paths under callgrind,
# one run each (wall time on a shared machine is noisy; these are not).
if ((instr)); then
  stage "callgrind counts"
  if command -v valgrind >/dev/null; then
    cg=$out/callgrind
    mkdir -p "$cg"
    cgrun() {
      local tag=$1
      shift
      # Explicit caches: a VM's cpuid may report nonsense (here a 320 MB
      # direct-mapped L3). LL is simulated as the 32 MiB, 16-way L3.
      valgrind --tool=callgrind --collect-atstart=no --cache-sim=yes \
        --I1=32768,8,64 --D1=32768,8,64 --LL=33554432,16,64 \
        --callgrind-out-file="$cg/$tag.out" "$build/bench/bench_core" \
        --callgrind 1 --cap-ms 100000000 "$@" 2>>"$cg/valgrind.log" |
        grep '^callgrind ' >>"$cg/ops.txt"
    }
    # All engines at 1e5; the twheel hierarchy and the heap also at 1e6
    # (the peers' expiry at 1e6 would take many minutes under valgrind).
    cgrun e5 --n 100000 --churn-steps 100000 \
      --workloads add,add_rand,cancel,cancel_rand,churn,expire_1024,expire_jump,idle
    cgrun e6 --n 1000000 --churn-steps 1000000 --engines twheel,heap \
      --workloads add,add_rand,cancel,cancel_rand,churn,expire_1,expire_jump
    {
      echo "n,workload,engine,ops,Ir_per_op,D1_miss_per_op,LL_miss_per_op"
      awk -f bench/report/callgrind.awk "$cg/ops.txt" "$cg"/*.out.* |
        sort -t, -k1,1n -k2,2 -k3,3
    } >"$out/instr.csv"
    echo "== callgrind: per operation (Ir = instructions; D1/LL = simulated" \
      "L1-data and last-level cache misses)"
    awk -F, '{ printf "%-8s %-12s %-13s %9s %10s %8s %8s\n", $1, $2, $3, $4, $5, $6, $7 }' \
      "$out/instr.csv" | tee "$out/instr.txt"
  else
    echo "instr: skipped (no valgrind)"
  fi
fi

# 5. Summary and plot.
stage "summary and plot"
awk -F, -f bench/report/summary.awk -v loads="$out/loads.txt" "$csv" |
  tee "$out/summary.txt"
if [ -s "$out/pg_lines.txt" ]; then # the PostgreSQL round's own targets
  awk -f bench/report/pg_summary.awk "$out/pg_lines.txt" | tee -a "$out/summary.txt"
fi
plot="plot: skipped (no gnuplot)"
if command -v gnuplot >/dev/null; then
  sizes=$(awk -F, 'NR > 1 && $2 !~ /^(svc|dur|redis|dev|bs|dram|pg)_/ { print $1 }' "$csv" | sort -n | uniq)
  # A round not in the CSV leaves its panel empty.
  hv() { grep -q "^[0-9]*,$1" "$csv" && echo 1 || echo 0; }
  have="have_core=$(hv '[a-z]*,twheel,'); have_svc=$(hv svc_); have_dur=$(hv dur_); have_redis=$(hv redis_)"
  [ -n "$sizes" ] || sizes=1000
  gnuplot -e "csv='$csv'; out='$out/bench.png'; nmin=$(echo "$sizes" | head -1); nmax=$(echo "$sizes" | tail -1); $have" \
    bench/report/plot.gp && plot="plot:    $out/bench.png"
fi
echo
echo "done in $((SECONDS - t_start)) s ($((SECONDS - t_script)) s with the" \
  "installs and the build; budget ${budget} s). Results in $out:"
echo "summary: $out/summary.txt (each target MET, MISSED or NOT RUN)"
echo "$plot"
echo "data:    $csv"
