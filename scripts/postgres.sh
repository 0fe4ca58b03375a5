# Sourced by scripts/test.sh: a throwaway PostgreSQL cluster on 127.0.0.1 for the store tests.
start_private_postgres() {
    local bindir
    bindir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
    if [[ -z "$bindir" && "$(id -u)" == 0 && "${CI:-}" == "true" ]]; then
        (apt-get update -qq && apt-get install -y -qq postgresql >/dev/null) || return 1
        bindir="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
    fi
    [[ -n "$bindir" ]] || return 1
    PGBIN="$bindir"
    PGDIR="$(mktemp -d /tmp/optlab-pg.XXXXXX)"
    local port=$((20000 + RANDOM % 20000))
    if [[ "$(id -u)" == 0 ]]; then
        id postgres >/dev/null 2>&1 || return 1
        chown postgres "$PGDIR"
        local as=(runuser -u postgres --)
    else
        local as=()
    fi
    "${as[@]}" "$bindir/initdb" -A trust -U postgres -D "$PGDIR/data" >/dev/null || return 1
    "${as[@]}" "$bindir/pg_ctl" -D "$PGDIR/data" -w -l "$PGDIR/log" \
        -o "-p $port -k $PGDIR -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null \
        || return 1
    export OPTLAB_TEST_POSTGRES_URL="postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
    echo "private PostgreSQL on 127.0.0.1:$port"
}
