#!/usr/bin/env bash
# The main job: builds twheel in Release (build/bench) and runs the benchmark
# suite: the core wheel against a binary heap, libuv and libevent
# (bench_core), the timer service (bench_service) against Netty's
# HashedWheelTimer and Java's ScheduledThreadPoolExecutor (bench/java).
# Prints the tables and writes build/bench/results/: results.csv (every
# figure), *.txt (each program's own table), bench.png (gnuplot), machine.txt.
# Installs the Debian packages it needs first (scripts/deps.sh bench).
#
# Usage: scripts/bench.sh [--full] [--reps R] [--no-java]
#   default  quick mode (a minute or two): 1e3 and 1e5 pending timers with
#            every workload, 1e6 with add/cancel/churn/expiry/memory; the
#            service and Java peers with 200,000 tasks
#   --full   1e3, 1e5, 1e6 and 1e7 pending timers, every workload; service
#            and Java peers with 1,000,000 tasks (tens of minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
full=0
reps=5
java=1
while (($#)); do
  case $1 in
    --full) full=1 ;;
    --reps) reps=$2; shift ;;
    --no-java) java=0 ;;
    *) echo "usage: $0 [--full] [--reps R] [--no-java]" >&2; exit 2 ;;
  esac
  shift
done

scripts/deps.sh bench
build=$root/build/bench
out=$build/results
mkdir -p "$out"
rm -f "$out"/results.csv "$out"/*.txt "$out"/bench.png
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DTWHEEL_BUILD_TESTS=OFF -DTWHEEL_BUILD_EXAMPLES=OFF >"$build.log" 2>&1 ||
  { cat "$build.log"; exit 1; }
cmake --build "$build" -j2 --target bench_core bench_service
csv=$out/results.csv
t_start=$SECONDS

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores"
  echo "memory: $(free -g | awk '/^Mem:/ {print $2}') GiB"
  echo "kernel: $(uname -sr)"
  echo "compiler: $(cc --version | head -1)"
  echo "libuv: $(pkg-config --modversion libuv 2>/dev/null || echo none)"
  echo "libevent: $(pkg-config --modversion libevent 2>/dev/null || echo none)"
  echo "java: $(java -version 2>&1 | head -1 || echo none)"
  echo "netty: $(readlink -f /usr/share/java/netty-common.jar 2>/dev/null | sed 's/.*netty-common-//; s/\.jar$//')"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} >"$out/machine.txt"
cat "$out/machine.txt"

# 1. The core wheel and the C peers.
core=("$build/bench/bench_core" --reps "$reps" --csv "$csv")
if ((full)); then
  "${core[@]}" --n 1000,100000,1000000,10000000 --workloads all \
    --cap-ms 10000 | tee "$out/core.txt"
  svc_args=()
  tasks=1000000
else
  "${core[@]}" --n 1000,100000 --workloads all --cap-ms 1000 |
    tee "$out/core.txt"
  # At 1e6 the expiry runs of the peers take seconds each: the expiry
  # workloads run once for them (see the '~' mark) and the rest as usual.
  "${core[@]}" --n 1000000 --cap-ms 1000 \
    --workloads add,add_rand,cancel,cancel_rand,churn,expire_1,expire_jump,memory |
    tee -a "$out/core.txt"
  svc_args=(--quick)
  tasks=200000
fi

# 2. The service (its own program; best of its runs) ...
"$build/bench/bench_service" "${svc_args[@]}" | tee "$out/service.txt"
awk -v n="$tasks" -f bench/service_csv.awk "$out/service.txt" >>"$csv"

# 3. ... and its Java peers.
if ((java)) && command -v javac >/dev/null && command -v java >/dev/null &&
  [ -r /usr/share/java/netty-common.jar ]; then
  mkdir -p "$build/java"
  javac -d "$build/java" -cp /usr/share/java/netty-common.jar \
    bench/java/TimerBench.java
  java -Xms2g -Xmx2g -cp "$build/java:/usr/share/java/netty-common.jar" \
    TimerBench --tasks "$tasks" --reps "$reps" --csv "$csv" |
    tee "$out/java.txt"
else
  echo "java: skipped (needs javac, java and /usr/share/java/netty-common.jar;" \
    "scripts/deps.sh bench installs them)" | tee "$out/java.txt"
fi

# 4. Summary and plot.
echo
awk -F, -f bench/summary.awk "$csv" | tee "$out/summary.txt"
if command -v gnuplot >/dev/null; then
  gnuplot -e "csv='$csv'; out='$out/bench.png'" bench/plot.gp &&
    echo "plot: $out/bench.png"
else
  echo "plot: skipped (no gnuplot)"
fi
echo "results: $out ($((SECONDS - t_start)) s)"
