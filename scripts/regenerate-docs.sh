#!/usr/bin/env bash
# Rewrites the docs generated from the code: docs/configuration.md (the flags of thunder-server
# and thunder-cli), docs/metrics.md (the metric catalogue) and the file map of
# docs/architecture.md. The generator is testbed/tests/generated_docs.rs; without
# THUNDER_REGENERATE_DOCS it only checks them (the test suite runs it so). thunder-cli's help
# is read from the built binary, so it is built first.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
cargo build -q --locked -p thunder-cli
THUNDER_REGENERATE_DOCS=1 cargo test -q --locked -p thunder-testbed --test generated_docs
python3 scripts/check-links.py
