#!/usr/bin/env bash
# Issue 17's benchmark on the GPU host: build (skipped where BUILD already
# holds server/ballast and tests/gpu/cuda_remap_test), the CUDA remapping tests,
# an 8B-shaped model, then `ballast bench-remap` (preemption vs remapping)
# with the timing cap and without it, alone and beside an idle model, and
# (fixedN) N layers streamed throughout with ample memory: the streaming
# cost alone, on the same batches as preemption (so the same tokens);
# prefillN is fixedN on a prefill-heavy workload (64 requests of 4,096
# prompt and 8 output tokens: nearly every step carries a 2,048-token
# prefill chunk), where a layer computes long enough to hide the copies
# (Mirage's constraint holds). VARIANTS picks them (default: timed forced idle).
# Usage (repository root, GPU host): deploy/gpu-host/remap-bench.sh OUT_DIR
set -euo pipefail
OUT=${1:?output directory}
BUILD=${BUILD:-/tmp/bb}
mkdir -p "$OUT"
# Prebuilt binaries already in $BUILD (e.g. links to prebuilt.sh's) skip the build.
if [ ! -x "$BUILD/server/ballast" ] || [ ! -x "$BUILD/tests/gpu/cuda_remap_test" ]; then
  GENERATOR="Unix Makefiles" TARGETS="ballast cuda_remap_test" bash deploy/gpu-host/build.sh .gpu-debs "$BUILD" \
    > "$OUT/build.log" 2>&1
fi
source deploy/gpu-host/env.sh
"$BUILD/tests/gpu/cuda_remap_test" 2>&1 | tail -8 | tee "$OUT/cuda_remap_test.txt"
B="$BUILD/server/ballast"
M=${MODEL:-/tmp/m8b}
if [ ! -f "$M/config.json" ]; then
  "$B" make-model --out "$M" --layers 32 --hidden 4096 --intermediate 14336 --heads 32 \
    --kv-heads 8 --vocab 128256 --max-position 8192 --llama3-rope-scaling --init-std 0.02 \
    --threads 16 > /dev/null
fi
MEM=${MEMORY_MIB:-19456}
COMMON=(--model "$M" --max-batch-tokens 2048 --max-seqs 256)
WORKLOAD=(--requests "${REQUESTS:-32}" --prompt "${PROMPT:-3072}" --output "${OUTPUT:-128}")
for variant in ${VARIANTS:-timed forced idle}; do
  extra=(--memory-mib "$MEM")
  [ "$variant" = forced ] && extra+=(--ignore-timing)
  workload=("${WORKLOAD[@]}")
  case "$variant" in  # fixedN: N layers streamed from the start, memory ample
    fixed*) extra=(--memory-mib 60000 --modes preempt,fixed --fixed-alpha "${variant#fixed}"
                   --fixed-slots 2) ;;
    prefill*) extra=(--memory-mib 60000 --modes preempt,fixed --fixed-alpha "${variant#prefill}"
                     --fixed-slots 2)
              workload=(--requests 64 --prompt 4096 --output 8) ;;
  esac
  if [ "$variant" = idle ]; then  # a second 8B, resident and idle, lends first
    M2=${MODEL2:-/tmp/m8b-2}
    if [ ! -f "$M2/config.json" ]; then
      "$B" make-model --out "$M2" --layers 32 --hidden 4096 --intermediate 14336 --heads 32 \
        --kv-heads 8 --vocab 128256 --max-position 8192 --llama3-rope-scaling --init-std 0.02 \
        --threads 16 --seed 2 > /dev/null
    fi
    extra=(--memory-mib $((MEM + 15360)) --idle-model "$M2")
  fi
  echo "== $variant" | tee -a "$OUT/summary.txt"
  "$B" bench-remap "${COMMON[@]}" "${workload[@]}" "${extra[@]}" --out "$OUT/$variant.json" 2> "$OUT/$variant.log" \
    | tee -a "$OUT/summary.txt"
done
