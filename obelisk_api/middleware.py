"""JSON errors under the API's mount point for what answers outside the API's views.

The views and ``urls.not_found`` already answer JSON; what is left is Django's own pages:
the CSRF page (a view that is not CSRF-exempt, such as the redirect at ``/api/``), a 400 for
a disallowed host, and the 500 page of an exception raised outside django-ninja (in a
middleware). A client of the API must branch on one shape, ``{"code", "message"}``, so:

- ``JsonErrorsMiddleware`` (first in ``MIDDLEWARE``) turns any non-JSON 4xx/5xx answer to a
  path under the API into that shape, with the code of its status;
- ``csrf_failure`` (``CSRF_FAILURE_VIEW``) names the reason, ``csrf_failed``, under the API,
  and is Django's page elsewhere.

Pages outside the API (the admin) are left as Django renders them.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import NoReverseMatch, reverse
from django.views import csrf

from obelisk_api.errors import STATUS_CODES, json_error

DEFAULT_PREFIX = "/api/"
KEPT_HEADERS = ("Allow", "Retry-After", "WWW-Authenticate")


def api_prefix() -> str:
    """Where the project mounted ``obelisk_api.urls`` (``/api/`` in the README), read from
    the URL conf rather than assumed (Django caches the reverse lookup)."""
    try:
        return reverse("obelisk_api:openapi-json").removesuffix("openapi.json")
    except NoReverseMatch:
        return DEFAULT_PREFIX


def is_api_request(request: HttpRequest) -> bool:
    return request.path.startswith(api_prefix())


def _is_json(response: HttpResponse) -> bool:
    return response.get("Content-Type", "").startswith("application/json")


def as_json_error(request: HttpRequest, response: HttpResponse) -> JsonResponse:
    """``response`` (a Django error page) as the API's error body, same status and the
    headers a client acts on (``Allow``, ``Retry-After``)."""
    status = response.status_code
    if status >= 500:
        code, message = "internal_error", "internal error; the server log has the details"
    else:
        code = STATUS_CODES.get(status, "http_error")
        message = f"{request.method} {request.path}: {response.reason_phrase}"
    converted = json_error(status, code, message)
    for header in KEPT_HEADERS:
        if header in response:
            converted[header] = response[header]
    return converted


class JsonErrorsMiddleware:
    """Every error answer under the API is JSON (D103). Put it first in ``MIDDLEWARE`` so it
    also sees what the other middleware answer."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if response.status_code >= 400 and not _is_json(response) and is_api_request(request):
            return as_json_error(request, response)
        return response


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """``CSRF_FAILURE_VIEW``: ``csrf_failed`` in JSON under the API, Django's page elsewhere."""
    if is_api_request(request):
        return json_error(403, "csrf_failed", f"CSRF check failed: {reason or 'no valid token'}")
    return csrf.csrf_failure(request, reason)
