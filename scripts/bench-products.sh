#!/usr/bin/env bash
# Seed 004's variants side by side: `meshql bench products` (GET by random id over N seeded
# products at 300/s, 900/s, then a sweep) on PostgreSQL as the seed ran it — the primary alone,
# with meshql's in-process cache, with Redis, on a streaming replica, on the replica with Redis —
# each without and with concurrent writes (new products POSTed to the primary). One Markdown
# table at the end with the seed's columns. Starts the servers it needs
# (scripts/services/{postgres,postgres-replica,redis}.sh); reports go to target/bench-products/.
#
# Usage: scripts/bench-products.sh [products=100000] [step_secs=30] [writes_per_sec=1000]
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-100000}
STEP=${2:-30}
WRITES=${3:-1000}
STAMP=$(date +%s)
OUT=target/bench-products
rm -rf "$OUT" && mkdir -p "$OUT"

cargo build --release -q -p meshql
MESHQL=target/release/meshql
PG=$(scripts/services/postgres.sh start)
REPLICA=$(scripts/services/postgres-replica.sh start)
REDIS=$(scripts/services/redis.sh start)

# the variants' configs: the products example on PostgreSQL, with a replica and caches
CONF=$OUT/configs
cp -r examples/products "$CONF"
base() { # the example with its SQLite storage block replaced by PostgreSQL
  sed -e 's/^type = "sqlite"$/type = "postgres"/' -e 's/^file = "products.db"$/url = "${DATABASE_URL}"/' \
    examples/products/meshql.toml
}
base >"$CONF/primary.toml"
{ base; printf '\n[cache]\n'; } >"$CONF/cache.toml"
{ base; printf '\n[cache]\nredis = { url = "%s", prefix = "bench%s" }\n' "$REDIS" "$STAMP"; } >"$CONF/redis.toml"
base | sed 's/^url = "${DATABASE_URL}"$/url = "${DATABASE_URL}"\nread_url = "${DATABASE_READ_URL}"/' >"$CONF/replica.toml"
{ base | sed 's/^url = "${DATABASE_URL}"$/url = "${DATABASE_URL}"\nread_url = "${DATABASE_READ_URL}"/'
  printf '\n[cache]\nredis = { url = "%s", prefix = "benchr%s" }\n' "$REDIS" "$STAMP"; } >"$CONF/replica-redis.toml"

n=0
run() { # variant writes_per_sec
  local variant=$1 writes=$2 label="$1-w$2"
  n=$((n + 1))
  local db="products_${STAMP}_$n"
  psql "$PG" -qc "CREATE DATABASE $db" >/dev/null
  echo "== $label" >&2
  DATABASE_URL="${PG%/*}/$db" DATABASE_READ_URL="${REPLICA%/*}/$db" MESHQL_DATA_DIR="$OUT/$label-data" \
    "$MESHQL" bench products --config "$CONF/$variant.toml" --products "$N" --step-secs "$STEP" \
    --writes-per-sec "$writes" --out "$OUT/$label" >"$OUT/$label.log" 2>&1 \
    || echo "   $label: a threshold failed or a run had errors; see $OUT/$label.log" >&2
  [ -f "$OUT/$label/report.json" ] || { tail -40 "$OUT/$label.log" >&2; exit 1; }
  rm -rf "$OUT/$label-data"
  psql "$PG" -qc "DROP DATABASE $db" >/dev/null || true
}

for writes in 0 "$WRITES"; do
  for variant in primary cache redis replica replica-redis; do
    run "$variant" "$writes"
  done
done

python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
variants = ["primary", "cache", "redis", "replica", "replica-redis"]
print("| variant | writes/s | 300/s p50 / p95 / p99 ms | 900/s p50 / p95 / p99 ms | sweep: highest rate with p95 ≤ bound | p95 there |")
print("|---|---:|---|---|---:|---:|")
for writes in sorted({int(d.rsplit("-w", 1)[1]) for d in os.listdir(out) if "-w" in d and os.path.isdir(f"{out}/{d}")}):
    for v in variants:
        path = f"{out}/{v}-w{writes}/report.json"
        if not os.path.exists(path):
            continue
        runs = [r for s in json.load(open(path))["scenarios"] for r in s["runs"]]
        by = {r["label"]: r for r in runs}
        def cell(label):
            r = by.get(label)
            if not r:
                return "–"
            o = r["overall"]
            return f"{o['med_ms']:.2f} / {o['p95_ms']:.2f} / {o['p99_ms']:.2f}"
        sweep = [r for r in runs if r["label"] not in ("300/s", "900/s")]
        ok = [r for r in sweep if r["overall"]["p95_ms"] <= 2.0 and r.get("dropped", 0) == 0]
        best = ok[-1] if ok else None
        print(f"| {v} | {writes} | {cell('300/s')} | {cell('900/s')} | {best['label'] if best else '–'} | {best['overall']['p95_ms']:.2f} |" if best else f"| {v} | {writes} | {cell('300/s')} | {cell('900/s')} | – | – |")
PY
