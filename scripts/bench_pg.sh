#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The PostgreSQL round: twheel's PostgreSQL backend beside graphile-worker
# and pg-boss (bench/peers/pg, the versions its package-lock.json pins),
# side by side in one run on one PostgreSQL server that this script starts
# (initdb under BUILD, 127.0.0.1 at a free port, fsync and
# synchronous_commit on, always stopped):
#   rates   timers scheduled per second, 1 and 16 connections, 1 and 32 a
#           transaction, due in an hour: twheel through SQL from libpq
#           (twheel-sql: twheel.schedule) and through its C API
#           (twheel-api: tw_durable_schedule / _schedule_many), their
#           floor at 32 a transaction (floor: the same rows in one plain
#           multi-row INSERT into a bare table with a primary key on
#           (ns, key) and an index on (ns, due, key), from the same client),
#           graphile-worker through its SQL functions from the same C
#           client (gw-sql: add_job / add_jobs) and through its Node API
#           (gw-node: addJob / addJobs), pg-boss through its Node API
#           (boss-node: send / insert);
#   fire    2,000 timers a second scheduled (32 a transaction) each due
#           0.5 s later and fired by the same process: the server's CPU
#           per fired timer (all its processes, from /proc) and the
#           callbacks' p99 lateness; twheel (a handle), graphile-worker
#           (run(), concurrency 10, its default pollInterval 2,000 ms;
#           gw-poll10: pollInterval 10 ms), pg-boss (work(), its least
#           polling interval 0.5 s, batchSize 2000);
#   sizes   rows and bytes (pg_total_relation_size of every table of the
#           system's schema) that N pending timers add, per timer;
#   floor   the server's CPU per timer of the three statements a fired
#           timer needs at the least, alone, from pgbench on the same
#           server: 32 rows in one INSERT (its commit synchronous), a
#           claim UPDATE of R of them (FOR UPDATE SKIP LOCKED, lease,
#           attempt, version; synchronous) and a DELETE of R by key
#           (synchronous_commit off), for R = 32, 11 and 4 rows a claim
#           (a claim every 16, 5.5 and 2 ms at 2,000 timers a second).
# Every row runs REPS times (default 3), the systems in a rotating order;
# bench/report/pg_summary.awk prints the medians and the targets.
#
# Usage: scripts/bench_pg.sh [BUILD [REPS]]   (BUILD: a Release build tree
#   with bench/bench_pg; default build/bench, built here if missing)
# Environment:
#   PG_LONG=1      a longer standalone run: 3 s per rate cell, 10 s of
#                  firing, 50,000 pending timers (default: 0.5 s, 2 s,
#                  5,000: about 60 s in all on 2 cores)
#   PG_RATE_S, PG_FIRE_S, PG_SIZE_N   each of those alone; PG_DRAIN_MS how
#                  long a fire run waits past the last due time (3,000;
#                  PG_LONG: 10,000)
#   PG_ONLY        some of rates,fire,sizes,floor (default all four)
#   PG_POLL10=0    no gw-poll10 row (graphile-worker at a 10 ms poll)
#   PG_FIRE_REPS   runs of the fire rows (default REPS)
#   PG_FLOOR_TX    pgbench transactions (of 32 timers) a floor row (300)
#   PG_WAITS=1     after the rate rows, twheel-sql and floor at 1x32 and
#                  16x32 once more, each while pg_stat_activity is sampled
#                  every 10 ms: pgwait lines, the backends' wait events
#                  (CPU: running), counted (a diagnosis of the 16x32 rows)
#   PG_STATEMENTS=1  the server with pg_stat_statements: after each fire
#                  row, its statements (calls, execution ms, rows, WAL
#                  bytes) and the WAL and commits of the row, as pgstmt
#                  and pgwal lines (a diagnosis: where the CPU goes)
#   PG_RATE_DUE_MS how far ahead the rate rows' timers are due (default
#                  an hour; 1000: due soon, so each schedule notifies)
#   PG_FIRE_RATE   timers a second in the fire rows (default 2000; the
#                  summary's targets are for 2,000)
#   PG_EXECUTORS   twheel's cfg.executor_threads in the fire rows
#                  (default 0: callbacks on the handle's own thread)
#   PG_PEERS_DIR   where the peers are installed (default BUILD/pg-peers;
#                  npm ci runs there when its lock file differs, with its
#                  npm cache inside it); without the npm registry and no
#                  earlier install, the peers' rows are skipped and said so
# Output: the lines of bench_pg and peer.js (pgrate, pgfire, pgsize,
# pgfloor, pgload: the load average), kept in PG_OUT (default BUILD/pg.txt), then
# the summary.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
build=$(realpath -m "${1:-$root/build/bench}") # absolute: the server's socket directory is under it
reps=${2:-3}
long=${PG_LONG:-0}
rate_s=${PG_RATE_S:-$( ((long)) && echo 3 || echo 0.5)}
fire_s=${PG_FIRE_S:-$( ((long)) && echo 10 || echo 2)}
size_n=${PG_SIZE_N:-$( ((long)) && echo 50000 || echo 5000)}
fire_rate=${PG_FIRE_RATE:-2000}
drain_ms=${PG_DRAIN_MS:-$( ((long)) && echo 10000 || echo 3000)}
cells="1x1 1x32 16x1 16x32"
pgout=${PG_OUT:-$build/pg.txt}

