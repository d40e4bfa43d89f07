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

from django.http import HttpRequest
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


def guard(view):
    """Wrap a django-ninja view: refuse a body announced larger than the limit before it is
    read (413), and answer a wrong method with the API's JSON error body, not plain text."""

    @functools.wraps(view)
    def guarded(request: HttpRequest, *args, **kwargs):
        try:
            announced = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            return json_error(400, "bad_request", "Content-Length is not a number")
        if announced > conf.get("MAX_PAYLOAD_BYTES"):
            error = request_too_large(announced)
            return json_error(error.http_status, error.code, error.message)
        response = view(request, *args, **kwargs)
        if response.status_code == 405 and not response.get("Content-Type", "").startswith("application/json"):
            allowed = response.get("Allow", "")
            refused = json_error(405, "method_not_allowed", f"{request.method} is not allowed here; use {allowed}")
            refused["Allow"] = allowed
            return refused
        return response

    return guarded
