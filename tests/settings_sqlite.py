"""Test settings on SQLite: a file database, so worker subprocesses can share it
(``OBELISK_TEST_SQLITE`` overrides its path)."""

import os

# Tests run as deployed (DEBUG off), so they need a key; scripts/test.sh exports the
# checkout's own (var/dev-secret-key). A test-only key when pytest is run directly; the
# worker and command subprocesses of the tests inherit it.
os.environ.setdefault("DJANGO_SECRET_KEY", "obelisk-tests-only-not-secret")

from obelisk_site.settings import *  # noqa: F403
from obelisk_site.settings import VAR_DIR, database_from_env

DATABASES = {"default": database_from_env(f"sqlite:///{VAR_DIR / 'test-run.sqlite3'}")}
DATABASES["default"]["TEST"] = {"NAME": os.environ.get("OBELISK_TEST_SQLITE", str(VAR_DIR / "test_obelisk.sqlite3"))}
OBELISK = {"COMPONENT_MODULES": ["tests.support.components"]}
