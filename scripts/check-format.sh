#!/usr/bin/env bash
# Fails when a tracked C++/CUDA source differs from clang-format's output
# (.clang-format: Google style, 100 columns). Fix with: scripts/check-format.sh --fix
set -euo pipefail
cd "$(dirname "$0")/.."
CF=${CLANG_FORMAT:-clang-format}
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu' '*.cuh')
if [ "${1:-}" = "--fix" ]; then
  "$CF" -i "${files[@]}"
  exit 0
fi
"$CF" --dry-run --Werror "${files[@]}"
echo "check-format: ${#files[@]} files clean ($("$CF" --version))"
