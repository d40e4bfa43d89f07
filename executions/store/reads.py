"""Reading executions, events and responses; waiting for results (spec 000 §7.3, §7.4)."""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from django.db import connection
from django.db.models import Max

from executions import errors, notify
from executions.events import (
    Created,
    Finished,
    HistoryEventRecord,
    Locked,
    RetVal,
    retval_from_json,
    storable_text,
)
from executions.ids import ExecutionId
from executions.models import (
    ExecutionBacktrace,
    ExecutionEvent,
    ExecutionState,
    JoinSetResponse,
    LogEntry,
)
from executions.sql import rows_by_key
from executions.store.common import (
    STATE_COLUMNS,
    canonical_id,
    columns_of,
    event_record,
    json_column,
    load_rows,
    load_rows_with_extras,
    read_snapshot,
)
from executions.store.datatypes import (
    EventRecord,
    ExecutionDetail,
    ExecutionFilter,
    ExecutionLog,
    ExecutionSnapshot,
    LogRecord,
    Response,
)
from executions.store.listing import filter_executions


def append_logs(
    execution_id: str,
    run_id: str,
    entries: Iterable[tuple[datetime, int, str]] = (),
    streams: Iterable[tuple[datetime, int, bytes]] = (),
) -> int:
    """Store what a run logged: records ``(created_at, level 1-5, message)`` and chunks of
    its std streams ``(created_at, 1 stdout | 2 stderr, bytes)``, in one transaction.
    Fire-and-forget like upstream's: no fence (a late run's logs are still its logs), and
    text is made storable (NUL, lone surrogates escaped) rather than refused."""
    execution_id = canonical_id(execution_id)
    rows = [
        LogEntry(execution_id=execution_id, run_id=run_id, created_at=at, level=level, message=storable_text(message))
        for at, level, message in entries
    ] + [
        LogEntry(execution_id=execution_id, run_id=run_id, created_at=at, stream_type=stream, payload=payload)
        for at, stream, payload in streams
    ]
    if rows:
        LogEntry.store_objects.bulk_create(rows)
    return len(rows)


def list_backtraces(execution_id: str) -> list[tuple[int, int, list]]:
    """``(version_min_including, version_max_excluding, frames)`` of an execution, in order."""
    execution_id = canonical_id(execution_id)
    rows = (
        ExecutionBacktrace.objects.filter(execution_id=execution_id)
        .order_by("version_min_including")
        .values_list("version_min_including", "version_max_excluding", "backtrace__frames")
    )
    return [(low, high, frames) for low, high, frames in rows]


def list_logs(execution_id: str, *, after_id: int = 0, limit: int = 100) -> list[LogRecord]:
    """Log records and std-stream chunks of every run, in the order they were written."""
    rows = LogEntry.objects.filter(execution_id=canonical_id(execution_id), id__gt=after_id).order_by("id")[:limit]
    return [
        LogRecord(
            r.id,
            r.run_id,
            r.created_at,
            r.get_level_display() if r.level else None,
            r.message,
            r.get_stream_type_display() if r.stream_type else None,
            bytes(r.payload) if r.payload is not None else None,
        )
        for r in rows
    ]


_STATE_SQL = f"SELECT {STATE_COLUMNS} FROM t_state WHERE execution_id = %s"


def get_state(execution_id: str) -> ExecutionSnapshot:
    execution_id = canonical_id(execution_id)
    rows = load_rows(ExecutionState, _STATE_SQL, [execution_id])
    if not rows:
        raise errors.NotFound(f"execution `{execution_id}` not found")
    return ExecutionSnapshot.of(rows[0])


def get_detail(execution_id: str, *, max_children: int = 1000) -> ExecutionDetail:
    """The row, the call, the result, the attempts and the tree links of one execution,
    from one snapshot (the API's and the console's execution page)."""
    execution_id = canonical_id(execution_id)
    with read_snapshot():
        state = get_state(execution_id)
        created = get_created(execution_id)
        attempts = ExecutionEvent.objects.filter(execution_id=execution_id, variant=Locked.VARIANT).count()
        finished = get_event(execution_id, state.corresponding_version) if state.is_finished else None
        children = list(
            filter_executions(ExecutionFilter(parent_id=execution_id))
            .order_by("execution_id")
            .values_list("execution_id", flat=True)[:max_children]
        )
    parsed = ExecutionId.parse(execution_id)
    return ExecutionDetail(
        state=state,
        params=created.params,
        metadata=dict(created.metadata),
        scheduled_at=created.scheduled_at,
        parent_id=None if parsed.is_top_level else str(parsed.split_to_parts()[0]),
        children=children,
        retval=finished.event.retval if finished else None,
        finished_at=finished.created_at if finished else None,
        attempts=attempts,
    )


