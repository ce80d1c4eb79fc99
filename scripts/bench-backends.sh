#!/usr/bin/env bash
# `meshql bench throughput rest-crud` on every storage backend (Kafka: examples/egg-economy-kafka),
# one after the other on this machine, each on a fresh database, then one Markdown table of the results side by side.
# Starts the servers it needs (scripts/services/*.sh). Reports go to target/bench-backends/.
#
# Usage: scripts/bench-backends.sh [rounds=1] [seconds=5]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-1}
SECS=${2:-5}
STAMP=$(date +%s)
OUT=target/bench-backends
rm -rf "$OUT" && mkdir -p "$OUT"

cargo build --release -q -p meshql
MESHQL=target/release/meshql

PG=$(scripts/services/postgres.sh start)
psql "$PG" -qc "CREATE DATABASE bench_$STAMP" >/dev/null
MY=$(scripts/services/mariadb.sh start)
mariadb -h 127.0.0.1 -P "${MESHQL_MARIADB_PORT:-13306}" -u meshql -pmeshql -e "CREATE DATABASE bench_$STAMP"
MONGO=$(scripts/services/ferretdb.sh start)
KAFKA=$(scripts/services/kafka.sh start)

run() { # label config [env...]
  local label=$1 config=$2
  shift 2
  echo "== $label" >&2
  env "$@" MESHQL_DATA_DIR="$OUT/$label-data" "$MESHQL" bench throughput rest-crud \
    --config "$config" --rounds "$ROUNDS" --duration "$SECS" --out "$OUT/$label" >"$OUT/$label.log" 2>&1 \
    || echo "   $label: a threshold failed or a run had errors; see $OUT/$label.log" >&2
  [ -f "$OUT/$label/report.json" ] || { tail -40 "$OUT/$label.log" >&2; exit 1; }
}

run sqlite examples/egg-economy/meshql.toml
run memory examples/egg-economy/meshql-memory.toml
run postgresql examples/egg-economy/meshql-postgres.toml DATABASE_URL="${PG%/*}/bench_$STAMP"
run mariadb examples/egg-economy/meshql-mysql.toml DATABASE_URL="${MY%/*}/bench_$STAMP"
run mongodb-wire examples/egg-economy/meshql-mongo.toml MONGO_URI="$MONGO" PREFIX="bench$STAMP"
run kafka examples/egg-economy-kafka/meshql.toml KAFKA_BROKERS="$KAFKA" PREFIX="bench$STAMP"

python3 - "$OUT" sqlite memory postgresql mariadb mongodb-wire kafka <<'PY'
import json, sys
out, labels = sys.argv[1], sys.argv[2:]
hot = ["rest_get_by_id", "graphql_get_by_id", "graphql_depth3", "rest_post"]
crud = ["rest_create", "rest_read", "rest_update", "rest_delete"]
print("| backend | ceiling | " + " | ".join(hot) + " | " + " | ".join(f"crud {k[5:]} (med ms)" for k in crud) + " | peak RSS |")
print("|---" * (3 + len(hot) + len(crud)) + "|")
for label in labels:
    report = json.load(open(f"{out}/{label}/report.json"))
    runs = {r["label"]: r for s in report["scenarios"] for r in s["runs"]}
    cells = [label, f"{runs['ceiling']['overall']['rps']:,.0f}"]
    for k in hot:
        r = runs[k]
        cells.append(f"{r['overall']['rps']:,.0f} ({r['metrics']['of_ceiling']:.3f})")
    smoke = next(r for r in runs.values() if any(x["kind"] == "rest_update" for x in r["kinds"]))
    kinds = {x["kind"]: x for x in smoke["kinds"]}
    cells += [f"{kinds[k]['med_ms']:.2f}" for k in crud]
    rss = max(r.get("server", {}).get("peak_rss_mib", 0) for r in runs.values())
    cells.append(f"{rss:.0f} MiB")
    print("| " + " | ".join(cells) + " |")
PY
