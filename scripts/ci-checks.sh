#!/usr/bin/env bash
# The CI checks `make test` runs after the Release build (-Werror) and its
# ctest. Each stage has its own build directory and prints its wall time.
#   format  scripts/check-format.sh with clang-format 14
#   clang   clang 14, -Wthread-safety -Werror (checks the ABSL_GUARDED_BY
#           annotations), ASan + UBSan (-fno-sanitize-recover=all), CUDA off,
#           with the libFuzzer targets of fuzz/; builds everything, runs
#           ctest -LE gpu (each fuzzer replays its corpus), then fuzzes each
#           target for FUZZ_SECONDS (20; scripts/run-fuzzers.sh)
#                                                              (build-clang/)
#   tsan    GCC 12 TSan build of the concurrency-heavy tests (device worker,
#           arbitration, model engine, scheduler, the multi-process
#           integration tests and the daemons they start) and runs them
#                                                                (build-tsan/)
#   package the Debian package of the Release build (scripts/check-package.sh:
#           contents, the unpacked binary runs, Depends covers its libraries)
#                                                                    (build/)
# A sanitizer report anywhere, including in a daemon an integration test
# started, fails the stage: reports are written under <build>/sanitizer-logs/.
# Usage: scripts/ci-checks.sh [format] [package] [clang] [tsan]   (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
JOBS=${JOBS:-$(nproc)}
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(format package clang tsan)

# Sanitizer builds: CUDA off (GPU tests skip without a GPU anyway), -O1 with
# line tables: a debug build whose tests still run in CI time.
SAN_FLAGS=(-G Ninja -DCMAKE_BUILD_TYPE=Debug -DBALLAST_CUDA=OFF -DBALLAST_WERROR=ON)

# Fails when any sanitizer report was written (tests and daemons alike).
check_logs() {
  local dir=$1
  if compgen -G "$dir/*" >/dev/null; then
    echo "ci-checks: sanitizer reports:"
    for f in "$dir"/*; do
      echo "==== $f"
      cat "$f"
    done
    # Last, so that a log's tail shows what each report is about: its
    # headline and the top frames of each stack (not the sanitizer's own).
    echo "ci-checks: sanitizer report summary:"
    cat "$dir"/* | python3 -c '
import re, sys
frames = 0
for line in sys.stdin:
    line = line.rstrip()
    if line.startswith("WARNING:") or line.startswith("SUMMARY:") or "ERROR:" in line:
        print(line); frames = 0
    elif re.match(r"\s+(Read|Write|Previous|Atomic|Location)", line):
        print(line); frames = 3
    elif frames and re.match(r"\s+#\d+ ", line) and not re.search("libsanitizer|<null>", line):
        print("  " + " ".join(line.split()[1:3])[:150]); frames -= 1'
    return 1
  fi
}

run_ctest() {  # build_dir, extra ctest args...
  local b=$1
  shift
  (cd "$b" && ctest --output-on-failure -j "$JOBS" --timeout 900 "$@")
}

stage_package() {
  # The Release tree `make ctest` built (configured here if absent).
  [ -f build/build.ninja ] || cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
  cmake --build build -j "$JOBS" --target ballast
  bash scripts/check-package.sh build
}

stage_format() {
  CLANG_FORMAT=clang-format-14 bash scripts/check-format.sh
}

stage_clang() {
  local b=build-clang logs=$ROOT/build-clang/sanitizer-logs
  cmake -S . -B $b "${SAN_FLAGS[@]}" -DCMAKE_CXX_COMPILER=clang++-14 \
    -DCMAKE_CXX_FLAGS_DEBUG="-O1 -gline-tables-only" -DBALLAST_SANITIZE=address,undefined \
    -DBALLAST_FUZZ=ON
  cmake --build $b -j "$JOBS"
  rm -rf "$logs" && mkdir -p "$logs"
  ASAN_OPTIONS=log_path=$logs/asan:detect_leaks=1:check_initialization_order=1 \
    UBSAN_OPTIONS=log_path=$logs/ubsan:print_stacktrace=1:halt_on_error=1 \
    ASAN_SYMBOLIZER_PATH=/usr/lib/llvm-14/bin/llvm-symbolizer \
    run_ctest $b -LE gpu
  check_logs "$logs"
  bash scripts/run-fuzzers.sh $b "${FUZZ_SECONDS:-20}"
}

# The tests TSan runs: those whose code has threads of its own (device
# workers, node manager, model engine, KV arena, scheduler and its worker
# pool, the HTTP gateway, the etcd leader election and store) and the
# multi-process integration tests with the
# daemon they start. Single-threaded tests (kernels, formats, tokenizers,
# chat templates, traces) are not built, so ctest skips them.
TSAN_TARGETS=(ballast device_worker_test device_arbitration_test node_manager_test
  host_weight_cache_test model_engine_test kv_arena_test global_scheduler_test
  gateway_protocol_test cluster_test lifecycle_test cli_test bench_integration_test
  gateway_test kv_tier_store_test session_tiering_test tiering_test worker_pool_test
  layer_kv_loader_test cpu_executor_test pinned_pool_test node_generate_test request_parse_test
  session_test etcd_state_store_test scheduler_ha_test)

stage_tsan() {
  local b=build-tsan logs=$ROOT/build-tsan/sanitizer-logs
  cmake -S . -B $b "${SAN_FLAGS[@]}" -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" -DBALLAST_SANITIZE=thread
  cmake --build $b -j "$JOBS" --target "${TSAN_TARGETS[@]}"
  rm -rf "$logs" && mkdir -p "$logs"
  TSAN_OPTIONS="log_path=$logs/tsan:halt_on_error=1:second_deadlock_stack=1:suppressions=$ROOT/tests/sanitizers/tsan.supp" \
    run_ctest $b -LE gpu -E "$(unbuilt_tests $b)"
  check_logs "$logs"
}

# A ctest -E regex of the tests whose program was not built (gtest binaries
# not built register as <target>_NOT_BUILT).
unbuilt_tests() {
  (cd "$1" && ctest --show-only=json-v1) | python3 -c '
import json, os, re, sys
names = [t["name"] for t in json.load(sys.stdin)["tests"]
         if not t.get("command") or not os.path.exists(t["command"][0])]
print("^(" + "|".join(re.escape(n) for n in names) + ")$" if names else "^$")'
}

declare -A took
for s in "${stages[@]}"; do
  echo "ci-checks: === $s"
  start=$SECONDS
  "stage_$s"
  took[$s]=$((SECONDS - start))
  echo "ci-checks: === $s passed in ${took[$s]} s"
done
for s in "${stages[@]}"; do printf 'ci-checks: %-6s %4d s\n' "$s" "${took[$s]}"; done
