#!/usr/bin/env bash
# A throw-away Apache Kafka broker for the tests: one KRaft node (broker and controller in one
# JVM) from the Maven Central jars, no ZooKeeper. The jars are fetched with Maven on first use
# (~15 s, ~55 MB, kept under the services dir); Java 17 and Maven are installed with apt if
# missing. Listens on 127.0.0.1:$MESHQL_KAFKA_PORT (default 19092; its controller on the next
# port), keeps its data under $MESHQL_SERVICES_DIR (default /tmp/meshql-services)/kafka/<port>,
# and prints the bootstrap address once the broker has started.
#
#   scripts/services/kafka.sh start     # idempotent; prints 127.0.0.1:19092
#   scripts/services/kafka.sh stop      # SIGTERM (controlled shutdown), then SIGKILL after 30 s
#   scripts/services/kafka.sh destroy   # stops it and deletes its data (topics, offsets)
#   scripts/services/kafka.sh url
#
# Brokers on other ports (MESHQL_KAFKA_PORT=19192 ...) keep data of their own, so a test can
# stop and restart one without disturbing the others.
set -euo pipefail
BASE=${MESHQL_SERVICES_DIR:-/tmp/meshql-services}
PORT=${MESHQL_KAFKA_PORT:-19092}
CONTROLLER_PORT=$((PORT + 1))
VERSION=3.9.1
LIB=$BASE/kafka/lib-$VERSION
DIR=$BASE/kafka/$PORT
URL="127.0.0.1:$PORT"

install() {
  if ! command -v java >/dev/null 2>&1 || ! command -v mvn >/dev/null 2>&1; then
    echo "installing Java and Maven (apt)..." >&2
    mkdir -p "$BASE"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless maven; } \
      >"$BASE/apt-kafka.log" 2>&1 || { cat "$BASE/apt-kafka.log" >&2; exit 1; }
  fi
  [ -f "$LIB/.complete" ] && return 0
  echo "fetching Kafka $VERSION from Maven Central (first run only)..." >&2
  local pom=$BASE/kafka/pom-$VERSION
  mkdir -p "$pom"
  cat >"$pom/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>meshql.test</groupId>
  <artifactId>kafka-broker</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency><groupId>org.apache.kafka</groupId><artifactId>kafka_2.13</artifactId><version>$VERSION</version></dependency>
    <dependency><groupId>org.slf4j</groupId><artifactId>slf4j-reload4j</artifactId><version>1.7.36</version></dependency>
  </dependencies>
</project>
POM
  rm -rf "$LIB.tmp"
  (cd "$pom" && mvn -q -B dependency:copy-dependencies -DoutputDirectory="$LIB.tmp") \
    >"$BASE/kafka/fetch.log" 2>&1 || { cat "$BASE/kafka/fetch.log" >&2; exit 1; }
  rm -rf "$LIB" && mv "$LIB.tmp" "$LIB" && touch "$LIB/.complete"
}

alive() { # a live, non-zombie process
  local pid=$1
  kill -0 "$pid" 2>/dev/null && [ "$(ps -o stat= -p "$pid" | cut -c1)" != Z ]
}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; }

started() { grep -q "Kafka Server started" "$DIR/server.log" 2>/dev/null; }

running() { [ -f "$DIR/pid" ] && alive "$(cat "$DIR/pid")" && listening; }

configure() {
  mkdir -p "$DIR/data"
  cat >"$DIR/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CONTROLLER_PORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CONTROLLER_PORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$DIR/data
num.partitions=1
auto.create.topics.enable=true
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
  cat >"$DIR/log4j.properties" <<'LOG'
log4j.rootLogger=INFO, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=${kafka.logs.dir}/server.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
log4j.logger.kafka=INFO
log4j.logger.org.apache.kafka=WARN
log4j.logger.state.change.logger=WARN
log4j.logger.kafka.log.LogCleaner=WARN
log4j.logger.kafka.request.logger=WARN
LOG
  if [ ! -f "$DIR/data/meta.properties" ]; then
    local cid
    cid=$(java -cp "$LIB/*" kafka.tools.StorageTool random-uuid 2>/dev/null | tail -1)
    java -cp "$LIB/*" kafka.tools.StorageTool format -t "$cid" -c "$DIR/server.properties" \
      >"$DIR/format.log" 2>&1 || { cat "$DIR/format.log" >&2; exit 1; }
  fi
}

start() {
  install
  if ! running; then
    configure
    : >"$DIR/server.log"
    nohup java -Xms128m -Xmx512m -XX:+UseSerialGC -Djava.awt.headless=true \
      -Dkafka.logs.dir="$DIR" -Dlog4j.configuration="file:$DIR/log4j.properties" \
      -cp "$LIB/*" kafka.Kafka "$DIR/server.properties" </dev/null >"$DIR/stdout.log" 2>&1 &
    echo $! >"$DIR/pid"
  fi
  for _ in $(seq 600); do
    started && listening && break
    alive "$(cat "$DIR/pid")" || break
    sleep 0.1
  done
  if ! { started && listening; }; then
    echo "Kafka did not start; its logs:" >&2
    tail -n 40 "$DIR/stdout.log" "$DIR/server.log" >&2
    exit 1
  fi
  echo "$URL"
}

stop() {
  local pid
  pid=$(cat "$DIR/pid" 2>/dev/null) || return 0
  if alive "$pid"; then
    kill "$pid"
    for _ in $(seq 300); do alive "$pid" || break; sleep 0.1; done
    alive "$pid" && kill -9 "$pid"
    for _ in $(seq 50); do alive "$pid" || break; sleep 0.1; done
  fi
  rm -f "$DIR/pid"
}

destroy() {
  stop
  rm -rf "$DIR"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  destroy) destroy ;;
  url) echo "$URL" ;;
  *) echo "usage: $0 start|stop|destroy|url" >&2; exit 2 ;;
esac
