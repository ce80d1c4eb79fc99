#!/bin/bash
# Run once by the postgres image's entrypoint when it initialises the primary's data directory
# (files in /docker-entrypoint-initdb.d/, as the postgres user, the server up on a local
# socket). Prepares streaming replication for postgres-standby:
#   - a `replicator` role with REPLICATION (password: $REPLICATION_PASSWORD);
#   - a physical replication slot `standby1`, so that the primary keeps the WAL the standby has
#     not received yet (while the standby is away it grows: drop the slot if you remove the
#     standby for good: SELECT pg_drop_replication_slot('standby1'));
#   - a pg_hba.conf line letting that role connect for replication from the network.
set -e

psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" \
  --set=replication_password="${REPLICATION_PASSWORD:?set REPLICATION_PASSWORD}" <<'SQL'
CREATE ROLE replicator WITH REPLICATION LOGIN PASSWORD :'replication_password';
SELECT pg_create_physical_replication_slot('standby1');
SQL

echo "host replication replicator all scram-sha-256" >> "$PGDATA/pg_hba.conf"
