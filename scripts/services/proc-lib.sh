# Shared by the service scripts that run a server as a background process with a pid file in
# $DIR (nats.sh, redis.sh): sourced, not run.

alive() { # a live, non-zombie process
  local pid=$1
  kill -0 "$pid" 2>/dev/null && [ "$(ps -o stat= -p "$pid" | cut -c1)" != Z ]
}

stop() { # SIGTERM, then SIGKILL after 5 s; forgets the pid
  local pid
  pid=$(cat "$DIR/pid" 2>/dev/null) || return 0
  if alive "$pid"; then
    kill "$pid"
    for _ in $(seq 100); do alive "$pid" || break; sleep 0.05; done
    alive "$pid" && kill -9 "$pid"
  fi
  rm -f "$DIR/pid"
}

destroy() { # stops it and deletes its directory
  stop
  rm -rf "$DIR"
}
