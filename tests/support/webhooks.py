"""Shared code of the webhook tests (``tests/webhooks/``): signing as GitHub and Stripe do,
the secrets' environment, what is stored, and requests to the real server.

The web process serves ``tests.support.webhook_components`` (``MODULES``); the secrets are
environment variables, set in the test process (``monkeypatch``) and given to the server.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import time

from executions.models import ExecutionState, WebhookCall, WebhookKey
from tests.support import webhook_components as components
from tests.support.server import Gunicorn, Reply

MODULES = "tests.support.components,tests.support.webhook_components"
SECRETS = {components.GITHUB_SECRET: "gh-test-secret", components.STRIPE_SECRET: "whsec_test"}
SERVER_ENV = {"OBELISK_COMPONENT_MODULES": MODULES, **SECRETS}
PREFIX = "/hooks"


def github_headers(body: bytes, delivery: str, *, secret: str | None = None) -> dict[str, str]:
    secret = SECRETS[components.GITHUB_SECRET] if secret is None else secret
    signature = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return {
        "X-Hub-Signature-256": f"sha256={signature}",
        "X-GitHub-Delivery": delivery,
        "Content-Type": "application/json",
    }


def stripe_headers(body: bytes, key: str, *, at: float | None = None, secret: str | None = None) -> dict[str, str]:
    secret = SECRETS[components.STRIPE_SECRET] if secret is None else secret
    timestamp = int(time.time() if at is None else at)
    signature = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return {"Stripe-Signature": f"t={timestamp},v1={signature}", "Idempotency-Key": key}


def as_meta(headers: dict[str, str]) -> dict[str, str]:
    """Headers as Django's test client takes them (``headers=`` does it too, but only for
    names it can turn into ``HTTP_*``)."""
    return {f"HTTP_{name.upper().replace('-', '_')}": value for name, value in headers.items()}


def stored() -> dict[str, int]:
    """How many executions, webhook calls and idempotency keys exist."""
    return {
        "executions": ExecutionState.objects.count(),
        "calls": WebhookCall.objects.count(),
        "keys": WebhookKey.objects.count(),
    }


def post(server: Gunicorn, path: str, body: bytes, headers: dict[str, str], *, method: str = "POST") -> Reply:
    """One request to the real server on a connection of its own."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    try:
        connection.request(method, PREFIX + path, body=body, headers=headers)
        response = connection.getresponse()
        return Reply(response.status, {k.lower(): v for k, v in response.getheaders()}, response.read())
    finally:
        connection.close()


def payload(order_id: str, quantity: int = 2) -> bytes:
    return json.dumps({"id": order_id, "quantity": quantity}).encode()
