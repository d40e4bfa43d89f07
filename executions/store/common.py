"""Helpers shared by the store's modules: time, ids, transactions, row locks, payload checks,
and the small changes of a locked ``t_state`` row that several writes make (``set_fields``,
``to_pending``, ``notify_pending``, ``check_fence``).

Every name here is public to the store's modules and to no one else: callers outside
the store use ``executions.store``'s ``__all__``.

why: D8, D55, D66, D68"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models.base import ModelState
from django.utils import timezone

from executions import conf, errors, notify
from executions.events import (
    canonical_json,
    check_storable,
    event_from_json,
    json_size,
)
from executions.ids import (
    ExecutionId,
)
from executions.models import (
    Backtrace,
    ExecutionBacktrace,
    ExecutionEvent,
    ExecutionState,
)
from executions.sql import Statements, in_list
from executions.state_machine import Lifecycle, State
from executions.store.datatypes import BlockingStack, EventRecord, Fence


def utc_now(now: datetime | None) -> datetime:
    """A caller's timestamp (now when None): aware, with a date in UTC."""
    if now is None:
        return timezone.now()
    if now.tzinfo is None:
        raise errors.ValidationFailed("timestamps must be timezone-aware")
    return in_utc(now, errors.ValidationFailed("timestamp is out of range: in UTC it must fall in the years 1 to 9999"))


def in_utc(value: datetime, refusal: errors.StoreError) -> datetime:
    """``value`` in UTC; ``refusal`` when it has no UTC date (year 1 at +14:00, year 9999
    at -14:00: ``astimezone`` overflows)."""
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise refusal from None


def canonical_id(execution_id: str | ExecutionId) -> str:
    return str(ExecutionId.parse(execution_id))


@contextlib.contextmanager
def write_transaction():
    """One store operation: atomic, with constraint violations reported as ``Conflict``."""
    try:
        with transaction.atomic():
            yield
    except IntegrityError as error:
        raise errors.Conflict(f"constraint violated: {error}") from error


@contextlib.contextmanager
def read_snapshot():
    """A consistent multi-query read (REPEATABLE READ on PostgreSQL, spec 004 §5.4.19)."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


def load_rows(model, sql: str, params) -> list:
    """Model instances from raw SQL that selects ``model``'s concrete columns in order
    (``columns_of``), with the backend's value converters applied (SQLite keeps datetimes
    as text): what the ORM does per row, without building a query at every call."""
    return [row for row, _ in load_rows_with_extras(model, sql, params)]


def load_rows_with_extras(model, sql: str, params) -> list[tuple]:
    """``load_rows`` for SQL that selects more columns after the model's: ``(instance,
    the rest of the row)`` pairs, the rest as the database returned it."""
    converters = _converters(model, connection.vendor)
    attnames = [field.attname for field in model._meta.concrete_fields]
    width = len(attnames)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        rows = cursor.fetchall()
    out, alias = [], connection.alias
    for row in rows:
        values = list(row[:width])
        for index, col, fns in converters:
            for fn in fns:
                values[index] = fn(values[index], col, connection)
        out.append((_instance(model, dict(zip(attnames, values, strict=True)), loaded_from=alias), row[width:]))
    return out


def new_instance(model, **values):
    """An unsaved ``model`` instance: ``values`` (by attribute name, ``execution_id`` for the
    ``execution`` key), every other concrete field at its default. What ``model(**values)``
    builds, for the store's hot path (see ``_instance``)."""
    static, dynamic = _defaults(model)
    for field in dynamic:
        if field.attname not in values:
            values[field.attname] = field.get_default()
    return _instance(model, {**static, **values})


