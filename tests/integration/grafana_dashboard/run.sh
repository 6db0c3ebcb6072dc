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

# shellcheck source=../serve_fixture.sh
source "$(dirname "$0")/../serve_fixture.sh"
sched=$(serve_port) node=$(serve_port) metrics=$(serve_port) prom=$(serve_port)
serve_config "$work/c.yaml" "$work" "$sched" "$node" "$metrics" \
  "layers: 2, hidden: 128, heads: 4, kv_heads: 2, intermediate: 256"
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
serve_wait "$bin" "$sched" "${pids[0]}" "$work/serve.log"
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
