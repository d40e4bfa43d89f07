"""Long polls (``GET /api/v1/executions/{id}/wait``) behind a real WSGI server (issue 36,
items 11 and 12; D100, D101, D102).

- 200 concurrent waits must not starve the database of connections: a wait holds none
  while it blocks, the server's connections stay bounded by its threads, past the caps a
  wait is answered 429 with ``Retry-After``, and the worker cluster runs every execution.
- A wait longer than the server's worker timeout answers JSON (``finished: false``) when
  the server's cap ends it, never the server's HTML 500.
"""

from __future__ import annotations

import secrets
import threading
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test import override_settings

from executions import store
from executions.events import Ok
from executions.store.reads import HOLD_CONNECTION_SECONDS
from obelisk_api import tokens, waiting
from tests.support import helpers
from tests.support.api import ADD, VIEW, api_for, assert_error, finish, make_user, submitted
from tests.support.clusters import started_clusters, wait_until
from tests.support.server import Gunicorn, Reply

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def deployed():
    return helpers.deploy_components()


# The README's command line (D102), exactly as documented but for the port.
README_COMMAND = (
    "gunicorn obelisk_site.wsgi:application --bind 127.0.0.1:8000"
    " --worker-class gthread --workers 2 --threads 16 --timeout 60 --graceful-timeout 30"
)
SAFETY_TIMEOUT = 50  # seconds: every client of the 200-wait test is done by then


def readme_args() -> str:
    """The README's command after the program name, its port left to fill in."""
    program, _, args = README_COMMAND.partition(" ")
    assert program == "gunicorn"
    return args.replace("127.0.0.1:8000", "127.0.0.1:{port}")


def viewer_token(username: str = "reader") -> str:
    """A token of a user with only the read permission (the issue's attacker)."""
    make_user(username, VIEW)
    return tokens.issue(username).token


# ---------------------------------------------------------------------------------------
# Item 11: 200 concurrent waits, a capped database role, a worker cluster
# ---------------------------------------------------------------------------------------

THREADS = 24  # the server's threads (one gunicorn gthread worker)
WAITS_PER_PROCESS = 16  # OBELISK['MAX_WAITS_PER_PROCESS'] for the server
CLIENTS = 200


class CappedRole:
    """A login role that may open at most ``limit`` connections (PostgreSQL refuses the
    next one, as ``max_connections`` would), with the rights the API needs on the test
    database; created and dropped by the test."""

    def __init__(self, limit: int):
        self.name = f"{connection.settings_dict['NAME']}_api"[:63]
        self.password = secrets.token_hex(16)
        self.limit = limit

    def __enter__(self) -> CappedRole:
        with connection.cursor() as cursor:
            self._drop(cursor)
            # A utility statement takes no parameters; the password is hex digits.
            cursor.execute(
                f"CREATE ROLE \"{self.name}\" LOGIN PASSWORD '{self.password}' CONNECTION LIMIT {int(self.limit)}"
            )
            cursor.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{self.name}"')
            cursor.execute(f'GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO "{self.name}"')
        return self

    def __exit__(self, *exc) -> None:
        with connection.cursor() as cursor:
            self._drop(cursor)

    def _drop(self, cursor) -> None:
        cursor.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [self.name])
        if cursor.fetchone():
            cursor.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", [self.name])
            cursor.execute(f'DROP OWNED BY "{self.name}"')
            cursor.execute(f'DROP ROLE "{self.name}"')

    def url(self) -> str:
        settings = connection.settings_dict
        host, port = settings.get("HOST") or "127.0.0.1", settings.get("PORT") or "5432"
        return f"postgres://{self.name}:{self.password}@{host}:{port}/{settings['NAME']}"

    def connections(self) -> int:
        """The role's sessions now, from ``pg_stat_activity``."""
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE usename = %s", [self.name])
            return cursor.fetchone()[0]


class Sampler(threading.Thread):
    """Counts the role's sessions every 20 ms; ``peak()`` since a mark."""

    def __init__(self, role: CappedRole):
        super().__init__(daemon=True)
        self.role = role
        self.samples: list[int] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                self.samples.append(self.role.connections())
                time.sleep(0.02)
        finally:
            connection.close()

    def mark(self) -> int:
        return len(self.samples)

    def peak(self, since: int = 0) -> int:
        return max(self.samples[since:], default=0)

    def stop(self) -> None:
        self.stopping.set()
        self.join(10)


