#!/usr/bin/env python
"""The REST API's cost over the in-process client, in one run on PostgreSQL.

On a database of its own (``obelisk_bench_http_<checkout>_<pid>``, created and dropped) with one real worker
cluster (``manage.py obelisk_worker``, the no-op activity of bench/components.py) and a real
HTTP server (Django's threaded development server with TCP_NODELAY, one keep-alive
connection from this client), it measures, one call at a time:

- submit: ``POST /api/v1/executions`` (bearer token; audited) next to ``client.submit``
  (the hot path, not audited) and ``client.submit`` audited as the API does it;
- submit → result: ``POST`` then ``GET …/wait`` until finished, next to ``client.submit`` +
  ``client.wait``.

Per operation: latency p50 / p99 (ms) and calls/s (one client, back to back). Django's
server is a development server: the figures bound what the API adds, not what a production WSGI
server would do.

Usage: python bench/api_http.py [--count 200] [--workers 1]
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

# Run as a script, this file's directory comes first on sys.path, and this file would be
# the standard library's `http` for everything imported after it.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from bench.run import FFQN, ROOT, child_env, note, percentile, stop_with_the_benchmark  # noqa: E402
from bench.support import own_database, running, warm_up  # noqa: E402

DATABASE = "obelisk_bench_http"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Django's development server (runserver's classes), with TCP_NODELAY on each connection:
# it writes a response's headers and body in two sends, and with Nagle's algorithm on, the
# body waits out the client's delayed ACK on a kept-alive connection (~40 ms a request,
# nothing to do with the API). runserver itself cannot be told to set it.
SERVE = """
import os, socket, sys
import django
django.setup()
from django.core.servers.basehttp import ThreadedWSGIServer, WSGIRequestHandler
from django.core.wsgi import get_wsgi_application

class NoDelay(WSGIRequestHandler):
    def setup(self):
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

server = ThreadedWSGIServer(("127.0.0.1", int(sys.argv[1])), NoDelay)
server.set_app(get_wsgi_application())
server.serve_forever()
"""


class Server:
    """Django's development server on the bench database, stopped whatever happens;
    ``env``: more of its environment (bench/webhooks.py adds its component module)."""

    def __init__(self, url: str, env: dict[str, str] | None = None):
        import requests

        self.port = free_port()
        env = {**child_env(url), "DJANGO_ALLOWED_HOSTS": "127.0.0.1", "PYTHONPATH": str(ROOT), **(env or {})}
        env.setdefault("DJANGO_SETTINGS_MODULE", os.environ.get("DJANGO_SETTINGS_MODULE", "obelisk_site.settings"))
        self.process = subprocess.Popen(
            [sys.executable, "-c", SERVE, str(self.port)],
            cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=stop_with_the_benchmark,
        )  # fmt: skip
        self.origin = f"http://127.0.0.1:{self.port}"
        self.base = f"{self.origin}/api/v1"
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{self.base}/health", timeout=5).status_code == 200:
                    return
            except requests.RequestException:  # not listening yet, or busy importing the URLs
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit("the HTTP server did not come up")
            time.sleep(0.1)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def bench_token() -> str:
    from django.contrib.auth.models import Permission, User

    from obelisk_api import tokens

    user = User.objects.create_user("bench")
    user.user_permissions.set(Permission.objects.filter(codename__in=["view_executionstate", "act_on_executions"]))
    return tokens.issue("bench", "bench/api_http.py").token


def timed(call, count: int) -> dict:
    """Latency of ``count`` calls back to back: p50 / p99 ms, calls/s."""
    samples = []
    started = time.perf_counter()
    for _ in range(count):
        begin = time.perf_counter()
        call()
        samples.append((time.perf_counter() - begin) * 1000)
    seconds = time.perf_counter() - started
    return {"p50": percentile(samples, 0.5), "p99": percentile(samples, 0.99), "rate": count / seconds}


def http_calls(server: Server, token: str):
    import requests

    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {token}"
    body = {"function": FFQN, "arguments": []}

    def submit() -> str:
        response = session.post(f"{server.base}/executions", json=body, timeout=30)
        assert response.status_code == 201, response.text
        return response.json()["execution_id"]

    def submit_and_wait() -> None:
        execution_id = submit()
        while True:
            answer = session.get(f"{server.base}/executions/{execution_id}/wait", params={"timeout": 30}, timeout=60)
            assert answer.status_code == 200, answer.text
            if answer.json()["finished"]:
                return

    return submit, submit_and_wait


def client_calls():
    from executions import client

    def submit() -> str:
        return client.submit(FFQN, []).execution_id

    def submit_audited() -> str:
        return client.submit(FFQN, [], actor="bench", via="api").execution_id

    def submit_and_wait() -> None:
        client.wait(submit(), timeout=30)

    return submit, submit_audited, submit_and_wait


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=200, help="calls per measure")
    parser.add_argument("--workers", type=int, default=1, help="worker processes of the cluster")
    args = parser.parse_args()
    # DEBUG is off in the server, as deployed: it needs a secret key.
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))

    with own_database(DATABASE) as url, running(url, args.workers) as clusters:
        warm_up(clusters)
        token = bench_token()
        server = Server(url)
        try:
            http_submit, http_round_trip = http_calls(server, token)
            py_submit, py_audited, py_round_trip = client_calls()
            for call in (http_submit, http_round_trip, py_submit, py_round_trip):
                timed(call, 10)  # warm-up: connections, caches, the worker
            note(f"measuring, {args.count} calls each")
            rows = [
                ("submit", "HTTP POST /executions", timed(http_submit, args.count)),
                ("submit", "client.submit", timed(py_submit, args.count)),
                ("submit", "client.submit, audited", timed(py_audited, args.count)),
                ("submit → result", "HTTP POST + GET …/wait", timed(http_round_trip, args.count)),
                ("submit → result", "client.submit + client.wait", timed(py_round_trip, args.count)),
            ]
        finally:
            server.stop()

    print(f"\nREST API vs in-process client, one call at a time ({args.count} each, {args.workers} worker(s))")
    print(f"{'measure':<17}{'how':<30}{'p50 ms':>9}{'p99 ms':>9}{'calls/s':>10}")
    for measure, how, figures in rows:
        print(f"{measure:<17}{how:<30}{figures['p50']:>9.2f}{figures['p99']:>9.2f}{figures['rate']:>10,.0f}")
    http_rt, py_rt = rows[3][2]["p50"], rows[4][2]["p50"]
    print(f"HTTP adds {http_rt - py_rt:.2f} ms at p50 to a submit → result round trip")


if __name__ == "__main__":
    main()
