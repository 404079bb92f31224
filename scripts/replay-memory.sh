#!/usr/bin/env bash
# The memory of a cold Kafka replay: how far a release thunder-server's resident memory rises
# above the store it builds, and where it settles once caught up.
#
#   scripts/replay-memory.sh [--settle SECS] [--check] [--mock-broker] [SCALE] [-- SERVER_ARGS...]
#       --settle: seconds from ready to the settled reading (default 10, at least 6: the store's
#       gauges are refreshed every 5 s, so the reading follows a refresh made once caught up).
#       SCALE: the synthetic feed-2d backlog divided by this (default 10: 100k authors, about
#       2M posts; 1 is full scale, 20M posts). SERVER_ARGS go to thunder-server as they are
#       (e.g. `-- -X queued.max.messages.kbytes=4096`). With --check, exits 1 when the peak or
#       the settled memory is over its bound (below), after printing the line. With
#       --mock-broker, replays through librdkafka's mock cluster (server/examples/mock_broker.rs),
#       a broker that honours the fetch limits as Kafka does, instead of the test broker, which
#       answers with a partition's whole backlog; the mock keeps only the newest 5 MB of each
#       partition (about 115k events), so it replays about 920k events at any SCALE up to 20.
#   THUNDER_SERVER_BIN=PATH scripts/replay-memory.sh ...
#       measures that thunder-server binary instead of this tree's (to alternate two builds)
#   THUNDER_REPLAY_TOPIC_READY=1 (with KAFKA_BROKERS set): replays the topic already on that
#       broker instead of starting one and producing the backlog (for rounds on one backlog;
#       THUNDER_REPLAY_BROKER_PID=PID waits for that broker to go quiet first)
#
# Builds the release binaries, starts a test broker of its own (noida-db, installed by
# scripts/kafka-broker.sh), produces the backlog into an 8-partition topic, waits until the
# broker is quiet, then starts the server with no snapshot (a cold replay of the whole topic)
# and samples its resident memory (VmRSS) every 50 ms until /readyz answers 200 and for SECS
# (default 10) after. Prints ONE JSON line:
#   scale, posts            the scale and the posts the store holds once settled
#   events                  records the server read from Kafka until ready
#   replay_secs             process start to /readyz 200
#   replay_events_per_sec   events / replay_secs
#   store_mib               the store's own bytes once settled, as /metrics reports them:
#                           post_store_arena_bytes{kind="reserved"} + post_store_timeline_bytes
#                           + post_store_index_bytes
#   peak_rss_mib            the largest VmRSS sampled from start to the end of the settle period
#   settled_rss_mib         VmRSS at the end of the settle period
#   peak_ratio              peak_rss / store (how many times the store's bytes the process held
#                           at its peak)
#   settled_ratio           settled_rss / store
#   peak_bound_mib          1.5 x store + 128 MiB: the bound a cold replay's peak must keep
#   settled_bound_mib       1.25 x store + 128 MiB: the bound the settled process must keep
#   peak_of_bound           peak_rss / peak_bound (at most 1.0: within the bound)
#   settled_of_bound        settled_rss / settled_bound (at most 1.0: within the bound)
#   rss_bytes_per_post      settled_rss / posts: resident bytes per post as an operator sees them
#   store_bytes_per_post    store / posts
#   oversized_responses     fetch responses larger than receive.message.max.bytes
#                           (kafka_oversized_fetch_responses_total)
# Progress goes to stderr. Full scale needs about 3 GB of memory for the server and 2.5 GB of
# disk for the broker.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SETTLE=10
SCALE=10
CHECK=0
MOCK=0
SERVER_ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
    --settle)
        SETTLE="$2"
        shift 2
        ;;
    --check)
        CHECK=1
        shift
        ;;
    --mock-broker)
        MOCK=1
        shift
        ;;
    --)
        shift
        SERVER_ARGS=("$@")
        break
        ;;
    *)
        SCALE="$1"
        shift
        ;;
    esac
