#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs one scenario of test_durable_redis against real redis-server
# processes that this script starts on 127.0.0.1 (random free ports, a
# temporary directory) and always stops, also on failure.
# Usage: tests/redis_test.sh SCENARIO TEST_BINARY
#   semantics | econn | crash | many | garbage | gap | shards
#                                      one server
#   suite                              one server; TEST_BINARY is
#                                      test_durable_semantics
#   poison                             one server; test_durable_poison
#   combine | idle | chunk             one server; test_redis_calls
#   owner | owner-kill | owner-stop |  one server; TEST_BINARY is
#   owner-pause | owner-clock |        test_redis_owner
#   owner-graceful | owner-busy
#   owner-churn                        3 masters + 3 replicas;
#                                      test_redis_owner
#   owner-stall                        a 3-master cluster; test_redis_owner
#                                      stall, then stall-dead
#   share | share-kill | reshard |     a 3-master cluster
#   many-cluster | stall
#   failover                           3 masters + 3 replicas
# Exit 77 (skipped) when redis-server is not installed. TW_WRAP (e.g.
# "gdb -batch -ex run -ex bt --args") wraps the one-server runs.
set -euo pipefail
scenario=$1
bin=$2
. "$(dirname "$0")/redis_lib.sh"

# start PORT EXTRA...: start (or restart) a server with its own directory.
declare -A pid_of
start() {
  local port=$1
  shift
  mkdir -p "$tmp/$port"
  redis-server --port "$port" --bind 127.0.0.1 --dir "$tmp/$port" \
    --save '' --logfile "$tmp/$port/log" --protected-mode no "$@" \
    "${extra[@]}" &
  pid_of[$port]=$!
  pids+=($!)
  for _ in $(seq 200); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  echo "redis on $port did not start" >&2
  cat "$tmp/$port/log" >&2
  return 1
}

extra=()
cextra=()
cluster() { # MASTERS REPLICAS_PER_MASTER
  local m=$1 r=$2 n=$(($1 * ($2 + 1))) base i
  base=$(pick_ports "$n")
  extra=(--cluster-enabled yes --cluster-node-timeout 1000
    --cluster-config-file nodes.conf --appendonly yes "${cextra[@]}")
  local addrs=()
  for ((i = 0; i < n; i++)); do
    start $((base + i))
    addrs+=(127.0.0.1:$((base + i)))
  done
  redis-cli --cluster create "${addrs[@]}" --cluster-replicas "$r" \
    --cluster-yes >"$tmp/create.log" 2>&1 || { cat "$tmp/create.log"; return 1; }
  for _ in $(seq 200); do
    if redis-cli -p "$base" cluster info | grep -q cluster_state:ok &&
      [ "$(redis-cli -p "$base" cluster slots | grep -c .)" -gt 0 ]; then
      break
    fi
    sleep 0.05
  done
  # Every node must agree before the test starts.
  for ((i = 0; i < n; i++)); do
    until redis-cli -p $((base + i)) cluster info | grep -q cluster_state:ok; do
      sleep 0.05
    done
  done
  # Replicas must be in sync before WAIT can count them.
  if ((r > 0)); then
    for ((i = 0; i < n; i++)); do
      for _ in $(seq 400); do
        info=$(redis-cli -p $((base + i)) info replication)
        if grep -q role:slave <<<"$info"; then
          grep -q master_link_status:up <<<"$info" && break
        else
          grep -q "slave0:.*state=online" <<<"$info" && break
        fi
        sleep 0.05
      done
    done
  fi
  seeds=127.0.0.1:$base,127.0.0.1:$((base + 1))
  cbase=$base
}

case $scenario in
  semantics | econn | crash | many | garbage | gap | shards | suite | poison | \
    combine | idle | chunk)
    port=$(pick_ports 1)
    if [ "$scenario" = econn ] || [ "$scenario" = crash ]; then
      extra=(--appendonly yes --appendfsync always)
    fi
    start "$port"
    export TW_REDIS_STOP="kill -9 \$(cat $tmp/pid) && sleep 0.1"
    echo "${pid_of[$port]}" >"$tmp/pid"
    export TW_REDIS_KILL="$TW_REDIS_STOP"
    # START runs in the test's shell: it restarts the server with the same
    # directory and records the pid for cleanup in $tmp/pids.
    restart="redis-server --port $port --bind 127.0.0.1 --dir $tmp/$port"
    restart+=" --save '' --logfile $tmp/$port/log ${extra[*]}"
    export TW_REDIS_START="($restart & echo \$! >$tmp/pid; echo \$! >>$tmp/pids);
      for i in \$(seq 200); do redis-cli -p $port ping >/dev/null 2>&1 && exit 0; sleep 0.05; done; exit 1"
    ${TW_WRAP:-} "$bin" "$scenario" "127.0.0.1:$port"
    exit
    ;;
  owner | owner-kill | owner-stop | owner-pause | owner-clock | owner-graceful | \
    owner-busy)
    # Fenced shard ownership: node processes on one server.
    port=$(pick_ports 1)
    [ "$scenario" = owner-pause ] && extra=(--enable-debug-command yes)
    start "$port"
    mode=${scenario#owner-}
    if [ "$mode" = owner ] || [ "$mode" = pause ] || [ "$mode" = clock ] ||
      [ "$mode" = graceful ] || [ "$mode" = busy ]; then
      "$bin" "$mode" "127.0.0.1:$port"
    else
      mkdir -p "$tmp/nodes"
      "$bin" "$mode" "127.0.0.1:$port" "$tmp/nodes"
    fi
    ;;
  share | share-kill | reshard | many-cluster | stall | owner-stall)
    # stall: the healthy masters keep serving while one is stopped.
    [ "${scenario#owner-}" = stall ] &&
      cextra=(--cluster-require-full-coverage no)
    cluster 3 0
    case $scenario in
      stall) "$bin" stall "$seeds" ;;
      owner-stall)
        mkdir -p "$tmp/nodes"
        "$bin" stall "$seeds"
        "$bin" stall-dead "$seeds" "$tmp/nodes"
        ;;
      many-cluster) "$bin" many "$seeds" ;;
      share) "$bin" share "$seeds" 3 "${TW_REDIS_TIMERS:-100000}" 0 "$tmp" ;;
      share-kill) "$bin" share "$seeds" 3 20000 1 "$tmp" ;;
      reshard)
        from=$(redis-cli -p "$cbase" cluster myid)
        to=$(redis-cli -p $((cbase + 1)) cluster myid)
        export TW_REDIS_RESHARD="redis-cli --cluster reshard 127.0.0.1:$cbase \
          --cluster-from $from --cluster-to $to --cluster-slots 3000 \
          --cluster-yes --cluster-pipeline 50 >$tmp/reshard.log 2>&1 ||
          { cat $tmp/reshard.log; exit 1; }"
        "$bin" reshard "$seeds"
        ;;
    esac
    ;;
  failover | owner-churn)
    cluster 3 1
    # The master of slot 0's shard range: kill the first master.
    victim=$(redis-cli -p "$cbase" cluster nodes | awk '/master/ && !/fail/ {print $2}' |
      head -1 | sed 's/@.*//; s/.*://')
    export TW_REDIS_KILL="kill -9 ${pid_of[$victim]}"
    seeds=127.0.0.1:$cbase,127.0.0.1:$((cbase + 1)),127.0.0.1:$((cbase + 2)),127.0.0.1:$((cbase + 3))
    "$bin" "${scenario#owner-}" "$seeds"
    ;;
  *)
    echo "unknown scenario $scenario" >&2
    exit 2
    ;;
esac
