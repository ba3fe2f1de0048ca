#!/usr/bin/env bash
# Start or stop a private Redis for Edward's tests and benchmarks.
#
#   scripts/redis.sh start   # prints the Redis URL on stdout (logs go to stderr)
#   scripts/redis.sh stop
#   scripts/redis.sh url
#
# The server listens on 127.0.0.1:${EDWARD_REDIS_PORT:-56379} with its files
# under target/redis-$PORT/ (no persistence: every start begins empty).
# Installs redis-server with apt-get if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PORT="${EDWARD_REDIS_PORT:-56379}"
BASE="$(pwd)/target/redis-$PORT"
PIDFILE="$BASE/redis.pid"
LOG="$BASE/redis.log"
URL="redis://127.0.0.1:${PORT}"

log() { printf 'redis.sh: %s\n' "$*" >&2; }

find_bin() {
    if ! command -v redis-server >/dev/null 2>&1; then
        if [[ "$(id -u)" -ne 0 ]]; then
            log "redis-server not found and not root to install it"
            exit 1
        fi
        log "installing redis-server with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 \
            redis-server >&2
    fi
    command -v redis-server
}

is_ready() { redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null | grep -q PONG; }

start() {
    BIN="$(find_bin)"
    mkdir -p "$BASE"
    if is_ready; then
        log "already running on port $PORT"
    else
        log "starting on 127.0.0.1:$PORT (dir $BASE)"
        "$BIN" --port "$PORT" --bind 127.0.0.1 --dir "$BASE" --daemonize yes \
            --pidfile "$PIDFILE" --logfile "$LOG" --save '' --appendonly no \
            --maxclients 1000 >&2 || { tail -n 50 "$LOG" >&2 || true; exit 1; }
        for _ in $(seq 1 100); do is_ready && break; sleep 0.1; done
        is_ready || { log "server did not become ready"; tail -n 50 "$LOG" >&2 || true; exit 1; }
    fi
    printf '%s\n' "$URL"
}

stop() {
    if [[ -f "$PIDFILE" ]]; then
        log "stopping"
        redis-cli -h 127.0.0.1 -p "$PORT" shutdown nosave >/dev/null 2>&1 \
            || kill "$(cat "$PIDFILE")" 2>/dev/null || true
        rm -f "$PIDFILE"
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    url) printf '%s\n' "$URL" ;;
    *) echo "usage: $0 start|stop|url" >&2; exit 2 ;;
esac
