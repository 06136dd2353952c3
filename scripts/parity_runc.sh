#!/usr/bin/env bash
# Greedy parity of `isokv run` with llama2.c's reference run.c.
#
#   scripts/parity_runc.sh RUNC [--model M.bin --tokenizer T.bin] [--isokv PATH] [--threads 1,2]
#                          [--save DIR]
#
# RUNC is a run.c you obtained yourself: either an executable built from it, or the source
# file, which is then compiled into a temporary directory with `cc -O2 ... -lm` (nothing is
# downloaded; this repository ships no copy of run.c). Both versions of run.c's command line
# work (-t, -n, -i, -z).
#
# Without --model: for seeds 1 and 2, a `stories15m`-shaped checkpoint with deterministic random
# weights, tied and separate classifier, plus the matching synthetic tokenizer (isokv model
# init), and three prompts (one with a non-ASCII character that goes through byte fallback).
# With --model/--tokenizer (e.g. the real stories15M.bin and tokenizer.bin): that pair, with the
# same prompts. For each case and each isokv thread count: run.c greedy (-t 0) for all seq_len
# positions, and a short run of 40 positions, against `isokv run --temp 0` with the equivalent
# -n (isokv counts generated tokens, run.c positions from BOS: run.c -n S is isokv -n S-P+1 for
# a prompt of P tokens with BOS, see isokv_n below); stdout must be byte-identical.
# --save DIR also stores run.c's outputs as DIR/case<K>.txt with DIR/cases.tsv (file, isokv -n,
# run.c -n, prompt; tab-separated): the expected outputs a test replays without run.c
# (tests/data/runc-stories260K/ was made this way, see its README).
# Exits 0 when every case matches, 1 on any mismatch (showing where), 2 on usage errors.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
  sed -n '4,5p' "$0" | sed 's/^# *//' >&2
  exit 2
}

RUNC=""
MODEL=""
TOK=""
ISOKV=build/isokv
THREADS=1,2
SAVE=""
while [ $# -gt 0 ]; do
  case "$1" in
  --model) MODEL=${2:?--model needs a path}; shift 2 ;;
  --tokenizer) TOK=${2:?--tokenizer needs a path}; shift 2 ;;
  --isokv) ISOKV=${2:?--isokv needs a path}; shift 2 ;;
  --threads) THREADS=${2:?--threads needs a list}; shift 2 ;;
  --save) SAVE=${2:?--save needs a directory}; shift 2 ;;
  -h | --help) usage ;;
  -*) echo "parity_runc: unknown option '$1'" >&2; usage ;;
  *) [ -z "$RUNC" ] || { echo "parity_runc: one RUNC path only" >&2; usage; }; RUNC=$1; shift ;;
  esac
done
if [ -z "$RUNC" ]; then
  echo "parity_runc: give the path of llama2.c's run.c (source or binary); none is bundled" >&2
  usage
fi
if [ ! -e "$RUNC" ]; then
  echo "parity_runc: '$RUNC' does not exist (build or obtain llama2.c's run.c first)" >&2
  exit 2
fi
if [ -n "$MODEL" ] && [ -z "$TOK" ] || [ -z "$MODEL" ] && [ -n "$TOK" ]; then
  echo "parity_runc: --model and --tokenizer go together" >&2
  exit 2
fi
for f in "$MODEL" "$TOK"; do
  if [ -n "$f" ] && [ ! -r "$f" ]; then echo "parity_runc: cannot read '$f'" >&2; exit 2; fi
done
if [ ! -x "$ISOKV" ]; then
  echo "parity_runc: no isokv binary at '$ISOKV' (run 'make build' or pass --isokv)" >&2
  exit 2
fi

TMP=$(mktemp -d /tmp/isokv_parity_XXXXXX)
trap 'rm -rf "$TMP"' EXIT
RUN="$RUNC"
case "$RUNC" in
*.c)
  if ! cc -O2 -o "$TMP/run" "$RUNC" -lm 2>"$TMP/cc.log"; then
    echo "parity_runc: cannot compile '$RUNC':" >&2
    cat "$TMP/cc.log" >&2
    exit 2
  fi
  RUN="$TMP/run"
  ;;
*)
  if [ ! -x "$RUNC" ]; then echo "parity_runc: '$RUNC' is not executable" >&2; exit 2; fi
  ;;
esac

PROMPTS=("" "Once upon a time" "The little dog ran to the park." "Zoë had a red ball")
if [ -n "$SAVE" ]; then
  mkdir -p "$SAVE"
  printf '# file\tisokv -n\trun.c -n\tprompt (made by scripts/parity_runc.sh --save)\n' >"$SAVE/cases.tsv"
