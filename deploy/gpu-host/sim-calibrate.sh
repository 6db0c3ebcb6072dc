#!/usr/bin/env bash
# Issue 20's engine-model calibration on the GPU host: build, then
# `ballast bench-engine` over Llama-3.2-1B, Llama-3.2-3B and Llama-3-8B
# shapes (random BF16 weights from make-model), decode batches x KV
# contexts and one prefill per context, BF16 KV, plus FP8 KV for 8B.
# Each shape's runs go to OUT/calib-<shape>.jsonl (one bench-engine JSON
# per line); `configs/sim/calibration-<card>.json` is built from them by
# scripts/sim-calibration.py. OUT/calib-<shape>-concurrent.jsonl holds
# decode steps of 2 or 4 copies of the shape stepping at once.
# OUT/calib-<shape>-large.jsonl holds decode steps of 512 and 1,024
# sequences (contexts 256 and 1024, where the KV fits the card), where the
# GEMMs are bound by compute, not by reading the weights.
# OUT/calib-<shape>-prompts.jsonl holds prefill steps of many short prompts,
# OUT/calib-<shape>-mixed.jsonl chunked-prefill steps (bench-engine --mixed).
# OUT/calib-<shape>-buckets.jsonl holds decode steps at the CUDA graphs'
# row buckets between powers of two (320 ... 960 sequences, contexts
# spread around 200), where cuBLASLt's heuristic picks differ from those
# at powers of two.
# OUT/calib-<shape>-small.jsonl holds short chunks (48-504 tokens: a
# prompt's last chunk, a short prompt), alone and beside 8 or 16 decodes.
# SHAPES picks shapes (default: 1b 3b 8b); LARGE_ONLY=1 runs only the
# large batches, PREFILL_ONLY=1 only the many-prompt and mixed prefills,
# SMALL_ONLY=1 only the short chunks,
# BUCKETS_ONLY=1 only the graph buckets (adding them to an earlier run's
# OUT).
# Usage (repository root, GPU host): deploy/gpu-host/sim-calibrate.sh OUT_DIR
set -euo pipefail
OUT=${1:?output directory}
BUILD=${BUILD:-/tmp/bb}
mkdir -p "$OUT"
if [ ! -x "$BUILD/server/ballast" ]; then
  GENERATOR="Unix Makefiles" TARGETS="ballast" bash deploy/gpu-host/build.sh .gpu-debs "$BUILD" \
    > "$OUT/build.log" 2>&1
