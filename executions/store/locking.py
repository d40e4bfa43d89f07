"""Locking executions for a run, and extending a lock (spec 000 §6.3, §7.2)."""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connection

from executions import errors, notify
from executions.events import (
    Created,
    Locked,
    Unlocked,
    compact_json,
    event_from_json,
    event_to_json,
)
from executions.ids import (
    FunctionFqn,
    parse_deployment_id,
    parse_executor_id,
    parse_run_id,
)
from executions.models import (
    ExecutionEvent,
    ExecutionState,
)
from executions.outage import DATABASE_ERRORS
from executions.sql import Statements, in_list, recordset_columns
from executions.state_machine import (
    Lifecycle,
    State,
)
from executions.store.append import append_many
from executions.store.claim import lock_ctes, lock_document, lock_fields, new_lock
from executions.store.common import (
    EVENT_FIELDS,
    canonical_id,
    check_fence,
    json_column,
    new_instance,
    row_for_update,
    utc_now,
    write_transaction,
)
from executions.store.datatypes import AppendItem, Fence, LockedExecution, LockTerms
from executions.store.reads import histories_of as _histories  # a seam the tests replace
from executions.store.reads import responses_of
from executions.store.transitions import apply_event, write_applied


def lock_pending(
    functions: Mapping[str, LockTerms],
    *,
    limit: int,
    executor_id: str,
    run_id: str,
    deployment_id: str,
    now: datetime | None = None,
    known: Mapping[str, int] | None = None,
) -> list[LockedExecution]:
    """Lock up to ``limit`` due, active executions of ``functions``, oldest first.

    One transaction: candidates are selected ``FOR UPDATE SKIP LOCKED`` (so concurrent
    executors never wait for or take each other's rows), a ``Locked`` event is inserted for
    each and the projections are updated, each with a new lock generation. On PostgreSQL,
    outside a caller's transaction, that is one statement (D69). The workflows' history and
    responses are read after it, under their new locks (D78).

    ``known``: workflows whose history the caller already holds, up to the version given
    (a parked run, D77). One claimed at exactly that version, where nothing was written
    since, comes without its history and responses (``history`` None): they are not read.
    """
    now = utc_now(now)
    parse_executor_id(executor_id)
    parse_run_id(run_id)
    parse_deployment_id(deployment_id)
    for ffqn in functions:
        FunctionFqn.parse(ffqn)
    if limit < 1 or not functions:
        return []
    if Statements().can_run_in_own_transaction():
        return _lock_pending_in_one_message(functions, limit, executor_id, run_id, deployment_id, now, known or {})
    with write_transaction():
        candidates = _due_candidates(functions, now, limit)
        if not candidates:
            return []
        by_ffqn: dict[str, list[tuple]] = defaultdict(list)
        for candidate in candidates:
            by_ffqn[candidate[1]].append(candidate)
        events, locked_events, statements = [], {}, Statements()
        for ffqn, group in by_ffqn.items():
            terms = functions[ffqn]
            locked = new_lock(terms, executor_id, run_id, deployment_id, now)
            body = event_to_json(locked)[Locked.VARIANT]
            for execution_id, _, version, generation, _, _ in group:
                locked_events[execution_id] = locked.model_copy(update={"lock_generation": generation + 1})
                events.append(
                    new_instance(
                        ExecutionEvent,
                        execution_id=execution_id,
                        version=version + 1,
                        created_at=now,
                        json_value={Locked.VARIANT: {**body, "lock_generation": generation + 1}},
                        variant=Locked.VARIANT,
                    )
                )
            statements.update(
                ExecutionState,
                [c[0] for c in group],
                {**lock_fields(terms, locked), "updated_at": now},
                plus_one={
                    "corresponding_version": "corresponding_version",
                    "last_lock_version": "corresponding_version",
                    "lock_generation": "lock_generation",
                },
            )
        statements.insert(ExecutionEvent, events, EVENT_FIELDS)
        ids = [c[0] for c in candidates]
        where, params = in_list(ids)
        statements.add(
            f"SELECT execution_id, json_value FROM t_execution_log WHERE version = 0 AND execution_id {where}", params
        )
        created = {execution_id: json_column(value) for execution_id, value in statements.run()}
        return _locked_executions(candidates, locked_events, deployment_id, created, known or {})


