#!/usr/bin/env bash
# Starts the embedded default (`ballast serve`: scheduler + one CPU node +
# three synthetic models), waits until it is healthy, streams from every
# model at once, then keeps serving until Ctrl-C.
# DEMO_EXIT=1 stops the server after the demo instead (used by scripts/CI).
set -euo pipefail
BALLAST=${1:-build/server/ballast}
CONFIG=${CONFIG:-configs/ballast.yaml}
TARGET=127.0.0.1:50051
LOG=${TMPDIR:-/tmp}/ballast-serve.log

"$BALLAST" serve --config "$CONFIG" >"$LOG" 2>&1 &
PID=$!
trap 'kill $PID 2>/dev/null || true; wait $PID 2>/dev/null || true' EXIT

echo "starting ballast serve (log: $LOG) ..."
for _ in $(seq 1 150); do
  if ! kill -0 $PID 2>/dev/null; then
    echo "ballast serve exited:"; cat "$LOG"; exit 1
  fi
  if "$BALLAST" models --target $TARGET 2>/dev/null | grep -q READY &&
     ! "$BALLAST" models --target $TARGET | tail -n +2 | grep -q "not resident"; then
    break
  fi
  sleep 0.2
done
"$BALLAST" models --target $TARGET
echo
"$BALLAST" demo --target $TARGET --prompt "Once upon a time" --max-tokens 48
echo
echo "A two-turn session (the second turn reuses the first turn's KV):"
"$BALLAST" generate --target $TARGET -m tiny-llama -s demo-session -p "Hello!" -n 24 --stats
"$BALLAST" generate --target $TARGET -m tiny-llama -s demo-session -p " Tell me more." -n 24 --stats
echo
if [ "${DEMO_EXIT:-0}" = "1" ]; then exit 0; fi
cat <<MSG
ballast serve is running on $TARGET (metrics: http://127.0.0.1:9400/metrics). Try:
  $BALLAST generate -m tiny-qwen2 -p "Hi" --stats
  $BALLAST cluster
Ctrl-C stops it.
MSG
wait $PID
