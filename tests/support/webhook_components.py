"""Webhook endpoints, and the workflow they start, of the webhook tests (``tests/webhooks/``).

The web process serves them when this module is among ``OBELISK_COMPONENT_MODULES``
(the real server of ``tests/support/server.py`` gets
``tests.support.components,tests.support.webhook_components``); a worker cluster serving it
runs ``test:hooks/wf.order``. The test process imports it, which registers the endpoints for
Django's test client too.

Secrets are read by name from the environment (``tests.support.webhooks.SECRETS``).
"""

from __future__ import annotations

from datetime import timedelta

from workers import activity, workflow
from workers.webhooks import OPEN, BearerToken, GitHubSignature, StripeSignature, WebhookResponse, webhook

ADD = "test:acts/basic.add"
GITHUB_SECRET = "OBELISK_TEST_GITHUB_SECRET"
STRIPE_SECRET = "OBELISK_TEST_STRIPE_SECRET"
UNSET_SECRET = "OBELISK_TEST_WEBHOOK_SECRET_NEVER_SET"


@activity(name="test:hooks/acts.price", backoff=timedelta(milliseconds=100))
def price(quantity: int) -> int:
    return quantity * 7


@workflow(name="test:hooks/wf.order")
def order(ctx, order_id: str, quantity: int) -> dict:
    """One activity call: the workflow a delivery starts."""
    return {"order": order_id, "total": ctx.call(price, quantity)}


def order_arguments(payload) -> list:
    """The workflow's arguments from a delivery's body (a dict with ``id`` and ``quantity``)."""
    if not isinstance(payload, dict):
        return [payload]  # the call is refused as invalid_arguments
    return [payload.get("id"), payload.get("quantity", 1)]


@webhook("POST", "/github", auth=GitHubSignature(secret=GITHUB_SECRET), idempotency_header="X-GitHub-Delivery")
def github_push(request):
    return request.submit(order, order_arguments(request.json()))


@webhook("POST", "/stripe", auth=StripeSignature(secret=STRIPE_SECRET), idempotency_header="Idempotency-Key")
def stripe_event(request):
    return request.submit(order, order_arguments(request.json()))


@webhook("POST", "/bearer", auth=BearerToken())
def bearer(request):
    return request.submit(ADD, request.json())


@webhook("POST", "/open", auth=OPEN)
def open_submit(request):
    """Any body: its JSON as ``add``'s arguments (the fuzz target: never a 5xx)."""
    return request.submit(ADD, request.json())


@webhook("POST", "/orders", auth=OPEN, idempotency_header="Idempotency-Key")
def place_order(request):
    """Submit and wait: ``?timeout=<seconds>`` (default 20)."""
    try:
        timeout = float(request.query.get("timeout", "20"))
    except ValueError:
        timeout = -1.0
    if not 0 <= timeout <= 60:
        return WebhookResponse(400, {"code": "bad_timeout", "message": "timeout must be 0 to 60 seconds"})
    return request.call(order, order_arguments(request.json()), timeout=timeout)


@webhook("GET", "/orders/answer", auth=OPEN)
def answer(request):
    return request.answer(request.query.get("id", ""))


@webhook("GET", "/echo", auth=OPEN)
def echo(request):
    return {"query": request.query, "header": request.headers.get("x-echo", "")}


@webhook("PUT", "/custom", auth=OPEN)
def custom(request):
    return WebhookResponse(201, "made", {"X-Custom": "yes"})


@webhook("POST", "/boom", auth=OPEN)
def boom(request):
    raise RuntimeError("a secret detail that must not reach the caller")


@webhook("POST", "/unset-secret", auth=GitHubSignature(secret=UNSET_SECRET))
def unset_secret(request):
    return {"reached": True}
