#!/usr/bin/env bash
# make demo: the main job on the bundled data (data/: a trained model, public traces) and on
# generated data, section by section. IKV_TRACES=DIR replays traces from DIR instead. Each module adds
# one function demo_<module> and one line in the list at the bottom. Output goes to out/.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
mkdir -p out
ISOKV="$BUILD/isokv"
DATA="$PWD/data" # the bundled model and traces (data/README.md)
rm -f out/small.bin out/small-tok.bin # the 159 MB checkpoint older demos left; none is written now

section() { printf '\n==== %s ====\n' "$*"; }

demo_cache() {
  section "cache core: throughput and memory per policy (measured, 1M block ops per phase)"
  "$BUILD/bench_index" --ops 1000000 --seqs 20000
}

# ---- demo_plan (planner; owner: plan) ----
demo_plan() {
  section "planner: the compute-latency walk of llama3-70b, 2048 in / 256 out (simulated, isokv roofline)"
  for hw in h100 h200; do
    "$ISOKV" plan --model llama3-70b --hw "$hw" --prompt 2048 --output 256 --plot "out/plan-$hw.svg"
    echo
  done
  "$ISOKV" plan route --model llama3-70b --hw h100 --class medium --slo-ms 4000
  "$ISOKV" plan route --model llama3-70b --hw h100 --class complex --allow-poll
  section "planner: the efficient frontier of the whole configuration space (simulated)"
  "$ISOKV" plan --frontier --model llama3-70b --hw h100 --plot out/frontier-h100.svg
  "$ISOKV" plan route --frontier --model llama3-70b --hw h100 --class medium --slo-ms 4000
  section "planner: algorithmic jumps, the isoquant before and after (simulated)"
  "$ISOKV" plan --jump w4,kv8,prefix:h=0.5 --model llama3-70b --hw h100 --plot out/jump-h100.svg
  section "planner: measured on isokv's engine on this machine (wall clock)"
  "$ISOKV" plan --measured --plot out/plan-measured.svg
}
# ---- end demo_plan ----

# ---- demo_engine (inference engine; owner: model) ----
demo_engine() {
  local model="$DATA/models/stories260K/stories260K.bin"
  section "engine: the bundled trained model (stories260K, llama2.c's TinyStories model, $model)"
  "$ISOKV" model info "$model"
  echo "# a story sampled from an empty prompt (isokv run without --model uses the bundled model and tokenizer)"
  IKV_DATA_DIR="$DATA" "$ISOKV" run --temp 0.8 --seed 7 -n 200
  local story="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. One day, she saw a big, red ball under a tree. She wanted to play with it, but her mom said it was time to go home. Lily was sad, so she asked her mom if she could bring the ball. Her mom smiled and said"
  echo "# cold vs warm: the same 112-token prompt (7 blocks of 16 tokens) three times on one engine;"
  echo "# runs 2 and 3 take its first 6 blocks from the cache (measured TTFT on stderr)"
  IKV_DATA_DIR="$DATA" "$ISOKV" run --prompt "$story" --temp 0 -n 24 --repeat 3
  section "engine benchmark: 'small' config with random weights, built in memory (the figures are the point), 1024-token public prefix"
  "$ISOKV" bench engine --config small --prefix 1024 --suffix 32 --decode 16 --threads 1 --repeat 1
}
# ---- end demo_engine ----

