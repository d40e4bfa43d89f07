"""A real WSGI server for the serving tests (``tests/workers/test_wait_connections.py``): gunicorn
serving ``obelisk_site.wsgi:application`` on the current test database, in a subprocess of
its own session (the arbiter and its workers are killed together at the end).

Like the worker clusters of ``tests/support/clusters.py``, the server is another process:
tests that use it are transactional, so that it sees what they committed.
"""

from __future__ import annotations

import http.client
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.support.clusters import BASE_DIR, current_database_url

GUNICORN = str(Path(sys.executable).parent / "gunicorn")
START_TIMEOUT = 60  # seconds; a safety limit only


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class Reply:
    """What the server answered: status, headers (lower-case names) and the raw body."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def is_json(self) -> bool:
        return self.headers.get("content-type", "").startswith("application/json")

    def json(self):
        return json.loads(self.body)


class Gunicorn:
    """``gunicorn <args>`` (``args`` after the program name, ``{port}`` filled in) with
    ``env`` on top of the test's environment and the test database's ``DATABASE_URL``."""

    def __init__(
        self, args: str, log_path: Path, *, env: dict[str, str] | None = None, database_url: str | None = None
    ):
        self.port = free_port()
        self.argv = [GUNICORN, *shlex.split(args.format(port=self.port))]
        self.log_path = Path(log_path)
        self.env = dict(env or {})
        self.database_url = database_url
        self.process: subprocess.Popen | None = None

    def start(self) -> Gunicorn:
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="obelisk_site.settings",
            DATABASE_URL=self.database_url or current_database_url(),
            OBELISK_COMPONENT_MODULES="tests.support.components",
            DJANGO_ALLOWED_HOSTS="127.0.0.1,localhost",
            PYTHONUNBUFFERED="1",
        )
        env.update(self.env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                self.argv,
                cwd=BASE_DIR,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {self.process.returncode}:\n{self.log()}")
            try:
                if self.get("/api/v1/health", timeout=2).status == 200:
                    return
            except OSError:
                pass
            if time.monotonic() >= deadline:
                raise RuntimeError(f"gunicorn not serving after {START_TIMEOUT} s:\n{self.log()}")
            time.sleep(0.1)

    def get(self, path: str, *, token: str | None = None, timeout: float = 60, on_sent=None) -> Reply:
        """One request on a connection of its own (as 200 separate clients would);
        ``on_sent()`` is called once the request is sent, before the answer is read."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            connection.request("GET", path, headers=headers)
            if on_sent is not None:
                on_sent()
            response = connection.getresponse()
            return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
        finally:
            connection.close()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.process is None:
            return
        # SIGINT: gunicorn's quick shutdown (SIGTERM would let open long polls run out).
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # whatever is left of its workers
        except (ProcessLookupError, PermissionError):
            pass
        if self.process.poll() is None:
            self.process.wait(10)

    def __enter__(self) -> Gunicorn:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
