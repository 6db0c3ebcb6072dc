#!/usr/bin/env bash
# Mean per-step phases (ms) from a serve log written with
# node.engine.slow_step_warn_ms set low enough to log every step (the
# engine's "slow step" warnings), over steps with no prefill tokens:
# inbox and tasks, plan, KV loads, launch, wait, tokens and finishes, and
# the span from the step's begin to its end.
# Usage: deploy/gpu-host/step-phases.sh SERVE_LOG
# Env: MIN_CHUNKS, MAX_CHUNKS (only steps with that many sequences; default
#      all).
set -euo pipefail
grep -o "slow step.*" "$1" | grep " 0 prefill tokens" |
  sed -E 's/.*\(([0-9]+) chunks.*inbox and tasks ([0-9.]+), plan ([0-9.]+), KV loads ([0-9.]+), launch ([0-9.]+), wait ([0-9.]+), tokens and finishes ([0-9.]+); ([0-9.]+) from begin.*/\1 \2 \3 \4 \5 \6 \7 \8/' |
  awk -v lo="${MIN_CHUNKS:-0}" -v hi="${MAX_CHUNKS:-1000000}" '$1 < lo || $1 > hi {next} {n++; for (i = 1; i <= 8; i++) s[i] += $i}
    END {if (n == 0) {print "no decode steps logged"; exit}
      printf "%d decode steps, mean: %.1f chunks; inbox %.3f, plan %.3f, KV loads %.3f, launch %.3f, wait %.3f, tokens %.3f; begin to end %.3f ms\n",
        n, s[1]/n, s[2]/n, s[3]/n, s[4]/n, s[5]/n, s[6]/n, s[7]/n, s[8]/n}'
