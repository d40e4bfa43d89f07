"""Reading executions, events and responses; waiting for results (spec 000 §7.3, §7.4)."""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime

from django.db import transaction
from django.db.models import Max, Q

from executions import errors, notify
from executions.events import (
    Created,
    Finished,
    HistoryEventRecord,
    RetVal,
    canonical_json,
    retval_from_json,
    storable_text,
)
from executions.models import (
    Backtrace,
    ExecutionBacktrace,
    ExecutionEvent,
    ExecutionState,
    JoinSetResponse,
    LogEntry,
)
from executions.store.common import _eid, _record, _snapshot
from executions.store.datatypes import EventRecord, ExecutionLog, Response


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
    execution_id = _eid(execution_id)
    rows = [
        LogEntry(execution_id=execution_id, run_id=run_id, created_at=at, level=level, message=storable_text(message))
        for at, level, message in entries
    ] + [
        LogEntry(execution_id=execution_id, run_id=run_id, created_at=at, stream_type=stream, payload=payload)
        for at, stream, payload in streams
    ]
    if rows:
        LogEntry.objects.bulk_create(rows)
    return len(rows)


def append_backtrace(
    execution_id: str, component_id: dict, version_min_including: int, version_max_excluding: int, frames: list
) -> str:
    """Store the stack that wrote events ``[min, max)`` (a workflow's blocking call),
    deduplicated by its hash (spec 000 §2.5, §3.6); returns the hash. Best effort."""
    execution_id = _eid(execution_id)
    digest = "01" + hashlib.sha256(canonical_json(frames).encode()).hexdigest()
    with transaction.atomic():
        Backtrace.objects.get_or_create(backtrace_hash=digest, defaults={"frames": frames})
        ExecutionBacktrace.objects.get_or_create(
            execution_id=execution_id,
            version_min_including=version_min_including,
            version_max_excluding=version_max_excluding,
            defaults={"component_id": component_id, "backtrace_id": digest},
        )
    return digest


def list_backtraces(execution_id: str) -> list[tuple[int, int, list]]:
    """``(version_min_including, version_max_excluding, frames)`` of an execution, in order."""
    execution_id = _eid(execution_id)
    rows = (
        ExecutionBacktrace.objects.filter(execution_id=execution_id)
        .order_by("version_min_including")
        .values_list("version_min_including", "version_max_excluding", "backtrace__frames")
    )
    return [(low, high, frames) for low, high, frames in rows]


def list_logs(execution_id: str, *, after_id: int = 0, limit: int = 100) -> list[LogEntry]:
    return list(LogEntry.objects.filter(execution_id=_eid(execution_id), id__gt=after_id).order_by("id")[:limit])


def get_state(execution_id: str) -> ExecutionState:
    execution_id = _eid(execution_id)
    try:
        return ExecutionState.objects.get(pk=execution_id)
    except ExecutionState.DoesNotExist:
        raise errors.NotFound(f"execution `{execution_id}` not found") from None


def get_event(execution_id: str, version: int) -> EventRecord:
    execution_id = _eid(execution_id)
    row = ExecutionEvent.objects.filter(execution_id=execution_id, version=version).values_list(
        "version", "created_at", "json_value"
    )
    found = list(row)
    if not found:
        raise errors.NotFound(f"execution `{execution_id}` has no event at version {version}")
    return _record(*found[0])


def get_last_event(execution_id: str) -> EventRecord:
    execution_id = _eid(execution_id)
    found = list(
        ExecutionEvent.objects.filter(execution_id=execution_id)
        .order_by("-version")
        .values_list("version", "created_at", "json_value")[:1]
    )
    if not found:
        raise errors.NotFound(f"execution `{execution_id}` not found")
    return _record(*found[0])


def get_created(execution_id: str) -> Created:
    return get_event(execution_id, 0).event


def get(execution_id: str) -> ExecutionLog:
    """State, every event and every response, read from one snapshot."""
    execution_id = _eid(execution_id)
    with _snapshot():
        state = get_state(execution_id)
        events = [
            _record(*row)
            for row in ExecutionEvent.objects.filter(execution_id=execution_id)
            .order_by("version")
            .values_list("version", "created_at", "json_value")
        ]
        responses = _responses_of([execution_id]).get(execution_id, [])
    return ExecutionLog(state, events, responses)


def list_events(execution_id: str, *, from_version: int = 0, limit: int = 100) -> tuple[list[EventRecord], int]:
    """Events with ``version >= from_version``, ascending, and the highest version."""
    execution_id = _eid(execution_id)
    with _snapshot():
        max_version = ExecutionEvent.objects.filter(execution_id=execution_id).aggregate(m=Max("version"))["m"]
        if max_version is None:
            raise errors.NotFound(f"execution `{execution_id}` not found")
        events = [
            _record(*row)
            for row in ExecutionEvent.objects.filter(execution_id=execution_id, version__gte=from_version)
            .order_by("version")
            .values_list("version", "created_at", "json_value")[:limit]
        ]
    return events, max_version


def list_responses(execution_id: str, *, after_seq: int = 0, limit: int | None = 100) -> tuple[list[Response], int]:
    """Responses with ``seq > after_seq`` in ``seq`` order, and the highest ``seq`` (0 if none)."""
    execution_id = _eid(execution_id)
    with _snapshot():
        max_seq = JoinSetResponse.objects.filter(execution_id=execution_id).aggregate(m=Max("seq"))["m"] or 0
        responses = _responses_of([execution_id], after_seq=after_seq, limit=limit).get(execution_id, [])
    return responses, max_seq


