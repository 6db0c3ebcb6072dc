#!/usr/bin/env bash
# Run ON THE GPU HOST after build.sh: single-thread encode speed of Hugging
# Face `tokenizers` (its Python binding, RAYON_NUM_THREADS=1) and of
# Ballast's tokenizer (tests/bench/tokenizer_bench) on the same machine, the
# same corpus (tests/data/tokenizers/corpus.json) and the same method
# (make_golden.py's time_encode: "entries" and "document").
# Usage: deploy/gpu-host/tokenizer-bench.sh BUILD_DIR TOKENIZER_DIR...
set -euo pipefail
build=$1
shift
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
for dir in "$@"; do
  RAYON_NUM_THREADS=1 python3 - "$dir" <<'PY'
import json, sys, time
sys.path.insert(0, "tests/data/tokenizers")
import make_golden as m
import tokenizers
d = sys.argv[1]
corpus = json.load(open("tests/data/tokenizers/corpus.json", encoding="utf-8"))
t0 = time.perf_counter()
tok = tokenizers.Tokenizer.from_file(d + "/tokenizer.json")
load = time.perf_counter() - t0
r = m.time_encode(tok, corpus)
print("HF tokenizers %s %s: entries %.2f M tokens/s, document %.2f M tokens/s, load %.2f s" % (
    tokenizers.__version__, d, r["entries"]["tokens_per_s"] / 1e6,
    r["document"]["tokens_per_s"] / 1e6, load))
PY
done
"$build/tests/bench/tokenizer_bench" "$@"
