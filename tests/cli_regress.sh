#!/usr/bin/env bash
# CLI regressions (issue 9): each check is named after the defect it pins, runs the isokv binary
# (or a bench program) and checks the exit code and the message. Registered with CTest as
# cli_regressions; run by hand as tests/cli_regress.sh build/isokv build/bench_index
# build/bench_engine build/bench_batch build/bench_semantic build/bench_store build/bench_tier_q8
# build/bench_q8_quality build/bench_serve. The exit-code rule everywhere: 0 ok, 1 the input or I/O failed, 2 usage
# (unknown option, malformed value, unknown policy/parameter/model name); --help exits 0.
set -u
cd "$(dirname "$0")/.."
BIN=${1:-build/isokv}
BENCH_INDEX=${2:-build/bench_index}
BENCH_ENGINE=${3:-build/bench_engine}
BENCH_BATCH=${4:-build/bench_batch}
BENCH_SEMANTIC=${5:-build/bench_semantic}
BENCH_STORE=${6:-build/bench_store}
BENCH_TIER_Q8=${7:-build/bench_tier_q8}
BENCH_Q8_QUALITY=${8:-build/bench_q8_quality}
BENCH_SERVE=${9:-build/bench_serve}
TMP=$(mktemp -d /tmp/ikv_cli_regress.XXXXXX)
trap 'rm -rf "$TMP"' EXIT
MOON=tests/data/mooncake_conv_300.jsonl
MODEL=data/models/stories260K/stories260K.bin
fails=0

# check NAME WANT_RC WANT_TEXT CMD...: WANT_TEXT must appear in stdout+stderr ("" = any);
# a WANT_TEXT starting with '!' must NOT appear.
check() {
  local name=$1 want=$2 text=$3
  shift 3
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  local ok=1
  [ "$rc" -eq "$want" ] || ok=0
  if [ -n "$text" ]; then
    if [ "${text:0:1}" = "!" ]; then
      case $out in *"${text:1}"*) ok=0 ;; esac
    else
      case $out in *"$text"*) ;; *) ok=0 ;; esac
    fi
  fi
  if [ $ok = 1 ]; then
    echo "ok   $name"
  else
    echo "FAIL $name: exit $rc (want $want), want text '$text'; output:"
    printf '%s\n' "$out" | head -5 | sed 's/^/     /'
    fails=$((fails + 1))
  fi
}

# --help exits 0 everywhere
for sub in "gen" "sim" "sim sweep" "plan" "plan route" "model" "model init" "run" "bench" \
           "bench engine" "help"; do
  # shellcheck disable=SC2086
  check "help_exits_0_${sub// /_}" 0 "usage" $BIN $sub --help
done
check help_exits_0_bench_index 0 "usage" "$BENCH_INDEX" --help
check help_exits_0_bench_engine 0 "usage" "$BENCH_ENGINE" --help

# unknown trailing flags are "unknown option", not "needs a value"
check run_unknown_trailing_flag 2 "unknown option '--bogus'" $BIN run --model "$MODEL" --prompt hi --bogus
check bench_unknown_trailing_flag 2 "unknown option '--bogus'" $BIN bench engine --json --bogus
check model_unknown_flag 2 "unknown option '--bogus'" $BIN model init --config tiny --bogus
check model_flag_needs_value 2 "needs a value" $BIN model init --config tiny -o
check sim_unknown_flag 2 "unknown option '--bogus'" $BIN sim "$MOON" --bogus
check gen_unknown_flag 2 "unknown option '--bogus'" $BIN gen -o "$TMP/g.jsonl" --bogus
check plan_unknown_flag 2 "unknown option '--bogus'" $BIN plan --bogus
check bench_index_unknown_flag 2 "unknown option '--bogus'" "$BENCH_INDEX" --bogus
check bench_index_bad_count 2 "not a count" "$BENCH_INDEX" --ops 1x
check bench_index_unknown_policy 2 "unknown policy" "$BENCH_INDEX" --policy nosuch --ops 1
check bench_engine_bad_count 2 "bad count '0'" "$BENCH_ENGINE" small 0
check bench_engine_unknown_config 2 "unknown model config" "$BENCH_ENGINE" nosuch

