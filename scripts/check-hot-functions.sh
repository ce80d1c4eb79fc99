#!/usr/bin/env bash
# Checks that crates/meshql-cli/hot-functions.txt still names the functions of a release
# meshql binary. The release link places the listed functions together (see
# crates/meshql-cli/build.rs); its names carry hashes of the toolchain and of the dependency
# graph, and the linker skips the names it does not find without a word, so after a toolchain
# or dependency change (or enough edits to the code that serves) the footprint grows back
# quietly. This counts the list's names that are defined text symbols of BINARY and fails
# below MIN_PERCENT (default 80: a list written by scripts/hot-functions.sh matches 100 % of
# the binary it was written from; ordinary edits to the serving code take it down a few points
# per session, which costs little footprint; a toolchain or dependency upgrade renames nearly
# every symbol and takes it far lower).
#
# Usage: scripts/check-hot-functions.sh [BINARY] [MIN_PERCENT]
#   BINARY defaults to the release build's meshql (target/release/meshql, or under
#   $CARGO_TARGET_DIR). scripts/test.sh runs it after building that binary.
# Exit status: 0 fresh enough, 1 too few names defined, 2 cannot check.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LIST=$ROOT/crates/meshql-cli/hot-functions.txt
BIN=${1:-${CARGO_TARGET_DIR:-$ROOT/target}/release/meshql}
MIN=${2:-80}

[[ $MIN =~ ^[0-9]+$ ]] || { echo "check-hot-functions: MIN_PERCENT must be a whole number, not '$MIN'" >&2; exit 2; }
[ -f "$LIST" ] || { echo "check-hot-functions: $LIST is missing" >&2; exit 2; }
[ -f "$BIN" ] || { echo "check-hot-functions: no binary at $BIN (cargo build --release -p meshql)" >&2; exit 2; }
command -v nm >/dev/null || { echo "check-hot-functions: nm (binutils) is not installed" >&2; exit 2; }

defined=$(mktemp)
trap 'rm -f "$defined"' EXIT
# the same symbols scripts/hot-functions.sh chooses from: defined code (t/T, weak w/W)
nm --defined-only "$BIN" | awk 'NF == 3 && $2 ~ /^[tTwW]$/ { print $3 }' > "$defined"
if [ ! -s "$defined" ]; then
  echo "check-hot-functions: $BIN defines no code symbols (stripped?); cannot check" >&2
  exit 2
fi

read -r matched total < <(awk 'NR == FNR { d[$0] = 1; next }
                               NF { t++; if ($1 in d) m++ }
                               END { print m + 0, t + 0 }' "$defined" "$LIST")
[ "$total" -gt 0 ] || { echo "check-hot-functions: $LIST is empty" >&2; exit 2; }
percent=$(awk -v m="$matched" -v t="$total" 'BEGIN { printf "%.1f", 100 * m / t }')
echo "hot-functions.txt: $matched of $total names are defined in $BIN ($percent%)"
if [ $((matched * 100)) -lt $((MIN * total)) ]; then
  cat >&2 <<EOF
hot-functions.txt is stale: fewer than $MIN % of its names are defined in the binary, so the
release link no longer places the code that serves together and the resident footprint
grows back (toolchain or dependency change, or edits to the serving paths). Write it again
and commit it:
    scripts/hot-functions.sh      # needs valgrind; a release build and a few minutes
    git add crates/meshql-cli/hot-functions.txt
EOF
  exit 1
fi
