#!/usr/bin/env bash
# make fuzz: builds the libFuzzer harnesses of tests/fuzz with clang in a build directory of
# their own and runs each for FUZZ_SECONDS (default 60), starting from its checked-in corpus
# (tests/fuzz/corpus/NAME, never written) plus what earlier runs found (BUILD/corpus/NAME).
# Crashes land in BUILD/artifacts/NAME/; copy one to tests/fuzz/regress/NAME/ once fixed, so
# `make test-asan` replays it from then on. A summary line per harness (runs, exec/s, cov, ft)
# is printed; the full libFuzzer log is BUILD/logs/NAME.log. docs/fuzzing.md has the results.
#
#   scripts/fuzz.sh [BUILD] [NAME...]     env: FUZZ_SECONDS, JOBS
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-fuzz}
shift || true
secs=${FUZZ_SECONDS:-60}
all=(trace_mooncake trace_weka trace_segments checkpoint tokenizer policy_spec tier_spec plan_config)
names=("${@:-${all[@]}}")
command -v clang >/dev/null || { echo "fuzz: clang is needed (scripts/deps.sh installs it)" >&2; exit 1; }
CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Debug -DIKV_FUZZ=ON >/dev/null
env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS cmake --build "$build" -j "${JOBS:-$(nproc)}" \
  --target $(printf 'fuzz_%s ' "${names[@]}") >/dev/null
mkdir -p "$build/logs"
status=0
for n in "${names[@]}"; do
  case $n in
    checkpoint) maxlen=16384 ;;
    trace_*|tokenizer) maxlen=8192 ;;
    *) maxlen=1024 ;;
  esac
  mkdir -p "$build/corpus/$n" "$build/artifacts/$n"
  log="$build/logs/$n.log"
  set +e
  OPENBLAS_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    "$build/tests/fuzz/fuzz_$n" -max_total_time="$secs" -max_len="$maxlen" -timeout=10 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix="$build/artifacts/$n/" \
    "$build/corpus/$n" "tests/fuzz/corpus/$n" >"$log" 2>&1
  rc=$?
  set -e
  last=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
  rate=$(grep -E 'stat::average_exec_per_sec' "$log" | awk '{print $2}' || true)
  if [ $rc -ne 0 ]; then
    status=1
    echo "fuzz $n: FAILED (exit $rc) after ${secs}s; see $log and $build/artifacts/$n/"
    grep -E 'ERROR|SUMMARY|runtime error' "$log" | head -5 || true
  else
    echo "fuzz $n: ${secs}s, ${rate:-?} exec/s; $last"
  fi
done
exit $status
