"""Test settings on PostgreSQL: ``OBELISK_TEST_DATABASE_URL`` (``scripts/test.sh`` sets it)."""

import hashlib
import os
from pathlib import Path

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
# The test database is this checkout's own (as scripts/test.sh names it, D106): two
# checkouts testing against one server never drop each other's database.
_CHECKOUT_TAG = hashlib.sha256(str(Path(__file__).resolve().parent.parent).encode()).hexdigest()[:8]
DATABASES["default"]["TEST"] = {"NAME": os.environ.get("OBELISK_TEST_DATABASE_NAME", f"test_obelisk_{_CHECKOUT_TAG}")}
OBELISK = {"COMPONENT_MODULES": ["tests.support.components"]}