# ---- demo_sim (simulator; owner: sim) ----
demo_sim() {
  # the public traces bundled under data/traces (IKV_TRACES=DIR points elsewhere: same layout)
  local traces=${IKV_TRACES:-$DATA/traces}
  local mc="$traces/mooncake" weka="$traces/weka_cc/weka_cc_traces_part1.jsonl.gz"
  if [ ! -f "$mc/conversation_trace.jsonl" ] || [ ! -f "$weka" ]; then
    echo "demo: traces not found under '$traces' (expected mooncake/conversation_trace.jsonl and weka_cc/weka_cc_traces_part1.jsonl.gz; set IKV_TRACES=DIR)" >&2
    return 1
  fi
  section "simulator fidelity: Mooncake traces, one global LRU pool, trace order (token hit ratio; Mooncake FAST'25 Fig. 9 / Table 2 for comparison)"
  printf '%-13s' trace; for c in 100k 1M 3M 10M unlimited; do printf '%11s' "$c"; done; printf '%13s %s\n' "3M/unlim." "(published: 3M/unlim. 41% conv, 46% synth; unlim. 40% / 66%)"
  for f in conversation synthetic; do
    printf '%-13s' "$f"
    local r3=0 ru=0
    for c in 100k 1M 3M 10M unlimited; do
      r=$("$ISOKV" sim "$mc/${f}_trace.jsonl" --capacity-tokens "$c" --json | sed -n 's/.*"token_hit_ratio":[[:space:]]*\([0-9.e-]*\).*/\1/p')
      printf '%11.4f' "$r"
      case $c in 3M) r3=$r ;; unlimited) ru=$r ;; esac
    done
    awk -v a="$r3" -v b="$ru" 'BEGIN { printf "%12.1f%%\n", 100 * a / b }'
  done
  section "simulator: WEKA Claude Code sessions, N conversations interleaved in one hour through one 2M-token cache (order mode)"
  "$ISOKV" sim sweep "$weka" --vary conversations=1,16,64,355 --policy lru,arc,value,opt \
    --capacity-tokens 2M --out out/sim-weka --title 'WEKA sessions, one 2M-token cache'
  section "simulator: the same 355 conversations in timed mode, tiers hbm 2M + dram 16M tokens (SIMULATED times)"
  "$ISOKV" sim "$weka" --mode timed --tiers hbm=2M,dram=16M --policy value --servers 32
  echo "plots: out/sim-weka/sweep.svg, out/sim-weka/sweep.png"
}
# ---- end demo_sim ----

# ---- demo_gen (synthetic multi-user workload; owner: gen) ----
demo_gen() {
  section "synthetic workload: isokv gen, then hit ratio vs users (simulated replay, order mode)"
  "$ISOKV" gen -o out/syn-example.jsonl --users 1000 --requests 2000
  head -c 400 out/syn-example.jsonl; echo " ..."
  # 500 apps, 1M-token cache, load growing with users: 3 N x 2 layouts x 7 configurations
  SYN_NAME=demo SYN_USERS="10 1000 100000" SYN_REQUESTS=5000 SYN_CAPACITY=1M \
    SYN_GEN="--block-tokens 64 --user-rate 4 --apps 500" scripts/synthetic.sh "$BUILD" out/synthetic
  echo "full sweep and its reading: scripts/synthetic.sh, docs/synthetic.md"
}
# ---- end demo_gen ----

