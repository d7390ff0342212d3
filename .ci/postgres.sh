# shellcheck shell=bash
# Sourced by .ci/run: start a throw-away PostgreSQL cluster on a free local port, in a temp dir,
# and point the store tests at it (ZEUS_CALLBACKS_TEST_DB_URL). The cluster is stopped and its
# directory removed when the sourcing shell exits. Standalone use:
#   . .ci/postgres.sh && python -m pytest -q tests/test_store.py
# Needs the distribution's PostgreSQL server (installed here with apt-get when missing;
# `--install-only` installs it and returns without starting it).

zc_pg_bin() {
    local bin
    bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [ -z "$bin" ] && command -v initdb >/dev/null 2>&1; then
        bin=$(dirname "$(command -v initdb)")
    fi
    echo "$bin"
}

ZC_PG_BIN=$(zc_pg_bin)
if [ -z "$ZC_PG_BIN" ] || [ ! -x "$ZC_PG_BIN/initdb" ]; then
    echo "postgres.sh: installing PostgreSQL from the distribution's packages" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null && apt-get install -y -q postgresql >/dev/null
    ZC_PG_BIN=$(zc_pg_bin)
fi
# `. .ci/postgres.sh --install-only`: .ci/run installs the server while pip works, and starts it later.
if [ "${1:-}" = "--install-only" ]; then
    return 0 2>/dev/null || exit 0
fi

ZC_PG_DIR=$(mktemp -d "${TMPDIR:-/tmp}/zc-postgres.XXXXXX")
# TCP connections need the password (so the tests can check refused credentials); a throw-away one.
ZC_PG_PASSWORD=zc-ci-$RANDOM$RANDOM
ZC_PG_PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# initdb refuses to run as root: run the server as the postgres user when we are root.
if [ "$(id -u)" = 0 ]; then
    chown postgres "$ZC_PG_DIR"
    zc_pg_as() { su postgres -s /bin/sh -c "$*"; }
else
    zc_pg_as() { sh -c "$*"; }
fi

echo "$ZC_PG_PASSWORD" >"$ZC_PG_DIR/pwfile"
zc_pg_as "'$ZC_PG_BIN/initdb' -D '$ZC_PG_DIR/data' -U postgres --auth-local=trust --auth-host=scram-sha-256 --pwfile='$ZC_PG_DIR/pwfile' --no-sync -E UTF8" >"$ZC_PG_DIR/initdb.log" 2>&1 \
    || { cat "$ZC_PG_DIR/initdb.log" >&2; return 1 2>/dev/null || exit 1; }
# Listen on loopback only; the socket lives in the temp dir (no /var/run/postgresql needed).
zc_pg_as "'$ZC_PG_BIN/pg_ctl' -D '$ZC_PG_DIR/data' -l '$ZC_PG_DIR/server.log' -w -t 60 start \
    -o \"-p $ZC_PG_PORT -k $ZC_PG_DIR -c listen_addresses=127.0.0.1 -c max_connections=300\"" >/dev/null \
    || { cat "$ZC_PG_DIR/server.log" >&2; return 1 2>/dev/null || exit 1; }

zc_pg_stop() {
    zc_pg_as "'$ZC_PG_BIN/pg_ctl' -D '$ZC_PG_DIR/data' -m immediate stop" >/dev/null 2>&1 || true
    rm -rf "$ZC_PG_DIR"
}
trap zc_pg_stop EXIT

export ZEUS_CALLBACKS_TEST_DB_URL="postgresql://postgres:$ZC_PG_PASSWORD@127.0.0.1:$ZC_PG_PORT/postgres"
export ZEUS_CALLBACKS_CI=1
echo "postgres.sh: PostgreSQL $("$ZC_PG_BIN/postgres" --version | awk '{print $3}') on port $ZC_PG_PORT ($ZC_PG_DIR)" >&2
