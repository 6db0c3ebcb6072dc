#!/usr/bin/env bash
# Run ON THE GPU HOST (issue 19, item 3): an Advise flood from one tenant
# against another tenant's TTFT, with the server and the flooding client on
# disjoint cores of the 16-core host, and the victim served by the CUDA
# engine. tests/bench/advise_flood measures PROBES Generate requests of
# tenant `victim` (TOKENS tokens each, one at a time) alone, then again while
# tenant `flooder` sends Advise calls for its real session at RATE calls/s.
# Prints advise_flood's report per run, prefixed with the run's name.
#
# Usage: deploy/gpu-host/flood-bench.sh [BUILD_DIR] [OUT_DIR]
#   BUILD_DIR holds server/ballast and tests/bench/advise_flood.
# Env: SERVER_CPUS (taskset list, default 0-7), CLIENT_CPUS (8-15),
#      RATES ("1 1000 10000": the 1/s run is the noise control),
#      PROBES (300), TOKENS (8), SIZE (small: qwen2 shape, 6 layers,
#      hidden 1024, ~1 ms TTFT, the harshest case for the victim; 1b:
#      Llama-3.2-1B's shape), NOQUOTA (non-empty: also 10,000/s with no
#      quota, for contrast), BACKEND/DEVICE (cuda, cuda:0; cpu, cpu:0 to
#      try the script on a machine with no GPU).
set -euo pipefail
BUILD=${1:-/tmp/ballast-build}
OUT=${2:-.}
SERVER_CPUS=${SERVER_CPUS:-0-7}
CLIENT_CPUS=${CLIENT_CPUS:-8-15}
RATES=${RATES:-1 1000 10000}
PROBES=${PROBES:-300}
TOKENS=${TOKENS:-8}
BALLAST=$BUILD/server/ballast
FLOOD=$BUILD/tests/bench/advise_flood
PORT=${SCHED_PORT:-50071}
case "${SIZE:-small}" in
  small) SHAPE="architecture: qwen2, layers: 6, hidden: 1024, heads: 8, kv_heads: 2, intermediate: 2816, vocab: 32000" ;;
  1b) SHAPE="architecture: llama, layers: 16, hidden: 2048, heads: 32, kv_heads: 8, intermediate: 8192, vocab: 128256" ;;
  *) echo "SIZE must be small or 1b" >&2; exit 2 ;;
esac
mkdir -p "$OUT"

config() {  # $1: "quota" or "none"
  local quotas="{}"
  if [ "$1" = quota ]; then
    quotas="{tenants: {flooder: {advisories_per_s: 100, advisory_burst: 100}}}"
  fi
  cat <<YAML
log_level: warn
scheduler: {listen: 127.0.0.1:$PORT, metrics_listen: "127.0.0.1:${METRICS_PORT:-9471}",
            quotas: $quotas}
node:
  node_id: gpu-0
  listen: 127.0.0.1:${NODE_PORT:-50072}
  metrics_listen: ""
  memory: {mode: elastic, slab_mib: 64}
  devices:
    - {name: "${DEVICE:-cuda:0}", memory_mib: 16384}
  engine: {backend: ${BACKEND:-cuda}, cuda_graphs: true, block_tokens: 16, max_batch_tokens: 2048,
           max_seqs: 64, max_context: 4096}
  kv_tiers: {dram_mib: 1024}
serve:
  cache_dir: $OUT/models
  models:
    - {name: victim-model, $SHAPE, max_position: 4096, seed: 1, init_std: 0.02}
YAML
}

run() {  # $1: quota|none, $2: rate
  config "$1" > "$OUT/flood-$1.yaml"
  taskset -c "$SERVER_CPUS" "$BALLAST" serve --config "$OUT/flood-$1.yaml" \
    > "$OUT/serve-$1-$2.log" 2>&1 &
  local pid=$! up=""
  trap 'kill $pid 2> /dev/null || true' EXIT
  for _ in $(seq 1 120); do
    # Our server, not one left on the port: it must still be running.
    kill -0 "$pid" 2> /dev/null || { echo "ballast serve exited; see $OUT/serve-$1-$2.log" >&2; exit 1; }
    "$BALLAST" health --target 127.0.0.1:$PORT > /dev/null 2>&1 && { up=1; break; }
    sleep 1
  done
  [ -n "$up" ] || { echo "ballast serve not healthy after 120 s" >&2; exit 1; }
  echo "== ${SIZE:-small} model, quota: $1, flood $2/s, server on cpus $SERVER_CPUS, client on $CLIENT_CPUS"
  timeout 300 taskset -c "$CLIENT_CPUS" "$FLOOD" 127.0.0.1:$PORT victim-model "$2" "$PROBES" \
    "$TOKENS" || echo "advise_flood exited with $?"
  kill "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  trap - EXIT
}

nproc
nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -1 || true
for rate in $RATES; do run quota "$rate"; done
if [ -n "${NOQUOTA:-}" ]; then run none 10000; fi
