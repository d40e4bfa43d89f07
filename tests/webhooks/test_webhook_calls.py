"""Webhook endpoints through Django's test client (issue 39, "Webhook endpoints"; D117-D119):
authentication per endpoint with nothing stored for a refused call, idempotent deliveries,
submit / wait / answer, every accepted call recorded, every refusal a 4xx JSON error.

The endpoints are those of ``tests/support/webhook_components.py``; the real server and a
real worker are in ``test_webhook_server.py``.
"""

from __future__ import annotations

import time

import pytest

from executions import store
from executions.events import Ok
from executions.models import ExecutionState, WebhookCall, WebhookKey
from obelisk_api import tokens
from tests.support import helpers
from tests.support import webhook_components as components
from tests.support.api import ACT, VIEW, assert_error, finish, make_user
from tests.support.webhooks import SECRETS, as_meta, github_headers, payload, stored, stripe_headers

pytestmark = pytest.mark.django_db

ORDER = "test:hooks/wf.order"


@pytest.fixture(autouse=True)
def deployed(monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    return helpers.deploy_components(("tests.support.components", "tests.support.webhook_components"))


def send(client, path: str, body: bytes = b"", headers: dict | None = None, *, method: str = "post", **extra):
    return getattr(client, method)(
        "/hooks" + path, body, content_type="application/json", **as_meta(headers or {}), **extra
    )


def orders() -> list[ExecutionState]:
    return list(ExecutionState.objects.filter(ffqn=ORDER))


# ---------------------------------------------------------------------------------------
# Authentication: GitHub, Stripe, bearer, open; a refused call stores nothing (D118)
# ---------------------------------------------------------------------------------------


def test_a_signed_github_delivery_starts_one_workflow_and_the_same_delivery_again_the_same_one(client):
    body = payload("o-1", 3)
    first = send(client, "/github", body, github_headers(body, "delivery-1"))
    again = send(client, "/github", body, github_headers(body, "delivery-1"))
    assert first.status_code == again.status_code == 202, first.content
    execution_id = first.json()["execution_id"]
    assert again.json() == {"execution_id": execution_id}
    assert [row.execution_id for row in orders()] == [execution_id]
    assert store.get_detail(execution_id).params == ["o-1", 3]
    calls = store.webhook_calls_of(execution_id)
    assert [(c.endpoint, c.status, c.idempotency_key) for c in calls] == [("POST /github", 202, "delivery-1")] * 2
    other = send(client, "/github", body, github_headers(body, "delivery-2"))
    assert other.status_code == 202 and other.json()["execution_id"] != execution_id
    assert len(orders()) == 2


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param(lambda body: github_headers(body, "d", secret="wrong"), id="wrong-secret"),
        pytest.param(lambda body: github_headers(body + b" ", "d"), id="other-body"),
        pytest.param(lambda body: {"X-GitHub-Delivery": "d"}, id="unsigned"),
        pytest.param(lambda body: {**github_headers(body, "d"), "X-Hub-Signature-256": "sha1=abc"}, id="other-scheme"),
        pytest.param(
            lambda body: {**github_headers(body, "d"), "X-Hub-Signature-256": "sha256=\u00e9"}, id="non-ascii"
        ),
    ],
)
def test_a_bad_github_signature_is_refused_with_401_json_and_nothing_is_stored(client, headers):
    body = payload("o-1")
    before = stored()
    response = send(client, "/github", body, headers(body))
    assert_error(response, 401, "bad_signature")
    assert "X-Obelisk-Request-Id" not in response
    assert stored() == before


def test_stripe_signature_is_checked_with_its_replay_window(client):
    body = payload("o-s")
    accepted = send(client, "/stripe", body, stripe_headers(body, "evt-1"))
    assert accepted.status_code == 202, accepted.content
    before = stored()
    for refused in (
        stripe_headers(body, "evt-2", at=time.time() - 6 * 60),  # expired: outside five minutes
        stripe_headers(body, "evt-2", at=time.time() + 6 * 60),
        stripe_headers(body, "evt-2", secret="whsec_other"),
        {"Stripe-Signature": "v1=abc", "Idempotency-Key": "evt-2"},
        {"Stripe-Signature": "t=notanumber,v1=abc", "Idempotency-Key": "evt-2"},
    ):
        assert_error(send(client, "/stripe", body, refused), 401, "bad_signature")
    assert stored() == before
    # Stripe may send several v1 signatures (a secret being rolled): one matching is enough.
    signed = stripe_headers(body, "evt-3")
    signed["Stripe-Signature"] = signed["Stripe-Signature"].replace("v1=", "v1=00,v1=")
    assert send(client, "/stripe", body, signed).status_code == 202