def get_event(execution_id: str, version: int) -> EventRecord:
    execution_id = canonical_id(execution_id)
    row = ExecutionEvent.objects.filter(execution_id=execution_id, version=version).values_list(
        "version", "created_at", "json_value"
    )
    found = list(row)
    if not found:
        raise errors.NotFound(f"execution `{execution_id}` has no event at version {version}")
    return event_record(*found[0])


def get_last_event(execution_id: str) -> EventRecord:
    execution_id = canonical_id(execution_id)
    found = list(
        ExecutionEvent.objects.filter(execution_id=execution_id)
        .order_by("-version")
        .values_list("version", "created_at", "json_value")[:1]
    )
    if not found:
        raise errors.NotFound(f"execution `{execution_id}` not found")
    return event_record(*found[0])


def get_created(execution_id: str) -> Created:
    return get_event(execution_id, 0).event


def get(execution_id: str) -> ExecutionLog:
    """State, every event and every response, read from one snapshot."""
    execution_id = canonical_id(execution_id)
    with read_snapshot():
        state = get_state(execution_id)
        events = [
            event_record(*row)
            for row in ExecutionEvent.objects.filter(execution_id=execution_id)
            .order_by("version")
            .values_list("version", "created_at", "json_value")
        ]
        responses = responses_of([execution_id]).get(execution_id, [])
    return ExecutionLog(state, events, responses)


def list_events(execution_id: str, *, from_version: int = 0, limit: int = 100) -> tuple[list[EventRecord], int]:
    """Events with ``version >= from_version``, ascending, and the highest version."""
    execution_id = canonical_id(execution_id)
    with read_snapshot():
        max_version = ExecutionEvent.objects.filter(execution_id=execution_id).aggregate(m=Max("version"))["m"]
        if max_version is None:
            raise errors.NotFound(f"execution `{execution_id}` not found")
        events = [
            event_record(*row)
            for row in ExecutionEvent.objects.filter(execution_id=execution_id, version__gte=from_version)
            .order_by("version")
            .values_list("version", "created_at", "json_value")[:limit]
        ]
    return events, max_version


def list_responses(execution_id: str, *, after_seq: int = 0, limit: int | None = 100) -> tuple[list[Response], int]:
    """Responses with ``seq > after_seq`` in ``seq`` order, and the highest ``seq`` (0 if none)."""
    execution_id = canonical_id(execution_id)
    with read_snapshot():
        max_seq = JoinSetResponse.objects.filter(execution_id=execution_id).aggregate(m=Max("seq"))["m"] or 0
        responses = responses_of([execution_id], after_seq=after_seq, limit=limit).get(execution_id, [])
    return responses, max_seq


def responses_after(execution_id: str, after_seq: int) -> list[Response]:
    """The responses with ``seq > after_seq``, in order: what a waiting workflow run asks for
    each time it wakes (two small queries; no snapshot needed, ``seq`` only grows)."""
    return responses_of([canonical_id(execution_id)], after_seq=after_seq).get(canonical_id(execution_id), [])


def histories_of(execution_ids: list[str]) -> dict[str, list[EventRecord]]:
    """The history events of workflows, in order: what a run replays (one fixed query)."""
    out: dict[str, list[EventRecord]] = defaultdict(list)
    source, params = rows_by_key("t_execution_log", "l", "execution_id", execution_ids, "l.variant = %s")
    sql = f"SELECT {_EVENT_COLUMNS_L} FROM {source} ORDER BY l.execution_id, l.version"
    for row in load_rows(ExecutionEvent, sql, [*params, HistoryEventRecord.VARIANT]):
        out[row.execution_id].append(event_record(row.version, row.created_at, row.json_value))
    return out


