#!/usr/bin/env bash
# The synthetic users sweep (docs/synthetic.md): token hit ratio against the number of users N,
# for both prompt layouts, with and without each remedy (pins, chunk reuse, value eviction).
#
#   scripts/synthetic.sh [BUILD [OUTDIR]]        defaults: build, out/synthetic
#
# For each layout and N it writes a trace with `isokv gen` (OUTDIR/traces/, not in git) and
# replays it with `isokv sim --json` (order mode, one tier of CAPACITY tokens) under these
# configurations:
#   lru            plain prefix cache, LRU
#   lru+pin        --pin-public: each request's leading public blocks pinned
#   lru+chunk      --chunk-reuse: doc blocks hit at any position (R = 0.26 of their tokens
#                  recomputed: the sim's default, the engine's measured figure, docs/chunks.md)
#   value          --policy value: eviction by recompute value instead of recency
#   value+pin+chunk  all three remedies
#   unlimited      LRU with unlimited capacity: the ceiling of prefix reuse (no eviction)
#   unlimited+chunk  the same with chunk reuse
# Results: OUTDIR/NAME.csv, and plots OUTDIR/NAME-<layout>.{svg,png} (and NAME-layouts.{svg,png}
# comparing the two layouts when both are run). Knobs (environment): SYN_NAME (synthetic),
# SYN_USERS (list), SYN_LAYOUTS, SYN_CONFIGS (subsets of the lists above), SYN_REQUESTS,
# SYN_CAPACITY, SYN_JOBS, SYN_PLOT_ONLY=1 (redraw from an existing CSV), SYN_GEN (isokv gen flags; default "--block-tokens 64 --user-rate 4":
# every segment size is a multiple of 64, and load grows with users). Hit ratios are exact counts of a
# simulated replay; the only measured figure is the wall time printed at the end.
set -euo pipefail
BUILD=${1:-build}
OUT=${2:-out/synthetic}
ISOKV="$BUILD/isokv"
USERS=${SYN_USERS:-"10 100 1000 10000 100000"}
REQUESTS=${SYN_REQUESTS:-20000}
CAPACITY=${SYN_CAPACITY:-2M}
JOBS=${SYN_JOBS:-$(nproc)}
GENFLAGS=${SYN_GEN:-"--block-tokens 64 --user-rate 4"}
NAME=${SYN_NAME:-synthetic}
LAYOUTS=${SYN_LAYOUTS:-"personal-first shared-first"}
CONFIGS=${SYN_CONFIGS:-"lru lru+pin lru+chunk value value+pin+chunk unlimited unlimited+chunk"}

