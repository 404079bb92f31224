#!/usr/bin/env bash
# Server CPU per GetInNetworkPosts answer, measured from the server's own /proc/PID/stat.
#
# Starts the release demo server, then for each request kind (full: a viewer following 2000
# demo authors, 1200 posts per answer; small: one author; empty: 2000 unknown authors) posts
# one fixed gRPC frame with h2load (installed from Debian's nghttp2-client if missing; the
# client is pinned to the last core) and prints, per kind: answers/s, server CPU per request
# (delta utime+stime over the run / requests), posts per answer and the outcomes counted in
# the server's get_in_network_posts_requests_total.
#
#   scripts/serve-bench.sh [--scale 100] [--requests 20000] [--clients 4] [--streams 4]
#                          [--kinds full,small,empty] [--server-cpus LIST] [--no-build]
#                          [-- extra server flags]
#       --server-cpus pins the server (taskset -c LIST), e.g. 0 to keep it off the client's core
#       and measure it without the client preempting it.
#   scripts/serve-bench.sh --overload [--timeout-ms 100]   # 8 x 64 streams with grpc-timeout
#   scripts/serve-bench.sh --baseline DIR [--rounds 5] [other flags]
#       side by side: alternates DIR/release's binaries (e.g. a build of main) with this build,
#       --rounds times each (the machine is shared and noisy), then prints per kind the median
#       server CPU per request of each and their ratio.
#   scripts/serve-bench.sh --floor [--rounds 3] [other flags]
#       thunder against its floor: alternates thunder-server with floor_server (thunder-benches:
#       the same serving path and codec answering each request kind with the answer the demo
#       store gave it at start, encoded per call, no store), --rounds times each under the same
#       h2load load, then prints per kind the median server CPU per request of each, their ratio
#       thunder / floor and the bytes per answer of each, and one JSON line.
#   scripts/serve-bench.sh --server floor [flags]   # one run against floor_server alone
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

scale=100 requests=20000 clients=4 streams=4 kinds=full,small,empty build=1
overload=0 timeout_ms=100 server_flags=() baseline="" rounds="" passed=() server_cpus=""
floor=0 server=thunder
# --baseline, --floor and --rounds are taken out here; everything else is parsed below (and
# passed on to each run of a side-by-side comparison).
while [ $# -gt 0 ]; do
    case "$1" in
        --baseline) baseline=$2; shift 2 ;;
        --floor) floor=1; shift ;;
        --rounds) rounds=$2; shift 2 ;;
        --) passed+=("$@"); break ;;
        *) passed+=("$1"); shift ;;
    esac
done
set -- ${passed[@]+"${passed[@]}"}
while [ $# -gt 0 ]; do
    case "$1" in
        --scale) scale=$2; shift 2 ;;
        --requests) requests=$2; shift 2 ;;
        --clients) clients=$2; shift 2 ;;
        --streams) streams=$2; shift 2 ;;
        --kinds) kinds=$2; shift 2 ;;
        --server-cpus) server_cpus=$2; shift 2 ;;
        --no-build) build=0; shift ;;
        --overload) overload=1; shift ;;
        --timeout-ms) timeout_ms=$2; shift 2 ;;
        --server) server=$2; shift 2 ;;
        --) shift; server_flags=("$@"); break ;;
        *) echo "unknown flag $1" >&2; exit 2 ;;
    esac
done

if ! command -v h2load >/dev/null 2>&1; then
    echo "installing h2load (Debian package nghttp2-client)" >&2
    as_root=()
    [ "$(id -u)" = 0 ] || as_root=(sudo)
    "${as_root[@]}" apt-get install -y -q nghttp2-client >/dev/null \
        || { "${as_root[@]}" apt-get update -q >/dev/null && "${as_root[@]}" apt-get install -y -q nghttp2-client >/dev/null; }
fi

case "$server" in
    thunder) server_bin=thunder-server ;;
    floor) server_bin=floor_server ;;
    *) echo "--server is thunder or floor, not $server" >&2; exit 2 ;;