done
cd "$ROOT"
if [ -z "${THUNDER_SERVER_BIN:-}" ] || [ "${THUNDER_REPLAY_TOPIC_READY:-0}" != 1 ]; then
    cargo build --release -q --locked -p thunder-server -p thunder-cli --bins
fi
if [ "$MOCK" = 1 ]; then
    cargo build --release -q --locked -p thunder-server --example mock_broker
fi
BIN="$ROOT/target/release"
SERVER_BIN="${THUNDER_SERVER_BIN:-$BIN/thunder-server}"
WORK="$(mktemp -d)"
SERVER_PID=""
BROKER_PID=""
stop() {
    kill "$1" 2>/dev/null || true
    for _ in $(seq 1 100); do
        kill -0 "$1" 2>/dev/null || break
        sleep 0.05
    done
    kill -9 "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}
cleanup() {
    if [ -n "$SERVER_PID" ]; then stop "$SERVER_PID"; fi
    if [ -n "$BROKER_PID" ]; then stop "$BROKER_PID"; fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1]);s.close()'
}

if [ "${THUNDER_REPLAY_TOPIC_READY:-0}" = 1 ]; then
    : "${KAFKA_BROKERS:?THUNDER_REPLAY_TOPIC_READY needs KAFKA_BROKERS}"
elif [ "$MOCK" = 1 ]; then
    # It serves until its stdin closes: a FIFO held open by this script.
    mkfifo "$WORK/mock.stdin"
    "$BIN/examples/mock_broker" <"$WORK/mock.stdin" >"$WORK/mock.out" 2>&1 &
    BROKER_PID=$!
    exec 4>"$WORK/mock.stdin"
    for _ in $(seq 1 200); do
        [ -s "$WORK/mock.out" ] && break
        sleep 0.05
    done
    KAFKA_BROKERS="$(head -1 "$WORK/mock.out")"
    "$BIN/thunder-cli" produce --kafka-brokers "$KAFKA_BROKERS" --synth --backlog \
        --synth-scale "$SCALE" >&2
else
    # A broker of its own (not scripts/kafka-broker.sh's, which a developer may be using),
    # with its data in the work directory.
    broker_bin="$(scripts/kafka-broker.sh install)"
    port="$(free_port)"
    mkdir -p "$WORK/broker"
    "$broker_bin" start --only kafka --host 127.0.0.1 --kafka-port "$port" \
        --data-dir "$WORK/broker" </dev/null >"$WORK/broker.log" 2>&1 &
    BROKER_PID=$!
    KAFKA_BROKERS="127.0.0.1:$port"
    for _ in $(seq 1 200); do
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break
        kill -0 "$BROKER_PID" 2>/dev/null || { cat "$WORK/broker.log" >&2; exit 1; }
        sleep 0.05
    done
    "$BIN/thunder-cli" produce --kafka-brokers "$KAFKA_BROKERS" --create-topic 8 --synth \
        --backlog --synth-scale "$SCALE" >&2
fi

# The broker shares this machine's cores and keeps busy for a while after a produce (it
# persists its log): wait, up to 300 s, until it used under 0.1 s of CPU in 2 s, so the replay
# is not timed against it.
broker_pid="${BROKER_PID:-${THUNDER_REPLAY_BROKER_PID:-}}"
if [ -n "$broker_pid" ]; then
    waited=0
    while [ "$waited" -lt 300 ]; do
        before="$(awk '{print $14 + $15}' "/proc/$broker_pid/stat")"
        sleep 2
        waited=$((waited + 2))
        after="$(awk '{print $14 + $15}' "/proc/$broker_pid/stat")"
        [ $((after - before)) -ge $(($(getconf CLK_TCK) / 10)) ] || break
    done
    echo "replay-memory: waited ${waited}s for the broker to go quiet" >&2
fi

