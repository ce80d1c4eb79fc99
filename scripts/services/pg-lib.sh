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
