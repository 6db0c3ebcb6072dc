#!/usr/bin/env bash
# Run ON THE GPU HOST from the repository root: unpacks the .deb set from
# fetch-debs.sh into a prefix (never into /) and builds Ballast against it.
# Usage: deploy/gpu-host/build.sh [DEB_DIR] [BUILD_DIR]
# Then:  source deploy/gpu-host/env.sh   (library path for running)
set -euo pipefail
DEBS=${1:-.gpu-debs}
BUILD=${2:-/tmp/ballast-build}
D=${BALLAST_DEP_PREFIX:-/opt/ballast-deps}
mkdir -p "$D"
for f in "$DEBS"/*.deb; do dpkg -x "$f" "$D"; done
export LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu          # else the link fails on -lre2
export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
ARCH=${CUDA_ARCH:-90}
cmake -S . -B "$BUILD" -G "${GENERATOR:-Unix Makefiles}" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$D/usr" \
  -DProtobuf_PROTOC_EXECUTABLE="$D/usr/bin/protoc" \
  -DProtobuf_INCLUDE_DIR="$D/usr/include" \
  -DProtobuf_LIBRARY="$D/usr/lib/x86_64-linux-gnu/libprotobuf.so" \
  -DgRPC_CPP_PLUGIN_EXECUTABLE="$D/usr/bin/grpc_cpp_plugin" \
  -DCMAKE_CUDA_ARCHITECTURES="$ARCH"
cmake --build "$BUILD" -j "$(nproc)" ${TARGETS:+--target $TARGETS}  # TARGETS="a b": only those
echo "built $BUILD/server/ballast"
