"""The execution store: the only code that writes execution state (spec 000 §6–§7).

Every public function is one database transaction: the log events it appends and the
``t_state`` projection it changes commit together or not at all, and any error leaves the
database as it was. Writers lock the execution's ``t_state`` row first (``SELECT … FOR
UPDATE``; the response path locks the *parent's* row, decision 11), then check, in this
order: the writer's fence (run id + lock generation, spec 004 §5.1), the state machine
(``state_machine.decide``), and the optimistic version fence (``version`` must be
``corresponding_version + 1``).

On SQLite the same code runs inside ``BEGIN IMMEDIATE`` transactions (see settings), which
serialise writers the way the seed's single writer thread does.

Notifications (``executions.notify``) are published inside each transaction and delivered
on commit.
"""

from __future__ import annotations

import base64
import contextlib
import enum
import logging
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.db.models import F, Max, Q
from django.utils import timezone

from executions import conf, errors, notify
from executions.events import (
    CancellationRequested,
    ChildExecutionRequest,
    ComponentId,
    ComponentUpgradeFinished,
    Created,
    DelayRequest,
    Event,
    ExecutionFailure,
    Finished,
    HistoryEventRecord,
    JoinNext,
    JoinNextTry,
    JoinSetCreate,
    JoinSetRequest,
    Locked,
    Paused,
    RetryConfig,
    RetVal,
    Schedule,
    TemporarilyFailed,
    Unlocked,
    Unpaused,
    canonical_json,
    consumes_response,
    event_from_json,
    event_join_set_id,
    event_to_json,
    history_event_type,
    json_size,
    result_kind_of,
    retval_from_json,
    retval_to_json,
)
from executions.ids import (
    DelayId,
    ExecutionId,
    FunctionFqn,
    JoinSetId,
    parse_deployment_id,
    parse_executor_id,
    parse_run_id,
)
from executions.models import Delay, ExecutionEvent, ExecutionState, JoinSetResponse, LogEntry
from executions.state_machine import (
    LEAVES_LOCKED,
    Effect,
    ExpiredLock,
    Lifecycle,
    State,
    check_lock,
    decide,
    event_kind,
    failure_event,
    on_lock_expired,
)

logger = logging.getLogger("obelisk.store")

# ---------------------------------------------------------------------------------------
# Request and result types
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CreateRequest:
    """A new execution. ``parent`` is ``(parent execution id, join set id)`` for a child."""

    execution_id: str
    ffqn: str
    params: list[Any]
    component_id: ComponentId
    deployment_id: str
    scheduled_at: datetime | None = None
    parent: tuple[str, str] | None = None
    metadata: Mapping[str, str] = field(default_factory=dict)
    scheduled_by: str | None = None
    paused: bool = False


@dataclass(frozen=True)
class CreateOutcome:
    next_version: int
    already_existed: bool


@dataclass(frozen=True)
class Fence:
    """Proof that a writer holds the lock: the run id and the lock generation it was given."""

    run_id: str
    lock_generation: int


@dataclass(frozen=True)
class LockTerms:
    """How an executor locks one function: whose component, how it retries, for how long."""

    component_id: ComponentId
    retry_config: RetryConfig
    lock_duration: timedelta


@dataclass(frozen=True)
class EventRecord:
    version: int
    created_at: datetime
    event: Event


@dataclass(frozen=True)
class Response:
    """A join-set response as the parent sees it; ``seq`` is the per-parent cursor."""

    seq: int
    created_at: datetime
    join_set_id: str
    delay_id: str | None = None
    delay_success: bool | None = None
    child_execution_id: str | None = None
    finished_version: int | None = None
    child_retval: RetVal | None = None


@dataclass
class LockedExecution:
    """What a run needs: the call, its fence, and for workflows the history to replay."""

    execution_id: str
    ffqn: str
    params: list[Any]
    metadata: dict[str, str]
    parent: tuple[str, str] | None
    component_type: str
    component_digest: str
    deployment_id: str
    next_version: int
    intermittent_event_count: int
    locked: Locked
    fence: Fence
    history: list[EventRecord] | None = None
    responses: list[Response] | None = None


@dataclass(frozen=True)
class ExecutionLog:
    state: ExecutionState
    events: list[EventRecord]
    responses: list[Response]

    @property
    def next_version(self) -> int:
        return self.state.next_version


@dataclass(frozen=True)
class ExpiredDelay:
    delay_id: str
    execution_id: str
    join_set_id: str
    expires_at: datetime


class CancelOutcome(enum.StrEnum):
    REQUESTED = "cancellation_requested"
    ALREADY_CANCELLING = "already_cancelling"
    ALREADY_CANCELLED = "already_cancelled"
    ALREADY_FINISHED = "already_finished"


class DelayOutcome(enum.StrEnum):
    DELIVERED = "delivered"
    ALREADY_FIRED = "already_fired"
    ALREADY_CANCELLED = "already_cancelled"


@dataclass(frozen=True)
class AttemptFailed:
    """A run's failed attempt, for ``append`` / ``append_many``: the store appends
    ``TemporarilyFailed`` / ``TemporarilyTimedOut`` while the retry policy the execution was
    locked with allows another attempt (counted from the log), otherwise ``final``. Deciding
    in the store, with the store's clock, makes each back-off in the log exact."""

    reason: str
    final: Finished
    detail: str | None = None
    timed_out: bool = False


@dataclass(frozen=True)
class AppendItem:
    """One event for ``append_many``: the executor's result of one run."""

    execution_id: str
    version: int
    event: Event | AttemptFailed
    fence: Fence | None = None


@dataclass(frozen=True)
class ExecutionFilter:
    """Filters of ``list_executions``; statuses are ORed, everything else is ANDed."""

    ffqn_prefix: str | None = None
    execution_id_prefix: str | None = None
    show_derived: bool = False
    hide_finished: bool = False
    deployment_id: str | None = None
    component_digest: str | None = None
    statuses: tuple[str, ...] = ()


STATUS_FILTERS = (
    "pending",
    "scheduled",
    "locked",
    "blocked",
    "paused",
    "cancelling",
    "finished",
    "finished_ok",
    "finished_error",
    "finished_failure",
)


@dataclass(frozen=True)
class Page:
    items: list
    older_cursor: str | None
    newer_cursor: str | None


# ---------------------------------------------------------------------------------------
# Small helpers
# ---------------------------------------------------------------------------------------


def _now(now: datetime | None) -> datetime:
    if now is None:
        return timezone.now()
    if now.tzinfo is None:
        raise errors.ValidationFailed("timestamps must be timezone-aware")
    return now


def _eid(execution_id: str | ExecutionId) -> str:
    return str(ExecutionId.parse(execution_id))


@contextlib.contextmanager
def _write_transaction():
    """One store operation: atomic, with constraint violations reported as ``Conflict``."""
    try:
        with transaction.atomic():
            yield
    except IntegrityError as error:
        raise errors.Conflict(f"constraint violated: {error}") from error


