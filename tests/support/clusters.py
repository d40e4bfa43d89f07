"""Real worker clusters for the end-to-end worker tests (``tests/workers/test_workers.py``).

``WorkerCluster`` starts ``manage.py obelisk_worker`` as a subprocess (its own session, so
the whole process tree can be killed at teardown) against the *current test database*:
the cluster is another process, so the tests that use it must be transactional
(``django_db(transaction=True)``) for it to see their committed rows.

The cluster's worker processes are forked by django-q2's sentinel, which is forked by the
``manage.py`` process; they share its process group. Tests learn a worker's pid from what
the test activities (``tests/support/components.py``) write into marker files.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

from django.db import connection

BASE_DIR = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60  # seconds; a safety limit only
STOP_TIMEOUT = 20  # seconds before the process group is killed
READY_LINE = "broker serving"  # logged by workers.broker once the pusher is dequeuing


def current_database_url() -> str:
    """A ``DATABASE_URL`` for the database this test process uses (the test database that
    pytest-django created; ``settings_dict['NAME']`` has been switched to it)."""
    settings = connection.settings_dict
    if connection.vendor == "postgresql":
        user = quote(settings.get("USER") or "", safe="")
        password = settings.get("PASSWORD") or ""
        credentials = f"{user}:{quote(password, safe='')}" if password else user
        host = settings.get("HOST") or "127.0.0.1"
        port = settings.get("PORT") or "5432"
        return f"postgres://{credentials}@{host}:{port}/{quote(settings['NAME'], safe='')}"
    if connection.vendor == "sqlite":
        name = str(settings["NAME"])
        if name == ":memory:" or name.startswith("file:"):
            raise RuntimeError(f"the SQLite test database must be a file to share it with workers, not {name!r}")
        return f"sqlite:///{Path(name).resolve()}"
    raise RuntimeError(f"unsupported database vendor {connection.vendor}")


def process_alive(pid: int) -> bool:
    """True if ``pid`` is a running process (a zombie, dead but not reaped, is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_until(predicate, *, timeout: float, interval: float = 0.05, what: str = "condition"):
    """Poll ``predicate`` until it returns something truthy (returned); ``timeout`` is a
    safety limit and raises ``AssertionError``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def wait_for_marker(path: Path, *, timeout: float = 30) -> str:
    """Wait until an activity wrote ``path`` (a complete line) and return its text."""

    def read():
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        return text if text.endswith("\n") else None

    return wait_until(read, timeout=timeout, what=f"marker {path}")


class WorkerCluster:
    """``python manage.py obelisk_worker --workers N`` on the test database."""

    def __init__(self, log_path: Path, workers: int = 2, *, name: str = "cluster", env: dict[str, str] | None = None):
        self.log_path = Path(log_path)
        self.workers = workers
        self.name = name
        self.env = dict(env or {})  # extra environment, e.g. OBELISK_SHUTDOWN_GRACE_SECONDS
        self.process: subprocess.Popen | None = None
        self._log_file = None

    @property
    def pid(self) -> int:
        return self.process.pid

    def start(self, *, wait: bool = True) -> WorkerCluster:
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="obelisk_site.settings",
            OBELISK_COMPONENT_MODULES="tests.support.components",
            DATABASE_URL=current_database_url(),
            OBELISK_LOG_LEVEL="INFO",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [sys.executable, "manage.py", "obelisk_worker", "--workers", str(self.workers)],
            cwd=BASE_DIR,
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT) -> None:
        """Until the broker dequeues (the sentinel has forked the workers by then)."""
        deadline = time.monotonic() + timeout
        while READY_LINE not in self.log():
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log()}")
            if time.monotonic() >= deadline:
                raise RuntimeError(f"{self.name} not ready after {timeout} s:\n{self.log()}")
            time.sleep(0.05)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def is_member(self, pid: int) -> bool:
        """Whether ``pid`` (alive) belongs to this cluster's process tree."""
        try:
            return os.getpgid(pid) == self.pid
        except ProcessLookupError:
            return False

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal_main(self, signum: int = signal.SIGTERM) -> None:
        """Send ``signum`` to the ``manage.py obelisk_worker`` process only (an operator's
        ``kill``)."""
        self.process.send_signal(signum)

    def signal_group(self, signum: int = signal.SIGTERM) -> None:
        """Send ``signum`` to every process of the cluster's process group at once (what
        systemd and Kubernetes do on stop; ``SIGKILL`` for a vanished host)."""
        os.killpg(self.pid, signum)

    def members(self) -> dict[int, int]:
        """The running processes of the cluster's process group (zombies, dead but not
        reaped, do not count), each with its parent's pid. Read from ``/proc``: a process
        whose parent died still belongs to the group."""
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            # fields after the command name: state, ppid, pgrp, ...
            if fields[0] != "Z" and int(fields[2]) == self.pid:
                found[int(entry.name)] = int(fields[1])
        return found

    def group_alive(self) -> bool:
        """Whether any process of the cluster's process group is still running."""
        return bool(self.members())

    def wait_exit(self, timeout: float) -> int:
        """Wait until the ``obelisk_worker`` process and every process of its group have
        ended; ``timeout`` is a safety limit (``AssertionError``). Returns the exit code."""
        deadline = time.monotonic() + timeout
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} still running {timeout} s after it was told to stop") from None
        wait_until(
            lambda: not self.group_alive(),
            timeout=max(0.1, deadline - time.monotonic()),
            what=f"every process of {self.name} to end",
        )
        return code

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM (django-q2 stops its processes), then SIGKILL to the whole group."""
        if self.process is None:
            return
        try:
            if self.process.poll() is None:
                self.process.send_signal(signal.SIGTERM)
                try:
                    self.process.wait(timeout)
                except subprocess.TimeoutExpired:
                    pass
            # Whatever is left of the tree (a stuck worker, a stopped cluster's stragglers).
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if self.process.poll() is None:
                self.process.wait(10)
        finally:
            if self._log_file is not None:
                self._log_file.close()
                self._log_file = None

    def __enter__(self) -> WorkerCluster:
        if self.process is None:
            self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def report_log(request, clusters, since: dict | None = None) -> None:
    """Print the clusters' logs (from the offsets in ``since``) to the terminal: called
    when a test failed, to help debugging."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    for cluster in clusters:
        text = cluster.log()
        if since is not None:
            text = text[since.get(id(cluster), 0) :]
        header = f"---- log of {cluster.name} (pid {cluster.pid}) for {request.node.nodeid} ----"
        if reporter is not None:
            reporter.write_line("")
            reporter.write_line(header)
            reporter.write_line(text[-20000:])
        else:
            print(header, text[-20000:], sep="\n", file=sys.stderr)


