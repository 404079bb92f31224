#!/usr/bin/env bash
# Builds thunder's release binaries into a directory: the build stage of deploy/Dockerfile
# runs it, and so can a release job without a Docker engine.
#
#   deploy/build-release.sh OUT_DIR
#
# Needs Rust (edition 2024), gcc, make and perl (librdkafka is built from source; protoc is
# vendored). CARGO_TARGET_DIR is honoured.
set -euo pipefail

# The binaries an image ships (checked against the workspace's targets by
# server/tests/deploy_manifests.rs).
BINARIES=(thunder-server thunder-cli)

out="${1:?usage: deploy/build-release.sh OUT_DIR}"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bin_args=()
for bin in "${BINARIES[@]}"; do
    bin_args+=(--bin "$bin")
done
cargo build --release --locked -p thunder-server -p thunder-cli "${bin_args[@]}"

target="${CARGO_TARGET_DIR:-target}/release"
for bin in "${BINARIES[@]}"; do
    install -m 0755 "$target/$bin" "$out/$bin"
done
echo "built ${BINARIES[*]} into $out"
