#!/usr/bin/env bash
# Start or stop a private PostgreSQL for Edward's tests and benchmarks.
#
#   scripts/pg.sh start   # prints the database URL on stdout (logs go to stderr)
#   scripts/pg.sh stop
#   scripts/pg.sh url
#
# The server listens on 127.0.0.1:${EDWARD_PG_PORT:-55432} with its data
# directory under target/pg/, owned by the `postgres` user when run as root
# (PostgreSQL refuses to run as root). Starting a stopped server recreates the
# test database, so every run begins empty. Installs PostgreSQL with apt-get
# if no server binaries are found.
set -euo pipefail
cd "$(dirname "$0")/.."

PORT="${EDWARD_PG_PORT:-55432}"
set_base() {
    BASE="$1"
    DATA="$BASE/data"
    SOCK="$BASE/run"
    LOG="$BASE/postgres.log"
}
set_base "$(pwd)/target/pg"
DB="${EDWARD_PG_DB:-edward_test}"
USER_NAME=edward
URL="postgres://${USER_NAME}@127.0.0.1:${PORT}/${DB}"

log() { printf 'pg.sh: %s\n' "$*" >&2; }

find_bin() {
    local dir
    dir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    if [[ -z "$dir" || ! -x "$dir/pg_ctl" ]]; then
        if [[ "$(id -u)" -ne 0 ]]; then
            log "no PostgreSQL server binaries found under /usr/lib/postgresql and not root to install them"
            exit 1
        fi
        log "installing PostgreSQL with apt-get"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
        dir="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
    fi
    printf '%s' "$dir"
}

# Run a command as the server's owner (postgres when we are root).
as_owner() {
    if [[ "$(id -u)" -eq 0 ]]; then
        runuser -u postgres -- "$@"
    else
        "$@"
    fi
}

is_ready() { "$BIN/pg_isready" -q -h 127.0.0.1 -p "$PORT" -d postgres -U "$USER_NAME"; }

start() {
    BIN="$(find_bin)"
    mkdir -p "$BASE"
    if [[ "$(id -u)" -eq 0 ]]; then
        id postgres >/dev/null 2>&1 || useradd --system --home-dir "$BASE" postgres
        chown postgres: "$BASE"
        # The checkout may sit under a directory the postgres user cannot
        # enter; then keep the server's files in a private temp directory.
        if ! runuser -u postgres -- test -w "$BASE"; then
            set_base "${TMPDIR:-/tmp}/edward-pg-$PORT"
            mkdir -p "$BASE" && chown postgres: "$BASE"
            log "checkout not accessible to postgres; using $BASE"
        fi
    fi
    if is_ready; then
        log "already running on port $PORT"
    else
        if [[ ! -f "$DATA/PG_VERSION" ]]; then
            log "initdb in $DATA"
            as_owner mkdir -p "$DATA" "$SOCK"
            as_owner "$BIN/initdb" -D "$DATA" --username="$USER_NAME" --auth=trust \
                --encoding=UTF8 --locale=C.UTF-8 >"$BASE/initdb.log" 2>&1 \
                || { cat "$BASE/initdb.log" >&2; exit 1; }
        fi
        as_owner mkdir -p "$SOCK"
        log "starting on 127.0.0.1:$PORT"
        as_owner "$BIN/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 \
            -o "-p $PORT -k $SOCK -c listen_addresses=127.0.0.1 -c max_connections=400" \
            start >&2 || { tail -n 50 "$LOG" >&2; exit 1; }
        for _ in $(seq 1 60); do is_ready && break; sleep 0.5; done
        is_ready || { log "server did not become ready"; tail -n 50 "$LOG" >&2; exit 1; }
        "$BIN/dropdb" -h 127.0.0.1 -p "$PORT" -U "$USER_NAME" --if-exists "$DB" >&2
    fi
    if ! "$BIN/psql" -h 127.0.0.1 -p "$PORT" -U "$USER_NAME" -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = '$DB'" | grep -q 1; then
        "$BIN/createdb" -h 127.0.0.1 -p "$PORT" -U "$USER_NAME" "$DB" >&2
    fi
    printf '%s\n' "$URL"
}

stop() {
    BIN="$(find_bin)"
    [[ -f "$DATA/postmaster.pid" ]] || set_base "${TMPDIR:-/tmp}/edward-pg-$PORT"
    if [[ -f "$DATA/postmaster.pid" ]]; then
        log "stopping"
        as_owner "$BIN/pg_ctl" -D "$DATA" -m fast -w stop >&2 || true
    fi
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    url) printf '%s\n' "$URL" ;;
    *) echo "usage: $0 start|stop|url" >&2; exit 2 ;;
esac
