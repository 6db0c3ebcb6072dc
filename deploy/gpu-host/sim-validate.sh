#!/usr/bin/env bash
# Issue 20's validation on the GPU host: one trace replayed by `ballast
# bench` against the real daemon (`ballast serve`, CUDA, one GPU, N copies
# of a Llama-3.2-1B-shaped model, elastic memory, overlapped steps), for
# comparison with `ballast simulate` on the same trace and
# configs/sim/validate-h200.yaml (docs/benchmarks.md has both commands).
# Writes OUT/trace.jsonl, OUT/real-<scale>/result.json per rate scale,
# OUT/real.txt (the reports) and OUT/host.txt: the node's mean step host
# time (ballast_node_step_host_seconds) during each scale's replay, the
# simulator's policy.step_host_s; the median TTFT outside the node
# (bench's path_ms), its policy.request_path_s, and its two parts; and the
# CPU seconds each replay took: the daemon's by thread name, the client's,
# and the machine's busy share; OUT/metrics.txt: /metrics after the last.
# Env: BUILD (/tmp/bb), N (4 models), DURATION (60 s), PRATE (persistent
# rate, 20/s), BRATE (burst rate, 40/s), SEED (24: every one of the four
# models gets requests), RATES (rate scales, "1 2 4"), BACKEND
# (cuda), SHAPE (make-model flags), MEMORY_MIB (40960), ROLLING
# (node.engine.rolling_steps, false; true for the rolling-step
# validation, validate-h200.yaml's `rolling` variant), WARMUP (0; 1: one
# untimed replay at the first rate scale before the measured ones), MAX_INFLIGHT
# (4096: `ballast bench --max-inflight`, the client's cap on requests in
# flight; bench's own default of 512 throttled the loaded replays on the
# H100, whose runs bench then flagged invalid for client lag).
# STREAM_THREADS (node.stream_threads, 2: the node's token delivery threads).
# REMAP (node.memory.remap.enabled, false; true for the remapping
# validation, configs/sim/remap-validate-h200.yaml; each model streaming
# layers needs its pinned copy, so give HOST_CACHE_MIB,
# node.memory.host_weight_cache_mib, 16384, room for all). MODEL_DIR (a
# checkpoint every model serves from, as scheduler.models paths; default:
# N synthetic models of SHAPE made at startup). PROMPT_MAX (2048) and
# OUTPUT_MAX (512): the trace's caps. LOG_LEVEL (the daemon's, warn).
# KV_PRESSURE (scheduler.kv_pressure_free_fraction, 0.05; 0: idle models
# are not evicted for KV room). TRACE_ARGS (more `ballast trace
# bursty` flags, none of those above).
# STEP_DONE (node.engine.step_done, spinning_thread). SLOW_STEP_MS
# (node.engine.slow_step_warn_ms, 0 = off; 0.001 logs every step with its
# work, for scripts/step-log.py). LOG_ARBITRATION (node.arbitration.
# log_decisions, false; true logs each queued request's arbitration
# changes, for scripts/arbitration-timeline.py). KEEP_REQUESTS (0; 1 keeps each scale's
# requests CSV, xz-compressed: per-request preemptions, TTFT and TPOT for a
# per-model comparison with the simulator's). A rate scale may be
# repeated (RATES="4 4 4": three replays on one daemon, reported as 4, 4-2
# and 4-3, each with its own real-<label>/). The CPU report's preemptions
# are the involuntary context switches of the daemon's threads alive at
# both ends of the replay.
# Usage (repository root, GPU host): deploy/gpu-host/sim-validate.sh OUT_DIR
set -euo pipefail
OUT=${1:?output directory}
BUILD=${BUILD:-/tmp/bb}
N=${N:-4}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=${WORK:-/tmp/sim-validate-work}  # files that need not come back
mkdir -p "$WORK"
if [ ! -x "$BUILD/server/ballast" ]; then
  GENERATOR="Unix Makefiles" TARGETS="ballast" bash deploy/gpu-host/build.sh .gpu-debs "$BUILD" \
    > "$WORK/build.log" 2>&1
