#!/usr/bin/env bash
# A compressed-time soak of a release thunder-server against the real test broker, ending
# with a verdict (printed; exit 1 when a check fails).
#
#   scripts/soak.sh [--short] [--minutes N] [--rate EVENTS_PER_SEC] [--retention-secs S]
#                   [--query-rate QPS] [--scale S] [--partitions P] [--keep DIR]
#
#   --short              the ~3 minute version run by scripts/test.sh (feed 150 s, retention 60 s)
#   --minutes N          feed duration in minutes, fractions allowed (default 30)
#   --rate R             live events per second produced (default 1000)
#   --retention-secs S   the server's --post-retention-seconds (default 120; 60 with --short)
#   --query-rate Q       GetInNetworkPosts calls per second of the steady query load (default 20)
#   --scale S            synthetic workload scale: 1M/S authors (default 100: 10,000 authors)
#   --partitions P       partitions of the topic (default 4)
#   --keep DIR           copy the samples, logs and summaries to DIR before cleaning up
#   --rss-slope-bound M  the RSS check's bound, MiB/min (default 4; see below)
#   THUNDER_SERVER_BIN=PATH   run that thunder-server binary instead of this tree's
#
# What it does, everything on 127.0.0.1, every process and temp dir removed on exit:
#   1. builds thunder-server, thunder-cli, loadgen and answers_compare (--release --locked);
#   2. starts the test broker (noida-db, scripts/kafka-broker.sh install) on a free port with
#      a fresh data dir and creates the topic with P partitions;
#   3. starts server A with the short retention and snapshots on (every retention/6 s, at
#      least 5 s), waits for /readyz;
#   4. feeds the topic with `thunder-cli produce --synth --rate R` (live events stamped now:
#      about 99% creates, 1% deletes of recent posts) for the feed duration, and meanwhile
#      runs `loadgen` at Q calls/s (2000- and 10000-author follow lists of the workload's
#      viewers), counting every status and every answer marked `thunder-degraded`;
#   5. samples server A every 5 s into samples.csv: RSS (/proc), threads, open fds, the store
#      gauges (posts, authors, tombstones, arena reserved, timeline bytes), the summed Kafka
#      lag and the records consumed;
#   6. after the feed: starts server B, a fresh replica that reads the topic from the start,
#      and compares A's answers with B's for ~350 query shapes (answers_compare: follow
#      lists as asked, video-only and capped at 2 per author, and single-author queries);
#   7. kills A with SIGKILL, starts it again from its snapshot dir, checks that it loaded a
#      snapshot and compares its answers with B's again;
#   8. prints the verdict (scripts/soak_verdict.py).
#
# The checks and their bounds (the samples are of the feed phase only):
#   - RSS slope over the second half of the feed <= 4 MiB/min (--rss-slope-bound). Once the
#     window is full the store holds a constant amount of data and trimming frees as much as
#     the feed adds, so RSS must level off; 4 MiB/min is about 70 bytes per event at the
#     default 1000 events/s, below the ~110 bytes a stored post costs (arena record and
#     timeline entry), and above the noise of a 75 s window (arena chunks of 2 MiB, allocator
#     caches). Needs a feed longer than about twice the retention, so the second half starts
#     with a full window. At the short version's size (60k posts, ~7 MiB of store in ~85 MiB
#     of RSS) it catches a leak per event, not a store holding a few times its window: the
#     posts check below does that.
#   - Posts stored within 10% of (events applied per second) x retention, averaged over the
#     samples taken once the window is full (from max(feed/2, retention + 10 s)). Trimming
#     must keep the store at the retention: a post may outlive it by ~10%, and ~1% of the
#     events are deletes. Trimming that runs one of 5 author groups every 120 s whatever the
#     retention keeps posts up to 600 s past it and fails this check (and the RSS slope) at
#     short retentions: it is issue 45's "memory follows the data".
#   - Kafka lag over the second half of the feed <= 30 s of feed (rate x 30): the consumer
#     keeps up.
#   - Open fds: the largest count in the second half exceeds the first half's by <= 16 (no
#     leaked sockets or files); threads are reported.
#   - Non-OK answers: 0, both as loadgen saw them and in the server's
#     get_in_network_posts_requests_total. Degraded answers (the `thunder-degraded` header;
#     get_in_network_posts_degrade_level_total above level 0) are counted and reported only:
#     the steady query load is far below capacity, so any is worth a look, but the degrade
#     ladder's own tests judge it.
#   - Answers equal to the fresh replica: every shape answered identically (a degraded answer
#     or a refusal of A is asked again, for up to 4.5 s; B runs with --max-degrade-level 0),
#     at least a quarter of the shapes non-empty (so the comparison is not of empty answers).
#     Each shape carries min_created_at = now - retention + 10 s, so posts that leave the
#     window while one shape is asked of both servers are not asked for: the comparison covers
#     the posts of the last (retention - 10 s - time since the feed stopped) seconds of feed,
#     so the replica and the restart are checked as soon as they are ready.
#   - The restart from the snapshot: snapshot_loaded_posts > 0 and answers equal to the fresh
#     replica as above.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