@contextlib.contextmanager
def _snapshot():
    """A consistent multi-query read (REPEATABLE READ on PostgreSQL, spec 004 §5.4.19)."""
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        yield


def _row_for_update(execution_id: str) -> ExecutionState:
    try:
        return ExecutionState.objects.select_for_update().get(pk=execution_id)
    except ExecutionState.DoesNotExist:
        raise errors.NotFound(f"execution `{execution_id}` not found") from None


def _json_payload(what: str, value: Any) -> None:
    """Refuse values that are not JSON or are larger than ``MAX_PAYLOAD_BYTES``."""
    try:
        size = json_size(value)
    except (TypeError, ValueError) as error:
        raise errors.ValidationFailed(f"{what} is not JSON-serialisable: {error}") from None
    limit = conf.get("MAX_PAYLOAD_BYTES")
    if size > limit:
        raise errors.PayloadTooLarge(what, size, limit)


def _millis(value: timedelta) -> int:
    return value // timedelta(milliseconds=1)


# ---------------------------------------------------------------------------------------
# Create
# ---------------------------------------------------------------------------------------


def _created_event(req: CreateRequest, execution_id: ExecutionId, now: datetime) -> Created:
    ffqn = str(FunctionFqn.parse(req.ffqn))
    if not isinstance(req.params, list):
        raise errors.ValidationFailed("params must be a JSON array")
    _json_payload("params", req.params)
    parse_deployment_id(req.deployment_id)
    if not isinstance(req.component_id, ComponentId):
        raise errors.ValidationFailed("component_id must be a ComponentId")
    parent = None
    if execution_id.is_top_level:
        if req.parent is not None:
            raise errors.ValidationFailed("a top-level execution id cannot have a parent")
    else:
        expected_parent, expected_js = execution_id.split_to_parts()
        if req.parent is None or (_eid(req.parent[0]), str(JoinSetId.parse(req.parent[1]))) != (
            str(expected_parent),
            str(expected_js),
        ):
            raise errors.ValidationFailed(
                f"child `{execution_id}` must name its parent `{expected_parent}` and join set `{expected_js}`"
            )
        parent = (str(expected_parent), str(expected_js))
    if req.scheduled_by is not None:
        _eid(req.scheduled_by)
    metadata = dict(req.metadata)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise errors.ValidationFailed("metadata must map strings to strings")
    return Created(
        ffqn=ffqn,
        params=req.params,
        parent=parent,
        scheduled_at=_now(req.scheduled_at) if req.scheduled_at else now,
        component_id=req.component_id,
        deployment_id=req.deployment_id,
        metadata=metadata,
        scheduled_by=req.scheduled_by,
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
    try:
        with transaction.atomic():
            notes = notify.Notes()
            version = _create_in_tx(execution_id, created, req.paused, now, notes)
            notes.publish()
            return CreateOutcome(version, already_existed=False)
    except IntegrityError as error:
        return _existing_create(str(execution_id), created, error)


def create_many(requests: list[CreateRequest], *, now: datetime | None = None) -> list[CreateOutcome]:
    """Create many executions in one transaction (two bulk inserts).

    All or nothing. If an id already exists, falls back to ``create`` one by one, which
    keeps each create idempotent.
    """
    now = _now(now)
    prepared = []
    for req in requests:
        execution_id = ExecutionId.parse(req.execution_id)
        prepared.append((execution_id, _created_event(req, execution_id, now), req.paused))
    if any(paused or created.parent for _, created, paused in prepared):
        return [create(req, now=now) for req in requests]
    try:
        with transaction.atomic():
            notes = notify.Notes()
            rows = [_state_row(execution_id, created, now) for execution_id, created, _ in prepared]
            ExecutionState.objects.bulk_create(rows)
            ExecutionEvent.objects.bulk_create([_created_row(created, row) for (_, created, _), row in zip(prepared, rows)])
            for row in rows:
                _notify_pending(row, notes)
            notes.publish()
    except IntegrityError:
        return [create(req, now=now) for req in requests]
    return [CreateOutcome(1, already_existed=False) for _ in prepared]


def _state_row(execution_id: ExecutionId, created: Created, now: datetime) -> ExecutionState:
    return ExecutionState(
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
    return ExecutionEvent(
        execution_id=row.execution_id,
        version=0,
        created_at=row.created_at,
        json_value=event_to_json(created),
        variant=Created.VARIANT,
        join_set_id=event_join_set_id(created),
    )


def _create_in_tx(execution_id: ExecutionId, created: Created, paused: bool, now: datetime, notes: notify.Notes) -> int:
    if created.parent and not ExecutionState.objects.filter(pk=created.parent[0]).exists():
        # A child's result must reach its parent when it finishes; an orphan never could.
        raise errors.NotFound(f"parent execution `{created.parent[0]}` not found")
    row = _state_row(execution_id, created, now)
    row.save(force_insert=True)
    _created_row(created, row).save(force_insert=True)
    if paused:
        return _append_in_tx(row, 1, Paused(), now, None, notes)
    _notify_pending(row, notes)
    return 1


def _existing_create(execution_id: str, created: Created, error: IntegrityError) -> CreateOutcome:
    try:
        existing = get_created(execution_id)
        state = ExecutionState.objects.get(pk=execution_id)
    except (errors.NotFound, ExecutionState.DoesNotExist):
        raise errors.Conflict(f"cannot create `{execution_id}`: {error}") from error
    if existing.ffqn != created.ffqn or canonical_json(existing.params) != canonical_json(created.params):
        raise errors.Conflict(
            f"execution `{execution_id}` already exists with a different function or parameters"
        )
    return CreateOutcome(state.next_version, already_existed=True)


# ---------------------------------------------------------------------------------------
# Append: the state machine applied to one row
# ---------------------------------------------------------------------------------------


@dataclass
class _Applied:
    event_row: ExecutionEvent
    fields: set[str]
    next_version: int
    after: list = field(default_factory=list)


def _check_fence(row: ExecutionState, fence: Fence) -> None:
    if row.run_id != fence.run_id or row.lock_generation != fence.lock_generation:
        raise errors.LockLost(
            f"execution `{row.execution_id}`: the lock of {fence.run_id} (generation {fence.lock_generation}) "
            f"is not current (holder {row.run_id}, generation {row.lock_generation})"
        )


def _to_pending(row: ExecutionState, at: datetime) -> set[str]:
    row.state = State.PENDING_AT
    row.pending_expires_finished = at
    row.max_retries = None
    row.retry_exp_backoff_millis = None
    row.last_lock_version = None
    row.join_set_id = None
    row.join_set_closing = None
    row.result_kind = None
    return {
        "state",
        "pending_expires_finished",
        "max_retries",
        "retry_exp_backoff_millis",
        "last_lock_version",
        "join_set_id",
        "join_set_closing",
        "result_kind",
    }


def _notify_pending(row: ExecutionState, notes: notify.Notes) -> None:
    """Announce a row that became lockable: due now on ``obelisk_pending``, due later as a
    timer (so brokers recompute their next wake-up)."""
    if row.state == State.PENDING_AT and row.lifecycle == Lifecycle.ACTIVE:
        if row.pending_expires_finished <= timezone.now():
            notes.pending_ffqns.add(row.ffqn)
        else:
            notes.timers = True


def _apply(
    row: ExecutionState,
    version: int,
    event: Event,
    now: datetime,
    fence: Fence | None,
    notes: notify.Notes,
) -> _Applied:
    """Validate ``event`` against ``row`` and compute the write, changing ``row`` in memory.

    Everything that can reject the event runs before ``row`` or ``notes`` change. Only
    reads the database (join-next counting). The caller inserts ``event_row``, saves
    ``fields`` of ``row`` and runs ``after`` (writes to other tables), in that order.
    """
    if fence is not None:
        _check_fence(row, fence)
    if isinstance(event, AttemptFailed):
        event = _failure_event(row, event, now)
    event = _bounded_failure(event)
    kind = event_kind(event)
    extending = False
    if kind == "locked":  # spec 000 §6.3: the lock rules, then the version
        if event.lock_expires_at <= now:
            raise errors.ValidationFailed("invalid expiry date")
        effect = decide(kind, row.state, row.lifecycle)
        extending = check_lock(
            state=row.state,
            scheduled_at=row.pending_expires_finished,
            holder=(row.executor_id, row.run_id),
            locked=event,
            created_at=now,
        )
        _check_version(row, version)
    elif kind == "created" or row.state == State.FINISHED:
        effect = decide(kind, row.state, row.lifecycle)  # always raises
    else:  # spec 000 §6.2: the version, then the event's own preconditions
        _check_version(row, version)
        effect = decide(kind, row.state, row.lifecycle)
    _validate(row, effect, event)

    fields = {"corresponding_version", "updated_at"}
    after: list = []
    next_version = version + 1
    # An event written without the holder's fence that takes the row out of `locked` (the
    # timer sweep, the cancellation driver, pause) revokes the holder's lock.
    # The holder no longer holds anything: it cannot extend or write as the holder again.
    if fence is None and row.state == State.LOCKED and effect in LEAVES_LOCKED:
        row.lock_generation += 1
        row.executor_id = None
        row.run_id = None
        fields |= {"lock_generation", "executor_id", "run_id"}

    if effect is Effect.LOCK:
        event = _apply_lock(row, event, version, extending)
        fields |= {
            "state", "pending_expires_finished", "last_lock_version", "executor_id", "run_id",
            "max_retries", "retry_exp_backoff_millis", "deployment_id", "component_id_input_digest",
            "join_set_id", "join_set_closing", "result_kind", "lock_generation",
        }  # fmt: skip
    elif effect is Effect.TO_PENDING:
        fields |= _to_pending(row, event.unlocked_at)
        _notify_pending(row, notes)
    elif effect is Effect.RETRY:
        fields |= _to_pending(row, event.backoff_expires_at)
        row.intermittent_event_count += 1
        fields.add("intermittent_event_count")
        _notify_pending(row, notes)
    elif effect is Effect.JOIN_NEXT:
        fields |= _apply_join_next(row, event.event, notes)
    elif effect is Effect.DELAY:
        after.append(_delay_inserter(row, event.event))
        notes.timers = True
    elif effect in (Effect.PAUSE, Effect.UNPAUSE, Effect.CANCEL):
        row.lifecycle = {
            Effect.PAUSE: Lifecycle.PAUSED,
            Effect.UNPAUSE: Lifecycle.ACTIVE,
            Effect.CANCEL: Lifecycle.CANCELLING,
        }[effect]
        fields.add("lifecycle")
        if effect is Effect.UNPAUSE:
            _notify_pending(row, notes)
        if effect is Effect.CANCEL:
            notes.cancelled.append(row.execution_id)
    elif effect is Effect.UPGRADE:
        fields |= _apply_upgrade(row, event)
    elif effect is Effect.FINISH:
        fields |= _apply_finish(row, event, version, now, notes, after)
        next_version = version

    row.corresponding_version = version
    row.updated_at = now
    event_row = ExecutionEvent(
        execution_id=row.execution_id,
        version=version,
        created_at=now,
        json_value=event_to_json(event),
        variant=event.VARIANT,
        join_set_id=event_join_set_id(event),
        history_event_type=history_event_type(event),
        consumes_response=consumes_response(event),
    )
    return _Applied(event_row, fields, next_version, after)


def _failure_event(row: ExecutionState, failure: AttemptFailed, now: datetime) -> Event:
    """Retry or finish, by the retry policy of the current lock (``t_state`` columns)."""
    if row.state != State.LOCKED:
        return failure.final  # no lock, no policy: the attempt's end is final
    return failure_event(
        intermittent_event_count=row.intermittent_event_count,
        max_retries=row.max_retries,
        backoff=timedelta(milliseconds=row.retry_exp_backoff_millis or 0),
        now=now,
        timed_out=failure.timed_out,
        reason=failure.reason,
        detail=failure.detail,
        final=failure.final,
    )


def _check_version(row: ExecutionState, version: int) -> None:
    expected = row.corresponding_version + 1
    if version != expected:
        raise errors.VersionConflict(expected, version)


def _validate(row: ExecutionState, effect: Effect, event: Event) -> None:
    """Event-specific checks: ids that must belong to this execution, payload sizes."""
    if effect is Effect.LOCK:
        parse_executor_id(event.executor_id)
        parse_run_id(event.run_id)
        parse_deployment_id(event.deployment_id)
    elif effect is Effect.FINISH:
        _json_payload("return value", retval_to_json(event.retval))
    elif effect is Effect.JOIN_NEXT:
        JoinSetId.parse(event.event.join_set_id)
    elif effect in (Effect.DELAY, Effect.BUMP):
        _validate_history_event(row, event.event)


def _apply_lock(row: ExecutionState, event: Locked, version: int, extending: bool) -> Locked:
    if not extending:
        row.lock_generation += 1
    row.state = State.LOCKED
    row.pending_expires_finished = event.lock_expires_at
    row.last_lock_version = version
    row.executor_id = event.executor_id
    row.run_id = event.run_id
    row.max_retries = event.retry_config.max_retries
    row.retry_exp_backoff_millis = _millis(event.retry_config.retry_exp_backoff)
    row.deployment_id = event.deployment_id
    row.component_id_input_digest = event.component_id.component_digest
    row.join_set_id = None
    row.join_set_closing = None
    row.result_kind = None
    return event.model_copy(update={"lock_generation": row.lock_generation})


def _bounded_failure(event: Event) -> Event:
    """Keep a failure's text within bounds: a long reason or traceback is cut, never
    refused, so an attempt's outcome is always recorded."""
    limit = conf.get("MAX_ERROR_DETAIL_CHARS")

    def cut(reason: str | None, detail: str | None) -> tuple[str | None, str | None]:
        if reason is not None and len(reason) > limit:
            reason = reason[:limit] + "…"
        if detail is not None and len(detail) > limit:
            detail = "…" + detail[-limit:]
        return reason, detail

    if isinstance(event, TemporarilyFailed):
        reason, detail = cut(event.reason, event.detail)
        return event.model_copy(update={"reason": reason, "detail": detail})
    if isinstance(event, Finished) and isinstance(event.retval, ExecutionFailure):
        reason, detail = cut(event.retval.reason, event.retval.detail)
        return event.model_copy(update={"retval": ExecutionFailure(event.retval.kind, reason, detail)})
    return event


def _count_consumed(execution_id: str, join_set_id: str) -> int:
    return ExecutionEvent.objects.filter(
        execution_id=execution_id, join_set_id=join_set_id, consumes_response=True
    ).count()


def _nth_response_time(execution_id: str, join_set_id: str, n: int) -> datetime | None:
    times = JoinSetResponse.objects.filter(execution_id=execution_id, join_set_id=join_set_id).order_by("seq")
    found = list(times.values_list("created_at", flat=True)[n - 1 : n])
    return found[0] if found else None


def _apply_join_next(row: ExecutionState, join_next: JoinNext, notes: notify.Notes) -> set[str]:
    """The n-th consuming join-next of a join set waits for its n-th response (spec 000 §5.2)."""
    n = _count_consumed(row.execution_id, join_next.join_set_id) + 1
    response_at = _nth_response_time(row.execution_id, join_next.join_set_id, n)
    if response_at is not None:
        fields = _to_pending(row, max(join_next.run_expires_at, response_at))
        _notify_pending(row, notes)
        return fields
    row.state = State.BLOCKED_BY_JOIN_SET
    row.pending_expires_finished = join_next.run_expires_at
    row.join_set_id = join_next.join_set_id
    row.join_set_closing = join_next.closing
    row.max_retries = None
    row.retry_exp_backoff_millis = None
    row.last_lock_version = None
    row.result_kind = None
    return {
        "state", "pending_expires_finished", "join_set_id", "join_set_closing",
        "max_retries", "retry_exp_backoff_millis", "last_lock_version", "result_kind",
    }  # fmt: skip


def _delay_inserter(row: ExecutionState, request: JoinSetRequest):
    delay: DelayRequest = request.request

    def insert():
        Delay.objects.create(
            delay_id=delay.delay_id,
            execution_id=row.execution_id,
            join_set_id=request.join_set_id,
            expires_at=delay.expires_at,
            is_paused=delay.paused,
        )

    return insert


def _validate_history_event(row: ExecutionState, event) -> None:
    if isinstance(event, JoinSetCreate):
        JoinSetId.parse(event.join_set_id)
    elif isinstance(event, JoinSetRequest) and isinstance(event.request, DelayRequest):
        delay = DelayId.parse(event.request.delay_id)
        if str(delay.execution_id) != row.execution_id or str(delay.join_set_id) != event.join_set_id:
            raise errors.ValidationFailed(
                f"delay `{delay}` does not belong to join set `{event.join_set_id}` of `{row.execution_id}`"
            )
    elif isinstance(event, JoinSetRequest) and isinstance(event.request, ChildExecutionRequest):
        child = ExecutionId.parse(event.request.child_execution_id)
        if child.is_top_level or child.split_to_parts() != (
            ExecutionId.parse(row.execution_id),
            JoinSetId.parse(event.join_set_id),
        ):
            raise errors.ValidationFailed(
                f"`{child}` is not a child of `{row.execution_id}` in join set `{event.join_set_id}`"
            )
        FunctionFqn.parse(event.request.target_ffqn)
        _json_payload("params", event.request.params)
    elif isinstance(event, JoinNextTry) and event.outcome == "found":
        n = _count_consumed(row.execution_id, event.join_set_id) + 1
        if _nth_response_time(row.execution_id, event.join_set_id, n) is None:
            raise errors.ValidationFailed(
                f"join_next_try on `{event.join_set_id}` found response #{n}, which does not exist"
            )
    elif isinstance(event, Schedule):
        _eid(event.execution_id)


def _apply_upgrade(row: ExecutionState, event: ComponentUpgradeFinished) -> set[str]:
    if event.succeeded:
        row.component_id_input_digest = event.component_digest
        row.deployment_id = event.deployment_id
        row.incompatible_digest = None
        return {"component_id_input_digest", "deployment_id", "incompatible_digest"}
    row.incompatible_digest = event.component_digest
    return {"incompatible_digest"}


def _apply_finish(row, event: Finished, version: int, now: datetime, notes: notify.Notes, after: list) -> set[str]:
    row.state = State.FINISHED
    row.pending_expires_finished = now
    row.last_lock_version = None
    row.max_retries = None
    row.retry_exp_backoff_millis = None
    row.executor_id = None
    row.run_id = None
    row.join_set_id = None
    row.join_set_closing = None
    row.lifecycle = Lifecycle.ACTIVE
    row.result_kind = result_kind_of(event.retval)
    notes.finished.append(row.execution_id)
    if not row.is_top_level:
        # A child's result always reaches its parent in the same transaction (decision D4).
        parent, join_set = ExecutionId.parse(row.execution_id).split_to_parts()
        after.append(
            lambda: _deliver_response(
                str(parent), str(join_set), now, notes, child_id=row.execution_id, finished_version=version
            )
        )
    return {
        "state", "pending_expires_finished", "last_lock_version", "max_retries", "retry_exp_backoff_millis",
        "executor_id", "run_id", "join_set_id", "join_set_closing", "lifecycle", "result_kind",
    }  # fmt: skip


def _write_applied(row: ExecutionState, applied: _Applied) -> None:
    applied.event_row.save(force_insert=True)
    row.save(update_fields=sorted(applied.fields))
    for action in applied.after:
        action()


def _append_in_tx(
    row: ExecutionState, version: int, event: Event, now: datetime, fence: Fence | None, notes: notify.Notes
) -> int:
    applied = _apply(row, version, event, now, fence, notes)
    _write_applied(row, applied)
    return applied.next_version


def append(
    execution_id: str,
    version: int,
    event: Event | AttemptFailed,
    *,
    fence: Fence | None = None,
    now: datetime | None = None,
) -> int:
    """Append one event at ``version`` and update the projection (spec 000 §6.2).

    Returns the next version (for ``Finished``: its own version). ``fence`` is the writer's
    lock; pass it whenever the writer is a run.
    """
    now = _now(now)
    execution_id = _eid(execution_id)
    with _write_transaction():
        row = _row_for_update(execution_id)
        notes = notify.Notes()
        next_version = _append_in_tx(row, version, event, now, fence, notes)
        notes.publish()
    return next_version


def append_batch(
    execution_id: str,
    version: int,
    events: list[Event],
    *,
    fence: Fence | None = None,
    now: datetime | None = None,
) -> int:
    """Append several events to one execution, in order, all or nothing."""
    if not events:
        raise errors.ValidationFailed("batch cannot be empty")
    now = _now(now)
    execution_id = _eid(execution_id)
    with _write_transaction():
        row = _row_for_update(execution_id)
        notes = notify.Notes()
        for event in events:
            version = _append_in_tx(row, version, event, now, fence, notes)
        notes.publish()
    return version


def append_batch_create_new_execution(
    execution_id: str,
    version: int,
    events: list[Event],
    children: list[CreateRequest],
    *,
    fence: Fence | None = None,
    now: datetime | None = None,
) -> int:
    """Append events to a parent and create its children (or scheduled executions) together."""
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
        notes = notify.Notes()
        for event in events:
            version = _append_in_tx(row, version, event, now, fence, notes)
        for child_id, created, paused in prepared:
            _create_in_tx(child_id, created, paused, now, notes)
        notes.publish()
    return version


def append_many(items: list[AppendItem], *, now: datetime | None = None) -> list[int | errors.StoreError]:
    """Append one event to each of many executions in one transaction (group commit).

    Each item succeeds or fails on its own: the result list holds the next version, or the
    error that rejected that item (nothing of it written). Rows are locked in id order, so
    concurrent batches cannot deadlock. An execution may appear only once.
    """
    now = _now(now)
    ids = [_eid(item.execution_id) for item in items]
    if len(set(ids)) != len(ids):
        raise errors.ValidationFailed("append_many takes each execution at most once")
    results: list[int | errors.StoreError] = []
    with _write_transaction():
        rows = {row.pk: row for row in ExecutionState.objects.select_for_update().filter(pk__in=ids).order_by("pk")}
        notes = notify.Notes()
        applied: list[tuple[ExecutionState, _Applied]] = []
        for execution_id, item in zip(ids, items):
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
        if applied:
            ExecutionEvent.objects.bulk_create([done.event_row for _, done in applied])
            _update_rows([(row, done.fields) for row, done in applied])
            _lock_parents_in_order([row for row, done in applied if done.after and not row.is_top_level])
            for _, done in applied:
                for action in done.after:
                    action()
        notes.publish()
    return results


def _update_rows(changes: list[tuple[ExecutionState, set[str]]]) -> None:
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
        ExecutionState.objects.filter(pk__in=pks).update(
            corresponding_version=F("corresponding_version") + 1, **dict(values)
        )


def _lock_parents_in_order(children: list[ExecutionState]) -> None:
    """Lock the parents a batch will respond to in id order, so batches never deadlock."""
    parents = sorted({str(ExecutionId.parse(child.execution_id).split_to_parts()[0]) for child in children})
    if parents:
        list(ExecutionState.objects.select_for_update().filter(pk__in=parents).order_by("pk").values_list("pk"))


def _row_values(row: ExecutionState) -> dict:
    return {f.attname: getattr(row, f.attname) for f in row._meta.concrete_fields}


def _restore_row(row: ExecutionState, values: dict) -> None:
    for name, value in values.items():
        setattr(row, name, value)


# ---------------------------------------------------------------------------------------
# Join-set responses and delays
# ---------------------------------------------------------------------------------------


def _deliver_response(
    parent_id: str,
    join_set_id: str,
    now: datetime,
    notes: notify.Notes,
    *,
    child_id: str | None = None,
    finished_version: int | None = None,
    delay_id: str | None = None,
    delay_success: bool | None = None,
) -> int:
    """Insert a response with the parent's next ``seq`` and unblock the parent if it waits
    for this join set (spec 000 §6.4). The parent's row is locked first (decision 11)."""
    parent = _row_for_update(parent_id)
    seq = (JoinSetResponse.objects.filter(execution_id=parent_id).aggregate(m=Max("seq"))["m"] or 0) + 1
    JoinSetResponse.objects.create(
        created_at=now,
        execution_id=parent_id,
        join_set_id=join_set_id,
        delay_id=delay_id,
        delay_success=delay_success,
        child_execution_id=child_id,
        finished_version=finished_version,
        seq=seq,
    )
    if (
        parent.state == State.BLOCKED_BY_JOIN_SET
        and parent.join_set_id == join_set_id
        and parent.lifecycle != Lifecycle.CANCELLING
    ):
        fields = _to_pending(parent, max(parent.pending_expires_finished, now))
        parent.updated_at = now
        parent.save(update_fields=sorted(fields | {"updated_at"}))
        _notify_pending(parent, notes)
    if delay_id is not None:
        Delay.objects.filter(delay_id=delay_id).delete()
    notes.responses.append(parent_id)
    return seq


def append_delay_response(
    delay_id: str, success: bool, *, now: datetime | None = None
) -> DelayOutcome:
    """Deliver a delay's response: fired (``success``) or cancelled; idempotent per delay."""
    now = _now(now)
    delay = DelayId.parse(delay_id)
    execution_id, join_set_id = str(delay.execution_id), str(delay.join_set_id)
    with _write_transaction():
        _row_for_update(execution_id)
        previous = list(
            JoinSetResponse.objects.filter(execution_id=execution_id, delay_id=str(delay)).values_list(
                "delay_success", flat=True
            )
        )
        if previous:
            return DelayOutcome.ALREADY_FIRED if previous[0] else DelayOutcome.ALREADY_CANCELLED
        if not Delay.objects.filter(delay_id=str(delay)).exists():
            raise errors.NotFound(f"delay `{delay}` was never requested")
        notes = notify.Notes()
        _deliver_response(execution_id, join_set_id, now, notes, delay_id=str(delay), delay_success=success)
        notes.publish()
    return DelayOutcome.DELIVERED


def append_response_for_test(parent_id: str, join_set_id: str, child_id: str, finished_version: int, *, now=None) -> int:
    """Deliver a child response directly (tests only; a real child response comes with its
    ``Finished`` event)."""
    now = _now(now)
    with _write_transaction():
        notes = notify.Notes()
        seq = _deliver_response(
            _eid(parent_id), str(JoinSetId.parse(join_set_id)), now, notes,
            child_id=_eid(child_id), finished_version=finished_version,
        )  # fmt: skip
        notes.publish()
    return seq


def pause_delay(delay_id: str) -> None:
    _set_delay_paused(delay_id, True)


def unpause_delay(delay_id: str) -> None:
    _set_delay_paused(delay_id, False)


def _set_delay_paused(delay_id: str, paused: bool) -> None:
    delay = str(DelayId.parse(delay_id))
    with _write_transaction():
        if not Delay.objects.filter(delay_id=delay).update(is_paused=paused):
            raise errors.NotFound(f"delay `{delay}` not found: already fired or cancelled")
        notes = notify.Notes(timers=True)
        notes.publish()


# ---------------------------------------------------------------------------------------
# Locking
# ---------------------------------------------------------------------------------------


def lock_pending(
    functions: Mapping[str, LockTerms],
    *,
    limit: int,
    executor_id: str,
    run_id: str,
    deployment_id: str,
    now: datetime | None = None,
) -> list[LockedExecution]:
    """Lock up to ``limit`` due, active executions of ``functions``, oldest first.

    One transaction: candidates are selected ``FOR UPDATE SKIP LOCKED`` (so concurrent
    executors never wait for or take each other's rows), a ``Locked`` event is inserted for
    each and the projections are updated, each with a new lock generation.
    """
    now = _now(now)
    parse_executor_id(executor_id)
    parse_run_id(run_id)
    parse_deployment_id(deployment_id)
    for ffqn in functions:
        FunctionFqn.parse(ffqn)
    if limit < 1 or not functions:
        return []
    with _write_transaction():
        candidates = list(
            ExecutionState.objects.select_for_update(skip_locked=True)
            .filter(
                state=State.PENDING_AT,
                lifecycle=Lifecycle.ACTIVE,
                pending_expires_finished__lte=now,
                ffqn__in=list(functions),
            )
            .order_by("pending_expires_finished")
            .values_list(
                "execution_id", "ffqn", "corresponding_version", "lock_generation",
                "intermittent_event_count", "component_type",
            )[:limit]
        )  # fmt: skip
        if not candidates:
            return []
        by_ffqn: dict[str, list[tuple]] = defaultdict(list)
        for candidate in candidates:
            by_ffqn[candidate[1]].append(candidate)
        events, locked_events = [], {}
        for ffqn, group in by_ffqn.items():
            terms = functions[ffqn]
            locked = Locked(
                component_id=terms.component_id,
                executor_id=executor_id,
                deployment_id=deployment_id,
                run_id=run_id,
                lock_expires_at=now + terms.lock_duration,
                retry_config=terms.retry_config,
            )
            body = event_to_json(locked)[Locked.VARIANT]
            for execution_id, _, version, generation, _, _ in group:
                locked_events[execution_id] = locked.model_copy(update={"lock_generation": generation + 1})
                events.append(
                    ExecutionEvent(
                        execution_id=execution_id,
                        version=version + 1,
                        created_at=now,
                        json_value={Locked.VARIANT: {**body, "lock_generation": generation + 1}},
                        variant=Locked.VARIANT,
                    )
                )
            ExecutionState.objects.filter(pk__in=[c[0] for c in group]).update(
                state=State.LOCKED,
                corresponding_version=F("corresponding_version") + 1,
                last_lock_version=F("corresponding_version") + 1,
                lock_generation=F("lock_generation") + 1,
                pending_expires_finished=locked.lock_expires_at,
                executor_id=executor_id,
                run_id=run_id,
                max_retries=terms.retry_config.max_retries,
                retry_exp_backoff_millis=_millis(terms.retry_config.retry_exp_backoff),
                deployment_id=deployment_id,
                component_id_input_digest=terms.component_id.component_digest,
                join_set_id=None,
                join_set_closing=None,
                result_kind=None,
                updated_at=now,
            )
        ExecutionEvent.objects.bulk_create(events)
        return _locked_executions(candidates, locked_events, deployment_id)


def _locked_executions(candidates, locked_events: dict[str, Locked], deployment_id: str) -> list[LockedExecution]:
    ids = [c[0] for c in candidates]
    created = dict(ExecutionEvent.objects.filter(execution_id__in=ids, version=0).values_list("execution_id", "json_value"))
    workflows = [c[0] for c in candidates if c[5] == "workflow"]
    histories = _histories(workflows) if workflows else {}
    responses = _responses_of(workflows) if workflows else {}
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
                history=histories.get(execution_id, []) if component_type == "workflow" else None,
                responses=responses.get(execution_id, []) if component_type == "workflow" else None,
            )
        )
    return out


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
    """Lock one execution at ``version`` (a new lock, or an extension by the same run)."""
    now = _now(now)
    execution_id = _eid(execution_id)
    locked = Locked(
        component_id=terms.component_id,
        executor_id=executor_id,
        deployment_id=deployment_id,
        run_id=run_id,
        lock_expires_at=now + terms.lock_duration,
        retry_config=terms.retry_config,
    )
    with _write_transaction():
        row = _row_for_update(execution_id)
        intermittent = row.intermittent_event_count
        notes = notify.Notes()
        applied = _apply(row, version, locked, now, None, notes)
        _write_applied(row, applied)
        candidate = (execution_id, row.ffqn, version - 1, row.lock_generation - 1, intermittent, row.component_type)
        locked = event_from_json(applied.event_row.json_value)
        return _locked_executions([candidate], {execution_id: locked}, deployment_id)[0]


