#!/usr/bin/env bash
# Builds one `ballast` binary per variant of a few source files, in ONE
# build directory, for A/B runs on one lease (run from the repository root,
# here or on the GPU host after build.sh; the build directory must exist).
#
#   deploy/gpu-host/ab-binaries.sh BUILD_DIR OUT_DIR NAME=VARIANT_DIR ...
#
# The working tree's binary is built first, as OUT_DIR/current. Each
# VARIANT_DIR holds replacement files at their paths in the tree (e.g.
# V/engine/cuda/attention_kernels.cu, from `git show REV:PATH`); they are
# copied in, the target rebuilt and copied out as OUT_DIR/NAME, and the
# tree's own files put back. The copies are touched first, and so is every
# file put back: the device tool carries the tree with its mtimes, which
# can be older than objects built in an earlier call, and make then keeps
# the stale objects. A copied build directory (cp -a) does not give a second
# build either: CMake's generated files hold absolute paths into the first.
# Fails when two binaries come out identical (a variant that did not build).
# TARGET (default ballast) and TARGET_PATH (default server/ballast) select
# another binary.
set -euo pipefail
BUILD=${1:?build directory}
OUT=${2:?output directory}
shift 2
TARGET=${TARGET:-ballast}
TARGET_PATH=${TARGET_PATH:-server/ballast}
D=${BALLAST_DEP_PREFIX:-/opt/ballast-deps}
if [ -d "$D/usr/lib/x86_64-linux-gnu" ]; then  # build.sh's unpacked dependencies
  export LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu
  export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi
mkdir -p "$OUT"
SAVE=$(mktemp -d)
trap 'rm -rf "$SAVE"' EXIT

build() {  # NAME: rebuild the target and copy it out
  cmake --build "$BUILD" --target "$TARGET" -j "$(nproc)" > "$OUT/build-$1.log" 2>&1 ||
    { echo "ab-binaries: $1 did not build (see $OUT/build-$1.log)" >&2; exit 1; }
  cp "$BUILD/$TARGET_PATH" "$OUT/$1"
  echo "$1: $(md5sum < "$OUT/$1" | cut -c1-12)"
}

# Every path any variant replaces, from the tree: touched, so the first
# build compiles the tree's own versions.
paths=()
for v in "$@"; do
  dir=${v#*=}
  [ -d "$dir" ] || { echo "ab-binaries: no directory $dir" >&2; exit 2; }
  while IFS= read -r f; do paths+=("${f#"$dir"/}"); done < <(find "$dir" -type f)
done
for p in "${paths[@]}"; do
  if [ -f "$p" ]; then
    mkdir -p "$SAVE/$(dirname "$p")"
    cp -p "$p" "$SAVE/$p"
    touch "$p"
  fi
done
build current
for v in "$@"; do
  name=${v%%=*} dir=${v#*=}
  while IFS= read -r f; do
    p=${f#"$dir"/}
    mkdir -p "$(dirname "$p")"
    cp "$f" "$p" && touch "$p"
  done < <(find "$dir" -type f)
  build "$name"
  while IFS= read -r f; do  # the tree's files back (or removed, if new)
    p=${f#"$dir"/}
    if [ -f "$SAVE/$p" ]; then cp "$SAVE/$p" "$p" && touch "$p"; else rm -f "$p"; fi
  done < <(find "$dir" -type f)
done
names=(current)
for v in "$@"; do names+=("${v%%=*}"); done
dups=$(cd "$OUT" && md5sum "${names[@]}" | sort | uniq -w32 -D | cut -c35- | tr '\n' ' ')
if [ -n "$dups" ]; then
  echo "ab-binaries: identical binaries (a variant did not rebuild): $dups" >&2
  exit 1
fi