def _due_candidates(functions: Mapping[str, LockTerms], now: datetime, limit: int) -> list[tuple]:
    """Due, active executions of ``functions``, pinned to the components whose code the
    caller runs, oldest first, locked ``SKIP LOCKED`` (rows another claimer holds are passed
    over, never waited for). A fixed statement: the partial index ``t_state_pending_ffqn``
    serves it."""
    sql, params = _due_candidates_sql(functions, now, limit)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [row[:6] for row in cursor.fetchall()]  # without the due time, which orders them


_CANDIDATE_COLUMNS = (
    "execution_id, ffqn, corresponding_version, lock_generation, intermittent_event_count, component_type"
)


def _due_candidates_sql(functions: Mapping[str, LockTerms], now: datetime, limit: int) -> tuple[str, list]:
    """Pinned (spec 000 §7.1 ``lock_pending_by_component_digest``): an execution runs only on
    the code of the component digest it records, so a worker claims only the digests of
    its own functions; an execution of another digest waits for a worker of that code, or
    an upgrade (D111). An ffqn belongs to one component of a deployment, so the two lists
    pick exactly the served pairs."""
    lock = " FOR UPDATE SKIP LOCKED" if connection.features.has_select_for_update_skip_locked else ""
    ffqns = list(functions)
    digests = sorted({terms.component_id.component_digest for terms in functions.values()})
    # The predicate of the partial index ``t_state_pending_ffqn`` is literal text: the
    # generic plan of a prepared statement (D71) can use a partial index only so.
    sql = (
        f"SELECT {_CANDIDATE_COLUMNS}, pending_expires_finished FROM t_state"
        f" WHERE state = '{State.PENDING_AT.value}' AND lifecycle = '{Lifecycle.ACTIVE.value}'"
        f" AND pending_expires_finished <= %s AND ffqn IN ({', '.join(['%s'] * len(ffqns))})"
        f" AND component_id_input_digest IN ({', '.join(['%s'] * len(digests))})"
        f" ORDER BY pending_expires_finished LIMIT %s{lock}"
    )
    return sql, [connection.ops.adapt_datetimefield_value(now), *ffqns, *digests, limit]


def _lock_pending_in_one_message(
    functions: Mapping[str, LockTerms],
    limit: int,
    executor_id: str,
    run_id: str,
    deployment_id: str,
    now: datetime,
    known: Mapping[str, int],
) -> list[LockedExecution]:
    """``lock_pending`` as one statement, sent as its own transaction (D69): the candidates
    locked ``SKIP LOCKED``, their rows updated and their ``Locked`` events inserted by
    data-modifying CTEs, their ``Created`` events returned. One round trip instead of four
    (``BEGIN``, the candidates, the writes, ``COMMIT``); the rows, the log and the result
    are the ones the transaction makes (a test holds them equal). The workflows' history
    and responses are read afterwards, under their new locks (D78).

    The terms of each function go as one JSON document: the new lock's columns
    (``lock_fields``) and its ``Locked`` event's JSON, cut where the row's generation goes."""
    terms_rows, locked_by_ffqn, names = [], {}, ()
    for ffqn, terms in functions.items():
        locked = locked_by_ffqn[ffqn] = new_lock(terms, executor_id, run_id, deployment_id, now)
        names, document = lock_document(terms, locked)
        terms_rows.append({"ffqn": ffqn, **document})
    candidates_sql, params = _due_candidates_sql(functions, now, limit)
    at = connection.ops.adapt_datetimefield_value(now)
    try:
        with connection.cursor() as cursor:
            cursor.execute(_claim_sql(candidates_sql, names), [*params, compact_json(terms_rows), at, at])
            rows = cursor.fetchall()
    except IntegrityError as error:
        raise errors.Conflict(f"constraint violated: {error}") from error
    candidates = [row[:6] for row in rows]
    locked_events = {
        execution_id: locked_by_ffqn[ffqn].model_copy(update={"lock_generation": generation + 1})
        for execution_id, ffqn, _, generation, _, _ in candidates
    }
    created = {row[0]: json_column(row[6]) for row in rows}
    try:
        return _locked_executions(candidates, locked_events, deployment_id, created, known)
    except DATABASE_ERRORS:  # the statement committed: what it locked goes back at once (D78)
        _hand_back(candidates, locked_events)
        raise


