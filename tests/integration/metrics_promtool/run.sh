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
# shellcheck source=../serve_fixture.sh
source "$(dirname "$0")/../serve_fixture.sh"
sched=$(serve_port) node=$(serve_port) metrics=$(serve_port)
serve_config "$work/c.yaml" "$work" "$sched" "$node" "$metrics" \
  "layers: 4, hidden: 256, heads: 8, kv_heads: 4, intermediate: 1024"
"$bin" serve --config "$work/c.yaml" > "$work/serve.log" 2>&1 &
pid=$!
trap 'kill $pid 2> /dev/null || true; wait $pid 2> /dev/null || true' EXIT
serve_wait "$bin" "$sched" "$pid" "$work/serve.log"
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
# serve runs the one scheduler: it leads (ballast_scheduler_leader 1).
for series in 'ballast_node_queue_seconds_count{model="tiny"} 3' \
              'ballast_node_activation_seconds_count{model="tiny",source="disk"} 1' \
              'ballast_scheduler_leader 1'; do
  grep -qF "$series" "$work/metrics.txt" || { echo "missing: $series"; exit 1; }
done
# The liveness probe of a scheduler without its gRPC port (deploy/kubernetes).
"$bin" health --metrics-url "http://127.0.0.1:$metrics/metrics"
echo "metrics_promtool: $(grep -c '^# TYPE' "$work/metrics.txt") families pass promtool check metrics"
