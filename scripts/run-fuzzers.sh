#!/usr/bin/env bash
# Fuzzes every libFuzzer target of fuzz/ for a bounded time (the CI's clang
# stage runs it; issue 19, item 8). Each target starts from its corpus,
# fuzz/corpus/<target>/ (seeds and past crash inputs; read-only here: new
# inputs go to a scratch directory). A crash, sanitizer report, leak, slow
# input (> 10 s) or out-of-memory (> 2 GiB) fails the run: the input is saved
# under BUILD_DIR/fuzz-crashes/<target>/ and the log names the command that
# reproduces it. Once fixed, copy the input into fuzz/corpus/<target>/, where
# ctest replays it for ever (tests <target>.corpus).
# Usage: scripts/run-fuzzers.sh BUILD_DIR [SECONDS per target, default 20]
set -uo pipefail
B=$(cd "${1:?usage: run-fuzzers.sh BUILD_DIR [SECONDS]}" && pwd)
T=${2:-20}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_SYMBOLIZER_PATH=${ASAN_SYMBOLIZER_PATH:-/usr/lib/llvm-14/bin/llvm-symbolizer}
fail=0
for src in "$ROOT"/fuzz/*_fuzzer.cc; do
  name=$(basename "$src" .cc)
  bin=$B/fuzz/$name
  if [ ! -x "$bin" ]; then
    echo "run-fuzzers: $bin is not built (configure with -DBALLAST_FUZZ=ON)" >&2
    exit 2
  fi
  scratch=$(mktemp -d)
  crashes=$B/fuzz-crashes/$name
  log=$B/fuzz-$name.log
  mkdir -p "$crashes"
  if "$bin" -max_total_time="$T" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$crashes/" "$scratch" "$ROOT/fuzz/corpus/$name" > "$log" 2>&1; then
    runs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
    echo "run-fuzzers: $name: ${runs:-?} inputs in ${T} s, nothing found"
  else
    echo "run-fuzzers: $name FAILED (inputs in $crashes; reproduce with $bin <input>):"
    tail -60 "$log"
    fail=1
  fi
  rm -rf "$scratch"
done
exit $fail
