"""One shape for every error the API returns: ``{"code": <stable name>, "message": <text>}``
(validation errors add ``details``), with the HTTP status that goes with the code.

The store's errors carry their own code and status (``executions.errors``); django-ninja's
own errors (validation, authentication, unparsable bodies) are re-shaped here, so a client
branches on ``code`` alone, whichever layer refused the request. Nothing that reaches the
API becomes a traceback: an unexpected exception is logged and answered with
``internal_error``.
"""

from __future__ import annotations

import logging

from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpRequest, JsonResponse
from ninja import NinjaAPI
from ninja.errors import HttpError, ValidationError

from executions import conf, errors

logger = logging.getLogger("obelisk.api")
MESSAGE_CHARS = 500  # a message quoting user input stays bounded

# The code of a bare HTTP status (django-ninja raises HttpError with a status only).
STATUS_CODES = {
    400: "bad_request",
    401: "unauthenticated",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    411: "length_required",
    413: "payload_too_large",
    429: "throttled",
}


class ApiError(Exception):
    """An error the API itself raises (authorization, CSRF), with its code and status."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class MalformedJson(errors.ValidationFailed):
    """The request body is not JSON (or not UTF-8)."""

    code = "malformed_json"


def body(code: str, message: str, **extra) -> dict:
    return {"code": code, "message": errors.excerpt(message, MESSAGE_CHARS), **extra}


def json_error(status: int, code: str, message: str, **extra) -> JsonResponse:
    """For responses made outside django-ninja (the URL guard, the catch-all 404)."""
    return JsonResponse(body(code, message, **extra), status=status)


def request_too_large(size: int) -> errors.PayloadTooLarge:
    return errors.PayloadTooLarge("the request body", size, conf.get("MAX_PAYLOAD_BYTES"))


def _location(loc) -> list[str]:
    """django-ninja's ``("body", <parameter name>, field…)`` as the client sees it:
    ``("body", field…)`` (the view's parameter name is no part of the API)."""
    parts = [str(part) for part in loc]
    return parts[:1] + parts[2:] if parts[:1] == ["body"] else parts


def install(api: NinjaAPI) -> None:
    """Register the handlers on ``api`` (the most specific exception class wins)."""

    def respond(request: HttpRequest, status: int, code: str, message: str, **extra):
        return api.create_response(request, body(code, message, **extra), status=status)

    @api.exception_handler(errors.StoreError)
    def store_error(request, exc: errors.StoreError):
        return respond(request, exc.http_status, exc.code, exc.message)

    @api.exception_handler(ApiError)
    def api_error(request, exc: ApiError):
        return respond(request, exc.status, exc.code, exc.message)

    @api.exception_handler(ValidationError)
    def validation_error(request, exc: ValidationError):
        details = [
            {"loc": _location(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": e.get("type", "")}
            for e in exc.errors
        ]
        first = details[0] if details else {"loc": [], "msg": "invalid request"}
        where = ".".join(first["loc"])
        return respond(request, 422, "validation_failed", f"{where}: {first['msg']}", details=details)

    @api.exception_handler(HttpError)
    def http_error(request, exc: HttpError):
        # django-ninja wraps what the body parser raised ("Cannot parse request body"):
        # the parser's own error says what was wrong with the body.
        if isinstance(exc.__cause__, errors.StoreError):
            return store_error(request, exc.__cause__)
        if isinstance(exc.__cause__, RequestDataTooBig):
            return store_error(request, request_too_large(int(request.META.get("CONTENT_LENGTH") or 0)))
        message = (
            "authentication required: `Authorization: Bearer <token>` or a session"
            if exc.status_code == 401
            else str(exc)
        )
        return respond(request, exc.status_code, STATUS_CODES.get(exc.status_code, "http_error"), message)

    @api.exception_handler(Http404)
    def not_found(request, exc: Http404):
        return respond(request, 404, "not_found", "not found")

    @api.exception_handler(RequestDataTooBig)
    def too_big(request, exc: RequestDataTooBig):
        return store_error(request, request_too_large(int(request.META.get("CONTENT_LENGTH") or 0)))

    @api.exception_handler(Exception)
    def unexpected(request, exc: Exception):
        if isinstance(exc, RecursionError):  # a structure too deep for some recursive code
            return respond(request, 400, errors.UnsupportedValue.code, "the request is nested too deeply")
        if isinstance(exc, (OperationalError, InterfaceError)):
            logger.warning("database unavailable: %s", exc)
            return respond(request, 503, "database_unavailable", "the database cannot be reached; try again")
        logger.exception("unexpected error in %s %s", request.method, request.path)
        return respond(request, 500, "internal_error", "internal error; the server log has the details")
