#!/usr/bin/env bash
# make demo: the main job on bundled and generated data. Sections are added as modules land.
set -euo pipefail
BUILD=${1:-build}
cd "$(dirname "$0")/.."
mkdir -p out
"$BUILD/isokv" --help
