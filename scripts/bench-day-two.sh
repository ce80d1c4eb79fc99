#!/usr/bin/env bash
# Day-two operations on this machine, one command: import, export, backup, restore and
# migration rates
# over a generated history (DOCS documents × VERSIONS versions of the farm example's `farm`).
#
#   scripts/bench-day-two.sh [DOCS] [VERSIONS]      # default 50000 × 4 = 200,000 versions
#   MIGRATE_BATCH=N: the migration's documents per transaction (default 500)
#
# Uses target/release/meshql (built if missing). Prints a Markdown table for docs/BENCHMARKS.md.
set -euo pipefail
DOCS=${1:-50000}
VERSIONS=${2:-4}
cd "$(dirname "$0")/.."
BIN=${MESHQL_BIN:-target/release/meshql}
[ -x "$BIN" ] || cargo build --release -p meshql >&2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
CONFIG=examples/farm/meshql.toml
export PORT=1   # no service answers there: backup opens the files itself

# the history: each document's versions a million ms apart, payloads of ~120 bytes
awk -v docs="$DOCS" -v versions="$VERSIONS" 'BEGIN {
  print "{\"meshql_export\":1,\"exported_at\":0,\"at\":null,\"history\":true,\"entities\":[\"farm\"]}"
  base = 1790000000000
  for (d = 0; d < docs; d++) {
    id = sprintf("%08x-0000-4000-8000-%012x", d, d)
    for (v = 0; v < versions; v++) {
      printf "{\"entity\":\"farm\",\"id\":\"%s\",\"created_at\":%d,\"deleted\":false,\"authorized_tokens\":[],\"payload\":{\"name\":\"farm %d version %d xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}}\n", id, base + d * 10 + v * 1000000, d, v
    }
  }
}' >"$WORK/history.ndjson"
N=$((DOCS * VERSIONS))
MID=$((1790000000000 + DOCS * 10 / 2 + (VERSIONS / 2) * 1000000))

secs() { # seconds a command takes (its output discarded)
  local start end
  start=$(date +%s.%N)
  "$@" >/dev/null 2>&1
  end=$(date +%s.%N)
  echo "$end - $start" | bc -l
}
rate() { printf '%.0f' "$(echo "$1 / $2" | bc -l)"; }
mib() { printf '%.1f' "$(echo "$1 / 1048576" | bc -l)"; }

t_import=$(secs "$BIN" import "$CONFIG" "$WORK/history.ndjson" --data-dir "$WORK/data")
t_again=$(secs "$BIN" import "$CONFIG" "$WORK/history.ndjson" --data-dir "$WORK/data")
t_export=$(secs "$BIN" export "$CONFIG" --data-dir "$WORK/data" --history --out "$WORK/out.ndjson")
t_export_zst=$(secs "$BIN" export "$CONFIG" --data-dir "$WORK/data" --history --out "$WORK/out.ndjson.zst")
t_backup=$(secs "$BIN" backup "$CONFIG" --data-dir "$WORK/data" --to "$WORK/backups")
BACKUP=$(ls -d "$WORK"/backups/meshql-* | head -1)
bytes=$(du -sb "$BACKUP" | cut -f1)
t_restore=$(secs "$BIN" restore "$BACKUP" --config "$CONFIG" --data-dir "$WORK/r1")
t_restore_at=$(secs "$BIN" restore "$BACKUP" --config "$CONFIG" --data-dir "$WORK/r2" --at "$MID")
# a declared migration of every farm (its name title-cased: each document changes), on the
# restored copy: the dry run reads and transforms all of them, the run writes a version each
cp -r examples/farm "$WORK/farm-v2"
awk -v batch="${MIGRATE_BATCH:-500}" 'BEGIN { n = 0 }
  /^\[\[entity\]\]/ { n++; if (n == 2) print "[[entity.migration]]\nname = \"title-case\"\nset = { name = { title = \"name\" } }\nbatch = " batch "\n" }
  { print }' examples/farm/meshql.toml >"$WORK/farm-v2/meshql.toml"
t_dry=$(secs "$BIN" migrate "$WORK/farm-v2" --data-dir "$WORK/r1" --dry-run)
t_migrate=$(secs "$BIN" migrate "$WORK/farm-v2" --data-dir "$WORK/r1")
"$BIN" migrate "$WORK/farm-v2" --data-dir "$WORK/r1" --status | grep -q "applied  title-case .*($DOCS documents)" \
  || { echo "the migration did not change $DOCS documents" >&2; exit 1; }
lines=$(($(wc -l <"$WORK/out.ndjson") - 1))
[ "$lines" = "$N" ] || { echo "export wrote $lines versions, not $N" >&2; exit 1; }

echo "| operation ($N versions, $DOCS documents; backup $(mib "$bytes") MiB) | seconds | rate |"
echo "|---|---|---|"
printf '| import into SQLite | %.2f | %s versions/s |\n' "$t_import" "$(rate "$N" "$t_import")"
printf '| the same import again (writes nothing) | %.2f | %s versions/s |\n' "$t_again" "$(rate "$N" "$t_again")"
printf '| export --history (NDJSON) | %.2f | %s versions/s |\n' "$t_export" "$(rate "$N" "$t_export")"
printf '| export --history (zstd) | %.2f | %s versions/s |\n' "$t_export_zst" "$(rate "$N" "$t_export_zst")"
printf '| backup (from the files) | %.2f | %s MiB/s |\n' "$t_backup" "$(printf '%.0f' "$(echo "$bytes / 1048576 / $t_backup" | bc -l)")"
printf '| restore | %.2f | %s MiB/s |\n' "$t_restore" "$(printf '%.0f' "$(echo "$bytes / 1048576 / $t_restore" | bc -l)")"
printf '| restore --at (half the versions cut) | %.2f | %s versions/s |\n' "$t_restore_at" "$(rate "$N" "$t_restore_at")"
printf '| migrate --dry-run (every document read and transformed) | %.2f | %s documents/s |\n' "$t_dry" "$(rate "$DOCS" "$t_dry")"
printf '| migrate (a new version of every document, batches of %s) | %.2f | %s documents/s |\n' "${MIGRATE_BATCH:-500}" "$t_migrate" "$(rate "$DOCS" "$t_migrate")"
