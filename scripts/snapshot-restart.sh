#!/usr/bin/env bash
# Restart-to-ready of a release thunder-server against a local broker: a cold replay of the
# topic against a restart from the snapshot written at graceful shutdown.
#
#   scripts/snapshot-restart.sh [SCALE]     feed-2d at SCALE (default 20: 50k authors, 1M posts)
#   THUNDER_SERVER_BIN=PATH scripts/snapshot-restart.sh [SCALE]
#       times that thunder-server binary instead of this tree's (to alternate two builds)
#   scripts/snapshot-restart.sh --warmed [SCALE]
#       waits 10 s more before the cold replay and the start from the snapshot (so the memory
#       the previous server freed has gone back to the host, on a virtual machine that hands freed memory
#       back), then times a third start from the snapshot right after the fresh_memory bench
#       has touched and freed as much memory as the load took: the difference is the host's
#       cost of backing the load's fresh memory (see docs/performance-history.md, *Snapshots and restart*)
#
# Builds the release binaries, starts a broker (scripts/kafka-broker.sh), produces the backlog
# into an 8-partition topic, then times, from process start to /readyz 200:
#   1. a server with --snapshot-dir replaying the whole topic (no snapshot yet), stopped with
#      SIGTERM (it writes its snapshot on the way out);
#   2. the same server started again, loading that snapshot and resuming Kafka from its offsets.
# For each it also prints the server's own CPU time to ready and its peak resident memory so
# far (/proc), the fetch responses it found larger than its receive.message.max.bytes
# (kafka_oversized_fetch_responses_total) and the broker's CPU time meanwhile. The broker
# shares this machine's cores and keeps busy for tens of seconds after a run (it persists its
# whole log after consumer commits), so each timed start first waits, up to 300 s, until the
# broker has used under 0.1 s of CPU in 2 s: on a deployment the broker runs on other machines.
# Full scale (SCALE 1, 20.2M events) needs about 3 GB of memory per server and 2.5 GB of disk.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WARMED=0
if [ "${1:-}" = "--warmed" ]; then
    WARMED=1
    shift
fi
SCALE="${1:-20}"
cd "$ROOT"
cargo build --release -q -p thunder-server -p thunder-cli --bins
if [ "$WARMED" = 1 ]; then
    cargo build --release -q -p thunder-benches --bin fresh_memory
fi
BIN="$ROOT/target/release"
SERVER_BIN="${THUNDER_SERVER_BIN:-$BIN/thunder-server}"
WORK="$(mktemp -d)"
SERVER_PID=""
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill -9 "$SERVER_PID" 2>/dev/null || true; fi
    scripts/kafka-broker.sh stop >/dev/null 2>&1 || true
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

eval "$(scripts/kafka-broker.sh start)"
"$BIN/thunder-cli" produce --kafka-brokers "$KAFKA_BROKERS" --create-topic 8 --synth --backlog \
    --synth-scale "$SCALE" >&2

free_port() {
    python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1]);s.close()'
}

BROKER_PID="$(cat "$ROOT/target/kafka-broker/pid")"
broker_ticks() { awk '{print $14 + $15}' "/proc/$BROKER_PID/stat"; }

# Waits until the broker is quiet (see the top), at most 300 s.
wait_for_quiet_broker() {
    local before after waited=0
    while [ "$waited" -lt 300 ]; do
        before="$(broker_ticks)"
        sleep 2
        waited=$((waited + 2))
        after="$(broker_ticks)"
        if [ $((after - before)) -lt $(($(getconf CLK_TCK) / 10)) ]; then
            echo "  (waited ${waited}s for the broker to go quiet)" >&2
            return
        fi
    done
    echo "  (the broker was still busy after 300s)" >&2
}

