#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The Redis backend against servers set up as in production, started by
# this script on 127.0.0.1 (random free ports, a temporary directory) and
# always stopped, also on failure.
# Usage: tests/redis_prod.sh SCENARIO TEST_REDIS_PROD [TEST_DURABLE_SEMANTICS
#        TEST_DURABLE_REDIS]
#   auth          one server: requirepass, ACL users (the minimal ACL of
#                 docs/guide/redis.md, one lacking a command, one lacking
#                 the namespace's keys, a wrong
#                 password), a Unix socket, /db and ?db=, bad addresses, a
#                 name that does not resolve, a closed port; no message
#                 shows a password; a WAIT is never the first command of a
#                 new connection (it would count none of the writes)
#   cluster-auth  3 masters with requirepass/masterauth; /db refused
#   tls           one server with tls-port and tls-auth-clients yes, with
#                 certificates made here: CA + client cert works; an
#                 untrusted CA, a wrong host name, no client cert and a
#                 plain port are refused, each with its reason
#   tls-cluster   3 masters, TLS only (tls-cluster yes), password: the
#                 backend-neutral suite (tests/durable_semantics.c), then
#                 slots resharded while timers flow (MOVED and ASK over
#                 TLS; test_durable_redis reshard)
#   sentinel      a master, a replica, three sentinels, passwords on both:
#                 timers flow, SENTINEL FAILOVER, nothing acknowledged lost
#                 with wait_replicas 1, calls resume on the new master
#   sentinel-load the same servers; TEST_DURABLE_SEMANTICS is
#                 test_redis_failover: timers scheduled and delivered
#                 throughout a SENTINEL FAILOVER and a kill -9 of the
#                 master; every acknowledged one delivered, the times
#                 printed
#   perm-lost     one server, an ACL user; TEST_DURABLE_SEMANTICS is
#                 test_redis_perm: commands the claims and completions
#                 use taken away after open, one at a time: the errors
#                 counted (stats.errors) and told (cfg.on_error) naming
#                 the command, and every timer delivered once it is back;
#                 the same for the ownership rounds' commands, and stats
#                 without ZCARD or ZCOUNT fail rather than read 0
# Exit 77 (skipped) without redis-server or openssl.
set -euo pipefail
scenario=$1
bin=$2
sem=${3:-}
dred=${4:-}
. "$(dirname "$0")/redis_lib.sh"

PW=pw-Secret-42  # the data nodes' password (must never be printed)
SPW=sentinel-Secret-7
cli=(redis-cli --no-auth-warning)

# serve NAME ARGS...: a redis-server in $tmp/NAME (wait_ping waits).
serve() {
  local name=$1
  shift
  mkdir -p "$tmp/$name"
  redis-server --bind 127.0.0.1 --dir "$tmp/$name" --save '' \
    --logfile "$tmp/$name/log" "$@" &
  pids+=($!)
}
wait_ping() { # redis-cli ARGS...
  for _ in $(seq 200); do
    "${cli[@]}" "$@" ping 2>/dev/null | grep -q PONG && return 0
    sleep 0.05
  done
  echo "server did not start: $*" >&2
  cat "$tmp"/*/log >&2 || true
  return 1
}

# cluster3 TLS SERVER_ARGS...: three masters with requirepass and
# masterauth, ports $base.. (TLS 1: TLS ports only; ccli then holds
# redis-cli's TLS options), joined and agreed.
ccli=()
cluster3() {
  local tls=$1 i p
  shift
  base=$(pick_ports 3)
  for i in 0 1 2; do
    p=(--port $((base + i)))
    ((tls)) && p=(--port 0 --tls-port $((base + i)))
    serve "c$i" "${p[@]}" --cluster-enabled yes --cluster-node-timeout 1000 \
      --cluster-config-file nodes.conf --requirepass "$PW" --masterauth "$PW" "$@"
  done
  for i in 0 1 2; do wait_ping -p $((base + i)) -a "$PW" "${ccli[@]}"; done
  "${cli[@]}" "${ccli[@]}" -a "$PW" --cluster create 127.0.0.1:$base \
    127.0.0.1:$((base + 1)) 127.0.0.1:$((base + 2)) --cluster-yes \
    >"$tmp/create.log" 2>&1 || { cat "$tmp/create.log"; exit 1; }
  for i in 0 1 2; do
    until "${cli[@]}" "${ccli[@]}" -p $((base + i)) -a "$PW" cluster info |
      grep -q cluster_state:ok; do
      sleep 0.05
    done
  done
}

expect() { # CODE KEY=VALUE...: one open, checked by the test program
  echo "== expect $*" | sed "s/$PW/***/g; s/$SPW/***/g"
  "$bin" open "$@" secret="$PW" secret="$SPW" secret=wrong-Pass-9
}