def extend_lock(
    execution_id: str,
    version: int,
    fence: Fence,
    lock_expires_at: datetime,
    *,
    now: datetime | None = None,
) -> int:
    """The holder extends its own lock by appending ``Locked`` again (spec 000 §10)."""
    now = _now(now)
    lock_expires_at = _now(lock_expires_at)
    execution_id = _eid(execution_id)
    with _write_transaction():
        row = _row_for_update(execution_id)
        locked = _last_locked_event(execution_id).model_copy(update={"lock_expires_at": lock_expires_at})
        notes = notify.Notes()
        next_version = _append_in_tx(row, version, locked, now, fence, notes)
        notes.publish()
    return next_version


def _last_locked_event(execution_id: str) -> Locked:
    row = ExecutionEvent.objects.filter(execution_id=execution_id, variant=Locked.VARIANT).order_by("-version").first()
    if row is None:
        raise errors.IllegalState(f"execution `{execution_id}` was never locked")
    return event_from_json(row.json_value)


# ---------------------------------------------------------------------------------------
# Timers: expired locks and due delays (spec 000 §7.3 get_expired_timers, §10)
# ---------------------------------------------------------------------------------------


def get_expired_timers(*, now: datetime | None = None, limit: int = 1000) -> tuple[list[ExpiredDelay], list[ExpiredLock]]:
    """Due, unpaused delays and expired locks (of any lifecycle; see ``on_lock_expired``)."""
    now = _now(now)
    delays = [
        ExpiredDelay(*row)
        for row in Delay.objects.filter(expires_at__lte=now, is_paused=False)
        .order_by("expires_at")
        .values_list("delay_id", "execution_id", "join_set_id", "expires_at")[:limit]
    ]
    locks = [
        _expired_lock(row)
        for row in ExecutionState.objects.filter(state=State.LOCKED, pending_expires_finished__lte=now).order_by(
            "pending_expires_finished"
        )[:limit]
    ]
    return delays, locks


