"""The webhook route under generated input (issue 39: "schemathesis or hypothesis over the
webhook route: no 5xx"): whatever method, path, headers and body a caller sends, the answer
is never a 5xx, every error is JSON ``{"code", "message"}``, and a refused call stores
nothing.

Two endpoints of ``tests/support/webhook_components.py`` answer 5xx by design and are left
out: ``/boom`` (a handler that raises: 500 ``webhook_failed``) and ``/unset-secret`` (a
secret nobody configured: 503). Examples are derandomized, so a run is the same in CI.
"""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from executions.models import WebhookCall
from tests.support import helpers
from tests.support.fuzz import error_body, hostile_text, json_values
from tests.support.webhooks import SECRETS, as_meta, github_headers, stored
from workers import webhooks

pytestmark = pytest.mark.django_db

FUZZ = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
EXCLUDED = {"/boom", "/unset-secret"}
PATHS = sorted({e.path for e in webhooks.endpoints() if e.path not in EXCLUDED} | {"/", "/nowhere", "/open/x"})
METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"]
HEADER_NAMES = [
    "Authorization",
    "X-Hub-Signature-256",
    "X-GitHub-Delivery",
    "Stripe-Signature",
    "Idempotency-Key",
    "Content-Type",
    "X-Echo",
]

bodies = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda value: json.dumps(value).encode()),
    st.sampled_from([b"", b"[1, 2]", b'{"a": 1, "b": 2}', b'["\\u0000", 1]', b"[" * 10_000, b"\xff"]),
)
header_values = st.one_of(
    hostile_text.map(lambda text: text.replace("\n", "").replace("\r", "")),
    st.sampled_from(["Bearer ", "Bearer x", "sha256=", "t=1,v1=00", "t=99999999999999,v1=a"]),
)
headers = st.dictionaries(st.sampled_from(HEADER_NAMES), header_values, max_size=4)
# A wait-for-result endpoint waits as long as ``timeout`` says: short ones only, and bad ones.
queries = st.fixed_dictionaries(
    {},
    optional={
        "timeout": st.sampled_from(["0", "0.05", "-1", "nan", "inf", "abc", ""]),
        "id": st.text(max_size=30),
        "a": st.text(max_size=10),
    },
)


@pytest.fixture(autouse=True)
def deployed(monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    return helpers.deploy_components(("tests.support.components", "tests.support.webhook_components"))


def check_answer(response, before, calls_before, *, head: bool = False) -> None:
    assert response.status_code < 500, (response.status_code, response.content[:300])
    if response.status_code >= 400 and not head:  # HEAD: the headers of a GET, no body
        error_body(response.content)
        if response.status_code in (401, 403, 404, 405, 413):  # refused before the handler
            assert stored()["executions"] == before["executions"]
            assert WebhookCall.objects.count() == calls_before


@FUZZ
@given(method=st.sampled_from(METHODS), path=st.sampled_from(PATHS), body=bodies, headers=headers, query=queries)
@example(method="POST", path="/open", body=b"[1, 2]", headers={}, query={})
@example(method="POST", path="/orders", body=b'{"id": "x"}', headers={"Idempotency-Key": "k"}, query={"timeout": "nan"})
@example(method="POST", path="/bearer", body=b"[1, 2]", headers={"Authorization": "Bearer \x00"}, query={})
def test_whatever_a_caller_sends_the_answer_is_never_a_5xx_and_errors_are_json(
    client, method, path, body, headers, query
):
    before, calls_before = stored(), WebhookCall.objects.count()
    response = client.generic(
        method,
        "/hooks" + path + ("?" + urlencode(query) if query else ""),
        body,
        content_type=headers.pop("Content-Type", "application/json"),
        **as_meta(headers),
    )
    check_answer(response, before, calls_before, head=method == "HEAD")


@FUZZ
@given(body=bodies, delivery=st.text(min_size=1, max_size=20))
@example(body=b'{"id": "a", "quantity": 2}', delivery="d")
@example(body=b'{"id": "a", "quantity": "many"}', delivery="d")
def test_a_correctly_signed_delivery_of_any_body_is_never_a_5xx(client, body, delivery):
    before, calls_before = stored(), WebhookCall.objects.count()
    response = client.post(
        "/hooks/github", body, content_type="application/json", **as_meta(github_headers(body, delivery))
    )
    check_answer(response, before, calls_before)
    assert response.status_code in (202, 400, 413), (response.status_code, response.content[:300])