# The smallest ACL the backend needs (docs/guide/redis.md): its commands,
# the commands its scripts call, and its namespace's keys.
ACL_CMDS="+evalsha +eval +script|load +cluster|slots +wait +get +zmscore +zcard +zcount +hlen +hscan
  +ping +select +role
  +del +dump +hdel +hget +hmget +hset +set +time +type +zadd +zrange +zrangebyscore +zrangebylex +zrem +zscore"

# sentinels: a master $m and its replica $r (passwords), three sentinels
# on $base+2.. watching it as "twm", every one knowing the replica and
# the other two; $sents their addresses.
sentinels() {
  base=$(pick_ports 5)
  m=$base r=$((base + 1))
  for p in "$m" "$r"; do
    rep=()
    [ "$p" = "$r" ] && rep=(--replicaof 127.0.0.1 "$m")
    serve "n$p" --port "$p" --requirepass "$PW" --masterauth "$PW" "${rep[@]}"
    echo "${pids[-1]}" >"$tmp/pid.$p"
    wait_ping -p "$p" -a "$PW"
  done
  for _ in $(seq 200); do
    "${cli[@]}" -p "$r" -a "$PW" info replication | grep -q master_link_status:up && break
    sleep 0.05
  done
  for i in 2 3 4; do
    s=$((base + i))
    mkdir -p "$tmp/s$i"
    cat >"$tmp/s$i/sentinel.conf" <<CONF
port $s
bind 127.0.0.1
dir $tmp/s$i
logfile $tmp/s$i/log
requirepass $SPW
sentinel monitor twm 127.0.0.1 $m 2
sentinel auth-pass twm $PW
sentinel down-after-milliseconds twm 1000
sentinel failover-timeout twm 5000
sentinel sentinel-pass $SPW
CONF
    redis-server "$tmp/s$i/sentinel.conf" --sentinel &
    pids+=($!)
  done
  for i in 2 3 4; do
    wait_ping -p $((base + i)) -a "$SPW"
    # Each sentinel must know the replica and the other sentinels.
    for _ in $(seq 400); do
      info=$("${cli[@]}" -p $((base + i)) -a "$SPW" sentinel master twm)
      if grep -A1 -x num-slaves <<<"$info" | grep -qx 1 &&
        grep -A1 -x num-other-sentinels <<<"$info" | grep -qx 2; then
        break
      fi
      sleep 0.05
    done
  done
  sents=127.0.0.1:$((base + 2)),127.0.0.1:$((base + 3)),127.0.0.1:$((base + 4))
}

# failover_scripts: after sentinels, $tmp/failover.sh (SENTINEL FAILOVER)
# and $tmp/kill.sh (kill -9 of the master; once another is named, the
# killed server restarted, empty, as its replica): each returns once the
# sentinels name a new master (up to 30 s) and it says it is one.
failover_scripts() {
  local sc="${cli[*]} -p $((base + 2)) -a $SPW"
  cat >"$tmp/newmaster.sh" <<SH
for i in \$(seq 600); do
  now=\$($sc sentinel get-master-addr-by-name twm | tail -1)
  if [ "\$now" != "\$1" ] && ${cli[*]} -p "\$now" -a $PW role | head -1 | grep -qx master; then
    echo "\$now"
    exit 0
  fi
  sleep 0.05
done
echo "the failover did not complete in 30 s" >&2
exit 1
SH
  cat >"$tmp/failover.sh" <<SH
set -e
old=\$($sc sentinel get-master-addr-by-name twm | tail -1)
out=\$($sc sentinel failover twm)
[ "\$out" = OK ] || { echo "SENTINEL FAILOVER: \$out" >&2; exit 1; }
sh $tmp/newmaster.sh "\$old" >/dev/null
SH
  cat >"$tmp/kill.sh" <<SH
set -e
old=\$($sc sentinel get-master-addr-by-name twm | tail -1)
kill -9 \$(cat $tmp/pid.\$old)
now=\$(sh $tmp/newmaster.sh "\$old")
redis-server --bind 127.0.0.1 --port \$old --dir $tmp/n\$old --save '' \\
  --logfile $tmp/n\$old/log --requirepass $PW --masterauth $PW \\
  --replicaof 127.0.0.1 \$now >/dev/null 2>&1 &
echo \$! >$tmp/pid.\$old
echo \$! >>$tmp/pids
SH
}