if [ ! -x "$build/bench/bench_pg" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DTWHEEL_BUILD_TESTS=OFF -DTWHEEL_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$build" --target bench_pg >/dev/null ||
    { echo "bench_pg: build failed (needs libpq-dev: scripts/deps.sh bench)" >&2; exit 1; }
fi
bench=$build/bench/bench_pg

# --- the peers: npm ci into a directory of the build, kept between runs --
peers=${PG_PEERS_DIR:-$build/pg-peers}
have_peers=0
install_peers() {
  mkdir -p "$peers"
  if [ -d "$peers/node_modules" ] &&
    cmp -s bench/peers/pg/package-lock.json "$peers/package-lock.json"; then
    return 0
  fi
  command -v npm >/dev/null || { echo "no npm (scripts/deps.sh bench)"; return 1; }
  cp bench/peers/pg/package.json bench/peers/pg/package-lock.json "$peers/"
  rm -rf "$peers/node_modules"
  if ! (cd "$peers" && npm_config_cache=$peers/.npm-cache timeout 300 \
    npm ci --no-audit --no-fund --loglevel=error --fetch-retries=1 \
    --fetch-timeout=20000 >"$peers/npm.log" 2>&1); then
    rm -f "$peers/package-lock.json"
    echo "npm ci failed (is the npm registry reachable? $peers/npm.log):" \
      "$(tail -n 3 "$peers/npm.log" | tr '\n' ' ')"
    return 1
  fi
}
if msg=$(install_peers); then
  have_peers=1
  cp bench/peers/pg/peer.js "$peers/"
else
  echo "pg peers: skipped, graphile-worker and pg-boss not installed: $msg" >&2
fi

# --- the server ---------------------------------------------------------
bindir=
for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -Vr) \
  "$(pg_config --bindir 2>/dev/null || true)"; do
  if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then
    bindir=$d
    break
  fi
