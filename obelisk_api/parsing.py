"""What a request body may be, checked before anything else looks at it.

django-ninja's default parser is ``json.loads(request.body)``, which lets through what the
database cannot store (NUL characters, lone surrogates, NaN) and raises what nobody
expects from a parser (``RecursionError`` on deep nesting, ``ValueError`` on an integer of
more than 4,300 digits). This parser turns each into a refusal with the store's code, so a
bad body is a 4xx JSON answer and reaches neither validation nor the store. The size is
checked twice: by ``guard`` on ``Content-Length`` before the body is read, and here on the
bytes actually read.
"""

from __future__ import annotations

import functools
import json

from django.core.handlers.wsgi import LimitedStream
from django.http import HttpRequest, HttpResponse, JsonResponse
from ninja.errors import ValidationError
from ninja.parser import Parser

from executions import conf, errors
from executions.events import check_storable
from obelisk_api.errors import MalformedJson, json_error, request_too_large

# The body is an object around the payload (``{"arguments": [...]}``): one level more.
ENVELOPE_DEPTH = 1


def _refuse_constant(name: str):
    raise MalformedJson(f"`{name}` is not JSON")


def parse_json(raw: bytes):
    """The JSON value of ``raw``, or a ``ValidationFailed`` saying why it is refused."""
    limit = conf.get("MAX_PAYLOAD_BYTES")
    if len(raw) > limit:
        raise request_too_large(len(raw))
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedJson("the request body is not UTF-8") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant)
    except RecursionError:
        raise errors.UnsupportedValue("the request body is nested too deeply") from None
    except ValueError as error:  # JSONDecodeError, and integers of more than 4,300 digits
        raise MalformedJson(f"the request body is not valid JSON: {errors.excerpt(str(error), 200)}") from None
    check_storable(value, "the request body", max_depth=conf.get("MAX_JSON_DEPTH") + ENVELOPE_DEPTH)
    return value


class StrictJsonParser(Parser):
    def parse_body(self, request: HttpRequest):
        return parse_json(request.body)


def refuse_repeated(request: HttpRequest, *names: str) -> None:
    """A query parameter that takes one value, given twice (``?created_after=a&created_after=b``),
    is a 422 as any other invalid parameter: Django's ``QueryDict`` would silently keep the
    last one (schemathesis found it)."""
    repeated = [name for name in names if len(request.GET.getlist(name)) > 1]
    if repeated:
        raise ValidationError(
            [
                {"loc": ("query", name), "msg": "given more than once; it takes one value", "type": "repeated"}
                for name in repeated
            ]
        )


# Methods whose body a route reads; a GET's body is never read, so never refused either.
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def guard(view):
    """Wrap a django-ninja view: refuse a body announced larger than the limit before it is
    read (413), read a chunked body where the server can hand it over (``_body_refusal``),
    answer HEAD as GET without the body, and answer a wrong method with the API's JSON error
    body, not plain text."""

    @functools.wraps(view)
    def guarded(request: HttpRequest, *args, **kwargs):
        refusal = _body_refusal(request)
        if refusal is not None:
            return refusal
        if request.method == "HEAD":
            response = _as_head(view, request, *args, **kwargs)
        else:
            response = view(request, *args, **kwargs)
        if response.status_code == 405 and not response.get("Content-Type", "").startswith("application/json"):
            return _not_allowed(request, response.get("Allow", ""))
        return response

    return guarded


def _body_refusal(request: HttpRequest) -> JsonResponse | None:
    """Check the framing of a request body before anything reads it.

    With ``Content-Length``, a number at most ``MAX_PAYLOAD_BYTES``. Without it, a chunked
    body is read only where the server decoded it and marks its end (``wsgi.input_terminated``,
    as gunicorn does): Django would read it as empty, so a valid submit was a 422. It is then
    read up to one byte past the limit, for ``parse_json`` to refuse (413) like any other
    body. A server that cannot hand it over gets 411, never an empty body (D103)."""
    if request.method not in BODY_METHODS:
        return None
    length = request.META.get("CONTENT_LENGTH") or ""
    if length:
        try:
            announced = int(length)
        except ValueError:
            return json_error(400, "bad_request", "Content-Length is not a number")
        if announced > conf.get("MAX_PAYLOAD_BYTES"):
            error = request_too_large(announced)
            return json_error(error.http_status, error.code, error.message)
        return None
    if "chunked" not in request.META.get("HTTP_TRANSFER_ENCODING", "").lower():
        return None
    if not request.META.get("wsgi.input_terminated"):
        return json_error(411, "length_required", "this server cannot read a chunked request body; send Content-Length")
    request._stream = LimitedStream(request.META["wsgi.input"], conf.get("MAX_PAYLOAD_BYTES") + 1)
    return None


def _as_head(view, request: HttpRequest, *args, **kwargs) -> HttpResponse:
    """HEAD is GET without the body (RFC 9110 §9.3.2), which load balancers probe with:
    the GET route runs, with its authentication, and its answer keeps every header,
    ``Content-Length`` included (D103)."""
    request.method = "GET"
    try:
        response = view(request, *args, **kwargs)
    finally:
        request.method = "HEAD"
    if not response.streaming and response.status_code != 405:
        response["Content-Length"] = str(len(response.content))
        response.content = b""
    return response


def _not_allowed(request: HttpRequest, allowed: str) -> JsonResponse:
    methods = [m.strip() for m in allowed.split(",") if m.strip()]
    if "GET" in methods and "HEAD" not in methods:
        methods.append("HEAD")
    allowed = ", ".join(sorted(methods))
    refused = json_error(405, "method_not_allowed", f"{request.method} is not allowed here; use {allowed}")
    refused["Allow"] = allowed
    return refused
