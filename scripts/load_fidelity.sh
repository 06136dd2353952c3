#!/bin/bash
# One fidelity point: start a fresh `isokv serve` (bundled stories260K, free port), replay TRACE
# against it with `isokv load` (closed loop), read the server's cached-token counter, stop it,
# and replay the sent order through `isokv sim --mode order` with the server's cache size.
#
#   scripts/load_fidelity.sh BIN OUTDIR NAME TRACE POLICY KVMEM CONC [isokv load flags...]
#   scripts/load_fidelity.sh build/isokv out/fid syn-lru /tmp/syn.jsonl lru 5M 1
#
# IKV_MODEL / IKV_TOKENIZER override the bundled stories260K (e.g. a longer-context checkpoint);
# IKV_SERVE_ARGS adds `isokv serve` flags (split on spaces: --block-tokens 1 --tier mem:64M).
# Prints one line: NAME policy cache_blocks conc live_ratio ok requests cached metrics_cached
# and the simulator's hit tokens with and without --pin-public (compare with cached), and of
# its timed mode with the measured service times (--mode timed --service trace). Everything lands in OUTDIR/NAME (server log, requests.csv, summary.json, sent.jsonl).
set -eu
[ $# -ge 7 ] || { sed -n 2,10p "$0"; exit 2; }
bin=$1 out=$2 name=$3 trace=$4 pol=$5 kv=$6 conc=$7
shift 7
root=$(cd "$(dirname "$0")/.." && pwd)
d=$out/$name
rm -rf "$d"
mkdir -p "$d"
"$bin" serve --model "${IKV_MODEL:-$root/data/models/stories260K/stories260K.bin}" \
    --tokenizer "${IKV_TOKENIZER:-$root/data/models/stories260K/tok512.bin}" --port 0 --threads 1 \
    --policy "$pol" --kv-mem "$kv" ${IKV_SERVE_ARGS:-} > "$d/serve.out" 2> "$d/serve.err" &
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
# sent.jsonl has the sent blocks (B tokens each); the server pins public prefixes: so does the sim
bt=$(python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).readline())['block_tokens'])" "$d/sent.jsonl")
# IKV_SIM_CAP replaces the simulator's capacity (e.g. "--tiers hbm=8192,dram=1M" for a server
# with a lower tier); the timed replay takes each request's measured times from sent.jsonl
cap=${IKV_SIM_CAP:---capacity-tokens $((cache * bt))}
for pin in "" --pin-public; do
  "$bin" sim "$d/sent.jsonl" --mode order --policy "$pol" $cap $pin --json > "$d/sim$pin.json"
done
"$bin" sim "$d/sent.jsonl" --mode timed --service trace --policy "$pol" $cap --pin-public --json \
    > "$d/sim-timed.json"
get() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['hit_tokens'])" "$1"; }
sim=$(get "$d/sim--pin-public.json") nopin=$(get "$d/sim.json") timed=$(get "$d/sim-timed.json")
echo "$name policy=$pol cache_blocks=$cache conc=$conc live(ratio ok requests cached)=$live metrics_cached=$metrics sim_hit_tokens(pin)=$sim sim_hit_tokens(no pin)=$nopin sim_timed_trace_hit_tokens=$timed"
