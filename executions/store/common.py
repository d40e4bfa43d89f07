"""Helpers shared by the store's modules: time, ids, transactions, row locks, payload checks."""

from __future__ import annotations

import contextlib
import json
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from executions import conf, errors
from executions.events import (
    check_storable,
    event_from_json,
    json_size,
)
from executions.ids import (
    ExecutionId,
)
from executions.models import (
    ExecutionEvent,
    ExecutionState,
)
from executions.state_machine import State
from executions.store.datatypes import EventRecord


def _now(now: datetime | None) -> datetime:
    if now is None:
        return timezone.now()
    if now.tzinfo is None:
        raise errors.ValidationFailed("timestamps must be timezone-aware")
    return now


def _eid(execution_id: str | ExecutionId) -> str:
    return str(ExecutionId.parse(execution_id))


@contextlib.contextmanager
def _write_transaction():
    """One store operation: atomic, with constraint violations reported as ``Conflict``."""
    try:
        with transaction.atomic():
            yield
    except IntegrityError as error:
        raise errors.Conflict(f"constraint violated: {error}") from error


@contextlib.contextmanager
def _snapshot():
    """A consistent multi-query read (REPEATABLE READ on PostgreSQL, spec 004 §5.4.19)."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


def _row_for_update(execution_id: str) -> ExecutionState:
    try:
        return ExecutionState.objects.select_for_update().get(pk=execution_id)
    except ExecutionState.DoesNotExist:
        raise errors.NotFound(f"execution `{execution_id}` not found") from None


def _json_payload(what: str, value: Any) -> None:
    """Refuse values that cannot be stored exactly (``UnsupportedValue``: not JSON, NUL,
    lone surrogates, too deeply nested) or are larger than ``MAX_PAYLOAD_BYTES``."""
    check_storable(value, what, max_depth=conf.get("MAX_JSON_DEPTH"))
    size = json_size(value)
    limit = conf.get("MAX_PAYLOAD_BYTES")
    if size > limit:
        raise errors.PayloadTooLarge(what, size, limit)


def _millis(value: timedelta) -> int:
    return value // timedelta(milliseconds=1)


STATE_FIELDS = tuple(f.name for f in ExecutionState._meta.concrete_fields)


EVENT_FIELDS = tuple(f.name for f in ExecutionEvent._meta.concrete_fields if f.name != "id")


def _json(value: Any) -> Any:
    """A JSON column read with a raw cursor: parsed already (psycopg) or text (SQLite)."""
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def _record(version: int, created_at: datetime, json_value: Any) -> EventRecord:
    return EventRecord(version, created_at, event_from_json(json_value))


def has_unfinished_children(execution_id: str) -> bool:
    """Whether any execution started in a join set of ``execution_id`` (at any depth) runs."""
    return (
        ExecutionState.objects.filter(execution_id__startswith=execution_id + ".")
        .exclude(state=State.FINISHED)
        .exists()
    )
