"""Webhook endpoints behind a real WSGI server (gunicorn, ``tests/support/server.py``) and,
where a workflow must actually run, a real worker cluster (issue 39, "What it must show").

- a signed GitHub-style delivery starts one workflow, and the same delivery sent twice
  starts it once; a bad signature is a 401 JSON error and stores nothing;
- the same delivery sent by many clients at once, before any of them was stored, starts
  one execution (``t_webhook_key``'s unique key, D117);
- a wait-for-result endpoint answers the workflow's result, computed by a worker; without a
  worker its wait runs out and it answers 202 with the id.
"""

from __future__ import annotations

import threading

import pytest

from executions.models import ExecutionState, WebhookCall
from tests.support import helpers
from tests.support.clusters import started_clusters
from tests.support.server import Gunicorn
from tests.support.webhooks import MODULES, SERVER_ENV, github_headers, payload, post, stored

pytestmark = pytest.mark.django_db(transaction=True)

ORDER = "test:hooks/wf.order"
SERVER_ARGS = "obelisk_site.wsgi:application --bind 127.0.0.1:{port} --worker-class gthread --workers 2 --threads 8"
CONCURRENT_CLIENTS = 12


@pytest.fixture(autouse=True)
def deployed():
    return helpers.deploy_components(("tests.support.components", "tests.support.webhook_components"))


@pytest.fixture
def server(tmp_path):
    with Gunicorn(SERVER_ARGS, tmp_path / "gunicorn.log", env=SERVER_ENV) as gunicorn:
        yield gunicorn


def order_ids() -> list[str]:
    return list(ExecutionState.objects.filter(ffqn=ORDER).values_list("execution_id", flat=True))


def test_through_the_server_a_delivery_sent_twice_starts_one_workflow_and_a_bad_signature_stores_nothing(server):
    body = payload("srv-1")
    first = post(server, "/github", body, github_headers(body, "srv-delivery"))
    again = post(server, "/github", body, github_headers(body, "srv-delivery"))
    assert first.status == again.status == 202, (first.body, server.log()[-2000:])
    assert first.is_json and first.json() == again.json()
    assert order_ids() == [first.json()["execution_id"]]
    assert first.headers["x-obelisk-request-id"] != again.headers["x-obelisk-request-id"]
    before = stored()
    refused = post(server, "/github", body, github_headers(body, "srv-other", secret="wrong"))
    assert refused.status == 401 and refused.is_json and refused.json()["code"] == "bad_signature"
    unknown = post(server, "/nowhere", body, {})
    assert unknown.status == 404 and unknown.is_json and unknown.json()["code"] == "webhook_not_found"
    assert stored() == before


def test_concurrent_first_deliveries_of_one_key_through_the_server_start_one_execution(server):
    body = payload("srv-race")
    headers = github_headers(body, "srv-race-delivery")
    barrier = threading.Barrier(CONCURRENT_CLIENTS)
    replies = [None] * CONCURRENT_CLIENTS

    def deliver(index: int) -> None:
        barrier.wait()
        replies[index] = post(server, "/github", body, headers)

    threads = [threading.Thread(target=deliver, args=(i,)) for i in range(CONCURRENT_CLIENTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(r is not None and r.status == 202 for r in replies), (
        [(r.status, r.body[:200]) for r in replies if r is not None],
        server.log()[-3000:],
    )
    assert len({r.json()["execution_id"] for r in replies}) == 1
    assert len(order_ids()) == 1
    assert WebhookCall.objects.filter(idempotency_key="srv-race-delivery").count() == CONCURRENT_CLIENTS


def test_a_wait_for_result_endpoint_answers_the_workflows_result_from_a_real_worker(request, tmp_path, server):
    body = payload("srv-wait", 6)
    waited_out = post(server, "/orders?timeout=0.3", body, {"Idempotency-Key": "srv-wait"})
    assert waited_out.status == 202 and waited_out.is_json, waited_out.body
    execution_id = waited_out.json()["execution_id"]
    with started_clusters(request, tmp_path, default_env={"OBELISK_COMPONENT_MODULES": MODULES}) as start:
        start(1)
        answered = post(server, "/orders?timeout=30", body, {"Idempotency-Key": "srv-wait"})
        fresh = post(server, "/orders?timeout=30", payload("srv-fresh", 1), {"Idempotency-Key": "srv-fresh"})
    assert answered.status == 200, (answered.body, server.log()[-2000:])
    assert answered.json() == {"ok": {"order": "srv-wait", "total": 42}}
    assert answered.headers["x-obelisk-execution-id"] == execution_id
    assert fresh.status == 200 and fresh.json() == {"ok": {"order": "srv-fresh", "total": 7}}
    assert len(order_ids()) == 2
