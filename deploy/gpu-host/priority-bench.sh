#!/usr/bin/env bash
# Issue 13's priority streams through the whole daemon, on the GPU host:
# `ballast serve` (CUDA, one GPU, overlapped steps) with two copies of a
# Llama-3.2-1B-shaped model. "bulk" gets BULK long-prompt streams of a few
# tokens each (back-to-back prefill chunks); one second later "chat" gets
# CHAT short-prompt streams of CHAT_TOKENS tokens, decoding beside them.
# Run once per node.engine.priority_streams mode; prints per mode chat's
# TBT and TPOT and bulk's TTFT and rate (tests/bench/stream_storm).
# Env: BUILD (/tmp/bb: server/ballast, tests/bench/stream_storm), MODES
# ("none decode first"), BULK (256), BULK_CHARS (3000), CHAT (4),
# CHAT_TOKENS (512), ROLLING (node.engine.rolling_steps, false), SM_RESERVE
# (node.engine.sm_reserve for chat: its SMs, the bulk model the rest; 0), SHAPE
# (the models' shape), BACKEND (cuda), DEVICE
# (cuda:0; cpu:0 with BACKEND=cpu, to try the script without a GPU).
# Usage (repository root, GPU host): deploy/gpu-host/priority-bench.sh OUT_DIR
set -euo pipefail
OUT=${1:?output directory}
BUILD=${BUILD:-/tmp/bb}
BALLAST=$BUILD/server/ballast
STORM=$BUILD/tests/bench/stream_storm
MODES=${MODES:-none decode first}
SHAPE=${SHAPE:-"layers: 16, hidden: 2048, heads: 32, kv_heads: 8, intermediate: 8192, vocab: 128256, tie_embeddings: true"}
ADDR=127.0.0.1:${SCHED_PORT:-50051}
mkdir -p "$OUT"
# sm_reserve_models without sm_reserve is a config error: name chat only
# when SMs are reserved.
RESERVE_MODELS=""
[ "${SM_RESERVE:-0}" != 0 ] && RESERVE_MODELS=", sm_reserve_models: [chat]"

config() {
  cat <<EOF
log_level: warn
scheduler: {listen: $ADDR, metrics_listen: "127.0.0.1:${METRICS_PORT:-9400}"}
node:
  node_id: gpu-0
  listen: 127.0.0.1:${NODE_PORT:-50061}
  metrics_listen: ""
  memory: {mode: elastic, slab_mib: 64}
  devices:
    - {name: "${DEVICE:-cuda:0}", memory_mib: 40960}
  engine: {backend: ${BACKEND:-cuda}, cuda_graphs: true, block_tokens: 16, max_batch_tokens: 2048,
           max_seqs: 128, max_context: 8192, overlap_steps: true, priority_streams: $1,
           rolling_steps: ${ROLLING:-false}, sm_reserve: ${SM_RESERVE:-0}$RESERVE_MODELS}
serve:
  cache_dir: $OUT/models
  models:
    - {name: chat, architecture: llama, $SHAPE, max_position: 8192, seed: 1, init_std: 0.02}
    - {name: bulk, architecture: llama, $SHAPE, max_position: 8192, seed: 2, init_std: 0.02}
EOF
}

pid=
trap '[ -n "$pid" ] && kill "$pid" 2> /dev/null || true' EXIT
for mode in $MODES; do
  config "$mode" > "$OUT/c-$mode.yaml"
  "$BALLAST" serve --config "$OUT/c-$mode.yaml" > "$OUT/serve-$mode.log" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do
    "$BALLAST" health --target "$ADDR" > /dev/null 2>&1 && break
    kill -0 "$pid" 2> /dev/null || { echo "serve exited; see $OUT/serve-$mode.log" >&2; exit 1; }
    sleep 1
  done
  for m in chat bulk; do "$STORM" "$ADDR" "$m" 2 8 > /dev/null; done  # resident, graphs captured
  STORM_PROMPT_CHARS=${BULK_CHARS:-3000} "$STORM" "$ADDR" bulk "${BULK:-256}" 8 \
    > "$OUT/bulk-$mode.txt" &
  bulk=$!
  sleep 1
  "$STORM" "$ADDR" chat "${CHAT:-4}" "${CHAT_TOKENS:-512}" > "$OUT/chat-$mode.txt"
  wait "$bulk"
  echo "priority_streams $mode, rolling_steps ${ROLLING:-false}, sm_reserve ${SM_RESERVE:-0}: chat $(grep -o 'TPOT p50 [0-9.]* ms\|TBT p50 [0-9.]* p99 [0-9.]* ms' "$OUT/chat-$mode.txt" | tr '\n' ' ');" \
    "bulk $(grep -o '[0-9.]* tokens/s\|TTFT p50 [0-9.]* p99 [0-9.]* ms\|status codes: [0-9= ]*' "$OUT/bulk-$mode.txt" | tr '\n' ' ')" |
    tee -a "$OUT/summary.txt"
  kill "$pid"
  wait "$pid" 2> /dev/null || true
  pid=
done