fi
source deploy/gpu-host/env.sh
B="$BUILD/server/ballast"
shape_args() {
  case "$1" in
    1b) echo "--layers 16 --hidden 2048 --intermediate 8192 --heads 32 --kv-heads 8 --tie-embeddings" ;;
    3b) echo "--layers 28 --hidden 3072 --intermediate 8192 --heads 24 --kv-heads 8 --tie-embeddings" ;;
    8b) echo "--layers 32 --hidden 4096 --intermediate 14336 --heads 32 --kv-heads 8" ;;
  esac
}
for s in ${SHAPES:-1b 3b 8b}; do
  M=/tmp/sim-m$s
  if [ ! -f "$M/config.json" ]; then
    # shellcheck disable=SC2046
    "$B" make-model --out "$M" $(shape_args "$s") --vocab 128256 --max-position 16384 \
      --llama3-rope-scaling --init-std 0.02 --threads 16 > /dev/null
  fi
  FILE="$OUT/calib-$s.jsonl"
  run() {  # context prefill batches [extra flags]; non-zero if bench-engine failed
    local ctx=$1 pre=$2 batches=$3; shift 3
    "$B" bench-engine --model "$M" --context "$ctx" --prefill "$pre" --batches "$batches" \
      --steps 16 --warmup 3 "$@" --out /tmp/sim-run.json >> "$OUT/summary.txt" 2>&1 || {
      echo "bench-engine failed (context $ctx, batches $batches): not recorded" >> "$OUT/summary.txt"
      return 1
    }
    python3 -c 'import json,sys; print(json.dumps(json.load(open("/tmp/sim-run.json"))))' \
      >> "$FILE"
  }
  echo "== $s" >> "$OUT/summary.txt"
  # Short chunks: each over a prefix as long, alone and beside 8 or 16
  # decodes at context 256, sized so that a step's rows (B + C) are a
  # multiple of 128, as scripts/sim-calibration.py keeps mixed steps
  # (all but the smallest, 64 rows, which counts alone only).
  if [ "${SMALL_ONLY:-0}" = 1 ]; then
    FILE="$OUT/calib-$s-small.jsonl"
    : > "$FILE"
    run 256 0 8 --mixed 56,120,248,376,504 || true
    run 256 0 16 --mixed 48,112,240,368,496 || true
    continue
  fi
  if [ "${LARGE_ONLY:-0}" != 1 ] && [ "${PREFILL_ONLY:-0}" != 1 ] && [ "${BUCKETS_ONLY:-0}" != 1 ]; then
    : > "$FILE"
    run 256 512 1,8,32,128,256
    run 1024 2048 1,8,32,128,256
    run 4096 8192 1,8,32,64
    [ "$s" = 8b ] && run 1024 2048 1,32,128 --kv-dtype fp8_e4m3
    # Several copies stepping at once (one thread each): how far concurrent
    # small steps overlap on the device, which one model at a time does not
    # measure (the simulator's rolling steps, docs/benchmarks.md). Kept
    # apart in calib-<shape>-concurrent.jsonl (one line per copy count):
    # 2 and 4 copies of 1b and 3b, 2 of 8b.
    : > "$OUT/calib-$s-concurrent.jsonl"
    copies="2 4"
    [ "$s" = 8b ] && copies=2
    for n in $copies; do
      "$B" bench-engine --model "$M" --context 1024 --prefill 0 --batches 1,4,8,32,128 --steps 16 \
        --warmup 3 --concurrent-models "$n" --out /tmp/sim-run.json >> "$OUT/summary.txt" 2>&1 || {
        # (an 80 GB card holds 2 copies of 3b beside their KV, not 4)
        echo "bench-engine failed ($n copies): not recorded" >> "$OUT/summary.txt"
        continue
      }
      python3 -c 'import json,sys; print(json.dumps(json.load(open("/tmp/sim-run.json"))))' \
        >> "$OUT/calib-$s-concurrent.jsonl"
    done
  fi
  # Prefill steps of many short prompts (a server's first steps), not one
  # long one: calib-<shape>-prompts.jsonl, 8,192 tokens as 32 prompts and
  # 2,048 as 16 (scripts/sim-calibration.py reads their prefill only).
  # Chunked prefill: calib-<shape>-mixed.jsonl, chunks of 512, 2,048 and
  # 7,168 tokens over a prefix as long, alone and beside 32, 256 or 1,000
  # decodes at context 256 (sim-calibration.py's MIXED_CONTEXT).
  # PREFILL_ONLY=1 runs only these (adding them to an earlier run's OUT).
  if [ "${LARGE_ONLY:-0}" != 1 ] && [ "${BUCKETS_ONLY:-0}" != 1 ]; then
    FILE="$OUT/calib-$s-prompts.jsonl"
    : > "$FILE"
    run 16 8192 1 --prefill-prompts 32 || true
    run 16 2048 1 --prefill-prompts 16 || true
    FILE="$OUT/calib-$s-mixed.jsonl"
    : > "$FILE"
    run 256 0 32,256,1000 --mixed 512,2048,7168 || true
  fi
  [ "${PREFILL_ONLY:-0}" = 1 ] && continue
  # Decode steps at the graph buckets between powers of two (engine/
  # graph_buckets.h: multiples of 64 past 256), contexts spread as a
  # server's (log-normal, sigma 0.8, mean 200): calib-<shape>-buckets.jsonl.
  if [ "${LARGE_ONLY:-0}" != 1 ]; then
    FILE="$OUT/calib-$s-buckets.jsonl"
    : > "$FILE"
    run 200 0 320,384,448,576,640,704,768,832,896,960 --context-sigma 0.8 || true
  fi
  [ "${BUCKETS_ONLY:-0}" = 1 ] && continue
  # Large batches last (scripts/sim-calibration.py's RUNS_LARGE order). At
  # context 1024 the KV of 1,024 sequences fits only for 1b; where a card
  # lacks the memory even for 512 (an 80 GB card, 8b), the runs stop there
  # and the file keeps the ones before.
  FILE="$OUT/calib-$s-large.jsonl"
  : > "$FILE"
  if run 256 0 512,1024; then
    if [ "$s" = 1b ]; then run 1024 0 512,1024 || true; else run 1024 0 512 || true; fi
  fi
done
tail -40 "$OUT/summary.txt"