def test_a_bearer_endpoint_needs_an_api_token_whose_user_may_act(client):
    make_user("viewer", VIEW)
    make_user("actor", VIEW, ACT)
    viewer, actor = tokens.issue("viewer").token, tokens.issue("actor").token
    body = b"[1, 2]"
    before = stored()
    assert_error(send(client, "/bearer", body), 401, "unauthorized")
    assert_error(send(client, "/bearer", body, {"Authorization": "Bearer nonsense"}), 401, "unauthorized")
    assert_error(send(client, "/bearer", body, {"Authorization": f"Basic {actor}"}), 401, "unauthorized")
    assert_error(send(client, "/bearer", body, {"Authorization": f"Bearer {viewer}"}), 403, "forbidden")
    assert stored() == before
    response = send(client, "/bearer", body, {"Authorization": f"Bearer {actor}"})
    assert response.status_code == 202, response.content
    assert store.get_detail(response.json()["execution_id"]).params == [1, 2]


def test_an_open_endpoint_serves_anyone_with_its_query_and_headers(client):
    response = client.get("/hooks/echo?a=1&b=two", HTTP_X_ECHO="hi")
    assert response.status_code == 200
    assert response.json() == {"query": {"a": "1", "b": "two"}, "header": "hi"}
    call = store.list_webhook_calls(endpoint="GET /echo")[0]
    assert (call.status, call.path, call.execution_id) == (200, "/echo", "")
    assert response["X-Obelisk-Request-Id"] == call.call_id


def test_a_missing_secret_refuses_every_call_with_503_and_stores_nothing(client):
    before = stored()
    body = b"{}"
    assert_error(send(client, "/unset-secret", body, github_headers(body, "d")), 503, "webhook_secret_missing")
    assert stored() == before


def test_a_secret_in_settings_is_used_before_the_environment(client, monkeypatch, settings):
    monkeypatch.setenv(components.UNSET_SECRET, "from-env")
    settings.OBELISK = {**settings.OBELISK, "WEBHOOK_SECRETS": {components.UNSET_SECRET: "from-settings"}}
    body = b"{}"
    assert_error(
        send(client, "/unset-secret", body, github_headers(body, "d", secret="from-env")), 401, "bad_signature"
    )
    response = send(client, "/unset-secret", body, github_headers(body, "d", secret="from-settings"))
    assert response.status_code == 200 and response.json() == {"reached": True}


# ---------------------------------------------------------------------------------------
# Routing and bad input: every refusal a 4xx JSON error
# ---------------------------------------------------------------------------------------


def test_an_unknown_path_is_404_json_and_a_known_path_with_another_method_405(client):
    assert_error(client.post("/hooks/nowhere", b"{}", content_type="application/json"), 404, "webhook_not_found")
    assert_error(client.get("/hooks/"), 404, "webhook_not_found")
    refused = assert_error(client.get("/hooks/open"), 405, "method_not_allowed")
    assert refused["message"].endswith("use POST")
    assert client.get("/hooks/open")["Allow"] == "POST"
    assert WebhookCall.objects.count() == 0


@pytest.mark.parametrize(
    "body, status, code",
    [
        pytest.param(b"{not json", 400, "malformed_json", id="malformed"),
        pytest.param(b"\xff\xfe", 400, "malformed_json", id="not-utf-8"),
        pytest.param(b'["a\\u0000b", 1]', 400, "unsupported_value", id="nul-escape"),
        pytest.param(b'["\\ud800", 1]', 400, "unsupported_value", id="lone-surrogate"),
        pytest.param(b"[NaN, 1]", 400, "malformed_json", id="nan"),
        pytest.param(b"[" * 100_000 + b"]" * 100_000, 400, "unsupported_value", id="deep"),
        pytest.param(b"[" * 80 + b"]" * 80, 400, "unsupported_value", id="deeper-than-the-store-takes"),
        pytest.param(b"1" * 5000, 400, "malformed_json", id="huge-integer"),
    ],
)
def test_a_bad_body_is_a_4xx_json_error_and_starts_nothing(client, body, status, code):
    before = ExecutionState.objects.count()
    response = send(client, "/open", body)
    assert_error(response, status, code)
    assert ExecutionState.objects.count() == before
    assert WebhookCall.objects.get(call_id=response["X-Obelisk-Request-Id"]).status == status


def test_a_body_over_the_payload_limit_is_413_before_it_is_read(client, settings):
    settings.OBELISK = {**settings.OBELISK, "MAX_PAYLOAD_BYTES": 1000}
    before = stored()
    assert_error(send(client, "/open", b"[" + b"1," * 600 + b"1]"), 413, "payload_too_large")
    body = b"x" * 1001
    assert_error(send(client, "/github", body, github_headers(body, "big")), 413, "payload_too_large")
    assert stored() == before


