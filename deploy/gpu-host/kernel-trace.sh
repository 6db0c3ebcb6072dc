#!/usr/bin/env bash
# Run ON THE GPU HOST: builds the CUPTI kernel tracer (kernel_trace.cc) and
# runs a command under it, then summarises the timeline (kernel-trace.py).
# Usage: deploy/gpu-host/kernel-trace.sh OUT_DIR [COMMAND ARGS...]
#   With no command, only builds OUT_DIR/libkernel_trace.so (for scripts
#   that take TRACE_LIB, such as overlap-bench.sh).
#   Env: CUDA (the toolkit, /usr/local/cuda), SUMMARY (kernel-trace.py's
#   options for the summary, default none: the whole trace),
#   KERNEL_TRACE_API_US (read by the library: also record the CUDA API
#   calls that took at least this many microseconds, kernel_trace.cc).
set -euo pipefail
OUT=$1
shift
CUDA=${CUDA:-/usr/local/cuda}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
LIB=$OUT/libkernel_trace.so
g++ -O2 -Wall -shared -fPIC -o "$LIB" "$HERE/kernel_trace.cc" -I"$CUDA/include" \
  -L"$CUDA/lib64" -lcupti -Wl,-rpath,"$CUDA/lib64"
[ $# -eq 0 ] && exit 0
CUDA_INJECTION64_PATH=$LIB KERNEL_TRACE_OUT=$OUT/trace.csv "$@"
# shellcheck disable=SC2086
python3 "$HERE/kernel-trace.py" "$OUT/trace.csv" ${SUMMARY:-}
