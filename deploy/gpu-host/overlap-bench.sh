#!/usr/bin/env bash
# Run ON THE GPU HOST after build.sh (and `source deploy/gpu-host/env.sh`):
# the serving path against the engine (issue 13, item 5). The same small
# model (qwen2 shape: 6 layers, hidden 1024, vocab 32K; ~130M parameters)
# is timed alone by `ballast bench-engine` (decode ms/step at batch B), then
# served by `ballast serve` as 1, 2 and 6 resident copies with B streams of
# T tokens to each at once (tests/bench/stream_storm), with the device's
# steps overlapped (node.engine.overlap_steps: true) and serial (false).
# Prints one line per run: aggregate tokens/s, the mean per-step host time
# (ballast_node_step_host_seconds) and TPOT p50 per model; then TPOT at low
# load, one stream to every model at once and one stream to m1 alone. Last,
# bench-engine: one copy at batches 1 and B, then the largest count of
# copies decoding at once (the device's own aggregate for N models).
# Usage: deploy/gpu-host/overlap-bench.sh [BUILD_DIR] [OUT_DIR]
# Env: B (streams per model, default 64), T (tokens per stream, 512),
#      COUNTS ("1 2 6"), MODES ("true false"), STREAM_THREADS (the node's
#      node.stream_threads, 2), NODE_CHANNELS (scheduler.node_channels, 1),
#      STORM_CHANNELS (each client's connections, 1), PROFILE (non-empty:
#      per-thread CPU of serve one second into each loaded run; use a T that
#      lasts a few seconds), ROLLING (node.engine.rolling_steps, false),
#      PRIORITY (node.engine.priority_streams, none), AHEAD
#      (node.engine.ahead_steps, true), STEP_DONE (node.engine.step_done,
#      spinning_thread), ENGINE (0: skip the bench-engine runs at the end),
#      ENGINE_CONTEXT (their context, 512), MEMORY_MODE (node.memory.mode,
#      elastic), KV_MIB (engine.kv_cache_mib, each model's pool in static
#      mode, 1024), BLOCK_TOKENS (engine.block_tokens, 16), TOKEN_BATCHES (1: the
#      clients ask for token batches, stream_storm's STORM_TOKEN_BATCHES),
#      TRACE_LIB (a libkernel_trace.so built by kernel-trace.sh: each serve
#      runs under it, and trace-N-MODE.txt summarises the device timeline of
#      the middle 60% of the loaded run, trace-N-MODE-bins.txt the whole run
#      by 0.1 s; the bench-engine run too, into trace-engine.txt, its last
#      half), SLOW_STEP_MS
#      (node.engine.slow_step_warn_ms, 0 = off; 0.001 logs every step's
#      phases to serve-N-MODE.log, see step-phases.sh).
set -euo pipefail
BUILD=${1:-/tmp/ballast-build}
OUT=${2:-.}
B=${B:-64}
T=${T:-512}
COUNTS=${COUNTS:-1 2 6}
MODES=${MODES:-true false}
BALLAST=$BUILD/server/ballast
STORM=$BUILD/tests/bench/stream_storm
mkdir -p "$OUT"
curl_() { env -u LD_LIBRARY_PATH curl -s "$@"; }

# YAML for N copies of the model (seeds 1..N), overlap on or off.
config() {
  local n=$1 overlap=$2
  cat <<EOF
log_level: warn
scheduler: {listen: 127.0.0.1:${SCHED_PORT:-50051}, metrics_listen: "127.0.0.1:${METRICS_PORT:-9400}",
            node_channels: ${NODE_CHANNELS:-1}}
node:
  node_id: gpu-0
  listen: 127.0.0.1:${NODE_PORT:-50061}
  metrics_listen: ""   # serve: one registry, on the scheduler's address
  stream_threads: ${STREAM_THREADS:-2}
  memory: {mode: ${MEMORY_MODE:-elastic}, slab_mib: 64}
  devices:
    - {name: "${DEVICE:-cuda:0}", memory_mib: 24576}
  engine: {backend: ${BACKEND:-cuda}, cuda_graphs: true, block_tokens: ${BLOCK_TOKENS:-16}, max_batch_tokens: 2048,
           kv_cache_mib: ${KV_MIB:-1024},
           max_seqs: 128, max_context: 4096, overlap_steps: $overlap,
           rolling_steps: ${ROLLING:-false}, ahead_steps: ${AHEAD:-true},
           priority_streams: ${PRIORITY:-none}, step_done: ${STEP_DONE:-spinning_thread},
           slow_step_warn_ms: ${SLOW_STEP_MS:-0}}
serve:
  cache_dir: $OUT/models
  models:
EOF
  for i in $(seq 1 "$n"); do
    echo "    - {name: m$i, architecture: qwen2, layers: 6, hidden: 1024, heads: 8, kv_heads: 2,"
    echo "       intermediate: 2816, vocab: 32000, max_position: 4096, seed: $i, init_std: 0.02}"
  done
}