def test_arguments_that_do_not_fit_the_function_are_400_invalid_arguments(client):
    for body in (b'["one", 2]', b"[1]", b'{"a": 1, "c": 2}', b'"text"'):
        assert_error(send(client, "/open", body), 400, "invalid_arguments")
    assert ExecutionState.objects.count() == 0


def test_the_idempotency_header_is_required_where_the_endpoint_names_one(client):
    body = payload("o-k")
    headers = github_headers(body, "x")
    del headers["X-GitHub-Delivery"]
    assert_error(send(client, "/github", body, headers), 400, "idempotency_key_missing")
    assert_error(send(client, "/orders", body, {"Idempotency-Key": "\x01"}), 400, "bad_idempotency_key")
    assert orders() == [] and WebhookKey.objects.count() == 0


def test_a_handler_that_raises_is_500_webhook_failed_without_its_detail_and_is_recorded(client, caplog):
    response = send(client, "/boom", b"{}")
    body = assert_error(response, 500, "webhook_failed")
    assert "secret detail" not in response.content.decode() and "Traceback" not in body["message"]
    call = WebhookCall.objects.get(call_id=response["X-Obelisk-Request-Id"])
    assert call.status == 500 and "RuntimeError" in call.error
    assert "secret detail" in caplog.text  # the log has it


def test_a_handler_may_answer_with_its_own_status_body_and_headers(client):
    response = client.put("/hooks/custom", b"")
    assert response.status_code == 201 and response.content == b"made" and response["X-Custom"] == "yes"


# ---------------------------------------------------------------------------------------
# Submit, wait, answer; the record of every accepted call
# ---------------------------------------------------------------------------------------


def test_every_accepted_call_is_recorded_with_its_request_id_status_execution_and_key(client):
    body = payload("o-r")
    response = send(client, "/github", body, github_headers(body, "delivery-r"))
    execution_id = response.json()["execution_id"]
    assert response["X-Obelisk-Execution-Id"] == execution_id
    (call,) = store.list_webhook_calls()
    assert call.call_id == response["X-Obelisk-Request-Id"] and call.call_id.startswith("Whc_")
    assert (call.endpoint, call.method, call.path, call.status) == ("POST /github", "POST", "/github", 202)
    assert (call.execution_id, call.idempotency_key, call.error) == (execution_id, "delivery-r", "")
    assert call.duration_ms >= 0


def test_when_the_wait_runs_out_the_call_is_202_and_a_retry_after_it_finished_gets_the_result(client):
    body = payload("o-w", 2)
    waited = send(client, "/orders?timeout=0.2", body, {"Idempotency-Key": "order-w"})
    assert waited.status_code == 202, waited.content
    execution_id = waited.json()["execution_id"]
    answer = client.get("/hooks/orders/answer", {"id": execution_id})
    assert answer.status_code == 202 and answer.json() == {"execution_id": execution_id}
    finish(execution_id, Ok({"order": "o-w", "total": 14}))
    answer = client.get("/hooks/orders/answer", {"id": execution_id})
    assert answer.status_code == 200 and answer.json() == {"ok": {"order": "o-w", "total": 14}}
    retried = send(client, "/orders?timeout=0.2", body, {"Idempotency-Key": "order-w"})
    assert retried.status_code == 200 and retried.json() == {"ok": {"order": "o-w", "total": 14}}
    assert len(orders()) == 1


def test_answer_for_an_id_that_is_not_one_is_a_4xx_json_error(client):
    assert_error(client.get("/hooks/orders/answer", {"id": "nonsense"}), 400, "invalid_id")
    assert_error(client.get("/hooks/orders/answer", {"id": "E_01JAAAAAAAAAAAAAAAAAAAAAAA"}), 404, "not_found")


def test_the_same_key_at_another_endpoint_is_another_execution(client):
    body = payload("o-x")
    github = send(client, "/github", body, github_headers(body, "shared-key"))
    stripe = send(client, "/stripe", body, stripe_headers(body, "shared-key"))
    assert github.json()["execution_id"] != stripe.json()["execution_id"]
    assert WebhookKey.objects.count() == 2


def test_the_calls_are_listed_newest_first(client):
    for n in range(3):
        client.get(f"/hooks/echo?n={n}")
    calls = store.list_webhook_calls()
    assert [c.received_at for c in calls] == sorted((c.received_at for c in calls), reverse=True)
    assert len(store.list_webhook_calls(limit=2)) == 2
    assert len(store.list_webhook_calls(endpoint="GET /echo")) == 3
    assert store.list_webhook_calls(endpoint="POST /github") == []


def test_component_modules_that_cannot_be_loaded_are_a_503_json_error_not_a_traceback(client, settings):
    settings.OBELISK = {**settings.OBELISK, "COMPONENT_MODULES": ["tests.support.no_such_module"]}
    assert_error(client.get("/hooks/echo"), 503, "webhooks_unavailable")
    assert WebhookCall.objects.count() == 0