case $scenario in
  auth)
    port=$(pick_ports 2)
    closed=$((port + 1))
    serve one --port "$port" --requirepass "$PW" --unixsocket "$tmp/one/redis.sock" \
      --unixsocketperm 700
    wait_ping -p "$port" -a "$PW"
    # shellcheck disable=SC2086
    "${cli[@]}" -p "$port" -a "$PW" ACL SETUSER twapp on '>app-Pass-1' \
      resetkeys '~{tw:*' resetchannels nocommands $ACL_CMDS >/dev/null
    # shellcheck disable=SC2086
    "${cli[@]}" -p "$port" -a "$PW" ACL SETUSER twless on '>app-Pass-1' \
      resetkeys '~{tw:*' resetchannels nocommands ${ACL_CMDS/+script|load /} >/dev/null
    # shellcheck disable=SC2086
    "${cli[@]}" -p "$port" -a "$PW" ACL SETUSER twother on '>app-Pass-1' \
      resetkeys '~{other:*' resetchannels nocommands $ACL_CMDS >/dev/null
    a=127.0.0.1:$port
    expect 0 addr="redis://:$PW@$a"
    expect 0 addr="$a" password="$PW"
    expect 0 addr="redis://default:$PW@$a"
    expect 0 addr="redis://twapp:app-Pass-1@$a" ns=tw
    expect 0 addr="redis://$a" user=twapp password=app-Pass-1
    expect TW_EAUTH addr="redis://:wrong-Pass-9@$a" want="redis $a: AUTH" want=WRONGPASS
    expect TW_EAUTH addr="redis://twapp:wrong-Pass-9@$a" want=WRONGPASS
    expect TW_EAUTH addr="$a" want="redis $a" want=NOAUTH
    "$bin" wait-fresh "redis://:$PW@$a" \
      "${cli[*]} -p $port -a $PW client kill type normal >/dev/null"
    expect TW_EAUTH addr="redis://twless:app-Pass-1@$a" ns=tw want=NOPERM want="script|load"
    expect TW_EAUTH addr="redis://twother:app-Pass-1@$a" ns=tw want=NOPERM \
      want="GET of a key of the namespace"
    # Every rule of the smallest ACL, and those ownership adds, removed in
    # turn (+ping, +select and +role are checked by the connection's set
    # up): the open is refused naming the command (issue 41; before, 25
    # of these 30 opened).
    own_cmds="+pexpire +pttl +zremrangebyscore"
    # shellcheck disable=SC2086
    all="$(printf ' %s' $ACL_CMDS $own_cmds) "
    # shellcheck disable=SC2086
    "${cli[@]}" -p "$port" -a "$PW" ACL SETUSER twown on '>app-Pass-1' \
      resetkeys '~{tw:*' resetchannels nocommands $all >/dev/null
    expect 0 addr="redis://twown:app-Pass-1@$a" ns=tw lease=2000
    for rule in $all; do
      case $rule in +ping | +select | +role) continue ;; esac
      # shellcheck disable=SC2086
      "${cli[@]}" -p "$port" -a "$PW" ACL SETUSER twrule reset on '>app-Pass-1' \
        resetkeys '~{tw:*' resetchannels nocommands ${all/ $rule / } >/dev/null
      expect TW_EAUTH addr="redis://twrule:app-Pass-1@$a" ns=tw lease=2000 wait=1 \
        want=NOPERM want="'${rule#+}'"
    done
    # The database: /5 and ?db=3 over the Unix socket, nothing in db 0.
    expect 0 addr="redis://:$PW@$a/5" keep=in5
    expect 0 addr="unix://$tmp/one/redis.sock?db=3" password="$PW" keep=in3
    expect 0 addr="unix://:$PW@$tmp/one/redis.sock"
    for db in 3 5; do
      n=$("${cli[@]}" -p "$port" -a "$PW" -n $db --scan --pattern '{tw:*' | wc -l)
      [ "$n" -gt 0 ] || { echo "db $db: no keys of the store" >&2; exit 1; }
    done
    expect TW_EINVAL addr="redis://:$PW@$a/99" want="SELECT" want="out of range"
    expect TW_ECONN addr="unix://$tmp/none.sock" password="$PW" want="unix:$tmp/none.sock"
    # Addresses: each error names what is wrong, never the password.
    expect TW_EINVAL addr=host want='redis: no port in "host"'
    expect TW_EINVAL addr="redis://:$PW@host:99999" want='bad port in "host:99999"'
    expect TW_EINVAL addr="redis://:$PW@$a/x1" want='bad database'
    expect TW_EINVAL addr="http://$a" want='unknown scheme "http"'
    expect TW_EINVAL addr="redis://:$PW@$a" ca=/nonexistent want="not rediss://"
    expect TW_ECONN addr="redis://:$PW@no-such-host.invalid:6379" \
      want="redis no-such-host.invalid:6379: the host name does not resolve"
    expect TW_ECONN addr="redis://:$PW@127.0.0.1:$closed" \
      want="redis 127.0.0.1:$closed: connection refused"
    ;;
  cluster-auth)
    cluster3 0
    seeds=127.0.0.1:$base,127.0.0.1:$((base + 1))
    expect 0 addr="redis://:$PW@$seeds"
    expect 0 addr="$seeds" password="$PW"
    expect TW_EAUTH addr="redis://:wrong-Pass-9@$seeds" want=WRONGPASS
    expect TW_EINVAL addr="redis://:$PW@$seeds/2" want="database 0"
    ;;
  tls | tls-cluster)
    command -v openssl >/dev/null || { echo "openssl missing: skipped"; exit 77; }
    c=$tmp/certs
    mkdir -p "$c"
    mkca() { # NAME
      openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=twheel test $1" \
        -keyout "$c/$1.key" -out "$c/$1.crt" 2>/dev/null
    }
    mkcert() { # NAME CA SAN
      openssl req -newkey rsa:2048 -nodes -subj "/CN=$1" -keyout "$c/$1.key" \
        -out "$c/$1.csr" 2>/dev/null
      printf 'subjectAltName=%s\n' "$3" >"$c/$1.ext"
      openssl x509 -req -in "$c/$1.csr" -CA "$c/$2.crt" -CAkey "$c/$2.key" \
        -CAcreateserial -days 2 -extfile "$c/$1.ext" -out "$c/$1.crt" 2>/dev/null
    }
    mkca ca
    mkca other
    mkcert server ca "IP:127.0.0.1"
    mkcert client ca "DNS:twheel-client"
    tlsargs=(--tls-cert-file "$c/server.crt" --tls-key-file "$c/server.key"
      --tls-ca-cert-file "$c/ca.crt" --tls-auth-clients yes)
    tcli=("${cli[@]}" --tls --cacert "$c/ca.crt" --cert "$c/client.crt" --key "$c/client.key")
    good=(ca="$c/ca.crt" cert="$c/client.crt" key="$c/client.key")
    if [ "$scenario" = tls ]; then
      port=$(pick_ports 2)
      serve one --port "$port" --tls-port $((port + 1)) "${tlsargs[@]}" --requirepass "$PW"
      wait_ping -p $((port + 1)) -a "$PW" "${tcli[@]:2}"
      t=127.0.0.1:$((port + 1))
      expect 0 addr="rediss://:$PW@$t" "${good[@]}"
      expect 0 addr="rediss://$t/2" password="$PW" "${good[@]}"
      expect TW_ECONN addr="rediss://:$PW@$t" ca="$c/other.crt" cert="$c/client.crt" \
        key="$c/client.key" want="redis $t: TLS: the server's certificate is not trusted"
      expect TW_ECONN addr="rediss://:$PW@localhost:$((port + 1))" "${good[@]}" \
        want='does not match the host name "localhost"'
      expect TW_ECONN addr="rediss://:$PW@$t" "${good[@]}" sni=redis.example.com \
        want='does not match the host name "redis.example.com"'
      expect TW_ECONN addr="rediss://:$PW@$t" ca="$c/ca.crt" \
        want="redis $t: TLS" want="certificate"
      expect TW_ECONN addr="rediss://:$PW@127.0.0.1:$port" "${good[@]}" \
        want="redis 127.0.0.1:$port: TLS handshake" want="not a TLS port"
      expect TW_EINVAL addr="rediss://:$PW@$t" ca="$c/ca.crt" cert="$c/client.crt" \
        want="both redis_tls_cert_file and redis_tls_key_file"
      expect TW_EINVAL addr="rediss://:$PW@$t" ca="$c/none.crt" want='cannot load the CAs of'
      expect TW_EAUTH addr="rediss://:wrong-Pass-9@$t" "${good[@]}" want=WRONGPASS
    else
      [ -n "$sem" ] || { echo "tls-cluster needs test_durable_semantics" >&2; exit 2; }
      ccli=("${tcli[@]:2}")
      cluster3 1 "${tlsargs[@]}" --tls-cluster yes --tls-replication yes
      export TW_SEM_TLS_CA=$c/ca.crt TW_SEM_TLS_CERT=$c/client.crt
      export TW_SEM_TLS_KEY=$c/client.key TW_SEM_PASSWORD=$PW
      seeds="rediss://127.0.0.1:$base,127.0.0.1:$((base + 1))"
      "$sem" suite "$seeds"
      if [ -n "$dred" ]; then
        from=$("${tcli[@]}" -p "$base" -a "$PW" cluster myid)
        to=$("${tcli[@]}" -p $((base + 1)) -a "$PW" cluster myid)
        export TW_REDIS_RESHARD="${tcli[*]} -a $PW --cluster reshard 127.0.0.1:$base \
          --cluster-from $from --cluster-to $to --cluster-slots 3000 \
          --cluster-yes --cluster-pipeline 50 >$tmp/reshard.log 2>&1 ||
          { cat $tmp/reshard.log; exit 1; }"
        "$dred" reshard "$seeds"
      fi
    fi
    ;;
  sentinel)
    # One replica, wait_replicas 1: a write is acknowledged only once the
    # replica that will be promoted has it. (With two replicas and WAIT 1,
    # an acknowledged write can sit on the one that is not promoted: seen
    # here, one schedule lost.) The new master has no replica until the
    # sentinels reconfigure the old one (their INFO period, ~10 s): WAIT
    # fails meanwhile, so calls resume after that.
    sentinels
    # A wrong sentinel password is the auth code, named by the sentinel.
    expect TW_EAUTH addr="redis-sentinel://:$PW@$sents/twm" spassword=wrong-Pass-9 \
      want="redis-sentinel master \"twm\": sentinel 127.0.0.1"
    expect TW_ECONN addr="redis-sentinel://:$PW@$sents/nosuch" spassword="$SPW" \
      want='knows no master named "nosuch"'
    failover_scripts
    export TW_FAILOVER="sh $tmp/failover.sh"
    "$bin" sentinel addr="redis-sentinel://$sents/twm" password="$PW" spassword="$SPW"
    now=$("${cli[@]}" -p $((base + 2)) -a "$SPW" sentinel get-master-addr-by-name twm | tail -1)
    [ "$now" = "$r" ] ||
      { echo "the failover did not happen (master port $now)" >&2; exit 1; }
    ;;
  sentinel-load)
    # Timers due 1 s ahead scheduled throughout a SENTINEL FAILOVER and a
    # kill -9 of the master, wait_replicas 1 with one replica (the
    # guide's promise: nothing acknowledged lost), deliveries resume.
    [ -n "$sem" ] || { echo "sentinel-load needs test_redis_failover" >&2; exit 2; }
    sentinels
    failover_scripts
    export TW_FAILOVER="sh $tmp/failover.sh" TW_KILL="sh $tmp/kill.sh"
    "$sem" addr="redis-sentinel://$sents/twm" password="$PW" spassword="$SPW"
    ;;
  perm-lost)
    # A permission taken away after open, then given back (issue 41):
    # counted, told, and nothing lost.
    [ -n "$sem" ] || { echo "perm-lost needs test_redis_perm" >&2; exit 2; }
    port=$(pick_ports 1)
    serve one --port "$port" --requirepass "$PW"
    wait_ping -p "$port" -a "$PW"
    # shellcheck disable=SC2086
    all=" $(echo $ACL_CMDS +pexpire +pttl +zremrangebyscore) "
    cat >"$tmp/acl.sh" <<SH
all='$all'
exec ${cli[*]} -p $port -a $PW ACL SETUSER twapp reset on '>app-Pass-1' \\
  resetkeys '~{tw:*' resetchannels nocommands \${all/ +\$1 / } >/dev/null
SH
    export TW_ACL="bash $tmp/acl.sh"
    "$sem" "redis://twapp:app-Pass-1@127.0.0.1:$port" evalsha zadd hset \
      zrangebyscore get hmget stats:zcard stats:zcount own:pexpire \
      own:zremrangebyscore
    ;;
  *)
    echo "unknown scenario $scenario" >&2
    exit 2
    ;;
esac
echo "$scenario: ok"
