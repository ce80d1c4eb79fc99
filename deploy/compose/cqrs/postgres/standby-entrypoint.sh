#!/bin/bash
# Entry point of postgres-standby (the postgres image, started as root). On first start (an
# empty data directory) it copies the primary with pg_basebackup: --write-recovery-conf leaves
# standby.signal and the primary's connection settings (primary_conninfo, primary_slot_name)
# in the copy, so the server then starts as a hot standby streaming from the primary. Later
# starts find the copy and go straight to the server. Then it hands over to the image's own
# entrypoint, which drops to the postgres user.
set -e
: "${PRIMARY_HOST:=postgres-primary}"

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  mkdir -p "$PGDATA"
  chown postgres:postgres "$PGDATA"
  chmod 0700 "$PGDATA"
  # PGPASSWORD (the replication password) comes from the environment
  until gosu postgres pg_basebackup --host="$PRIMARY_HOST" --username=replicator \
      --pgdata="$PGDATA" --wal-method=stream --slot=standby1 --write-recovery-conf \
      --checkpoint=fast; do
    echo "standby: pg_basebackup from $PRIMARY_HOST failed; retrying in 2 s" >&2
    find "$PGDATA" -mindepth 1 -delete
    sleep 2
  done
fi

exec docker-entrypoint.sh postgres -c hot_standby=on