done
[ -n "$bindir" ] || { echo "bench_pg: no PostgreSQL server (scripts/deps.sh bench)" >&2; exit 1; }
work=$build/pg-work
as=()
if [ "$(id -u)" = 0 ]; then as=(runuser -u postgres --); fi
stop_pg() {
  if [ -f "$work/data/postmaster.pid" ]; then
    "${as[@]}" "$bindir/pg_ctl" -D "$work/data" -m fast -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap stop_pg EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
stop_pg
mkdir -p "$work"
((${#as[@]})) && chown postgres "$work"
# initdb once into a template under BUILD, copied for each run.
tpl=$build/pg-template-$("$bindir/postgres" -V | tr -c 'A-Za-z0-9.\n' _)
if [ ! -f "$tpl/PG_VERSION" ]; then
  rm -rf "$tpl.part"
  mkdir -p "$tpl.part"
  ((${#as[@]})) && chown postgres "$tpl.part"
  "${as[@]}" "$bindir/initdb" -D "$tpl.part/data" -U bench --auth=trust \
    -E UTF8 --locale=C >"$work/initdb.log" 2>&1 ||
    { cat "$work/initdb.log" >&2; exit 1; }
  mv -T "$tpl.part/data" "$tpl"
  rm -rf "$tpl.part"
fi
"${as[@]}" cp -a "$tpl" "$work/data"
port=
for _ in 1 2 3 4 5; do
  p=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  if "${as[@]}" "$bindir/pg_ctl" -D "$work/data" -l "$work/log" -w -t 60 \
    -o "-p $p -c listen_addresses=127.0.0.1 -c unix_socket_directories=$work -c fsync=on -c synchronous_commit=on -c max_connections=100${PG_STATEMENTS:+ -c shared_preload_libraries=pg_stat_statements}" \
    start >/dev/null 2>&1; then
    port=$p
    break
  fi
done
[ -n "$port" ] || { echo "bench_pg: the server did not start" >&2; tail "$work/log" >&2; exit 1; }
url="host=127.0.0.1 port=$port user=bench dbname=postgres"
nurl="postgresql://bench@127.0.0.1:$port/postgres"
pm=$(head -1 "$work/data/postmaster.pid")
psql=("$bindir/psql" -X -q -At -d "$url")
pgserver="pgserver version=$("$bindir/postgres" -V | awk '{print $3}') port=$port \
synchronous_commit=$("${psql[@]}" -c 'show synchronous_commit') \
fsync=$("${psql[@]}" -c 'show fsync')"

# The schemas, installed once before anything is measured (graphile-worker
# and pg-boss install theirs when they first start: one short rate cell).
"$bench" setup "$url"
if ((have_peers)); then
  for s in gw boss; do
    node "$peers/peer.js" rate "$s" "$nurl" 0.05 1x1 >/dev/null ||
      { echo "pg peers: $s did not start; its rows are skipped" >&2; have_peers=0; }
  done
fi
# The diagnosis row twheel-sql-nonotify: twheel.schedule as the database
# has it, without its pg_notify() call, as twb.schedule_nn and twb.schedule_many_nn (a NOTIFY holds
# a lock of the whole server from before a transaction's commit record
# until the commit's WAL flush is done, so commits that notify wait for
# each other's fsyncs one by one).
nonotify=0
if "${psql[@]}" -c "CREATE SCHEMA IF NOT EXISTS twb" -c "DO \$\$ DECLARE
    f text;
    n text[] := '{schedule,schedule_many}';
    a text[] := '{\"(text, bytea, bigint, bytea)\",\"(text, bytea[], bigint[], bytea[])\"}';
  BEGIN
    FOR i IN 1 .. 2 LOOP
      f := pg_get_functiondef(('twheel.' || n[i] || a[i])::regprocedure);
      IF position('pg_notify(' IN f) = 0 THEN RAISE 'no pg_notify'; END IF;
      f := regexp_replace(f, 'PERFORM pg_notify\([^;]*\);', '');
      f := replace(f, 'twheel.' || n[i] || '(', 'twb.' || n[i] || '_nn(');
      EXECUTE f;
    END LOOP;
  END \$\$" >/dev/null 2>&1; then
  nonotify=1
fi
# The floor of the rate rows (bench_pg rate floor): the same rows in one
# plain INSERT into a bare table with only what twheel.timers needs to be
# safe and claimable: a primary key on (ns, key), an index on (ns, due,
# key). twb.waits(N, MS): N samples MS apart of what the client backends
# doing a statement wait for (pg_stat_activity), counted (PG_WAITS=1).
"${psql[@]}" -c "CREATE SCHEMA IF NOT EXISTS twb" -c "CREATE TABLE twb.floor (
    ns text NOT NULL, key bytea NOT NULL, due bigint NOT NULL,
    payload bytea NOT NULL, PRIMARY KEY (ns, key));
  CREATE INDEX floor_due ON twb.floor (ns, due, key);
  CREATE FUNCTION twb.waits(n int, ms int) RETURNS TABLE (ev text, c bigint)
  LANGUAGE plpgsql AS \$\$ DECLARE a text[] := '{}'; BEGIN
    FOR i IN 1 .. n LOOP
      PERFORM pg_stat_clear_snapshot();
      a := a || ARRAY(SELECT coalesce(wait_event_type || ':' || wait_event,
        'CPU') FROM pg_stat_activity WHERE backend_type = 'client backend'
        AND state = 'active' AND pid <> pg_backend_pid());
      PERFORM pg_sleep(ms / 1000.0);
    END LOOP;
    RETURN QUERY SELECT e, count(*) FROM unnest(a) e GROUP BY e ORDER BY 2 DESC;
  END \$\$" >/dev/null
# The tables each system's pending timers live in, emptied between runs.
empty() {
  local q="TRUNCATE twheel.timers, twheel.dead, twb.floor;"
  ((have_peers)) && q+=" TRUNCATE graphile_worker._private_jobs,
    graphile_worker._private_job_queues CASCADE; TRUNCATE pgboss.job;"
  "${psql[@]}" -c "$q" -c CHECKPOINT >/dev/null
}
# The server's load average beside each set of rows, and the seconds since
# the script began.
load() { echo "pgload at=$1 load=$(cut -d' ' -f1 /proc/loadavg) t=$SECONDS"; }

rates() { # SYSTEM
  case $1 in
    twheel-sql | twheel-api | gw-sql) "$bench" rate "$1" "$url" "$rate_s" $cells ;;
    twheel-sql-nonotify) "$bench" rate "$1" "$url" "$rate_s" 1x1 16x1 16x32 ;;
    floor) "$bench" rate "$1" "$url" "$rate_s" 1x32 16x32 ;;
    gw-node) node "$peers/peer.js" rate gw "$nurl" "$rate_s" $cells ;;
    boss-node) node "$peers/peer.js" rate boss "$nurl" "$rate_s" $cells ;;
  esac
  empty
}
# PG_WAITS=1: what the backends wait for while SYSTEM schedules at CELL
# (a run of its own, not counted in the rates): pgwait lines, one an event,
# n the samples (every 10 ms) that saw a backend wait there.
waits() { # SYSTEM CELL
  local n
  n=$(awk -v s="$rate_s" 'BEGIN { n = int(s * 60); print n < 5 ? 5 : n }')
  "$bench" rate "$1" "$url" "$rate_s" "$2" | sed 's/^pgrate /pgwaitrate /' &
  sleep 0.3 # its connections made
  "${psql[@]}" -c "SELECT 'pgwait sys=$1 cell=$2 event=' || ev || ' n=' || c
    FROM twb.waits($n, 10)"
  wait $!
  empty
}
# After a fire row with PG_STATEMENTS=1: its statements, WAL, commits.
stmt_reset() {
  [ -n "${PG_STATEMENTS:-}" ] || return 0
  "${psql[@]}" -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" \
    -c "SELECT pg_stat_statements_reset(), pg_stat_reset_shared('wal')" >/dev/null
  commits0=$("${psql[@]}" -c "SELECT xact_commit FROM pg_stat_database WHERE datname = 'postgres'")
}
stmt_dump() { # SYSTEM
  [ -n "${PG_STATEMENTS:-}" ] || return 0
  sleep 1 # the backends' statistics are flushed at most every second
  "${psql[@]}" -F ' ' -c "SELECT 'pgstmt sys=$1 calls=' || calls || ' ms='
      || round(total_exec_time::numeric, 1) || ' rows=' || rows
      || ' wal_bytes=' || wal_bytes || ' query=' || left(regexp_replace(query,
      '\s+', '_', 'g'), 70) FROM pg_stat_statements WHERE toplevel
      AND query !~* 'pg_stat|xact_commit|CREATE EXTENSION'
      ORDER BY total_exec_time DESC LIMIT 6"
  "${psql[@]}" -c "SELECT 'pgwal sys=$1 records=' || wal_records || ' bytes='
      || wal_bytes || ' syncs=' || wal_sync || ' commits=' || (SELECT
      xact_commit FROM pg_stat_database WHERE datname = 'postgres')
      - $commits0 FROM pg_stat_wal"
}
fire() { # SYSTEM
  stmt_reset
  case $1 in
    twheel) "$bench" fire "$url" "$pm" "$fire_rate" "$fire_s" 500 "$drain_ms" ;;
    gw) node "$peers/peer.js" fire gw "$nurl" "$pm" "$fire_rate" "$fire_s" 500 "$drain_ms" ;;
    gw-poll10) POLL_MS=10 node "$peers/peer.js" fire gw "$nurl" "$pm" "$fire_rate" "$fire_s" 500 "$drain_ms" ;;
    boss) node "$peers/peer.js" fire boss "$nurl" "$pm" "$fire_rate" "$fire_s" 500 "$drain_ms" ;;
  esac
  stmt_dump "$1"
  empty
}
# The server's CPU so far in clock ticks: the postmaster's own and its
# reaped children's, and every live child's (a process gone between the
# listing and its read is left out: cat's status is not the function's).
db_ticks() {
  { cat /proc/[0-9]*/stat 2>/dev/null || true; } | awk -v pm="$pm" '{ pid = $1
    sub(/^.*\) /, "")
    if (pid == pm) t += $12 + $13 + $14 + $15; else if ($2 == pm) t += $12 + $13 }
    END { print t + 0 }'
}
# pgfloor R: the pgbench script of 32 timers, R rows a claim.
floor_script() {
  local r=$1 k lo hi
  echo '\set p random(1, 1000000000)'
  echo "INSERT INTO twheel.timers (ns, key, due, payload) SELECT 'floor',
    convert_to(:p || '.' || i, 'UTF8'), 0, convert_to('{\"d\": 0, \"i\": '
    || i || '}', 'UTF8') FROM generate_series(1, 32) i;"
  for ((k = 0; k * r < 32; k++)); do
    echo "WITH c AS (SELECT ctid FROM twheel.timers WHERE ns = 'floor'
      AND greatest(due, 0) <= 1 AND (lease_until IS NULL OR lease_until <
      clock_timestamp()) ORDER BY greatest(due, 0), key LIMIT $r FOR UPDATE
      SKIP LOCKED) UPDATE twheel.timers t SET attempts = t.attempts + 1,
      ver = nextval('twheel.ver_seq'), owner = 'floor', lease_until =
      clock_timestamp() + interval '30 s' WHERE t.ctid = ANY (ARRAY(SELECT
      ctid FROM c)) RETURNING t.key, t.due, t.payload, t.attempts, t.ver;"
  done
  for ((k = 0; k * r < 32; k++)); do
    lo=$((k * r + 1)) hi=$(((k + 1) * r < 32 ? (k + 1) * r : 32))
    echo "BEGIN;"
    echo "SET LOCAL synchronous_commit = off;"
    echo "DELETE FROM twheel.timers WHERE ns = 'floor' AND key = ANY (ARRAY(
      SELECT convert_to(:p || '.' || i, 'UTF8') FROM generate_series($lo, $hi) i));"
    echo "COMMIT;"
  done
}
floor() { # R: the server's CPU per timer of floor_script R
  local f=$work/floor$1.sql n=${PG_FLOOR_TX:-300} t0 t1
  floor_script "$1" >"$f"
  t0=$(db_ticks)
  "$bindir/pgbench" -n -M prepared -f "$f" -t "$n" -h 127.0.0.1 -p "$port" \
    -U bench postgres >/dev/null 2>&1 || { echo "pgbench failed" >&2; return; }
  t1=$(db_ticks)
  awk -v r="$1" -v n="$n" -v d=$((t1 - t0)) -v hz="$(getconf CLK_TCK)" \
    'BEGIN { printf "pgfloor rows_per_claim=%d timers=%d db_cpu_s=%.2f db_us_per_timer=%.1f\n",
      r, 32 * n, d / hz, d / hz * 1e6 / (32 * n) }'
  empty
}
# pgsize SYSTEM SCHEMA: rows and bytes of every table of SCHEMA.
size_of() {
  "${psql[@]}" -F ' ' -c "SELECT coalesce(sum((xpath('/row/c/text()',
      query_to_xml(format('SELECT count(*) AS c FROM %I.%I', n.nspname,
      c.relname), false, true, '')))[1]::text::bigint), 0),
      coalesce(sum(pg_total_relation_size(c.oid)), 0)
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = '$1' AND c.relkind = 'r'"
}
sizes() { # SYSTEM SCHEMA LOADER...: what size_n pending timers add
  local sys=$1 schema=$2 r0 b0 r1 b1
  shift 2
  empty
  read -r r0 b0 <<<"$(size_of "$schema")"
  "$@" >/dev/null
  "${psql[@]}" -c "CHECKPOINT" >/dev/null
  read -r r1 b1 <<<"$(size_of "$schema")"
  awk -v s="$sys" -v n="$size_n" -v r0="$r0" -v b0="$b0" -v r1="$r1" \
    -v b1="$b1" 'BEGIN { printf "pgsize sys=%s pending=%d rows=%d bytes=%d rows_per_timer=%.2f bytes_per_timer=%.1f\n",
      s, n, r1 - r0, b1 - b0, (r1 - r0) / n, (b1 - b0) / n }'
  empty
}

