#!/usr/bin/env bash
# Issue 20's remapping validation on the GPU host (docs/benchmarks.md,
# "Where the remapping run's time goes"): the seed-7 bursty trace (258
# requests) replayed by sim-validate.sh against four Llama-3-8B-shaped BF16
# models on one GPU limited to 72 GiB, rolling steps, once per mode of
# MODES, one daemon per mode. Compare with
#   ballast simulate --config configs/sim/remap-validate-h200.yaml \
#     --policy off|remap --trace OUT/<mode>/v/trace.jsonl --rate-scale 2,4
# Env: MODES ("true false": node.memory.remap.enabled, one run each),
# RATES ("2 4"), SLOW_STEP_MS (0; 0.001 logs every step for
# scripts/step-log.py), LOG_ARBITRATION (false; true for
# scripts/arbitration-timeline.py), LIMIT (seconds per mode, 420), BUILD (a folder with
# server/ballast; default: the ballast on PATH, as prebuilt.sh run puts it).
# Writes OUT/<mode>/v.tgz (sim-validate.sh's folder, requests CSVs kept)
# and OUT/<mode>/serve.log.xz; prints each run's report and the node's
# remapping, compaction and preemption counters.
# Usage (repository root, GPU host): deploy/gpu-host/remap-validate.sh OUT
set -uo pipefail
OUT=${1:?output directory}
cd "$(dirname "$0")/../.." || exit 1
if [ -z "${BUILD:-}" ]; then
  BUILD=/tmp/remap-validate-build
  mkdir -p "$BUILD/server" && ln -sf "$(command -v ballast)" "$BUILD/server/ballast"
fi
B="$BUILD/server/ballast"
MODEL=/tmp/llama3-8b-random
if [ ! -f "$MODEL/config.json" ]; then
  t0=$(date +%s)
  "$B" make-model --out "$MODEL" --layers 32 --hidden 4096 --intermediate 14336 --heads 32 \
    --kv-heads 8 --vocab 128256 --max-position 8192 --llama3-rope-scaling --init-std 0.02 \
    --threads "$(nproc)" > /tmp/make-model.log 2>&1 || { tail -5 /tmp/make-model.log; exit 1; }
  echo "make-model $(($(date +%s) - t0)) s"
fi
for mode in ${MODES:-true false}; do
  dir="$OUT/remap-$mode"
  mkdir -p "$dir"
  t0=$(date +%s)
  KV_PRESSURE=0.05 LOG_LEVEL=info REMAP=$mode HOST_CACHE_MIB=16384 MODEL_DIR=$MODEL N=4 \
    MEMORY_MIB=73728 ROLLING=true SEED=7 DURATION=120 PRATE=1 BRATE=2 PROMPT_MAX=3072 \
    OUTPUT_MAX=1024 RATES="${RATES:-2 4}" SLOW_STEP_MS="${SLOW_STEP_MS:-0}" KEEP_REQUESTS=1 \
    LOG_ARBITRATION="${LOG_ARBITRATION:-false}" \
    TRACE_ARGS="--persistent-fraction 0 --group-fraction 0 --prompt-mean 2048 --output-mean 256" \
    BUILD="$BUILD" timeout "${LIMIT:-420}" bash deploy/gpu-host/sim-validate.sh "$dir/v"
  echo "remap=$mode: sim-validate rc=$? in $(($(date +%s) - t0)) s"
  grep -E "rate scale|MODEL|^m[0-9]|TOTAL|goodput|by status|first" "$dir/v/real.txt" 2> /dev/null
  grep -E "^ballast_node_(model_preemptions|kv_compaction|remap_events|remap_stall|kv_reclaims|step_drains)" \
    "$dir/v/metrics.txt" 2> /dev/null
  if [ -f "$dir/v/serve.log" ]; then
    grep -E "weight layer|moved [0-9]+ bytes of KV|failed" "$dir/v/serve.log" | cut -c1-220 | head -40
    xz -T4 "$dir/v/serve.log" && mv "$dir/v/serve.log.xz" "$dir/serve.log.xz"
  fi
  tar -C "$dir" -czf "$dir/v.tgz" v && rm -rf "$dir/v"
done
