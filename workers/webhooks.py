"""The authoring API of webhook endpoints: ``@webhook(method, path, auth=…)`` on a plain
function ``handler(request) -> response`` (no worker runtime, no Django).

::

    from workers.webhooks import GitHubSignature, webhook

    @webhook("POST", "/github", auth=GitHubSignature(secret="GITHUB_WEBHOOK_SECRET"),
             idempotency_header="X-GitHub-Delivery")
    def on_push(request):
        return request.submit(build, [request.json()["after"]])

The path is relative to the site's webhook prefix (``OBELISK["WEBHOOK_PREFIX"]``, default
``hooks/``): the endpoint above is served at ``/hooks/github``. The web process imports the
component modules and serves the endpoints they declare (``obelisk_api.webhooks``, D119).

``auth`` is required, one of:

- ``GitHubSignature(secret=NAME)``: ``X-Hub-Signature-256: sha256=<hex>``, HMAC-SHA256 of
  the raw body;
- ``StripeSignature(secret=NAME, tolerance=…)``: ``Stripe-Signature: t=<unix>,v1=<hex>``,
  HMAC-SHA256 of ``f"{t}.{body}"``, refused outside the replay window;
- ``BearerToken()``: a REST API token whose user may act on executions;
- ``OPEN``: anyone, stated explicitly.

A secret is named, never written in code: ``settings.OBELISK["WEBHOOK_SECRETS"][NAME]``, else
the environment variable ``NAME``. why: D118.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from workers.registry import RegistrationError

__all__ = [
    "OPEN",
    "BearerToken",
    "Endpoint",
    "GitHubSignature",
    "Open",
    "StripeSignature",
    "WebhookResponse",
    "endpoints",
    "find",
    "methods_of",
    "webhook",
]

METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})
_PATH_RE = re.compile(r"^/[A-Za-z0-9._~\-/]*$")
_HEADER_RE = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")  # an HTTP token (RFC 9110 §5.1)


@dataclass(frozen=True)
class GitHubSignature:
    """GitHub's ``X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body>``."""

    secret: str
    header: str = "X-Hub-Signature-256"


@dataclass(frozen=True)
class StripeSignature:
    """Stripe's ``Stripe-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "t.body">``; a
    timestamp further than ``tolerance`` from now is refused (a replayed delivery)."""

    secret: str
    tolerance: timedelta = timedelta(minutes=5)
    header: str = "Stripe-Signature"


@dataclass(frozen=True)
class BearerToken:
    """``Authorization: Bearer <token>``: a REST API token (``manage.py obelisk_token``) of a
    user with ``act_on_executions``."""


@dataclass(frozen=True)
class Open:
    """No authentication: anyone may call. Only as ``auth=OPEN``, never by omission."""


OPEN = Open()
AUTH_KINDS = (GitHubSignature, StripeSignature, BearerToken, Open)


@dataclass(frozen=True)
class Endpoint:
    """One declared endpoint; ``key`` (``"POST /github"``) names it in the records."""

    method: str
    path: str
    handler: Callable
    auth: object
    idempotency_header: str | None = None
    name: str = ""
    module: str = field(default="", compare=False)

    @property
    def key(self) -> str:
        return f"{self.method} {self.path}"


@dataclass(frozen=True)
class WebhookResponse:
    """What a handler may return for full control: ``body`` a dict or list (sent as JSON),
    text, bytes or None. A handler may also return a plain dict or list (200 JSON), or what
    ``request.submit`` / ``call`` / ``answer`` return (they are ``WebhookResponse`` objects)."""

    status: int = 200
    body: object = None
    headers: dict[str, str] = field(default_factory=dict)
    execution_id: str = ""  # the execution it answers for, recorded with the call


_ENDPOINTS: dict[tuple[str, str], Endpoint] = {}