fi
saved=0

# isokv_n S P: the isokv -n (generated tokens) equal to run.c's -n S (positions from BOS, the
# last one sampled but not run) for a prompt of P tokens including BOS: run.c runs positions
# 0..S-1 and samples at every one from P-1 on, S-P+1 tokens.
isokv_n() { echo $(($1 - $2 + 1)); }

# save FILE ISOKV_N RUNC_N PROMPT: keeps one run.c output as an expected output
save() {
  [ -n "$SAVE" ] || return 0
  saved=$((saved + 1))
  cp "$1" "$SAVE/case$saved.txt"
  printf 'case%s.txt\t%s\t%s\t%s\n' "$saved" "$2" "$3" "$4" >>"$SAVE/cases.tsv"
}
fails=0
cases=0

# compare NAME A B: byte comparison of two outputs; on mismatch shows the first differing byte.
compare() {
  cases=$((cases + 1))
  if cmp -s "$2" "$3"; then
    echo "  same  $1 ($(wc -c <"$2") bytes)"
    return
  fi
  fails=$((fails + 1))
  local at
  at=$(cmp "$2" "$3" 2>&1 | grep -o 'byte [0-9]*' | grep -o '[0-9]*' || true)
  at=${at:-$(($(wc -c <"$2") < $(wc -c <"$3") ? $(wc -c <"$2") : $(wc -c <"$3")))}
  local from=$((at > 60 ? at - 60 : 0))
  echo "  DIFF  $1: first difference at byte ${at}"
  echo "        run.c: ...$(tail -c +$((from + 1)) "$2" | head -c 120 | tr '\n' '|')"
  echo "        isokv: ...$(tail -c +$((from + 1)) "$3" | head -c 120 | tr '\n' '|')"
}

# check LABEL MODEL TOKENIZER
check() {
  local label=$1 m=$2 t=$3 seq i=0
  seq=$("$ISOKV" model info "$m" | sed -n 's/.*seq_len \([0-9]*\).*/\1/p')
  for p in "${PROMPTS[@]}"; do
    i=$((i + 1))
    "$RUN" "$m" -z "$t" -t 0 -n "$seq" -i "$p" >"$TMP/rc_full.txt" 2>/dev/null
    "$RUN" "$m" -z "$t" -t 0 -n 40 -i "$p" >"$TMP/rc_40.txt" 2>/dev/null
    local np="" th
    for th in ${THREADS//,/ }; do
      # -n beyond seq_len: isokv stops when the sequence is full, as run.c does
      "$ISOKV" run --model "$m" --tokenizer "$t" --prompt "$p" --temp 0 --threads "$th" \
        -n "$seq" >"$TMP/ik_full.txt" 2>"$TMP/ik.err"
      np=$(sed -n 's/.*prompt \([0-9]*\) tokens.*/\1/p' "$TMP/ik.err")
      "$ISOKV" run --model "$m" --tokenizer "$t" --prompt "$p" --temp 0 --threads "$th" \
        -n "$(isokv_n 40 "$np")" >"$TMP/ik_40.txt" 2>/dev/null
      compare "$label, prompt $i ($np tokens), $th thread(s), all $seq positions" \
        "$TMP/rc_full.txt" "$TMP/ik_full.txt"
      compare "$label, prompt $i, $th thread(s), run.c -n 40 = isokv -n $(isokv_n 40 "$np")" \
        "$TMP/rc_40.txt" "$TMP/ik_40.txt"
    done
    save "$TMP/rc_full.txt" "$seq" "$seq" "$p"
    save "$TMP/rc_40.txt" "$(isokv_n 40 "$np")" 40 "$p"
  done
}

echo "greedy parity, run.c ($RUNC) against $ISOKV"
if [ -n "$MODEL" ]; then
  check "$(basename "$MODEL")" "$MODEL" "$TOK"
else
  for seed in 1 2; do
    "$ISOKV" model init --config stories15m --seed "$seed" -o "$TMP/m.bin" \
      --tokenizer-out "$TMP/tok.bin" >/dev/null
    check "stories15m seed $seed tied" "$TMP/m.bin" "$TMP/tok.bin"
    "$ISOKV" model init --config stories15m --seed "$seed" --classifier separate \
      -o "$TMP/m.bin" >/dev/null
    check "stories15m seed $seed separate" "$TMP/m.bin" "$TMP/tok.bin"
  done
fi
echo "$((cases - fails)) of $cases outputs identical"
[ -z "$SAVE" ] || echo "saved $saved run.c outputs and $SAVE/cases.tsv"
[ "$fails" -eq 0 ]
