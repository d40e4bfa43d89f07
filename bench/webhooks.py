#!/usr/bin/env python
"""Webhook requests/s with submit-and-return next to the REST API's submit, in one run on
PostgreSQL (issue 39, "bench/").

On a database of its own (``obelisk_bench_webhooks_<checkout>_<pid>``, created and dropped)
with one real worker cluster (the no-op activity of bench/components.py, which drains what
is submitted) and one HTTP server (Django's threaded development server with TCP_NODELAY,
as bench/api_http.py; the same server process serves both the API and the webhooks), one
client on one keep-alive connection measures, one call at a time:

- ``POST /api/v1/executions`` with a bearer token (201; audited, ``via = api``);
- ``POST /hooks/bench/submit-bearer``: a webhook with ``BearerToken()`` whose handler calls
  ``request.submit`` (202; the call recorded in ``t_webhook_call``);
- ``POST /hooks/bench/submit-open``: the same with ``auth=OPEN``;
- ``POST /hooks/bench/submit-keyed``: open, with an ``Idempotency-Key`` (a fresh key per
  call: one more row, ``t_webhook_key``).

Per measure: requests/s and latency p50 / p99 (ms). The endpoints are declared in this
module, which the server imports as a component module (its top level imports only the
authoring API).

Usage: python bench/webhooks.py [--count 300]
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    # Run as a script, this file's directory comes first on sys.path: put the project first.
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
    sys.path.insert(0, str(_here.parent))

from workers.webhooks import OPEN, BearerToken, webhook  # noqa: E402

FFQN = "bench:noop/ifc.noop"  # bench/components.py


@webhook("POST", "/bench/submit-bearer", auth=BearerToken())
def submit_bearer(request):
    return request.submit(FFQN, [])


@webhook("POST", "/bench/submit-open", auth=OPEN)
def submit_open(request):
    return request.submit(FFQN, [])


@webhook("POST", "/bench/submit-keyed", auth=OPEN, idempotency_header="Idempotency-Key")
def submit_keyed(request):
    return request.submit(FFQN, [])


DATABASE = "obelisk_bench_webhooks"


def start_server(url: str):
    """bench/api_http.py's server, importing this module as a component module too."""
    from bench.api_http import Server

    return Server(url, {"OBELISK_COMPONENT_MODULES": "bench.components,bench.webhooks"})


def calls(server, token: str) -> dict:
    """One function per measure, each making one request and checking its status."""
    import itertools

    import requests

    session = requests.Session()
    auth = {"Authorization": f"Bearer {token}"}
    keys = itertools.count()

    def post(path: str, status: int, headers=None, json=None):
        def call() -> None:
            response = session.post(server.origin + path, json=json, headers=headers, timeout=30)
            assert response.status_code == status, (path, response.status_code, response.text[:300])

        return call

    def keyed() -> None:
        response = session.post(
            server.origin + "/hooks/bench/submit-keyed", headers={"Idempotency-Key": f"k-{next(keys)}"}, timeout=30
        )
        assert response.status_code == 202, response.text[:300]

    return {
        "REST POST /api/v1/executions (bearer)": post(
            "/api/v1/executions", 201, auth, {"function": FFQN, "arguments": []}
        ),
        "webhook submit, bearer": post("/hooks/bench/submit-bearer", 202, auth),
        "webhook submit, open": post("/hooks/bench/submit-open", 202),
        "webhook submit, open + Idempotency-Key": keyed,
    }


def main() -> None:
    import argparse
    import os
    import secrets

    from bench.api_http import bench_token, timed
    from bench.run import note
    from bench.support import own_database, running, warm_up

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=300, help="requests per measure")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (each measure once a round)")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))

    with own_database(DATABASE) as url, running(url, 1) as clusters:
        warm_up(clusters)
        token = bench_token()
        server = start_server(url)
        try:
            measures = calls(server, token)
            for call in measures.values():
                timed(call, 20)  # warm-up: connections, caches, prepared statements
            note(f"measuring, {args.count} requests each, {args.rounds} interleaved round(s)")
            results: dict[str, list[dict]] = {name: [] for name in measures}
            for _ in range(args.rounds):
                for name, call in measures.items():
                    results[name].append(timed(call, args.count))
        finally:
            server.stop()

    print(
        f"\nWebhook submit-and-return vs the REST API's submit ({args.count} x {args.rounds}, one client, same server)"
    )
    print(f"{'how':<42}{'requests/s':>12}{'p50 ms':>9}{'p99 ms':>9}")
    for name, runs in results.items():
        best = max(runs, key=lambda r: r["rate"])
        print(f"{name:<42}{best['rate']:>12,.0f}{best['p50']:>9.2f}{best['p99']:>9.2f}")
    print("(best round of each; the REST submit is audited, a webhook's call is recorded in t_webhook_call)")


if __name__ == "__main__":
    main()
