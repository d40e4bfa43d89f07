"""Appending events (spec 000 §6.2, §7.2): one, a batch, with children, or one each for many executions."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

from django.db import connection

from executions import errors, notify
from executions.events import (
    Event,
    Finished,
)
from executions.ids import (
    ExecutionId,
)
from executions.models import (
    ExecutionEvent,
    ExecutionState,
)
from executions.sql import Statements
from executions.state_machine import State
from executions.store.common import (
    EVENT_FIELDS,
    _add_backtrace,
    _eid,
    _now,
    _row_for_update,
    _rows_for_update,
    _write_transaction,
)
from executions.store.datatypes import (
    AppendItem,
    AttemptFailed,
    BlockingStack,
    ChildClaim,
    CreateRequest,
    Fence,
    LockedExecution,
)
from executions.store.transitions import (
    ResponseBatch,
    _append_events_in_tx,
    _Applied,
    _apply,
    _create_in_tx,
    _create_unpaused_in_tx,
    _created_event,
)


def append(
    execution_id: str,
    version: int | None,
    event: Event | AttemptFailed,
    *,
    fence: Fence | None = None,
    now: datetime | None = None,
) -> int:
    """Append one event at ``version`` and update the projection (spec 000 §6.2).

    Returns the next version (for ``Finished``: its own version). ``fence`` is the writer's
    lock; pass it whenever the writer is a run. A fenced writer may pass ``version=None`` to
    append at the next version (see ``transitions._apply``).
    """
    return append_batch_create_new_execution(execution_id, version, [event], [], fence=fence, now=now)


def append_batch(
    execution_id: str,
    version: int | None,
    events: list[Event],
    *,
    fence: Fence | None = None,
    now: datetime | None = None,
) -> int:
    """Append several events to one execution, in order, all or nothing."""
    return append_batch_create_new_execution(execution_id, version, events, [], fence=fence, now=now)


def append_batch_create_new_execution(
    execution_id: str,
    version: int | None,
    events: list[Event],
    children: list[CreateRequest],
    *,
    fence: Fence | None = None,
    now: datetime | None = None,
    stack: BlockingStack | None = None,
) -> int:
    """Append events to an execution and create its children (or the executions it
    schedules) in the same transaction. ``stack``: the workflow code's stack at this
    write, stored (deduplicated) if the write leaves the execution blocked on a join set
    (spec 000 §2.5: where the code waits)."""
    version, _ = append_and_claim_children(execution_id, version, events, children, fence=fence, now=now, stack=stack)
    return version


def append_and_claim_children(
    execution_id: str,
    version: int | None,
    events: list[Event],
    children: list[CreateRequest],
    *,
    fence: Fence | None = None,
    now: datetime | None = None,
    stack: BlockingStack | None = None,
    claim: ChildClaim | None = None,
) -> tuple[int, list[LockedExecution]]:
    """``append_batch_create_new_execution``, and with ``claim`` the children it covers
    are created locked for the claimer, in the same transaction: the next version, and
    the children locked (D65). A child so locked is exactly what ``lock_pending`` would
    have made of it; it is never announced as pending."""
    if not events:
        raise errors.ValidationFailed("batch cannot be empty")
    now = _now(now)
    execution_id = _eid(execution_id)
    prepared = []
    for child in children:
        child_id = ExecutionId.parse(child.execution_id)
        created = _created_event(child, child_id, now)
        if created.parent is not None and created.parent[0] != execution_id:
            raise errors.ValidationFailed(f"`{child_id}` is not a child of `{execution_id}`")
        if created.parent is None and created.scheduled_by != execution_id:
            raise errors.ValidationFailed(f"`{child_id}` must be a child of, or scheduled by, `{execution_id}`")
        prepared.append((child_id, created, child.paused))
    with _write_transaction():
        row = _row_for_update(execution_id)
        first_version = row.corresponding_version + 1
        notes, statements = notify.Notes(), Statements()
        version = _append_events_in_tx(row, version, events, now, fence, notes, statements)
        claimed = _create_unpaused_in_tx(
            [(child_id, created) for child_id, created, paused in prepared if not paused],
            now,
            notes,
            statements,
            claim,
        )
        for child_id, created, paused in prepared:
            if paused:
                _create_in_tx(child_id, created, paused, now, notes, statements, parent_locked=True)
        if stack is not None and row.state == State.BLOCKED_BY_JOIN_SET:
            _add_backtrace(statements, execution_id, stack, first_version, version)
        notes.publish(statements)
        statements.run()
    return version, claimed


def append_many(items: list[AppendItem], *, now: datetime | None = None) -> list[int | errors.StoreError]:
    """Append one event to each of many executions in one transaction (group commit).

    Each item succeeds or fails on its own: the result list holds the next version, or the
    error that rejected that item (nothing of it written). The executions' rows, then the
    rows of the parents their results may answer, are locked in id order, in one query, so
    concurrent batches cannot deadlock. An execution may appear only once.
    """
    now = _now(now)
    ids = [_eid(item.execution_id) for item in items]
    if len(set(ids)) != len(ids):
        raise errors.ValidationFailed("append_many takes each execution at most once")
    results: list[int | errors.StoreError] = []
    with _write_transaction():
        rows = _rows_for_update(ids, then=_parents_answered(ids, items))
        notes = notify.Notes()
        applied: list[tuple[ExecutionState, _Applied]] = []
        for execution_id, item in zip(ids, items, strict=False):
            row = rows.get(execution_id)
            try:
                if row is None:
                    raise errors.NotFound(f"execution `{execution_id}` not found")
                snapshot = _row_values(row)
                done = _apply(row, item.version, item.event, now, item.fence, notes)
            except errors.StoreError as error:
                if row is not None:
                    _restore_row(row, snapshot)
                results.append(error)
                continue
            applied.append((row, done))
            results.append(done.next_version)
        statements = Statements()
        statements.insert(ExecutionEvent, [done.event_row for _, done in applied], EVENT_FIELDS)
        _update_rows([(row, done.fields) for row, done in applied], statements)
        responding = [row for row, done in applied if done.after]
        responses = ResponseBatch()
        if responding:  # children: their responses go to their parents in the same batch
            for _, done in applied:
                for action in done.after:
                    action(parents=rows, statements=statements, responses=responses)
        notes.publish(statements)
        responses.add_to(statements, now)  # last: on PostgreSQL it returns the responses' rows
        returned = statements.run()
        if responses.rows and connection.vendor == "postgresql":
            finished = {row.execution_id: done.event_row.json_value for row, done in applied if done.after}
            notes.response_values.extend(responses.inserted(returned, finished))
    return results


def _update_rows(changes: list[tuple[ExecutionState, set[str]]], statements: Statements) -> None:
    """Write many changed rows with one UPDATE per distinct set of new values.

    Every appended event moves ``corresponding_version`` up by exactly one (checked under
    the row lock), so it is written as ``+ 1`` and rows that differ only in their version
    share a statement: a batch of finished no-ops is a single UPDATE.
    """
    groups: dict[tuple, list[str]] = defaultdict(list)
    for row, fields in changes:
        values = tuple((name, getattr(row, name)) for name in sorted(fields - {"corresponding_version"}))
        groups[values].append(row.pk)
    for values, pks in groups.items():
        statements.update(
            ExecutionState, pks, dict(values), plus_one={"corresponding_version": "corresponding_version"}
        )


def _parents_answered(ids: list[str], items: list[AppendItem]) -> set[str]:
    """The parents that the children among ``items`` answer if their events finish them (a
    ``Finished``, or a failed attempt with no retry left): locked with the batch's own rows,
    in the same query, instead of in a second round trip once the batch knows (D68)."""
    return {
        str(ExecutionId.parse(execution_id).split_to_parts()[0])
        for execution_id, item in zip(ids, items, strict=True)
        if "." in execution_id and isinstance(item.event, (Finished, AttemptFailed))
    }


def _row_values(row: ExecutionState) -> dict:
    return {f.attname: getattr(row, f.attname) for f in row._meta.concrete_fields}


def _restore_row(row: ExecutionState, values: dict) -> None:
    for name, value in values.items():
        setattr(row, name, value)
