#!/usr/bin/env bash
# ctest gateway_openai_client: installs the official `openai` npm client into
# CACHE_DIR (npm registry needed; a failed install fails the test) and runs
# check.mjs against `ballast serve`, its chat model using the Qwen3 tokenizer
# in TOKENIZERS_DIR/qwen3 (scripts/fetch-test-tokenizers.sh).
# Usage: run.sh BALLAST_BINARY CACHE_DIR TOKENIZERS_DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1
cache=$2
tokenizers=$3
mkdir -p "$cache"
cp "$here/package.json" "$here/serve.mjs" "$here/check.mjs" "$here/check_chat.mjs" \
  "$here/check_curl.mjs" "$here/load.mjs" "$cache/"
if [ ! -f "$cache/node_modules/openai/package.json" ] ||
   ! grep -q "\"version\": \"$(sed -n 's/.*"openai": "\(.*\)".*/\1/p' "$here/package.json")\"" \
     "$cache/node_modules/openai/package.json"; then
  (cd "$cache" && npm install --no-audit --no-fund --loglevel=error)
fi
cd "$cache"
exec node check.mjs "$bin" "$tokenizers/qwen3"
