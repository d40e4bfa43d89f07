# Shared by scripts/*.sh: a virtualenv with requirements.txt installed, reinstalled only
# when requirements.txt changes, and a development secret key (dev_secret_key). What takes
# time (the first run's installation: half a minute or more) is said before it starts.
setup_venv() {
    if ! command -v python3 >/dev/null; then
        echo "python3 (3.11 or newer) is required" >&2
        exit 1
    fi
    if [ ! -x .venv/bin/python ]; then
        echo "setting up: making the virtualenv .venv (first run only)..." >&2
        python3 -m venv .venv
    fi
    # shellcheck disable=SC1091
    . .venv/bin/activate
    local want have
    want=$(sha256sum requirements.txt | cut -d' ' -f1)
    have=$(cat .venv/.requirements.sha256 2>/dev/null || true)
    if [ "$want" != "$have" ]; then
        echo "setting up: installing requirements.txt into .venv with pip (first run, or it changed: about half a minute)..." >&2
        python -m pip install -q --disable-pip-version-check -r requirements.txt
        echo "setting up: installed." >&2
        echo "$want" > .venv/.requirements.sha256
    fi
    dev_secret_key
}

# DEBUG is off unless DJANGO_DEBUG=1, and then the settings require DJANGO_SECRET_KEY.
# The scripts run as deployed (DEBUG off) with a key of this checkout's own, made once in
# var/dev-secret-key (readable by its owner only). Never used when DJANGO_SECRET_KEY is set.
dev_secret_key() {
    if [ -n "${DJANGO_SECRET_KEY:-}" ]; then
        return
    fi
    local var_dir="${OBELISK_VAR_DIR:-var}"
    mkdir -p "$var_dir"
    if [ ! -s "$var_dir/dev-secret-key" ]; then
        (umask 077 && python -c 'import secrets; print(secrets.token_urlsafe(50))' > "$var_dir/dev-secret-key")
    fi
    DJANGO_SECRET_KEY=$(cat "$var_dir/dev-secret-key")
    export DJANGO_SECRET_KEY
}

# Eight hex digits of this checkout's path (sha256 of `pwd -P`, as bench/run.py's
# CHECKOUT_TAG): part of the names of the databases this checkout makes on a shared server,
# so that two checkouts never use, or drop, each other's (D106).
checkout_tag() {
    printf '%s' "$(pwd -P)" | sha256sum | cut -c1-8
}

# True when a PostgreSQL server answers at $1 (a postgres:// URL).
pg_reachable() {
    python - "$1" <<'PY' >/dev/null 2>&1
import sys, psycopg
psycopg.connect(sys.argv[1], connect_timeout=3).close()
PY
}

# Start a throwaway PostgreSQL cluster in a temporary directory (installing Debian's
# postgresql package first if no server binaries exist). Exports PG_THROWAWAY_URL and
# stops the cluster when the calling shell exits.
start_throwaway_pg() {
    local pgbin sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
    if [ -z "$pgbin" ] || [ ! -x "$pgbin/initdb" ]; then
        echo "installing Debian's postgresql package..." >&2
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null
        pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
    fi
    PG_TMP=$(mktemp -d /tmp/obelisk-pg.XXXXXX)
    local port run=""
    port=$(python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    if [ "$(id -u)" = 0 ]; then
        chown postgres "$PG_TMP"
        run="runuser -u postgres --"
    fi
    $run "$pgbin/initdb" -D "$PG_TMP/data" -A trust -U postgres --no-sync >"$PG_TMP/initdb.log"
    $run "$pgbin/pg_ctl" -D "$PG_TMP/data" -l "$PG_TMP/server.log" -w -t 60 \
        -o "-p $port -k $PG_TMP -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
    PG_STOP="$run $pgbin/pg_ctl -D $PG_TMP/data -m fast -w stop"
    trap 'eval "$PG_STOP" >/dev/null 2>&1; rm -rf "$PG_TMP"' EXIT
    export PG_THROWAWAY_URL="postgres://postgres@127.0.0.1:$port/postgres"
    echo "throwaway PostgreSQL running at $PG_THROWAWAY_URL" >&2
}
