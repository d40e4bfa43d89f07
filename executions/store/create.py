"""Creating executions (spec 000 §6.1; idempotent, decision 13): the ``Created`` event and
its ``t_state`` row, one by one or one ``INSERT`` per table for many (a workflow's children,
some of them created locked for its own process, D65).

"The same call" under one execution id (D104): the same function, arguments equal as a JSON
Schema validator compares JSON values (``1`` = ``1.0``, ``-0.0`` = ``0.0``, objects in any
key order; ``true`` ≠ ``1``), and the same ``paused`` and ``scheduled_at`` as the first
request asked for. Anything else is ``Conflict``, naming what differs.

why: D13, D48, D55, D65, D71, D104
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import IntegrityError, transaction

from executions import errors, notify
from executions.events import (
    ComponentId,
    Created,
    Event,
    Locked,
    Paused,
    event_from_json,
    event_join_set_id,
    event_to_json,
)
from executions.ids import (
    ExecutionId,
    FunctionFqn,
    JoinSetId,
    parse_deployment_id,
)
from executions.models import (
    ExecutionEvent,
    ExecutionState,
)
from executions.sql import Statements
from executions.state_machine import Lifecycle, State
from executions.store.claim import lock_fields, new_lock
from executions.store.common import (
    EVENT_FIELDS,
    STATE_FIELDS,
    canonical_id,
    check_payload,
    new_instance,
    notify_pending,
    set_fields,
    utc_now,
)
from executions.store.datatypes import ChildClaim, CreateOutcome, CreateRequest, Fence, LockedExecution, LockTerms
from executions.store.transitions import append_in_tx


def create(req: CreateRequest, *, now: datetime | None = None) -> CreateOutcome:
    """Create an execution, pending at ``scheduled_at`` (spec 000 §6.1).

    Idempotent (decision 13): the same id with the same function and parameters returns the
    existing execution (``already_existed``); the same id with anything else is ``Conflict``.
    With ``paused`` a ``Paused`` event follows at version 1.
    """
    now = utc_now(now)
    execution_id = ExecutionId.parse(req.execution_id)
    created = created_event(req, execution_id, now)
    statements = Statements()
    if statements.can_run_in_own_transaction() and not req.paused and not created.parent:
        return _create_in_one_message(execution_id, created, req, now, statements)
    try:
        with transaction.atomic():
            notes, statements = notify.Notes(), Statements()
            version = create_in_tx(execution_id, created, req.paused, now, notes, statements)
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
        create_in_tx(execution_id, created, False, now, notes, statements)
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
    now = utc_now(now)
    prepared = []
    for req in requests:
        execution_id = ExecutionId.parse(req.execution_id)
        prepared.append((execution_id, created_event(req, execution_id, now), req))
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
            version = create_in_tx(execution_id, created, req.paused, now, notes, statements)
            outcomes.append(CreateOutcome(version, False))
        else:
            plain.append((execution_id, created))
            outcomes.append(CreateOutcome(1, already_existed=False))
    create_unpaused_in_tx(plain, now, notes, statements)
    notes.publish(statements)
    statements.run()
    return outcomes


@dataclass(frozen=True)
class _Original:
    """What the first request under an id asked for, as its ``Created`` event records it."""

    created: Created
    created_at: datetime  # when it was created: the due time of a request without one


def _originals(ids: list[str]) -> dict[str, _Original]:
    """The first request of those of ``ids`` that exist, from their ``Created`` events."""
    rows = ExecutionEvent.objects.filter(execution_id__in=ids, version=0).values_list(
        "execution_id", "created_at", "json_value"
    )
    return {execution_id: _Original(event_from_json(value), at) for execution_id, at, value in rows}


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
    if existing.paused != created.paused:
        raise errors.Conflict(
            f"{prefix}, submitted with `paused` {_flag(existing.paused)}; this request has {_flag(created.paused)}"
        )
    # No ``scheduled_at`` asks for the first request's creation instant ("now" when it came).
    due = created.scheduled_at if req.scheduled_at is not None else original.created_at
    if due != existing.scheduled_at:
        at_once = existing.scheduled_at == original.created_at
        first = "none (run at once)" if at_once else existing.scheduled_at.isoformat()
        asked = created.scheduled_at.isoformat() if req.scheduled_at is not None else "none"
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


def created_event(req: CreateRequest, execution_id: ExecutionId, now: datetime) -> Created:
    ffqn = str(FunctionFqn.parse(req.ffqn))
    if not isinstance(req.params, list):
        raise errors.ValidationFailed("params must be a JSON array")
    check_payload("params", req.params)
    parse_deployment_id(req.deployment_id)
    if not isinstance(req.component_id, ComponentId):
        raise errors.ValidationFailed("component_id must be a ComponentId")
    parent = None
    if execution_id.is_top_level:
        if req.parent is not None:
            raise errors.ValidationFailed("a top-level execution id cannot have a parent")
    else:
        expected_parent, expected_js = execution_id.split_to_parts()
        if req.parent is None or (canonical_id(req.parent[0]), str(JoinSetId.parse(req.parent[1]))) != (
            str(expected_parent),
            str(expected_js),
        ):
            raise errors.ValidationFailed(
                f"child `{execution_id}` must name its parent `{expected_parent}` and join set `{expected_js}`"
            )
        parent = (str(expected_parent), str(expected_js))
    if req.scheduled_by is not None:
        canonical_id(req.scheduled_by)
    metadata = dict(req.metadata)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise errors.ValidationFailed("metadata must map strings to strings")
    check_payload("metadata", metadata)
    return Created(
        ffqn=ffqn,
        params=req.params,
        parent=parent,
        scheduled_at=utc_now(req.scheduled_at) if req.scheduled_at else now,
        component_id=req.component_id,
        deployment_id=req.deployment_id,
        metadata=metadata,
        scheduled_by=req.scheduled_by,
        paused=req.paused,
    )


def _state_row(execution_id: ExecutionId, created: Created, now: datetime) -> ExecutionState:
    return new_instance(
        ExecutionState,
        execution_id=str(execution_id),
        is_top_level=execution_id.is_top_level,
        corresponding_version=0,
        ffqn=created.ffqn,
        created_at=now,
        component_id_input_digest=created.component_id.component_digest,
        component_type=created.component_id.component_type,
        first_scheduled_at=created.scheduled_at,
        deployment_id=created.deployment_id,
        pending_expires_finished=created.scheduled_at,
        state=State.PENDING_AT,
        updated_at=now,
        lifecycle=Lifecycle.ACTIVE,
    )


def _created_row(created: Created, row: ExecutionState) -> ExecutionEvent:
    return _event_row(row, 0, created, row.created_at)


def create_in_tx(
    execution_id: ExecutionId,
    created: Created,
    paused: bool,
    now: datetime,
    notes: notify.Notes,
    statements: Statements | None = None,
    parent_locked: bool = False,
) -> int:
    """Insert the state row and the ``Created`` event (into ``statements`` if given, for
    the caller to run with its other writes). ``parent_locked``: the caller holds the
    parent's row lock, so it exists."""
    if created.parent and not parent_locked and not ExecutionState.objects.filter(pk=created.parent[0]).exists():
        # A child's result must reach its parent when it finishes; an orphan never could.
        raise errors.NotFound(f"parent execution `{created.parent[0]}` not found")
    row = _state_row(execution_id, created, now)
    batch = statements if statements is not None else Statements()
    batch.insert(ExecutionState, [row], STATE_FIELDS)
    batch.insert(ExecutionEvent, [_created_row(created, row)], EVENT_FIELDS)
    if paused:
        batch.run()
        row._state.adding = False
        return append_in_tx(row, 1, Paused(), now, None, notes)
    notify_pending(row, notes)
    if statements is None:
        batch.run()
    return 1


