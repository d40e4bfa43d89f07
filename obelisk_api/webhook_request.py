"""What a webhook handler receives: ``WebhookRequest``, the call (method, path, headers,
body, query) and the client's three answers to it.

- ``request.submit(fn, args)``: start an execution and answer at once, 202
  ``{"execution_id": …}``;
- ``request.call(fn, args, timeout=s)``: start one and wait for it: 200 with its result
  (``{"ok": …}`` / ``{"err": …}`` / ``{"execution_failure": …}``), or 202 with its id when
  the wait runs out (the wait gives the database connection back while it blocks, D100);
- ``request.answer(execution_id)``: 200 with a finished execution's result, else 202.

With the endpoint's ``idempotency_header``, the first execution a call starts takes the id
the header's value stands for (``store.execution_id_for_key``): a retried delivery submits
the same execution (created once) and gets the same answer. why: D117.
"""

from __future__ import annotations

import math

from django.utils.datastructures import CaseInsensitiveMapping

from executions import client, conf, errors, store
from executions.events import retval_to_json
from executions.ids import ExecutionId
from obelisk_api.parsing import parse_json
from workers.webhooks import Endpoint, WebhookResponse


class WebhookError(Exception):
    """A call the handler (or the request's helpers) refuses: a JSON error with this status."""

    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


class WebhookRequest:
    """One call of an endpoint, as its handler sees it."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        method: str,
        path: str,
        headers,
        body: bytes,
        query: dict[str, str],
        call_id: str,
        idempotency_key: str = "",
    ):
        self.endpoint = endpoint
        self.method = method
        self.path = path
        self.headers = CaseInsensitiveMapping(dict(headers))
        self.body = body
        self.query = query
        self.call_id = call_id
        self.idempotency_key = idempotency_key
        self.execution_id = ""  # the execution this call started or answered, recorded
        self._keyed_id_used = False
        self._json = None

    def json(self):
        """The body as JSON; a 4xx ``WebhookError`` for what is not storable JSON (not UTF-8,
        malformed, NaN, NUL characters, lone surrogates, too deep, too large)."""
        if self._json is None:
            try:
                self._json = (parse_json(self.body),)
            except errors.StoreError as error:
                raise WebhookError(error.http_status, error.code, error.message) from None
        return self._json[0]

    def submit(self, fn_or_ffqn, arguments) -> WebhookResponse:
        """Start an execution of ``fn_or_ffqn`` (a registered function or its name); 202."""
        execution_id = self._start(fn_or_ffqn, arguments)
        return WebhookResponse(202, {"execution_id": execution_id}, execution_id=execution_id)

    def call(self, fn_or_ffqn, arguments, *, timeout: float = 10.0) -> WebhookResponse:
        """Start an execution and wait up to ``timeout`` seconds (at most ``MAX_WAIT``) for
        its result: 200 with it, else 202 with the id."""
        execution_id = self._start(fn_or_ffqn, arguments)
        return self._wait(execution_id, timeout)

    def answer(self, execution_id: str) -> WebhookResponse:
        """A finished execution's result (200), else 202 with its id."""
        try:
            execution_id = str(ExecutionId.parse(execution_id))
            self.execution_id = execution_id
            retval = client.result(execution_id)
        except errors.StoreError as error:
            raise WebhookError(error.http_status, error.code, error.message) from None
        if retval is None:
            return WebhookResponse(202, {"execution_id": execution_id}, execution_id=execution_id)
        return WebhookResponse(200, retval_to_json(retval), execution_id=execution_id)

    def _start(self, fn_or_ffqn, arguments) -> str:
        ffqn = getattr(fn_or_ffqn, "ffqn", fn_or_ffqn)
        execution_id = None
        if self.idempotency_key and not self._keyed_id_used:
            self._keyed_id_used = True  # the key stands for the call's first execution only
            execution_id = store.execution_id_for_key(
                self.endpoint.key, self.idempotency_key, str(ExecutionId.generate())
            )
        try:
            submitted = client.submit(ffqn, arguments, execution_id=execution_id)
        except errors.PayloadTooLarge as error:
            raise WebhookError(error.http_status, error.code, error.message) from None
        except errors.ValidationFailed as error:
            raise WebhookError(400, "invalid_arguments", error.message) from None
        self.execution_id = submitted.execution_id
        return submitted.execution_id

    def _wait(self, execution_id: str, timeout: float) -> WebhookResponse:
        if not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout < 0:
            raise ValueError(f"timeout must be a number of seconds >= 0, not {timeout!r}")
        timeout = min(float(timeout), conf.get("MAX_WAIT").total_seconds())
        try:
            result = client.wait(execution_id, timeout=timeout)
        except errors.Timeout:
            return WebhookResponse(202, {"execution_id": execution_id}, execution_id=execution_id)
        return WebhookResponse(200, result, execution_id=execution_id)
