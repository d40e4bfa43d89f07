"""Appending events (spec 000 §6.2, §7.2): one, a batch, with children, or one each for many executions."""

from __future__ import annotations

import functools
import json
from collections import defaultdict
from datetime import UTC, datetime

from django.db import IntegrityError, connection

from executions import errors, notify
from executions.events import (
    Event,
    Finished,
    Locked,
    Ok,
    compact_json,
    event_to_json,
    retval_to_json,
)
from executions.ids import (
    ExecutionId,
)
from executions.models import (
    ExecutionEvent,
    ExecutionState,
)
from executions.sql import Statements, assignments_from, recordset_columns, recordset_values
from executions.state_machine import Lifecycle, State
from executions.store.claim import lock_ctes, lock_document, new_lock
from executions.store.common import (
    EVENT_FIELDS,
    PENDING_CLEARS,
    add_backtrace,
    canonical_id,
    check_payload,
    row_for_update,
    rows_for_update,
    utc_now,
    write_transaction,
)
from executions.store.create import create_in_tx, create_unpaused_in_tx, created_event
from executions.store.datatypes import (
    AppendItem,
    AttemptFailed,
    BlockingStack,
    ChildClaim,
    CreateRequest,
    Fence,
    LockedExecution,
    ParkedRuns,
    Response,
)
from executions.store.responses import ResponseBatch
from executions.store.transitions import (
    Applied,
    append_events_in_tx,
    apply_event,
    bounded_failure,
    finish_fields,
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
    version, claimed, _ = append_and_claim_in_transaction(
        execution_id, version, events, children, fence, now, stack, claim
    )
    return version, claimed


def prepared_children(execution_id: str, children: list[CreateRequest], now: datetime) -> list[tuple]:
    """Each child's id, ``Created`` event and whether it starts paused; ``ValidationFailed``
    for one that is neither a child of ``execution_id`` nor scheduled by it."""
    prepared = []
    for child in children:
        child_id = ExecutionId.parse(child.execution_id)
        created = created_event(child, child_id, now)
        if created.parent is not None and created.parent[0] != execution_id:
            raise errors.ValidationFailed(f"`{child_id}` is not a child of `{execution_id}`")
        if created.parent is None and created.scheduled_by != execution_id:
            raise errors.ValidationFailed(f"`{child_id}` must be a child of, or scheduled by, `{execution_id}`")
        prepared.append((child_id, created, child.paused))
    return prepared


def append_and_claim_in_transaction(
    execution_id: str,
    version: int | None,
    events: list[Event],
    children: list[CreateRequest],
    fence: Fence | None,
    now: datetime | None,
    stack: BlockingStack | None,
    claim: ChildClaim | None,
) -> tuple[int, list[LockedExecution], ExecutionState]:
    """``append_and_claim_children``'s transaction: the row locked (with the transaction's
    ``BEGIN``, D125), the events applied and the children created; also the row as written
    (``executions.store.local_call`` predicts the next write's row from it)."""
    if not events:
        raise errors.ValidationFailed("batch cannot be empty")
    now = utc_now(now)
    execution_id = canonical_id(execution_id)
    prepared = prepared_children(execution_id, children, now)
    with write_transaction():
        row = row_for_update(execution_id)
        first_version = row.corresponding_version + 1
        notes, statements = notify.Notes(), Statements()
        version = append_events_in_tx(row, version, events, now, fence, notes, statements)
        claimed = create_unpaused_in_tx(
            [(child_id, created) for child_id, created, paused in prepared if not paused],
            now,
            notes,
            statements,
            claim,
        )
        for child_id, created, paused in prepared:
            if paused:
                create_in_tx(child_id, created, paused, now, notes, statements, parent_locked=True)
        if stack is not None and row.state == State.BLOCKED_BY_JOIN_SET:
            add_backtrace(statements, execution_id, stack, first_version, version)
        notes.publish(statements)
        statements.run()
    return version, claimed, row


def append_many(
    items: list[AppendItem], *, now: datetime | None = None, parked: ParkedRuns | None = None
) -> list[int | errors.StoreError]:
    """Append one event to each of many executions in one transaction (group commit).

    Each item succeeds or fails on its own: the result list holds the next version, or the
    error that rejected that item (nothing of it written). The executions' rows, then the
    rows of the parents their results may answer, are locked in id order, in one query, so
    concurrent batches cannot deadlock. An execution may appear only once.

    ``parked``: workflows whose runs are parked in the caller's process; one that a result
    answers may be locked for the caller at once (D82, ``ParkedRuns``).
    """
    now = utc_now(now)
    ids = [canonical_id(item.execution_id) for item in items]
    if len(set(ids)) != len(ids):
        raise errors.ValidationFailed("append_many takes each execution at most once")
    written = _finish_in_one_message(ids, items, now, parked) if _runs_results(ids, items) else {}
    rest = [(execution_id, item) for execution_id, item in zip(ids, items, strict=True) if execution_id not in written]
    in_transaction = iter(_append_many_in_transaction([r[0] for r in rest], [r[1] for r in rest], now) if rest else [])
    return [written[execution_id] if execution_id in written else next(in_transaction) for execution_id in ids]


def _append_many_in_transaction(
    ids: list[str], items: list[AppendItem], now: datetime
) -> list[int | errors.StoreError]:
    results: list[int | errors.StoreError] = []
    with write_transaction():
        rows = rows_for_update(ids, then=_parents_answered(ids, items))
        notes = notify.Notes()
        applied: list[tuple[ExecutionState, Applied]] = []
        for execution_id, item in zip(ids, items, strict=False):
            row = rows.get(execution_id)
            try:
                if row is None:
                    raise errors.NotFound(f"execution `{execution_id}` not found")
                snapshot = _row_values(row)
                done = apply_event(row, item.version, item.event, now, item.fence, notes)
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


def _runs_results(ids: list[str], items: list[AppendItem]) -> bool:
    """Whether every item is a run's result: a ``Finished`` with the run's fence and no
    version (D70); a child's answers a parent that is not itself in the batch (D81)."""
    return all(
        isinstance(item.event, Finished) and item.fence is not None and item.version is None for item in items
    ) and not _parents_answered(ids, items) & set(ids)


def _finish_in_one_message(
    ids: list[str], items: list[AppendItem], now: datetime, parked: ParkedRuns | None = None
) -> dict[str, int]:
    """A group commit of runs' results as one statement, sent as its own transaction (D70,
    D81): the batch's rows are locked by id, in id order (never through the index of every
    locked row, D76), then the rows of the parents their results answer, in id order
    (D68); those whose lock is still the run's (state ``locked``, the fence's run and
    generation) are finished and logged, each child's result goes to its parent as the
    next response, a parent waiting on that join set goes pending (or, if its run is among
    ``parked``, is locked for that run, D82), and the notifications are sent, by CTEs:
    ``obelisk_response`` only for parents held by another executor than the child's, since
    a run awaiting in place lives in its workflow's holder and this process's listeners
    are handed the response at commit (D133).
    Returns the versions written; an item not among them (its lock moved on) is left to
    the transaction, which says why. Nothing is written when an item's value cannot be
    stored (the transaction refuses it on its own), nor when a response another
    transaction gave a parent meanwhile takes the seq this statement's snapshot saw free:
    the transaction then writes the batch, reading the responses afresh."""
    statements = Statements()
    if not statements.can_run_in_own_transaction():
        return {}
    try:
        rows, finished, answered = _finished_rows(ids, items, now)
    except errors.StoreError:  # a value that cannot be stored: the transaction refuses it alone
        return {}
    at = connection.ops.adapt_datetimefield_value(now)
    parents = sorted({parent for parent, _ in answered.values()})
    resuming, lock_names, locks = _resume_rows(parked, parents, now) if parked and parents else ([], (), {})
    if answered:
        params = [compact_json(rows), ids, at, at, parents]
        params += [compact_json(resuming), at, at, at] if resuming else []
        params += [at, at, at, at, notify.FINISHED, notify.RESPONSE, notify.PENDING]
    else:
        params = [compact_json(rows), ids, at, at, notify.FINISHED]
    statements.add(_finish_sql(_FINISH_FIELDS, answering=bool(answered), resuming=lock_names), params)
    notify.sent_from(connection.connection)  # before the commit, whose echo it tells apart
    try:
        returned = statements.run_in_own_transaction()
    except IntegrityError as error:
        if answered and "t_join_set_response_seq" in str(error):
            return {}  # a response committed while the statement waited for its parent's lock
        raise errors.Conflict(f"constraint violated: {error}") from error
    written = {execution_id: version for execution_id, version, *_ in returned}
    messages, values = _written_notes(rows, finished, returned) if written else ([], [])
    notify.deliver_locally(messages, values)
    if resuming:
        _note_resumed(parked, returned, answered, locks, values)
    return written


def _resume_rows(parked: ParkedRuns, parents: list[str], now: datetime) -> tuple[list[dict], tuple[str, ...], dict]:
    """The statement's document of the parked runs' workflows among the ``parents`` this
    batch answers (D82): each one's id, the version its run wrote last, and its new lock
    (``lock_document``, under the one run id of ``parked``); the names of the lock's
    columns; and each one's ``Locked`` event, its generation still to be put in."""
    rows, names, locks = [], (), {}
    for parent in parents:
        if parent in parked.versions:
            version, terms = parked.versions[parent]
            locks[parent] = new_lock(terms, parked.executor_id, parked.run_id, parked.deployment_id, now)
            names, document = lock_document(terms, locks[parent])
            rows.append({"execution_id": parent, "version": version, **document})
    return rows, names, locks


def _note_resumed(
    parked: ParkedRuns, returned: list[tuple], answered: dict, locks: dict[str, Locked], values: list
) -> None:
    """Put in ``parked.resumed`` the workflows the statement locked: each one's ``Locked``
    event, with its generation, that event's version (columns 6 and 7 of a row), and the
    responses the statement gave it (``answered``: each child's parent and join set)."""
    for execution_id, *_, generation, version, _notified in returned:
        if generation is not None:
            parent, _ = answered[execution_id]
            locked = locks[parent].model_copy(update={"lock_generation": generation})
            parked.resumed[parent] = (locked, version, [response for p, response in values if p == parent])


def _written_notes(rows: list[dict], finished: list[str], returned: list[tuple]) -> tuple[list, list]:
    """What the statement announced and the responses it inserted, as ``Notes`` gives them
    to this process's listeners (D67): of the rows written only."""
    written = {row[0]: row for row in returned}
    notes = notify.Notes(
        finished=[item for item, row in zip(finished, rows, strict=True) if row["execution_id"] in written]
    )
    for row in rows:
        if row["execution_id"] in written and "parent_id" in row:
            _, version, seq, created_at, pending_ffqn = written[row["execution_id"]][:5]
            notes.responses.append(row["parent_id"])
            if pending_ffqn is not None:
                notes.pending_ffqns.add(pending_ffqn)
            as_stored = json.loads(compact_json(row["json_value"]))
            response = Response.of(
                seq, created_at, row["answers_join_set"], None, None, row["execution_id"], version, as_stored
            )
            notes.response_values.append((row["parent_id"], response))
    return notes.messages(), notes.response_values


def _finished_rows(
    ids: list[str], items: list[AppendItem], now: datetime
) -> tuple[list[dict], list[str], dict[str, tuple[str, str]]]:
    """The statement's document, a row per item (its fence, the columns ``finish_fields``
    sets, its ``Finished`` event, its ``obelisk_finished`` item with the payload it goes
    in, and for a child the parent and join set its result answers, with the payload of
    its ``obelisk_response`` item), those items, and the children's parents and join sets.
    Checks each value as ``_apply`` does (``ValidationFailed``)."""
    rows, finished, answered = [], [], {}
    for position, (execution_id, item) in enumerate(zip(ids, items, strict=True)):
        event = bounded_failure(item.event)
        retval = retval_to_json(event.retval)
        check_payload("return value", retval)
        fields = finish_fields(event, now)
        finished.append(notify.finished_item(execution_id, retval))
        row = {
            "execution_id": execution_id,
            "fence_run_id": item.fence.run_id,
            "fence_generation": item.fence.lock_generation,
            **recordset_values(ExecutionState, _FINISH_FIELDS, fields),
            "json_value": event_to_json(event),
            "n": position,
        }
        if "." in execution_id:
            parent, join_set = ExecutionId.parse(execution_id).split_to_parts()
            answered[execution_id] = row["parent_id"], row["answers_join_set"] = str(parent), str(join_set)
        rows.append(row)
    for row, item, chunk in zip(rows, finished, notify.chunk_numbers(finished), strict=True):
        row.update(item=item, chunk=chunk)
    parents = [row["parent_id"] for row in rows if "parent_id" in row]
    for row, chunk in zip([row for row in rows if "parent_id" in row], notify.chunk_numbers(parents), strict=True):
        row["response_chunk"] = chunk
    return rows, finished, answered


_FINISH_FIELDS = tuple(finish_fields(Finished(retval=Ok(None)), datetime.now(UTC)))


@functools.cache
def _finish_sql(names: tuple[str, ...], *, answering: bool = False, resuming: tuple[str, ...] = ()) -> str:
    """D70's statement; ``answering`` (D81): the batch has children, whose results go to
    their parents as ``_deliver_response`` sends them (spec 000 §6.4); ``resuming`` (D82,
    the names of a lock's columns): parents whose runs are parked in the writer's process
    are locked for it, as ``lock_pending`` would lock them once pending."""
    if not answering:
        return f"""
WITH v AS (
    SELECT * FROM json_to_recordset(%s) AS v(execution_id text, fence_run_id text, fence_generation bigint,
        {recordset_columns(ExecutionState, names)}, json_value json, item text, chunk integer)
),
{_finish_ctes(names)}
notifying AS (
    SELECT pg_notify(%s, string_agg(v.item, E'\\n' ORDER BY c.execution_id))
    FROM c JOIN v ON v.execution_id = c.execution_id GROUP BY v.chunk
)
SELECT c.execution_id, c.corresponding_version + 1, (SELECT count(*) FROM notifying) FROM c
"""
    no_wait = ", ".join(f"{name} = NULL" for name in PENDING_CLEARS)
    answers = """q.join_set_id IN (SELECT v.answers_join_set FROM c JOIN v ON v.execution_id = c.execution_id
                              WHERE v.parent_id = q.execution_id)"""
    return f"""
WITH v AS (
    SELECT * FROM json_to_recordset(%s) AS v(execution_id text, fence_run_id text, fence_generation bigint,
        {recordset_columns(ExecutionState, names)}, json_value json, item text, chunk integer,
        n integer, parent_id text, answers_join_set text, response_chunk integer)
),
{_finish_ctes(names)}
parents AS (
    SELECT p.execution_id, p.state, p.join_set_id, p.lifecycle, p.pending_expires_finished,
        p.corresponding_version, p.lock_generation, p.executor_id FROM t_state p
    WHERE p.execution_id = ANY (%s::text[]) AND (SELECT count(*) FROM by_id) >= 0
    ORDER BY p.execution_id
    FOR UPDATE OF p
),
{_resuming_ctes(resuming, answers) if resuming else ""}
answered AS (
    UPDATE t_state s SET state = '{State.PENDING_AT.value}',
        pending_expires_finished = GREATEST(q.pending_expires_finished, %s), {no_wait}, updated_at = %s
    FROM parents q
    WHERE s.execution_id = q.execution_id AND q.state = '{State.BLOCKED_BY_JOIN_SET.value}'
        AND q.lifecycle <> '{Lifecycle.CANCELLING.value}' AND {answers}
        {"AND NOT EXISTS (SELECT FROM resumable m WHERE m.execution_id = q.execution_id)" if resuming else ""}
    RETURNING s.execution_id, s.ffqn, s.lifecycle, s.pending_expires_finished
),
responding AS (
    INSERT INTO t_join_set_response
        (created_at, execution_id, join_set_id, delay_id, delay_success, child_execution_id, finished_version, seq)
    SELECT %s::timestamptz, v.parent_id, v.answers_join_set, NULL, NULL, c.execution_id, c.corresponding_version + 1,
        (SELECT COALESCE(MAX(t.seq), 0) FROM t_join_set_response t WHERE t.execution_id = v.parent_id)
            + row_number() OVER (PARTITION BY v.parent_id ORDER BY v.n)
    FROM c JOIN v ON v.execution_id = c.execution_id JOIN parents q ON q.execution_id = v.parent_id
    RETURNING child_execution_id, seq, created_at
),
due AS (
    SELECT DISTINCT a.execution_id, a.ffqn FROM answered a
    WHERE a.lifecycle = '{Lifecycle.ACTIVE.value}' AND a.pending_expires_finished <= %s
),
notifying AS (
    SELECT pg_notify(%s, string_agg(v.item, E'\\n' ORDER BY c.execution_id))
    FROM c JOIN v ON v.execution_id = c.execution_id GROUP BY v.chunk
    UNION ALL
    SELECT pg_notify(%s, string_agg(v.parent_id, E'\\n' ORDER BY v.n))
    FROM c JOIN v ON v.execution_id = c.execution_id JOIN parents q ON q.execution_id = v.parent_id
    WHERE q.executor_id IS DISTINCT FROM c.executor_id GROUP BY v.response_chunk
    UNION ALL
    SELECT pg_notify(%s, string_agg(DISTINCT due.ffqn, E'\\n')) FROM due HAVING count(*) > 0
)
SELECT c.execution_id, c.corresponding_version + 1, r.seq, r.created_at, due.ffqn,
    {"m.lock_generation + 1, m.corresponding_version + 1" if resuming else "NULL::bigint, NULL::bigint"},
    (SELECT count(*) FROM notifying)
FROM c JOIN v ON v.execution_id = c.execution_id
    LEFT JOIN responding r ON r.child_execution_id = c.execution_id
    LEFT JOIN due ON due.execution_id = v.parent_id
    {"LEFT JOIN resumable m ON m.execution_id = v.parent_id" if resuming else ""}
"""


def _resuming_ctes(lock_names: tuple[str, ...], answers: str) -> str:
    """D82: the parents this batch answers whose runs are parked in the writer's process
    (``r``), found waiting on that join set at the version the run wrote last, active and
    due (``resumable``), are locked (their columns and generation as ``lock_pending``'s
    statement sets them) and their ``Locked`` events logged, instead of going pending."""
    return f"""r AS (
    SELECT * FROM json_to_recordset(%s) AS r(execution_id text, version bigint,
        {recordset_columns(ExecutionState, lock_names)}, event_head text, event_tail text)
),
resumable AS (
    SELECT q.execution_id, q.corresponding_version, q.lock_generation FROM parents q JOIN r ON r.execution_id = q.execution_id
    WHERE q.state = '{State.BLOCKED_BY_JOIN_SET.value}' AND q.lifecycle = '{Lifecycle.ACTIVE.value}'
        AND q.corresponding_version = r.version AND q.pending_expires_finished <= %s AND {answers}
),
{lock_ctes(lock_names, "resumable m JOIN r ON r.execution_id = m.execution_id", "m", "r", update="resuming", log="relogging")},"""


def _finish_ctes(names: tuple[str, ...]) -> str:
    """Lock the batch's rows by id, keep those still held by the run (``c``: its fence is
    the row's, as ``check_fence`` wants; an Await workflow's row may be pending or blocked
    under it, D127), finish them
    and log their ``Finished`` events: the part D70 and D81 share. Each row is locked by
    its key, in id order, in a ``LATERAL`` subquery: a plan made while the table was small
    still uses the primary key, where ``= ANY(ids)`` read the whole table (D87)."""
    return f"""by_id AS (
    SELECT s.execution_id, s.corresponding_version, s.state, s.run_id, s.lock_generation, s.executor_id
    FROM (SELECT unnest(%s::text[]) AS id ORDER BY 1) AS i
    CROSS JOIN LATERAL (
        SELECT s.execution_id, s.corresponding_version, s.state, s.run_id, s.lock_generation, s.executor_id
        FROM t_state s
        WHERE s.execution_id = i.id
        FOR UPDATE OF s
    ) AS s
),
c AS (
    SELECT s.execution_id, s.corresponding_version, s.executor_id FROM by_id s JOIN v ON v.execution_id = s.execution_id
    WHERE s.state <> '{State.FINISHED.value}' AND s.run_id = v.fence_run_id AND s.lock_generation = v.fence_generation
),
finishing AS (
    UPDATE t_state s SET corresponding_version = c.corresponding_version + 1,
        {assignments_from(ExecutionState, names, "v")}, updated_at = %s
    FROM c JOIN v ON v.execution_id = c.execution_id
    WHERE s.execution_id = c.execution_id
),
logging AS (
    INSERT INTO t_execution_log
        (execution_id, version, created_at, json_value, variant, join_set_id, history_event_type, consumes_response)
    SELECT c.execution_id, c.corresponding_version + 1, %s, v.json_value, '{Finished.VARIANT}', NULL, NULL, false
    FROM c JOIN v ON v.execution_id = c.execution_id
),"""


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
