#!/usr/bin/env bash
# Set up and run the demo: SQLite (nothing to install), a real worker cluster, three sample
# activities (one succeeds, one fails twice then succeeds, one times out), their histories.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
setup_venv
export OBELISK_COMPONENT_MODULES="${OBELISK_COMPONENT_MODULES:-demo.activities,demo.workflows}"
python manage.py migrate -v0
python manage.py obelisk_demo "$@"
