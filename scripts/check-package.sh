#!/usr/bin/env bash
# Builds the Debian package from a configured and built tree
# (deploy/packaging.cmake) and checks it: the files it must ship, that the
# unpacked binary runs, and that every shared library the binary needs
# comes from a Debian package its Depends names.
# A clean-chroot install is not attempted: it needs root and debootstrap's
# network access to a mirror, which CI's machines do not promise.
# Usage: scripts/check-package.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
(cd "$BUILD" && rm -f ballast_*.deb && cpack -G DEB > cpack.log 2>&1) || {
  cat "$BUILD/cpack.log"
  exit 1
}
deb=$(ls "$BUILD"/ballast_*.deb)
fail() { echo "check-package: $deb: $*" >&2; exit 1; }

contents=$(dpkg-deb -c "$deb" | awk '{print $6}')
for f in ./usr/bin/ballast ./usr/lib/systemd/system/ballast-node.service \
         ./usr/lib/systemd/system/ballast-scheduler.service \
         ./usr/share/ballast/configs/node.yaml ./usr/share/ballast/configs/scheduler.yaml \
         ./usr/share/ballast/kubernetes/ballast.yaml ./usr/share/doc/ballast/README.md \
         ./usr/share/ballast/grafana/ballast.json ./usr/share/ballast/prometheus/alerts.yaml; do
  grep -qx "$f" <<< "$contents" || fail "missing $f"
done
dpkg-deb -I "$deb" postinst > /dev/null || fail "no postinst"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dpkg-deb -x "$deb" "$tmp"
version=$("$tmp/usr/bin/ballast" --version) || fail "the packaged binary does not run"
[[ $version == "ballast "* ]] || fail "unexpected --version: $version"

# Depends (package names) against the packages owning the libraries the
# binary itself links (its DT_NEEDED entries, resolved by ldd on this
# machine; dpkg -S names their owners). Libraries those pull in are their
# packages' dependencies, not ours.
needed() {
  local sonames
  sonames=$(readelf -d "$1" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')
  ldd "$1" | awk -v want="$sonames" 'BEGIN {n = split(want, w, "\n"); for (i = 1; i <= n; i++) need[w[i]] = 1}
    $1 in need && $3 ~ /^\// {print $3}'
}
depends=$(dpkg-deb -f "$deb" Depends | tr ',' '\n' | awk '{print $1}' | sort -u)
missing=()
while read -r lib; do
  owner=$(dpkg -S "$(readlink -f "$lib")" 2> /dev/null | head -1 | cut -d: -f1) ||
    owner=$(dpkg -S "$lib" 2> /dev/null | head -1 | cut -d: -f1) || true
  [ -n "$owner" ] || fail "$lib belongs to no Debian package"
  # Depends may name the owner or a virtual package it provides
  # (libspdlog1.10 provides libspdlog1.10-fmt9).
  names=$(printf '%s\n' "$owner"; dpkg-query -W -f='${Provides}' "$owner" 2> /dev/null |
    tr ',' '\n' | awk '{print $1}')
  grep -qxF -f <(grep . <<< "$names") <<< "$depends" || missing+=("$owner ($lib)")
done < <(needed "$tmp/usr/bin/ballast")
[ ${#missing[@]} -eq 0 ] || fail "Depends lacks: ${missing[*]}"
echo "check-package: $(basename "$deb") ok: $(wc -l <<< "$contents") entries," \
  "$(wc -l <<< "$depends") dependencies, $version"