# Starts the server, sets ELAPSED to the seconds from start to /readyz 200, CPU to its CPU
# seconds until then, ANON_MIB to the most anonymous memory it held meanwhile (sampled every
# 50 ms: VmHWM also counts the file pages a load maps) and OVERSIZED to its oversized fetch
# responses; leaves it running.
start_and_time() {
    local admin grpc started ticks broker_before
    admin="$(free_port)"
    grpc="$(free_port)"
    wait_for_quiet_broker
    if [ "$WARMED" = 1 ] && [ -z "${SERVER_PREFACE:-}" ]; then
        sleep 10
    fi
    if [ -n "${SERVER_PREFACE:-}" ]; then
        $SERVER_PREFACE >/dev/null
    fi
    broker_before="$(broker_ticks)"
    started="$(date +%s.%N)"
    RUST_LOG=warn,thunder_server::snapshot=info "$SERVER_BIN" --kafka-brokers "$KAFKA_BROKERS" \
        --grpc-addr "127.0.0.1:$grpc" --admin-addr "127.0.0.1:$admin" \
        --snapshot-dir "$WORK/snapshots" --snapshot-interval-secs 0 >"$WORK/server.log" 2>&1 &
    SERVER_PID=$!
    local anon_kib=0 now_kib
    until curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1; do
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$WORK/server.log" >&2; exit 1; }
        now_kib="$(awk '$1 == "RssAnon:" {print $2}' "/proc/$SERVER_PID/status" 2>/dev/null \
            || true)"
        [ "${now_kib:-0}" -le "$anon_kib" ] || anon_kib="$now_kib"
        sleep 0.05
    done
    ANON_MIB=$((anon_kib / 1024))
    ELAPSED="$(python3 -c "import sys;print(round($(date +%s.%N) - $started, 2))")"
    ticks="$(awk '{print $14 + $15}' "/proc/$SERVER_PID/stat")"
    CPU="$(python3 -c "print(round($ticks / $(getconf CLK_TCK), 2))")"
    BROKER_CPU="$(python3 -c "print(round(($(broker_ticks) - $broker_before) / $(getconf CLK_TCK), 2))")"
    PEAK_MIB="$(awk '$1 == "VmHWM:" {print int($2 / 1024)}' "/proc/$SERVER_PID/status")"
    OVERSIZED="$(curl -sf "http://127.0.0.1:$admin/metrics" |
        awk '$1 == "kafka_oversized_fetch_responses_total" {print $2}')"
}

# Prints the last start's load line (its posts, load time and read time) from the server log.
print_load() {
    sed 's/\x1b\[[0-9;]*m//g' "$WORK/server.log" | grep 'snapshot loaded' \
        | grep -oE ' (posts|took_secs|read_secs)=[0-9.]+' | tr -d '\n' | sed 's/^/  load:/' >&2 || true
    echo >&2
}

stop_server() {
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID"
    SERVER_PID=""
}

start_and_time
cold="$ELAPSED"
echo "cold replay: ready in ${cold}s, ${CPU}s of server CPU (broker ${BROKER_CPU}s), peak RSS ${PEAK_MIB} MiB (anonymous ${ANON_MIB} MiB), ${OVERSIZED:-?} oversized fetch responses" >&2
stop_server
snapshot="$(ls -1 "$WORK"/snapshots/*.thsnap | tail -1)"
bytes="$(stat -c %s "$snapshot")"
start_and_time
warm="$ELAPSED"
echo "from the snapshot: ready in ${warm}s, ${CPU}s of server CPU (broker ${BROKER_CPU}s), peak RSS ${PEAK_MIB} MiB (anonymous ${ANON_MIB} MiB), ${OVERSIZED:-?} oversized fetch responses" >&2
# The load's own share of that (the rest is start-up and the Kafka catch-up).
print_load
stop_server
echo "scale $SCALE: ready after a cold replay in ${cold}s, after loading a ${bytes}-byte snapshot in ${warm}s ($(python3 -c "print(round($cold / $warm, 1))")x faster)"
if [ "$WARMED" = 1 ]; then
    # As much memory as the load held at its peak, plus a margin, touched and freed just
    # before the start (after the wait for a quiet broker, which would let it go cold).
    warm_mib=$((ANON_MIB + 256))
    SERVER_PREFACE="$BIN/fresh_memory --mib $warm_mib --pauses-secs 0"
    start_and_time
    warmed="$ELAPSED"
    SERVER_PREFACE=""
    echo "from the snapshot, ${warm_mib} MiB touched and freed first: ready in ${warmed}s, ${CPU}s of server CPU" >&2
    print_load
    stop_server
    echo "scale $SCALE: with the host's cost of fresh memory taken out, ready from the snapshot in ${warmed}s ($(python3 -c "print(round($cold / $warmed, 1))")x faster than the cold replay)"
fi
