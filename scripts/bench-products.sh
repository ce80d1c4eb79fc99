#!/usr/bin/env bash
# Seed 004's variants side by side: `meshql bench products` (GET by random id over N seeded
# products at 300/s, 900/s, then a sweep) on PostgreSQL as the seed ran it — the primary alone,
# with meshql's in-process cache, with Redis, on a streaming replica, on the replica with Redis,
# and the last two as a CQRS pair (`--role write` for the seeding and the writes, `--role read`
# on the replica for the reads: read-role, read-role-redis) — each without and with concurrent
# writes (new products POSTed to the primary). VARIANTS="…" runs some of them. One Markdown
# table at the end with the seed's columns. Starts the servers it needs
# (scripts/services/{postgres,postgres-replica,redis}.sh); reports go to target/bench-products/.
#
# Usage: scripts/bench-products.sh [products=100000] [step_secs=30] [writes_per_sec=1000] [rounds=1]
# (writes_per_sec 0: the variants without writes only). With several rounds every variant runs
# once per round, in turn, and each cell is the median of its rounds (p95's range beside it).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-100000}
STEP=${2:-30}
WRITES=${3:-1000}
ROUNDS=${4:-1}
STAMP=$(date +%s)
OUT=target/bench-products
rm -rf "$OUT" && mkdir -p "$OUT"

# MESHQL=path/to/meshql: measure that binary instead of building this tree's
if [ -z "${MESHQL:-}" ]; then
  cargo build --release -q -p meshql
  MESHQL=target/release/meshql
fi
PG=$(scripts/services/postgres.sh start)
REPLICA=$(scripts/services/postgres-replica.sh start)
REDIS=$(scripts/services/redis.sh start)

# the variants' configs: the products example on PostgreSQL, with a replica and caches
CONF=$OUT/configs
cp -r examples/products "$CONF"
base() { # the example with its SQLite storage block replaced by PostgreSQL
  sed -e 's/^type = "sqlite"$/type = "postgres"/' -e 's/^file = "products.db"$/url = "${DATABASE_URL}"/' \
    examples/products/meshql.toml
}
base >"$CONF/primary.toml"
{ base; printf '\n[cache]\n'; } >"$CONF/cache.toml"
{ base; printf '\n[cache]\nredis = { url = "%s", prefix = "bench%s" }\n' "$REDIS" "$STAMP"; } >"$CONF/redis.toml"
base | sed 's/^url = "${DATABASE_URL}"$/url = "${DATABASE_URL}"\nread_url = "${DATABASE_READ_URL}"/' >"$CONF/replica.toml"
{ base | sed 's/^url = "${DATABASE_URL}"$/url = "${DATABASE_URL}"\nread_url = "${DATABASE_READ_URL}"/'
  printf '\n[cache]\nredis = { url = "%s", prefix = "benchr%s" }\n' "$REDIS" "$STAMP"; } >"$CONF/replica-redis.toml"

n=0
run() { # variant writes_per_sec round
  local variant=$1 writes=$2 label="$1-w$2-r$3" config=$1 roles=()
  case $variant in
    read-role) config=replica roles=(--cqrs) ;;
    read-role-redis) config=replica-redis roles=(--cqrs) ;;
  esac
  n=$((n + 1))
  local db="products_${STAMP}_$n"
  psql "$PG" -qc "CREATE DATABASE $db" >/dev/null
  echo "== $label" >&2
  DATABASE_URL="${PG%/*}/$db" DATABASE_READ_URL="${REPLICA%/*}/$db" MESHQL_DATA_DIR="$OUT/$label-data" \
    "$MESHQL" bench products --config "$CONF/$config.toml" "${roles[@]}" --products "$N" --step-secs "$STEP" \
    --writes-per-sec "$writes" --out "$OUT/$label" >"$OUT/$label.log" 2>&1 \
    || echo "   $label: a threshold failed or a run had errors; see $OUT/$label.log" >&2
  [ -f "$OUT/$label/report.json" ] || { tail -40 "$OUT/$label.log" >&2; exit 1; }
  rm -rf "$OUT/$label-data"
  psql "$PG" -qc "DROP DATABASE $db" >/dev/null || true
}

for writes in $(printf '%s\n' 0 "$WRITES" | sort -un); do
  for round in $(seq "$ROUNDS"); do
    for variant in ${VARIANTS:-primary cache redis replica replica-redis read-role read-role-redis}; do
      run "$variant" "$writes" "$round"
    done
  done
done

python3 - "$OUT" <<'PY'
import json, os, re, statistics, sys
out = sys.argv[1]
variants = ["primary", "cache", "redis", "replica", "replica-redis", "read-role", "read-role-redis"]
runs_of = {}  # (variant, writes) -> [runs of one round]
for d in sorted(os.listdir(out)):
    m = re.fullmatch(r"(.+)-w(\d+)-r(\d+)", d)
    path = f"{out}/{d}/report.json"
    if m and os.path.exists(path):
        runs = [r for s in json.load(open(path))["scenarios"] for r in s["runs"]]
        runs_of.setdefault((m[1], int(m[2])), []).append(runs)
rounds = max((len(v) for v in runs_of.values()), default=0)
print(f"| variant | writes/s | 300/s p50 / p95 / p99 ms | 900/s p50 / p95 / p99 ms | sweep: highest rate with p95 ≤ 2 ms (p95) | 900/s cache: hit rate · reads that skipped it |")
print("|---|---:|---|---|---|---|")
if rounds > 1:
    print(f"<!-- each cell: the median of {rounds} rounds; [min–max] of p95 -->")
for writes in sorted({w for _, w in runs_of}):
    for v in variants:
        rs = runs_of.get((v, writes))
        if not rs:
            continue
        def cell(label):
            os_ = [r["overall"] for runs in rs for r in runs if r["label"] == label]
            if not os_:
                return "–"
            med = lambda k: statistics.median(o[k] for o in os_)
            text = f"{med('med_ms'):.2f} / {med('p95_ms'):.2f} / {med('p99_ms'):.2f}"
            if len(os_) > 1:
                p95 = [o["p95_ms"] for o in os_]
                text += f" [{min(p95):.2f}–{max(p95):.2f}]"
            return text
        best = []
        for runs in rs:
            ok = [r for r in runs if r["label"] not in ("300/s", "900/s")
                  and r["overall"]["p95_ms"] <= 2.0 and r.get("dropped", 0) == 0]
            best.append(f"{ok[-1]['label']} ({ok[-1]['overall']['p95_ms']:.2f})" if ok else "–")
        def cache(label):
            ms = [r.get("metrics", {}) for runs in rs for r in runs if r["label"] == label]
            ms = [m for m in ms if "cache_hit_rate" in m]
            if not ms:
                return "–"
            hit = statistics.median(m["cache_hit_rate"] for m in ms)
            skip = statistics.median(m["cache_skipped_share"] for m in ms)
            return f"{hit:.0%} · {skip:.0%}"
        print(f"| {v} | {writes} | {cell('300/s')} | {cell('900/s')} | {' · '.join(best)} | {cache('900/s')} |")
PY