@contextlib.contextmanager
def started_clusters(request, directory: Path, *, default_workers: int = 1, default_env: dict | None = None):
    """For one test: ``start(workers, env=..., wait=True)`` starts a cluster of its own;
    every cluster started is stopped when the block ends, and their logs are printed if
    the test failed."""
    started: list[WorkerCluster] = []

    def start(workers: int = default_workers, *, env: dict | None = default_env, wait: bool = True) -> WorkerCluster:
        number = len(started) + 1
        cluster = WorkerCluster(directory / f"cluster-{number}.log", workers=workers, name=f"cluster {number}", env=env)
        started.append(cluster)
        return cluster.start(wait=wait)

    failed = request.session.testsfailed
    try:
        yield start
    finally:
        for cluster in started:
            cluster.stop()
        if request.session.testsfailed > failed:
            report_log(request, started)


def outcomes(execution_ids: list[str], timeout: float) -> dict[str, object]:
    """Wait for the executions to finish; each one's value, or ``"unfinished (<state>)"``
    for those still unfinished at the safety limit, so a failed comparison shows what went
    wrong instead of a bare timeout."""
    from executions import errors, store

    try:
        return store.wait_for_finished(execution_ids, timeout=timeout)
    except errors.Timeout:
        found = store.get_finished_results(execution_ids)
        return {
            execution_id: found.get(execution_id, f"unfinished ({store.get_state(execution_id).state})")
            for execution_id in execution_ids
        }