# ---- demo_store (storage tiers; owner: store) ----
demo_store() {
  section "storage tiers: bundled stories260K, a KV pool with room for 2 blocks, a file tier below it (measured)"
  local m=data/models/stories260K p
  p=$(for i in 1 2 3 4 5 6; do printf 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends. '; done)
  rm -f out/demo-tier.store
  echo "# process 1: computes the prompt; the blocks the pool has no room for go to the file"
  "$ISOKV" run --model $m/stories260K.bin --tokenizer $m/tok512.bin --prompt "$p" -n 16 \
    --kv-mem 700k --tier file:out/demo-tier.store:16M > out/demo-tier-1.txt 2> out/demo-tier-1.err
  cat out/demo-tier-1.err
  echo "# process 2 (a fresh index): finds them by probing the file, loads instead of recomputing"
  "$ISOKV" run --model $m/stories260K.bin --tokenizer $m/tok512.bin --prompt "$p" -n 16 \
    --kv-mem 700k --tier file:out/demo-tier.store:16M > out/demo-tier-2.txt 2> out/demo-tier-2.err
  cat out/demo-tier-2.err
  cmp -s out/demo-tier-1.txt out/demo-tier-2.txt && echo "# same text from both processes (out/demo-tier-*.txt)"
  local t1 t2
  t1=$(sed -n 's/.*TTFT \([0-9.]*\) ms.*/\1/p' out/demo-tier-1.err)
  t2=$(sed -n 's/.*TTFT \([0-9.]*\) ms.*/\1/p' out/demo-tier-2.err)
  awk -v a="$t1" -v b="$t2" 'BEGIN { printf "# TTFT recomputing %.2f ms, loading from the file tier %.2f ms: %+.2f ms (measured, one run each)\n", a, b, b - a }'
}
# ---- end demo_store ----

# ---- demo_serve (HTTP server; owner: serve) ----
demo_serve() {
  section "serve: isokv serve on the bundled stories260K, two tenants sharing a public system prompt (curl)"
  local dir port pid i
  dir=$(mktemp -d /tmp/isokv-demo-serve.XXXXXX)
  printf '{"sk-alice": "alice", "sk-bob": "bob"}' > "$dir/keys.json"
  printf 'You are a storyteller for small children. Your stories are short, kind and simple.' > "$dir/system.txt"
  "$ISOKV" serve --port 0 --api-keys "$dir/keys.json" --public-prefix "$dir/system.txt" >"$dir/out" 2>"$dir/log" &
  pid=$!
  # stopped when the section ends, and also when a failing command ends the script (set -e)
  trap 'kill -TERM "${pid:-}" 2>/dev/null; wait "${pid:-}" 2>/dev/null; rm -rf "${dir:-}"; trap - RETURN EXIT' RETURN EXIT
  port=
  for i in $(seq 1 100); do
    port=$(sed -n 's|.*listening on http://127.0.0.1:\([0-9]*\).*|\1|p' "$dir/out")
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    sleep 0.1
  done
  cat "$dir/out"
  curl -s "http://127.0.0.1:$port/metrics" | grep -E '^isokv_(engine_cached_tokens_total|blocks_inserted_total|partial_block_hits_total|kv_pool_blocks_used) ' > "$dir/m0"
  local sys
  sys=$(cat "$dir/system.txt")
  ask() { # key story
    curl -s "http://127.0.0.1:$port/v1/completions" -H "Authorization: Bearer $1" \
      -d "{\"prompt\":\"$sys $2\",\"max_tokens\":24,\"temperature\":0}" |
      jq -r '"\(.usage.isokv.tenant): prompt \(.usage.prompt_tokens) tokens, cached \(.usage.prompt_tokens_details.cached_tokens) (public \(.usage.isokv.public_prompt_tokens)) -> \(.choices[0].text | gsub("\n"; " "))"'
  }
  ask sk-alice "Tell me about a cat who found a hat."
  ask sk-bob "Tell me about a cat who found a hat."
  ask sk-alice "Tell me about a cat who found a hat."
  ask sk-bob "Tell me about a dog who lost a ball."
  echo "# streamed (SSE), bob:"
  curl -sN "http://127.0.0.1:$port/v1/chat/completions" -H "Authorization: Bearer sk-bob" \
    -d '{"messages":[{"role":"user","content":"A bird"}],"max_tokens":6,"temperature":0,"stream":true}' > "$dir/sse"
  head -c 600 "$dir/sse"; echo " ..."
  echo "# metrics that changed:"
  curl -s "http://127.0.0.1:$port/metrics" | grep -E '^isokv_(engine_cached_tokens_total|blocks_inserted_total|partial_block_hits_total|kv_pool_blocks_used) ' > "$dir/m1"
  diff "$dir/m0" "$dir/m1" | grep '^>' | sed 's/^> /  /' || true
  curl -s "http://127.0.0.1:$port/metrics" | grep -E '^isokv_(requests_total|cached_prompt_tokens_total)\{' | sed 's/^/  /'
  echo "# server log:"
  sed 's/^/  /' "$dir/log"
}
# ---- end demo_serve ----

# ---- sections (one line each) ----
demo_cache
demo_plan
demo_engine
demo_store
demo_sim
demo_gen
demo_serve