def create_unpaused_in_tx(
    items: list[tuple[ExecutionId, Created]], now: datetime, notes, statements, claim: ChildClaim | None = None
) -> list[LockedExecution]:
    """Insert the state rows and ``Created`` events of unpaused executions, one ``INSERT``
    per table for all of them: a workflow's wide join set costs two statements, not two
    per child (D55). The caller checked that each parent exists.

    With ``claim``, the children it covers are created locked instead of pending, with
    their ``Locked`` event in the same ``INSERT``, and returned as ``lock_pending`` would
    return them (eager dispatch, D65); the others are announced as usual."""
    rows, event_rows, claimed = [], [], []
    for execution_id, created in items:
        row = _state_row(execution_id, created, now)
        rows.append(row)
        event_rows.append(_created_row(created, row))
        terms = _claimable(claim, created, now) if claim is not None and len(claimed) < claim.limit else None
        if terms is None:
            notify_pending(row, notes)
            continue
        locked = new_lock(terms, claim.executor_id, claim.run_id, claim.deployment_id, now)
        locked = locked.model_copy(update={"lock_generation": 1})
        set_fields(row, **lock_fields(terms, locked), corresponding_version=1, last_lock_version=1, lock_generation=1)
        event_rows.append(_event_row(row, 1, locked, now))
        claimed.append(_new_locked_execution(row, created, locked))
    statements.insert(ExecutionState, rows, STATE_FIELDS)
    statements.insert(ExecutionEvent, event_rows, EVENT_FIELDS)
    return claimed


def _claimable(claim: ChildClaim, created: Created, now: datetime) -> LockTerms | None:
    """The terms to lock a new execution under: due now, served by the claimer, and built
    from the component the claimer runs."""
    terms = claim.functions.get(created.ffqn)
    if terms is None or created.scheduled_at > now or terms.component_id != created.component_id:
        return None
    return terms


def _event_row(row: ExecutionState, version: int, event: Event, now: datetime) -> ExecutionEvent:
    """The log row of ``event`` at ``version`` of ``row``'s execution."""
    return new_instance(
        ExecutionEvent,
        execution_id=row.execution_id,
        version=version,
        created_at=now,
        json_value=event_to_json(event),
        variant=event.VARIANT,
        join_set_id=event_join_set_id(event),
    )


def _new_locked_execution(row: ExecutionState, created: Created, locked: Locked) -> LockedExecution:
    return LockedExecution(
        execution_id=row.execution_id,
        ffqn=row.ffqn,
        params=created.params,
        metadata=dict(created.metadata),
        parent=created.parent,
        component_type=row.component_type,
        component_digest=row.component_id_input_digest,
        deployment_id=locked.deployment_id,
        next_version=row.corresponding_version + 1,
        intermittent_event_count=0,
        locked=locked,
        fence=Fence(locked.run_id, row.lock_generation),
    )