def _expired_lock(row: ExecutionState) -> ExpiredLock:
    return ExpiredLock(
        execution_id=row.execution_id,
        locked_at_version=row.last_lock_version,
        next_version=row.corresponding_version + 1,
        intermittent_event_count=row.intermittent_event_count,
        max_retries=row.max_retries,
        retry_exp_backoff=timedelta(milliseconds=row.retry_exp_backoff_millis or 0),
        executor_id=row.executor_id,
        run_id=row.run_id,
        lifecycle=row.lifecycle,
    )


def next_timer_at() -> datetime | None:
    """When the earliest lock expires or delay is due: the sweep's next wake-up."""
    first_lock = (
        ExecutionState.objects.filter(state=State.LOCKED)
        .order_by("pending_expires_finished")
        .values_list("pending_expires_finished", flat=True)
        .first()
    )
    first_delay = (
        Delay.objects.filter(is_paused=False).order_by("expires_at").values_list("expires_at", flat=True).first()
    )
    times = [t for t in (first_lock, first_delay) if t is not None]
    return min(times) if times else None


def expire_lock(execution_id: str, *, now: datetime | None = None) -> Event | None:
    """Handle one expired lock: retry, unlock or finish it (``on_lock_expired``).

    Skips (returns None) a row another sweeper holds, or one no longer locked and expired:
    the holder may have finished or extended in the meantime. The appended event revokes the
    holder's lock, so a late write from it fails with ``LockLost``.
    """
    now = _now(now)
    execution_id = _eid(execution_id)
    with _write_transaction():
        row = (
            ExecutionState.objects.select_for_update(skip_locked=True)
            .filter(pk=execution_id, state=State.LOCKED, pending_expires_finished__lte=now)
            .first()
        )
        if row is None:
            return None
        event = on_lock_expired(_expired_lock(row), now)
        notes = notify.Notes()
        _append_in_tx(row, row.corresponding_version + 1, event, now, None, notes)
        notes.publish()
    logger.info("lock of %s expired: %s", execution_id, event.VARIANT)
    return event


