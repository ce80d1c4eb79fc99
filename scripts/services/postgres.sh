#!/usr/bin/env bash
# A throw-away PostgreSQL for the tests: installs it if missing (Debian), creates a cluster
# under $MESHQL_SERVICES_DIR (default /tmp/meshql-services), listens on 127.0.0.1:$MESHQL_PG_PORT
# (default 55432), and prints the connection URL of database `meshql_test`.
#
# It keeps 512 MB of WAL for a streaming standby (scripts/services/postgres-replica.sh) that
# falls behind while the tests write, and whatever the standby's physical slot has not received
# (up to 8 GB per slot: a slot nothing reads cannot fill the disk).
#
# The server accepts TLS as well as plain connections (`ssl = on`, set with ALTER SYSTEM and a
# reload, so a cluster already running gets it without a restart): a throw-away CA and server
# certificate (DNS:localhost, IP:127.0.0.1) are made with openssl under $DIR/tls
# (scripts/services/tls-certs.sh; `ca.crt` to trust, `other-ca.crt` an unrelated CA).
#
#   scripts/services/postgres.sh start   # idempotent; prints the URL
#   scripts/services/postgres.sh stop
#   scripts/services/postgres.sh url
#   scripts/services/postgres.sh tls     # prints the directory of ca.crt and other-ca.crt
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=${MESHQL_SERVICES_DIR:-/tmp/meshql-services}/postgres
PORT=${MESHQL_PG_PORT:-55432}
URL="postgres://postgres@127.0.0.1:$PORT/meshql_test"

. "$HERE/pg-lib.sh"

install() {
  if ! pgbin >/dev/null; then
    echo "installing PostgreSQL (apt)..." >&2
    mkdir -p "$(dirname "$DIR")"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; } \
      >"$(dirname "$DIR")/apt-postgresql.log" 2>&1 \
      || { cat "$(dirname "$DIR")/apt-postgresql.log" >&2; exit 1; }
  fi
}

start() {
  install
  local bin; bin=$(pgbin)
  mkdir -p "$DIR"
  [ "$(id -u)" = 0 ] && chown postgres "$DIR" "$(dirname "$DIR")" 2>/dev/null || true
  # wal_level=logical and the slots: the postgres_cdc processor source (logical replication)
  local options="-p $PORT -k '$DIR' -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c wal_keep_size=512MB -c max_slot_wal_keep_size=8GB -c wal_level=logical -c max_replication_slots=32 -c max_wal_senders=32"
  if as_owner "$bin/pg_ctl -D '$DIR/data' status" >/dev/null 2>&1 \
    && [ "$(psql -h 127.0.0.1 -p "$PORT" -U postgres -tAc 'SHOW wal_level' 2>/dev/null)" != logical ]; then
    # started by an earlier version of this script: start it again with the settings above
    as_owner "$bin/pg_ctl -D '$DIR/data' -m fast -w stop" >/dev/null 2>&1 || true
  fi
  if ! as_owner "$bin/pg_ctl -D '$DIR/data' status" >/dev/null 2>&1; then
    if [ ! -f "$DIR/data/PG_VERSION" ]; then
      as_owner "$bin/initdb -D '$DIR/data' -U postgres -A trust --no-instructions" >"$DIR/initdb.log" 2>&1 \
        || { cat "$DIR/initdb.log" >&2; exit 1; }
    fi
    as_owner "$bin/pg_ctl -D '$DIR/data' -l '$DIR/server.log' -w -t 30 -o \"$options\" start" >"$DIR/pg_ctl.log" 2>&1 </dev/null \
      || { echo "PostgreSQL did not start; its log:" >&2; cat "$DIR/pg_ctl.log" "$DIR/server.log" >&2; exit 1; }
  fi
  for _ in $(seq 50); do
    "$bin/pg_isready" -q -h 127.0.0.1 -p "$PORT" && break
    sleep 0.1
  done
  "$bin/pg_isready" -q -h 127.0.0.1 -p "$PORT" || { echo "PostgreSQL is not accepting connections" >&2; exit 1; }
  if ! psql -h 127.0.0.1 -p "$PORT" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='meshql_test'" | grep -q 1; then
    psql -q -h 127.0.0.1 -p "$PORT" -U postgres -c "CREATE DATABASE meshql_test" >/dev/null
  fi
  enable_tls
  echo "$URL"
}

enable_tls() { # certificates, then ssl = on (reloadable: plain connections are unaffected)
  local owner=""
  [ "$(id -u)" = 0 ] && owner=postgres
  bash "$HERE/tls-certs.sh" "$DIR/tls" $owner >/dev/null
  local q="psql -q -X -h 127.0.0.1 -p $PORT -U postgres -d postgres -tA"
  if [ "$($q -c "SHOW ssl")" != on ] || [ "$($q -c "SHOW ssl_cert_file")" != "$DIR/tls/server.crt" ]; then
    $q -c "ALTER SYSTEM SET ssl_cert_file = '$DIR/tls/server.crt'" \
       -c "ALTER SYSTEM SET ssl_key_file = '$DIR/tls/server.key'" \
       -c "ALTER SYSTEM SET ssl = on" -c "SELECT pg_reload_conf()" >/dev/null
    for _ in $(seq 50); do
      [ "$($q -c "SHOW ssl")" = on ] && break
      sleep 0.1
    done
    [ "$($q -c "SHOW ssl")" = on ] || { echo "PostgreSQL did not turn TLS on; its log:" >&2; tail -20 "$DIR/server.log" >&2; exit 1; }
  fi
}

case "${1:-start}" in
  start) start ;;
  stop) pg_stop ;;
  url) echo "$URL" ;;
  tls) echo "$DIR/tls" ;;
  *) echo "usage: $0 start|stop|url|tls" >&2; exit 2 ;;
esac
