"""A real worker cluster on the test's database, for end-to-end tests (``obelisk_worker``).

``obelisk_worker`` (the management command) runs in a subprocess, in a session of its own,
with the test process's settings and import path, and the database pytest-django created
for the session: a generated settings module imports the test's settings and points
``DATABASES['default']`` at it (a user's settings need not read ``DATABASE_URL``). The test
must be transactional for the cluster to see its rows; an in-memory SQLite database cannot
be shared and is refused. Stopped with SIGTERM (django-q2 stops in order), then the whole
process group is killed. why: D120
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection

from executions import conf, store
from executions.events import RetVal
from workers.registry import Function
from workers.testing import deployment

READY = "worker cluster:"  # the command's first line once its processes are started
START_TIMEOUT = 60.0
STOP_TIMEOUT = 20.0


class WorkerCluster:
    """``obelisk_worker --workers N`` serving ``modules`` on the test database."""

    def __init__(self, directory: Path, modules: list[str], workers: int = 1):
        self.directory = Path(directory)
        self.modules = modules
        self.workers = workers
        self.log_path = self.directory / "obelisk-worker.log"
        self.process: subprocess.Popen | None = None

    def start(self) -> WorkerCluster:
        self.directory.mkdir(parents=True, exist_ok=True)
        module = self._settings_module()
        paths = [str(self.directory)] + [p for p in sys.path if p and os.path.isdir(p)]
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": module, "PYTHONPATH": os.pathsep.join(paths)}
        env["PYTHONUNBUFFERED"] = "1"
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "django", "obelisk_worker", "--workers", str(self.workers)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while READY not in self.log():
            if self.process.poll() is not None:
                raise RuntimeError(f"the worker cluster exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the worker cluster did not start within {START_TIMEOUT:g} s:\n{self.log()}")
            time.sleep(0.05)
        return self

    def submit(self, fn: Function | str, *args: Any, **options) -> str:
        """Submit ``fn(*args)`` pinned to this process's code; returns the execution id."""
        execution_id, _ = deployment.submit(fn if isinstance(fn, str) else fn.ffqn, list(args), **options)
        return execution_id

    def result(self, execution_id: str, timeout: float = 30.0) -> RetVal:
        """Wait for the execution to finish (``errors.Timeout`` after ``timeout``)."""
        return store.wait_for_finished([execution_id], timeout=timeout)[execution_id]

    def run(self, fn: Function | str, *args: Any, timeout: float = 30.0) -> RetVal:
        return self.result(self.submit(fn, *args), timeout)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.process is None:
            return
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(self.process.pid, signal.SIGKILL)  # stragglers of the tree
            except (ProcessLookupError, PermissionError):
                pass
            if self.process.poll() is None:
                self.process.wait(10)
        finally:
            self.process = None

    def _settings_module(self) -> str:
        """A settings module: the test's, on the test database, serving ``modules``."""
        database = {key: value for key, value in connection.settings_dict.items() if key != "TEST"}
        name = str(database.get("NAME") or "")
        if connection.vendor == "sqlite" and (name == ":memory:" or name.startswith("file:") or not name):
            raise RuntimeError(
                "obelisk_worker needs a test database other processes can open: give SQLite a file "
                "(DATABASES['default']['TEST']['NAME']), or use PostgreSQL"
            )
        obelisk = {**getattr(settings, "OBELISK", {}), "COMPONENT_MODULES": self.modules}
        module = "obelisk_test_worker_settings"
        (self.directory / f"{module}.py").write_text(
            "import datetime  # noqa: F401 (timedeltas of OBELISK below)\n"
            f"from {settings.SETTINGS_MODULE} import *  # noqa\n"
            f"DATABASES = {{'default': {database!r}}}\n"
            f"OBELISK = {obelisk!r}\n"
        )
        return module


def default_modules() -> list[str]:
    """The settings' component modules: what a worker of the project serves."""
    return [m.strip() for m in conf.get("COMPONENT_MODULES") if m and m.strip()]