esac
[ -z "$baseline" ] || [ "$floor" = 0 ] || { echo "--baseline and --floor do not mix" >&2; exit 2; }
[ -n "$rounds" ] || { rounds=5; [ "$floor" = 0 ] || rounds=3; }

target="${CARGO_TARGET_DIR:-target}/release"
if [ "$build" = 1 ]; then
    cargo build --release --locked -p thunder-server -p thunder-cli --bins >&2
    if [ "$floor" = 1 ] || [ "$server" = floor ]; then
        cargo build --release --locked -p thunder-benches --bin floor_server >&2
    fi
fi

if [ "$floor" = 1 ]; then
    [ -x "$target/floor_server" ] || { echo "no $target/floor_server" >&2; exit 2; }
    runs="$(mktemp)"
    trap 'rm -f "$runs"' EXIT
    for round in $(seq "$rounds"); do
        for side in thunder floor; do
            "$PWD/scripts/serve-bench.sh" --no-build --server "$side" ${passed[@]+"${passed[@]}"} | tail -n +2 | sed "s/^/$side /" | tee -a "$runs" >&2
        done
    done
    # Columns of a run line: side kind scale requests seconds answers/s cpu posts bytes outcomes.
    awk -v rounds="$rounds" -v requests="$requests" '
        function median(list,    n, v, i, j, t) {
            n = split(list, v, " ")
            for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
            return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
        }
        { key = $2 " " $3; cpu[$1, key] = cpu[$1, key] " " $7; bytes[$1, key] = bytes[$1, key] " " $9
          if (!(key in seen)) { seen[key] = 1; order[++kinds] = key } }
        END {
            printf "%-6s %6s %20s %18s %14s %14s %13s\n", "kind", "scale", "thunder_cpu_us/req", "floor_cpu_us/req", "thunder/floor", "thunder_bytes", "floor_bytes"
            json = ""
            for (k = 1; k <= kinds; k++) {
                split(order[k], ks, " ")
                t = median(cpu["thunder", order[k]]); f = median(cpu["floor", order[k]])
                tb = median(bytes["thunder", order[k]]); fb = median(bytes["floor", order[k]])
                r = f > 0 ? t / f : 0
                printf "%-6s %6s %20.1f %18.1f %14.2f %14.0f %13.0f\n", ks[1], ks[2], t, f, r, tb, fb
                json = json sprintf("%s\"%s\":{\"thunder_cpu_us_per_req\":%.1f,\"floor_cpu_us_per_req\":%.1f,\"ratio\":%.3f,\"thunder_bytes\":%.0f,\"floor_bytes\":%.0f}", (k > 1 ? "," : ""), ks[1], t, f, r, tb, fb)
                scale = ks[2]
            }
            printf "(medians of %d alternating runs each)\n", rounds
            printf "{\"bench\":\"serve-floor\",\"scale\":%s,\"requests\":%s,\"rounds\":%d,\"kinds\":{%s}}\n", scale, requests, rounds, json
        }' "$runs"
    exit 0
fi

if [ -n "$baseline" ]; then
    [ -x "$baseline/release/thunder-server" ] || { echo "no $baseline/release/thunder-server" >&2; exit 2; }
    this_dir="$(cd "${CARGO_TARGET_DIR:-target}" && pwd)"
    runs="$(mktemp)"
    trap 'rm -f "$runs"' EXIT
    for round in $(seq "$rounds"); do
        for side in baseline this; do
            dir=$this_dir
            [ "$side" = baseline ] && dir=$baseline
            CARGO_TARGET_DIR="$dir" "$PWD/scripts/serve-bench.sh" --no-build ${passed[@]+"${passed[@]}"} | tail -n +2 | sed "s/^/$side /" | tee -a "$runs" >&2
        done
    done
    printf '%-6s %6s %22s %18s %7s\n' kind scale "baseline_cpu_us/req" "this_cpu_us/req" ratio
    awk -v rounds="$rounds" '
        function median(list,    n, v, i, j, t) {
            n = split(list, v, " ")
            for (i = 2; i <= n; i++) for (j = i; j > 1 && v[j - 1] + 0 > v[j] + 0; j--) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
            return n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
        }
        { key = $2 " " $3; cpu[$1, key] = cpu[$1, key] " " $7; if (!(key in seen)) { seen[key] = 1; order[++kinds] = key } }
        END {
            for (k = 1; k <= kinds; k++) {
                split(order[k], ks, " ")
                b = median(cpu["baseline", order[k]]); t = median(cpu["this", order[k]])
                printf "%-6s %6s %22.1f %18.1f %7.2f\n", ks[1], ks[2], b, t, (b > 0 ? t / b : 0)
            }
            printf "(medians of %d alternating runs each)\n", rounds
        }' "$runs"
    exit 0
