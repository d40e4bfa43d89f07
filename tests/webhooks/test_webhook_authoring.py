"""``@webhook`` refuses, when the module is imported, what it cannot serve safely: an endpoint
without ``auth`` (open only when stated, D118), the same method and path twice, a method or
path it cannot route, a secret that is not a name. No database: the authoring API imports
no Django."""

from __future__ import annotations

from datetime import timedelta

import pytest

from workers import webhooks
from workers.registry import RegistrationError
from workers.webhooks import OPEN, BearerToken, GitHubSignature, StripeSignature, webhook


@pytest.fixture(autouse=True)
def own_registry(monkeypatch):
    """Each test declares into an empty registry, so the test components stay as they are."""
    monkeypatch.setattr(webhooks, "_ENDPOINTS", {})


def handler(request):
    return {}


def test_an_endpoint_without_auth_is_refused_and_says_how_to_mean_open():
    with pytest.raises(RegistrationError, match="auth=OPEN"):
        webhook("POST", "/x")(handler)
    assert webhooks.endpoints() == []


def test_an_explicitly_open_endpoint_is_registered_under_its_method_and_path():
    webhook("post", "/x/", auth=OPEN)(handler)
    endpoint = webhooks.find("POST", "/x")
    assert endpoint is not None and endpoint.key == "POST /x" and endpoint.auth is OPEN
    assert webhooks.methods_of("/x") == ["POST"]
    assert webhooks.find("GET", "/x") is None


def test_the_same_method_and_path_twice_is_a_registration_error():
    webhook("POST", "/x", auth=OPEN)(handler)

    def other(request):
        return {}

    with pytest.raises(RegistrationError, match="already declared"):
        webhook("POST", "/x", auth=BearerToken())(other)
    webhook("GET", "/x", auth=OPEN)(other)  # another method at the same path is another endpoint
    assert webhooks.methods_of("/x") == ["GET", "POST"]


@pytest.mark.parametrize(
    "method, path, options, message",
    [
        ("FETCH", "/x", {"auth": OPEN}, "method must be one of"),
        ("POST", "x", {"auth": OPEN}, "path must start with"),
        ("POST", "/a b", {"auth": OPEN}, "path must start with"),
        ("POST", "/a//b", {"auth": OPEN}, "path must start with"),
        ("POST", "/x", {"auth": BearerToken}, "an instance, not the class"),
        ("POST", "/x", {"auth": "open"}, "unknown auth"),
        ("POST", "/x", {"auth": GitHubSignature(secret="")}, "secret names a setting"),
        ("POST", "/x", {"auth": StripeSignature(secret="S", tolerance=timedelta(0))}, "tolerance"),
        ("POST", "/x", {"auth": OPEN, "idempotency_header": "Bad Header"}, "idempotency_header"),
    ],
)
def test_a_declaration_it_cannot_serve_is_a_registration_error(method, path, options, message):
    with pytest.raises(RegistrationError, match=message):
        webhook(method, path, **options)(handler)
    assert webhooks.endpoints() == []