def fire_delay(delay_id: str, *, now: datetime | None = None) -> DelayOutcome:
    """The sweep's action for a due delay: deliver its ``DelayFinished`` (success)."""
    return append_delay_response(delay_id, True, now=now)


# ---------------------------------------------------------------------------------------
# Lifecycle: pause, unpause, cancel (spec 000 §7.2, §7.4; decision 14)
# ---------------------------------------------------------------------------------------


def pause_execution(execution_id: str, *, now: datetime | None = None) -> int:
    """Pause a pending or blocked execution. A running workflow is unlocked first (its run
    is fenced out); a running activity cannot be paused, only cancelled."""
    now = _now(now)
    execution_id = _eid(execution_id)
    with _write_transaction():
        row = _row_for_update(execution_id)
        if row.is_finished:
            raise errors.AlreadyFinished(f"execution `{execution_id}` is already finished")
        notes = notify.Notes()
        version = row.corresponding_version + 1
        if row.state == State.LOCKED and row.lifecycle == Lifecycle.ACTIVE:
            if row.component_type in ("activity", "activity_stub"):
                raise errors.IllegalState("cannot pause a running activity; cancel it instead")
            version = _append_in_tx(row, version, Unlocked(unlocked_at=now, reason="paused"), now, None, notes)
        version = _append_in_tx(row, version, Paused(), now, None, notes)
        notes.publish()
    return version