MINUTES=30
RATE=1000
RETENTION=""
QUERY_RATE=20
SCALE=100
PARTITIONS=4
KEEP=""
SHORT=0
RSS_SLOPE_BOUND=4
POSTS_TOLERANCE=0.10
LAG_BOUND_SECS=30
FD_GROWTH_BOUND=16
SAMPLE_SECS=5
COMPARE_MARGIN_SECS=10

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
    --short) SHORT=1; shift ;;
    --minutes) MINUTES="$2"; shift 2 ;;
    --rate) RATE="$2"; shift 2 ;;
    --retention-secs) RETENTION="$2"; shift 2 ;;
    --query-rate) QUERY_RATE="$2"; shift 2 ;;
    --scale) SCALE="$2"; shift 2 ;;
    --partitions) PARTITIONS="$2"; shift 2 ;;
    --keep) KEEP="$2"; shift 2 ;;
    --rss-slope-bound) RSS_SLOPE_BOUND="$2"; shift 2 ;;
    -h | --help) usage ;;
    *) echo "soak: unknown argument $1" >&2; usage ;;
    esac
done
if [ "$SHORT" = 1 ]; then
    MINUTES=2.5
    RETENTION="${RETENTION:-60}"
fi
RETENTION="${RETENTION:-120}"
FEED_SECS="$(python3 -c "print(round(float('$MINUTES') * 60))")"
EVENTS="$(python3 -c "print(round($FEED_SECS * float('$RATE')))")"
SNAPSHOT_SECS=$((RETENTION / 6 > 5 ? RETENTION / 6 : 5))

log() { echo "soak: $*" >&2; }

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
log "building (release)"
cargo build --release --locked -q -p thunder-server -p thunder-cli --bins
cargo build --release --locked -q -p thunder-benches --bin loadgen --bin answers_compare
SERVER_BIN="${THUNDER_SERVER_BIN:-$TARGET/release/thunder-server}"
CLI="$TARGET/release/thunder-cli"
LOADGEN="$TARGET/release/loadgen"
COMPARE="$TARGET/release/answers_compare"
KAFKA_BIN="$(scripts/kafka-broker.sh install)"

