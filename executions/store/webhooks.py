"""Webhook calls: idempotency keys and the record of every accepted call (D117).

- ``execution_id_for_key``: an endpoint's idempotency key (GitHub's ``X-GitHub-Delivery``,
  an ``Idempotency-Key``) stands for one execution id, fixed by the first delivery that
  stores it. ``t_webhook_key`` is unique on (endpoint, key): of two concurrent first
  deliveries one inserts and the other reads the winner's id, so a retried or duplicated
  delivery submits the same execution, which ``create`` makes once.
- ``record_webhook_call``: one row of ``t_webhook_call`` per call that passed the endpoint's
  authentication (a refused call stores nothing, D118); its ``call_id`` is the response's
  ``X-Obelisk-Request-Id``.
- ``list_webhook_calls`` / ``webhook_calls_of``: the console's list and the execution page.

Each function is one transaction. why: D117, D118.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from executions import errors
from executions.events import check_text
from executions.ids import new_ulid
from executions.models import WebhookCall, WebhookKey
from executions.store.common import canonical_id, utc_now, write_transaction

__all__ = [
    "WebhookCallRecord",
    "execution_id_for_key",
    "list_webhook_calls",
    "new_webhook_call_id",
    "record_webhook_call",
    "webhook_calls_of",
]

CALL_ID_PREFIX = "Whc_"
MAX_KEY_CHARS = 256  # t_webhook_key.idempotency_key
MAX_ENDPOINT_CHARS = 512
MAX_PATH_CHARS = 1024
MAX_ERROR_CHARS = 2000


@dataclass(frozen=True)
class WebhookCallRecord:
    call_id: str
    endpoint: str
    method: str
    path: str
    received_at: datetime
    status: int
    execution_id: str
    idempotency_key: str
    error: str
    duration_ms: float


def new_webhook_call_id() -> str:
    """``Whc_<ULID>``: known before the handler runs, so it can be the response's header."""
    return CALL_ID_PREFIX + new_ulid()


def _check_key(endpoint: str, key: str) -> None:
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
        raise errors.ValidationFailed(f"an idempotency key must be 1 to {MAX_KEY_CHARS} characters")
    check_text(key, "idempotency key")
    if not isinstance(endpoint, str) or not endpoint or len(endpoint) > MAX_ENDPOINT_CHARS:
        raise errors.ValidationFailed(f"an endpoint must be 1 to {MAX_ENDPOINT_CHARS} characters")


def execution_id_for_key(endpoint: str, key: str, candidate_id: str, *, now: datetime | None = None) -> str:
    """The execution id ``key`` stands for at ``endpoint``: ``candidate_id`` if this call is
    the first to store the key, else the id stored first. Race-safe: the insert does nothing
    on a conflict (``ON CONFLICT DO NOTHING`` / ``INSERT OR IGNORE``; on PostgreSQL it waits
    for a concurrent insert of the same key to commit), and the read that follows sees the
    winner's row. why: D117."""
    _check_key(endpoint, key)
    candidate_id = canonical_id(candidate_id)
    now = utc_now(now)
    with write_transaction():
        WebhookKey.store_objects.bulk_create(
            [WebhookKey(endpoint=endpoint, idempotency_key=key, execution_id=candidate_id, created_at=now)],
            ignore_conflicts=True,
        )
        return WebhookKey.objects.get(endpoint=endpoint, idempotency_key=key).execution_id


def record_webhook_call(
    call_id: str,
    *,
    endpoint: str,
    method: str,
    path: str,
    received_at: datetime,
    status: int,
    execution_id: str = "",
    idempotency_key: str = "",
    error: str = "",
    duration_ms: float = 0.0,
) -> WebhookCallRecord:
    """Store one accepted call. Text from the request (path, key, error) is cut to its
    column and freed of what the database cannot store, never refused: the call happened."""
    if not isinstance(call_id, str) or not call_id.startswith(CALL_ID_PREFIX):
        raise errors.InvalidId(f"a webhook call id must look like `{CALL_ID_PREFIX}<ULID>`")
    record = WebhookCallRecord(
        call_id=call_id,
        endpoint=_storable(endpoint, MAX_ENDPOINT_CHARS),
        method=_storable(method, 16),
        path=_storable(path, MAX_PATH_CHARS),
        received_at=utc_now(received_at),
        status=int(status),
        execution_id=canonical_id(execution_id) if execution_id else "",
        idempotency_key=_storable(idempotency_key, MAX_KEY_CHARS),
        error=_storable(error, MAX_ERROR_CHARS),
        duration_ms=max(0.0, float(duration_ms)),
    )
    with write_transaction():
        WebhookCall.store_objects.create(**record.__dict__)
    return record


def _storable(text: str, limit: int) -> str:
    """``text`` without NUL characters and lone surrogates, at most ``limit`` characters."""
    text = str(text or "").replace("\x00", "\ufffd")
    text = text.encode("utf-8", "replace").decode("utf-8")
    return text[:limit]


def _record(row: WebhookCall) -> WebhookCallRecord:
    return WebhookCallRecord(
        row.call_id,
        row.endpoint,
        row.method,
        row.path,
        row.received_at,
        row.status,
        row.execution_id,
        row.idempotency_key,
        row.error,
        row.duration_ms,
    )


def list_webhook_calls(*, endpoint: str | None = None, limit: int = 100) -> list[WebhookCallRecord]:
    """Recorded calls, newest first; of one endpoint (``METHOD /path``) when given."""
    query = WebhookCall.objects.order_by("-received_at", "-call_id")
    if endpoint is not None:
        query = query.filter(endpoint=endpoint)
    return [_record(row) for row in query[:limit]]


def webhook_calls_of(execution_id: str, *, limit: int = 20) -> list[WebhookCallRecord]:
    """The calls that started (or answered with) an execution, oldest first: the first is
    the one that started it, the rest are retried deliveries."""
    query = WebhookCall.objects.filter(execution_id=canonical_id(execution_id)).order_by("received_at", "call_id")
    return [_record(row) for row in query[:limit]]