def webhook(method: str, path: str, *, auth=None, idempotency_header: str | None = None, name: str | None = None):
    """Declare ``handler(request) -> response`` as the endpoint ``method path``. Every
    mistake is a ``RegistrationError`` when the module is imported."""
    method = _check_method(method)
    path = _check_path(path)
    _check_auth(auth, method, path)
    if idempotency_header is not None and (
        not isinstance(idempotency_header, str) or not _HEADER_RE.fullmatch(idempotency_header)
    ):
        raise RegistrationError(
            f"webhook {method} {path}: idempotency_header must be a header name such as "
            f'"Idempotency-Key", not {idempotency_header!r}'
        )
    if name is not None and not isinstance(name, str):
        raise RegistrationError(f"webhook {method} {path}: name must be a string, not {type(name).__name__}")

    def decorate(handler: Callable) -> Callable:
        if not callable(handler):
            raise RegistrationError(f"webhook {method} {path}: decorate a function `def handler(request)`")
        endpoint = Endpoint(
            method,
            path,
            handler,
            auth,
            idempotency_header,
            name or handler.__name__,
            module=getattr(handler, "__module__", ""),
        )
        _register(endpoint)
        handler.webhook = endpoint
        return handler

    return decorate


def _check_method(method) -> str:
    if not isinstance(method, str) or method.upper() not in METHODS:
        raise RegistrationError(f"webhook: method must be one of {', '.join(sorted(METHODS))}, not {method!r}")
    return method.upper()


def _check_path(path) -> str:
    if not isinstance(path, str) or not _PATH_RE.fullmatch(path) or "//" in path:
        raise RegistrationError(
            f'webhook: path must start with "/" and hold letters, digits and ._~-/ only, such as "/github", '
            f"not {path!r} (it is relative to OBELISK['WEBHOOK_PREFIX'])"
        )
    return path.rstrip("/") or "/"


def _check_auth(auth, method: str, path: str) -> None:
    if auth is None:
        raise RegistrationError(
            f"webhook {method} {path}: auth is required; pass auth=OPEN to mean open, or "
            "GitHubSignature(secret=...), StripeSignature(secret=...), BearerToken()"
        )
    if isinstance(auth, type) and auth in AUTH_KINDS:
        raise RegistrationError(f"webhook {method} {path}: write auth={auth.__name__}(...), an instance, not the class")
    if not isinstance(auth, AUTH_KINDS):
        raise RegistrationError(f"webhook {method} {path}: unknown auth {auth!r}")
    secret = getattr(auth, "secret", "")
    if isinstance(auth, (GitHubSignature, StripeSignature)) and (not isinstance(secret, str) or not secret):
        raise RegistrationError(
            f"webhook {method} {path}: secret names a setting or environment variable, "
            f'such as secret="GITHUB_WEBHOOK_SECRET"'
        )
    if isinstance(auth, StripeSignature) and (
        not isinstance(auth.tolerance, timedelta) or auth.tolerance <= timedelta(0)
    ):
        raise RegistrationError(f"webhook {method} {path}: tolerance must be a positive timedelta")


def _register(endpoint: Endpoint) -> None:
    """Add an endpoint; the same (method, path) twice is an error unless it is the same
    function again (a module imported twice under one name)."""
    key = (endpoint.method, endpoint.path)
    existing = _ENDPOINTS.get(key)
    if existing is not None and (
        existing.module != endpoint.module or existing.handler.__qualname__ != endpoint.handler.__qualname__
    ):
        raise RegistrationError(
            f"webhook {endpoint.key} is already declared by {existing.module}.{existing.handler.__qualname__}"
        )
    _ENDPOINTS[key] = endpoint


def find(method: str, path: str) -> Endpoint | None:
    """The endpoint of ``method`` at ``path`` (relative to the prefix, trailing ``/`` ignored)."""
    return _ENDPOINTS.get((method.upper(), path.rstrip("/") or "/"))


def methods_of(path: str) -> list[str]:
    """The methods declared at ``path``: a known path with another method is a 405."""
    path = path.rstrip("/") or "/"
    return sorted(method for method, declared in _ENDPOINTS if declared == path)


def endpoints() -> list[Endpoint]:
    """Every declared endpoint, by path then method."""
    return sorted(_ENDPOINTS.values(), key=lambda e: (e.path, e.method))