# unknown policy / parameter / model names are usage errors
check sim_unknown_policy_param 2 "" $BIN sim "$MOON" --policy lru:bogus=1
check sweep_unknown_policy_param 2 "unknown parameter 'bogus'" $BIN sim sweep "$MOON" --vary max-requests=10,20 --policy lru,value:bogus=1 --out "$TMP/sw" --no-plot
check run_unknown_policy 2 "unknown eviction policy 'nosuch'" $BIN run --model "$MODEL" --prompt hi --policy nosuch
check plan_unknown_model 2 "unknown model 'gpt-9'" $BIN plan --model gpt-9
check plan_unknown_parameter 2 "unknown parameter" $BIN plan --set nosuch=1
check bench_unknown_config 2 "unknown model config 'nosuch'" $BIN bench engine --config nosuch
echo '{"nosuch": 1}' >"$TMP/plan.json"
check plan_config_deep_nesting 1 "JSON nested deeper than 1000 levels" $BIN plan --config tests/fuzz/regress/plan_config/deep_nesting.json
check plan_config_unknown_parameter_is_input 1 "unknown parameter 'nosuch'" $BIN plan --config "$TMP/plan.json"

# numbers take the same k/M/G suffixes everywhere
check sim_suffixes 0 "requests             100" $BIN sim "$MOON" --max-requests 0.1k --seed 1k
check run_suffixes 0 "" $BIN run --model "$MODEL" --prompt hi -n 2 --seed 1k --kv-mem 64M
check plan_suffixes 0 "prompt 2000, output 1000" $BIN plan --prompt 2k --output 1k
check version_unknown_flag 2 "unknown option '--bogus'" $BIN version --bogus
check gen_rejects_typo 2 "bad value '12x'" $BIN gen -o "$TMP/g.jsonl" --users 12x

# messages
check run_tokenizer_directory 1 ".: is a directory, not a tokenizer file" $BIN run --model "$MODEL" --tokenizer . --prompt hi
check run_model_directory 1 ".: is a directory, not a checkpoint file" $BIN run --model . --prompt hi
check run_kv_mem_beyond_memory 1 "is more than this machine's" $BIN run --model "$MODEL" --prompt hi --kv-mem 100T
check bench_decode_0 2 "--decode must be at least 1" $BIN bench engine --decode 0
check bench_prefix_0 2 "--prefix must be at least 1" $BIN bench engine --prefix 0
check plan_params_no_issue 0 "!issue" $BIN plan --params
check sim_tokens_print_1M 0 "(1M tokens)" $BIN sim "$MOON" --capacity-tokens 999936
check sim_tokens_never_exponent 0 "!e+03k" $BIN sim "$MOON" --capacity-tokens 999936

# resource amplification and ranges
check sim_thrash_window_10G 2 "--thrash-window: at most 4294967294 blocks" $BIN sim "$MOON" --thrash-window 10G
check sim_thrash_window_1G_runs 0 "within the next 1000000000 drops" $BIN sim "$MOON" --capacity-tokens 100k --thrash-window 1G
check sim_max_request_tokens 1 "more than the limit of 1000 tokens (--max-request-tokens)" $BIN sim "$MOON" --strict --max-request-tokens 1000
check sim_tiers_slower_first 2 "comes after the slower 'dram'" $BIN sim "$MOON" --tiers dram=1M,hbm=100k
check sim_tiers_duplicate 2 "tier 'hbm' is given twice" $BIN sim "$MOON" --tiers hbm=1M,hbm=100k
check gen_block_65536 2 "1..65535" $BIN gen -o "$TMP/g.jsonl" --block-tokens 65536

# parser defects, end to end
printf '{"timestamp": -1, "input_length": 1, "output_length": 1, "hash_ids": [0]}\n{"timestamp": 1}\n' >"$TMP/bad.jsonl"
check sim_all_malformed_names_file 1 "$TMP/bad.jsonl: no valid request to replay: 2 malformed lines skipped; the first: $TMP/bad.jsonl:1:" \
  $BIN sim "$TMP/bad.jsonl" --format mooncake
check sim_weka_zero_requests 1 "the conversation has no requests" $BIN sim tests/fuzz/regress/trace_weka/zero_requests.jsonl
check sim_nul_byte_strict 1 ":2: NUL byte at column" $BIN sim tests/fuzz/regress/trace_mooncake/nul_byte.jsonl --strict
check sim_trailing_strict 1 ":2: trailing content after the JSON object" $BIN sim tests/fuzz/regress/trace_mooncake/trailing_content.jsonl --strict
check sim_deep_nesting 1 "JSON nested deeper than 1000 levels" $BIN sim tests/fuzz/regress/trace_segments/deep_first_line.jsonl

