#!/usr/bin/env bash
# Writes crates/meshql-cli/hot-functions.txt: the functions a serving meshql runs, hottest
# first, which the release link places together (see crates/meshql-cli/build.rs and
# docs/BENCHMARKS.md, "Footprint: the code serving runs, placed together").
#
# How: the release binary serves examples/egg-economy under valgrind's callgrind; once it is
# ready the counters are zeroed (start-up code is not wanted: its pages are released), then
# `meshql bench` runs the egg-economy suite and the throughput paths against it, with a few
# more requests (lists, metrics, the console, a 404); every function that executed is listed
# by the instructions it ran. Functions of the previous list that this run did not see (slow
# paths of contended locks, which callgrind's one-thread-at-a-time execution rarely takes)
# are kept after them. Run it again after a toolchain or dependency upgrade: names the build
# no longer defines are ignored by the linker, and the footprint then grows back. That is
# checked: scripts/test.sh builds the release binary and fails when fewer than 80 % of the
# list's names are defined in it (scripts/check-hot-functions.sh BINARY tells the count).
#
# Usage: scripts/hot-functions.sh     (needs valgrind; takes a few minutes)
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind >/dev/null; }
cargo build --release -q -p meshql
BIN=target/release/meshql
LIST=crates/meshql-cli/hot-functions.txt
WORK=$(mktemp -d)
PORT=17391
trap 'kill "$VG" 2>/dev/null || true; rm -rf "$WORK"' EXIT

valgrind --tool=callgrind --demangle=no --dump-instr=no --compress-strings=no --compress-pos=no \
  --callgrind-out-file="$WORK/cg.out" \
  "$BIN" serve examples/egg-economy --port $PORT --data-dir "$WORK/data" --log-level warn \
  > "$WORK/serve.log" 2>&1 &
VG=$!
for _ in $(seq 600); do curl -sf "localhost:$PORT/health" >/dev/null && break; sleep 0.2; done
sleep 1
callgrind_control -z "$VG" >/dev/null
"$BIN" bench egg-economy throughput --url "http://127.0.0.1:$PORT" --curve-secs 0 --duration 2 \
  --vus 2 --out "$WORK/bench" > "$WORK/bench.log"
for path in /farm/api /farm/api?limit=2 /metrics /ready / /farm/api/nosuch; do
  curl -s "localhost:$PORT$path" > /dev/null
done
sleep 3
callgrind_control -d "$VG" >/dev/null
kill "$VG"; wait "$VG" 2>/dev/null || true

python3 - "$BIN" "$WORK" "$LIST" <<'PY'
import collections, glob, subprocess, sys
binary, work, out = sys.argv[1:4]
defined = set()
for line in subprocess.run(["nm", "--defined-only", binary], capture_output=True, text=True).stdout.splitlines():
    parts = line.split()
    if len(parts) == 3 and parts[1] in "tTwW":
        defined.add(parts[2])
# self cost per function: cost lines under `fn=`, except the one after `calls=` (a callee's)
cost = collections.Counter()
for dump in glob.glob(f"{work}/cg.out*"):
    fn, after_call = None, False
    for line in open(dump):
        if line.startswith("fn="):
            fn = line[3:].strip()
            cost[fn] += 0  # ran, whatever it cost itself
        elif line.startswith("calls="):
            after_call = True
        elif line[:1].isdigit() and fn:
            if not after_call and len(line.split()) > 1:
                cost[fn] += int(line.split()[1])
            after_call = False
seen = [f for f, _ in sorted(cost.items(), key=lambda kv: -kv[1]) if f in defined]
try:
    previous = [l.strip() for l in open(out) if l.strip()]
except FileNotFoundError:
    previous = []
chosen = set(seen)
kept = [f for f in previous if f not in chosen and f in defined]
skip = lambda f: "startup_pages" in f  # runs once, right before its pages are released
names = [f for f in seen + kept if not skip(f)]
open(out, "w").write("".join(f + "\n" for f in names))
print(f"{out}: {len(seen)} functions ran while serving, {len(kept)} kept from the previous list")
PY
