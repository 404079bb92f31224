#!/usr/bin/env bash
# Builds the fuzz targets on the stable toolchain (no sanitizer unless THUNDER_FUZZ_ASAN=1) and
# runs each one for a bounded time, starting from a throw-away copy of its committed seed corpus.
# Fails when a target crashes (the crashing input is kept under fuzz/artifacts/<target>/).
#
#   THUNDER_FUZZ_SECONDS   seconds per target (default 60)
#   THUNDER_FUZZ_TARGETS   space-separated targets (default: all of them)
#   THUNDER_FUZZ_JOBS      libFuzzer -fork jobs per target (default 1: one process)
#   THUNDER_FUZZ_ASAN      1: build and run under AddressSanitizer (stable toolchain through
#                          RUSTC_BOOTSTRAP=1); default 0: no sanitizer (`-s none`)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/../fuzz"

seconds="${THUNDER_FUZZ_SECONDS:-60}"
targets="${THUNDER_FUZZ_TARGETS:-ingest_ordering ingest_ordering_threads kafka_payload grpc_request snapshot_load base_load}"
jobs="${THUNDER_FUZZ_JOBS:-1}"

sanitizer=(-s none)
asan=0
if [ "${THUNDER_FUZZ_ASAN:-0}" = "1" ]; then
    sanitizer=()
    export RUSTC_BOOTSTRAP=1
    # Under -Zsanitizer=address the `cc` crate builds the bundled zstd instrumented too;
    # librdkafka's configure links its checks against it and needs the ASan runtime.
    export LDFLAGS="${LDFLAGS:+$LDFLAGS }-fsanitize=address"
    asan=1
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz-smoke: installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

cargo fuzz build "${sanitizer[@]}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

failed=()
for target in $targets; do
    corpus="$work/$target"
    mkdir -p "$corpus"
    if [ -d "corpus/$target" ]; then
        cp -R "corpus/$target/." "$corpus/"
    fi
    fork=()
    if [ "$jobs" -gt 1 ]; then
        fork=("-fork=$jobs")
    fi
    leaks=()
    if [ "$asan" = 1 ] && [ "$target" = ingest_ordering_threads ]; then
        # LeakSanitizer flags glibc's thread-exit bookkeeping of the short-lived writer threads.
        leaks=(-detect_leaks=0)
    fi
    echo "fuzz-smoke: $target for ${seconds}s"
    if ! cargo fuzz run "${sanitizer[@]}" "$target" "$corpus" -- \
        -max_total_time="$seconds" -timeout=20 -rss_limit_mb=4096 -print_final_stats=1 \
        "${fork[@]}" "${leaks[@]}"; then
        failed+=("$target")
    fi
done

if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz-smoke: crashed: ${failed[*]} (inputs under fuzz/artifacts/)" >&2
    exit 1
fi
echo "fuzz-smoke: all targets ran ${seconds}s without a crash"
