"""Checking a webhook call against its endpoint's ``auth`` (``workers.webhooks``), before
anything is stored: a refused call leaves no row anywhere (D118).

- ``GitHubSignature``: ``sha256=<hex>`` = HMAC-SHA256(secret, raw body), compared in
  constant time;
- ``StripeSignature``: ``t=<unix>,v1=<hex>[,v1=…]``, a ``v1`` = HMAC-SHA256(secret,
  ``f"{t}.{body}"``), and ``t`` within ``tolerance`` of now (Stripe's replay window);
- ``BearerToken``: a REST API token (``obelisk_api.tokens``) whose user may act on executions;
- ``OPEN``: nothing to check.

A secret is found by name: ``settings.OBELISK["WEBHOOK_SECRETS"][name]``, else the
environment variable ``name``. A missing secret refuses every call (503
``webhook_secret_missing``, logged once per name): an endpoint never accepts unsigned calls
because its secret was forgotten. why: D118.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time

from django.conf import settings

from obelisk_api import tokens
from obelisk_api.auth import ACT_PERMISSION
from workers.webhooks import BearerToken, GitHubSignature, Open, StripeSignature

logger = logging.getLogger("obelisk.webhooks")
_reported_missing: set[str] = set()


class Refused(Exception):
    """The call is refused with this status and JSON error code."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def check(auth, headers, body: bytes, *, now: float | None = None) -> None:
    """Raise ``Refused`` unless the call satisfies ``auth``."""
    if isinstance(auth, Open):
        return
    if isinstance(auth, GitHubSignature):
        _check_github(auth, headers, body)
    elif isinstance(auth, StripeSignature):
        _check_stripe(auth, headers, body, time.time() if now is None else now)
    elif isinstance(auth, BearerToken):
        _check_bearer(headers)
    else:  # workers.webhooks refuses any other at registration
        raise Refused(401, "unauthorized", "this endpoint's authentication is unknown")


def secret_of(name: str) -> bytes:
    """The secret named ``name``, from settings or the environment; ``Refused`` (503) if neither has it."""
    configured = getattr(settings, "OBELISK", {}).get("WEBHOOK_SECRETS") or {}
    value = configured.get(name) or os.environ.get(name) or ""
    if not value:
        if name not in _reported_missing:
            _reported_missing.add(name)
            logger.error(
                "webhook secret %s is not set (OBELISK['WEBHOOK_SECRETS'] or the environment): its calls are refused",
                name,
            )
        raise Refused(503, "webhook_secret_missing", f"the secret `{name}` of this endpoint is not configured")
    return value.encode("utf-8") if isinstance(value, str) else bytes(value)


def _hex_hmac(secret: bytes, message: bytes) -> str:
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _check_github(auth: GitHubSignature, headers, body: bytes) -> None:
    secret = secret_of(auth.secret)
    given = headers.get(auth.header) or ""
    if not given:
        raise Refused(401, "bad_signature", f"the `{auth.header}` header is missing")
    expected = "sha256=" + _hex_hmac(secret, body)
    if not hmac.compare_digest(given.strip().encode("utf-8", "replace"), expected.encode()):
        raise Refused(401, "bad_signature", f"the `{auth.header}` signature does not match the body")


def _check_stripe(auth: StripeSignature, headers, body: bytes, now: float) -> None:
    secret = secret_of(auth.secret)
    given = headers.get(auth.header) or ""
    if not given:
        raise Refused(401, "bad_signature", f"the `{auth.header}` header is missing")
    timestamp, signatures = _parse_stripe(given)
    if timestamp is None or not signatures:
        raise Refused(401, "bad_signature", f"the `{auth.header}` header must be `t=<unix seconds>,v1=<hex>`")
    if abs(now - timestamp) > auth.tolerance.total_seconds():
        raise Refused(401, "bad_signature", "the signature's timestamp is outside the tolerance (a replayed call?)")
    expected = _hex_hmac(secret, str(timestamp).encode() + b"." + body).encode()
    if not any(hmac.compare_digest(s.encode("utf-8", "replace"), expected) for s in signatures):
        raise Refused(401, "bad_signature", f"no `{auth.header}` signature matches the body")


def _parse_stripe(header: str) -> tuple[int | None, list[str]]:
    timestamp, signatures = None, []
    for part in header.split(","):
        key, _, value = part.strip().partition("=")
        if key == "t" and value.isascii() and value.isdigit() and len(value) <= 12:
            timestamp = int(value)
        elif key == "v1" and value:
            signatures.append(value)
    return timestamp, signatures


def _check_bearer(headers) -> None:
    scheme, _, token = (headers.get("Authorization") or "").partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise Refused(401, "unauthorized", "authentication required: `Authorization: Bearer <token>`")
    user = tokens.user_of(token)
    if user is None:
        raise Refused(401, "unauthorized", "the bearer token is unknown or revoked")
    if not user.has_perm(ACT_PERMISSION):
        raise Refused(403, "forbidden", f"user `{user.get_username()}` lacks the permission `{ACT_PERMISSION}`")
