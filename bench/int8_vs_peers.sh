#!/usr/bin/env bash
# isokv int8 vs llama.cpp Q8_0 vs llama2.c runq.c: decode and prefill tokens/s, side by side.
#
#   bench/int8_vs_peers.sh --llama-bin DIR --runq PATH [--isokv PATH] [--configs small,base]
#                          [--threads 1,2] [--groups 64,32] [--rounds 3] [--work DIR]
#
# Peers are binaries you built yourself, outside this repository (nothing is downloaded or
# built here): DIR holds llama.cpp's llama-bench, llama-convert-llama2c-to-ggml and
# llama-quantize (with their shared libraries); PATH is an executable built from llama2.c's
# runq.c (e.g. `gcc -Ofast -fopenmp -march=native runq.c -lm -o runqomp`, its Makefile's
# runqomp recipe). For each config: `isokv model init --config C --seed 1` (random weights) and
# its tokenizer, `isokv model quantize --group G` for each group G of --groups that divides the
# config's dim and hidden_dim (64 is export.py's default, fp32 scales: 1.0625 bytes a weight,
# Q8_0's size; `small`'s hidden 1376 allows 32 at most, 1.125 bytes), and the same fp32
# checkpoint converted to GGUF and quantized to Q8_0 by llama.cpp's tools (kept in --work,
# default /tmp/isokv_int8_bench, and reused when present). Then ROUNDS rounds; in each, for
# every config and thread count, one after the other (interleaved, so a busy machine slows all
# alike), per group G:
#   isokv prefill  `isokv bench engine --config C --q8 G --threads T --prefix 2048 --suffix 32
#                  --decode 1 --repeat 1 --json`: the cold 2080-token prompt (same weights,
#                  quantized in memory as isokv model quantize does);
#   isokv decode   the same with `--prefix 1 --suffix 15 --decode 128`: 128 steps after 16 tokens;
# then once for all groups:
#   llama.cpp      `llama-bench -m C.q8_0.gguf -p 2048 -n 128 -t T -r 1`: pp2048 and tg128;
#   runq.c         `OMP_NUM_THREADS=T runq C_q8_gG.bin -z tok_C.bin -t 0 -n 144 -i "Once upon a
#                  time"` (G the first group of the list the config allows): its "achieved
#                  tok/s" (it runs the prompt token by token, so that is its prefill rate too).
# Prints, per round, the figures and the 1-minute load average, then a table, one row per
# config, thread count and group: best / median of the rounds per cell, and the ratios
# isokv / llama.cpp of the best figures. All measured.
# Exits 0, 1 when a program fails, 2 on usage errors.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  sed -n '4,5p' "$0" | sed 's/^# *//' >&2
  exit "${1:-2}"
}
LB=""
RUNQ=""
ISOKV=build/isokv
CONFIGS=small,base
THREADS=1,2
QGROUPS=64,32
ROUNDS=3
WORK=/tmp/isokv_int8_bench
while [ $# -gt 0 ]; do
  case "$1" in
  --llama-bin) LB=${2:?--llama-bin needs a directory}; shift 2 ;;
  --runq) RUNQ=${2:?--runq needs a path}; shift 2 ;;
  --isokv) ISOKV=${2:?--isokv needs a path}; shift 2 ;;
  --configs) CONFIGS=${2:?--configs needs a list}; shift 2 ;;
  --threads) THREADS=${2:?--threads needs a list}; shift 2 ;;
  --groups) QGROUPS=${2:?--groups needs a list}; shift 2 ;;
  --rounds) ROUNDS=${2:?--rounds needs a number}; shift 2 ;;
  --work) WORK=${2:?--work needs a directory}; shift 2 ;;
  -h | --help) usage 0 ;;
  *) echo "int8_vs_peers: unknown argument '$1'" >&2; usage ;;
  esac
