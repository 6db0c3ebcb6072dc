#!/usr/bin/env bash
# ctest grafana_dashboard: deploy/grafana/ballast.json is a valid Grafana
# dashboard (Grafana's documented JSON model; Debian ships no Grafana to load
# it in) whose every query is valid PromQL over metrics the daemon exports,
# and, run by a real Prometheus (Debian's prometheus package, with the
# recording rules of deploy/prometheus/alerts.yaml) scraping `ballast serve`
# under a small workload, answers with series.
# Usage: run.sh BALLAST_BINARY SOURCE_DIR WORK_DIR
set -euo pipefail
bin=$1
src=$2
work=$3
for tool in promtool prometheus; do
  command -v $tool > /dev/null || { echo "$tool not found (Debian package prometheus)"; exit 1; }
done
python3 -c 'import jsonschema' || { echo "python3-jsonschema not installed"; exit 1; }
rm -rf "$work" && mkdir -p "$work"
check="$src/deploy/grafana/check-dashboard.py"
dash="$src/deploy/grafana/ballast.json"
python3 "$check" static "$dash" "$src/deploy/grafana/dashboard.schema.json" \
  "$src/server/metrics.cc" "$src/deploy/prometheus/alerts.yaml" "$work"

port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
sched=$(port) node=$(port) metrics=$(port) prom=$(port)
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
    - {name: tiny, architecture: llama, layers: 2, hidden: 128, heads: 4, kv_heads: 2,
       intermediate: 256, vocab: 258}
YAML
cp "$src/deploy/prometheus/alerts.yaml" "$work/alerts.yaml"
cat > "$work/prometheus.yml" <<YAML
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [alerts.yaml]
scrape_configs:
  - job_name: ballast
    static_configs: [{targets: ["127.0.0.1:$metrics"]}]
YAML
pids=()
trap 'for p in "${pids[@]}"; do kill $p 2> /dev/null || true; done; wait 2> /dev/null || true' EXIT
"$bin" serve --config "$work/c.yaml" > "$work/serve.log" 2>&1 &
pids+=($!)
prometheus --config.file="$work/prometheus.yml" --storage.tsdb.path="$work/tsdb" \
  --web.listen-address="127.0.0.1:$prom" > "$work/prometheus.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 120); do
  "$bin" health --target "127.0.0.1:$sched" > /dev/null 2>&1 && break
  kill -0 "${pids[0]}" 2> /dev/null || { cat "$work/serve.log"; exit 1; }
  sleep 0.5
done
gen() { "$bin" generate --target "127.0.0.1:$sched" -m tiny -n 8 --ignore-eos "$@" > /dev/null; }
# Requests spread over the rate windows (30 s in the live check), one of
# them in a session, one that misses its TTFT target.
for i in $(seq 1 12); do
  gen -p "hello $i" --ttft-ms 60000 --tpot-ms 60000
  [ "$i" = 3 ] && gen --ttft-ms 1 --tpot-ms 60000 -p "$(printf 'x%.0s' $(seq 1 400))"
  [ "$i" = 6 ] && gen -p "a session" --session s1
  sleep 1
done
curl -sf "http://127.0.0.1:$prom/-/ready" > /dev/null || { cat "$work/prometheus.log"; exit 1; }
python3 "$check" live "$dash" "http://127.0.0.1:$prom"