def _instance(model, values: dict, *, loaded_from: str | None = None):
    """A model instance made without ``Model.__init__``, as ``Model.from_db`` (``loaded_from``
    a database alias) or ``Model(...)`` would make it: ``save()`` and every attribute work the same. Django's
    constructor walks every field and sends two signals (which nothing in the engine
    listens to) for each row: 3.5-5 µs a row against 1.1-1.6 µs here, and an activity's
    run makes three rows (about 4% of a worker's CPU in a drain; docs/benchmarks.md). The
    store's models have no related objects to cache and no deferred fields, so an instance
    is its attribute values and its ``_state``."""
    instance = model.__new__(model)
    instance.__dict__.update(values)
    state = instance._state = ModelState()
    if loaded_from is not None:
        state.adding, state.db = False, loaded_from
    return instance


@functools.cache
def _defaults(model) -> tuple[dict, tuple]:
    """The concrete fields' constant defaults by attribute name, and the fields whose
    default is computed at each call."""
    static, dynamic = {}, []
    for field in model._meta.concrete_fields:
        if field.has_default() and callable(field.default):
            dynamic.append(field)
        else:
            static[field.attname] = field.get_default()
    return static, tuple(dynamic)


@functools.cache
def _converters(model, vendor: str) -> list:
    out = []
    for index, field in enumerate(model._meta.concrete_fields):
        col = field.get_col(model._meta.db_table)
        fns = connection.ops.get_db_converters(col) + field.get_db_converters(connection)
        if fns:
            out.append((index, col, fns))
    return out


def columns_of(model, alias: str | None = None) -> str:
    """The concrete columns of ``model``, in field order, for ``load_rows``."""
    prefix = f"{alias}." if alias else ""
    return ", ".join(prefix + field.column for field in model._meta.concrete_fields)


STATE_COLUMNS = columns_of(ExecutionState)


def rows_for_update(execution_ids, *, then=()) -> dict[str, ExecutionState]:
    """Lock ``t_state`` rows and load them, in one query: ``execution_ids`` in id order,
    then the rows of ``then`` that are not among them, in id order (a group commit's
    executions, then their parents). Every writer locks in this order, children before
    parents, so concurrent batches never deadlock (D68)."""
    ids = list(execution_ids)
    later = sorted(set(then) - set(ids))
    if not ids and not later:
        return {}
    lock = " FOR UPDATE" if connection.features.has_select_for_update else ""
    where, params = in_list(ids + later)
    order = "execution_id"
    if ids and later:  # PostgreSQL locks rows in the order they are sorted
        first, first_params = in_list(ids)
        order, params = f"execution_id {first} DESC, execution_id", params + first_params
    sql = f"SELECT {STATE_COLUMNS} FROM t_state WHERE execution_id {where} ORDER BY {order}{lock}"
    return {row.pk: row for row in load_rows(ExecutionState, sql, params)}


def row_for_update(execution_id: str) -> ExecutionState:
    """Lock and load one row. On PostgreSQL the transaction's ``BEGIN``, which psycopg
    sends before its first statement, goes in one round trip with the lock, as a pipeline
    (D125): every write transaction of one execution starts so."""
    if connection.vendor == "postgresql" and connection.in_atomic_block:
        with connection.connection.pipeline():
            row = rows_for_update([execution_id]).get(execution_id)
    else:
        row = rows_for_update([execution_id]).get(execution_id)
    if row is None:
        raise errors.NotFound(f"execution `{execution_id}` not found")
    return row


def check_payload(what: str, value: Any) -> None:
    """Refuse values that cannot be stored exactly (``UnsupportedValue``: not JSON, NUL,
    lone surrogates, too deeply nested) or are larger than ``MAX_PAYLOAD_BYTES``."""
    check_storable(value, what, max_depth=conf.get("MAX_JSON_DEPTH"))
    size = json_size(value)
    limit = conf.get("MAX_PAYLOAD_BYTES")
    if size > limit:
        raise errors.PayloadTooLarge(what, size, limit)


def millis(value: timedelta) -> int:
    return value // timedelta(milliseconds=1)


STATE_FIELDS = tuple(f.name for f in ExecutionState._meta.concrete_fields)


EVENT_FIELDS = tuple(f.name for f in ExecutionEvent._meta.concrete_fields if f.name != "id")


