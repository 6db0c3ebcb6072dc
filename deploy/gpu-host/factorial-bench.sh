#!/usr/bin/env bash
# Run ON THE GPU HOST after build.sh (and `source deploy/gpu-host/env.sh`):
# issue 14's factorial comparison. A catalogue of nine Llama-family models
# (three names each over the 8B, 3B and 1B shapes of configs/bench/shapes,
# some with FP8 KV) whose weights together exceed the device budget, one
# bursty trace (Prism §3's properties), and `ballast bench compare` under
# one config per factor: memory mode (static | elastic) x arbitration
# (fcfs | moore_hodgson); everything else (budget, idle eviction, SLOs,
# engine) is the same. Placement (kvpr) cannot change anything with one
# device, so it is not a factor here. A background sampler records the
# GPU's real memory use (nvidia-smi) per config.
#
# Usage: deploy/gpu-host/factorial-bench.sh BUILD_DIR OUT_DIR
# Env: STAGE (models | trace | run | all, default all), CATALOGUE (where the
#      checkpoints go, /tmp/catalogue), BUDGET_MIB (device budget, 65536),
#      STATIC_KV_MIB (static mode's KV pool per model, 2048), SCALES
#      ("1,2,4"), SEARCH ("LO,HI": instead of SCALES, `bench compare --search`
#      bisects each config's highest scale at >= 99% TTFT attainment in
#      [LO, HI]), SEARCH_RUNS (runs per config with SEARCH, 6), DURATION
#      (trace seconds, 30), CONFIGS (any of
#      static-fcfs elastic-fcfs static-mh elastic-mh), IDLE_EVICT_MS (5000),
#      SLO ("1000 100": TTFT and TPOT ms), BACKEND/DEVICE (cuda, cuda:0),
#      SHAPES ("8b 3b 1b"; a CPU smoke run sets tiny ones with SHAPE_ARGS_*),
#      TRACE_ARGS (more `trace bursty` flags, e.g. --length-scale 0.05),
#      SLAB_MIB (KV slab and weight page size, 64; 2 for tiny CPU budgets),
#      WARMUP (`bench compare` flag, --warmup: every trace model served once
#      before each run; WARMUP=" " measures cold starts), HOST_CACHE_MIB
#      (host copies of evicted weights, 32768: pinned when serve starts; 0
#      turns copies off), LOG_LEVEL (serve's, warn).
set -euo pipefail
BUILD=${1:-/tmp/bb}
OUT=${2:-.}
STAGE=${STAGE:-all}
CAT=${CATALOGUE:-/tmp/catalogue}
BUDGET_MIB=${BUDGET_MIB:-65536}
STATIC_KV_MIB=${STATIC_KV_MIB:-2048}
SCALES=${SCALES:-1,2,4}
DURATION=${DURATION:-30}
CONFIGS=${CONFIGS:-static-fcfs elastic-fcfs static-mh elastic-mh}
IDLE_EVICT_MS=${IDLE_EVICT_MS:-5000}
read -r TTFT_MS TPOT_MS <<< "${SLO:-1000 100}"
BACKEND=${BACKEND:-cuda}
DEVICE=${DEVICE:-cuda:0}
SHAPES=${SHAPES:-8b 3b 1b}
BALLAST=$BUILD/server/ballast
mkdir -p "$OUT" "$CAT"

# Llama 3.1 8B, Llama 3.2 3B and 1B (configs/bench/shapes/llama-*.json).
SHAPE_ARGS_8b=${SHAPE_ARGS_8b:---layers 32 --hidden 4096 --heads 32 --kv-heads 8 --intermediate 14336 --vocab 128256}
SHAPE_ARGS_3b=${SHAPE_ARGS_3b:---layers 28 --hidden 3072 --heads 24 --kv-heads 8 --intermediate 8192 --vocab 128256 --tie-embeddings}
SHAPE_ARGS_1b=${SHAPE_ARGS_1b:---layers 16 --hidden 2048 --heads 32 --kv-heads 8 --intermediate 8192 --vocab 128256 --tie-embeddings}

