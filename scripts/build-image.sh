#!/bin/sh
# Package drivelab into two FROM scratch images, pulling nothing:
# drivelab:dev (the lab; `serve` by default) and drivelab-cosi-s3:dev (the
# reference COSI driver). TAG=... overrides `dev`.
#
# The image holds the workspace's debug binary and the shared objects it loads
# (the dynamic loader, libc, libm, libgcc_s: what `ldd` lists, copied from this
# host at their paths). DRIVELAB_BIN=path packages an already built binary:
# the container test passes its own build's, so the images run the binary the
# suite tested and CI builds the tree once (a static build was a second one,
# ~10 CPU-minutes). Without it the script runs `cargo build --workspace --bins`.
set -eu
cd "$(dirname "$0")/.."
TAG=${TAG:-dev}
CARGO=${CARGO:-cargo}
BIN=${DRIVELAB_BIN:-}
if [ -z "$BIN" ]; then
  "$CARGO" build --locked --workspace --bins
  BIN=target/debug/drivelab
fi
[ -x "$BIN" ] || { echo "build-image: $BIN is not an executable" >&2; exit 1; }

CTX=$(mktemp -d)
trap 'rm -rf "$CTX"' EXIT
mkdir -p "$CTX/rootfs"
cp "$BIN" "$CTX/rootfs/drivelab"
# Every absolute path ldd names (a static binary names none), dereferenced.
LIBS=$(ldd "$BIN" 2>/dev/null | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' | sort -u)
for lib in $LIBS; do
  mkdir -p "$CTX/rootfs$(dirname "$lib")"
  cp -L "$lib" "$CTX/rootfs$lib"
done
cp docker/Dockerfile docker/cosi-s3.Dockerfile "$CTX/"
DOCKER_BUILDKIT=0 docker build -q -f "$CTX/Dockerfile" -t "drivelab:$TAG" "$CTX"
DOCKER_BUILDKIT=0 docker build -q -f "$CTX/cosi-s3.Dockerfile" -t "drivelab-cosi-s3:$TAG" "$CTX"
echo "built drivelab:$TAG and drivelab-cosi-s3:$TAG from $BIN ($(echo "$LIBS" | wc -w) shared objects)"
