#!/usr/bin/env bash
# A throw-away MariaDB for the tests: installs it if missing (Debian), creates a data
# directory under $MESHQL_SERVICES_DIR (default /tmp/meshql-services), listens on
# 127.0.0.1:$MESHQL_MARIADB_PORT (default 13306) and prints the URL of database `meshql_test`
# (user `meshql`, password `meshql`).
#
# The server accepts TLS as well as plain connections (`--ssl-cert`, `--ssl-key`, `--ssl-ca`;
# clients choose): a throw-away CA and server certificate (DNS:localhost, IP:127.0.0.1) are made
# with openssl under $DIR/tls (scripts/services/tls-certs.sh; `ca.crt` to trust, `other-ca.crt`
# an unrelated CA). MariaDB reads these only when it starts: a server already running without
# TLS (started by an older version of this script) is left alone, with a note; `restart` turns
# TLS on.
#
#   scripts/services/mariadb.sh start   # idempotent; prints the URL
#   scripts/services/mariadb.sh stop
#   scripts/services/mariadb.sh restart # stop, then start
#   scripts/services/mariadb.sh url
#   scripts/services/mariadb.sh tls     # prints the directory of ca.crt and other-ca.crt
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DIR=${MESHQL_SERVICES_DIR:-/tmp/meshql-services}/mariadb
PORT=${MESHQL_MARIADB_PORT:-13306}
URL="mysql://meshql:meshql@127.0.0.1:$PORT/meshql_test"

install() {
  if ! command -v mariadbd >/dev/null 2>&1 && [ ! -x /usr/sbin/mariadbd ]; then
    echo "installing MariaDB (apt)..." >&2
    mkdir -p "$(dirname "$DIR")"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server; } \
      >"$(dirname "$DIR")/apt-mariadb-server.log" 2>&1 \
      || { cat "$(dirname "$DIR")/apt-mariadb-server.log" >&2; exit 1; }
  fi
}

client() { mariadb --connect-timeout=2 --protocol=socket -S "$DIR/mysqld.sock" -u root "$@"; }

# running = answering (a pid alone can be a zombie or a recycled number)
running() { [ -S "$DIR/mysqld.sock" ] && client -e "SELECT 1" >/dev/null 2>&1; }

alive() { # a live, non-zombie process
  local pid=$1
  kill -0 "$pid" 2>/dev/null && [ "$(ps -o stat= -p "$pid" | cut -c1)" != Z ]
}

start() {
  install
  mkdir -p "$DIR"
  chown -R mysql "$DIR" 2>/dev/null || true
  local owner=""
  [ "$(id -u)" = 0 ] && owner=mysql
  bash "$HERE/tls-certs.sh" "$DIR/tls" $owner >/dev/null
  if ! running; then
    if [ ! -d "$DIR/data/mysql" ]; then
      mariadb-install-db --user=mysql --datadir="$DIR/data" --auth-root-authentication-method=socket \
        --skip-test-db >"$DIR/install.log" 2>&1 || { cat "$DIR/install.log" >&2; exit 1; }
    fi
    rm -f "$DIR/mysqld.sock"
    # started as a plain background command: no subshell may keep our stdout open
    nohup /usr/sbin/mariadbd --no-defaults --user=mysql --datadir="$DIR/data" \
      --port="$PORT" --bind-address=127.0.0.1 --socket="$DIR/mysqld.sock" \
      --pid-file="$DIR/mysqld.pid" --log-error="$DIR/error.log" \
      --innodb-flush-log-at-trx-commit=2 --max-connections=300 --skip-name-resolve \
      --ssl-cert="$DIR/tls/server.crt" --ssl-key="$DIR/tls/server.key" --ssl-ca="$DIR/tls/ca.crt" \
      </dev/null >/dev/null 2>&1 &
    for _ in $(seq 100); do
      client -e "SELECT 1" >/dev/null 2>&1 && break
      sleep 0.1
    done
    client -e "SELECT 1" >/dev/null 2>&1 || { echo "MariaDB did not start; its log:" >&2; cat "$DIR/error.log" >&2; exit 1; }
  elif [ "$(client -N -e "SELECT @@have_ssl")" != YES ]; then
    echo "note: MariaDB on port $PORT runs without TLS (started before this script enabled it); '$0 restart' turns it on" >&2
  fi
  client -e "CREATE DATABASE IF NOT EXISTS meshql_test;
    CREATE USER IF NOT EXISTS 'meshql'@'%' IDENTIFIED BY 'meshql';
    CREATE USER IF NOT EXISTS 'meshql'@'localhost' IDENTIFIED BY 'meshql';
    GRANT ALL ON *.* TO 'meshql'@'%'; GRANT ALL ON *.* TO 'meshql'@'localhost';"
  echo "$URL"
}

stop() {
  local pid
  pid=$(cat "$DIR/mysqld.pid" 2>/dev/null) || return 0
  if alive "$pid"; then
    kill "$pid"
    for _ in $(seq 100); do alive "$pid" || break; sleep 0.1; done
  fi
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  restart) stop; start ;;
  url) echo "$URL" ;;
  tls) echo "$DIR/tls" ;;
  *) echo "usage: $0 start|stop|restart|url|tls" >&2; exit 2 ;;
esac
