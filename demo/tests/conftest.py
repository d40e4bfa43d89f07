"""The toolkit's fixtures in this checkout, where the package is not installed (a project
that installs it gets them from the plugin's ``pytest11`` entry point, with no conftest)."""

from workers.testing.plugin import obelisk_env, obelisk_worker, pytest_configure  # noqa: F401
