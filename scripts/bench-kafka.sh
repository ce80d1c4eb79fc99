#!/usr/bin/env bash
# Seed 001's ksqlDB row, reproduced: MeshQL's k6 suite (`meshql bench egg-economy`, the profile
# given: smoke = 1 user, load = 5 → 10 users, stress = up to 50) against examples/egg-economy
# (SQLite) and examples/egg-economy-kafka (Kafka as the database), alternating ROUNDS times,
# each Kafka round on topics of its own, then `meshql bench compare` puts the last pair side
# by side (B = Kafka).
#
#   scripts/bench-kafka.sh [PROFILE=smoke|load|stress] [ROUNDS=2]
#
# THINK_MS=500 gives every user the think time of MeshQL's k6 scripts (`sleep(0.5)` after each
# iteration: the load seed 001 measured); by default users send back to back.
#
# Starts the broker of `scripts/services/kafka.sh` (127.0.0.1:19092) unless KAFKA_BROKERS names
# another. Needs a release build (BIN, default target/release/meshql). Reports go to OUT
# (default bench-results/kafka-<time>).
set -euo pipefail
cd "$(dirname "$0")/.."
PROFILE=${1:-smoke}
ROUNDS=${2:-2}
BIN=${BIN:-target/release/meshql}
OUT=${OUT:-bench-results/kafka-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
export KAFKA_BROKERS=${KAFKA_BROKERS:-$(scripts/services/kafka.sh start)}

for r in $(seq 1 "$ROUNDS"); do
  echo "== round $r: egg-economy (SQLite)"
  "$BIN" bench egg-economy --profile "$PROFILE" ${THINK_MS:+--think-ms "$THINK_MS"} --out "$OUT/sqlite-$r" | tail -25
  echo "== round $r: egg-economy-kafka ($KAFKA_BROKERS)"
  PREFIX="bench$$r$r" "$BIN" bench egg-economy --profile "$PROFILE" ${THINK_MS:+--think-ms "$THINK_MS"} \
    --config examples/egg-economy-kafka/meshql.toml --out "$OUT/kafka-$r" | tail -25
done
"$BIN" bench compare "$OUT/sqlite-$ROUNDS/report.json" "$OUT/kafka-$ROUNDS/report.json" | tee "$OUT/compare.txt"
