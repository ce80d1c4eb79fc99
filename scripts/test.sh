#!/usr/bin/env bash
# The project's test command: everything CI runs, on a fresh machine of this kind.
# Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "scripts/test.sh: cargo is not installed (install Rust with rustup first)" >&2
  exit 1
fi

# Real servers for the storage backends: installed if missing, started on unusual loopback
# ports, stopped when the tests end. A test that needs one fails loudly if it cannot start.
MESHQL_TEST_POSTGRES_URL=$(scripts/services/postgres.sh start)
MESHQL_TEST_MYSQL_URL=$(scripts/services/mariadb.sh start)
MESHQL_TEST_MONGO_URL=$(scripts/services/ferretdb.sh start)
export MESHQL_TEST_POSTGRES_URL MESHQL_TEST_MYSQL_URL MESHQL_TEST_MONGO_URL
trap 'scripts/services/postgres.sh stop; scripts/services/mariadb.sh stop; scripts/services/ferretdb.sh stop' EXIT

cargo test --workspace --locked "$@"
