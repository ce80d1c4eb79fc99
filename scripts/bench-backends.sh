#!/usr/bin/env bash
# The quick throughput check (scripts/quick-bench.sh) on every storage backend, one after the
# other on this machine, each on a fresh database. Starts the servers it needs.
#
# Usage: scripts/bench-backends.sh [rounds=1] [seconds=5]
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-1}
SECS=${2:-5}
STAMP=$(date +%s)

PG=$(scripts/services/postgres.sh start)
psql "$PG" -qc "CREATE DATABASE bench_$STAMP" >/dev/null
MY=$(scripts/services/mariadb.sh start)
mariadb -h 127.0.0.1 -P "${MESHQL_MARIADB_PORT:-13306}" -u meshql -pmeshql -e "CREATE DATABASE bench_$STAMP"
MONGO=$(scripts/services/ferretdb.sh start)

BENCH_LABEL=sqlite scripts/quick-bench.sh "$ROUNDS" "$SECS" examples/egg-economy
BENCH_LABEL=memory scripts/quick-bench.sh "$ROUNDS" "$SECS" examples/egg-economy/meshql-memory.toml
BENCH_LABEL=postgresql DATABASE_URL="${PG%/*}/bench_$STAMP" \
  scripts/quick-bench.sh "$ROUNDS" "$SECS" examples/egg-economy/meshql-postgres.toml
BENCH_LABEL=mariadb DATABASE_URL="${MY%/*}/bench_$STAMP" \
  scripts/quick-bench.sh "$ROUNDS" "$SECS" examples/egg-economy/meshql-mysql.toml
BENCH_LABEL=mongodb-wire/ferretdb MONGO_URI="$MONGO" PREFIX="bench$STAMP" \
  scripts/quick-bench.sh "$ROUNDS" "$SECS" examples/egg-economy/meshql-mongo.toml
