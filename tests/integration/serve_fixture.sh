# shellcheck shell=bash
# Sourced by the integration scripts that run `ballast serve` on the CPU
# with one tiny Llama named "tiny" (metrics_promtool, grafana_dashboard).
#   serve_port                       a free loopback port
#   serve_config FILE WORK SCHED NODE METRICS "layers: 2, hidden: 128, ..."
#                                    writes the config (models in WORK/models)
#   serve_wait BIN SCHED PID LOG     waits until the scheduler answers health
#                                    checks; exits 1 with the log if PID died
serve_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

serve_config() {
  local file=$1 work=$2 sched=$3 node=$4 metrics=$5 shape=$6
  cat > "$file" <<YAML
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
    - {name: tiny, architecture: llama, $shape, vocab: 258}
YAML
}

serve_wait() {
  local bin=$1 sched=$2 pid=$3 log=$4
  for _ in $(seq 1 120); do
    "$bin" health --target "127.0.0.1:$sched" > /dev/null 2>&1 && return 0
    kill -0 "$pid" 2> /dev/null || { cat "$log"; exit 1; }
    sleep 0.5
  done
}