fi
[ -f deploy/gpu-host/env.sh ] && source deploy/gpu-host/env.sh
B="$BUILD/server/ballast"
SHAPE=${SHAPE:-"layers: 16, hidden: 2048, heads: 32, kv_heads: 8, intermediate: 8192, vocab: 128256, tie_embeddings: true"}
models=$(seq -s, -f "m%g" 1 "$N")
"$B" trace bursty --models "$models" --duration "${DURATION:-60}" --persistent-rate "${PRATE:-20}" \
  --burst-rate "${BRATE:-40}" --prompt-max "${PROMPT_MAX:-2048}" \
  --output-max "${OUTPUT_MAX:-512}" --seed "${SEED:-24}" \
  ${TRACE_ARGS:-} -o "$OUT/trace.jsonl" > "$WORK/trace-stats.txt"
{
  cat <<YAML
log_level: ${LOG_LEVEL:-warn}
scheduler:
  listen: 127.0.0.1:50051
  metrics_listen: "127.0.0.1:9400"
  slo: {ttft_ms: 1000, tpot_ms: 50}
  kv_pressure_free_fraction: ${KV_PRESSURE:-0.05}
YAML
  if [ -n "${MODEL_DIR:-}" ]; then
    echo "  models:"
    for i in $(seq 1 "$N"); do echo "    - {name: m$i, path: $MODEL_DIR}"; done
  fi
  cat <<YAML
node:
  node_id: gpu-0
  listen: 127.0.0.1:50061
  metrics_listen: ""
  stream_threads: ${STREAM_THREADS:-2}
  memory: {mode: elastic, slab_mib: 64, remap: {enabled: ${REMAP:-false}},
           host_weight_cache_mib: ${HOST_CACHE_MIB:-16384}}
  arbitration: {log_decisions: ${LOG_ARBITRATION:-false}}
  devices:
    - {name: "${DEVICE:-cuda:0}", memory_mib: ${MEMORY_MIB:-40960}}
  engine: {backend: ${BACKEND:-cuda}, cuda_graphs: true, block_tokens: 16, max_batch_tokens: 2048,
           max_seqs: 128, max_context: 4096, overlap_steps: true,
           rolling_steps: ${ROLLING:-false},   # false: the lockstep iterations of validate-h200.yaml
           step_done: ${STEP_DONE:-spinning_thread}, slow_step_warn_ms: ${SLOW_STEP_MS:-0}}
YAML
  if [ -z "${MODEL_DIR:-}" ]; then
    echo "serve:"
    echo "  cache_dir: ${CACHE:-/tmp/sim-validate-models}"
    echo "  models:"
    for i in $(seq 1 "$N"); do
      echo "    - {name: m$i, architecture: llama, $SHAPE, max_position: 8192, seed: $i, init_std: 0.02}"
    done
  fi
} > "$WORK/serve.yaml"
"$B" serve --config "$WORK/serve.yaml" > "$OUT/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2> /dev/null || true' EXIT
for _ in $(seq 1 300); do
  "$B" health --target 127.0.0.1:50051 > /dev/null 2>&1 && break
  sleep 1
done
# Every model resident before the clock starts. A node still pinning its
# host cache, or loading other models first (with remapping, each 8B load
# pinned a 15 GB image for 11 s when the cache was full), can outlast the
# scheduler's route_wait (30 s), so a warm-up is retried for 10 minutes.
for i in $(seq 1 "$N"); do
  for try in $(seq 1 20); do
    "$B" generate --model "m$i" --prompt "warm up" -n 2 --ignore-eos > /dev/null && break
    [ "$try" = 20 ] && { echo "sim-validate.sh: model m$i never loaded" >&2; exit 1; }
  done
done
# WARMUP=1: replay the trace once at the first rate scale first, results
# discarded, so the measured replays see a warm daemon (graphs captured
# for the batch sizes the trace reaches, KV slabs mapped).
if [ "${WARMUP:-0}" = 1 ]; then
  set -- ${RATES:-1 2 4}
  "$B" bench --trace "$OUT/trace.jsonl" --out "$WORK/warmup" --rate-scale "$1" \
    --max-inflight "${MAX_INFLIGHT:-4096}" --no-plots > "$WORK/warmup.txt"
