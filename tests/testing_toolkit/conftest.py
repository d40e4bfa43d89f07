"""The toolkit's fixtures for this checkout's own tests, where the package is not installed
(an installed one registers them through its ``pytest11`` entry point)."""

from workers.testing.plugin import obelisk_env, obelisk_worker, pytest_configure  # noqa: F401
