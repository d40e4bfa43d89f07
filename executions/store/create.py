"""Creating executions (spec 000 §6.1; idempotent, decision 13).

"The same call" under one execution id (D104): the same function, arguments equal as a JSON
Schema validator compares JSON values (``1`` = ``1.0``, ``-0.0`` = ``0.0``, objects in any
key order; ``true`` ≠ ``1``), and the same ``paused`` and ``scheduled_at`` as the first
request asked for. Anything else is ``Conflict``, naming what differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from executions import errors, notify
from executions.events import (
    Created,
    Paused,
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
        return _create_in_one_message(execution_id, created, req, now, statements)
    try:
        with transaction.atomic():
            notes, statements = notify.Notes(), Statements()
            version = _create_in_tx(execution_id, created, req.paused, now, notes, statements)
            notes.publish(statements)
            statements.run()
            return CreateOutcome(version, already_existed=False)
    except IntegrityError as error:
        return _existing_create(str(execution_id), created, req, error)


def _create_in_one_message(
    execution_id: ExecutionId, created: Created, req: CreateRequest, now: datetime, statements: Statements
) -> CreateOutcome:
    """The common create (no pause, no parent to check) as one prepared statement on
    PostgreSQL: the row, its event and the NOTIFY, committed together (D48, D71)."""
    notes = notify.Notes()
    try:
        _create_in_tx(execution_id, created, False, now, notes, statements)
        messages = notes.add_to(statements)
        statements.run_as_one_statement()
    except IntegrityError as error:
        return _existing_create(str(execution_id), created, req, error)
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
        prepared.append((execution_id, _created_event(req, execution_id, now), req))
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
    for execution_id, created, req in prepared:
        if str(execution_id) in existing:
            original, next_version = existing[str(execution_id)]
            _require_same_call(str(execution_id), original, created, req)
            outcomes.append(CreateOutcome(next_version, already_existed=True))
        elif req.paused or created.parent:  # a Paused event, or a parent to check: one by one
            version = _create_in_tx(execution_id, created, req.paused, now, notes, statements)
            outcomes.append(CreateOutcome(version, False))
        else:
            plain.append((execution_id, created))
            outcomes.append(CreateOutcome(1, already_existed=False))
    _create_unpaused_in_tx(plain, now, notes, statements)
    notes.publish(statements)
    statements.run()
    return outcomes


@dataclass(frozen=True)
class _Original:
    """What the first request under an id asked for, as its first events record it."""

    created: Created
    paused: bool  # a ``Paused`` event at version 1, written with ``Created`` (same instant)
    scheduled: bool  # ``scheduled_at`` was given: it differs from the creation instant


def _originals(ids: list[str]) -> dict[str, _Original]:
    """The first request of those of ``ids`` that exist, from their events 0 and 1. A pause
    by an operator later is an event at a later instant, so it is not taken for one."""
    events: dict[str, dict[int, tuple]] = {}
    rows = ExecutionEvent.objects.filter(execution_id__in=ids, version__in=(0, 1)).values_list(
        "execution_id", "version", "created_at", "json_value", "variant"
    )
    for execution_id, version, created_at, value, variant in rows:
        events.setdefault(execution_id, {})[version] = (created_at, value, variant)
    originals = {}
    for execution_id, found in events.items():
        if 0 not in found:
            continue
        created_at, value, _ = found[0]
        created = event_from_json(value)
        first = found.get(1)
        paused = first is not None and first[2] == Paused.VARIANT and first[0] == created_at
        originals[execution_id] = _Original(created, paused, scheduled=created.scheduled_at != created_at)
    return originals


def _existing_versions(ids: list[str]) -> dict[str, tuple[_Original, int]]:
    """The first request and next version of those of ``ids`` that exist."""
    versions = {}
    for execution_id, version, state in ExecutionState.objects.filter(pk__in=ids).values_list(
        "execution_id", "corresponding_version", "state"
    ):
        versions[execution_id] = version if state == "finished" else version + 1
    if not versions:
        return {}
    originals = _originals(list(versions))
    return {execution_id: (originals[execution_id], versions[execution_id]) for execution_id in originals}


def same_json(a: Any, b: Any) -> bool:
    """Whether two JSON values are equal as JSON Schema compares them (``const``, ``enum``,
    ``uniqueItems``): numbers by value (``1`` = ``1.0``, ``-0.0`` = ``0.0``), objects by
    their keys in any order, arrays item by item; ``true`` is not ``1`` (D104).

    Python's ``==`` alone says ``True == 1``; ints and floats it compares exactly, so an
    integer past 2**53 is not equal to its nearest float."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_json(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_json(value, b[key]) for key, value in a.items())
    return type(a) is type(b) and a == b


def _require_same_call(execution_id: str, original: _Original, created: Created, req: CreateRequest) -> None:
    """``Conflict`` naming the first thing this request asks differently (D104)."""
    existing = original.created
    prefix = f"execution `{execution_id}` already exists"
    if existing.ffqn != created.ffqn:
        raise errors.Conflict(f"{prefix} as a call of `{existing.ffqn}`, not `{created.ffqn}`")
    if not same_json(existing.params, created.params):
        raise errors.Conflict(f"{prefix} with other arguments")
    if original.paused != req.paused:
        raise errors.Conflict(
            f"{prefix}, submitted with `paused` {_flag(original.paused)}; this request has {_flag(req.paused)}"
        )
    scheduled = req.scheduled_at is not None
    if original.scheduled != scheduled or (scheduled and existing.scheduled_at != created.scheduled_at):
        first = existing.scheduled_at.isoformat() if original.scheduled else "none (run at once)"
        asked = created.scheduled_at.isoformat() if scheduled else "none"
        raise errors.Conflict(f"{prefix}, submitted with `scheduled_at` {first}; this request has {asked}")


def _flag(value: bool) -> str:
    return "true" if value else "false"


def _existing_create(execution_id: str, created: Created, req: CreateRequest, error: IntegrityError) -> CreateOutcome:
    try:
        state = ExecutionState.objects.get(pk=execution_id)
        original = _originals([execution_id])[execution_id]
    except (ExecutionState.DoesNotExist, KeyError):
        raise errors.Conflict(f"cannot create `{execution_id}`: {error}") from error
    _require_same_call(execution_id, original, created, req)
    return CreateOutcome(state.next_version, already_existed=True)