[ -x "$ISOKV" ] || { echo "synthetic.sh: $ISOKV not found (build first)" >&2; exit 1; }
RUNS="$OUT/runs-$NAME"
mkdir -p "$OUT/traces" "$RUNS"
rm -f "$RUNS"/*.csv
start=$(date +%s.%N)

csv="$OUT/$NAME.csv"
if [ "${SYN_PLOT_ONLY:-0}" != 1 ]; then
# 1. traces (cheap: ~0.2 s each)
for layout in $LAYOUTS; do
  for n in $USERS; do
    # shellcheck disable=SC2086
    "$ISOKV" gen -q -o "$OUT/traces/$NAME-$layout-$n.jsonl" --users "$n" --layout "$layout" \
      --requests "$REQUESTS" $GENFLAGS
  done
done

# 2. replays, JOBS at a time. One CSV line per run.
flags_of() {
  case "$1" in
    lru) echo "--policy lru --capacity-tokens $CAPACITY" ;;
    lru+pin) echo "--policy lru --capacity-tokens $CAPACITY --pin-public" ;;
    lru+chunk) echo "--policy lru --capacity-tokens $CAPACITY --chunk-reuse" ;;
    value) echo "--policy value --capacity-tokens $CAPACITY" ;;
    value+pin+chunk) echo "--policy value --capacity-tokens $CAPACITY --pin-public --chunk-reuse" ;;
    unlimited) echo "--policy lru --capacity-tokens unlimited" ;;
    unlimited+chunk) echo "--policy lru --capacity-tokens unlimited --chunk-reuse" ;;
  esac
}
# jget KEY FILE: the first numeric value of "KEY" in a cJSON-printed object
jget() { awk -v k="\"$1\":" '$1 == k { v = $2; sub(/,$/, "", v); print v; exit }' "$2"; }
run_one() {
  local layout=$1 n=$2 cfg=$3 j
  j=$(mktemp)
  # shellcheck disable=SC2046
  if ! "$ISOKV" sim "$OUT/traces/$NAME-$layout-$n.jsonl" --json $(flags_of "$cfg") >"$j"; then
    echo "synthetic.sh: replay failed: $layout $n $cfg" >&2
    rm -f "$j"
    return 1
  fi
  printf '%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n' "$layout" "$n" "$cfg" \
    "$(jget requests "$j")" "$(jget input_tokens "$j")" "$(jget token_hit_ratio "$j")" \
    "$(jget chunk_hit_tokens "$j")" "$(jget evictions "$j")" "$(jget thrash_ratio "$j")" \
    "$(jget pins "$j")" >"$RUNS/$layout-$n-$cfg.csv"
  rm -f "$j"
}
export -f run_one flags_of jget
export ISOKV OUT CAPACITY NAME RUNS
for layout in $LAYOUTS; do
  for n in $USERS; do
    for cfg in $CONFIGS; do echo "$layout $n $cfg"; done
  done
done | xargs -P "$JOBS" -L 1 bash -c 'run_one "$@"' _

{
  echo "layout,users,config,requests,input_tokens,token_hit_ratio,chunk_hit_tokens,evictions,thrash_ratio,pins"
  cat "$RUNS"/*.csv | sort -t, -k1,1 -k3,3 -k2,2n
} >"$csv"
fi # SYN_PLOT_ONLY

# 3. the table (users across, configurations down) and the plots
for layout in $LAYOUTS; do
  echo "token hit ratio, $layout layout ($REQUESTS requests, capacity $CAPACITY tokens, gen flags '$GENFLAGS'; simulated replay, order mode):"
  awk -F, -v L="$layout" -v users="$USERS" -v cfgs="$CONFIGS" '
    NR > 1 && $1 == L { r[$3 "," $2] = $6 }
    END {
      nu = split(users, U, " "); nc = split(cfgs, C, " ")
      printf "  %-16s", "users"; for (i = 1; i <= nu; i++) printf " %8s", U[i]; printf "\n"
      for (c = 1; c <= nc; c++) {
        printf "  %-16s", C[c]
        for (i = 1; i <= nu; i++) printf " %8.4f", r[C[c] "," U[i]]
        printf "\n"
      }
    }' "$csv"
done

if command -v gnuplot >/dev/null; then
  dat="$RUNS/plot"
  mkdir -p "$dat"
  for layout in $LAYOUTS; do
    for cfg in $CONFIGS; do
      awk -F, -v L="$layout" -v C="$cfg" 'NR > 1 && $1 == L && $3 == C { print $2, $6 }' "$csv" |
        sort -n >"$dat/$layout-$cfg.dat"
    done
  done
  style_of() { # gnuplot style and title of a configuration
    case "$1" in
      lru) echo "w lp lw 2 pt 7 lc 1 t 'lru'" ;;
      lru+pin) echo "w lp lw 2 pt 5 lc 2 t 'lru + pin public'" ;;
      lru+chunk) echo "w lp lw 2 pt 9 lc 3 t 'lru + chunk reuse'" ;;
      value) echo "w lp lw 2 pt 11 lc 4 t 'value'" ;;
      value+pin+chunk) echo "w lp lw 2 pt 13 lc 7 t 'value + pin + chunk'" ;;
      unlimited) echo "w l lw 1 dt 2 lc rgb 'black' t 'unlimited (lru ceiling)'" ;;
      unlimited+chunk) echo "w l lw 1 dt 3 lc rgb 'gray40' t 'unlimited + chunk'" ;;
    esac
  }
  # gpstr TEXT: TEXT as a gnuplot string expression that reads back as exactly its bytes and is
  # never code (the same encoding as isokv's cli_gp_string): printable ASCII other than the
  # single quote goes in single quotes (no backquote substitution there), every other byte is a
  # double-quoted octal escape, and the pieces are joined with gnuplot's '.' operator.
  gpstr() {
    printf '%s' "$1" | od -An -v -tu1 | LC_ALL=C awk '
      { for (i = 1; i <= NF; i++) {
          c = $i + 0
          if (c >= 32 && c < 127 && c != 39) {
            if (!o) { printf "%s\047", (n++ ? "." : ""); o = 1 }
            printf "%c", c
          } else {
            if (o) { printf "\047"; o = 0 }
            printf "%s\"\\%03o\"", (n++ ? "." : ""), c
          }
      } }
      END { if (o) printf "\047"; if (!n) printf "\047\047" }' | sed 's/^/(/; s/$/)/'
  }
  header() { # terminal, output, title
    printf '%s\nset output %s\n' "$1" "$(gpstr "$2")"
    printf 'set title (%s."\\n".%s."\\n".%s) noenhanced\n' "$(gpstr "$3")" \
      "$(gpstr "$REQUESTS requests, one $CAPACITY-token tier; simulated replay, order mode")" \
      "$(gpstr "isokv gen ${GENFLAGS:-(defaults)}")"
    printf '%s\n' "set xlabel 'users (N)'" "set ylabel 'token hit ratio'" "set logscale x" \
      "set yrange [0:1]" "set grid" "set key below noenhanced"
  }
  plot_layout() { # layout, terminal, output
    header "$2" "$3" "Synthetic workload, $1 layout: token hit ratio vs users"
    local sep="plot"
    for cfg in $CONFIGS; do
      printf '%s %s %s' "$sep" "$(gpstr "$dat/$1-$cfg.dat")" "$(style_of "$cfg")"
      sep=", "
    done
    echo
  }
  plot_layouts() { # terminal, output
    header "$1" "$2" "Synthetic workload: personal-first (filled, thick) vs shared-first (open, thin)"
    local sep="plot" last lw pt lc
    last=$(echo "$CONFIGS" | tr ' ' '\n' | grep -v unlimited | tail -1)
    for layout in $LAYOUTS; do
      for cfg in lru "$last"; do
        lw=3 pt=7 lc=1
        [ "$layout" = shared-first ] && lw=1 pt=6
        [ "$cfg" = lru ] || lc=7
        printf '%s %s w lp lw %s pt %s ps 1.5 lc %s t %s' "$sep" "$(gpstr "$dat/$layout-$cfg.dat")" \
          "$lw" "$pt" "$lc" "$(gpstr "$layout, $cfg")"
        sep=", "
      done
    done
    echo
  }
  svg="set terminal svg size 900,620 dynamic font 'sans,12'"
  png="set terminal png size 900,620"
  for layout in $LAYOUTS; do
    plot_layout "$layout" "$svg" "$OUT/$NAME-$layout.svg" | gnuplot
    plot_layout "$layout" "$png" "$OUT/$NAME-$layout.png" | gnuplot
    echo "plot: $OUT/$NAME-$layout.{svg,png}"
  done
  if [ "$(echo "$LAYOUTS" | wc -w)" -gt 1 ]; then
    plot_layouts "$svg" "$OUT/$NAME-layouts.svg" | gnuplot
    plot_layouts "$png" "$OUT/$NAME-layouts.png" | gnuplot
    echo "plot: $OUT/$NAME-layouts.{svg,png}"
  fi
fi
end=$(date +%s.%N)
# the file name goes to awk through the environment: never pasted into its program
CSV_NAME=$csv awk -v a="$start" -v b="$end" -v j="$JOBS" -v c="$(nproc)" \
  'BEGIN { printf "wrote %s; MEASURED wall time %.1f s with %d parallel jobs on %d cores\n", ENVIRON["CSV_NAME"], b - a, j, c }'
