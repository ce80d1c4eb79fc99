#!/usr/bin/env bash
# A throw-away MongoDB-wire-protocol server for the tests: FerretDB v1.24 on its PostgreSQL
# handler, built from its Go module on first use (a real mongod cannot be installed on these
# machines). Its PostgreSQL is the project's own (scripts/services/postgres.sh, started if need
# be), database `ferretdb_$PORT`. The PostgreSQL handler pushes equality filters down to SQL;
# the SQLite handler scans whole collections, so its reads slow down as they grow.
# Listens on 127.0.0.1:$MESHQL_FERRETDB_PORT (default 27018) and prints its URI; and with TLS on
# 127.0.0.1:$MESHQL_FERRETDB_TLS_PORT (default: the port + 1000), with a throw-away CA and server
# certificate (DNS:localhost, IP:127.0.0.1) made by scripts/services/tls-certs.sh under
# $DIR/tls (`ca.crt` to trust, `other-ca.crt` an unrelated CA). A server already running
# without the TLS listener (started by an older version of this script) is left alone, with a
# note; `restart` adds it.
#
#   scripts/services/ferretdb.sh start   # idempotent; prints the URI
#   scripts/services/ferretdb.sh stop    # stops FerretDB (not its PostgreSQL)
#   scripts/services/ferretdb.sh restart # stop, then start
#   scripts/services/ferretdb.sh destroy # stops it and drops its database and state
#   scripts/services/ferretdb.sh url
#   scripts/services/ferretdb.sh tls-url # the TLS listener's URI (tls=true, tlsCAFile=ca.crt)
#   scripts/services/ferretdb.sh tls     # prints the directory of ca.crt and other-ca.crt
#   scripts/services/ferretdb.sh bin     # builds if needed; prints the binary's path
#
# MESHQL_FERRETDB_BIN runs that binary instead of building one. Servers on other ports keep
# their own state directory and database (tests start a second one on a port of their own).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BASE=${MESHQL_SERVICES_DIR:-/tmp/meshql-services}
PORT=${MESHQL_FERRETDB_PORT:-27018}
DIR=$BASE/ferretdb-$PORT
VERSION=v1.24.0
BIN=${MESHQL_FERRETDB_BIN:-$BASE/bin/ferretdb-$VERSION}
TLS_PORT=${MESHQL_FERRETDB_TLS_PORT:-$((PORT + 1000))}
URL="mongodb://127.0.0.1:$PORT/"
TLS_URL="mongodb://127.0.0.1:$TLS_PORT/?tls=true&tlsCAFile=$DIR/tls/ca.crt"
DATABASE=ferretdb_$PORT

build() {
  [ -x "$BIN" ] && return 0
  command -v go >/dev/null 2>&1 || { echo "Go is needed to build FerretDB" >&2; exit 1; }
  mkdir -p "$BASE/bin" "$BASE/src"
  echo "building FerretDB $VERSION (first run only, ~2 min)..." >&2
  (
    cd "$BASE/src"
    go mod download "github.com/FerretDB/FerretDB@$VERSION"
    src="$(go env GOMODCACHE)/github.com/!ferret!d!b/!ferret!d!b@$VERSION"
    rm -rf ferretdb && cp -r "$src" ferretdb && chmod -R u+w ferretdb
    echo "$VERSION" > ferretdb/build/version/version.txt
    cd ferretdb && go build -o "$BIN.tmp" ./cmd/ferretdb
  ) >"$BASE/ferretdb-build.log" 2>&1 || { cat "$BASE/ferretdb-build.log" >&2; exit 1; }
  mv "$BIN.tmp" "$BIN"
}

alive() { # a live, non-zombie process
  local pid=$1
  kill -0 "$pid" 2>/dev/null && [ "$(ps -o stat= -p "$pid" | cut -c1)" != Z ]
}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/${1:-$PORT}") 2>/dev/null; }

running() { [ -f "$DIR/pid" ] && alive "$(cat "$DIR/pid")" && listening; }

start() {
  build
  mkdir -p "$DIR"
  bash "$HERE/tls-certs.sh" "$DIR/tls" >/dev/null
  if ! running; then
    local pg
    pg=$("$HERE/postgres.sh" start)
    pg=${pg%/*}
    if ! psql "$pg/postgres" -tAc "SELECT 1 FROM pg_database WHERE datname='$DATABASE'" | grep -q 1; then
      psql -q "$pg/postgres" -c "CREATE DATABASE $DATABASE" >/dev/null
    fi
    nohup "$BIN" </dev/null --handler=pg --postgresql-url="$pg/$DATABASE" --state-dir="$DIR" \
      --listen-addr="127.0.0.1:$PORT" --listen-tls="127.0.0.1:$TLS_PORT" \
      --listen-tls-cert-file="$DIR/tls/server.crt" --listen-tls-key-file="$DIR/tls/server.key" \
      --telemetry=disable --debug-addr=- --log-level=warn \
      >"$DIR/server.log" 2>&1 &
    echo $! > "$DIR/pid"
    for _ in $(seq 100); do
      listening && break
      sleep 0.1
    done
    listening || { echo "FerretDB did not start; its log:" >&2; cat "$DIR/server.log" >&2; exit 1; }
    for _ in $(seq 50); do
      listening "$TLS_PORT" && break
      sleep 0.1
    done
    listening "$TLS_PORT" || { echo "FerretDB's TLS listener did not start; its log:" >&2; cat "$DIR/server.log" >&2; exit 1; }
  elif ! listening "$TLS_PORT"; then
    echo "note: FerretDB on port $PORT runs without its TLS listener (started before this script added it); '$0 restart' adds it" >&2
  fi
  echo "$URL"
}

stop() {
  local pid
  pid=$(cat "$DIR/pid" 2>/dev/null) || return 0
  if alive "$pid"; then
    kill "$pid"
    for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
  fi
}

destroy() { # stop, then drop the database and state directory
  stop
  local pg
  pg=$("$HERE/postgres.sh" url)
  psql -q "${pg%/*}/postgres" -c "DROP DATABASE IF EXISTS $DATABASE" >/dev/null 2>&1 || true
  rm -rf "$DIR"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  destroy) destroy ;;
  restart) stop; start ;;
  url) echo "$URL" ;;
  tls-url) echo "$TLS_URL" ;;
  tls) echo "$DIR/tls" ;;
  bin) build; echo "$BIN" ;;
  *) echo "usage: $0 start|stop|restart|destroy|url|tls-url|tls|bin" >&2; exit 2 ;;
esac
