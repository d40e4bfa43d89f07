"""The pytest plugin (entry point ``pytest11``: ``obelisk = workers.testing.plugin``).

- ``obelisk_env``: ``run_workflow``, ``replay``, ``export`` and ``sequence`` in a test on the
  test database (in pytest-django's rolled-back transaction, or a transactional test's
  flushed database under ``django_db(transaction=True)``), with a clean registry: functions the test itself defines
  are forgotten afterwards, and stubs the test never used fail it at teardown;
- ``obelisk_worker``: a real worker cluster on the test's database, started before the test
  and stopped after it (``@pytest.mark.obelisk_worker(modules=[...], workers=N)``; the
  settings' ``OBELISK['COMPONENT_MODULES']`` by default).

pytest loads plugins before ``django.setup()``: nothing here imports Django, the store or
the runtime until a fixture runs. why: D120
"""

from __future__ import annotations

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "obelisk_worker(modules=None, workers=1): the component modules and size of obelisk_worker's cluster"
    )


class ObeliskEnv:
    """What ``obelisk_env`` gives a test."""

    def __init__(self):
        from workers.testing import environment, replaying, stubs

        self._environment = environment
        self._replaying = replaying
        self.sequence = stubs.sequence
        self.runs: list = []

    def run(self, fn, *args, **options):
        """``workers.testing.run_workflow``; unused stubs fail the test at its end."""
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", self._environment.UnusedStubWarning)
            run = self._environment.run_workflow(fn, *args, **options)
        self.runs.append(run)
        return run

    run_workflow = run

    def replay(self, fn, history, **options):
        """``workers.testing.replay``: an exported history against the current code."""
        return self._replaying.replay(fn, history, **options)

    def export(self, execution_id: str) -> dict:
        """The execution's history document (what the API's ``/export`` returns)."""
        from executions.store.export import export_execution

        return export_execution(execution_id)

    def unused_stubs(self):
        return self._environment.unused_stubs_error(self.runs)


@pytest.fixture
def obelisk_env(db):
    from executions import catalog
    from workers import registry
    from workers.testing import deployment

    saved = registry.registered()
    catalog.forget()  # the test database was emptied: what this process learned of it is stale
    deployment._deployment_for.cache_clear()
    env = ObeliskEnv()
    try:
        yield env
    finally:
        _forget_local_functions(registry, saved)
        catalog.forget()
        deployment._deployment_for.cache_clear()
    error = env.unused_stubs()
    if error is not None:
        raise error


def _forget_local_functions(registry, saved: dict) -> None:
    """The registry as the test found it, with the modules imported meanwhile: functions
    the test defined in its own body (``<locals>``) go, ones they replaced come back."""
    registry.restore(saved)


@pytest.fixture
def obelisk_worker(request, transactional_db, tmp_path):
    from executions import catalog
    from workers.testing import deployment
    from workers.testing.cluster import WorkerCluster, default_modules

    marker = request.node.get_closest_marker("obelisk_worker")
    options = dict(marker.kwargs) if marker else {}
    modules = list(options.get("modules") or default_modules())
    catalog.forget()
    deployment._deployment_for.cache_clear()
    cluster = WorkerCluster(tmp_path / "obelisk-worker", modules, workers=int(options.get("workers", 1)))
    cluster.start()
    failed = request.session.testsfailed
    try:
        yield cluster
    finally:
        cluster.stop()
        if request.session.testsfailed > failed:
            print(f"\n--- obelisk_worker log ({cluster.log_path}) ---\n{cluster.log()}")