admin="$(free_port)"
grpc="$(free_port)"
started="$(date +%s.%N)"
RUST_LOG="${RUST_LOG:-warn}" "$SERVER_BIN" --kafka-brokers "$KAFKA_BROKERS" \
    --grpc-addr "127.0.0.1:$grpc" --admin-addr "127.0.0.1:$admin" \
    ${SERVER_ARGS[@]+"${SERVER_ARGS[@]}"} >"$WORK/server.log" 2>&1 &
SERVER_PID=$!

status=0
python3 - "$SERVER_PID" "$admin" "$started" "$SETTLE" "$SCALE" "$CHECK" <<'EOF' || status=$?
import json, sys, time, urllib.request

pid, admin, started, settle, scale, check = sys.argv[1:]
started, settle = float(started), float(settle)
# The post_store_* gauges are refreshed every 5 s (STATS_INTERVAL in server/src/maintenance.rs),
# not when the server turns ready: read them, and the settled RSS, at least one refresh after it.
settle = max(settle, 6.0)
base = f"http://127.0.0.1:{admin}"
MIB = 1 << 20


def rss():
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def get(path):
    try:
        with urllib.request.urlopen(base + path, timeout=2) as answer:
            return answer.status, answer.read().decode()
    except OSError as error:
        return getattr(error, "code", None), ""


def metrics():
    values = {}
    for line in get("/metrics")[1].splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


peak = 0
ready_at = None
last_ready_check = 0.0
events = 0
while True:
    now = time.time()
    try:
        peak = max(peak, rss())
    except (OSError, RuntimeError):
        print("replay-memory: the server exited", file=sys.stderr)
        sys.exit(2)
    if ready_at is None and now - last_ready_check >= 0.2:
        last_ready_check = now
        if get("/readyz")[0] == 200:
            ready_at = time.time()
            events = metrics().get("kafka_messages_consumed_total", 0)
    if ready_at is not None and now - ready_at >= settle:
        break
    time.sleep(0.05)

settled = rss()
peak = max(peak, settled)
m = metrics()
store = (m['post_store_arena_bytes{kind="reserved"}'] + m["post_store_timeline_bytes"]
         + m["post_store_index_bytes"])
posts = m["post_store_total_posts"]
if posts == 0 or store == 0:
    print("replay-memory: the store gauges are still empty once settled (no refresh since ready?)",
          file=sys.stderr)
    sys.exit(2)
replay = ready_at - started
peak_bound = 1.5 * store + 128 * MIB
settled_bound = 1.25 * store + 128 * MIB
print(json.dumps({
    "scale": int(scale),
    "posts": int(posts),
    "events": int(events),
    "replay_secs": round(replay, 2),
    "replay_events_per_sec": round(events / replay),
    "store_mib": round(store / MIB, 1),
    "peak_rss_mib": round(peak / MIB, 1),
    "settled_rss_mib": round(settled / MIB, 1),
    "peak_ratio": round(peak / store, 2),
    "settled_ratio": round(settled / store, 2),
    "peak_bound_mib": round(peak_bound / MIB, 1),
    "settled_bound_mib": round(settled_bound / MIB, 1),
    "peak_of_bound": round(peak / peak_bound, 3),
    "settled_of_bound": round(settled / settled_bound, 3),
    "rss_bytes_per_post": round(settled / posts, 1),
    "store_bytes_per_post": round(store / posts, 1),
    "oversized_responses": int(m.get("kafka_oversized_fetch_responses_total", 0)),
}), flush=True)
if check == "1" and (peak > peak_bound or settled > settled_bound):
    print(f"replay-memory: over the bound: peak {peak / MIB:.1f} MiB (bound {peak_bound / MIB:.1f}),"
          f" settled {settled / MIB:.1f} MiB (bound {settled_bound / MIB:.1f})", file=sys.stderr)
    sys.exit(3)
EOF
case "$status" in
0) ;;
3) exit 1 ;;
*)
    cat "$WORK/server.log" >&2
    exit "$status"
    ;;
esac
