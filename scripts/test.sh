#!/usr/bin/env bash
# The project's test command: everything CI runs, on a fresh machine of this kind.
# Usage: scripts/test.sh [extra cargo test args]
#   (extra args skip the release build of the hot-functions check unless MESHQL_HOT_CHECK=1)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "scripts/test.sh: cargo is not installed (install Rust with rustup first)" >&2
  exit 1
fi

# The Kafka relay statically links librdkafka, which rdkafka-sys compiles from source with
# cmake (and the C/C++ compilers Rust already needs); installed if it is missing.
# The README's tour (run by the `readme` test) uses curl and jq, as a newcomer would.
missing=()
for tool in cmake curl jq; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "scripts/test.sh: installing ${missing[*]} (apt)..." >&2
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } \
    >/tmp/meshql-apt-tools.log 2>&1 || { cat /tmp/meshql-apt-tools.log >&2; exit 1; }
fi

# The release link orders the serving code by crates/meshql-cli/hot-functions.txt, whose
# names go stale silently after a toolchain or dependency change: build the release binary
# (the tests use debug builds only, so this is a release build of its own: 21 min from
# scratch on 2 cores shared with other builds, 8 of them the final ThinLTO compile of the
# meshql crate) and fail if too few of the list's names are defined in it. Only where the build
# applies the list (x86_64 Linux, Rust 1.90+ with its own LLD; build.rs writes its decision
# to $OUT_DIR/symbol-order). Runs on full runs; extra arguments skip it unless
# MESHQL_HOT_CHECK=1, and MESHQL_HOT_CHECK=0 always skips it. The tests run either way.
hot_status=0
hot_fail=
if [ "${MESHQL_HOT_CHECK:-$([ $# -eq 0 ] && echo 1 || echo 0)}" != 1 ]; then
  echo "scripts/test.sh: hot-functions check skipped (MESHQL_HOT_CHECK=1 runs it)" >&2
elif [ "$(uname -sm)" != "Linux x86_64" ]; then
  echo "scripts/test.sh: hot-functions check skipped: the list applies to x86_64 Linux only" >&2
else
  echo "scripts/test.sh: release build for the hot-functions check..." >&2
  messages=$(mktemp)
  if cargo build --release --locked -p meshql --message-format=json-render-diagnostics >"$messages"; then
    # OUT_DIR of meshql's build script, and the binary, from cargo's JSON messages
    out_dir=$(grep '"reason":"build-script-executed"' "$messages" | grep 'crates/meshql-cli[#") ]' |
      sed -n 's/.*"out_dir":"\([^"]*\)".*/\1/p' | head -n1 || true)
    bin=$(grep '"reason":"compiler-artifact"' "$messages" | grep 'crates/meshql-cli[#") ]' |
      sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | head -n1 || true)
    order=$(cat "$out_dir/symbol-order" 2>/dev/null || echo "unknown: no $out_dir/symbol-order")
    if [ "$order" = on ]; then
      scripts/check-hot-functions.sh "$bin" 2>&1 | tee "$messages" || hot_status=$?
      case $hot_status in
        0) ;;
        1) hot_fail="$(head -n1 "$messages"): stale, run scripts/hot-functions.sh and commit the list" ;;
        *) hot_fail="the hot-functions check could not run (see above)" ;;
      esac
    elif [[ $order == off* ]]; then
      echo "scripts/test.sh: hot-functions check skipped: symbol order $order" >&2
    else
      hot_status=2
      hot_fail="cannot tell whether the release link used hot-functions.txt ($order)"
      echo "scripts/test.sh: $hot_fail" >&2
    fi
  else
    hot_status=$?
    hot_fail="the release build (for the hot-functions check) failed"
    echo "scripts/test.sh: $hot_fail" >&2
  fi
  rm -f "$messages"
fi

# Real servers for the storage backends and the relays: installed if missing, started on
# unusual loopback ports, stopped when the tests end. A test that needs one fails loudly if it
# cannot start.
trap 'scripts/services/redis.sh stop; MESHQL_REDIS_PORT=16389 scripts/services/redis.sh stop; MESHQL_REDIS_PORT=16399 scripts/services/redis.sh stop; MESHQL_REDIS_PORT=16409 scripts/services/redis.sh stop; MESHQL_REDIS_PORT=16419 MESHQL_REDIS_TLS=1 scripts/services/redis.sh stop; scripts/services/nats.sh stop; scripts/services/kafka.sh stop; scripts/services/ferretdb.sh stop; scripts/services/mariadb.sh stop; scripts/services/postgres-replica.sh stop; scripts/services/postgres.sh stop; scripts/services/seaweedfs.sh stop' EXIT
MESHQL_TEST_POSTGRES_URL=$(scripts/services/postgres.sh start)
# a streaming hot standby of it, for the read-replica tests
MESHQL_TEST_POSTGRES_REPLICA_URL=$(scripts/services/postgres-replica.sh start)
MESHQL_TEST_MYSQL_URL=$(scripts/services/mariadb.sh start)
MESHQL_TEST_MONGO_URL=$(scripts/services/ferretdb.sh start)
MESHQL_TEST_KAFKA_BROKERS=$(scripts/services/kafka.sh start)
MESHQL_TEST_NATS_URL=$(scripts/services/nats.sh start)
# the shared read cache and shared rate limits (tests that stop and start Redis use servers
# on ports of their own)
MESHQL_TEST_REDIS_URL=$(scripts/services/redis.sh start)
# an S3-compatible server for backups to a bucket (SeaweedFS, built once from the Go module proxy)
MESHQL_TEST_S3_URL=$(scripts/services/seaweedfs.sh start)
export MESHQL_TEST_S3_URL
export MESHQL_TEST_POSTGRES_URL MESHQL_TEST_POSTGRES_REPLICA_URL MESHQL_TEST_MYSQL_URL MESHQL_TEST_MONGO_URL
export MESHQL_TEST_KAFKA_BROKERS MESHQL_TEST_NATS_URL MESHQL_TEST_REDIS_URL
# Chromium and chromedriver for the console's browser tests (installed if missing).
CHROMIUM_ENV=$(scripts/services/chromium.sh start)
while IFS='=' read -r key value; do export "$key=$value"; done <<<"$CHROMIUM_ENV"

# Run everything (`--no-fail-fast`: a failing test binary does not hide the ones after it),
# then close with one line that totals every test binary's results and names the failures
# (cargo ends with the doc-tests' own, often empty, summary).
log=$(mktemp)
status=0
cargo test --workspace --locked --no-fail-fast "$@" 2>&1 | tee "$log" || status=$?
if [ "$hot_status" != 0 ]; then
  echo "scripts/test.sh: FAILED: $hot_fail"
  [ "$status" != 0 ] || status=$hot_status
fi
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i } }
     /^test .* FAILED$/ { failed[++n] = $2 }
     END { printf "tests: %d passed, %d failed\n", p, f; for (i = 1; i <= n; i++) printf "  failed: %s\n", failed[i] }' "$log"
# a test binary that could not be built or crashed reports no `test result:` line
if [ "$status" != 0 ] && ! grep -q '^test .* FAILED$' "$log"; then
  echo "scripts/test.sh: cargo test failed outside the tests (a build error or a crashed test binary: see above)"
fi
rm -f "$log"
exit "$status"