only() { [[ ",${PG_ONLY:-rates,fire,sizes,floor}," == *",$1,"* ]]; }
rate_sys=(twheel-sql twheel-api gw-sql floor)
((nonotify)) && rate_sys+=(twheel-sql-nonotify)
fire_sys=(twheel)
if ((have_peers)); then
  rate_sys+=(gw-node boss-node)
  fire_sys+=(gw boss)
  ((${PG_POLL10:-1})) && fire_sys+=(gw-poll10)
fi
{
  echo "$pgserver"
  for ((r = 1; r <= reps; r++)); do
    only rates || break
    load "rates/$r"
    n=${#rate_sys[@]}
    for ((i = 0; i < n; i++)); do rates "${rate_sys[(i + r - 1) % n]}"; done
  done
  if [ -n "${PG_WAITS:-}" ] && only rates; then
    load waits
    for sys in twheel-sql floor; do for c in 1x32 16x32; do waits $sys $c; done; done
  fi
  for ((r = 1; r <= ${PG_FIRE_REPS:-$reps}; r++)); do
    only fire || break
    load "fire/$r"
    n=${#fire_sys[@]}
    for ((i = 0; i < n; i++)); do fire "${fire_sys[(i + r - 1) % n]}"; done
  done
  only sizes && load sizes
  only sizes && sizes twheel twheel "$bench" load "$url" "$size_n"
  if ((have_peers)) && only sizes; then
    sizes gw graphile_worker node "$peers/peer.js" load gw "$nurl" "$size_n"
    sizes boss pgboss node "$peers/peer.js" load boss "$nurl" "$size_n"
  fi
  only floor && load floor
  for ((r = 1; r <= reps; r++)); do
    only floor || break
    for rows in 32 11 4; do floor "$rows"; done
  done
  load end
} | tee "$pgout" &
wait $! # (in the background so that a signal stops the server at once)
stop_pg
awk -f bench/report/pg_summary.awk "$pgout"