def json_column(value: Any) -> Any:
    """A JSON column read with a raw cursor: parsed already (psycopg) or text (SQLite)."""
    return json.loads(value) if isinstance(value, (str, bytes)) else value


def event_record(version: int, created_at: datetime, json_value: Any) -> EventRecord:
    return EventRecord(version, created_at, event_from_json(json_value))


def has_unfinished_children(execution_id: str) -> bool:
    """Whether any execution started in a join set of ``execution_id`` (at any depth) runs."""
    return (
        ExecutionState.objects.filter(execution_id__startswith=execution_id + ".")
        .exclude(state=State.FINISHED)
        .exists()
    )


def backtrace_hash(frames: list) -> str:
    """``01`` + SHA-256 of the frames' canonical JSON: equal stacks share one row."""
    return "01" + hashlib.sha256(canonical_json(frames).encode()).hexdigest()


def add_backtrace(statements: Statements, execution_id: str, stack: BlockingStack, low: int, high: int) -> None:
    """The stack that wrote events ``[low, high)``, deduplicated by its hash (spec 000
    §2.5, §3.6), added to the operation's statements: no round trip of its own."""
    digest = backtrace_hash(stack.frames)
    statements.insert(
        Backtrace,
        [Backtrace(backtrace_hash=digest, frames=stack.frames)],
        ("backtrace_hash", "frames"),
        ignore_conflicts=True,
    )
    row = ExecutionBacktrace(
        execution_id=execution_id,
        component_id=stack.component_id,
        version_min_including=low,
        version_max_excluding=high,
        backtrace_id=digest,
    )
    fields = ("execution", "component_id", "version_min_including", "version_max_excluding", "backtrace")
    statements.insert(ExecutionBacktrace, [row], fields, ignore_conflicts=True)


def check_fence(row: ExecutionState, fence: Fence) -> None:
    """``LockLost`` unless ``fence`` is the row's current lock (spec 004 §5.1)."""
    if row.run_id != fence.run_id or row.lock_generation != fence.lock_generation:
        raise errors.LockLost(
            f"execution `{row.execution_id}`: the lock of {fence.run_id} (generation {fence.lock_generation}) "
            f"is not current (holder {row.run_id}, generation {row.lock_generation})"
        )


def set_fields(row: ExecutionState, **values) -> set[str]:
    """Assign ``values`` to ``row``; the names of the fields to save."""
    for name, value in values.items():
        setattr(row, name, value)
    return set(values)


# Columns that describe the current lock or wait: cleared whenever the row leaves it.
NO_LOCK = {"max_retries": None, "retry_exp_backoff_millis": None, "last_lock_version": None, "result_kind": None}
NO_WAIT = {"join_set_id": None, "join_set_closing": None}


PENDING_CLEARS = tuple({**NO_LOCK, **NO_WAIT})  # the columns ``to_pending`` empties


def to_pending(row: ExecutionState, at: datetime) -> set[str]:
    """§6.5 A/B; the holder (``executor_id``/``run_id``) is kept so it can extend its lock."""
    return set_fields(row, state=State.PENDING_AT, pending_expires_finished=at, **NO_LOCK, **NO_WAIT)


def notify_pending(row: ExecutionState, notes: notify.Notes, *, announce_later: bool = True) -> None:
    """Announce a row that became lockable: due now on ``obelisk_pending``, due later on
    ``obelisk_scheduled`` (so brokers recompute their next wake-up).

    ``announce_later=False``: a workflow whose wait was resolved while its run awaits in
    place is due later only at that run's lock expiry, in case the run dies (spec 000 §10
    keep-warm); the run itself goes on, woken by ``obelisk_response``. Brokers look at the
    table at least every half second, long before a lock expires, so waking every broker of
    every cluster for each response to an awaiting workflow bought nothing (D66)."""
    if row.state == State.PENDING_AT and row.lifecycle == Lifecycle.ACTIVE:
        if row.pending_expires_finished <= timezone.now():
            notes.pending_ffqns.add(row.ffqn)
        elif announce_later:
            notes.scheduled = True
