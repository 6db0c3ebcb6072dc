#!/usr/bin/env bash
# Binaries built HERE (Debian 12, CUDA 13, sm_90, Release), run on the GPU
# host without building there: a fresh GPU machine spends 3-5 minutes of
# device time in build.sh, this a few seconds.
#
#   pack (here):      deploy/gpu-host/prebuilt.sh pack BUILD_DIR [BINARY ...]
#     Copies BUILD_DIR/server/ballast and each BINARY (paths under
#     BUILD_DIR, e.g. tests/gpu/cuda_kernels_test) into .gpu-run/bin
#     (xz-compressed: about 6 MiB for ballast, 4 for a GPU test), and
#     the runtime .debs they load (found by ldd + dpkg -S, taken from
#     .gpu-debs/, see fetch-debs.sh) into .gpu-run/debs. Fails if a library
#     has no .deb there, or if the folder passes the device tool's 64 MiB
#     carry limit (the ballast binary and its libraries are about 23 MiB).
#   run (GPU host):   deploy/gpu-host/prebuilt.sh run COMMAND [ARG ...]
#     Unpacks .gpu-run/debs into $BALLAST_DEP_PREFIX (default
#     /opt/ballast-deps, as build.sh), decompresses the binaries (in
#     place: the device's copy of the tree), puts .gpu-run/bin first on PATH and
#     the libraries on LD_LIBRARY_PATH, and runs COMMAND.
#
# The device tool carries git-ignored paths by name: carry [".gpu-run"].
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=.gpu-run
case "${1:-}" in
  pack)
    BUILD=${2:?build directory}
    shift 2
    rm -rf "$RUN" && mkdir -p "$RUN/bin" "$RUN/debs"
    for b in server/ballast "$@"; do cp "$BUILD/$b" "$RUN/bin/"; done
    # The packages owning the libraries the binaries load (merged /usr:
    # ldd may print /lib/... for a file dpkg registered under /usr/lib/...).
    pkgs=$(for b in "$RUN"/bin/*; do ldd "$b"; done | awk '/=>/ {print $3}' | sort -u |
      sed 's#^/lib/#/usr/lib/#' | { xargs -r dpkg -S 2>/dev/null || true; } | cut -d: -f1 | sort -u)
    for p in $pkgs; do
      case "$p" in libc6 | libgcc-s1 | libstdc++6 | zlib1g) continue ;; esac  # the host's own
      deb=$(ls .gpu-debs/"${p}"_*.deb 2>/dev/null | head -1 || true)
      if [ -z "$deb" ]; then
        echo "prebuilt.sh: no .deb for $p in .gpu-debs/ (add it to fetch-debs.sh)" >&2
        exit 1
      fi
      cp "$deb" "$RUN/debs/"
    done
    # xz-compressed after ldd has read them: their device code (fat
    # cubins) shrinks about 6x, so GPU test binaries fit the carry too.
    xz -T0 "$RUN"/bin/*
    kib=$(du -sk "$RUN" | cut -f1)
    echo "packed $(ls "$RUN/bin" | wc -l) binaries and $(ls "$RUN/debs" | wc -l) .debs: ${kib} KiB"
    if [ "$kib" -gt $((64 * 1024)) ]; then
      echo "prebuilt.sh: $RUN is over the 64 MiB carry limit" >&2
      exit 1
    fi
    ;;
  run)
    shift
    D=${BALLAST_DEP_PREFIX:-/opt/ballast-deps}
    mkdir -p "$D"
    for f in "$RUN"/debs/*.deb; do dpkg -x "$f" "$D"; done
    for f in "$RUN"/bin/*.xz; do  # xz, or Python's lzma where xz is missing
      [ -e "$f" ] || continue
      xz -d -f "$f" 2> /dev/null || python3 -c 'import lzma, os, sys
src = sys.argv[1]
with lzma.open(src) as i, open(src[:-3], "wb") as o: o.write(i.read())
os.chmod(src[:-3], 0o755)
os.remove(src)' "$f"
    done
    export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
    export PATH=$PWD/$RUN/bin:$PATH
    exec "$@"
    ;;
  *)
    echo "usage: $0 pack BUILD_DIR [BINARY ...] | run COMMAND [ARG ...]" >&2
    exit 2
    ;;
esac