class Client(threading.Thread):
    """One API client that waits for one execution until it has finished: it asks again
    after ``finished: false`` and after a 429 (once ``Retry-After`` has passed)."""

    def __init__(self, server: Gunicorn, token: str, execution_id: str, sent: threading.Semaphore):
        super().__init__(daemon=True)
        self.server, self.token, self.execution_id, self.sent = server, token, execution_id, sent
        self.replies: list[Reply] = []
        self.failure: str | None = None

    def run(self) -> None:
        deadline = time.monotonic() + SAFETY_TIMEOUT
        path = f"/api/v1/executions/{self.execution_id}/wait?timeout=30"
        while time.monotonic() < deadline:
            try:
                reply = self.server.get(path, token=self.token, timeout=45, on_sent=self._first_sent)
            except OSError as error:
                self.failure = f"{type(error).__name__}: {error}"
                return
            self.replies.append(reply)
            if reply.status == 429 and reply.headers.get("retry-after", "").isdigit():
                time.sleep(int(reply.headers["retry-after"]))
            elif reply.status != 200 or not reply.is_json or reply.json()["finished"]:
                return
        self.failure = f"still waiting after {SAFETY_TIMEOUT} s"

    def _first_sent(self) -> None:
        if len(self.replies) == 0:
            self.sent.release()

    def finished(self) -> bool:
        last = self.replies[-1] if self.replies else None
        return last is not None and last.status == 200 and last.is_json and last.json()["finished"]


def assert_well_formed(reply: Reply) -> None:
    """200, or a 429 in the API's error shape with a ``Retry-After`` in seconds."""
    assert reply.status in (200, 429), (reply.status, reply.body[:300])
    assert reply.is_json, (reply.status, reply.headers, reply.body[:300])
    if reply.status == 429:
        assert reply.json()["code"] == "too_many_waits", reply.json()
        assert reply.headers["retry-after"].isdigit() and int(reply.headers["retry-after"]) >= 1


@pytest.mark.postgres_only
def test_200_concurrent_waits_hold_no_connections_while_they_wait_and_every_execution_finishes(request, tmp_path):
    token = viewer_token()
    execution_ids = [submitted(ADD, [i, 1]) for i in range(CLIENTS)]
    # The role plays `max_connections`: the server may open one per thread and its LISTEN.
    with CappedRole(limit=THREADS + 2) as role:
        env = {
            "OBELISK_MAX_WAITS_PER_PROCESS": str(WAITS_PER_PROCESS),
            "OBELISK_MAX_WAITS_PER_USER": str(WAITS_PER_PROCESS),
            "OBELISK_MAX_WAIT_SECONDS": "20",
        }
        args = f"obelisk_site.wsgi:application --bind 127.0.0.1:{{port}} --worker-class gthread --threads {THREADS}"
        sampler = Sampler(role)
        sent = threading.Semaphore(0)
        with Gunicorn(args, tmp_path / "gunicorn.log", env=env, database_url=role.url()) as server:
            sampler.start()
            try:
                clients = [Client(server, token, execution_id, sent) for execution_id in execution_ids]
                for client in clients:
                    client.start()
                for _ in clients:
                    assert sent.acquire(timeout=SAFETY_TIMEOUT), "a client could not send its first wait"
                # Every client asked, no worker runs: the server's waits block. Their
                # connections are closed: the server keeps at most one per thread that is
                # not waiting, and its LISTEN session (a stray re-read aside).
                time.sleep(10 * HOLD_CONNECTION_SECONDS)  # a wait keeps its connection that long
                blocked = sampler.mark()
                wait_until(lambda: len(sampler.samples) >= blocked + 100, timeout=30, what="samples")
                blocked_peak = sampler.peak(blocked)
                with started_clusters(request, tmp_path) as start:
                    start(1)
                    for client in clients:
                        client.join(SAFETY_TIMEOUT)
            finally:
                sampler.stop()
                log = server.log()
    failures = [(c.execution_id, c.failure) for c in clients if c.failure or not c.finished()]
    assert not failures, (failures[:5], log[-3000:])
    for client in clients:
        for reply in client.replies:
            assert_well_formed(reply)
    assert [c.replies[-1].json()["result"] for c in clients] == [{"ok": i + 1} for i in range(CLIENTS)]
    assert len(store.get_finished_results(execution_ids)) == CLIENTS
    assert blocked_peak <= THREADS - WAITS_PER_PROCESS + 3, (blocked_peak, sampler.samples[blocked:][:50])
    assert any(reply.status == 429 for client in clients for reply in client.replies)
    assert sampler.peak() <= THREADS + 1, sampler.peak()
    assert "Traceback" not in log, log[-3000:]