done
[ -n "$LB" ] && [ -n "$RUNQ" ] || { echo "int8_vs_peers: --llama-bin and --runq are required" >&2; usage; }
for b in llama-bench llama-convert-llama2c-to-ggml llama-quantize; do
  [ -x "$LB/$b" ] || { echo "int8_vs_peers: no executable $LB/$b" >&2; exit 2; }
done
[ -x "$RUNQ" ] || { echo "int8_vs_peers: '$RUNQ' is not an executable" >&2; exit 2; }
[ -x "$ISOKV" ] || { echo "int8_vs_peers: no isokv at '$ISOKV' (make build, or --isokv)" >&2; exit 2; }
case "$ROUNDS" in '' | *[!0-9]*) echo "int8_vs_peers: --rounds must be a number" >&2; exit 2 ;; esac
for g in ${QGROUPS//,/ }; do
  case "$g" in '' | *[!0-9]*) echo "int8_vs_peers: --groups must be numbers" >&2; exit 2 ;; esac
done
command -v python3 >/dev/null || { echo "int8_vs_peers: needs python3 (tables)" >&2; exit 2; }
ISOKV=$(cd "$(dirname "$ISOKV")" && pwd)/$(basename "$ISOKV")
RUNQ=$(cd "$(dirname "$RUNQ")" && pwd)/$(basename "$RUNQ")
mkdir -p "$WORK"
export LD_LIBRARY_PATH="$LB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# the checkpoints, made once; CG_<config> = the groups that config allows
for c in ${CONFIGS//,/ }; do
  if [ ! -s "$WORK/$c.q8_0.gguf" ] || [ ! -s "$WORK/$c.bin" ]; then
    echo "making $c checkpoints in $WORK" >&2
    "$ISOKV" model init --config "$c" --seed 1 -o "$WORK/$c.bin" --tokenizer-out "$WORK/tok_$c.bin" >/dev/null
    "$LB/llama-convert-llama2c-to-ggml" --copy-vocab-from-model "$WORK/tok_$c.bin" \
      --llama2c-model "$WORK/$c.bin" --llama2c-output-model "$WORK/$c.f32.gguf" >"$WORK/conv_$c.log" 2>&1
    "$LB/llama-quantize" "$WORK/$c.f32.gguf" "$WORK/$c.q8_0.gguf" Q8_0 >"$WORK/q_$c.log" 2>&1
  fi
  ok=""
  for g in ${QGROUPS//,/ }; do
    if [ -s "$WORK/${c}_q8_g$g.bin" ] ||
      "$ISOKV" model quantize "$WORK/$c.bin" -o "$WORK/${c}_q8_g$g.bin" --group "$g" >/dev/null 2>"$WORK/qz_${c}_$g.log"; then
      ok="$ok $g"
    else
      echo "$c: group $g skipped: $(cat "$WORK/qz_${c}_$g.log")" >&2
    fi
  done
  [ -n "$ok" ] || { echo "int8_vs_peers: no group of '$QGROUPS' fits $c" >&2; exit 1; }
  eval "CG_$c=\"$ok\""
done

OUT="$WORK/results.tsv"
: >"$OUT"
# rec ROUND CONFIG THREADS WHAT VALUE
rec() { printf '%s\t%s\t%s\t%s\t%s\n' "$@" >>"$OUT"; echo "  $4 $5"; }
load() { cut -d' ' -f1 /proc/loadavg; }
ikjson() { python3 -c 'import json,sys; print(json.load(sys.stdin)["rows"][0][sys.argv[1]])' "$1"; }

echo "nproc $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); start $(date -u +%H:%M:%S) UTC, load $(load)"
for r in $(seq "$ROUNDS"); do
  for c in ${CONFIGS//,/ }; do
    for t in ${THREADS//,/ }; do
      echo "round $r, $c, $t thread(s), load $(load)"
      rec "$r" "$c" "$t" load "$(load)"
      eval "gl=\$CG_$c"
      for g in $gl; do
        v=$("$ISOKV" bench engine --config "$c" --q8 "$g" --threads "$t" --prefix 2048 --suffix 32 \
          --decode 1 --repeat 1 --json | ikjson prefill_tok_s)
        rec "$r" "$c" "$t" "isokv_prefill_g$g" "$v"
        v=$("$ISOKV" bench engine --config "$c" --q8 "$g" --threads "$t" --prefix 1 --suffix 15 \
          --decode 128 --repeat 1 --json | ikjson decode_tok_s)
        rec "$r" "$c" "$t" "isokv_decode_g$g" "$v"
      done
      g1=${gl# }
      g1=${g1%% *}
      "$LB/llama-bench" -m "$WORK/$c.q8_0.gguf" -p 2048 -n 128 -t "$t" -r 1 -o csv 2>/dev/null |
        python3 -c 'import csv,sys
for x in csv.DictReader(sys.stdin):
    print(("llama_pp" if int(x["n_prompt"]) else "llama_tg"), x["avg_ts"])' >"$WORK/lb.txt"
      [ -s "$WORK/lb.txt" ] || { echo "int8_vs_peers: llama-bench failed" >&2; exit 1; }
      while read -r k v; do rec "$r" "$c" "$t" "$k" "$v"; done <"$WORK/lb.txt"
      v=$(OMP_NUM_THREADS=$t "$RUNQ" "$WORK/${c}_q8_g$g1.bin" -z "$WORK/tok_$c.bin" -t 0 -n 144 \
        -i "Once upon a time" 2>&1 >/dev/null | sed -n 's/.*achieved tok\/s: *//p')
      [ -n "$v" ] || { echo "int8_vs_peers: runq.c printed no tok/s" >&2; exit 1; }
      rec "$r" "$c" "$t" "runq_g$g1" "$v"
    done
  done
done
echo "end $(date -u +%H:%M:%S) UTC, load $(load)"
python3 - "$OUT" <<'EOF'
import sys, statistics as st
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
cells = {}
for r, c, t, k, v in rows:
    cells.setdefault((c, int(t), k), []).append(float(v))
names = ["isokv int8 prefill (2080)", "llama.cpp Q8_0 pp2048", "isokv int8 decode (128 after 16)",
         "llama.cpp Q8_0 tg128", "runq.c (same group)", "load avg (min-max)"]
print("\ntok/s, best / median of %d rounds; ratios best over best\n" % max(int(r[0]) for r in rows))
print("| config | threads | group | " + " | ".join(names) +
      " | prefill isokv / llama.cpp | decode isokv / llama.cpp |")
print("|" + " --- |" * (len(names) + 5))
fmt = lambda v: "%.0f / %.0f" % (max(v), st.median(v)) if v else "-"
best = lambda c, t, k: max(cells.get((c, t, k), [0]))
groups = sorted({int(k.split("_g")[1]) for _, _, k in cells if k.startswith("isokv_prefill_g")},
                reverse=True)
for (c, t) in sorted({(c, t) for c, t, _ in cells}, key=lambda x: (x[0] != "small", x[1])):
    for g in groups:
        if (c, t, "isokv_prefill_g%d" % g) not in cells: continue
        ld = cells.get((c, t, "load"), [0])
        out = [fmt(cells.get((c, t, k), [])) for k in
               ("isokv_prefill_g%d" % g, "llama_pp", "isokv_decode_g%d" % g, "llama_tg",
                "runq_g%d" % g)] + ["%.1f-%.1f" % (min(ld), max(ld))]
        lp, lt = best(c, t, "llama_pp"), best(c, t, "llama_tg")
        rp = best(c, t, "isokv_prefill_g%d" % g) / lp if lp else 0
        rd = best(c, t, "isokv_decode_g%d" % g) / lt if lt else 0
        print("| %s | %d | %d | %s | %.2f | %.2f |" % (c, t, g, " | ".join(out), rp, rd))
EOF
