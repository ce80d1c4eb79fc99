#!/usr/bin/env bash
# A throw-away NATS server with JetStream for the tests: Debian's nats-server (installed with
# apt if missing), listening on 127.0.0.1:$MESHQL_NATS_PORT (default 14222), its JetStream
# store under $MESHQL_SERVICES_DIR (default /tmp/meshql-services)/nats/<port>. Prints the URL.
#
#   scripts/services/nats.sh start     # idempotent; prints nats://127.0.0.1:14222
#   scripts/services/nats.sh stop
#   scripts/services/nats.sh destroy   # stops it and deletes its streams
#   scripts/services/nats.sh url
#
# Servers on other ports keep stores of their own (a test kills and restarts one of its own).
set -euo pipefail
BASE=${MESHQL_SERVICES_DIR:-/tmp/meshql-services}
PORT=${MESHQL_NATS_PORT:-14222}
DIR=$BASE/nats/$PORT
# shellcheck source=proc-lib.sh
source "$(dirname "$0")/proc-lib.sh"
URL="nats://127.0.0.1:$PORT"

install() {
  command -v nats-server >/dev/null 2>&1 && return 0
  echo "installing nats-server (apt)..." >&2
  mkdir -p "$BASE"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nats-server; } \
    >"$BASE/apt-nats.log" 2>&1 || { cat "$BASE/apt-nats.log" >&2; exit 1; }
}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

running() { [ -f "$DIR/pid" ] && alive "$(cat "$DIR/pid")" && listening; }

start() {
  install
  mkdir -p "$DIR/store"
  if ! running; then
    nohup nats-server -a 127.0.0.1 -p "$PORT" -js -sd "$DIR/store" </dev/null >"$DIR/server.log" 2>&1 &
    echo $! >"$DIR/pid"
    for _ in $(seq 100); do
      listening && break
      alive "$(cat "$DIR/pid")" || break
      sleep 0.05
    done
    listening || { echo "nats-server did not start; its log:" >&2; cat "$DIR/server.log" >&2; exit 1; }
  fi
  echo "$URL"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  destroy) destroy ;;
  url) echo "$URL" ;;
  *) echo "usage: $0 start|stop|destroy|url" >&2; exit 2 ;;
esac