# ---------------------------------------------------------------------------------------
# The caps: per user and per process, 429 with Retry-After past them
# ---------------------------------------------------------------------------------------


def caps(per_user: int, per_process: int) -> dict:
    from django.conf import settings

    return {
        **settings.OBELISK,
        "MAX_WAITS_PER_USER": per_user,
        "MAX_WAITS_PER_PROCESS": per_process,
        "MAX_WAIT": timedelta(seconds=20),
    }


def test_waits_past_the_per_user_and_per_process_caps_are_answered_429_with_retry_after():
    ada, bob = make_user("ada", VIEW), make_user("bob", VIEW)
    execution_id = submitted()
    path = f"/executions/{execution_id}/wait"
    replies = []

    def wait_as(user) -> threading.Thread:
        def run():
            replies.append(api_for(user).get(path, {"timeout": 20}))
            connection.close()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    with override_settings(OBELISK=caps(per_user=2, per_process=3)):
        threads = [wait_as(ada), wait_as(ada)]
        wait_until(lambda: waiting.in_flight(ada) == 2, timeout=10, what="ada's two waits")
        refused = api_for(ada).get(path, {"timeout": 20})
        body = assert_error(refused, 429, "too_many_waits")
        assert "2 waits" in body["message"] and int(refused["Retry-After"]) >= 1
        threads.append(wait_as(bob))  # another user still gets in: the cap is per user
        wait_until(lambda: waiting.in_flight() == 3, timeout=10, what="bob's wait")
        refused = api_for(bob).get(path, {"timeout": 20})
        assert "3 waits" in assert_error(refused, 429, "too_many_waits")["message"]  # the process's cap
        assert int(refused["Retry-After"]) >= 1
        finish(execution_id, Ok(3))
        for thread in threads:
            thread.join(SAFETY_TIMEOUT)
        assert [r.json()["finished"] for r in replies] == [True, True, True]
        assert waiting.in_flight() == 0
        again = api_for(ada).get(path, {"timeout": 20})
        assert again.status_code == 200 and again.json()["result"] == {"ok": 3}


# ---------------------------------------------------------------------------------------
# Item 12: a wait longer than the server's worker timeout
# ---------------------------------------------------------------------------------------

SERVERS = {
    # gunicorn's default (sync) worker, killed after --timeout; 3 s here, 30 s by default.
    "sync-worker": "obelisk_site.wsgi:application --bind 127.0.0.1:{port} --timeout 3",
    # The README's command line.
    "readme-command": None,
}


@pytest.mark.parametrize("server", sorted(SERVERS))
def test_a_wait_longer_than_the_worker_timeout_answers_json_finished_false(server, tmp_path):
    token = viewer_token()
    execution_id = submitted()
    args = SERVERS[server] or readme_args()
    # The cap below the worker's timeout (D102): 25 s under gunicorn's default 30 s; here
    # 1.5 s under the sync worker's 3 s, the same mechanism in a few seconds.
    with Gunicorn(args, tmp_path / "gunicorn.log", env={"OBELISK_MAX_WAIT_SECONDS": "1.5"}) as gunicorn:
        reply = gunicorn.get(f"/api/v1/executions/{execution_id}/wait?timeout=45", token=token)
        log = gunicorn.log()
    assert reply.status == 200 and reply.is_json, (reply.status, reply.body[:300], log[-2000:])
    assert reply.json() == {"execution_id": execution_id, "finished": False, "outcome": None, "result": None}
    assert "WORKER TIMEOUT" not in log, log[-2000:]


def test_the_default_caps_fit_gunicorns_default_timeout_and_the_readme_command():
    """A wait ends before any of the timeouts that would kill it (D102), and the waits of
    a process leave threads of the README's command free for other requests (D101)."""
    from gunicorn.config import Config

    from executions import conf

    command = Config()
    parsed = command.parser().parse_args(readme_args().format(port=8000).split())
    for name, value in vars(parsed).items():
        if value is not None and name != "args":
            command.set(name.lower(), value)
    max_wait = conf.DEFAULTS["MAX_WAIT"].total_seconds()
    assert max_wait < min(Config().timeout, command.timeout, command.graceful_timeout)
    assert (command.worker_class_str, command.threads) == ("gthread", 16)
    assert conf.DEFAULTS["MAX_WAITS_PER_USER"] <= conf.DEFAULTS["MAX_WAITS_PER_PROCESS"] < command.threads
