#!/usr/bin/env bash
# What `[server.rate_limit]` costs a request, in process and shared through Redis, side by side
# in one run: examples/egg-economy without limits, with limits kept in process, and with
# `redis = { … }` (a Redis of its own on 127.0.0.1:$MESHQL_REDIS_PORT, default 16469, started
# and stopped here). Limits are high enough that nothing is refused: what is measured is the
# limiter's work, not refusals.
#
#   scripts/bench-rate-limits.sh [ROUNDS=3] [GETS=5000]
#
# 1. `meshql bench throughput --rounds 1 --duration 4 --curve-secs 0`, the three variants in
#    turn, ROUNDS times: the median req/s of each hot path.
# 2. Latency of one caller: GETS reads by id, one after the other on one keep-alive connection
#    (one curl), per variant: microseconds per request.
#
# Uses target/release/meshql (built if missing). Prints Markdown tables for
# docs/BENCHMARKS.md.
set -euo pipefail
ROUNDS=${1:-3}
GETS=${2:-5000}
cd "$(dirname "$0")/.."
BIN=${MESHQL_BIN:-$PWD/target/release/meshql}
[ -x "$BIN" ] || cargo build --release -p meshql >&2
export MESHQL_REDIS_PORT=${MESHQL_REDIS_PORT:-16469}
WORK=$(mktemp -d)
SERVER=
cleanup() {
  [ -z "$SERVER" ] || kill "$SERVER" 2>/dev/null || true
  scripts/services/redis.sh stop >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
URL=$(scripts/services/redis.sh start)

LIMITS='
[server.rate_limit]
reads = { per_second = 1000000, burst = 1000000 }
writes = { per_second = 1000000, burst = 1000000 }
graphql = { per_second = 1000000, burst = 1000000 }'
VARIANTS=(none process redis)
for v in "${VARIANTS[@]}"; do
  cp -r examples/egg-economy "$WORK/$v"
  rm -rf "$WORK/$v/data"
done
printf '%s\n' "$LIMITS" >>"$WORK/process/meshql.toml"
printf '%s\nredis = { url = "%s", prefix = "bench-%s" }\n' "$LIMITS" "$URL" "$$" >>"$WORK/redis/meshql.toml"

KINDS=(rest_get_by_id graphql_get_by_id graphql_depth3 rest_post)
for round in $(seq "$ROUNDS"); do
  for v in "${VARIANTS[@]}"; do
    echo "round $round: $v" >&2
    "$BIN" bench throughput --config "$WORK/$v" --rounds 1 --duration 4 --curve-secs 0 \
      --out "$WORK/out-$v-$round" 2>&1 |
      awk -v v="$v" '$2 ~ /^[0-9,]+$/ && $3 ~ /^[0-9.]+$/ { gsub(",", "", $2); print v, $1, $3, $2 }' >>"$WORK/rps"
  done
done
# every limited request of the Redis variant went to Redis (none decided in process): one
# EVALSHA per request, two for a GraphQL request costing more than 1 (depth 3)
evalsha=$(redis-cli -p "$MESHQL_REDIS_PORT" info commandstats | tr -d '\r' |
  sed -n 's/^cmdstat_evalsha:calls=\([0-9]*\).*/\1/p')
requests=$(awk '$1 == "redis" && $2 != "ceiling" { n += $4 } END { print n }' "$WORK/rps")
depth3=$(awk '$1 == "redis" && $2 == "graphql_depth3" { n += $4 } END { print n }' "$WORK/rps")
echo "Redis variant: $requests requests measured (+ seeding), ${evalsha:-0} EVALSHA calls (depth 3: $depth3 requests, two each)" >&2

median() { sort -n | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
rps() { awk -v v="$1" -v k="$2" '$1 == v && $2 == k { print $3 }' "$WORK/rps" | median; }

echo
echo "| req/s, median of $ROUNDS | no limits | in process | ratio | Redis | ratio |"
echo "|---|---|---|---|---|---|"
for k in "${KINDS[@]}"; do
  n=$(rps none "$k"); p=$(rps process "$k"); r=$(rps redis "$k")
  printf '| %s | %.0f | %.0f | %.3f | %.0f | %.3f |\n' "$k" "$n" "$p" "$(echo "$p / $n" | bc -l)" "$r" "$(echo "$r / $n" | bc -l)"
done

# one caller, one request at a time: the variants in turn, ROUNDS times
PORT=17469
latency() { # µs per GET by id of variant $1, one at a time on one connection (to $WORK/latency)
  local v=$1 start end fallbacks
  rm -rf "$WORK/data-$v"
  "$BIN" serve "$WORK/$v" --port "$PORT" --data-dir "$WORK/data-$v" --log-level warn >"$WORK/serve-$v.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 300); do curl -sf "localhost:$PORT/health" >/dev/null && break; sleep 0.1; done
  ID=$(curl -s -X POST "localhost:$PORT/farm/api" -H 'content-type: application/json' \
    -d '{"name":"Emerdale","farm_type":"homestead","zone":"north"}' | jq -r .id)
  urls=()
  for _ in $(seq "$GETS"); do urls+=("http://localhost:$PORT/farm/api/$ID"); done
  curl -s "${urls[@]}" >/dev/null # warm: connections to Redis made, code paged in
  start=$(date +%s.%N)
  curl -s "${urls[@]}" >/dev/null
  end=$(date +%s.%N)
  fallbacks=$(curl -s "localhost:$PORT/metrics" | awk '/^meshql_rate_limit_shared_fallbacks_total/ { n += $2 } END { print n + 0 }')
  [ "$fallbacks" = 0 ] || echo "$v: $fallbacks requests decided in process (Redis did not answer in time)" >&2
  kill "$SERVER"
  wait "$SERVER" 2>/dev/null || true
  SERVER=
  echo "$v $(echo "($end - $start) * 1000000 / $GETS" | bc -l)" >>"$WORK/latency"
}
for round in $(seq "$ROUNDS"); do
  for v in "${VARIANTS[@]}"; do
    latency "$v"
  done
done
echo
echo "| $GETS REST GETs by id, one at a time (median of $ROUNDS) | µs per request |"
echo "|---|---|"
for v in "${VARIANTS[@]}"; do
  printf '| %s | %.0f |\n' "$v" "$(awk -v v="$v" '$1 == v { print $2 }' "$WORK/latency" | median)"
done