def _hand_back(candidates, locked_events: dict[str, Locked]) -> None:
    """Best effort: ``Unlocked`` for each claimed execution, with the claim's fence, so a
    claim whose reads failed leaves nothing locked until its locks expire."""
    unlocked = Unlocked(unlocked_at=utc_now(None), reason="handed back: reading its history failed")
    items = [AppendItem(c[0], None, unlocked, Fence(locked_events[c[0]].run_id, c[3] + 1)) for c in candidates]
    try:
        append_many(items)
    except Exception:  # the connection is gone too: the locks expire
        pass


@functools.cache
def _claim_sql(candidates_sql: str, names: tuple[str, ...]) -> str:
    # Each ``Created`` event in a subquery of its own: a plan made while the log was small
    # still reads it by the primary key, where a join read the whole log (D87).
    record = recordset_columns(ExecutionState, names)
    return f"""
WITH c AS ({candidates_sql}),
t AS (SELECT * FROM json_to_recordset(%s) AS t(ffqn text, {record}, event_head text, event_tail text)),
{lock_ctes(names, "c JOIN t ON t.ffqn = c.ffqn", "c", "t", update="locking", log="logging")}
SELECT {", ".join("c." + column.strip() for column in _CANDIDATE_COLUMNS.split(","))},
    (SELECT l.json_value FROM t_execution_log l WHERE l.execution_id = c.execution_id AND l.version = 0)
FROM c
ORDER BY c.pending_expires_finished, c.execution_id
"""


def _locked_executions(
    candidates,
    locked_events: dict[str, Locked],
    deployment_id: str,
    created: dict[str, Any] | None = None,
    known: Mapping[str, int] = {},  # noqa: B006 (never mutated)
) -> list[LockedExecution]:
    ids = [c[0] for c in candidates]
    if created is None:
        created = dict(
            ExecutionEvent.objects.filter(execution_id__in=ids, version=0).values_list("execution_id", "json_value")
        )
    workflows = [c[0] for c in candidates if c[5] == "workflow" and known.get(c[0]) != c[2]]
    # One claimed at version 0 has only its ``Created`` event: no history yet, and no
    # response, since only its own run creates what could answer it (D125).
    started = [execution_id for execution_id, _, version, *_ in candidates if execution_id in workflows and version]
    histories = _histories(started) if started else {}
    responses = responses_of(started) if started else {}
    out = []
    for execution_id, ffqn, version, generation, intermittent, component_type in candidates:
        body = created[execution_id][Created.VARIANT]
        locked = locked_events[execution_id]
        parent = body.get("parent")
        out.append(
            LockedExecution(
                execution_id=execution_id,
                ffqn=ffqn,
                params=body["params"],
                metadata=body.get("metadata") or {},
                parent=tuple(parent) if parent else None,
                component_type=component_type,
                component_digest=locked.component_id.component_digest,
                deployment_id=deployment_id,
                next_version=version + 2,
                intermittent_event_count=intermittent,
                locked=locked,
                fence=Fence(locked.run_id, generation + 1),
                history=histories.get(execution_id, []) if execution_id in workflows else None,
                responses=responses.get(execution_id, []) if execution_id in workflows else None,
            )
        )
    return out


