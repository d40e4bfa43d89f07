"""A ``ctx.call``'s write when its child runs in the workflow's own thread (D124): the
parent's events with the child created locked, as one statement checked against the row
the run expects (D126, D127), or else the transaction of ``executions.store.append``."""

from __future__ import annotations

import copy
import functools
from datetime import datetime

from django.db import DatabaseError, connection

from executions import errors, notify
from executions.events import Event, compact_json
from executions.models import ExecutionEvent, ExecutionState
from executions.sql import Statements, assignments_from, recordset_columns, recordset_values
from executions.state_machine import Lifecycle, State
from executions.store.append import append_and_claim_in_transaction, prepared_children
from executions.store.common import (
    EVENT_FIELDS,
    STATE_COLUMNS,
    STATE_FIELDS,
    canonical_id,
    load_rows,
    to_pending,
    utc_now,
)
from executions.store.create import create_unpaused_in_tx
from executions.store.datatypes import ChildClaim, CreateRequest, Fence, LockedExecution
from executions.store.transitions import apply_events


def append_call(
    execution_id: str,
    version: int,
    events: list[Event],
    children: list[CreateRequest],
    *,
    fence: Fence,
    claim: ChildClaim | None,
    expected: ExecutionState | None = None,
    now: datetime | None = None,
) -> tuple[int, list[LockedExecution], ExecutionState]:
    """``append_and_claim_children`` for a workflow run's write that creates a local child
    (D124), with the row as written: the next version, the children locked, the row.
    ``expected``: the row as the caller expects to find it (as its last write left it,
    with what its local child's response did to it, ``answered``); on PostgreSQL, outside
    any ``atomic`` block, the write is then one statement that finds the row exactly so
    under its lock (D126). A row found otherwise, or anything the statement cannot write,
    and the write is the transaction, which says why. Without ``expected`` (a run's first
    call, or one after a child that did not finish here), the row is read first, unlocked:
    two round trips where the transaction takes four, and the statement checks what was
    read (D127)."""
    if Statements().can_run_in_own_transaction():
        expected = expected or _row(canonical_id(execution_id))
        if expected is not None:  # None: no such execution, which the transaction says
            written = _append_in_one_message(execution_id, version, events, children, fence, claim, expected, now)
            if written is not None:
                return written
    return append_and_claim_in_transaction(execution_id, version, events, children, fence, now, None, claim)


def _row(execution_id: str) -> ExecutionState | None:
    """The row as it is, unlocked (what ``append_call``'s statement then checks)."""
    rows = load_rows(ExecutionState, f"SELECT {STATE_COLUMNS} FROM t_state WHERE execution_id = %s", [execution_id])
    return rows[0] if rows else None


def answered(row: ExecutionState, join_set_id: str, at: datetime) -> ExecutionState:
    """``row`` as the one-statement write of a child's result made at ``at`` (D81's
    ``answered``) leaves it: a row blocked on that join set, and not being cancelled, goes
    pending no earlier than it was due. A prediction only, for ``append_call``'s
    ``expected``, which the statement checks."""
    row = copy.copy(row)
    if (
        row.state == State.BLOCKED_BY_JOIN_SET
        and row.lifecycle != Lifecycle.CANCELLING
        and row.join_set_id == join_set_id
    ):
        to_pending(row, max(row.pending_expires_finished, at))
        row.updated_at = at
    return row


def _append_in_one_message(
    execution_id: str,
    version: int,
    events: list[Event],
    children: list[CreateRequest],
    fence: Fence,
    claim: ChildClaim | None,
    expected: ExecutionState,
    now: datetime | None,
) -> tuple[int, list[LockedExecution], ExecutionState] | None:
    """``_append_and_claim`` as one statement, sent as its own transaction (D126): the
    rules are applied in Python to the row ``expected`` (as the transaction applies them to
    the row it locked), and the statement locks the row, checks that every column is as
    expected (otherwise it fails: division by zero, and nothing of it is kept), and writes
    the events, the row's new columns and the children, as data-modifying CTEs around the
    writes the transaction would make. None: not written (a write that would notify, a
    paused child, a refusal, the row found otherwise, any error); the transaction follows."""
    now = utc_now(now)
    execution_id = canonical_id(execution_id)
    try:
        prepared = prepared_children(execution_id, children, now)
        if any(paused for _, _, paused in prepared) or expected.execution_id != execution_id:
            return None
        row, notes, statements = copy.copy(expected), notify.Notes(), Statements()
        version, event_rows, fields, after = apply_events(row, version, events, now, fence, notes)
        claimed = create_unpaused_in_tx(
            [(child_id, created) for child_id, created, _ in prepared], now, notes, statements, claim
        )
    except errors.StoreError:
        return None
    if after or notes.messages():
        return None
    statements.insert(ExecutionEvent, event_rows, EVENT_FIELDS)
    writes = statements.take()
    names = tuple(sorted(fields))
    sql = _call_sql(tuple(sql for sql, _ in writes), names)
    params = [
        compact_json([recordset_values(ExecutionState, STATE_FIELDS, {n: getattr(expected, n) for n in STATE_FIELDS})]),
        execution_id,
        compact_json([recordset_values(ExecutionState, names, {n: getattr(row, n) for n in names})]),
    ]
    for _, write_params in writes:
        params += write_params
    try:
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
    except DatabaseError:  # the row moved on (division by zero), or a write refused: the transaction says why
        return None
    return version, claimed, row


@functools.cache
def _call_sql(writes: tuple[str, ...], names: tuple[str, ...]) -> str:
    """D126's statement: the row locked only if every column is as expected (``g``), its
    new columns set (``u``), the other writes as CTEs, and a division by zero when the row
    was not found so, which undoes them all."""
    columns = [ExecutionState._meta.get_field(name).column for name in STATE_FIELDS]
    same = " AND ".join(f"s.{column} IS NOT DISTINCT FROM e.{column}" for column in columns)
    ctes = ",\n".join(f"w{n} AS ({sql})" for n, sql in enumerate(writes))
    return f"""
WITH g AS (
    SELECT s.execution_id FROM t_state s,
        json_to_recordset(%s) AS e({recordset_columns(ExecutionState, STATE_FIELDS)})
    WHERE s.execution_id = %s AND {same}
    FOR UPDATE OF s
),
u AS (
    UPDATE t_state s SET {assignments_from(ExecutionState, names, "v")}
    FROM json_to_recordset(%s) AS v({recordset_columns(ExecutionState, names)})
    WHERE s.execution_id IN (SELECT execution_id FROM g)
    RETURNING 1
),
{ctes}
SELECT 1 / (SELECT count(*)::int FROM u)
"""
