#!/usr/bin/env bash
# The project's test command: everything CI runs, on a fresh machine of this kind.
# Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "scripts/test.sh: cargo is not installed (install Rust with rustup first)" >&2
  exit 1
fi

# The Kafka relay statically links librdkafka, which rdkafka-sys compiles from source with
# cmake (and the C/C++ compilers Rust already needs): install cmake if it is missing.
if ! command -v cmake >/dev/null 2>&1; then
  echo "scripts/test.sh: installing cmake (apt) to build librdkafka..." >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake; } \
    >/tmp/meshql-apt-cmake.log 2>&1 || { cat /tmp/meshql-apt-cmake.log >&2; exit 1; }
fi

# Real servers for the storage backends and the relays: installed if missing, started on
# unusual loopback ports, stopped when the tests end. A test that needs one fails loudly if it
# cannot start.
trap 'scripts/services/nats.sh stop; scripts/services/kafka.sh stop; scripts/services/ferretdb.sh stop; scripts/services/mariadb.sh stop; scripts/services/postgres.sh stop' EXIT
MESHQL_TEST_POSTGRES_URL=$(scripts/services/postgres.sh start)
MESHQL_TEST_MYSQL_URL=$(scripts/services/mariadb.sh start)
MESHQL_TEST_MONGO_URL=$(scripts/services/ferretdb.sh start)
MESHQL_TEST_KAFKA_BROKERS=$(scripts/services/kafka.sh start)
MESHQL_TEST_NATS_URL=$(scripts/services/nats.sh start)
export MESHQL_TEST_POSTGRES_URL MESHQL_TEST_MYSQL_URL MESHQL_TEST_MONGO_URL
export MESHQL_TEST_KAFKA_BROKERS MESHQL_TEST_NATS_URL
# Chromium and chromedriver for the console's browser tests (installed if missing).
CHROMIUM_ENV=$(scripts/services/chromium.sh start)
while IFS='=' read -r key value; do export "$key=$value"; done <<<"$CHROMIUM_ENV"

# Run everything, then close with one line that totals every test binary's results (cargo
# ends with the doc-tests' own, often empty, summary).
log=$(mktemp)
status=0
cargo test --workspace --locked "$@" 2>&1 | tee "$log" || status=$?
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
rm -f "$log"
exit "$status"
