"""Creating executions (spec 000 §6.1; idempotent, decision 13)."""

from __future__ import annotations

from datetime import datetime

from django.db import IntegrityError, transaction

from executions import errors, notify
from executions.events import (
    Created,
    canonical_json,
)
from executions.ids import (
    ExecutionId,
)
from executions.models import (
    ExecutionEvent,
    ExecutionState,
)
from executions.sql import Statements
from executions.store.common import EVENT_FIELDS, STATE_FIELDS, _now
from executions.store.datatypes import CreateOutcome, CreateRequest
from executions.store.reads import get_created
from executions.store.transitions import (
    _create_in_tx,
    _created_event,
    _created_row,
    _notify_pending,
    _state_row,
)


def create(req: CreateRequest, *, now: datetime | None = None) -> CreateOutcome:
    """Create an execution, pending at ``scheduled_at`` (spec 000 §6.1).

    Idempotent (decision 13): the same id with the same function and parameters returns the
    existing execution (``already_existed``); the same id with anything else is ``Conflict``.
    With ``paused`` a ``Paused`` event follows at version 1.
    """
    now = _now(now)
    execution_id = ExecutionId.parse(req.execution_id)
    created = _created_event(req, execution_id, now)
    try:
        with transaction.atomic():
            notes, statements = notify.Notes(), Statements()
            version = _create_in_tx(execution_id, created, req.paused, now, notes, statements)
            notes.publish(statements)
            statements.run()
            return CreateOutcome(version, already_existed=False)
    except IntegrityError as error:
        return _existing_create(str(execution_id), created, error)


def create_many(requests: list[CreateRequest], *, now: datetime | None = None) -> list[CreateOutcome]:
    """Create many executions in one transaction (two bulk inserts).

    All or nothing. If an id already exists, falls back to ``create`` one by one, which
    keeps each create idempotent.
    """
    now = _now(now)
    prepared = []
    for req in requests:
        execution_id = ExecutionId.parse(req.execution_id)
        prepared.append((execution_id, _created_event(req, execution_id, now), req.paused))
    if any(paused or created.parent for _, created, paused in prepared):
        return [create(req, now=now) for req in requests]
    try:
        with transaction.atomic():
            notes, statements = notify.Notes(), Statements()
            rows = [_state_row(execution_id, created, now) for execution_id, created, _ in prepared]
            statements.insert(ExecutionState, rows, STATE_FIELDS)
            statements.insert(
                ExecutionEvent,
                [_created_row(c, row) for (_, c, _), row in zip(prepared, rows, strict=False)],
                EVENT_FIELDS,
            )
            for row in rows:
                _notify_pending(row, notes)
            notes.publish(statements)
            statements.run()
    except IntegrityError:
        return [create(req, now=now) for req in requests]
    return [CreateOutcome(1, already_existed=False) for _ in prepared]


def _existing_create(execution_id: str, created: Created, error: IntegrityError) -> CreateOutcome:
    try:
        existing = get_created(execution_id)
        state = ExecutionState.objects.get(pk=execution_id)
    except (errors.NotFound, ExecutionState.DoesNotExist):
        raise errors.Conflict(f"cannot create `{execution_id}`: {error}") from error
    if existing.ffqn != created.ffqn or canonical_json(existing.params) != canonical_json(created.params):
        raise errors.Conflict(f"execution `{execution_id}` already exists with a different function or parameters")
    return CreateOutcome(state.next_version, already_existed=True)
