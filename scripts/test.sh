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

# Each step names itself with the seconds since the start, so a slow step shows in CI's log.
step() { printf '\n==> [%4ds] %s\n' "$SECONDS" "$*"; }

step "Build dependencies (Debian packages)"
# librdkafka is built with the system OpenSSL (libssl-dev) into every binary; the optional
# `gssapi` and `curl` features, compiled below, need libsasl2-dev and libcurl; the release check
# makes a CA with the openssl command. Installed once.
missing=()
for module in openssl libsasl2 libcurl; do
    pkg-config --exists "$module" 2>/dev/null || missing+=("$module")
done
if [ "${#missing[@]}" -gt 0 ] || ! command -v openssl >/dev/null 2>&1; then
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
        pkg-config libssl-dev libsasl2-dev libcurl4-openssl-dev openssl
fi

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
# deploy/prometheus/scrape.yml is checked (promtool check config) and run in a real Prometheus
# with the rules by server/tests/deploy_metrics.rs; Debian's build has no Kubernetes discovery,
# so that test lists the pods from a file with the same meta labels. It must not skip here.
export THUNDER_REQUIRE_PROMETHEUS=1

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

step "Loom models (arena slot reuse, timeline ring, the store's core races: every interleaving, two preemptions)"
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

step "Release build (deploy/build-release.sh, what deploy/Dockerfile runs) and its Kafka security"
# The binaries an image ships, built by the image's own script; then the issue-52 check: the
# release server accepts SCRAM over TLS with a real CA and refuses sasl_ssl without a mechanism.
release="$(mktemp -d)"
trap 'rm -f "$summary" "${features_log:-}"; rm -rf "$release"' EXIT
deploy/build-release.sh "$release/bin"
openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=thunder check CA" \
    -keyout "$release/ca.key" -out "$release/CA.pem" 2>/dev/null
scram=(--check-config --kafka-brokers 127.0.0.1:9093 --kafka-security-protocol sasl_ssl
    --kafka-sasl-username u --kafka-ssl-ca-location "$release/CA.pem")
THUNDER_KAFKA_SASL_PASSWORD=p "$release/bin/thunder-server" "${scram[@]}" \
    --kafka-sasl-mechanism SCRAM-SHA-512 >/dev/null
status=0
THUNDER_KAFKA_SASL_PASSWORD=p "$release/bin/thunder-server" "${scram[@]}" >/dev/null \
    2>"$release/refused.txt" || status=$?
if [ "$status" != 2 ] || ! grep -q "needs --kafka-sasl-mechanism" "$release/refused.txt"; then
    echo "sasl_ssl without a mechanism: exit $status, expected 2 with the reason:" >&2
    cat "$release/refused.txt" >&2
    exit 1
fi
echo "release thunder-server: SCRAM-SHA-512 over TLS accepted, no mechanism refused (exit 2)"
echo "runtime libraries:"
ldd "$release/bin/thunder-server" | awk '{print "  " $1}'

step "Replay memory (a cold replay of 1M posts stays within 1.5x its store + 128 MiB, 1.25x once caught up)"
# Through the test broker, which answers with whole backlogs: the worst case. About 30 s.
scripts/replay-memory.sh --settle 6 --check 20

if [ "${THUNDER_SOAK:-1}" != "0" ]; then
    step "Short soak (live feed, query load, fresh replica and snapshot restart compared)"
    python3 scripts/soak_verdict_test.py
    scripts/soak.sh --short
fi

# The optional features' compile goes on beside the fuzz runs (each keeps one core busy); it
# is awaited, and its failure reported, below.
features_log="$(mktemp)"
CARGO_BUILD_JOBS=1 cargo check --locked -p thunder-server --lib --features gssapi,curl \
    >"$features_log" 2>&1 &
features_pid=$!

if [ "${THUNDER_FUZZ_SECONDS:-60}" != "0" ] && [ -x scripts/fuzz-smoke.sh ]; then
    step "Fuzz smoke run"
    scripts/fuzz-smoke.sh
fi

step "Optional Kafka features compile (gssapi: Kerberos via libsasl2; curl: OAUTHBEARER OIDC)"
# Compiling is all CI can do for them (no KDC or OIDC provider here): one more librdkafka
# build, about 4 minutes on 2 cores. It started beside the fuzz runs above, which keep one
# core busy each, and is awaited here.
if ! wait "$features_pid"; then
    cat "$features_log" >&2
    echo "the optional Kafka features do not compile" >&2
    exit 1
fi
echo "gssapi and curl compile"

# One closing line for whoever reads the end of the log: the test count of the run above.
passed=$(grep -Eo '[0-9]+ tests? run: [0-9]+ passed|test result: ok\. [0-9]+ passed' "$summary" \
    | grep -Eo '[0-9]+ passed' | awk '{n += $1} END {print n + 0}')
echo "tests: $passed passed, 0 failed (${SECONDS}s in all)"
