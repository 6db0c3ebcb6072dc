# source me on the GPU host after build.sh: library path for the unpacked deps.
D=${BALLAST_DEP_PREFIX:-/opt/ballast-deps}
export LD_LIBRARY_PATH=$D/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
