#!/usr/bin/env bash
# A streaming hot standby of the test PostgreSQL (scripts/services/postgres.sh), for read
# replica tests and benchmarks: starts the primary if needed, copies it with pg_basebackup
# (-R: the copy follows the primary over streaming replication) under
# $MESHQL_SERVICES_DIR/postgres-replica, serves it read-only on 127.0.0.1:$MESHQL_PG_REPLICA_PORT
# (default 55433), and prints the URL of its `meshql_test` database.
#
#   scripts/services/postgres-replica.sh start   # idempotent; prints the URL
#   scripts/services/postgres-replica.sh stop    # the standby only
#   scripts/services/postgres-replica.sh url
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BASE=${MESHQL_SERVICES_DIR:-/tmp/meshql-services}
DIR=$BASE/postgres-replica
PRIMARY_PORT=${MESHQL_PG_PORT:-55432}
PORT=${MESHQL_PG_REPLICA_PORT:-55433}
URL="postgres://postgres@127.0.0.1:$PORT/meshql_test"

. "$HERE/pg-lib.sh"

SLOT=standby_$PORT

# A fresh copy of the primary that follows it through the physical slot $SLOT (the primary
# keeps the WAL the standby has not received yet, so a standby that falls behind while the
# tests or a benchmark write catches up instead of breaking; postgres.sh bounds what a slot
# may keep). initdb's pg_hba.conf trusts local replication.
clone() {
  local bin=$1
  rm -rf "$DIR/data"
  psql -X -q -h 127.0.0.1 -p "$PRIMARY_PORT" -U postgres -d postgres -c \
    "SELECT pg_drop_replication_slot('$SLOT') FROM pg_replication_slots WHERE slot_name = '$SLOT' AND NOT active" >/dev/null
  as_owner "$bin/pg_basebackup -h 127.0.0.1 -p $PRIMARY_PORT -U postgres -D '$DIR/data' -R -X stream -C -S $SLOT --checkpoint=fast" \
    >"$DIR/basebackup.log" 2>&1 || { echo "pg_basebackup failed:" >&2; cat "$DIR/basebackup.log" >&2; exit 1; }
}

start_server() {
  local bin=$1
  as_owner "$bin/pg_ctl -D '$DIR/data' -l '$DIR/server.log' -w -t 60 \
    -o \"-p $PORT -k '$DIR' -c listen_addresses=127.0.0.1 -c hot_standby=on -c max_connections=300 -c max_wal_senders=32 -c max_replication_slots=32\" start" >"$DIR/pg_ctl.log" 2>&1 </dev/null \
    || { echo "the PostgreSQL standby did not start; its log:" >&2; cat "$DIR/pg_ctl.log" "$DIR/server.log" >&2; exit 1; }
}

# Whether the standby streams from the primary (within a few seconds of a start).
streaming() {
  for _ in $(seq 50); do
    [ "$(psql -X -h 127.0.0.1 -p "$PORT" -U postgres -d postgres -tAc "SELECT status FROM pg_stat_wal_receiver" 2>/dev/null)" = streaming ] && return 0
    sleep 0.2
  done
  return 1
}

start() {
  bash "$HERE/postgres.sh" start >/dev/null
  local bin; bin=$(pgbin)
  mkdir -p "$DIR"
  [ "$(id -u)" = 0 ] && chown postgres "$DIR" 2>/dev/null || true
  if as_owner "$bin/pg_ctl -D '$DIR/data' status" >/dev/null 2>&1 \
    && [ "$(psql -h 127.0.0.1 -p "$PORT" -U postgres -tAc 'SHOW max_wal_senders' 2>/dev/null)" != 32 ]; then
    # started by an earlier version of this script: a standby needs at least the primary's
    # max_wal_senders (postgres.sh raised it), so start it again with the settings below
    as_owner "$bin/pg_ctl -D '$DIR/data' -m fast -w stop" >/dev/null 2>&1 || true
  fi
  if ! as_owner "$bin/pg_ctl -D '$DIR/data' status" >/dev/null 2>&1; then
    # a copy made without the slot (an earlier version of this script) is made again
    if [ ! -f "$DIR/data/standby.signal" ] || ! grep -q "primary_slot_name" "$DIR/data/postgresql.auto.conf" 2>/dev/null; then
      clone "$bin"
    fi
    start_server "$bin"
  fi
  if ! streaming; then
    # a standby that cannot follow any more (the WAL it needs is gone): copy the primary again
    echo "the standby does not stream from the primary (its log: $(tail -1 "$DIR/server.log")); copying the primary again" >&2
    as_owner "$bin/pg_ctl -D '$DIR/data' -m fast -w stop" >/dev/null 2>&1 || true
    clone "$bin"
    start_server "$bin"
    streaming || { echo "the standby does not stream from the primary; its log:" >&2; tail -20 "$DIR/server.log" >&2; exit 1; }
  fi
  for _ in $(seq 100); do
    "$bin/pg_isready" -q -h 127.0.0.1 -p "$PORT" && break
    sleep 0.1
  done
  "$bin/pg_isready" -q -h 127.0.0.1 -p "$PORT" || { echo "the standby is not accepting connections" >&2; exit 1; }
  [ "$(psql -X -h 127.0.0.1 -p "$PORT" -U postgres -d meshql_test -tAc "SELECT pg_is_in_recovery()")" = t ] \
    || { echo "the server on port $PORT is not a standby" >&2; exit 1; }
  echo "$URL"
}

case "${1:-start}" in
  start) start ;;
  stop) pg_stop ;;
  url) echo "$URL" ;;
  *) echo "usage: $0 start|stop|url" >&2; exit 2 ;;
esac
