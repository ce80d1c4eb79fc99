#!/usr/bin/env bash
# A throw-away S3-compatible server for the tests: SeaweedFS (`weed`, built once from the Go
# module proxy with `go install`, into $MESHQL_SERVICES_DIR/bin), its S3 gateway on
# 127.0.0.1:$MESHQL_S3_PORT (default 18333) with one identity (access key `meshql`, secret
# `meshql-secret`), its data under $MESHQL_SERVICES_DIR (default /tmp/meshql-services)/seaweedfs.
# The bucket `meshql-test` is created. Prints the S3 endpoint URL.
#
#   scripts/services/seaweedfs.sh start     # idempotent; prints http://127.0.0.1:18333
#   scripts/services/seaweedfs.sh stop
#   scripts/services/seaweedfs.sh destroy   # stops it and deletes its buckets
#   scripts/services/seaweedfs.sh url
set -euo pipefail
BASE=${MESHQL_SERVICES_DIR:-/tmp/meshql-services}
PORT=${MESHQL_S3_PORT:-18333}
DIR=$BASE/seaweedfs/$PORT
BIN=$BASE/bin
# the release the Go module proxy serves (see the env package list)
VERSION=v0.0.0-20261109003541-7506e5f91cd6
# shellcheck source=proc-lib.sh
source "$(dirname "$0")/proc-lib.sh"
URL="http://127.0.0.1:$PORT"

install() {
  [ -x "$BIN/weed" ] && return 0
  command -v go >/dev/null 2>&1 || export PATH=$PATH:/usr/local/go/bin
  command -v go >/dev/null 2>&1 || { echo "seaweedfs: needs Go (go install)" >&2; exit 1; }
  echo "building SeaweedFS (once; a few minutes)..." >&2
  mkdir -p "$BIN" "$BASE/src"
  # its go.mod has replace directives, which `go install pkg@version` refuses: build it as
  # the main module, from a writable copy of the module the proxy serves
  (
    set -e
    mod=github.com/seaweedfs/seaweedfs@$VERSION
    dir=$(go mod download -json "$mod" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
    [ -n "$dir" ] || { echo "go mod download $mod failed" >&2; exit 1; }
    rm -rf "$BASE/src/seaweedfs"
    cp -r "$dir" "$BASE/src/seaweedfs"
    chmod -R u+w "$BASE/src/seaweedfs"
    cd "$BASE/src/seaweedfs"
    nice -n 10 go build -o "$BIN/weed.tmp" ./weed
    mv "$BIN/weed.tmp" "$BIN/weed"
  ) >"$BASE/go-seaweedfs.log" 2>&1 || { tail -50 "$BASE/go-seaweedfs.log" >&2; exit 1; }
}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

running() { [ -f "$DIR/pid" ] && alive "$(cat "$DIR/pid")" && listening; }

start() {
  install
  mkdir -p "$DIR/data"
  cat >"$DIR/s3.json" <<JSON
{"identities": [{"name": "meshql",
  "credentials": [{"accessKey": "meshql", "secretKey": "meshql-secret"}],
  "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}
JSON
  if ! running; then
    # ports of its own: master, volume and filer beside the S3 gateway (gRPC: +10000)
    nohup "$BIN/weed" server -ip=127.0.0.1 -ip.bind=127.0.0.1 -dir="$DIR/data" \
      -master.port=$((PORT + 1000)) -volume.port=$((PORT + 1001)) -filer.port=$((PORT + 1002)) \
      -volume.max=10 -s3 -s3.port="$PORT" -s3.config="$DIR/s3.json" \
      </dev/null >"$DIR/server.log" 2>&1 &
    echo $! >"$DIR/pid"
    for _ in $(seq 600); do
      listening && break
      alive "$(cat "$DIR/pid")" || break
      sleep 0.1
    done
    listening || { echo "seaweedfs did not start; its log:" >&2; tail -50 "$DIR/server.log" >&2; exit 1; }
  fi
  # the tests' bucket (idempotent); the master may need a moment before it answers
  for _ in $(seq 50); do
    if echo "s3.bucket.create -name meshql-test" |
      "$BIN/weed" shell -master="127.0.0.1:$((PORT + 1000))" 2>&1 |
      grep -q -e "created bucket" -e "already exist"; then
      break
    fi
    sleep 0.2
  done
  echo "$URL"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  destroy) destroy ;;
  url) echo "$URL" ;;
  *) echo "usage: $0 start|stop|destroy|url" >&2; exit 2 ;;
esac
