#!/usr/bin/env bash
# The short-capacity policy grid of issue 15 (docs/policies.md, "Is value ahead?"): every online
# policy and opt on every cell where the cache is short, and where each candidate policy ranks.
#
#   scripts/policy_grid.sh [BUILD [OUTDIR]] [-- CANDIDATE ...]      defaults: build, out/grid, value
#
# Cells (token hit ratio, simulated, order mode, one tier):
#   weka-C-N   WEKA part 1, the first N = 64, 128, 355 conversations, C = 0.5M, 2M tokens
#   mc-conv-C, mc-syn-C   the Mooncake conversation and synthetic traces, C = 1M, 3M
#   A-L-U-sS   synthetic scenario A (isokv gen defaults, 2M tokens), layout L, U = 10,000 and
#              100,000 users, generator seeds S = 1, 2, 3; B-...: scenario B (500 apps, 1M)
# Baselines (lru fifo lfu s3fifo sieve arc gdsf opt) are run once and kept under
# OUTDIR/base/; a candidate (any --policy spec, e.g. value:new=8) is rerun every time unless
# GRID_KEEP=1. One line per cell: every policy's hit ratio, each candidate's rank among the
# online policies (1 = best) and the share of the lru -> opt gap it closes; then a summary per
# candidate (cells won, mean gap closed on the WEKA cells). GRID_JOBS runs in parallel
# (default nproc). GRID_CELLS restricts the cells (a grep -E pattern on the cell name).
# GRID_SET=weka20 runs the 20 WEKA cells of docs/simulator.md's value/ARC check instead
# (capacities 0.5M-4M x N = 32-355, and four near 2M / 64) with lru, arc, opt as baselines.
set -euo pipefail
BUILD=build
OUT=out/grid
if [ $# -gt 0 ] && [ "$1" != -- ]; then BUILD=$1; shift; fi
if [ $# -gt 0 ] && [ "$1" != -- ]; then OUT=$1; shift; fi
[ $# -gt 0 ] && [ "$1" = -- ] && shift
CANDS=("$@")
[ ${#CANDS[@]} -gt 0 ] || CANDS=(value)
ISOKV="$BUILD/isokv"
JOBS=${GRID_JOBS:-$(nproc)}
WEKA=data/traces/weka_cc/weka_cc_traces_part1.jsonl.gz
MC=data/traces/mooncake
BASE="lru fifo lfu s3fifo sieve arc gdsf opt"
ONLINE="lru fifo lfu s3fifo sieve arc gdsf"
[ -x "$ISOKV" ] || { echo "policy_grid.sh: $ISOKV not found (build first)" >&2; exit 1; }
mkdir -p "$OUT/base" "$OUT/cand" "$OUT/traces"

# cell name -> "TRACE|FLAGS"
declare -A CELL
order=()
if [ "${GRID_SET:-short}" = weka20 ]; then
  # GRID_SET=weka20: the 20 WEKA cells around the short ones (docs/simulator.md)
  for c in 500k 1M 2M 4M; do
    for n in 32 64 128 355; do
      CELL[weka-$c-$n]="$WEKA|--conversations $n --capacity-tokens $c"; order+=("weka-$c-$n")
    done
  done
  for cn in 2M-56 2M-72 1800k-64 2200k-64; do
    c=${cn%-*}; n=${cn#*-}
    CELL[weka-$cn]="$WEKA|--conversations $n --capacity-tokens $c"; order+=("weka-$cn")
  done
  BASE="lru arc opt"; ONLINE="lru arc"
fi
[ "${GRID_SET:-short}" = weka20 ] || for c in 500k 2M; do
  for n in 64 128 355; do
    CELL[weka-$c-$n]="$WEKA|--conversations $n --capacity-tokens $c"; order+=("weka-$c-$n")
  done
done
[ "${GRID_SET:-short}" = weka20 ] || for t in conv syn; do
  f=$MC/conversation_trace.jsonl; [ $t = syn ] && f=$MC/synthetic_trace.jsonl
  for c in 1M 3M; do CELL[mc-$t-$c]="$f|--capacity-tokens $c"; order+=("mc-$t-$c"); done
done
[ "${GRID_SET:-short}" = weka20 ] || for sc in A B; do
  for l in personal-first shared-first; do
    for u in 10000 100000; do
      for s in 1 2 3; do
        name=$sc-$l-$u-s$s
        tr="$OUT/traces/$name.jsonl"
        if [ ! -s "$tr" ]; then
          extra=""; [ $sc = B ] && extra="--apps 500"
          # shellcheck disable=SC2086
          "$ISOKV" gen -q -o "$tr" --users $u --layout $l --requests 20000 --block-tokens 64 \
            --user-rate 4 $extra --seed $s
        fi
        cap=2M; [ $sc = B ] && cap=1M
        CELL[$name]="$tr|--capacity-tokens $cap"; order+=("$name")
      done
    done
  done
done
if [ -n "${GRID_CELLS:-}" ]; then
  keep=(); for n in "${order[@]}"; do [[ $n =~ $GRID_CELLS ]] && keep+=("$n"); done
  order=("${keep[@]}")
fi

# file name of a policy spec (':' ',' '=' are kept out of file names)
fname() { echo "$1" | tr ':,=' '_~+'; }
jobs_file=$(mktemp)
trap 'rm -f "$jobs_file"' EXIT
for n in "${order[@]}"; do
  for p in $BASE; do
    [ -s "$OUT/base/$n.$p" ] || echo "$n $p $OUT/base/$n.$p" >>"$jobs_file"
  done
  for p in "${CANDS[@]}"; do
    f="$OUT/cand/$n.$(fname "$p")"
    [ "${GRID_KEEP:-0}" = 1 ] && [ -s "$f" ] && continue
    echo "$n $p $f" >>"$jobs_file"
  done
done
start=$(date +%s.%N)
export ISOKV
run_one() {
  local spec=$2 out=$3 tr flags v
  tr=${4%%|*}; flags=${4#*|}
  # shellcheck disable=SC2086
  v=$("$ISOKV" sim "$tr" $flags --policy "$spec" --json |
      awk '$1 == "\"token_hit_ratio\":" { v = $2; sub(/,$/, "", v); print v; exit }')
  [ -n "$v" ] || { echo "policy_grid.sh: run failed: $1 $spec" >&2; return 1; }
  printf '%.4f\n' "$v" >"$out"
}
export -f run_one
while read -r n p f; do printf '%s\0%s\0%s\0%s\0' "$n" "$p" "$f" "${CELL[$n]}"; done <"$jobs_file" |
  xargs -0 -r -n 4 -P "$JOBS" bash -c 'run_one "$@"' _
end=$(date +%s.%N)

# the table
{
  printf 'cell'; for p in $BASE; do printf ' %s' "$p"; done
  for p in "${CANDS[@]}"; do printf ' %s' "$p"; done; printf '\n'
  for n in "${order[@]}"; do
    printf '%s' "$n"
    for p in $BASE; do printf ' %s' "$(cat "$OUT/base/$n.$p")"; done
    for p in "${CANDS[@]}"; do printf ' %s' "$(cat "$OUT/cand/$n.$(fname "$p")")"; done
    printf '\n'
  done
} | awk -v nbase="$(echo $BASE | wc -w)" -v online="$ONLINE" '
  NR == 1 { for (i = 2; i <= NF; i++) name[i] = $i; nf = NF
            printf "%-26s", "cell"; for (i = 2; i <= NF; i++) printf " %8.8s", $i
            for (i = nbase + 2; i <= NF; i++) printf " | rank gap%%"; printf "\n"; next }
  {
    printf "%-26s", $1
    for (i = 2; i <= NF; i++) printf " %8.4f", $i
    lru = $2; opt = $(nbase + 1); nonline = split(online, on, " ")
    for (i = nbase + 2; i <= NF; i++) {
      rank = 1; for (j = 2; j <= nonline + 1; j++) if ($j > $i) rank++
      gap = opt > lru ? 100 * ($i - lru) / (opt - lru) : 0
      printf " | %4d %4.0f", rank, gap
      cells[i]++; if (rank == 1) won[i]++
      if ($1 ~ /^weka/) { wgap[i] += gap; wn[i]++; if (gap >= 50) whalf[i]++ }
      best = 0; for (j = 2; j <= nonline + 1; j++) if ($j > best) best = $j
      d = $i - best; if (d < worst[i] || !(i in worst)) { worst[i] = d; wcell[i] = $1 }
    }
    printf "\n"
  }
  END {
    for (i = nbase + 2; i <= nf; i++)
      printf "%s: best online in %d of %d cells; WEKA gap closed mean %.0f%%, >= 50%% in %d of %d; worst cell %s (%+.4f vs best baseline)\n",
             name[i], won[i], cells[i], wn[i] ? wgap[i] / wn[i] : 0, whalf[i], wn[i], wcell[i], worst[i]
  }'
printf 'wall %.1f s, %d runs, %d jobs\n' "$(echo "$end - $start" | bc)" "$(wc -l <"$jobs_file")" "$JOBS" >&2