def unpause_execution(execution_id: str, *, now: datetime | None = None) -> int:
    now = _now(now)
    execution_id = _eid(execution_id)
    with _write_transaction():
        row = _row_for_update(execution_id)
        notes = notify.Notes()
        version = _append_in_tx(row, row.next_version, Unpaused(), now, None, notes)
        notes.publish()
    return version


def cancel(execution_id: str, *, now: datetime | None = None) -> CancelOutcome:
    """Request cancellation (lifecycle ``cancelling``); the cancellation driver finishes it.

    Distinct outcomes (spec 004 §5.4 item 18): requested now, already cancelling, already
    finished as cancelled, already finished otherwise. A missing execution is ``NotFound``.
    """
    now = _now(now)
    execution_id = _eid(execution_id)
    with _write_transaction():
        row = _row_for_update(execution_id)
        if row.is_finished:
            cancelled = result_kind_of(ExecutionFailure("cancelled"))
            return CancelOutcome.ALREADY_CANCELLED if row.result_kind == cancelled else CancelOutcome.ALREADY_FINISHED
        if row.lifecycle == Lifecycle.CANCELLING:
            return CancelOutcome.ALREADY_CANCELLING
        notes = notify.Notes()
        _append_in_tx(row, row.corresponding_version + 1, CancellationRequested(), now, None, notes)
        notes.publish()
    return CancelOutcome.REQUESTED


