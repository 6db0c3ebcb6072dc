#!/usr/bin/env bash
# Overlapped decode steps (GpuExecutorOptions::overlap_min_rows,
# engine/cuda/cuda_forward_overlap.cc) against whole-batch steps, in one
# lease: `ballast bench-engine` decode steps of an 8B-shaped model (random
# BF16 weights) at large batches with spread contexts, without overlap and
# with it at each SM target for the products, alternating per round.
# Run on the GPU host with ballast on PATH (prebuilt.sh run):
#   deploy/gpu-host/nano-batch-bench.sh OUT
# Env: MODEL (made if missing), BATCHES (256,512,1000), CONTEXT (300),
# SIGMA (0.8), ROWS (overlap_min_rows, 256), SMS (targets, "0 100 116";
# 0 = none), ROUNDS (1), KV (auto).
set -euo pipefail
OUT=${1:?usage: nano-batch-bench.sh OUT}
MODEL=${MODEL:-/tmp/llama3-8b-random}
ARGS=(--model "$MODEL" --context "${CONTEXT:-300}" --context-sigma "${SIGMA:-0.8}" --prefill 0
  --steps 16 --warmup 3 --batches "${BATCHES:-256,512,1000}" --kv-dtype "${KV:-auto}")
mkdir -p "$OUT"
if [ ! -f "$MODEL/config.json" ]; then
  ballast make-model --out "$MODEL" --layers 32 --hidden 4096 --intermediate 14336 --heads 32 \
    --kv-heads 8 --vocab 128256 --max-position 8192 --init-std 0.02 --llama3-rope-scaling
fi
for r in $(seq 1 "${ROUNDS:-1}"); do
  ballast bench-engine "${ARGS[@]}" --out "$OUT/base-$r.json" > "$OUT/base-$r.txt"
  for s in ${SMS:-0 100 116}; do
    ballast bench-engine "${ARGS[@]}" --overlap-rows "${ROWS:-256}" --overlap-gemm-sms "$s" \
      --out "$OUT/overlap-$s-$r.json" > "$OUT/overlap-$s-$r.txt"
  done
done
python3 - "$OUT" <<'PY'
import glob, json, os, sys
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    j = json.load(open(f))
    name = os.path.basename(f)[:-5]
    for d in j["decode"]:
        rows.setdefault(d["batch"], {})[name] = d["ms_per_step"]
names = sorted({n for r in rows.values() for n in r})
print("batch " + " ".join(f"{n:>14}" for n in names))
for b in sorted(rows):
    print(f"{b:5d} " + " ".join(f"{rows[b].get(n, float('nan')):14.2f}" for n in names))
PY