host_us() {  # mean step host time (µs) between two scrapes of the metrics
  awk -v a="$1" -v b="$2" 'BEGIN {
    split(a, x, " "); split(b, y, " ");
    if (y[2] - x[2] > 0) printf "%.0f", 1e6 * (y[1] - x[1]) / (y[2] - x[2]); else print "n/a" }'
}
threads() {  # the step threads' seconds by activity: begin finish idle other
  curl_ 127.0.0.1:${METRICS_PORT:-9400}/metrics | awk '/^ballast_node_step_thread_seconds_total/ {
    if ($0 ~ /activity="begin"/) b += $2; else if ($0 ~ /activity="finish"/) f += $2;
    else if ($0 ~ /activity="idle"/) i += $2; else o += $2 } END {print b + 0, f + 0, i + 0, o + 0}'
}
thread_share() {  # shares of the step thread's time between two threads() scrapes
  awk -v a="$1" -v b="$2" 'BEGIN {
    split(a, x, " "); split(b, y, " "); t = 0; for (k = 1; k <= 4; k++) {d[k] = y[k] - x[k]; t += d[k]}
    if (t <= 0) {print "n/a"; exit}
    printf "begin %.0f%%, finish %.0f%%, idle %.0f%%, other %.0f%%", 100*d[1]/t, 100*d[2]/t, 100*d[3]/t, 100*d[4]/t }'
}
starts() {  # steps begun: alone ahead late (ballast_node_steps_total)
  curl_ 127.0.0.1:${METRICS_PORT:-9400}/metrics | awk '/^ballast_node_steps_total/ {
    if ($0 ~ /start="alone"/) a += $2; else if ($0 ~ /start="ahead"/) h += $2; else l += $2 }
    END {print a + 0, h + 0, l + 0}'
}
starts_diff() {  # steps begun between two starts() scrapes
  awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " ");
    printf "steps alone %d, ahead %d, late %d", y[1] - x[1], y[2] - x[2], y[3] - x[3] }'
}
progress() {  # the node's steps begun, sampled every 0.1 s until $1.stop exists
  while [ ! -e "$1.stop" ]; do
    echo "$(date +%s.%N) $(curl_ 127.0.0.1:${METRICS_PORT:-9400}/metrics |
      awk '/^ballast_node_steps_total/ {s += $2} END {print s + 0}')"
    sleep 0.1
  done > "$1"
}
steps_end() {  # seconds from $2 until the node began its last step ($1: progress's file)
  awk -v t0="$2" '{t[NR] = $1; s[NR] = $2} END {
    for (i = 1; i <= NR; i++) if (s[i] == s[NR]) {printf "%.2f", t[i] - t0; exit} }' "$1"
}
scrape() {
  curl_ 127.0.0.1:${METRICS_PORT:-9400}/metrics | awk '/^ballast_node_step_host_seconds_sum/ {s += $2}
    /^ballast_node_step_host_seconds_count/ {c += $2} END {print s + 0, c + 0}'
}

