#!/usr/bin/env bash
# Make sure a Docker daemon answers, for Edward's Docker sandbox tests.
#
#   scripts/dockerd.sh start   # returns once `docker info` answers
#   scripts/dockerd.sh stop    # stops the daemon only if `start` started it
#
# If a daemon already answers (the local socket, or DOCKER_HOST), nothing is
# started and `stop` leaves it alone. Otherwise `docker.io` is installed with
# apt-get when `dockerd` is missing, and `dockerd` is started in the
# background (there is no systemd here) with its log in target/dockerd/.
# Its pid is recorded there, so `stop` stops only what `start` started.
set -euo pipefail
cd "$(dirname "$0")/.."

BASE="$(pwd)/target/dockerd"
PIDFILE="$BASE/dockerd.pid"
LOG="$BASE/dockerd.log"
WAIT_SECS="${EDWARD_DOCKERD_WAIT:-60}"

log() { printf 'dockerd.sh: %s\n' "$*" >&2; }

answers() { docker info >/dev/null 2>&1; }

install_docker() {
    if command -v dockerd >/dev/null 2>&1 && command -v docker >/dev/null 2>&1; then
        return
    fi
    if [[ "$(id -u)" -ne 0 ]]; then
        log "dockerd is not installed and we are not root to install docker.io"
        exit 1
    fi
    log "installing docker.io with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io >&2
}

start() {
    if answers; then
        log "a Docker daemon already answers; not starting one"
        return
    fi
    install_docker
    if [[ -n "${DOCKER_HOST:-}" ]]; then
        log "DOCKER_HOST=$DOCKER_HOST does not answer; unset it to use a local daemon"
        exit 1
    fi
    mkdir -p "$BASE"
    log "starting dockerd (log: $LOG)"
    # setsid: the daemon must not die with the shell (or its job control)
    # that started it; `stop` kills it by the recorded pid.
    setsid dockerd >"$LOG" 2>&1 </dev/null &
    echo $! >"$PIDFILE"
    for _ in $(seq 1 "$((WAIT_SECS * 4))"); do
        if answers; then
            log "dockerd is up (pid $(cat "$PIDFILE"))"
            return
        fi
        if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
            log "dockerd exited during start-up; last log lines:"
            tail -n 30 "$LOG" >&2
            rm -f "$PIDFILE"
            exit 1
        fi
        sleep 0.25
    done
    log "dockerd did not answer within ${WAIT_SECS}s; last log lines:"
    tail -n 30 "$LOG" >&2
    exit 1
}

stop() {
    if [[ ! -f "$PIDFILE" ]]; then
        return
    fi
    local pid
    pid="$(cat "$PIDFILE")"
    if kill -0 "$pid" 2>/dev/null; then
        log "stopping dockerd (pid $pid)"
        kill -TERM "$pid"
        for _ in $(seq 1 120); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.25
        done
        if kill -0 "$pid" 2>/dev/null; then
            log "dockerd did not stop in 30s; killing it"
            kill -KILL "$pid" || true
        fi
    fi
    rm -f "$PIDFILE"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
