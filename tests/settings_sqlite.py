"""Test settings on SQLite: a file database, so worker subprocesses can share it
(``OBELISK_TEST_SQLITE`` overrides its path)."""

import os

from obelisk_site.settings import *  # noqa: F403
from obelisk_site.settings import VAR_DIR, database_from_env

DATABASES = {"default": database_from_env(f"sqlite:///{VAR_DIR / 'test-run.sqlite3'}")}
DATABASES["default"]["TEST"] = {"NAME": os.environ.get("OBELISK_TEST_SQLITE", str(VAR_DIR / "test_obelisk.sqlite3"))}
OBELISK = {"COMPONENT_MODULES": ["tests.components"]}
