#!/usr/bin/env bash
# Seed 001's claim for the SAP variant, checked: the egg-economy API over SAP-style Z-tables
# (examples/egg-economy-sap: ten postgres_cdc captures and mappings running underneath) answers
# as fast as examples/egg-economy. Runs MeshQL's k6 suite (`meshql bench egg-economy`, the
# profile given) against both, alternating ROUNDS times, while a writer commits new lay reports
# into ZAFRU_LEGE at LEGACY_RATE rows/s (so the capture, the mapping and the projections work
# during the SAP runs), then `meshql bench compare` puts the last pair side by side (B = SAP).
#
#   scripts/bench-sap.sh [PROFILE=smoke|load|stress] [ROUNDS=2] [LEGACY_RATE=100]
#
# Needs the PostgreSQL `scripts/services/postgres.sh start` runs (wal_level = logical) and a
# release build (BIN, default target/release/meshql). Reports go to OUT (default
# bench-results/sap-<time>).
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${1:-smoke}
ROUNDS=${2:-2}
RATE=${3:-100}
BIN=${BIN:-target/release/meshql}
OUT=${OUT:-bench-results/sap-$(date +%Y%m%d-%H%M%S)}
ADMIN=${MESHQL_BENCH_LEGACY_URL:-postgres://postgres@127.0.0.1:55432/postgres}
DB=meshql_bench_sap_$$
SUFFIX=_bench$$
LEGACY_URL=${ADMIN%/*}/$DB
mkdir -p "$OUT"

cleanup() {
  [ -n "${WRITER:-}" ] && kill "$WRITER" 2>/dev/null || true
  sleep 1
  psql "$ADMIN" -qtAc "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots
                       WHERE slot_name LIKE 'meshql_sap_%$SUFFIX' AND NOT active" >/dev/null 2>&1 || true
  psql "$ADMIN" -qc "DROP DATABASE IF EXISTS $DB WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT

psql "$ADMIN" -qc "CREATE DATABASE $DB"
psql "$LEGACY_URL" -q -v ON_ERROR_STOP=1 -f examples/egg-economy-sap/legacy-db/init.sql

# the legacy system at work: RATE new lay reports a second, each its own transaction
python3 - "$LEGACY_URL" "$RATE" <<'EOF' &
import subprocess, sys, time
url, rate = sys.argv[1], float(sys.argv[2])
p = subprocess.Popen(["psql", url, "-qtA"], stdin=subprocess.PIPE, text=True)
hens = ["HEN-00000%d" % i for i in range(1, 8)]
plants = {"HEN-000001": "1000", "HEN-000002": "1000", "HEN-000003": "1000", "HEN-000004": "1000",
          "HEN-000005": "2000", "HEN-000006": "2000", "HEN-000007": "3000"}
n, start = 0, time.monotonic()
while True:
    n += 1
    hen = hens[n % 7]
    p.stdin.write("INSERT INTO zafru_lege (aufnr, equnr, werks, ei_menge, erfas_dt, erfas_zt) "
                  f"VALUES ('B{n:011d}', '{hen}', '{plants[hen]}', 1, '20260203', '080000');\n")
    p.stdin.flush()
    time.sleep(max(0.0, start + n / rate - time.monotonic()))
EOF
WRITER=$!

export LEGACY_URL LEGACY_SLOT_SUFFIX=$SUFFIX
for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r: egg-economy"
  "$BIN" bench egg-economy --profile "$PROFILE" --out "$OUT/eggs-$r" | tail -25
  echo "== round $r: egg-economy-sap (capture underneath, $RATE legacy rows/s)"
  "$BIN" bench egg-economy --profile "$PROFILE" --config examples/egg-economy-sap/meshql.toml \
    --out "$OUT/sap-$r" | tail -25
done
rows=$(psql "$LEGACY_URL" -qtAc "SELECT count(*) FROM zafru_lege")
echo "legacy lay reports written during the runs: $rows"
"$BIN" bench compare "$OUT/eggs-$ROUNDS/report.json" "$OUT/sap-$ROUNDS/report.json" | tee "$OUT/compare.txt"