# name shape kv_dtype: three names per shape (a fine-tune serves the same
# shapes), one of each shape with FP8 KV.
catalogue() {
  for s in $SHAPES; do
    echo "$s-a $s auto"
    echo "$s-b $s fp8_e4m3"
    echo "$s-c $s auto"
  done
}
names() { catalogue | awk '{print $1}' | paste -sd, -; }

make_models() {
  for s in $SHAPES; do
    local dir=$CAT/llama-$s args_var=SHAPE_ARGS_$s
    if [ ! -f "$dir/config.json" ]; then
      local t0=$SECONDS
      # shellcheck disable=SC2086
      "$BALLAST" make-model --out "$dir" --architecture llama ${!args_var} --max-position 8192 \
        --llama3-rope-scaling --init-std 0.02 --seed 7
      echo "made llama-$s in $((SECONDS - t0)) s ($(du -sh "$dir" | cut -f1))"
    fi
  done
  catalogue | while read -r name shape _; do ln -sfn "$CAT/llama-$shape" "$CAT/$name"; done
}

make_trace() {
  "$BALLAST" trace bursty --out "$OUT/trace.jsonl" --models "$(names)" --duration "$DURATION" \
    --prompt-mean 512 --output-mean 128 --prompt-max 2048 --output-max 512 --seed 1 ${TRACE_ARGS:-}
  "$BALLAST" trace stats "$OUT/trace.jsonl" --models "$(names)" | tee "$OUT/trace-stats.txt"
}

config() {  # config NAME -> YAML
  local mode=${1%-*} arb=${1#*-}
  [ "$arb" = mh ] && arb=moore_hodgson
  cat <<EOF
log_level: ${LOG_LEVEL:-warn}
scheduler:
  listen: 127.0.0.1:50051
  metrics_listen: ""
  slo: {ttft_ms: $TTFT_MS, tpot_ms: $TPOT_MS}
  idle_evict_ms: $IDLE_EVICT_MS
  models:
EOF
  catalogue | while read -r name _ kv; do
    echo "    - {name: $name, path: $CAT/$name, kv_dtype: $kv}"
  done
  cat <<EOF
node:
  node_id: gpu-0
  listen: 127.0.0.1:0
  metrics_listen: ""
  memory: {mode: $mode, slab_mib: ${SLAB_MIB:-64}, host_weight_cache_mib: ${HOST_CACHE_MIB:-32768}}
  arbitration: {policy: $arb}
  devices:
    - {name: "$DEVICE", memory_mib: $BUDGET_MIB}
  engine: {backend: $BACKEND, block_tokens: 16, kv_cache_mib: $STATIC_KV_MIB,
           max_batch_tokens: 2048, max_seqs: 128, max_context: 4096}
EOF
}

run_configs() {
  local scales=(--rate-scale "$SCALES")
  [ -n "${SEARCH:-}" ] && scales=(--search "$SEARCH" --search-runs "${SEARCH_RUNS:-6}")
  for c in $CONFIGS; do
    config "$c" > "$OUT/$c.yaml"
    local t0=$SECONDS sampler="" peak="n/a"
    if command -v nvidia-smi > /dev/null; then  # the device's real use, every 0.5 s
      nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 \
        > "$OUT/$c-gpu-mib.txt" 2> /dev/null < /dev/null &
      sampler=$!
    fi
    "$BALLAST" bench compare --trace "$OUT/trace.jsonl" --configs "$OUT/$c.yaml" \
      "${scales[@]}" --out "$OUT/$c" --no-plots ${WARMUP:---warmup} > "$OUT/$c.txt" 2>&1 || true
    if [ -n "$sampler" ]; then
      kill "$sampler" 2> /dev/null || true
      peak=$(sort -n "$OUT/$c-gpu-mib.txt" | tail -1)
    fi
    echo "== $c ($((SECONDS - t0)) s; GPU memory used at most $peak MiB)"
    grep -E "^\| " "$OUT/$c/compare.md" 2> /dev/null || tail -5 "$OUT/$c.txt"
  done
}

case "$STAGE" in
  models) make_models ;;
  trace) make_trace ;;
  run) run_configs ;;
  all) make_models && make_trace && run_configs ;;
  *) echo "STAGE is models, trace, run or all" >&2 && exit 2 ;;
esac
