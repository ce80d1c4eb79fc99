#!/usr/bin/env bash
# Instructions a meshql server runs per REST GET by id: a deterministic count (callgrind), the
# same for the same binary whatever else the machine is doing, for comparing two builds of a
# change to the hot path where wall-clock benchmarks on a shared 2-core machine disagree.
#
# How: BINARY serves examples/egg-economy under valgrind's callgrind; one farm is created and
# read once; the counters are zeroed; one curl reads it N times on one keep-alive connection;
# the counters are dumped. Start-up and shutdown are not counted.
#
# Usage: scripts/instructions-per-read.sh BINARY [N=2000] [PORT=17401]   (needs valgrind, jq)
#        MESHQL_CONFIG=DIR scripts/instructions-per-read.sh …   (another copy of egg-economy)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${1:?usage: scripts/instructions-per-read.sh BINARY [N] [PORT]}
N=${2:-2000}
PORT=${3:-17401}
command -v valgrind >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null; }
WORK=$(mktemp -d)
valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" \
  "$BIN" serve "${MESHQL_CONFIG:-examples/egg-economy}" --port "$PORT" --data-dir "$WORK/data" --log-level warn \
  > "$WORK/serve.log" 2>&1 &
VG=$!
trap 'kill "$VG" 2>/dev/null || true; rm -rf "$WORK"' EXIT
for _ in $(seq 600); do curl -sf "localhost:$PORT/health" >/dev/null && break; sleep 0.2; done
ID=$(curl -s -X POST "localhost:$PORT/farm/api" -H 'content-type: application/json' \
  -d '{"name":"Emerdale","farm_type":"homestead","zone":"north"}' | jq -r .id)
curl -s "localhost:$PORT/farm/api/$ID" > /dev/null
sleep 1
callgrind_control -z "$VG" > /dev/null
urls=()
for _ in $(seq "$N"); do urls+=("http://localhost:$PORT/farm/api/$ID"); done
curl -s "${urls[@]}" > /dev/null
callgrind_control -d "$VG" > /dev/null
total=$(grep -E '^(summary|totals):' "$WORK/cg.out.1" | head -n1 | awk '{print $2}')
echo "$BIN: $total instructions for $N GETs by id: $((total / N)) per GET"
