#!/usr/bin/env bash
# A local Kafka-protocol broker for tests and manual runs (noida-db from PyPI, pinned).
#
#   scripts/kafka-broker.sh install   install the broker into target/kafka-venv (idempotent), print its path
#   scripts/kafka-broker.sh env       install, then print `export THUNDER_TEST_KAFKA_BIN=...`
#   scripts/kafka-broker.sh start     start one broker on a free 127.0.0.1 port; prints
#                                     `export KAFKA_BROKERS=127.0.0.1:PORT` and `export THUNDER_TEST_KAFKA_BIN=...`
#   scripts/kafka-broker.sh stop      stop the broker started by `start` and remove its data
#   scripts/kafka-broker.sh status    print the running broker's address, if any
#
# Use it as `eval "$(scripts/kafka-broker.sh start)"` ... `scripts/kafka-broker.sh stop`.
# The Kafka integration tests start their own brokers from THUNDER_TEST_KAFKA_BIN
# (so they can restart them); `env` is all they need.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
NOIDA_VERSION="0.2.3"
VENV="${THUNDER_KAFKA_VENV:-$ROOT/target/kafka-venv}"
STATE="$ROOT/target/kafka-broker"

log() { echo "kafka-broker: $*" >&2; }

install_broker() {
    if [ ! -x "$VENV/bin/python" ]; then
        python3 -m venv "$VENV" >&2
    fi
    if ! "$VENV/bin/python" -c "import importlib.metadata as m,sys; sys.exit(m.version('noida-db') != '$NOIDA_VERSION')" 2>/dev/null; then
        "$VENV/bin/pip" install -q --disable-pip-version-check "noida-db==$NOIDA_VERSION" >&2
    fi
    # The real binary, not the pip console script (which does not forward SIGTERM).
    "$VENV/bin/python" -c 'import noida_db,os;print(os.path.join(os.path.dirname(noida_db.__file__),"noida-db"))'
}

free_port() {
    python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1]);s.close()'
}

wait_for_port() {
    local port="$1" pid="$2"
    for _ in $(seq 1 200); do
        if ! kill -0 "$pid" 2>/dev/null; then
            return 1
        fi
        if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return 0
        fi
        sleep 0.05
    done
    return 1
}

running_pid() {
    [ -f "$STATE/pid" ] || return 1
    local pid
    pid="$(cat "$STATE/pid")"
    kill -0 "$pid" 2>/dev/null || return 1
    echo "$pid"
}

cmd="${1:-}"
case "$cmd" in
install)
    install_broker
    ;;
env)
    bin="$(install_broker)"
    echo "export THUNDER_TEST_KAFKA_BIN=$bin"
    ;;
start)
    bin="$(install_broker)"
    if pid="$(running_pid)"; then
        log "already running (pid $pid)"
        echo "export KAFKA_BROKERS=$(cat "$STATE/brokers")"
        echo "export THUNDER_TEST_KAFKA_BIN=$bin"
        exit 0
    fi
    rm -rf "$STATE"
    mkdir -p "$STATE/data"
    port="$(free_port)"
    "$bin" start --only kafka --host 127.0.0.1 --kafka-port "$port" --data-dir "$STATE/data" \
        </dev/null >"$STATE/broker.log" 2>&1 &
    pid=$!
    echo "$pid" >"$STATE/pid"
    if ! wait_for_port "$port" "$pid"; then
        log "broker did not start; log follows"
        cat "$STATE/broker.log" >&2 || true
        kill "$pid" 2>/dev/null || true
        exit 1
    fi
    echo "127.0.0.1:$port" >"$STATE/brokers"
    log "started pid $pid on 127.0.0.1:$port"
    echo "export KAFKA_BROKERS=127.0.0.1:$port"
    echo "export THUNDER_TEST_KAFKA_BIN=$bin"
    ;;
stop)
    if pid="$(running_pid)"; then
        kill "$pid" 2>/dev/null || true
        for _ in $(seq 1 100); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.05
        done
        kill -9 "$pid" 2>/dev/null || true
        log "stopped pid $pid"
    fi
    rm -rf "$STATE"
    ;;
status)
    if pid="$(running_pid)"; then
        echo "running pid $pid on $(cat "$STATE/brokers")"
    else
        echo "not running"
        exit 1
    fi
    ;;
*)
    echo "usage: $0 install|env|start|stop|status" >&2
    exit 2
    ;;
esac
