#!/usr/bin/env bash
# Restart-to-ready of a release thunder-server against a local broker: a cold replay of the
# topic against a restart from the base written at graceful shutdown, and against a restart
# after SIGKILL from a base written while serving plus the tail since.
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
#      SIGTERM (it writes its snapshot, a base file, on the way out);
#   2. the same server started again, mapping that base and resuming Kafka from its offsets;
#      a replica replaying the whole topic is started beside it and answers_compare asks both
#      the same queries (every answer must be equal);
#   3. that server writes a base while serving (POST /admin/snapshot, paced as the periodic
#      ones), TAIL live events are produced after it (default: 1% of the backlog) and the
#      server is killed with SIGKILL; a start from that base replays the tail, and its answers
#      are compared with the replica's again;
#   4. a start from the base that one wrote at its graceful stop, the file's pages dropped
#      from the page cache first (posix_fadvise DONTNEED): a node that never read the file.
# For each it also prints the server's own CPU time to ready and its memory: peak resident,
# anonymous (sampled every 50 ms), and at ready the resident total with its file-backed part
# (the base's mapped pages it has touched); the fetch responses it found larger than its
# receive.message.max.bytes (kafka_oversized_fetch_responses_total) and the broker's CPU time
# meanwhile. The broker
# shares this machine's cores and keeps busy for tens of seconds after a run (it persists its
# whole log after consumer commits), so each timed start first waits, up to 300 s, until the
# broker has used under 0.1 s of CPU in 2 s: on a deployment the broker runs on other machines.
# Full scale (SCALE 1, 20.2M events) needs about 3 GB of memory per server (two run at once in
# steps 2 and 3) and 3.5 GB of disk.
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
cargo build --release -q -p thunder-benches --bin answers_compare
if [ "$WARMED" = 1 ]; then
    cargo build --release -q -p thunder-benches --bin fresh_memory
fi
BIN="$ROOT/target/release"
SERVER_BIN="${THUNDER_SERVER_BIN:-$BIN/thunder-server}"
WORK="$(mktemp -d)"
SERVER_PID=""
REPLICA_PID=""
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill -9 "$SERVER_PID" 2>/dev/null || true; fi
    if [ -n "$REPLICA_PID" ]; then kill -9 "$REPLICA_PID" 2>/dev/null || true; fi
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

# Starts the server (with the snapshot directory, after the broker went quiet; with
# SNAPSHOTS=0 a replica without either, not to be timed), sets ELAPSED to the
# seconds from start to /readyz 200, CPU to its CPU seconds until then, ANON_MIB to the most
# anonymous memory it held meanwhile (sampled every 50 ms: VmHWM also counts the file pages a
# load maps), RSS_MIB and FILE_MIB to its resident memory at ready and the file-backed part
# of it, and OVERSIZED to its oversized fetch responses; leaves it running, its gRPC and
# admin ports in GRPC and ADMIN, its log in $WORK/server.log.
start_and_time() {
    local started ticks broker_before snapshot_flags=()
    ADMIN="$(free_port)"
    GRPC="$(free_port)"
    if [ "${SNAPSHOTS:-1}" = 1 ]; then
        snapshot_flags=(--snapshot-dir "$WORK/snapshots" --snapshot-interval-secs 0)
    fi
    if [ "${SNAPSHOTS:-1}" = 1 ]; then
        wait_for_quiet_broker
    fi
    if [ "$WARMED" = 1 ] && [ -z "${SERVER_PREFACE:-}" ]; then
        sleep 10
    fi
    if [ -n "${SERVER_PREFACE:-}" ]; then
        $SERVER_PREFACE >/dev/null
    fi
    broker_before="$(broker_ticks)"
    started="$(date +%s.%N)"
    RUST_LOG=warn,thunder_server::snapshot=info "$SERVER_BIN" --kafka-brokers "$KAFKA_BROKERS" \
        --grpc-addr "127.0.0.1:$GRPC" --admin-addr "127.0.0.1:$ADMIN" \
        "${snapshot_flags[@]}" >"$WORK/server.log" 2>&1 &
    SERVER_PID=$!
    local anon_kib=0 now_kib
    until curl -sf "http://127.0.0.1:$ADMIN/readyz" >/dev/null 2>&1; do
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
    RSS_MIB="$(awk '$1 == "VmRSS:" {print int($2 / 1024)}' "/proc/$SERVER_PID/status")"
    FILE_MIB="$(awk '$1 == "RssFile:" {print int($2 / 1024)}' "/proc/$SERVER_PID/status")"
    OVERSIZED="$(curl -sf "http://127.0.0.1:$ADMIN/metrics" |
        awk '$1 == "kafka_oversized_fetch_responses_total" {print $2}')"
}

# One line of the last start's figures, after LABEL.
report_start() {
    echo "$1: ready in ${ELAPSED}s, ${CPU}s of server CPU (broker ${BROKER_CPU}s), peak RSS ${PEAK_MIB} MiB (anonymous ${ANON_MIB} MiB), at ready ${RSS_MIB} MiB resident (${FILE_MIB} MiB of it file pages), ${OVERSIZED:-?} oversized fetch responses" >&2
}

