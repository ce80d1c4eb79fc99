#!/usr/bin/env bash
# A throw-away Redis for the tests (the shared read cache, meshql-cache-redis): Debian's
# redis-server (installed with apt if missing), listening on 127.0.0.1:$MESHQL_REDIS_PORT
# (default 16379), its directory under $MESHQL_SERVICES_DIR (default /tmp/meshql-services)/
# redis/<port>, nothing persisted (no RDB snapshots, no append-only file). Prints the URL.
#
#   scripts/services/redis.sh start     # idempotent; prints redis://127.0.0.1:16379
#   scripts/services/redis.sh stop
#   scripts/services/redis.sh destroy   # stops it and deletes its directory
#   scripts/services/redis.sh url
#
# With MESHQL_REDIS_TLS=1 the server speaks TLS only (certificates of scripts/services/
# tls-certs.sh under $MESHQL_SERVICES_DIR/redis/tls) and the URL is rediss://…;
# `redis.sh ca` prints the file of the authority that signed it.
#
# Servers on other ports are separate (a test stops and restarts one of its own). Commands on
# one port are serialised (tests running in parallel may all ask for the same server).
set -euo pipefail
BASE=${MESHQL_SERVICES_DIR:-/tmp/meshql-services}
PORT=${MESHQL_REDIS_PORT:-16379}
DIR=$BASE/redis/$PORT
# shellcheck source=proc-lib.sh
source "$(dirname "$0")/proc-lib.sh"
URL="redis://127.0.0.1:$PORT"
TLS=${MESHQL_REDIS_TLS:-}
CERTS=$BASE/redis/tls
CLI_TLS=()
if [ -n "$TLS" ]; then
  URL="rediss://127.0.0.1:$PORT"
  CLI_TLS=(--tls --cacert "$CERTS/ca.crt")
fi

install() {
  command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1 && return 0
  echo "installing redis-server (apt)..." >&2
  mkdir -p "$BASE"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; } \
    >"$BASE/apt-redis.log" 2>&1 || { cat "$BASE/apt-redis.log" >&2; exit 1; }
}

# The server answering on the port is the one we started (not another process's).
ours() {
  local pid=$1
  redis-cli "${CLI_TLS[@]}" -h 127.0.0.1 -p "$PORT" info server 2>/dev/null | tr -d '\r' | grep -qx "process_id:$pid"
}

running() { [ -f "$DIR/pid" ] && alive "$(cat "$DIR/pid")" && ours "$(cat "$DIR/pid")"; }

lock() { # one command at a time per port (the server does not inherit the lock: `9>&-`)
  mkdir -p "$BASE/redis"
  exec 9>"$BASE/redis/$PORT.cmd-lock"
  flock -w 60 9 || { echo "redis.sh: another command on port $PORT holds its lock" >&2; exit 1; }
}

start() {
  install
  mkdir -p "$DIR"
  if ! running; then
    # No config file: the defaults, then these. `--save ""` and `--appendonly no`: nothing
    # is written to disk; `--logfile ""`: the log goes to server.log.
    local listen=(--port "$PORT")
    if [ -n "$TLS" ]; then
      "$(dirname "$0")/tls-certs.sh" "$CERTS" >/dev/null
      listen=(--port 0 --tls-port "$PORT" --tls-cert-file "$CERTS/server.crt"
        --tls-key-file "$CERTS/server.key" --tls-ca-cert-file "$CERTS/ca.crt"
        --tls-auth-clients no)
    fi
    nohup redis-server --bind 127.0.0.1 "${listen[@]}" --dir "$DIR" \
      --save "" --appendonly no --daemonize no --logfile "" \
      </dev/null >"$DIR/server.log" 2>&1 9>&- &
    echo $! >"$DIR/pid"
    for _ in $(seq 100); do
      running && break
      alive "$(cat "$DIR/pid")" || break
      sleep 0.05
    done
    running || { echo "redis-server did not start; its log:" >&2; cat "$DIR/server.log" >&2; exit 1; }
  fi
  echo "$URL"
}

case "${1:-start}" in
  start) lock; start ;;
  stop) lock; stop ;;
  destroy) lock; destroy ;;
  url) echo "$URL" ;;
  ca) "$(dirname "$0")/tls-certs.sh" "$CERTS" >/dev/null; echo "$CERTS/ca.crt" ;;
  *) echo "usage: $0 start|stop|destroy|url|ca" >&2; exit 2 ;;
esac