def with_history(locked: LockedExecution) -> LockedExecution:
    """``locked`` with its history and responses read: a workflow claimed without them
    (``lock_pending``'s ``known``) whose parked run had given up by the time it was
    claimed (D77). Read outside the claim's transaction, under the run's lock: only the
    lock's holder appends history, and responses only ever come after."""
    if locked.history is not None:
        return locked
    history = _histories([locked.execution_id]).get(locked.execution_id, [])
    responses = responses_of([locked.execution_id]).get(locked.execution_id, [])
    return dataclasses.replace(locked, history=history, responses=responses)


def lock_one(
    execution_id: str,
    version: int,
    terms: LockTerms,
    *,
    executor_id: str,
    run_id: str,
    deployment_id: str,
    now: datetime | None = None,
) -> LockedExecution:
    """Lock one execution at ``version``, and return it as a claim does (its ``Created``,
    and a workflow's history and responses, read). The run that holds it already locks it
    again with ``lock_again``, which reads nothing."""
    now = utc_now(now)
    execution_id = canonical_id(execution_id)
    locked = new_lock(terms, executor_id, run_id, deployment_id, now)
    with write_transaction():
        candidate, locked = _write_lock(execution_id, version, locked, now)
        return _locked_executions([candidate], {execution_id: locked}, deployment_id)[0]


def lock_again(run: LockedExecution, version: int, terms: LockTerms, *, now: datetime | None = None) -> datetime:
    """``lock_one`` for the run that holds the execution already (``run``, as it was
    claimed): a workflow whose resolved Await wait left its row pending renews its lease by
    locking the row again, with the same run id. Returns the new lock's expiry. It reads
    none of the history, the responses or ``Created``: the run holds them, and a long
    workflow renews every two thirds of its lock (D131)."""
    now = utc_now(now)
    locked = new_lock(terms, run.locked.executor_id, run.fence.run_id, run.deployment_id, now)
    with write_transaction():
        _, locked = _write_lock(run.execution_id, version, locked, now)
    return locked.lock_expires_at


def _write_lock(execution_id: str, version: int, locked: Locked, now: datetime) -> tuple[tuple, Locked]:
    """``locked`` applied to the row, locked in the caller's transaction. Returns the row
    as a claim's candidate, and the event as written."""
    row = row_for_update(execution_id)
    intermittent = row.intermittent_event_count
    applied = apply_event(row, version, locked, now, None, notify.Notes())
    write_applied(row, applied)
    candidate = (execution_id, row.ffqn, version - 1, row.lock_generation - 1, intermittent, row.component_type)
    return candidate, event_from_json(applied.event_row.json_value)


def extend_lock(
    execution_id: str,
    fence: Fence,
    lock_expires_at: datetime,
    *,
    now: datetime | None = None,
) -> str:
    """The holder renews its lock: a heartbeat (decisions.md D27).

    Only ``t_state``'s lock expiry moves (never backwards), under the row lock and the
    holder's fence; no event is appended and the version stays. So an hour-long activity
    does not write hundreds of ``Locked`` events, the lock in ``t_state`` is always the
    current one (what the sweep reads), and a renewal never races a cancellation request
    for a version. Returns the execution's lifecycle, so a holder renewing the lock of an
    execution being cancelled learns it at once (``"cancelling"``).
    """
    now = utc_now(now)
    lock_expires_at = utc_now(lock_expires_at)
    execution_id = canonical_id(execution_id)
    if lock_expires_at <= now:
        raise errors.ValidationFailed("invalid expiry date: a renewed lock must expire after now")
    with write_transaction():
        row = row_for_update(execution_id)
        check_fence(row, fence)
        if row.state != State.LOCKED:
            raise errors.IllegalState(f"cannot renew the lock of `{execution_id}`: it is {row.state}")
        if lock_expires_at > row.pending_expires_finished:
            ExecutionState.store_objects.filter(pk=execution_id).update(
                pending_expires_finished=lock_expires_at, updated_at=now
            )
    return row.lifecycle
