#!/usr/bin/env bash
# make demo: the main job on bundled and generated data, section by section. Each module adds
# one function demo_<module> and one line in the list at the bottom. Output goes to out/.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
mkdir -p out
ISOKV="$BUILD/isokv"

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
}
# ---- end demo_plan ----

# ---- demo_engine (inference engine; owner: model) ----
demo_engine() {
  section "engine: generated 'small' model (random weights: the text is noise, the figures are the point)"
  "$ISOKV" model init --config small --seed 1 -o out/small.bin --tokenizer-out out/small-tok.bin
  "$ISOKV" model info out/small.bin
  local sys
  sys=$(for i in $(seq 1 24); do printf 'You are a careful assistant of the isokv project; answer briefly. '; done)
  echo "# the same request twice on one engine: the second run reuses the prompt's full blocks"
  "$ISOKV" run --model out/small.bin --tokenizer out/small-tok.bin --prompt "$sys Question: what is a prefix cache?" \
    -n 12 --repeat 2
  echo "# cold vs warm TTFT: tenant A then tenant B, same 1024-token public prefix, own 32-token suffix"
  "$ISOKV" bench engine --config small --prefix 1024 --suffix 32 --decode 16 --threads 1
}
# ---- end demo_engine ----

# ---- sections (one line each) ----
demo_cache
demo_plan
demo_engine
