"""Test settings on PostgreSQL: ``OBELISK_TEST_DATABASE_URL`` (``scripts/test.sh`` sets it)."""

import os

# Tests run as deployed (DEBUG off), so they need a key; scripts/test.sh exports the
# checkout's own (var/dev-secret-key). A test-only key when pytest is run directly; the
# worker and command subprocesses of the tests inherit it.
os.environ.setdefault("DJANGO_SECRET_KEY", "obelisk-tests-only-not-secret")

from obelisk_site.settings import *  # noqa: F401,F403
from obelisk_site.settings import database_from_env

DATABASES = {
    "default": database_from_env(
        os.environ.get("OBELISK_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/obelisk")
    )
}
DATABASES["default"]["TEST"] = {"NAME": os.environ.get("OBELISK_TEST_DATABASE_NAME", "test_obelisk")}
OBELISK = {"COMPONENT_MODULES": ["tests.components"]}
