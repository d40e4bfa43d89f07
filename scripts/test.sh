#!/usr/bin/env bash
# Set up and run the whole test suite: once on PostgreSQL, once on SQLite.
#
# PostgreSQL: OBELISK_TEST_DATABASE_URL if set; otherwise the server on 127.0.0.1:5432 if
# one answers; otherwise (or with OBELISK_TEST_PG=throwaway) a throwaway cluster started
# here in a temporary directory, installing Debian's postgresql package if needed. The test
# database pytest-django creates (and drops) there is OBELISK_TEST_DATABASE_NAME, by default
# test_obelisk_<checkout tag>: two checkouts sharing a server never drop each other's (D106).
# Extra arguments go to pytest, e.g. scripts/test.sh -k fencing -x
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
setup_venv

if [ -z "${OBELISK_TEST_DATABASE_URL:-}" ]; then
    local_url="postgres://postgres@127.0.0.1:5432/postgres"
    if [ "${OBELISK_TEST_PG:-auto}" != "throwaway" ] && pg_reachable "$local_url"; then
        export OBELISK_TEST_DATABASE_URL="$local_url"
    else
        start_throwaway_pg
        export OBELISK_TEST_DATABASE_URL="$PG_THROWAWAY_URL"
    fi
fi

# The browser tests drive Debian's Chromium (no browser download).
if [ ! -x /usr/bin/chromium ]; then
    echo "installing Debian's chromium package for the browser tests..." >&2
    sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null
fi

export OBELISK_TEST_DATABASE_NAME="${OBELISK_TEST_DATABASE_NAME:-test_obelisk_$(checkout_tag)}"

status=0
echo "== tests on PostgreSQL ($OBELISK_TEST_DATABASE_URL, test database $OBELISK_TEST_DATABASE_NAME)"
python -m pytest --ds=tests.settings_postgres "$@" || status=$?
echo "== tests on SQLite"
python -m pytest --ds=tests.settings_sqlite "$@" || status=$?
if [ "$status" -ne 0 ]; then
    echo "TESTS FAILED" >&2
fi
exit "$status"