for overlap in $MODES; do
  for n in $COUNTS; do
    config "$n" "$overlap" > "$OUT/c-$n-$overlap.yaml"
    ${TRACE_LIB:+env CUDA_INJECTION64_PATH=$TRACE_LIB KERNEL_TRACE_OUT=$OUT/trace-$n-$overlap.csv} \
      "$BALLAST" serve --config "$OUT/c-$n-$overlap.yaml" > "$OUT/serve-$n-$overlap.log" 2>&1 &
    pid=$!
    trap 'kill $pid 2> /dev/null || true' EXIT
    for _ in $(seq 1 120); do
      "$BALLAST" health --target 127.0.0.1:${SCHED_PORT:-50051} > /dev/null 2>&1 && break
      sleep 1
    done
    for i in $(seq 1 "$n"); do "$STORM" 127.0.0.1:${SCHED_PORT:-50051} "m$i" 2 8 > /dev/null; done  # resident
    before=$(scrape)
    tb=$(threads)
    sb=$(starts)
    t0=$(date +%s.%N)
    rm -f "$OUT/progress-$n-$overlap.txt.stop"
    progress "$OUT/progress-$n-$overlap.txt" &
    sampler=$!
    storms=()
    for i in $(seq 1 "$n"); do
      STORM_TOKEN_BATCHES=${TOKEN_BATCHES:-0} "$STORM" 127.0.0.1:${SCHED_PORT:-50051} "m$i" "$B" "$T" \
        > "$OUT/storm-$n-$overlap-$i.txt" &
      storms+=($!)
    done
    if [ -n "${PROFILE:-}" ]; then  # per-thread CPU of serve mid-run
      sleep 1
      python3 "$(dirname "$0")/thread-cpu.py" "$pid" 1 10 | tee -a "$OUT/profile-$n-$overlap.txt"
    fi
    wait "${storms[@]}"
    t1=$(date +%s.%N)
    touch "$OUT/progress-$n-$overlap.txt.stop"
    wait "$sampler"
    after=$(scrape)
    ta=$(threads)
    sa=$(starts)
    tokens=$(cat "$OUT"/storm-"$n"-"$overlap"-*.txt | awk '{t += $4} END {print t}')
    codes=$(cat "$OUT"/storm-"$n"-"$overlap"-*.txt | grep -o "status codes: [0-9=]*" | sort | uniq -c | tr '\n' ';')
    rate=$(awk -v t="$tokens" -v a="$t0" -v b="$t1" 'BEGIN {printf "%.2f s: %.0f", b - a, t / (b - a)}')
    echo "models $n overlap $overlap: $tokens tokens in $rate tokens/s;" \
      "the node began its last step $(steps_end "$OUT/progress-$n-$overlap.txt" "$t0") s in;" \
      "step host $(host_us "$before" "$after") us (step thread: $(thread_share "$tb" "$ta"); $(starts_diff "$sb" "$sa"));" \
      "TPOT p50 per model (ms):" \
      "$(cat "$OUT"/storm-"$n"-"$overlap"-*.txt | grep -o "TPOT p50 [0-9.]*" | awk '{print $3}' | tr '\n' ' ');" \
      "$codes $(cat "$OUT"/storm-"$n"-"$overlap"-*.txt | grep -o "[0-9.]* tokens per message" | head -1)" |
      tee -a "$OUT/serve.txt"
    # Low load: one stream per model at once; each one's TPOT against the
    # engine's batch-1 step.
    storms=()
    for i in $(seq 1 "$n"); do
      "$STORM" 127.0.0.1:${SCHED_PORT:-50051} "m$i" 1 "$T" > "$OUT/low-$n-$overlap-$i.txt" &
      storms+=($!)
    done
    wait "${storms[@]}"
    echo "  low load (1 stream per model): TPOT p50 per model (ms):" \
      "$(cat "$OUT"/low-"$n"-"$overlap"-*.txt | grep -o "TPOT p50 [0-9.]*" | awk '{print $3}' | tr '\n' ' ')" |
      tee -a "$OUT/serve.txt"
    # Low load with N resident and one active: one stream to m1 alone.
    "$STORM" 127.0.0.1:${SCHED_PORT:-50051} m1 1 "$T" > "$OUT/solo-$n-$overlap.txt"
    echo "  low load (1 stream, m1 only of $n resident): TPOT p50 (ms):" \
      "$(grep -o "TPOT p50 [0-9.]*" "$OUT/solo-$n-$overlap.txt" | awk '{print $3}')" |
      tee -a "$OUT/serve.txt"
    kill "$pid"
    wait "$pid" 2> /dev/null || true
    if [ -n "${TRACE_LIB:-}" ]; then
      python3 "$(dirname "$0")/kernel-trace.py" "$OUT/trace-$n-$overlap.csv" --wall "$t0" "$t1" \
        --middle 0.6 > "$OUT/trace-$n-$overlap.txt"
      python3 "$(dirname "$0")/kernel-trace.py" "$OUT/trace-$n-$overlap.csv" --wall "$t0" "$t1" \
        --bins 0.1 | grep " s: busy" > "$OUT/trace-$n-$overlap-bins.txt"
      rm -f "$OUT/trace-$n-$overlap.csv"
    fi
  done
done
[ "${ENGINE:-1}" = 0 ] && exit 0
# The engine alone: decode ms/step at batch B (a checkpoint the serve runs
# wrote).
model=$(ls -d "$OUT"/models/m1-*/ | head -1)
# With several counts, the largest also runs that many copies at once
# (--concurrent-models): the device's own aggregate for N models.
most=$(echo "$COUNTS" | tr ' ' '\n' | sort -n | tail -1)
"$BALLAST" bench-engine --model "$model" --batches "1,$B" --context "${ENGINE_CONTEXT:-512}" --prefill 0 \
  --steps 64 --concurrent-models "$most" --out "$OUT/engine.json" | tee "$OUT/engine.txt"
if [ -n "${TRACE_LIB:-}" ]; then  # the copies alone, traced: their last half
  CUDA_INJECTION64_PATH=$TRACE_LIB KERNEL_TRACE_OUT=$OUT/trace-engine.csv "$BALLAST" bench-engine \
    --model "$model" --batches "$B" --context "${ENGINE_CONTEXT:-512}" --prefill 0 --steps 1024 \
    --concurrent-models "$most" --out "$OUT/engine-traced.json" > /dev/null
  python3 "$(dirname "$0")/kernel-trace.py" "$OUT/trace-engine.csv" --last 0.5 --middle 0.8 \
    --bins 0.1 > "$OUT/trace-engine.txt"
  rm -f "$OUT/trace-engine.csv"
fi
