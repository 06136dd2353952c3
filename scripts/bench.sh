#!/usr/bin/env bash
# make bench: run every benchmark program under bench/, printing what each measured.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
for b in "$BUILD"/bench_*; do
  [ -x "$b" ] || continue
  echo "== $(basename "$b")"
  "$b"
done