# every bench program: --help prints usage and exits 0 (and runs nothing), an unknown option is
# "unknown option" exit 2, a flag without its value is "needs a value" exit 2 (never ignored)
for b in "$BENCH_BATCH" "$BENCH_SEMANTIC" "$BENCH_STORE" "$BENCH_TIER_Q8" "$BENCH_Q8_QUALITY" \
         "$BENCH_SERVE"; do
  n=$(basename "$b")
  check "help_exits_0_$n" 0 "usage: $n" "$b" --help
  check "${n}_help_runs_nothing" 0 "!measured" "$b" --help
  check "${n}_unknown_flag" 2 "unknown option '--bogus'" "$b" --bogus
done
check bench_semantic_unknown_flag_after_cmd 2 "unknown option '--bogus'" "$BENCH_SEMANTIC" lookup --bogus
check bench_semantic_trailing_flag 2 "option '-n' needs a value" "$BENCH_SEMANTIC" lookup -n
check bench_semantic_pairs_no_file 2 "pairs needs a FILE" "$BENCH_SEMANTIC" pairs
check bench_semantic_no_cmd 2 "want pairs, latency or lookup" "$BENCH_SEMANTIC" --config tiny
check bench_store_trailing_flag 2 "option '--mb' needs a value" "$BENCH_STORE" --mb
check bench_store_bad_mb 2 "--mb wants 1..4096" "$BENCH_STORE" --mb 0
check bench_tier_q8_trailing_flag 2 "option '--len' needs a value" "$BENCH_TIER_Q8" --len
check bench_tier_q8_bad_len 2 "--len 32..4000" "$BENCH_TIER_Q8" --len 1
check bench_serve_trailing_flag 2 "option '--streams' needs a value" "$BENCH_SERVE" --streams
check bench_serve_unknown_after_valid 2 "unknown option '--bogus'" "$BENCH_SERVE" --requests 1 --bogus
check bench_serve_url_not_loopback 2 "loopback only" "$BENCH_SERVE" --url http://10.0.0.1:8080
check bench_serve_url_no_port 2 "loopback only" "$BENCH_SERVE" --url http://127.0.0.1
check bench_serve_url_bad_port 2 "loopback only" "$BENCH_SERVE" --url http://127.0.0.1:99999
check bench_serve_bad_sizes 2 "bad sizes" "$BENCH_SERVE" --requests 0
check bench_batch_too_many 2 "too many arguments" "$BENCH_BATCH" small 1 64 24 5
check bench_batch_bad_config 2 "bad argument" "$BENCH_BATCH" nosuch
check bench_q8_quality_few_args 2 "wants 3 to 5 arguments" "$BENCH_Q8_QUALITY" "$MODEL"
check bench_q8_quality_missing_model 1 "" "$BENCH_Q8_QUALITY" "$TMP/none.bin" "$TMP/none.tok" 32

# long-context checkpoints for scaled traces (docs/load.md): --seq-len sets the context only,
# out of range is a usage error; serve --block-tokens is range-checked before the model loads
check model_init_seq_len 0 "wrote" $BIN model init --config tiny --seq-len 4096 -o "$TMP/l.bin"
check model_info_seq_len 0 "seq_len 4096" $BIN model info "$TMP/l.bin"
check model_init_seq_len_zero 2 "--seq-len '0'" $BIN model init --config tiny --seq-len 0 -o "$TMP/z.bin"
check serve_block_tokens_zero 2 "--block-tokens 0 is not in 1..4096" $BIN serve --block-tokens 0
check sim_service_needs_timed 2 "--service trace needs --mode timed" $BIN sim $MOON --service trace
check sim_service_bad 2 "--service must be trace or model" $BIN sim $MOON --mode timed --service x
check sim_service_no_times 1 "no measured ttft_s" $BIN sim $MOON --mode timed --service trace

if [ $fails -ne 0 ]; then
  echo "cli regressions: $fails FAILED"
  exit 1
fi
echo "cli regressions: all passed"