WORK="$(mktemp -d)"
PIDS=()
cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill -9 "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [ -n "$KEEP" ]; then
        mkdir -p "$KEEP"
        cp -r "$WORK"/*.csv "$WORK"/*.log "$WORK"/*.json "$KEEP"/ 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() {
    python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1]);s.close()'
}

# The value of one metric line (name with labels, as exposed) from a scrape file; 0 if absent.
metric() { awk -v k="$2" '$1 == k {print $2; found=1} END {if (!found) print 0}' "$1"; }
# The sum of a metric over all its labels.
metric_sum() { awk -v k="$2" 'index($1, k "{") == 1 || $1 == k {s += $2} END {print s + 0}' "$1"; }

# Starts the broker on a free port with a fresh data dir.
BROKER_PORT="$(free_port)"
mkdir -p "$WORK/broker"
"$KAFKA_BIN" start --only kafka --host 127.0.0.1 --kafka-port "$BROKER_PORT" \
    --data-dir "$WORK/broker" </dev/null >"$WORK/broker.log" 2>&1 &
PIDS+=($!)
BROKERS="127.0.0.1:$BROKER_PORT"
for _ in $(seq 1 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$BROKER_PORT") 2>/dev/null && break
    sleep 0.05
done
log "broker on $BROKERS; topic with $PARTITIONS partitions"
"$CLI" produce --kafka-brokers "$BROKERS" --create-topic "$PARTITIONS" --live-events 0 \
    </dev/null >>"$WORK/producer.log" 2>&1

# Starts a server (name, extra flags...); sets SERVER_PID, SERVER_GRPC, SERVER_ADMIN.
start_server() {
    local name="$1"
    shift
    SERVER_GRPC="$(free_port)"
    SERVER_ADMIN="$(free_port)"
    RUST_LOG="${RUST_LOG:-info}" "$SERVER_BIN" --kafka-brokers "$BROKERS" \
        --grpc-addr "127.0.0.1:$SERVER_GRPC" --admin-addr "127.0.0.1:$SERVER_ADMIN" \
        --post-retention-seconds "$RETENTION" "$@" >>"$WORK/server-$name.log" 2>&1 &
    SERVER_PID=$!
    PIDS+=("$SERVER_PID")
}

# Waits until the server answers /readyz with 200 (at most $2 seconds).
wait_ready() {
    local name="$1" limit="$2" waited=0
    until curl -sf "http://127.0.0.1:$SERVER_ADMIN/readyz" >/dev/null 2>&1; do
        if ! kill -0 "$SERVER_PID" 2>/dev/null; then
            log "server $name exited; its log follows"
            tail -50 "$WORK/server-$name.log" >&2
            exit 1
        fi
        if [ "$waited" -ge $((limit * 10)) ]; then
            log "server $name not ready after ${limit}s; its log follows"
            tail -50 "$WORK/server-$name.log" >&2
            exit 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}

SNAPSHOTS="$WORK/snapshots"
start_server a --snapshot-dir "$SNAPSHOTS" --snapshot-interval-secs "$SNAPSHOT_SECS"
A_PID="$SERVER_PID" A_GRPC="$SERVER_GRPC" A_ADMIN="$SERVER_ADMIN"
wait_ready a 60
log "server A ready (retention ${RETENTION}s, snapshots every ${SNAPSHOT_SECS}s)"

# Samples server A every SAMPLE_SECS seconds until it is gone.
sampler() {
    local started="$1" scrape="$WORK/scrape.prom" t phase
    echo "t_secs,phase,rss_mib,threads,fds,posts,authors,tombstones,arena_reserved_mib,timeline_mib,lag,consumed" \
        >"$WORK/samples.csv"
    while kill -0 "$A_PID" 2>/dev/null; do
        t="$(python3 -c "import time;print(round(time.time() - $started, 1))")"
        phase=feed
        [ ! -e "$WORK/feed-done" ] || phase=after
        if curl -sf -m 3 "http://127.0.0.1:$A_ADMIN/metrics" >"$scrape" 2>/dev/null; then
            printf '%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s\n' "$t" "$phase" \
                "$(awk '$1 == "VmRSS:" {printf "%.1f", $2 / 1024}' "/proc/$A_PID/status" 2>/dev/null)" \
                "$(awk '$1 == "Threads:" {print $2}' "/proc/$A_PID/status" 2>/dev/null)" \
                "$(find "/proc/$A_PID/fd" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)" \
                "$(metric "$scrape" post_store_total_posts)" \
                "$(metric "$scrape" post_store_user_count)" \
                "$(metric "$scrape" post_store_deleted_posts)" \
                "$(awk '$1 == "post_store_arena_bytes{kind=\"reserved\"}" {printf "%.1f", $2 / 1048576}' "$scrape")" \
                "$(awk '$1 == "post_store_timeline_bytes" {printf "%.1f", $2 / 1048576}' "$scrape")" \
                "$(metric_sum "$scrape" kafka_partition_lag)" \
                "$(metric "$scrape" kafka_messages_consumed_total)" >>"$WORK/samples.csv"
        fi
        sleep "$SAMPLE_SECS"
    done
}

log "feeding $EVENTS events at $RATE/s for ${FEED_SECS}s (scale $SCALE), $QUERY_RATE queries/s"
FEED_START="$(date +%s.%N)"
sampler "$FEED_START" &
SAMPLER_PID=$!
PIDS+=("$SAMPLER_PID")
"$CLI" produce --kafka-brokers "$BROKERS" --synth --synth-scale "$SCALE" \
    --live-events "$EVENTS" --rate "$RATE" </dev/null >>"$WORK/producer.log" 2>&1 &
PRODUCER_PID=$!
PIDS+=("$PRODUCER_PID")
"$LOADGEN" --addr "http://127.0.0.1:$A_GRPC" --scale "$SCALE" --rate "$QUERY_RATE" \
    --concurrency 2 --connections 1 --duration-secs "$FEED_SECS" >"$WORK/loadgen.log" 2>&1 &
LOADGEN_PID=$!
PIDS+=("$LOADGEN_PID")

# The producer paces itself; it may end a little late on a busy machine.
if ! wait "$PRODUCER_PID"; then
    log "the producer failed; its log follows"
    cat "$WORK/producer.log" >&2
    exit 1
fi
touch "$WORK/feed-done"
if ! wait "$LOADGEN_PID"; then
    log "loadgen failed; its log follows"
    cat "$WORK/loadgen.log" >&2
    exit 1
fi
log "feed done: $(grep -o 'produced .*' "$WORK/producer.log" | tail -1)"
log "queries: $(grep -E '^requests|^degraded' "$WORK/loadgen.log" | tr '\n' ' ')"

# The server's own counts of the feed phase, before the comparisons add their calls.
curl -sf "http://127.0.0.1:$A_ADMIN/metrics" >"$WORK/server-a-feed.prom"
awk 'index($1, "get_in_network_posts_requests_total{") == 1 {
        match($1, /status="[^"]*"/); s = substr($1, RSTART + 8, RLENGTH - 9); n[s] += $2
     }
     END { printf "{"; sep = ""; for (k in n) { printf "%s\"%s\": %d", sep, k, n[k]; sep = ", " } print "}" }' \
    "$WORK/server-a-feed.prom" >"$WORK/server-statuses.json"
SERVER_DEGRADED="$(awk 'index($1, "get_in_network_posts_degrade_level_total{") == 1 &&
    $1 !~ /level="0"/ {s += $2} END {print s + 0}' "$WORK/server-a-feed.prom")"

# Compares server A (at $1) with the replica; writes $2.
compare_with_replica() {
    local candidate="$1" out="$2"
    "$COMPARE" --reference "http://127.0.0.1:$B_GRPC" --candidate "http://127.0.0.1:$candidate" \
        --scale "$SCALE" --retention-secs "$RETENTION" --margin-secs "$COMPARE_MARGIN_SECS" \
        >"$out" 2>"$out.log" || true
    log "compared: $(tail -1 "$out" 2>/dev/null)"
    if [ -s "$out.log" ]; then
        head -5 "$out.log" >&2
    fi
}

log "starting a fresh replica (B) that reads the topic from the start"
# B is the reference: it never degrades, so its answers are always the full ones.
start_server b --max-degrade-level 0
B_GRPC="$SERVER_GRPC"
wait_ready b 120
compare_with_replica "$A_GRPC" "$WORK/compare-replica.json"

log "kill -9 server A; starting it again from $SNAPSHOTS"
ls -1 "$SNAPSHOTS" >&2 || true
kill -9 "$A_PID"
wait "$A_PID" 2>/dev/null || true
wait "$SAMPLER_PID" 2>/dev/null || true
start_server a2 --snapshot-dir "$SNAPSHOTS" --snapshot-interval-secs "$SNAPSHOT_SECS"
wait_ready a2 120
curl -sf "http://127.0.0.1:$SERVER_ADMIN/metrics" >"$WORK/server-a2.prom"
LOADED="$(metric "$WORK/server-a2.prom" snapshot_loaded_posts)"
log "restarted: snapshot_loaded_posts $LOADED, ready in $(metric "$WORK/server-a2.prom" init_duration_seconds)s"
compare_with_replica "$SERVER_GRPC" "$WORK/compare-restart.json"

echo
echo "soak: feed ${FEED_SECS}s at $RATE events/s, retention ${RETENTION}s, $QUERY_RATE queries/s, scale $SCALE, $PARTITIONS partitions"
python3 scripts/soak_verdict.py --csv "$WORK/samples.csv" --feed-secs "$FEED_SECS" \
    --retention-secs "$RETENTION" --rate "$RATE" --rss-slope-bound "$RSS_SLOPE_BOUND" \
    --posts-tolerance "$POSTS_TOLERANCE" --lag-bound-secs "$LAG_BOUND_SECS" \
    --fd-growth-bound "$FD_GROWTH_BOUND" --stats-interval-secs "$SAMPLE_SECS" \
    --loadgen "$WORK/loadgen.log" --server-statuses "$WORK/server-statuses.json" \
    --server-degraded "$SERVER_DEGRADED" --replica "$WORK/compare-replica.json" \
    --restart "$WORK/compare-restart.json" --snapshot-loaded-posts "${LOADED%.*}"
