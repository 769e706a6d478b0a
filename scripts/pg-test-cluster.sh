#!/usr/bin/env bash
# A throwaway PostgreSQL 15 cluster for the tests and CI. The test binaries run it themselves
# when TAH_TEST_PG_URL is not set (tests/support/postgres.rs); CI starts one for all of them.
#
#   eval "$(scripts/pg-test-cluster.sh start)"   # exports TAH_TEST_PG_URL and TAH_TEST_PG_DIR
#   cargo test --test all store::
#   scripts/pg-test-cluster.sh stop              # stops it and removes TAH_TEST_PG_DIR
#
# The cluster is tuned for speed, not durability (fsync off): never point it at real data.
# Runs as root (the server itself runs as the `postgres` OS user) or as an ordinary user (the
# server runs as that user). Only the two `export` lines go to stdout; progress goes to stderr.
set -euo pipefail

PG_VERSION="${PG_VERSION:-15}"
DB_NAME="${TAH_TEST_PG_DB:-tah_test}"

log() { echo "pg-test-cluster: $*" >&2; }
die() { log "$*"; exit 1; }

find_bindir() {
    local dir
    for dir in "/usr/lib/postgresql/${PG_VERSION}/bin" /usr/lib/postgresql/*/bin; do
        if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
            echo "$dir"
            return 0
        fi
    done
    if command -v pg_config >/dev/null 2>&1; then
        dir="$(pg_config --bindir)"
        if [ -x "$dir/initdb" ]; then echo "$dir"; return 0; fi
    fi
    return 1
}

install_postgres() {
    [ "$(id -u)" = 0 ] || die "PostgreSQL server binaries not found and not root: install postgresql-${PG_VERSION}"
    log "installing PostgreSQL ${PG_VERSION}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update >&2
    apt-get install -y "postgresql-${PG_VERSION}" >&2 || apt-get install -y postgresql >&2
}

# Runs a command as the cluster's OS user.
as_owner() {
    if [ "$(id -u)" = 0 ]; then
        if command -v runuser >/dev/null 2>&1; then
            runuser -u postgres -- "$@"
        else
            su postgres -s /bin/sh -c "$(printf '%q ' "$@")"
        fi
    else
        "$@"
    fi
}

free_port() {
    if command -v python3 >/dev/null 2>&1; then
        python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
    else
        # A random high port; start() retries if it is taken.
        shuf -i 20000-60999 -n 1
    fi
}

start() {
    local bindir dir port
    bindir="$(find_bindir)" || { install_postgres; bindir="$(find_bindir)" || die "initdb not found after install"; }
    if [ "$(id -u)" = 0 ]; then
        id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
    fi
    dir="$(mktemp -d "${TMPDIR:-/tmp}/tah-pg.XXXXXX")"
    chmod 700 "$dir"
    if [ "$(id -u)" = 0 ]; then
        chown postgres: "$dir"
        as_owner test -w "$dir" \
            || { rmdir "$dir"; die "the postgres user cannot reach $dir (set TMPDIR to a directory it can traverse, e.g. /tmp)"; }
    fi
    log "initdb in $dir ($bindir)"
    as_owner "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
        || as_owner "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; die "initdb failed"; }

    local tries=0
    while :; do
        port="$(free_port)"
        if as_owner "$bindir/pg_ctl" -D "$dir/data" -l "$dir/log" -w -t 60 \
            -o "-c listen_addresses=127.0.0.1 -p $port -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200 -k $dir" \
            start >&2; then
            break
        fi
        tries=$((tries + 1))
        [ "$tries" -lt 3 ] || { tail -n 30 "$dir/log" >&2 || true; die "pg_ctl start failed"; }
        log "start failed (port $port taken?); retrying"
    done

    as_owner "$bindir/psql" -h "$dir" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -qAt \
        -c "CREATE DATABASE $DB_NAME" >&2 || die "CREATE DATABASE failed"
    log "PostgreSQL is up on 127.0.0.1:$port"
    echo "export TAH_TEST_PG_URL=postgres://postgres@127.0.0.1:$port/$DB_NAME"
    echo "export TAH_TEST_PG_DIR=$dir"
}

stop() {
    local dir="${TAH_TEST_PG_DIR:-${1:-}}"
    [ -n "$dir" ] || die "TAH_TEST_PG_DIR is not set (and no directory given)"
    case "$dir" in
        */tah-pg.*) ;;
        *) die "refusing to remove $dir: not a directory this script created" ;;
    esac
    local bindir
    bindir="$(find_bindir)" || die "pg_ctl not found"
    if [ -f "$dir/data/postmaster.pid" ]; then
        as_owner "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >&2 || log "pg_ctl stop failed"
    fi
    rm -rf "$dir"
    log "stopped and removed $dir"
}

case "${1:-}" in
    start) start ;;
    stop) shift; stop "$@" ;;
    *) echo "usage: $0 start | stop [DIR]" >&2; exit 2 ;;
esac
