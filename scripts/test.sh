#!/usr/bin/env bash
# The project's test command: everything CI runs, on a fresh machine of this kind.
# Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v cargo >/dev/null 2>&1; then
  echo "scripts/test.sh: cargo is not installed (install Rust with rustup first)" >&2
  exit 1
fi

# Servers needed by storage backends are started here as backends are added
# (each test that needs one fails loudly if it cannot start).

cargo test --workspace --locked "$@"
