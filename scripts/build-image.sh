#!/bin/sh
# Build drivelab as a static binary and package it into two FROM scratch images,
# pulling nothing: drivelab:dev (the lab; `serve` by default) and
# drivelab-cosi-s3:dev (the reference COSI driver). TAG=... overrides `dev`.
# DRIVELAB_STATIC_TARGET_DIR (default target) is the cargo target dir of the
# static build; BUILD_ONLY=1 stops after the binary (make test prebuilds it).
set -eu
cd "$(dirname "$0")/.."
TAG=${TAG:-dev}
TARGET=x86_64-unknown-linux-gnu
CARGO=${CARGO:-cargo}
# --target keeps RUSTFLAGS off build scripts and proc macros (host artifacts).
TARGET_DIR=${DRIVELAB_STATIC_TARGET_DIR:-target}
RUSTFLAGS="-C target-feature=+crt-static" CARGO_TARGET_DIR="$TARGET_DIR" \
  "$CARGO" build --locked --no-default-features --target "$TARGET" --bin drivelab
BIN="$TARGET_DIR/$TARGET/debug/drivelab"
# ldd prints "statically linked" (static-pie) or "not a dynamic executable"; anything else links a libc.
if ldd "$BIN" 2>&1 | grep -qv -e "statically linked" -e "not a dynamic executable"; then
  echo "build-image: $BIN is not static" >&2
  exit 1
fi
if [ "${BUILD_ONLY:-}" = 1 ]; then
  echo "built $BIN"
  exit 0
fi
CTX=$(mktemp -d)
trap 'rm -rf "$CTX"' EXIT
cp "$BIN" "$CTX/drivelab"
cp docker/Dockerfile docker/cosi-s3.Dockerfile "$CTX/"
DOCKER_BUILDKIT=0 docker build -q -f "$CTX/Dockerfile" -t "drivelab:$TAG" "$CTX"
DOCKER_BUILDKIT=0 docker build -q -f "$CTX/cosi-s3.Dockerfile" -t "drivelab-cosi-s3:$TAG" "$CTX"
echo "built drivelab:$TAG and drivelab-cosi-s3:$TAG from $BIN"
