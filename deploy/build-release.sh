#!/usr/bin/env bash
# Builds thunder's release binaries into a directory: the build stage of deploy/Dockerfile
# runs it, and so can a release job without a Docker engine.
#
#   [THUNDER_FEATURES=gssapi,curl] deploy/build-release.sh OUT_DIR
#
# Needs Rust (edition 2024), gcc, make, perl, pkg-config and the OpenSSL headers (librdkafka is
# built from source with TLS, SASL SCRAM and OAUTHBEARER against the system OpenSSL: Debian's
# libssl-dev; protoc is vendored). THUNDER_FEATURES adds optional Kafka features of
# thunder-server: `gssapi` (needs libsasl2-dev) and `curl` (OIDC; needs libcurl4-openssl-dev).
# CARGO_TARGET_DIR is honoured. scripts/test.sh runs it, so CI builds what the image ships.
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
feature_args=()
if [ -n "${THUNDER_FEATURES:-}" ]; then
    # thunder-cli forwards each to thunder-server; one build serves both binaries.
    feature_args=(--features "$(echo "$THUNDER_FEATURES" | tr ',' '\n' | sed 's|^|thunder-server/|' | paste -sd, -)")
fi
cargo build --release --locked -p thunder-server -p thunder-cli "${bin_args[@]}" "${feature_args[@]}"

target="${CARGO_TARGET_DIR:-target}/release"
for bin in "${BINARIES[@]}"; do
    install -m 0755 "$target/$bin" "$out/$bin"
done
echo "built ${BINARIES[*]} into $out"
