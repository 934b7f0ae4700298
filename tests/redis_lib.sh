# SPDX-License-Identifier: MIT
# Sourced by tests/redis_test.sh and tests/redis_prod.sh: skip (exit 77)
# without redis-server; a temporary directory $tmp; $pids, every server
# started (and those a test's own commands started, one pid a line in
# $tmp/pids), killed with -9 and the directory removed on exit, also on
# failure; pick_ports N.
command -v redis-server >/dev/null || { echo "redis-server missing: skipped"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/twredis.XXXXXX")
pids=()
cleanup() {
  local p
  if [ -f "$tmp/pids" ]; then
    while read -r p; do pids+=("$p"); done <"$tmp/pids"
  fi
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# A port that is free, as is port+10000 (the cluster bus).
port_free() { ! (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null; }
pick_ports() { # N: N consecutive free ports (and their bus ports)
  local n=$1 base i ok
  for _ in $(seq 50); do
    # Below the ephemeral range (32768+), bus ports (port + 10000) too.
    base=$((10000 + RANDOM % 12000))
    ok=1
    for ((i = 0; i < n; i++)); do
      port_free $((base + i)) && port_free $((base + i + 10000)) || { ok=0; break; }
    done
    if ((ok)); then echo "$base"; return; fi
  done
  echo "no free ports" >&2
  return 1
}