def responses_after(execution_id: str, after_seq: int) -> list[Response]:
    """The responses with ``seq > after_seq``, in order: what a waiting workflow run asks for
    each time it wakes (two small queries; no snapshot needed, ``seq`` only grows)."""
    return _responses_of([_eid(execution_id)], after_seq=after_seq).get(_eid(execution_id), [])


def _histories(execution_ids: list[str]) -> dict[str, list[EventRecord]]:
    out: dict[str, list[EventRecord]] = defaultdict(list)
    rows = (
        ExecutionEvent.objects.filter(execution_id__in=execution_ids, variant=HistoryEventRecord.VARIANT)
        .order_by("execution_id", "version")
        .values_list("execution_id", "version", "created_at", "json_value")
    )
    for execution_id, version, created_at, json_value in rows:
        out[execution_id].append(_record(version, created_at, json_value))
    return out


def _responses_of(
    execution_ids: list[str], *, after_seq: int = 0, limit: int | None = None
) -> dict[str, list[Response]]:
    query = JoinSetResponse.objects.filter(execution_id__in=execution_ids, seq__gt=after_seq).order_by(
        "execution_id", "seq"
    )
    if limit is not None:
        query = query[:limit]
    rows = list(query)
    children = [r.child_execution_id for r in rows if r.child_execution_id]
    retvals = {}
    if children:
        for child_id, version, json_value in ExecutionEvent.objects.filter(
            execution_id__in=children, variant=Finished.VARIANT
        ).values_list("execution_id", "version", "json_value"):
            retvals[(child_id, version)] = retval_from_json(json_value[Finished.VARIANT]["retval"])
    out: dict[str, list[Response]] = defaultdict(list)
    for r in rows:
        out[r.execution_id].append(
            Response(
                seq=r.seq,
                created_at=r.created_at,
                join_set_id=r.join_set_id,
                delay_id=r.delay_id,
                delay_success=r.delay_success,
                child_execution_id=r.child_execution_id,
                finished_version=r.finished_version,
                child_retval=retvals.get((r.child_execution_id, r.finished_version)),
            )
        )
    return out


def get_tree(execution_id: str) -> list[tuple[ExecutionState, RetVal | None]]:
    """An execution and every execution started in its join sets, at any depth, each with
    its result (None while it runs), in id order (a parent before its children)."""
    execution_id = _eid(execution_id)
    with _snapshot():
        rows = list(
            ExecutionState.objects.filter(Q(pk=execution_id) | Q(execution_id__startswith=execution_id + ".")).order_by(
                "execution_id"
            )
        )
        if not rows:
            raise errors.NotFound(f"execution `{execution_id}` not found")
        results = get_finished_results([row.execution_id for row in rows if row.is_finished])
    return [(row, results.get(row.execution_id)) for row in rows]


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
    rows = ExecutionEvent.objects.filter(execution_id__in=list(execution_ids), variant=Finished.VARIANT)
    return {
        execution_id: retval_from_json(json_value[Finished.VARIANT]["retval"])
        for execution_id, json_value in rows.values_list("execution_id", "json_value")
    }


def wait_for_finished_result(execution_id: str, *, timeout: float | None = None) -> RetVal:
    """Block until the execution finishes; ``Timeout`` after ``timeout`` seconds."""
    execution_id = _eid(execution_id)
    results = wait_for_finished([execution_id], timeout=timeout)
    return results[execution_id]


def wait_for_finished(
    execution_ids: Iterable[str],
    *,
    timeout: float | None = None,
    on_progress=None,
) -> dict[str, RetVal]:
    """Block until all of ``execution_ids`` finish and return their values.

    Woken by ``obelisk_finished`` notifications (LISTEN/NOTIFY on PostgreSQL), re-checking
    the tables at least every second. ``on_progress(done, total)`` is called as results
    arrive. ``Timeout`` lists how many are still running.
    """
    remaining = {_eid(execution_id) for execution_id in execution_ids}
    _require_existing(remaining)
    total = len(remaining)
    deadline = None if timeout is None else time.monotonic() + timeout
    results: dict[str, RetVal] = {}
    with notify.Listener([notify.FINISHED]) as listener:
        candidates = set(remaining)
        last_full_check = time.monotonic()
        while True:
            found = _finished_among(candidates)
            results.update(found)
            remaining -= found.keys()
            if found and on_progress:
                on_progress(len(results), total)
            if not remaining:
                return results
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise errors.Timeout(f"{len(remaining)} of {total} executions still running after {timeout} s")
            wait = 1.0 if deadline is None else min(1.0, deadline - now)
            notes = listener.wait(wait)
            if time.monotonic() - last_full_check >= 1.0 or not notify.is_postgres():
                candidates = set(remaining)
                last_full_check = time.monotonic()
            else:
                candidates = remaining.intersection(item for note in notes for item in note.items)


def _require_existing(ids: set[str]) -> None:
    ids = list(ids)
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        found = set(ExecutionState.objects.filter(pk__in=chunk).values_list("pk", flat=True))
        missing = [execution_id for execution_id in chunk if execution_id not in found]
        if missing:
            raise errors.NotFound(f"execution `{missing[0]}` not found")


def _finished_among(ids: set[str]) -> dict[str, RetVal]:
    found = {}
    chunk = list(ids)
    for start in range(0, len(chunk), 500):
        found.update(get_finished_results(chunk[start : start + 500]))
    return found
