#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs a command against a PostgreSQL server that this script makes and
# starts itself: initdb into a temporary directory, the server on
# 127.0.0.1 at a free port (and a Unix socket in the same directory),
# always stopped (-m immediate) and removed, also on failure. The command
# finds the server in the environment:
#   TW_PG_URL   a libpq connection string (trust authentication, user twheel)
#   TW_PG_BIN   the server's bin directory (psql, pg_ctl, ...)
#   TW_PG_DATA  its data directory, TW_PG_PORT its port
#   TW_PG_RESTART  a shell command: the server killed (-m immediate) and
#                  started again on the same port
# With TW_PG_STANDBY=1 in the environment, a streaming standby of it as
# well (pg_basebackup -R, asynchronous until the command sets
# synchronous_standby_names on the primary), stopped the same way:
#   TW_PG_STANDBY_URL   the standby (read-only until promoted)
#   TW_PG_FAILOVER_URL  both servers, primary first, with
#                       target_session_attrs=read-write
#   TW_PG_STOP     a shell command: the primary killed (-m immediate)
#   TW_PG_PROMOTE  a shell command: the standby promoted (waits for it)
# Usage: tests/pg_test.sh COMMAND [ARGS...]
# Exit 77 (skipped) when no PostgreSQL server binaries are installed
# (Debian: postgresql, from scripts/deps.sh). TW_PG_BINDIR picks them.
set -euo pipefail

bindir=
for d in ${TW_PG_BINDIR:-} $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -Vr) \
  "$(pg_config --bindir 2>/dev/null || true)" /usr/bin /usr/local/pgsql/bin; do
  if [ -n "$d" ] && [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && [ -x "$d/postgres" ]; then
    bindir=$d
    break
  fi
done
if [ -z "$bindir" ]; then
  echo "pg_test: no PostgreSQL server binaries (initdb, pg_ctl): skipped" >&2
  exit 77
fi

tmp=$(mktemp -d /tmp/twpg.XXXXXX)
# The server refuses to run as root: then it runs as an unprivileged user.
as=()
if [ "$(id -u)" = 0 ]; then
  user=postgres
  id "$user" >/dev/null 2>&1 || user=nobody
  chown "$user" "$tmp"
  as=(runuser -u "$user" --)
fi
cleanup() {
  for d in "$tmp/data" "$tmp/standby"; do
    [ ! -d "$d" ] || "${as[@]}" "$bindir/pg_ctl" -D "$d" -m immediate -w stop >/dev/null 2>&1 || true
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

# A random port below the kernel's ephemeral range (32768 and up), so no
# outgoing connection holds it; one that a server listens on already
# makes the start fail, and start_server tries another. (Starting a
# Python to ask the kernel for a free port took seconds on a loaded
# machine.)
free_port() {
  echo $((20000 + RANDOM % 12000))
}

# initdb once per user and server version into a template, copied for
# each run (initdb takes seconds, a copy a fraction of one). The template
# is made aside and renamed into place, so concurrent runs never see half
# of one.
tpl=${TMPDIR:-/tmp}/twpg-template-$(id -u)-$("$bindir/postgres" -V | tr -c 'A-Za-z0-9.\n' _)
if [ ! -f "$tpl/PG_VERSION" ]; then
  part=$(mktemp -d "${TMPDIR:-/tmp}/twpg-tpl.XXXXXX")
  [ ${#as[@]} = 0 ] || chown "$user" "$part"
  "${as[@]}" "$bindir/initdb" -D "$part/data" -U twheel --auth=trust \
    --no-sync -E UTF8 --locale=C >"$tmp/initdb.log" 2>&1 ||
    { cat "$tmp/initdb.log" >&2; rm -rf "$part"; exit 1; }
  mv -T "$part/data" "$tpl" 2>/dev/null || true
  rm -rf "$part"
fi
"${as[@]}" cp -a "$tpl" "$tmp/data"
# start_server DIR LOG: started on a free port ($port), else exit 1.
start_server() {
  local _
  for _ in 1 2 3 4 5 6 7 8; do
    port=$(free_port)
    if "${as[@]}" "$bindir/pg_ctl" -D "$1" -l "$2" -w -t 60 \
      -o "-p $port -c listen_addresses=127.0.0.1 -c unix_socket_directories=$tmp -c fsync=off -c max_connections=200" \
      start >/dev/null 2>&1; then
      return 0
    fi
  done
  echo "pg_test: the server did not start" >&2
  cat "$2" >&2 || true
  exit 1
}
start_server "$tmp/data" "$tmp/log"
export TW_PG_URL="host=127.0.0.1 port=$port user=twheel dbname=postgres"
export TW_PG_BIN=$bindir TW_PG_DATA=$tmp/data TW_PG_PORT=$port
# A crash of the server and its restart (pg_ctl keeps the start options).
export TW_PG_RESTART="${as[*]} $bindir/pg_ctl -D $tmp/data -l $tmp/log -m immediate -w -t 60 restart >/dev/null"
if [ -n "${TW_PG_STANDBY:-}" ]; then
  primary=$port
  # A copy streamed from the primary; -R writes standby.signal and
  # primary_conninfo. The primary's postgresql.auto.conf comes along, so
  # the command sets synchronous_standby_names on the primary only after.
  "${as[@]}" "$bindir/pg_basebackup" -h 127.0.0.1 -p "$primary" -U twheel \
    -D "$tmp/standby" -R -X stream -c fast --no-sync >"$tmp/basebackup.log" 2>&1 ||
    { echo "pg_test: pg_basebackup failed" >&2; cat "$tmp/basebackup.log" >&2; exit 1; }
  start_server "$tmp/standby" "$tmp/standby.log"
  export TW_PG_STANDBY_URL="host=127.0.0.1 port=$port user=twheel dbname=postgres"
  export TW_PG_FAILOVER_URL="host=127.0.0.1,127.0.0.1 port=$primary,$port user=twheel dbname=postgres target_session_attrs=read-write"
  export TW_PG_STOP="${as[*]} $bindir/pg_ctl -D $tmp/data -m immediate -w -t 60 stop >/dev/null"
  export TW_PG_PROMOTE="${as[*]} $bindir/pg_ctl -D $tmp/standby -w -t 60 promote >/dev/null"
  port=$primary
fi
set +e
"$@"
rc=$?
set -e
if [ "$rc" != 0 ] && [ "$rc" != 77 ]; then
  echo "pg_test: exit $rc; the server's log:" >&2
  tail -n 30 "$tmp/log" >&2 || true
  if [ -f "$tmp/standby.log" ]; then
    echo "pg_test: the standby's log:" >&2
    tail -n 30 "$tmp/standby.log" >&2 || true
  fi
fi
exit "$rc"
