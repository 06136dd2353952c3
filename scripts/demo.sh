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

# ---- sections (one line each) ----
demo_cache
