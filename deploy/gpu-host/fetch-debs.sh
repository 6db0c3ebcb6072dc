#!/usr/bin/env bash
# Run HERE (a machine that reaches Debian's archive): downloads the runtime
# and -dev packages Ballast builds with into .gpu-debs/ (git-ignored), for
# air-gapped GPU hosts that have a compiler and CUDA but none of our C++
# dependencies. Then copy the tree (with .gpu-debs/) there and run build.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:-.gpu-debs}
mkdir -p "$OUT"
cd "$OUT"
apt-get download \
  libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 protobuf-compiler-grpc \
  libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32 protobuf-compiler \
  libabsl-dev libabsl20220623 libc-ares-dev libc-ares2 libre2-dev libre2-9 \
  libspdlog-dev libspdlog1.10 libfmt-dev libfmt9 libyaml-cpp-dev libyaml-cpp0.7 \
  prometheus-cpp-dev libprometheus-cpp-core1.0 libprometheus-cpp-pull1.0 libprometheus-cpp-push1.0 \
  libcivetweb-dev libcivetweb1 civetweb libssl-dev libssl3 zlib1g-dev \
  libcurl4-openssl-dev libcurl4 nlohmann-json3-dev libcli11-dev libsqlite3-dev libsqlite3-0 \
  libgtest-dev libgmock-dev googletest libbenchmark-dev libbenchmark1debian \
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libicu-dev libicu72 \
  libboost-dev libboost1.74-dev \
  libxxhash-dev libxxhash0 liburing-dev liburing2
echo "downloaded $(ls *.deb | wc -l) packages into $OUT ($(du -sh . | cut -f1))"
