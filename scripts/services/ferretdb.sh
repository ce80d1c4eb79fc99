#!/usr/bin/env bash
# A throw-away MongoDB-wire-protocol server for the tests: FerretDB v1.24 (SQLite handler),
# built from its Go module on first use (a real mongod cannot be installed on these machines).
# Listens on 127.0.0.1:$MESHQL_FERRETDB_PORT (default 27018) and prints its URI.
#
#   scripts/services/ferretdb.sh start   # idempotent; prints the URI
#   scripts/services/ferretdb.sh stop
#   scripts/services/ferretdb.sh url
#   scripts/services/ferretdb.sh bin     # builds if needed; prints the binary's path
#
# MESHQL_FERRETDB_BIN runs that binary instead of building one (tests start a second server
# with their own MESHQL_SERVICES_DIR and port).
set -euo pipefail
BASE=${MESHQL_SERVICES_DIR:-/tmp/meshql-services}
DIR=$BASE/ferretdb
PORT=${MESHQL_FERRETDB_PORT:-27018}
VERSION=v1.24.0
BIN=${MESHQL_FERRETDB_BIN:-$BASE/bin/ferretdb-$VERSION}
URL="mongodb://127.0.0.1:$PORT/"

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

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

running() { [ -f "$DIR/pid" ] && alive "$(cat "$DIR/pid")" && listening; }

start() {
  build
  mkdir -p "$DIR/data"
  if ! running; then
    nohup "$BIN" </dev/null --handler=sqlite --sqlite-url="file:$DIR/data/" --state-dir="$DIR" \
      --listen-addr="127.0.0.1:$PORT" --telemetry=disable --debug-addr=- --log-level=warn \
      >"$DIR/server.log" 2>&1 &
    echo $! > "$DIR/pid"
    for _ in $(seq 100); do
      listening && break
      sleep 0.1
    done
    listening || { echo "FerretDB did not start; its log:" >&2; cat "$DIR/server.log" >&2; exit 1; }
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

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  url) echo "$URL" ;;
  bin) build; echo "$BIN" ;;
  *) echo "usage: $0 start|stop|url|bin" >&2; exit 2 ;;
esac
