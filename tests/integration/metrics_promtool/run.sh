#!/usr/bin/env bash
# ctest metrics_promtool: `ballast serve` with a tiny model serves a few
# requests (one with an SLO it cannot miss, one it cannot meet); its
# /metrics must pass Prometheus' own `promtool check metrics` (Debian's
# prometheus package, deploy/install-deps.sh) and carry the SLO attainment
# series. No promtool: the test fails.
# Usage: run.sh BALLAST_BINARY WORK_DIR
set -euo pipefail
bin=$1
work=$2
command -v promtool > /dev/null || { echo "promtool not found (Debian package prometheus)"; exit 1; }
rm -rf "$work" && mkdir -p "$work"
port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
sched=$(port) node=$(port) metrics=$(port)
cat > "$work/c.yaml" <<YAML
log_level: warn
scheduler: {listen: "127.0.0.1:$sched", metrics_listen: "127.0.0.1:$metrics"}
node:
  node_id: n1
  listen: "127.0.0.1:$node"
  metrics_listen: ""
  devices: [{name: "cpu:0", memory_mib: 2048}]
  engine: {backend: cpu, kv_cache_mib: 64}
serve:
  cache_dir: $work/models
  models:
    - {name: tiny, architecture: llama, layers: 4, hidden: 256, heads: 8, kv_heads: 4,
       intermediate: 1024, vocab: 258}
YAML
"$bin" serve --config "$work/c.yaml" > "$work/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2> /dev/null || true; wait $pid 2> /dev/null || true' EXIT
for _ in $(seq 1 120); do
  "$bin" health --target "127.0.0.1:$sched" > /dev/null 2>&1 && break
  kill -0 $pid 2> /dev/null || { cat "$work/serve.log"; exit 1; }
  sleep 0.5
done
gen() { "$bin" generate --target "127.0.0.1:$sched" -m tiny -n 8 --ignore-eos "$@" > /dev/null; }
gen -p hello --ttft-ms 60000 --tpot-ms 60000   # met
gen -p hello --ttft-ms 60000 --tpot-ms 60000
# A 600-token prompt's prefill (about 4 GFLOP on this model) cannot take
# under 1 ms on a CPU: its TTFT is missed.
gen --ttft-ms 1 --tpot-ms 60000 -p "$(printf 'x%.0s' $(seq 1 600))"
curl -sf "http://127.0.0.1:$metrics/metrics" > "$work/metrics.txt"
promtool check metrics < "$work/metrics.txt"
grep -q '^ballast_scheduler_slo_requests_total{model="tiny",result="met",slo="ttft"} 2' \
  "$work/metrics.txt" || { grep slo "$work/metrics.txt"; echo "no ttft met series"; exit 1; }
grep -q '^ballast_scheduler_slo_requests_total{model="tiny",result="missed",slo="ttft"} 1' \
  "$work/metrics.txt" || { grep slo "$work/metrics.txt"; echo "no ttft missed series"; exit 1; }
for series in 'ballast_node_queue_seconds_count{model="tiny"} 3' \
              'ballast_node_activation_seconds_count{model="tiny",source="disk"} 1'; do
  grep -qF "$series" "$work/metrics.txt" || { echo "missing: $series"; exit 1; }
done
echo "metrics_promtool: $(grep -c '^# TYPE' "$work/metrics.txt") families pass promtool check metrics"
