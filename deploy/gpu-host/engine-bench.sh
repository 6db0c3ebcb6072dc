#!/usr/bin/env bash
# Run ON THE GPU HOST after build.sh (and `source deploy/gpu-host/env.sh`):
# writes a Llama-3-8B-shaped checkpoint with random BF16 weights, times
# Hugging Face transformers on it (tests/bench/hf_engine_bench.py), then
# `ballast bench-engine` on the same files, and prints the side-by-side table
# recorded in docs/benchmarks.md.
# Usage: deploy/gpu-host/engine-bench.sh [BUILD_DIR] [MODEL_DIR] [OUT_DIR]
set -euo pipefail
BUILD=${1:-/tmp/ballast-build}
MODEL=${2:-/tmp/llama3-8b-random}
OUT=${3:-.}
mkdir -p "$OUT"
if [ -f "$MODEL/config.json" ]; then CREATE=""; else CREATE="--create"; fi
python3 tests/bench/hf_engine_bench.py --model "$MODEL" $CREATE --out "$OUT/transformers.json"
"$BUILD/server/ballast" bench-engine --model "$MODEL" --hf-json "$OUT/transformers.json" \
  --out "$OUT/engine.json" ${BENCH_ENGINE_FLAGS:-}
