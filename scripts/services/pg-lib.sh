# Shared by scripts/services/postgres.sh and postgres-replica.sh (sourced, not run).

pgbin() { # the directory of the installed PostgreSQL's programs
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  done
  return 1
}

as_owner() { # run a command as the cluster owner (postgres when we are root)
  if [ "$(id -u)" = 0 ]; then su postgres -s /bin/bash -c "$*"; else bash -c "$*"; fi
}

pg_stop() { # stops the cluster in $DIR/data (fast shutdown), if PostgreSQL is installed at all
  local bin
  bin=$(pgbin) || exit 0
  as_owner "$bin/pg_ctl -D '$DIR/data' -m fast stop" >/dev/null 2>&1 || true
}
