#!/usr/bin/env bash
# The postgres_cdc snapshot rate (docs/BENCHMARKS.md, "Legacy capture"): a ROWS-row legacy
# table on the PostgreSQL of scripts/services/postgres.sh, copied by a script or mapping
# processor into SQLite; prints the rate the processor logs.
# Usage: scripts/bench-legacy-snapshot.sh [rows=1000000] [script|mapping] (BIN= another meshql)
set -uo pipefail
cd "$(dirname "$0")/.."
N=${1:-1000000}; KIND=${2:-mapping}
BIN=${BIN:-target/release/meshql}
[ "$BIN" != target/release/meshql ] || cargo build --release -q -p meshql
ADMIN=$(scripts/services/postgres.sh start)
DB=snap_$(date +%s%N | tail -c 8); SLOT=meshql_$DB
psql $ADMIN -qc "CREATE DATABASE $DB"
URL=${ADMIN%/*}/$DB
psql $URL -qc "CREATE TABLE cust_acct (acct_id serial primary key, acct_num varchar(12) not null, cust_nm_first varchar(30), stat_cd varchar(1) not null, tot_amt int); INSERT INTO cust_acct (acct_num, cust_nm_first, stat_cd, tot_amt) SELECT 'A-' || g, 'NAME' || g, 'A', g FROM generate_series(1, $N) g"
W=$(mktemp -d); D=$W/svc; mkdir -p $D
cat > $D/customer.schema.json <<'J'
{"type": "object", "properties": {"account_number": {"type": "string"}, "first_name": {"type": ["string", "null"]}, "status": {"type": "string"}, "total": {"type": ["number", "null"]}, "legacy_id": {"type": "integer"}}, "required": ["account_number", "status"]}
J
printf 'type Customer { id: ID, account_number: String }\ntype Query { getById(id: ID, at: Float): Customer }\n' > $D/customer.graphql
cat > $D/customer.js <<'J'
function transform(change) {
  const id = "cust-" + change.id;
  if (change.op === "delete") return { id: id, _delete: true };
  const r = change.payload;
  return { id: id, account_number: r.acct_num, first_name: r.cust_nm_first, status: r.stat_cd === "A" ? "active" : "closed", total: r.tot_amt === null ? null : r.tot_amt / 100, legacy_id: r.acct_id };
}
J
if [ "$KIND" = script ]; then
  PROC="type = \"script\"
script = \"customer.js\""
  EXTRA=""
else
  PROC="type = \"mapping\""
  EXTRA='[processor.mapping]
table = "cust_acct"
key = ["acct_id"]
[processor.mapping.fields]
account_number = "acct_num"
first_name = { title = "cust_nm_first" }
status = { code = "stat_cd", map = { A = "active", C = "closed" } }
total = { cents = "tot_amt" }
legacy_id = { int = "acct_id" }'
fi
cat > $D/meshql.toml <<T
port = 4998
data_dir = "$W/data"
[storage.default]
type = "sqlite"
file = "clean.db"
[changes]
enabled = true
[[entity]]
name = "customer"
[entity.rest]
path = "/customer/api"
schema = "customer.schema.json"
[entity.graphql]
path = "/customer/graph"
schema = "customer.graphql"
[[entity.graphql.singletons]]
name = "getById"
query = '{"id": "{{id}}"}'
[[processor]]
name = "customers"
$PROC
inputs = ["cust_acct"]
output = "customer"
batch = ${BATCH:-100}
source = { type = "postgres_cdc", url = "$URL", publication = "p_$DB", slot = "$SLOT", tables = ["cust_acct"] }
$EXTRA
T
$BIN serve $D/meshql.toml --log-level info > $W/log 2>&1 &
SP=$!
T0=$(date +%s.%N)
until grep -q "snapshot copied" $W/log; do sleep 0.2; if ! kill -0 $SP 2>/dev/null; then tail $W/log; break; fi; done
T1=$(date +%s.%N)
grep "snapshot copied" $W/log | tail -1
echo "wall: $(python3 -c "print(round($T1-$T0,2))") s for $N rows"
kill $SP; sleep 1
psql $ADMIN -qc "SELECT pg_drop_replication_slot('$SLOT')" >/dev/null 2>&1
psql $ADMIN -qc "DROP DATABASE $DB" 2>&1 | head -2
rm -rf "$W"
