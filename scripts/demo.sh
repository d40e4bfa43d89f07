#!/usr/bin/env bash
# Set up and run the demo: SQLite in var/ (nothing to install), a real worker cluster, sample
# activities (one succeeds, one fails twice then succeeds, one times out) and a workflow,
# their histories. It runs as deployed (DEBUG off) with this checkout's development key
# (scripts/lib.sh, dev_secret_key) and the demo's own component modules: the settings have
# no default modules.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
setup_venv
export OBELISK_COMPONENT_MODULES="${OBELISK_COMPONENT_MODULES:-demo.activities,demo.workflows,demo.webhooks}"
echo "migrating the demo's SQLite database in ${OBELISK_VAR_DIR:-var}/..." >&2
python manage.py migrate -v0
python manage.py obelisk_demo "$@"
