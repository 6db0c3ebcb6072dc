#!/usr/bin/env bash
# Run ON THE GPU HOST after build.sh (and `source deploy/gpu-host/env.sh`):
# offline throughput through the whole daemon (issue 18, item 5). One
# Llama-3-8B-shaped checkpoint (random BF16 weights, byte tokenizer: one
# prompt token per byte) is served by `ballast serve`; `ballast trace
# sharegpt` makes N requests with ShareGPT-like lengths, all released at
# t = 0; `ballast bench` sends them over gRPC at once (one stream each,
# ignore_eos, max_tokens = the trace's output length) and reports output
# tokens/s over the wall time from the first release to the last token.
# A 64-request warm-up (activation, CUDA graphs) runs first and is not
# counted. One run per QUANTS x SEQS (node.engine.max_seqs).
# Usage: deploy/gpu-host/offline-bench.sh [BUILD_DIR] [OUT_DIR]
# Env: N (requests, 1000), QUANTS ("none fp8"), SEQS ("256"), BATCH_TOKENS
#      (node.engine.max_batch_tokens, 8192), MEMORY_MIB (the device's
#      budget, 120000), MODEL (checkpoint dir, made if missing), SEED (1),
#      BACKEND (cuda; cpu checks the script on a small MODEL), ROLLING
#      (node.engine.rolling_steps, true; runs before 2026-11-29 were false),
#      MEMORY_MODE (node.memory.mode, elastic; static gives the model a
#      private pool of KV_MIB, 100000, node.engine.kv_cache_mib), METRICS
#      (the scheduler's /metrics address, 127.0.0.1:9400: each run's node
#      metrics, step thread time and step host time among them, are saved
#      to OUT/metrics-TAG.txt after the run), KV_DTYPE (the model's
#      kv_dtype, auto: the activation type; fp8_e4m3 halves the KV bytes),
#      SLOW_STEP_MS (node.engine.slow_step_warn_ms, 0 = off; 0.001 logs
#      every step with its work and end time to OUT/serve-TAG.log, for
#      scripts/step-log.py), TRACE_LIB (a libkernel_trace.so built by
#      kernel-trace.sh: the server's kernels go to OUT/trace-TAG.csv),
#      GEMM_TUNE (node.engine.gemm_tune_candidates, 0 = cuBLASLt's
#      heuristic first, untimed), AHEAD (node.engine.ahead_steps, true),
#      WARM (node.engine.warm_products, true), LOG_LEVEL (warn; info also
#      logs each new decode graph's eager run, capture and instantiation),
#      SUFFIX (appended to each run's TAG, for A/B runs into one OUT_DIR).
set -euo pipefail
BUILD=${1:-/tmp/ballast-build}
OUT=${2:-.}
N=${N:-1000}
QUANTS=${QUANTS:-none fp8}
SEQS=${SEQS:-256}
MODEL=${MODEL:-/tmp/llama3-8b-random}
B="$BUILD/server/ballast"
mkdir -p "$OUT"
if [ ! -f "$MODEL/config.json" ]; then
  "$B" make-model --out "$MODEL" --layers 32 --hidden 4096 --intermediate 14336 --heads 32 \
    --kv-heads 8 --vocab 128256 --max-position 8192 --init-std 0.02 --llama3-rope-scaling
fi
"$B" trace sharegpt -n "$N" --models llama8b --seed "${SEED:-1}" --out "$OUT/sharegpt.jsonl"
"$B" trace sharegpt -n 64 --models llama8b --seed 99 --out "$OUT/warmup.jsonl"
"$B" trace stats "$OUT/sharegpt.jsonl" | tee "$OUT/trace-stats.txt"

config() {  # quantization, max_seqs
  cat <<EOF
log_level: ${LOG_LEVEL:-warn}
scheduler:
  listen: 127.0.0.1:50051
  metrics_listen: ${METRICS:-127.0.0.1:9400}
  slo: {ttft_ms: 600000, tpot_ms: 10000}
  models:
    - {name: llama8b, path: $MODEL, quantization: $1, kv_dtype: ${KV_DTYPE:-auto}}
node:
  node_id: gpu-0
  listen: 127.0.0.1:50061
  metrics_listen: ""
  memory: {mode: ${MEMORY_MODE:-elastic}, slab_mib: 64}
  devices:
    - {name: "${DEVICE:-cuda:0}", memory_mib: ${MEMORY_MIB:-120000}}
  engine: {backend: ${BACKEND:-cuda}, cuda_graphs: true, block_tokens: 16,
           max_batch_tokens: ${BATCH_TOKENS:-8192}, max_seqs: $2, max_context: 4096,
           rolling_steps: ${ROLLING:-true}, ahead_steps: ${AHEAD:-true},
           kv_cache_mib: ${KV_MIB:-100000},
           slow_step_warn_ms: ${SLOW_STEP_MS:-0}, gemm_tune_candidates: ${GEMM_TUNE:-0},
           warm_products: ${WARM:-true}}
EOF
}

for q in $QUANTS; do
  for s in $SEQS; do
    tag=$q-seqs$s${SUFFIX:-}
    config "$q" "$s" > "$OUT/$tag.yaml"
    traced=()
    [ -n "${TRACE_LIB:-}" ] &&
      traced=(env "CUDA_INJECTION64_PATH=$TRACE_LIB" "KERNEL_TRACE_OUT=$OUT/trace-$tag.csv")
    "${traced[@]}" "$B" serve --config "$OUT/$tag.yaml" > "$OUT/serve-$tag.log" 2>&1 &
    pid=$!
    trap 'kill $pid 2> /dev/null || true' EXIT
    for _ in $(seq 1 120); do
      "$B" health --target 127.0.0.1:50051 > /dev/null 2>&1 && break
      sleep 1
    done
    "$B" bench --trace "$OUT/warmup.jsonl" --max-inflight "$N" --no-plots \
      --out "$OUT/warmup-$tag" > "$OUT/warmup-$tag.txt" 2>&1
    # Sending N requests at once takes the client ~50 ms: a lag bound of
    # 500 ms (about 1% of a run) keeps the run valid.
    "$B" bench --trace "$OUT/sharegpt.jsonl" --max-inflight "$N" --no-plots --max-client-lag-ms 500 \
      --out "$OUT/run-$tag" 2>&1 | tee "$OUT/run-$tag.txt" | grep -iE "throughput|requests|status"
    python3 -c "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())" \
      "http://${METRICS:-127.0.0.1:9400}/metrics" > "$OUT/metrics-$tag.txt" || echo "no metrics from ${METRICS:-127.0.0.1:9400}" >&2
    kill "$pid"
    wait "$pid" 2> /dev/null || true
  done
done
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
def find(o, key):
    if isinstance(o, dict):
        if key in o: return o[key]
        for v in o.values():
            r = find(v, key)
            if r is not None: return r
    if isinstance(o, list):
        for v in o:
            r = find(v, key)
            if r is not None: return r
    return None
for f in sorted(out.glob("run-*/result.json")):
    r = json.loads(f.read_text())
    print(f"{f.parent.name}: output {find(r, 'output_token_throughput'):.0f} tok/s, "
          f"total {find(r, 'token_throughput'):.0f} tok/s, wall {find(r, 'wall_s'):.1f} s")
PY