_EVENT_COLUMNS_L = columns_of(ExecutionEvent, "l")
_RESPONSE_COLUMNS = columns_of(JoinSetResponse, "r")
# Each child's result in a subquery of its own: read by the log's key whatever the plan
# was made from (D87).
_RESPONSES_SQL = """
SELECT {columns}, (
    SELECT f.json_value FROM t_execution_log f
    WHERE f.execution_id = r.child_execution_id AND f.version = r.finished_version AND f.variant = 'finished'
) AS child_finished
FROM {source}
ORDER BY r.execution_id, r.seq
"""


def responses_of(
    execution_ids: list[str], *, after_seq: int = 0, limit: int | None = None
) -> dict[str, list[Response]]:
    """Responses with their children's results, in one query (a waiting run asks at every
    wake-up: no ORM query to build)."""
    source, params = rows_by_key("t_join_set_response", "r", "execution_id", execution_ids, "r.seq > %s")
    sql = _RESPONSES_SQL.format(columns=_RESPONSE_COLUMNS, source=source)
    params.append(after_seq)
    if limit is not None:
        sql += " LIMIT %s"
        params.append(limit)
    out: dict[str, list[Response]] = defaultdict(list)
    for r, (child_finished,) in load_rows_with_extras(JoinSetResponse, sql, params):
        finished = json_column(child_finished) if child_finished is not None else None
        out[r.execution_id].append(
            Response.of(
                r.seq,
                r.created_at,
                r.join_set_id,
                r.delay_id,
                r.delay_success,
                r.child_execution_id,
                r.finished_version,
                finished,
            )
        )
    return out


def get_tree(execution_id: str) -> list[tuple[ExecutionSnapshot, RetVal | None]]:
    """An execution and every execution started in its join sets, at any depth, each with
    its result (None while it runs), in id order (a parent before its children)."""
    execution_id = canonical_id(execution_id)
    with read_snapshot():
        root = list(ExecutionState.objects.filter(pk=execution_id))
        if not root:
            raise errors.NotFound(f"execution `{execution_id}` not found")
        # The descendants are a range of the primary key's pattern index (D94, D128), sorted
        # here: with an ORDER BY the planner may walk the whole primary key instead, for its order.
        descendants = ExecutionState.objects.filter(execution_id__startswith=execution_id + ".")
        rows = root + sorted(descendants, key=lambda row: row.execution_id)
        results = get_finished_results([row.execution_id for row in rows if row.is_finished])
    return [(ExecutionSnapshot.of(row), results.get(row.execution_id)) for row in rows]


def get_finished_result(execution_id: str) -> RetVal | None:
    """The return value of a finished execution, or None while it runs."""
    state = get_state(execution_id)
    if not state.is_finished:
        return None
    record = get_event(state.execution_id, state.corresponding_version)
    if not isinstance(record.event, Finished):
        raise errors.StoreError("cannot get finished event based on t_state version")
    return record.event.retval


def get_finished_results(execution_ids: Iterable[str]) -> dict[str, RetVal]:
    """Return values of those of ``execution_ids`` that are finished (one query)."""
    return {execution_id: value for execution_id, value in _progress(list(execution_ids)).items() if value}


def _progress(execution_ids: list[str]) -> dict[str, RetVal | None]:
    """``{id: return value, or None while it runs}`` of those of ``execution_ids`` that
    exist, in one query per 500 ids (a waiter asks at every wake-up: a fixed statement)."""
    out = {}
    for start in range(0, len(execution_ids), 500):
        chunk = execution_ids[start : start + 500]
        source, params = rows_by_key("t_state", "s", "execution_id", chunk)
        with connection.cursor() as cursor:
            cursor.execute(_PROGRESS_SQL.format(source=source), params)
            for execution_id, json_value in cursor.fetchall():
                out[execution_id] = (
                    retval_from_json(json_column(json_value)[Finished.VARIANT]["retval"]) if json_value else None
                )
    return out


# The result in a subquery of its own: read by the log's key whatever the plan was made
# from (D87).
_PROGRESS_SQL = """
SELECT s.execution_id, CASE WHEN s.state = 'finished' THEN (
    SELECT f.json_value FROM t_execution_log f
    WHERE f.execution_id = s.execution_id AND f.version = s.corresponding_version
) END
FROM {source}
"""


