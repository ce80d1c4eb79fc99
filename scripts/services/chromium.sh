#!/usr/bin/env bash
# Chromium and chromedriver for the console's browser tests (crates/meshql-cli/tests/console.rs):
# Debian's `chromium` and `chromium-driver`, installed with apt if missing. Nothing to start:
# each test runs its own chromedriver (and headless Chromium) on a free port and stops it.
#
#   scripts/services/chromium.sh start   # idempotent; prints the two paths, KEY=VALUE per line
#   scripts/services/chromium.sh paths   # the same, without installing
#
# The tests read MESHQL_TEST_CHROMIUM and MESHQL_TEST_CHROMEDRIVER (default /usr/bin/chromium
# and /usr/bin/chromedriver) and fail, saying so, when either is missing.
set -euo pipefail
BASE=${MESHQL_SERVICES_DIR:-/tmp/meshql-services}

install() {
  command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 && return 0
  echo "installing chromium and chromium-driver (apt)..." >&2
  mkdir -p "$BASE"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; } \
    >"$BASE/apt-chromium.log" 2>&1 || { cat "$BASE/apt-chromium.log" >&2; exit 1; }
}

paths() {
  local chromium chromedriver
  chromium=$(command -v chromium) || { echo "chromium is not installed" >&2; exit 1; }
  chromedriver=$(command -v chromedriver) || { echo "chromedriver is not installed" >&2; exit 1; }
  echo "MESHQL_TEST_CHROMIUM=$chromium"
  echo "MESHQL_TEST_CHROMEDRIVER=$chromedriver"
}

case "${1:-}" in
  start) install; paths ;;
  paths) paths ;;
  stop) ;; # nothing runs between tests
  *) echo "usage: $0 start|paths|stop" >&2; exit 2 ;;
esac