def get_cancelling(*, limit: int = 100) -> list[str]:
    return list(
        ExecutionState.objects.filter(lifecycle=Lifecycle.CANCELLING)
        .order_by("created_at")
        .values_list("execution_id", flat=True)[:limit]
    )


def finish_cancelled(
    execution_id: str, *, fence: Fence | None = None, version: int | None = None, now: datetime | None = None
) -> bool:
    """The cancellation driver's write: ``Finished(cancelled)`` for a cancelling execution.

    Without a fence it acts only when no run holds a live lock (pending, blocked, or an
    expired lock); a running holder stops its run and calls this with its fence and version.
    Workflows are finished here only once they have no unfinished children. Returns whether
    it finished the execution.
    """
    now = _now(now)
    execution_id = _eid(execution_id)
    with _write_transaction():
        row = _row_for_update(execution_id)
        if row.lifecycle != Lifecycle.CANCELLING:
            return False
        if fence is None and row.state == State.LOCKED and row.pending_expires_finished > now:
            return False
        if fence is None and row.component_type == "workflow" and _has_unfinished_children(execution_id):
            return False
        notes = notify.Notes()
        retval = ExecutionFailure("cancelled", "cancellation requested")
        _append_in_tx(row, version or row.corresponding_version + 1, Finished(retval=retval), now, fence, notes)
        notes.publish()
    return True


def _has_unfinished_children(execution_id: str) -> bool:
    return (
        ExecutionState.objects.filter(execution_id__startswith=execution_id + ".")
        .exclude(state=State.FINISHED)
        .exists()
    )


