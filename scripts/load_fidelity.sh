#!/bin/bash
# One fidelity point: start a fresh `isokv serve` (bundled stories260K, free port), replay TRACE
# against it with `isokv load` (closed loop), read the server's cached-token counter, stop it,
# and replay the sent order through `isokv sim --mode order` with the server's cache size.
#
#   scripts/load_fidelity.sh BIN OUTDIR NAME TRACE POLICY KVMEM CONC [isokv load flags...]
#   scripts/load_fidelity.sh build/isokv out/fid syn-lru /tmp/syn.jsonl lru 5M 1
#
# Prints one line: NAME policy cache_blocks conc live_ratio ok requests cached metrics_cached
# sim_ratio. Everything lands in OUTDIR/NAME (server log, requests.csv, summary.json, sent.jsonl).
set -eu
[ $# -ge 7 ] || { sed -n 2,10p "$0"; exit 2; }
bin=$1 out=$2 name=$3 trace=$4 pol=$5 kv=$6 conc=$7
shift 7
root=$(cd "$(dirname "$0")/.." && pwd)
d=$out/$name
rm -rf "$d"
mkdir -p "$d"
"$bin" serve --model "$root/data/models/stories260K/stories260K.bin" \
    --tokenizer "$root/data/models/stories260K/tok512.bin" --port 0 --threads 1 \
    --policy "$pol" --kv-mem "$kv" > "$d/serve.out" 2> "$d/serve.err" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do grep -q "cache [0-9]* blocks" "$d/serve.out" 2>/dev/null && break; sleep 0.1; done
port=$(grep -o "127.0.0.1:[0-9]*" "$d/serve.out" | head -1 | cut -d: -f2)
cache=$(grep -o "cache [0-9]* blocks" "$d/serve.out" | awk '{print $2}')
[ -n "$port" ] && [ -n "$cache" ] || { echo "$name: the server did not start" >&2; exit 1; }
"$bin" load "$trace" --url "http://127.0.0.1:$port" --closed-loop --concurrency "$conc" \
    --out "$d" "$@" > "$d/load.txt" 2>&1 || true
metrics=$(curl -s --max-time 5 "127.0.0.1:$port/metrics" |
    awk '/^isokv_cached_prompt_tokens_total/ {s += $2} END {print s + 0}')
kill "$pid"
wait "$pid" || true
trap - EXIT
live=$(python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(d['token_hit_ratio'], d['ok'], d['requests'], d['cached_tokens'])" "$d/summary.json")
sim=$("$bin" sim "$d/sent.jsonl" --mode order --policy "$pol" --capacity-tokens $((cache * 64)) --json |
    python3 -c "import json,sys; print(json.load(sys.stdin)['token_hit_ratio'])")
echo "$name policy=$pol cache_blocks=$cache conc=$conc live=$live metrics_cached=$metrics sim=$sim"
