#!/usr/bin/env bash
# A throw-away PostgreSQL cluster on loopback for the distributed tests.
#   eval "$(bash scripts/pg.sh start)"   # exports AUTOTUNE_TEST_PG_URL and AUTOTUNE_TEST_PG_DIR
#   bash scripts/pg.sh stop              # stops the cluster of $AUTOTUNE_TEST_PG_DIR and deletes it
# The server refuses to run as root, so as root it runs as the `postgres` user. Host connections need a
# password (scram), so that the tests exercise a URL with a secret in it.
set -euo pipefail

bindir() {
    if command -v pg_config >/dev/null && [ -x "$(pg_config --bindir)/initdb" ]; then pg_config --bindir; return; fi
    local found
    found=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
    if [ -z "$found" ]; then echo "pg.sh: PostgreSQL is not installed (apt-get install -y postgresql)" >&2; exit 1; fi
    echo "$found"
}

as_owner() {  # run a server command as the cluster's owner
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

start() {
    local bin dir port password
    bin=$(bindir)
    dir=$(mktemp -d /tmp/autotune-pg.XXXXXX)
    chmod 755 "$dir"
    [ "$(id -u)" = 0 ] && chown postgres: "$dir"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    password=$(python3 -c 'import secrets; print(secrets.token_hex(12))')
    echo "$password" > "$dir/pwfile"
    [ "$(id -u)" = 0 ] && chown postgres: "$dir/pwfile"
    as_owner "$bin/initdb" -D "$dir/data" -U autotune --pwfile="$dir/pwfile" --auth-local=trust \
        --auth-host=scram-sha-256 >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; exit 1; }
    as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=200 -c fsync=off" start >/dev/null \
        || { cat "$dir/server.log" >&2; exit 1; }
    as_owner "$bin/createdb" -h "$dir" -p "$port" -U autotune autotune_test
    echo "export AUTOTUNE_TEST_PG_DIR=$dir"
    echo "export AUTOTUNE_TEST_PG_URL=postgresql+psycopg://autotune:$password@127.0.0.1:$port/autotune_test"
}

stop() {
    local dir=${AUTOTUNE_TEST_PG_DIR:?AUTOTUNE_TEST_PG_DIR is not set}
    as_owner "$(bindir)/pg_ctl" -D "$dir/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
