#!/usr/bin/env bash
# Latency and CPU per request class through `isokv serve` on the bundled model (measured):
# starts a server on a free loopback port with a two-thread engine, routes simple requests to
# step 1 (one thread, no speculation) and lets medium (step 4) and complex (step 5) use two
# threads and prompt-lookup speculation, runs build/bench_serve --classes 1 against it, stops
# it (also on failure), and prints the load average before and after. docs/planner.md, 11.
#   scripts/bench_route_classes.sh [BUILD_DIR] [ROUNDS] [THREADS]
# THREADS (2) is the server's --threads; 1 turns the thread lever off for every class (the
# control: what the classes cost when only priority and speculation differ).
set -euo pipefail
build=${1:-build}
rounds=${2:-3}
threads=${3:-2}
case $threads in ''|*[!0-9]*) echo "THREADS must be a number" >&2; exit 2;; esac
bin=$build/isokv
[ -x "$bin" ] && [ -x "$build/bench_serve" ] || { echo "build $bin and $build/bench_serve first" >&2; exit 1; }
out=$(mktemp -d)
pid=
cleanup() { [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$out"; }
trap cleanup EXIT
echo "nproc $(nproc); load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq 1 "$rounds"); do
  "$bin" serve --port 0 --threads "$threads" --max-seqs 4 --max-queue 256 --kv-mem 64M \
    --route-set route.simple=1 --spec lookup >"$out/stdout" 2>"$out/stderr" &
  pid=$!
  port=
  for _ in $(seq 1 300); do
    port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$out/stdout" | head -1)
    [ -n "$port" ] && break
    sleep 0.1
  done
  [ -n "$port" ] || { echo "server did not start:" >&2; cat "$out/stderr" >&2; exit 1; }
  echo "== round $r (server port $port)"
  "$build/bench_serve" --url "http://127.0.0.1:$port" --streams 12 --requests 6 --prompt 64 \
    --max-tokens 64 --classes 1
  curl -s "http://127.0.0.1:$port/metrics" | grep -E '^isokv_(steps_by_threads|route_(cpu|thread)_seconds)_total' || true
  kill "$pid"; wait "$pid" || true; pid=
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
