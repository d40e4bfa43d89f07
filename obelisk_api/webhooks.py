"""Serving the webhook endpoints the component modules declare (``workers.webhooks``), under
``OBELISK["WEBHOOK_PREFIX"]`` (default ``hooks/``): one view, ``serve``, mounted by
``url_pattern()`` in ``obelisk_site.urls`` (and a host project's URL configuration).

A call goes, in order:

1. the component modules are imported, once per list of modules (``workers.components``):
   only what ``OBELISK['COMPONENT_MODULES']`` declares is served (D119);
2. the endpoint is found by method and path: 404 ``webhook_not_found``, 405 with ``Allow``
   for a known path and another method;
3. the body's size is checked (``MAX_PAYLOAD_BYTES``; announced before it is read,
   ``parsing.guard``, and as read): 413;
4. its authentication (``webhook_auth``): 401 ``bad_signature`` / ``unauthorized``, 403, 503
   ``webhook_secret_missing``; nothing is stored for a refused call (D118);
5. the idempotency header, when the endpoint names one: missing is 400;
6. the handler runs with a ``WebhookRequest``; what it returns becomes the response, what it
   raises a JSON error (500 ``webhook_failed`` without a traceback, logged);
7. the call is recorded (``store.record_webhook_call``) with its status, the execution it
   started and its key; its id is the ``X-Obelisk-Request-Id`` header.

Every answer is JSON ``{"code", "message"}`` when it is an error. why: D117, D118, D119.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from datetime import UTC, datetime

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import re_path
from django.views.decorators.csrf import csrf_exempt

from executions import conf, errors, store
from obelisk_api import webhook_auth
from obelisk_api.errors import json_error, request_too_large
from obelisk_api.parsing import guard
from obelisk_api.webhook_request import WebhookError, WebhookRequest
from workers import webhooks
from workers.components import load_components
from workers.registry import RegistrationError
from workers.webhooks import Endpoint, WebhookResponse

logger = logging.getLogger("obelisk.webhooks")
DEFAULT_PREFIX = "hooks/"
REQUEST_ID_HEADER = "X-Obelisk-Request-Id"
_loaded: set[tuple[str, ...]] = set()
_loading = threading.Lock()


def prefix() -> str:
    """``OBELISK["WEBHOOK_PREFIX"]``: where the endpoints are served, without a leading ``/``."""
    value = getattr(settings, "OBELISK", {}).get("WEBHOOK_PREFIX", DEFAULT_PREFIX)
    value = str(value).strip("/")
    return f"{value}/" if value else ""


def url_pattern():
    """The URL pattern of every endpoint, for ``urlpatterns``."""
    return re_path(rf"^{re.escape(prefix())}(?P<path>[\s\S]*)$", serve, name="obelisk_webhook")


def ensure_loaded() -> None:
    """Import the component modules, once per list of them: their ``@webhook`` declarations register."""
    modules = tuple(conf.get("COMPONENT_MODULES"))
    if modules in _loaded:
        return
    with _loading:
        if modules not in _loaded:
            try:
                load_components(list(modules))
            except RegistrationError as error:  # a typo in the setting, a bad declaration
                logger.error("webhooks: the component modules cannot be loaded: %s", error)
                raise WebhookError(503, "webhooks_unavailable", "the webhook endpoints cannot be loaded") from None
            _loaded.add(modules)


@csrf_exempt  # a webhook's caller has no session; each endpoint states its own authentication
@guard
def serve(request: HttpRequest, path: str = "") -> HttpResponse:
    """One call of an endpoint (the module's docstring has the steps)."""
    started = time.monotonic()
    received_at = datetime.now(UTC)
    try:
        ensure_loaded()
        endpoint = _endpoint(request, "/" + path)
        if isinstance(endpoint, HttpResponse):
            return endpoint
        body = _body(request)
        webhook_auth.check(endpoint.auth, request.headers, body)
    except webhook_auth.Refused as refused:
        return json_error(refused.status, refused.code, refused.message)
    except WebhookError as error:
        return json_error(error.status, error.code, error.message)
    except (OperationalError, InterfaceError) as error:
        return _database_unavailable(error)
    return _accepted(request, endpoint, "/" + path, body, received_at, started)


def _endpoint(request: HttpRequest, path: str) -> Endpoint | HttpResponse:
    method = "GET" if request.method == "HEAD" else request.method
    endpoint = webhooks.find(method, path)
    if endpoint is not None:
        return endpoint
    allowed = webhooks.methods_of(path)
    if not allowed:
        return json_error(404, "webhook_not_found", f"no webhook endpoint at {request.path}")
    refused = json_error(405, "method_not_allowed", f"{request.method} is not allowed here; use {', '.join(allowed)}")
    refused["Allow"] = ", ".join(allowed)
    return refused


def _body(request: HttpRequest) -> bytes:
    """The raw body, at most ``MAX_PAYLOAD_BYTES`` (``guard`` refused a larger announced one)."""
    try:
        body = request.body
    except RequestDataTooBig:
        raise _too_large(int(request.META.get("CONTENT_LENGTH") or 0)) from None
    if len(body) > conf.get("MAX_PAYLOAD_BYTES"):
        raise _too_large(len(body))
    return body


def _too_large(size: int) -> WebhookError:
    error = request_too_large(size)
    return WebhookError(error.http_status, error.code, error.message)


def _accepted(
    request: HttpRequest, endpoint: Endpoint, path: str, body: bytes, received_at: datetime, started: float
) -> HttpResponse:
    """An authenticated call: run the handler, record the call, answer."""
    call_id = store.new_webhook_call_id()
    webhook_request = None
    error_text = ""
    try:
        webhook_request = WebhookRequest(
            endpoint,
            method=request.method,
            path=path,
            headers=request.headers,
            body=body,
            query=_query(request),
            call_id=call_id,
            idempotency_key=_idempotency_key(request, endpoint),
        )
        response = _respond(endpoint.handler(webhook_request))
    except WebhookError as error:
        response, error_text = json_error(error.status, error.code, error.message), f"{error.code}: {error.message}"
    except errors.StoreError as error:
        response, error_text = (
            json_error(error.http_status, error.code, error.message),
            f"{error.code}: {error.message}",
        )
    except (OperationalError, InterfaceError) as error:
        return _database_unavailable(error)  # nothing can be recorded either
    except RecursionError:
        response, error_text = json_error(400, "unsupported_value", "the request is nested too deeply"), "too deep"
    except Exception as error:
        logger.exception("webhook %s (%s) failed", endpoint.key, call_id)
        response = json_error(500, "webhook_failed", "the webhook's handler failed; the server log has the details")
        error_text = f"{type(error).__name__}: {error}"
    response[REQUEST_ID_HEADER] = call_id
    execution_id = webhook_request.execution_id if webhook_request is not None else ""
    _record(endpoint, request, path, call_id, received_at, started, response, execution_id, error_text)
    return response


def _query(request: HttpRequest) -> dict[str, str]:
    try:
        return request.GET.dict()
    except SuspiciousOperation as error:  # too many fields
        raise WebhookError(400, "bad_request", f"the query string is refused: {error}") from None


def _idempotency_key(request: HttpRequest, endpoint: Endpoint) -> str:
    header = endpoint.idempotency_header
    if header is None:
        return ""
    key = (request.headers.get(header) or "").strip()
    if not key:
        raise WebhookError(400, "idempotency_key_missing", f"this endpoint needs the `{header}` header")
    if len(key) > 256 or "\x00" in key or not key.isprintable():
        raise WebhookError(400, "bad_idempotency_key", f"the `{header}` header must be 1 to 256 printable characters")
    return key


def _respond(returned) -> HttpResponse:
    """What a handler returned, as an HTTP response."""
    if isinstance(returned, WebhookResponse):
        response = _body_response(returned.status, returned.body)
        for name, value in (returned.headers or {}).items():
            response[name] = value
        if returned.execution_id:
            response["X-Obelisk-Execution-Id"] = returned.execution_id
        return response
    if isinstance(returned, (dict, list)):
        return _body_response(200, returned)
    if returned is None:
        return HttpResponse(status=204)
    raise TypeError(
        f"a webhook handler returns a dict, a list, a WebhookResponse or None, not {type(returned).__name__}"
    )


def _body_response(status: int, body) -> HttpResponse:
    if not isinstance(status, int) or not 200 <= status <= 599:
        raise ValueError(f"a webhook response's status must be 200 to 599, not {status!r}")
    if body is None:
        return HttpResponse(status=status)
    if isinstance(body, bytes):
        return HttpResponse(body, status=status, content_type="application/octet-stream")
    if isinstance(body, str):
        return HttpResponse(body, status=status, content_type="text/plain; charset=utf-8")
    return JsonResponse(body, status=status, safe=False, json_dumps_params={"allow_nan": False})


def _record(endpoint, request, path, call_id, received_at, started, response, execution_id, error_text) -> None:
    """The call's row; a failure to write it is logged, and the caller still gets its answer."""
    try:
        store.record_webhook_call(
            call_id,
            endpoint=endpoint.key,
            method=request.method,
            path=path,
            received_at=received_at,
            status=response.status_code,
            execution_id=execution_id,
            idempotency_key=(request.headers.get(endpoint.idempotency_header) or "").strip()
            if endpoint.idempotency_header
            else "",
            error=error_text,
            duration_ms=(time.monotonic() - started) * 1000,
        )
    except Exception:
        logger.exception("webhook %s: the call %s could not be recorded", endpoint.key, call_id)


def _database_unavailable(error: Exception) -> HttpResponse:
    logger.warning("webhook: database unavailable: %s", error)
    return json_error(503, "database_unavailable", "the database cannot be reached; try again")
