"""Creating executions (spec 000 §6.1; idempotent, decision 13)."""

from __future__ import annotations

from datetime import datetime

from django.db import IntegrityError, transaction

from executions import errors, notify
from executions.events import (
    Created,
    canonical_json,
    event_from_json,
)
from executions.ids import (
    ExecutionId,
)
from executions.models import (
    ExecutionEvent,
    ExecutionState,
)
from executions.sql import Statements
from executions.store.common import _now
from executions.store.datatypes import CreateOutcome, CreateRequest
from executions.store.reads import get_created
from executions.store.transitions import (
    _create_in_tx,
    _create_unpaused_in_tx,
    _created_event,
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
    statements = Statements()
    if statements.can_run_in_own_transaction() and not req.paused and not created.parent:
        return _create_in_one_message(execution_id, created, now, statements)
    try:
        with transaction.atomic():
            notes, statements = notify.Notes(), Statements()
            version = _create_in_tx(execution_id, created, req.paused, now, notes, statements)
            notes.publish(statements)
            statements.run()
            return CreateOutcome(version, already_existed=False)
    except IntegrityError as error:
        return _existing_create(str(execution_id), created, error)


def _create_in_one_message(
    execution_id: ExecutionId, created: Created, now: datetime, statements: Statements
) -> CreateOutcome:
    """The common create (no pause, no parent to check) as one prepared statement on
    PostgreSQL: the row, its event and the NOTIFY, committed together (D48, D71)."""
    notes = notify.Notes()
    try:
        _create_in_tx(execution_id, created, False, now, notes, statements)
        messages = notes.add_to(statements)
        statements.run_as_one_statement()
    except IntegrityError as error:
        return _existing_create(str(execution_id), created, error)
    notify.deliver_locally(messages)
    return CreateOutcome(1, already_existed=False)


def create_many(requests: list[CreateRequest], *, now: datetime | None = None) -> list[CreateOutcome]:
    """Create many executions in one transaction: all or nothing.

    Idempotent per request (decision 13): an id that exists with the same function and
    parameters is reported ``already_existed``; one that exists with anything else is
    ``Conflict``, and then nothing at all is created.
    """
    now = _now(now)
    prepared = []
    for req in requests:
        execution_id = ExecutionId.parse(req.execution_id)
        prepared.append((execution_id, _created_event(req, execution_id, now), req.paused))
    ids = [str(execution_id) for execution_id, _, _ in prepared]
    if len(set(ids)) != len(ids):
        raise errors.ValidationFailed("create_many takes each execution id at most once")
    for attempt in range(2):
        try:
            with transaction.atomic():
                return _create_many_in_tx(prepared, now)
        except IntegrityError as error:  # a concurrent create of one of the ids won the race
            if attempt:
                raise errors.Conflict(f"cannot create the executions: {error}") from error
    raise AssertionError("unreachable")


def _create_many_in_tx(prepared: list, now: datetime) -> list[CreateOutcome]:
    existing = _existing_versions([str(execution_id) for execution_id, _, _ in prepared])
    notes, statements = notify.Notes(), Statements()
    outcomes, plain = [], []
    for execution_id, created, paused in prepared:
        if str(execution_id) in existing:
            stored, next_version = existing[str(execution_id)]
            _require_same_call(str(execution_id), stored, created)
            outcomes.append(CreateOutcome(next_version, already_existed=True))
        elif paused or created.parent:  # a Paused event, or a parent to check: one by one
            outcomes.append(CreateOutcome(_create_in_tx(execution_id, created, paused, now, notes, statements), False))
        else:
            plain.append((execution_id, created))
            outcomes.append(CreateOutcome(1, already_existed=False))
    _create_unpaused_in_tx(plain, now, notes, statements)
    notes.publish(statements)
    statements.run()
    return outcomes


def _existing_versions(ids: list[str]) -> dict[str, tuple[Created, int]]:
    """The ``Created`` event and next version of those of ``ids`` that exist."""
    versions = {}
    for execution_id, version, state in ExecutionState.objects.filter(pk__in=ids).values_list(
        "execution_id", "corresponding_version", "state"
    ):
        versions[execution_id] = version if state == "finished" else version + 1
    if not versions:
        return {}
    created = ExecutionEvent.objects.filter(execution_id__in=list(versions), version=0).values_list(
        "execution_id", "json_value"
    )
    return {execution_id: (event_from_json(value), versions[execution_id]) for execution_id, value in created}


def _require_same_call(execution_id: str, existing: Created, created: Created) -> None:
    if existing.ffqn != created.ffqn or canonical_json(existing.params) != canonical_json(created.params):
        raise errors.Conflict(f"execution `{execution_id}` already exists with a different function or parameters")


def _existing_create(execution_id: str, created: Created, error: IntegrityError) -> CreateOutcome:
    try:
        existing = get_created(execution_id)
        state = ExecutionState.objects.get(pk=execution_id)
    except (errors.NotFound, ExecutionState.DoesNotExist):
        raise errors.Conflict(f"cannot create `{execution_id}`: {error}") from error
    _require_same_call(execution_id, existing, created)
    return CreateOutcome(state.next_version, already_existed=True)
