"""Test settings on PostgreSQL: ``OBELISK_TEST_DATABASE_URL`` (``scripts/test.sh`` sets it)."""

import os

from obelisk_site.settings import *  # noqa: F401,F403
from obelisk_site.settings import database_from_env

DATABASES = {
    "default": database_from_env(
        os.environ.get("OBELISK_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/obelisk")
    )
}
DATABASES["default"]["TEST"] = {"NAME": os.environ.get("OBELISK_TEST_DATABASE_NAME", "test_obelisk")}
OBELISK = {"COMPONENT_MODULES": ["tests.components"]}
