#!/usr/bin/env bash
# Side-by-side throughput of meshql against the load tool's ceiling (nginx returning a fixed
# ~170-byte JSON body with one worker), measured with wrk in one run on this machine.
# A stop-gap until `meshql bench` exists; see docs/BENCHMARKS.md.
#
# Usage: scripts/quick-bench.sh [rounds=3] [seconds=8] [config=examples/egg-economy]
#   The config's own environment (DATABASE_URL, MONGO_URI, ...) is passed through, so the
#   same scenarios run on every storage backend, e.g.
#   DATABASE_URL=$(scripts/services/postgres.sh start) \
#     scripts/quick-bench.sh 1 5 examples/egg-economy/meshql-postgres.toml
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-3}
SECS=${2:-8}
CONFIG=${3:-examples/egg-economy}
NGINX_PORT=18080
MESHQL_PORT=15288
WORK=$(mktemp -d)
trap 'kill $MESHQL_PID 2>/dev/null || true; [ -f "$WORK/nginx.pid" ] && kill "$(cat "$WORK/nginx.pid")" 2>/dev/null; rm -rf "$WORK"' EXIT

need() { command -v "$1" >/dev/null 2>&1; }
if ! need wrk || ! need nginx || ! need jq; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk nginx-light jq >/dev/null
fi

[ "${SKIP_BUILD:-0}" = 1 ] || cargo build --release -q -p meshql

cat > "$WORK/nginx.conf" <<NGINX
worker_processes 1;
daemon on;
pid $WORK/nginx.pid;
error_log $WORK/nginx-error.log;
events { worker_connections 1024; }
http {
  access_log off;
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      default_type application/json;
      return 200 '{"name":"Emerdale","farm_type":"homestead","zone":"north","owner":"someone","id":"dc605290-9677-4957-9f0e-7bb8f0379c60","extra":"padding-to-about-170-bytes-xx"}';
    }
  }
}
NGINX
nginx -c "$WORK/nginx.conf"

target/release/meshql serve "$CONFIG" --port $MESHQL_PORT --data-dir "$WORK/data" --log-level warn &
MESHQL_PID=$!
for _ in $(seq 100); do curl -sf localhost:$MESHQL_PORT/health >/dev/null && break; sleep 0.05; done

api=http://127.0.0.1:$MESHQL_PORT
post() { curl -sf -X POST "$api/$1/api" -H 'content-type: application/json' -d "$2" | jq -r .id; }
FARM=$(post farm '{"name":"Emerdale","farm_type":"homestead","zone":"north"}')
for c in 1 2 3; do
  COOP=$(post coop "{\"name\":\"coop-$c\",\"farm_id\":\"$FARM\",\"capacity\":10,\"coop_type\":\"a\"}")
  for h in 1 2 3 4 5; do post hen "{\"name\":\"hen-$c-$h\",\"coop_id\":\"$COOP\",\"breed\":\"leghorn\"}" >/dev/null; done
done

lua() { # name, body
  printf 'wrk.method = "POST"\nwrk.body = [[%s]]\nwrk.headers["Content-Type"] = "application/json"\n' "$2" > "$WORK/$1.lua"
}
lua byid "{\"query\":\"{ getById(id: \\\"$FARM\\\") { id name farm_type zone } }\"}"
lua depth3 "{\"query\":\"{ getById(id: \\\"$FARM\\\") { name coops { name hens { name breed } } } }\"}"
lua post '{"name":"farm-x","farm_type":"homestead","zone":"north"}'

run() { # label, wrk args...
  local label=$1; shift
  local out; out=$(wrk -t1 -c10 -d"${SECS}s" "$@")
  if echo "$out" | grep -q "Non-2xx"; then echo "$label: non-2xx responses!" >&2; echo "$out" >&2; exit 1; fi
  echo "$out" | awk -v l="$label" '/Requests\/sec/ {print l, $2}'
}

results="$WORK/results.txt"
for r in $(seq "$ROUNDS"); do
  run ceiling http://127.0.0.1:$NGINX_PORT/ >> "$results"
  run rest_get_by_id "$api/farm/api/$FARM" >> "$results"
  run graphql_get_by_id -s "$WORK/byid.lua" "$api/farm/graph" >> "$results"
  run graphql_depth3 -s "$WORK/depth3.lua" "$api/farm/graph" >> "$results"
  run rest_post -s "$WORK/post.lua" "$api/farm/api" >> "$results"
  echo "round $r done" >&2
done
RSS_KB=$(ps -o rss= -p $MESHQL_PID)

python3 - "$results" "$RSS_KB" <<'PY'
import sys, statistics
rows = {}
for line in open(sys.argv[1]):
    k, v = line.split()
    rows.setdefault(k, []).append(float(v))
ceiling = statistics.median(rows.pop("ceiling"))
import os
print(f"{os.environ.get('BENCH_LABEL', '')} wrk -t1 -c10; medians of {len(next(iter(rows.values())))} rounds; ceiling (nginx) {ceiling:,.0f} req/s")
print(f"{'scenario':<20} {'req/s':>10} {'of ceiling':>11}")
for k, v in rows.items():
    m = statistics.median(v)
    print(f"{k:<20} {m:>10,.0f} {m/ceiling:>11.3f}")
print(f"meshql RSS after the run: {int(sys.argv[2])/1024:.1f} MiB")
PY
