#!/usr/bin/env bash
# Run ON THE GPU HOST after build.sh (and `source deploy/gpu-host/env.sh`):
# the cost of deterministic mode (engine.deterministic: batch-invariant
# kernels) on a Llama-3-8B-shaped checkpoint with random BF16 weights:
# `ballast bench-engine` decode at BATCHES and prefill, default against
# --deterministic, per quantization in QUANTS, all in one session.
# Usage: deploy/gpu-host/deterministic-bench.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
BUILD=${1:-/tmp/ballast-build}
OUT=${2:-.}
MODEL=${MODEL:-/tmp/llama3-8b-random}
BATCHES=${BATCHES:-1,16,64,256}
QUANTS=${QUANTS:-none}
B="$BUILD/server/ballast"
mkdir -p "$OUT"
if [ ! -f "$MODEL/config.json" ]; then
  "$B" make-model --out "$MODEL" --layers 32 --hidden 4096 --intermediate 14336 --heads 32 \
    --kv-heads 8 --vocab 128256 --max-position 8192 --init-std 0.02 --llama3-rope-scaling
fi
for q in $QUANTS; do
  # shellcheck disable=SC2086
  "$B" bench-engine --model "$MODEL" --batches "$BATCHES" --quantization "$q" \
    --out "$OUT/default-$q.json" ${BENCH_ENGINE_FLAGS:-} > /dev/null
  # shellcheck disable=SC2086
  "$B" bench-engine --model "$MODEL" --batches "$BATCHES" --quantization "$q" --deterministic \
    --out "$OUT/deterministic-$q.json" ${BENCH_ENGINE_FLAGS:-} > /dev/null
done
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for f in sorted(out.glob("*.json")):
    r = json.loads(f.read_text())
    cells = ", ".join(f"b{d['batch']}: {d['ms_per_step']:.3f} ms" for d in r.get("decode", []))
    pre = r.get("prefill", {})
    print(f"{f.stem}: {cells}; prefill {pre.get('tokens')} tokens {pre.get('ms', 0):.1f} ms")
PY
