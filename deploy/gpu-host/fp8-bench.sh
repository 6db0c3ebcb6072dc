#!/usr/bin/env bash
# Run ON THE GPU HOST after build.sh (and `source deploy/gpu-host/env.sh`):
# FP8 weights (quantization: fp8) against BF16 on a Llama-3-8B-shaped
# checkpoint with random BF16 weights: `ballast bench-engine` decode at
# BATCHES and prefill, once per quantization (and, for fp8, once per
# SKINNY row limit), all in one session. JSON results go to OUT.
# Usage: deploy/gpu-host/fp8-bench.sh [BUILD_DIR] [OUT_DIR]
set -euo pipefail
BUILD=${1:-/tmp/ballast-build}
OUT=${2:-.}
MODEL=${MODEL:-/tmp/llama3-8b-random}
BATCHES=${BATCHES:-1,16,64,256}
SKINNY=${SKINNY:-"2 8"}
B="$BUILD/server/ballast"
mkdir -p "$OUT"
if [ ! -f "$MODEL/config.json" ]; then
  "$B" make-model --out "$MODEL" --layers 32 --hidden 4096 --intermediate 14336 --heads 32 \
    --kv-heads 8 --vocab 128256 --max-position 8192 --init-std 0.02 --llama3-rope-scaling
fi
# shellcheck disable=SC2086
"$B" bench-engine --model "$MODEL" --batches "$BATCHES" --quantization none \
  --out "$OUT/bf16.json" ${BENCH_ENGINE_FLAGS:-}
for s in $SKINNY; do
  # shellcheck disable=SC2086
  "$B" bench-engine --model "$MODEL" --batches "$BATCHES" --quantization fp8 --skinny-max-m "$s" \
    --out "$OUT/fp8-skinny$s.json" ${BENCH_ENGINE_FLAGS:-}
done
python3 - "$OUT" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
for f in sorted(out.glob("*.json")):
    r = json.loads(f.read_text())
    dec = r.get("decode", [])
    cells = ", ".join(f"b{d['batch']}: {d['ms_per_step']:.3f} ms ({100 * d['roofline_fraction']:.1f}%)"
                      for d in dec)
    pre = r.get("prefill", {})
    print(f"{f.stem}: weights {r['weight_bytes'] / 2**30:.2f} GiB; {cells}; "
          f"prefill {pre.get('tokens')} tokens {pre.get('ms', 0):.1f} ms")
PY