def wait_for_finished_result(
    execution_id: str, *, timeout: float | None = None, release_connection: bool = False
) -> RetVal:
    """Block until the execution finishes; ``Timeout`` after ``timeout`` seconds.
    ``release_connection``: as for ``wait_for_finished`` (D100)."""
    execution_id = canonical_id(execution_id)
    results = wait_for_finished([execution_id], timeout=timeout, release_connection=release_connection)
    return results[execution_id]


# A wait that gives its connection back keeps it this long first: a result that comes
# sooner costs no reconnect (nor the connection's prepared statements, D71) (D100).
HOLD_CONNECTION_SECONDS = 0.1
# How often a wait re-reads the tables without being told to: every second while it
# holds its connection; every 5 s once it gave it back (a lost notification costs that
# much latency; the LISTEN session says when it reconnected).
RECHECK_SECONDS = 1.0
RELEASED_RECHECK_SECONDS = 5.0


def wait_for_finished(
    execution_ids: Iterable[str],
    *,
    timeout: float | None = None,
    on_progress=None,
    release_connection: bool = False,
) -> dict[str, RetVal]:
    """Block until all of ``execution_ids`` finish and return their values.

    Woken by ``obelisk_finished`` notifications (LISTEN/NOTIFY on PostgreSQL), re-checking
    the tables at least every second. ``on_progress(done, total)`` is called as results
    arrive. ``Timeout`` lists how many are still running.

    ``release_connection`` (on PostgreSQL, outside a transaction): after the first
    ``HOLD_CONNECTION_SECONDS`` this thread's connection is closed before each block, so a
    long poll holds none while it waits; it waits on the process's one LISTEN session and
    reads again only when a notification names an execution without its value, or the
    session reconnected, or every ``RELEASED_RECHECK_SECONDS`` (D100).
    """
    remaining = {canonical_id(execution_id) for execution_id in execution_ids}
    total = len(remaining)
    deadline = None if timeout is None else time.monotonic() + timeout
    release_after = (
        time.monotonic() + HOLD_CONNECTION_SECONDS
        if release_connection and notify.is_postgres() and not connection.in_atomic_block
        else None
    )
    recheck = RECHECK_SECONDS if release_after is None else RELEASED_RECHECK_SECONDS
    results: dict[str, RetVal] = {}
    with notify.Listener([notify.FINISHED]) as listener:
        progress = _progress(list(remaining))
        missing = remaining - progress.keys()
        if missing:
            raise errors.NotFound(f"execution `{min(missing)}` not found")
        found = {execution_id: value for execution_id, value in progress.items() if value is not None}
        last_full_check = time.monotonic()
        while True:
            results.update(found)
            remaining -= found.keys()
            if found and on_progress:
                on_progress(len(results), total)
            if not remaining:
                return results
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise errors.Timeout(f"{len(remaining)} of {total} executions still running after {timeout} s")
            wait = recheck if deadline is None else min(recheck, deadline - now)
            if release_after is not None:
                if now >= release_after:
                    connection.close()
                else:
                    wait = min(wait, release_after - now)
            found, named, everything = _woken_by(listener.wait(wait), remaining)
            if everything or time.monotonic() - last_full_check >= recheck or not notify.is_postgres():
                candidates = remaining - found.keys()
                last_full_check = time.monotonic()
            else:
                candidates = named - found.keys()
            if candidates:
                found.update(get_finished_results(candidates))


def _woken_by(notes: list[notify.Notification], remaining: set[str]) -> tuple[dict[str, RetVal], set[str], bool]:
    """What ``obelisk_finished`` notifications say of ``remaining``: the values they carry
    (a short result comes with its notification), the ids they name, and whether one named
    nothing (the LISTEN session reconnected: anything may have finished meanwhile)."""
    found, named, everything = {}, set(), False
    for note in notes:
        everything = everything or not note.items
        for execution_id, value in map(notify.parse_finished_item, note.items):
            if execution_id in remaining:
                named.add(execution_id)
                if value is not None:
                    found[execution_id] = retval_from_json(value)
    return found, named, everything