# Asks the running server (the candidate) and the replica the same queries, once the replica
# has stopped consuming (it reads the live tail as it comes); exits on a difference.
compare_with_replica() {
    local consumed before=-1
    while true; do
        consumed="$(curl -sf "http://127.0.0.1:$REPLICA_ADMIN/metrics" |
            awk '$1 == "kafka_messages_consumed_total" {print $2}')"
        [ "$consumed" != "$before" ] || break
        before="$consumed"
        sleep 1
    done
    "$BIN/answers_compare" --reference "http://127.0.0.1:$REPLICA_GRPC" \
        --candidate "http://127.0.0.1:$GRPC" --scale "$SCALE" --retention-secs 172800 >&2 || {
        echo "$1: the answers differ from the replica's" >&2
        exit 1
    }
    echo "$1: answers equal the replica's" >&2
}

# Prints the last start's load line (its posts, load time and read or verify time) from the
# server log.
print_load() {
    sed 's/\x1b\[[0-9;]*m//g' "$WORK/server.log" | grep -E 'snapshot loaded|base mapped' \
        | grep -oE ' (posts|tombstones|took_secs|read_secs|map_secs|verify_secs|restore_secs)=[0-9.]+' | tr -d '\n' \
        | sed 's/^/  load:/' >&2 || true
    echo >&2
}

# Starts a replica that replays the whole topic, to compare answers with (not timed), beside
# the running server.
start_replica() {
    local pid="$SERVER_PID" grpc="$GRPC" admin="$ADMIN"
    SNAPSHOTS=0 start_and_time
    REPLICA_PID="$SERVER_PID"
    REPLICA_GRPC="$GRPC"
    REPLICA_ADMIN="$ADMIN"
    SERVER_PID="$pid"
    GRPC="$grpc"
    ADMIN="$admin"
}

stop_replica() {
    kill -TERM "$REPLICA_PID"
    wait "$REPLICA_PID" || true
    REPLICA_PID=""
}

stop_server() {
    kill -TERM "$SERVER_PID"
    wait "$SERVER_PID"
    SERVER_PID=""
}

start_and_time
cold="$ELAPSED"
cold_rss="$RSS_MIB"
report_start "cold replay"
stop_server
snapshot="$(ls -1 "$WORK"/snapshots/*.thsnap | tail -1)"
bytes="$(stat -c %s "$snapshot")"
start_and_time
warm="$ELAPSED"
warm_anon="$ANON_MIB"
report_start "from the base"
# The load's own share of that (the rest is start-up and the Kafka catch-up).
print_load
echo "scale $SCALE: ready after a cold replay in ${cold}s (${cold_rss} MiB resident), after mapping a ${bytes}-byte base in ${warm}s ($(python3 -c "print(round($cold / $warm, 1))")x faster; ${RSS_MIB} MiB resident, ${FILE_MIB} MiB of it the base's pages)"

start_replica
compare_with_replica "from the base"
# The replica stops for the timed start below (a broker it reads from does not go quiet).
stop_replica

# A base written while serving, a tail after it, then SIGKILL.
curl -sf -X POST -H 'X-Thunder-Admin: 1' "http://127.0.0.1:$ADMIN/admin/snapshot" >/dev/null
TAIL="${TAIL:-$((20200000 / SCALE / 100))}"
"$BIN/thunder-cli" produce --kafka-brokers "$KAFKA_BROKERS" --synth --synth-scale "$SCALE" \
    --live-events "$TAIL" >&2
kill -9 "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
SERVER_PID=""
start_and_time
killed="$ELAPSED"
report_start "after SIGKILL, from the base written while serving and a tail of $TAIL events"
print_load
start_replica
compare_with_replica "after SIGKILL"
stop_server
echo "scale $SCALE: after SIGKILL ready in ${killed}s, the tail of $TAIL events included (the cold replay took $(python3 -c "print(round($cold * $TAIL / 20200000 * $SCALE, 2))")s per as many events)"
stop_replica

# A start as on another node: the newest base's pages dropped from the page cache first, so
# the start reads the file from the disk (what a pod rescheduled with its volume pays).
newest="$(ls -1 "$WORK"/snapshots/*.thsnap | tail -1)"
python3 -c 'import os,sys;fd=os.open(sys.argv[1],os.O_RDONLY);os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED);os.close(fd)' "$newest"
start_and_time
report_start "from the base, its pages not in the page cache"
print_load
stop_server
echo "scale $SCALE: from the base with a cold page cache ready in ${ELAPSED}s"

if [ "$WARMED" = 1 ]; then
    # As much memory as the load held at its peak, plus a margin, touched and freed just
    # before the start (after the wait for a quiet broker, which would let it go cold).
    warm_mib=$((warm_anon + 256))
    SERVER_PREFACE="$BIN/fresh_memory --mib $warm_mib --pauses-secs 0"
    start_and_time
    warmed="$ELAPSED"
    SERVER_PREFACE=""
    echo "from the snapshot, ${warm_mib} MiB touched and freed first: ready in ${warmed}s, ${CPU}s of server CPU" >&2
    print_load
    stop_server
    echo "scale $SCALE: with the host's cost of fresh memory taken out, ready from the snapshot in ${warmed}s ($(python3 -c "print(round($cold / $warmed, 1))")x faster than the cold replay)"
fi
