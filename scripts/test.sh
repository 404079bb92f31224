#!/usr/bin/env bash
# The whole test suite: what CI runs, and what a developer runs before pushing.
#
# Needs only what a fresh machine has (Rust with cargo-nextest, gcc, make, Python 3) and the
# package registries: it installs the Kafka test broker (PyPI), cargo-fuzz (crates.io),
# promtool (Debian's prometheus package) and headless Chromium (Debian's `chromium`, for the
# status page test) itself, idempotently. Every service a test needs is started by that test
# on 127.0.0.1 and stopped again.
#
# THUNDER_FUZZ_SECONDS=N   seconds per fuzz target (default 60; 0 skips fuzzing)
# THUNDER_SOAK=0           skips the short soak (scripts/soak.sh --short, about 3-4 minutes)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

step() { printf '\n==> %s\n' "$*"; }

step "Kafka test broker"
# Tests start and stop their own brokers from THUNDER_TEST_KAFKA_BIN.
eval "$(scripts/kafka-broker.sh env)"

step "Headless Chromium (the status page test renders the admin page in it)"
# Debian's package, installed once; the test fails rather than skips when it is required.
if ! command -v chromium >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends chromium
fi
export THUNDER_REQUIRE_CHROMIUM=1

step "Format and lints"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# Every relative link (and anchor) in the Markdown docs resolves.
python3 scripts/check-links.py

step "Alert rules (promtool check and unit tests)"
# promtool comes with Debian's prometheus package, and the deploy tests read YAML with
# python3-yaml; both installed once.
missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
python3 -c 'import yaml' 2>/dev/null || missing+=(python3-yaml)
if [ "${#missing[@]}" -gt 0 ]; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
promtool check rules deploy/prometheus/thunder-alerts.yml
promtool test rules deploy/prometheus/*.test.yml

step "Tests"
summary="$(mktemp)"
trap 'rm -f "$summary"' EXIT
if cargo nextest --version >/dev/null 2>&1; then
    cargo nextest run --workspace --locked --no-fail-fast 2>&1 | tee "$summary"
    cargo test --workspace --locked --doc
    # nextest gives each test a process of its own; the plain harness runs several side by
    # side in one, where one test's epoch pins delay another's reclamation. The engine's unit
    # tests once that way keep a plain `cargo test` green too (a few seconds in release).
    cargo test -p thunder-engine --release --lib --locked
else
    cargo test --workspace --locked --no-fail-fast 2>&1 | tee "$summary"
fi

step "Loom models (arena slot reuse, timeline ring: every interleaving, two preemptions)"
# `--cfg thunder_loom` swaps the engine's atomics for loom's (engine/src/sync.rs); only the
# models run under it (the `loom` filter). Its own target dir keeps the normal build cached.
# The code compiled only under that cfg gets the same lints.
RUSTFLAGS="${RUSTFLAGS:-} --cfg thunder_loom" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom" \
    cargo clippy --locked -p thunder-engine --lib --tests -- -D warnings
RUSTFLAGS="${RUSTFLAGS:-} --cfg thunder_loom" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom" \
    LOOM_MAX_PREEMPTIONS=2 cargo test --locked -p thunder-engine --release --lib loom

step "Benchmark smoke run (small scale; prints figures, asserts no timing)"
cargo run --release --locked -p thunder-benches --bin compare -- --scale 1000 --queries 200 --settle-secs 0
cargo run --release --locked -p thunder-benches --bin seen_filter -- --scale 1000 --rounds 20 --probes 20000

step "Replay memory (a cold replay of 1M posts stays within 1.5x its store + 128 MiB, 1.25x once caught up)"
# Through the test broker, which answers with whole backlogs: the worst case. About 30 s.
scripts/replay-memory.sh --settle 3 --check 20

if [ "${THUNDER_SOAK:-1}" != "0" ]; then
    step "Short soak (live feed, query load, fresh replica and snapshot restart compared)"
    python3 scripts/soak_verdict_test.py
    scripts/soak.sh --short
fi

if [ "${THUNDER_FUZZ_SECONDS:-60}" != "0" ] && [ -x scripts/fuzz-smoke.sh ]; then
    step "Fuzz smoke run"
    scripts/fuzz-smoke.sh
fi

# One closing line for whoever reads the end of the log: the test count of the run above.
passed=$(grep -Eo '[0-9]+ tests? run: [0-9]+ passed|test result: ok\. [0-9]+ passed' "$summary" \
    | grep -Eo '[0-9]+ passed' | awk '{n += $1} END {print n + 0}')
echo "tests: $passed passed, 0 failed"