def upsert_stub_response(execution_id: str, retval: RetVal, *, now: datetime | None = None) -> bool:
    """Finish a derived execution (normally an activity stub) with ``retval``; idempotent.

    Returns True when it wrote, False when the same value was already there; a different
    value is ``StubConflict``. The parent gets the response in the same transaction.
    """
    now = _now(now)
    child = ExecutionId.parse(execution_id)
    if child.is_top_level:
        raise errors.ValidationFailed("only a derived (child) execution can be stubbed")
    try:
        append(str(child), 1, Finished(retval=retval), now=now)
        return True
    except errors.AlreadyFinished:
        pass
    record = get_event(str(child), 1)
    if isinstance(record.event, Finished) and canonical_json(retval_to_json(record.event.retval)) == canonical_json(
        retval_to_json(retval)
    ):
        return False
    raise errors.StubConflict(f"`{child}` already finished with a different value")


# ---------------------------------------------------------------------------------------
# Logs
# ---------------------------------------------------------------------------------------


def append_logs(execution_id: str, run_id: str, entries: Iterable[tuple[datetime, int, str]]) -> int:
    """Store log records of a run (``(created_at, level 1-5, message)``)."""
    rows = [
        LogEntry(execution_id=execution_id, run_id=run_id, created_at=at, level=level, message=message)
        for at, level, message in entries
    ]
    if rows:
        LogEntry.objects.bulk_create(rows)
    return len(rows)


def list_logs(execution_id: str, *, after_id: int = 0, limit: int = 100) -> list[LogEntry]:
    return list(LogEntry.objects.filter(execution_id=_eid(execution_id), id__gt=after_id).order_by("id")[:limit])


# ---------------------------------------------------------------------------------------
# Reads
# ---------------------------------------------------------------------------------------


def get_state(execution_id: str) -> ExecutionState:
    execution_id = _eid(execution_id)
    try:
        return ExecutionState.objects.get(pk=execution_id)
    except ExecutionState.DoesNotExist:
        raise errors.NotFound(f"execution `{execution_id}` not found") from None


def _record(version: int, created_at: datetime, json_value: Any) -> EventRecord:
    return EventRecord(version, created_at, event_from_json(json_value))


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


def list_events(
    execution_id: str, *, from_version: int = 0, limit: int = 100
) -> tuple[list[EventRecord], int]:
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


def _responses_of(execution_ids: list[str], *, after_seq: int = 0, limit: int | None = None) -> dict[str, list[Response]]:
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


# ---------------------------------------------------------------------------------------
# Listing executions (spec 000 §7.4 list_executions)
# ---------------------------------------------------------------------------------------


def encode_cursor(row: ExecutionState) -> str:
    raw = f"{row.created_at.isoformat()}|{row.execution_id}"
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        created_at, execution_id = raw.split("|", 1)
        return datetime.fromisoformat(created_at), execution_id
    except (ValueError, UnicodeDecodeError):
        raise errors.ValidationFailed(f"invalid cursor `{cursor}`") from None


def _status_condition(status: str, now: datetime) -> Q:
    finished_ok = '"ok"'
    finished_error = '{"err":"error"}'
    return {
        "pending": Q(state=State.PENDING_AT, lifecycle=Lifecycle.ACTIVE, pending_expires_finished__lte=now),
        "scheduled": Q(state=State.PENDING_AT, lifecycle=Lifecycle.ACTIVE, pending_expires_finished__gt=now),
        "locked": Q(state=State.LOCKED, lifecycle=Lifecycle.ACTIVE),
        "blocked": Q(state=State.BLOCKED_BY_JOIN_SET, lifecycle=Lifecycle.ACTIVE),
        "paused": Q(lifecycle=Lifecycle.PAUSED),
        "cancelling": Q(lifecycle=Lifecycle.CANCELLING),
        "finished": Q(state=State.FINISHED),
        "finished_ok": Q(state=State.FINISHED, result_kind=finished_ok),
        "finished_error": Q(state=State.FINISHED, result_kind=finished_error),
        "finished_failure": Q(state=State.FINISHED) & ~Q(result_kind__in=[finished_ok, finished_error]),
    }[status]


def filter_executions(filters: ExecutionFilter, *, now: datetime | None = None):
    """The queryset of ``list_executions`` (also used by the admin's counts)."""
    now = _now(now)
    query = ExecutionState.objects.all()
    if not filters.show_derived:
        query = query.filter(is_top_level=True)
    if filters.ffqn_prefix:
        query = query.filter(ffqn__startswith=filters.ffqn_prefix)
    if filters.execution_id_prefix:
        query = query.filter(execution_id__startswith=filters.execution_id_prefix)
    if filters.hide_finished:
        query = query.exclude(state=State.FINISHED)
    if filters.deployment_id:
        query = query.filter(deployment_id=filters.deployment_id)
    if filters.component_digest:
        query = query.filter(component_id_input_digest=filters.component_digest)
    if filters.statuses:
        unknown = set(filters.statuses) - set(STATUS_FILTERS)
        if unknown:
            raise errors.ValidationFailed(f"unknown status filter(s) {sorted(unknown)}; use {list(STATUS_FILTERS)}")
        condition = Q()
        for status in filters.statuses:
            condition |= _status_condition(status, now)
        query = query.filter(condition)
    return query


def list_executions(
    filters: ExecutionFilter = ExecutionFilter(),
    *,
    limit: int = 20,
    older_than: str | None = None,
    newer_than: str | None = None,
    now: datetime | None = None,
) -> Page:
    """A page of executions, newest first, with keyset cursors on ``(created_at, id)``.

    Pass ``older_cursor`` of a page as ``older_than`` for the next page, ``newer_cursor`` as
    ``newer_than`` for the previous one. Ordering and cursor use the same key (a deliberate
    fix of spec 000 §12.17).
    """
    if limit < 1 or limit > 1000:
        raise errors.ValidationFailed("limit must be between 1 and 1000")
    if older_than and newer_than:
        raise errors.ValidationFailed("pass older_than or newer_than, not both")
    query = filter_executions(filters, now=now)
    if newer_than:
        at, execution_id = decode_cursor(newer_than)
        query = query.filter(Q(created_at__gt=at) | Q(created_at=at, execution_id__gt=execution_id))
        rows = list(query.order_by("created_at", "execution_id")[: limit + 1])
        more_newer = len(rows) > limit
        rows = rows[:limit][::-1]
        return Page(
            rows,
            older_cursor=encode_cursor(rows[-1]) if rows else None,
            newer_cursor=encode_cursor(rows[0]) if rows and more_newer else None,
        )
    if older_than:
        at, execution_id = decode_cursor(older_than)
        query = query.filter(Q(created_at__lt=at) | Q(created_at=at, execution_id__lt=execution_id))
    rows = list(query.order_by("-created_at", "-execution_id")[: limit + 1])
    more_older = len(rows) > limit
    rows = rows[:limit]
    return Page(
        rows,
        older_cursor=encode_cursor(rows[-1]) if rows and more_older else None,
        newer_cursor=encode_cursor(rows[0]) if rows and older_than else None,
    )