fi

work="$(mktemp -d)"
server_pid=""
cleanup() {
    if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
grpc_port=$(free_port)
admin_port=$(free_port)
pin=()
[ -z "$server_cpus" ] || pin=(taskset -c "$server_cpus")
# The request frames (the floor server answers each with the demo store's answer to it).
IFS=, read -r -a kind_list <<<"$kinds"
floor_flags=()
for kind in "${kind_list[@]}"; do
    "$target/thunder-cli" frame --kind "$kind" --scale "$scale" --out "$work/$kind.bin" >/dev/null
    floor_flags+=(--answer-for "$work/$kind.bin")
done
[ "$server" = floor ] || floor_flags=()
${pin[@]+"${pin[@]}"} "$target/$server_bin" --grpc-addr "127.0.0.1:$grpc_port" --admin-addr "127.0.0.1:$admin_port" \
    --demo-scale "$scale" --qps-limit 1000000 ${floor_flags[@]+"${floor_flags[@]}"} "${server_flags[@]}" >"$work/server.log" 2>&1 &
server_pid=$!
# The demo store loads before the server is ready: seconds at the default scale, about a
# minute of a loaded machine at --scale 1 (20M posts). A server that dies is caught at once.
for _ in $(seq 6000); do
    if curl -fs "http://127.0.0.1:$admin_port/readyz" >/dev/null 2>&1; then break; fi
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
    sleep 0.1
done
curl -fs "http://127.0.0.1:$admin_port/readyz" >/dev/null || { echo "server not ready" >&2; exit 1; }

ticks_per_sec=$(getconf CLK_TCK)
last_core=$(( $(nproc) - 1 ))
url="http://127.0.0.1:$grpc_port/thunder.v1.InNetworkPostsService/GetInNetworkPosts"

# utime + stime of the server, in clock ticks (fields 14 and 15; the command name may hold spaces).
cpu_ticks() { sed 's/.*) //' "/proc/$server_pid/stat" | awk '{print $12 + $13}'; }
# The sum of every sample of metric $1 (all label sets) matching the optional label filter $2.
metric() { curl -fs "http://127.0.0.1:$admin_port/metrics" | awk -v name="$1" -v filter="${2:-}" '
    $1 ~ "^"name"({|$)" && index($1, filter) { sum += $2 } END { printf "%.0f\n", sum }'; }
outcomes() { curl -fs "http://127.0.0.1:$admin_port/metrics" \
    | awk '/^get_in_network_posts_requests_total{/ { match($1, /status="[^"]*"/); s = substr($1, RSTART + 8, RLENGTH - 9); printf "%s=%s ", s, $2 }'; }

h2() {
    local frame=$1 n=$2 c=$3 m=$4; shift 4
    taskset -c "$last_core" h2load -n "$n" -c "$c" -m "$m" -d "$frame" \
        -H 'content-type: application/grpc' -H 'te: trailers' "$@" "$url"
}

if [ "$overload" = 1 ]; then
    "$target/thunder-cli" frame --kind full --scale "$scale" --out "$work/full.bin" >/dev/null
    "$target/thunder-cli" frame --kind small --scale "$scale" --out "$work/small.bin" >/dev/null
    before=$(outcomes)
    echo "overload: 8 connections x 64 streams of full requests, grpc-timeout ${timeout_ms}m, $requests requests"
    h2 "$work/full.bin" "$requests" 8 64 -H "grpc-timeout: ${timeout_ms}m" >"$work/h2.out" &
    load=$!
    sleep 1
    # A light request while the load runs: how long it waits.
    for i in 1 2 3 4 5; do
        h2 "$work/small.bin" 1 1 1 -H "grpc-timeout: ${timeout_ms}m" | awk -v i="$i" '/time for request/ {print "light request " i ": " $0}'
        sleep 0.3
    done
    wait "$load"
    grep -E 'finished in|requests:' "$work/h2.out"
    echo "outcomes before: $before"
    echo "outcomes after:  $(outcomes)"
    curl -fs "http://127.0.0.1:$admin_port/metrics" | grep -E "^(get_in_network_posts_degrade_level_total|rejected_requests_total|get_in_network_posts_late_answers_total)" || true
    curl -fs "http://127.0.0.1:$admin_port/metrics" | awk '
        /^get_in_network_posts_refusal_seconds_bucket\{le="0\.0008[0-9]*"\}/ { fast = $2 }
        /^get_in_network_posts_refusal_seconds_count/ { n = $2 }
        END { if (n > 0) printf "refusals decided within 0.8 ms of the call start: %d of %d\n", fast, n }'
    echo "server threads: $(ls /proc/$server_pid/task | wc -l), RSS: $(awk '/VmRSS/ {print $2, $3}' /proc/$server_pid/status)"
    exit 0
fi

printf '%-6s %6s %9s %9s %12s %15s %13s %13s  %s\n' kind scale requests seconds answers/s "server_cpu_us/req" posts/answer bytes/answer outcomes
for kind in "${kind_list[@]}"; do
    frame="$work/$kind.bin"
    h2 "$frame" $(( requests / 10 + 100 )) "$clients" "$streams" >/dev/null   # warm-up
    ok0=$(metric get_in_network_posts_requests_total 'status="ok"')
    all0=$(metric get_in_network_posts_requests_total)
    posts0=$(metric get_in_network_posts_count_sum)
    bytes0=$(metric get_in_network_posts_response_bytes_sum)
    before=$(outcomes)
    cpu0=$(cpu_ticks)
    start=$(date +%s.%N)
    h2 "$frame" "$requests" "$clients" "$streams" >"$work/h2.out"
    end=$(date +%s.%N)
    cpu1=$(cpu_ticks)
    all1=$(metric get_in_network_posts_requests_total)
    ok1=$(metric get_in_network_posts_requests_total 'status="ok"')
    posts1=$(metric get_in_network_posts_count_sum)
    bytes1=$(metric get_in_network_posts_response_bytes_sum)
    n=$(( all1 - all0 )) ok=$(( ok1 - ok0 ))
    if [ "$server" = floor ]; then
        # The floor counts no calls (and no posts): its answers are h2load's successes.
        n=$(awk '/^requests:/ { for (i = 1; i <= NF; i++) if ($(i + 1) ~ /^succeeded/) print $i }' "$work/h2.out")
        ok=$n
    fi
    awk -v kind="$kind" -v scale="$scale" -v n="$n" -v ok="$ok" -v t0="$start" -v t1="$end" \
        -v cpu=$(( cpu1 - cpu0 )) -v hz="$ticks_per_sec" -v posts=$(( posts1 - posts0 )) \
        -v bytes=$(( bytes1 - bytes0 )) -v out="$(outcomes)" -v floor="$([ "$server" = floor ] && echo 1 || echo 0)" 'BEGIN {
        secs = t1 - t0
        printf "%-6s %6d %9d %9.2f %12.0f %15.1f %13s %13.0f  %s\n", kind, scale, n, secs, n / secs,
            cpu * 1e6 / hz / (n > 0 ? n : 1), (floor ? "-" : sprintf("%.1f", posts / (ok > 0 ? ok : 1))),
            bytes / (ok > 0 ? ok : 1), out }'
    grep -q ' 0 failed, 0 errored' "$work/h2.out" || grep -E 'requests:' "$work/h2.out" >&2
done