fi
scrape() {  # sum and count of the per-step host time
  env -u LD_LIBRARY_PATH curl -s 127.0.0.1:9400/metrics |
    awk '/^ballast_node_step_host_seconds_sum/ {s += $2} /^ballast_node_step_host_seconds_count/ {c += $2}
         END {print s + 0, c + 0}'
}
threads() {  # "name/tid ticks" per thread of the daemon (utime + stime),
  # "@process ticks": the whole process's, threads that exited included, and
  # "@preempted N": the live threads' involuntary context switches
  { read -r s < /proc/"$pid"/stat; } 2> /dev/null && set -- ${s##*) } && echo "@process $((${12} + ${13}))"
  cat /proc/"$pid"/task/*/status 2> /dev/null |
    awk '/^nonvoluntary_ctxt_switches/ {n += $2} END {print "@preempted", n + 0}'
  for t in /proc/"$pid"/task/*; do
    { read -r n < "$t/comm" && read -r s < "$t/stat"; } 2> /dev/null || continue
    set -- ${s##*) }  # fields from the state on: utime is the 12th, stime the 13th
    echo "${n// /_}/${t##*/} $((${12} + ${13}))"
  done
}
# Ticks busy (steal included), idle, and stolen (the hypervisor ran
# something else on a virtual CPU that wanted to run).
machine() { awk '/^cpu / {print $2 + $3 + $4 + $7 + $8 + $9, $5 + $6, $9}' /proc/stat; }
# CPU seconds during one replay: the daemon's (in total, and by thread name
# and the busiest threads among those alive at its end), the client's
# (bench), and the machine's busy share of its cores.
cpu_report() {  # k, threads before, after, machine before, after, client "real user sys"
  local hz
  hz=$(getconf CLK_TCK)
  { echo "$2" | sed 's/^/A /'; echo "$3" | sed 's/^/B /'; } |
    awk -v hz="$hz" -v k="$1" -v ma="$4" -v mb="$5" -v c="$6" -v cores="$(nproc)" '
      { if ($1 == "A") a[$2] += $3; else b[$2] += $3 }
      function top(d, m,   i, n, best) {
        for (i = 0; i < m; i++) { best = ""; for (n in d) if (best == "" || d[n] > d[best]) best = n
          if (best == "" || d[best] < 0.05) break; printf " %s %.1f s", best, d[best]; delete d[best] } }
      END { total = (b["@process"] - a["@process"]) / hz; delete a["@process"]; delete b["@process"]
        preempted = b["@preempted"] - a["@preempted"]; delete a["@preempted"]; delete b["@preempted"]
        for (t in b) { one[t] = (b[t] - ((t in a) ? a[t] : 0)) / hz
          n = t; sub("/[0-9]+$", "", n); byname[n] += one[t]; count[n]++ }
        split(ma, x, " "); split(mb, y, " "); split(c, w, " ")
        busy = y[1] - x[1]; idle = y[2] - x[2]; steal = y[3] - x[3]
        printf "rate scale %s: CPU over %.1f s: daemon %.1f s, client %.1f s, machine %.0f%% busy of %d cores (%.1f%% stolen), daemon threads preempted %d times\n",
          k, w[1], total, w[2] + w[3], 100 * busy / (busy + idle), cores,
          100 * steal / (busy + idle), preempted
        printf "rate scale %s:   daemon threads by name (count):", k
        for (n in byname) { label[n " (" count[n] ")"] = byname[n] }
        top(label, 8); printf "\n"
        printf "rate scale %s:   busiest threads (name/tid):", k; top(one, 8); printf "\n" }'
}
: > "$OUT/real.txt"
: > "$OUT/host.txt"
TIMEFORMAT='%R %U %S'
declare -A replays  # a repeated rate scale k: its n-th replay is reported as k-n
for k in ${RATES:-1 2 4}; do
  replays[$k]=$((${replays[$k]:-0} + 1))
  scale=$k
  [ "${replays[$k]}" -gt 1 ] && k="$k-${replays[$k]}"
  before=$(scrape)
  t0=$(threads)
  m0=$(machine)
  { time "$B" bench --trace "$OUT/trace.jsonl" --out "$OUT/real-$k" --rate-scale "$scale" \
    --max-inflight "${MAX_INFLIGHT:-4096}" --no-plots > "$WORK/real-$k.txt"; } 2> "$WORK/client-$k.txt" ||
    { cat "$WORK/client-$k.txt" >&2; exit 1; }
  m1=$(machine)
  t1=$(threads)
  cat "$WORK/real-$k.txt" | tee -a "$OUT/real.txt"
  after=$(scrape)
  cpu_report "$k" "$t0" "$t1" "$m0" "$m1" "$(tail -1 "$WORK/client-$k.txt")" | tee -a "$OUT/host.txt"
  awk -v a="$before" -v b="$after" -v k="$k" 'BEGIN { split(a, x, " "); split(b, y, " ");
    printf "rate scale %s: %d steps, mean step host time %.1f us\n", k, y[2] - x[2],
           (y[2] > x[2]) ? 1e6 * (y[1] - x[1]) / (y[2] - x[2]) : 0 }' | tee -a "$OUT/host.txt"
  # The request path outside the engine (the simulator's policy.request_path_s).
  # Its parts: node -> scheduler, scheduler -> client.
  { grep -e "TTFT outside the node" -e "node -> scheduler" "$WORK/real-$k.txt" ||
    echo "no path reported"; } |
    sed "s/^/rate scale $k: /" | tee -a "$OUT/host.txt"
  if [ "${KEEP_REQUESTS:-0}" = 1 ]; then
    xz -f "$OUT/real-$k"/requests-*.csv
    rm -f "$OUT/real-$k"/result-*.json
  else
    rm -f "$OUT/real-$k"/requests-*.csv "$OUT/real-$k"/result-*.json
  fi
done
# The node's counters at the end (remapping's lent layers, preemptions).
env -u LD_LIBRARY_PATH curl -s 127.0.0.1:9400/metrics > "$OUT/metrics.txt" || true
kill $pid
wait $pid 2> /dev/null || true
