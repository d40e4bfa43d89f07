"""How each event changes the tables: the state machine's effects, applied to a locked row.

``apply_event`` checks an event against its execution's row (the writer's fence, the
transition table of ``executions.state_machine``, the version) and computes the write, with
one small handler per ``Effect`` (``_EFFECTS``); ``append_in_tx`` and
``append_events_in_tx`` perform it. Every writing operation of the store goes through here;
creation is in ``create``, the claim's statements in ``claim``, response delivery in
``responses``.

why: D8, D10, D14, D55"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection

from executions import conf, errors, notify
from executions.events import (
    ChildExecutionRequest,
    ComponentUpgradeFinished,
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
    Schedule,
    TemporarilyFailed,
    consumes_response,
    event_join_set_id,
    event_to_json,
    history_event_type,
    result_kind_of,
    retval_to_json,
    storable_text,
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
from executions.models import (
    Delay,
    ExecutionEvent,
    ExecutionState,
)
from executions.sql import Statements
from executions.state_machine import (
    LEAVES_LOCKED,
    Effect,
    Lifecycle,
    State,
    check_lock,
    decide,
    event_kind,
    failure_event,
)
from executions.store.common import (
    EVENT_FIELDS,
    NO_LOCK,
    NO_WAIT,
    canonical_id,
    check_fence,
    check_payload,
    millis,
    new_instance,
    notify_pending,
    set_fields,
    to_pending,
)
from executions.store.datatypes import AttemptFailed, Fence
from executions.store.responses import deliver_response


@dataclass
class Applied:
    """An event's write, computed by ``apply_event``: the log row to insert, the fields of
    ``t_state`` to save, the version after it, and writes to other tables (``after``)."""

    event_row: ExecutionEvent
    fields: set[str]
    next_version: int
    after: list = field(default_factory=list)


def apply_event(
    row: ExecutionState,
    version: int | None,
    event: Event,
    now: datetime,
    fence: Fence | None,
    notes: notify.Notes,
    unconsumed: _Unconsumed | None = None,
) -> Applied:
    """Validate ``event`` against ``row`` and compute the write, changing ``row`` in memory.

    Everything that can reject the event runs before ``row`` or ``notes`` change. Only
    reads the database (join-next counting; ``unconsumed``: the row's untaken responses,
    shared by the events of one write, which take them in turn). The caller inserts
    ``event_row``, saves ``fields`` of ``row`` and runs ``after`` (writes to other
    tables), in that order.
    """
    version, event, effect, extending = _accept(row, version, event, now, fence)
    stored_json = _validate(row, effect, event, unconsumed)
    if unconsumed is not None and isinstance(event, HistoryEventRecord) and isinstance(event.event, JoinSetCreate):
        unconsumed.created(event.event.join_set_id)

    change = _Change(row, event, version, now, notes, unconsumed, extending)
    # An event written without the holder's fence that takes the row out of `locked` (the
    # timer sweep, the cancellation driver, pause) revokes the holder's lock: the holder
    # can no longer write, extend, or re-lock as the holder (decisions.md D8).
    if fence is None and row.state == State.LOCKED and effect in LEAVES_LOCKED:
        change.fields |= set_fields(row, lock_generation=row.lock_generation + 1, executor_id=None, run_id=None)
    change.fields |= _EFFECTS[effect](change)

    row.corresponding_version = version
    row.updated_at = now
    event = change.event
    event_row = new_instance(
        ExecutionEvent,
        execution_id=row.execution_id,
        version=version,
        created_at=now,
        json_value=stored_json if stored_json is not None else event_to_json(event),
        variant=event.VARIANT,
        join_set_id=event_join_set_id(event),
        history_event_type=history_event_type(event),
        consumes_response=consumes_response(event),
    )
    return Applied(event_row, change.fields, change.next_version, change.after)


def _accept(
    row: ExecutionState, version: int | None, event: Event, now: datetime, fence: Fence | None
) -> tuple[int, Event, Effect, bool]:
    """The checks that may refuse ``event``, in the order of spec 000 §6.2-§6.3: the
    writer's fence, then the version and the transition table. Returns the event's version,
    the event as it will be written (an ``AttemptFailed`` resolved, a failure bounded), its
    effect, and whether it extends the current lock."""
    if fence is not None:
        check_fence(row, fence)
    if version is None:
        # A run's own write may skip the version: its fence, checked under the row lock,
        # proves the lock is still its own; events others appended meanwhile without
        # revoking it (a cancellation request) must not make its result unwritable.
        if fence is None:
            raise errors.ValidationFailed("a write without a version must carry the writer's fence")
        version = row.corresponding_version + 1
    if isinstance(event, AttemptFailed):
        event = _failure_event(row, event, now)
    event = bounded_failure(event)
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
    return version, event, effect, extending


@dataclass(slots=True)
class _Change:
    """One accepted event being applied to its row: what each effect's handler reads, and
    what it may change (the event written, the writes after, the version after it)."""

    row: ExecutionState
    event: Event
    version: int
    now: datetime
    notes: notify.Notes
    unconsumed: _Unconsumed | None
    extending: bool
    fields: set[str] = field(default_factory=lambda: {"corresponding_version", "updated_at"})
    after: list = field(default_factory=list)
    next_version: int = 0

    def __post_init__(self):
        self.next_version = self.version + 1  # a finished execution's stays at its last


def _lock(change: _Change) -> set[str]:
    change.event, fields = _apply_lock(change.row, change.event, change.version, change.extending)
    return fields


def _unlock(change: _Change) -> set[str]:
    fields = to_pending(change.row, change.event.unlocked_at)
    notify_pending(change.row, change.notes)
    return fields


def _retry(change: _Change) -> set[str]:
    row = change.row
    fields = to_pending(row, change.event.backoff_expires_at)
    fields |= set_fields(row, intermittent_event_count=row.intermittent_event_count + 1)
    notify_pending(row, change.notes)
    return fields


def _join_next(change: _Change) -> set[str]:
    unconsumed = change.unconsumed or _Unconsumed(change.row.execution_id)
    return _apply_join_next(change.row, change.event.event, change.notes, unconsumed)


def _delay(change: _Change) -> set[str]:
    change.after.append(_delay_inserter(change.row, change.event.event))
    change.notes.timers = True
    return set()


def _bump(change: _Change) -> set[str]:
    return set()


def _pause(change: _Change) -> set[str]:
    return set_fields(change.row, lifecycle=Lifecycle.PAUSED)  # §6.5 F


def _unpause(change: _Change) -> set[str]:
    fields = set_fields(change.row, lifecycle=Lifecycle.ACTIVE)  # §6.5 F
    notify_pending(change.row, change.notes)
    return fields


def _cancel(change: _Change) -> set[str]:
    fields = set_fields(change.row, lifecycle=Lifecycle.CANCELLING)  # §6.5 G
    change.notes.cancelled.append(change.row.execution_id)
    return fields


def _reschedule(change: _Change) -> set[str]:
    fields = set_fields(change.row, pending_expires_finished=change.event.scheduled_at)
    notify_pending(change.row, change.notes)
    return fields


def _upgrade(change: _Change) -> set[str]:
    return _apply_upgrade(change.row, change.event)


def _finish(change: _Change) -> set[str]:
    change.next_version = change.version  # a finished execution's next version is its last
    return _apply_finish(change.row, change.event, change.version, change.now, change.notes, change.after)


# How each effect of the state machine changes the row (spec 000 §6.5), beside the
# version and ``updated_at`` that every event sets.
_EFFECTS = {
    Effect.LOCK: _lock,
    Effect.TO_PENDING: _unlock,
    Effect.RETRY: _retry,
    Effect.JOIN_NEXT: _join_next,
    Effect.DELAY: _delay,
    Effect.BUMP: _bump,
    Effect.PAUSE: _pause,
    Effect.UNPAUSE: _unpause,
    Effect.CANCEL: _cancel,
    Effect.RESCHEDULE: _reschedule,
    Effect.UPGRADE: _upgrade,
    Effect.FINISH: _finish,
}


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


def _validate(row: ExecutionState, effect: Effect, event: Event, unconsumed: _Unconsumed | None) -> Any:
    """Event-specific checks: ids that must belong to this execution, payload sizes. Returns
    the event's JSON as stored when the check made it (a history event: its size is
    checked), else None."""
    if effect is Effect.LOCK:
        parse_executor_id(event.executor_id)
        parse_run_id(event.run_id)
        parse_deployment_id(event.deployment_id)
    elif effect is Effect.FINISH:
        check_payload("return value", retval_to_json(event.retval))
    elif effect is Effect.JOIN_NEXT:
        JoinSetId.parse(event.event.join_set_id)
    elif effect in (Effect.DELAY, Effect.BUMP):
        _validate_history_event(row, event.event, unconsumed)
        stored = event_to_json(event)
        check_payload("history event", stored)
        return stored
    return None


def _apply_lock(row: ExecutionState, event: Locked, version: int, extending: bool) -> tuple[Locked, set[str]]:
    """§6.5 C: a new lock gets the next generation; an extension keeps it."""
    fields = set_fields(
        row,
        state=State.LOCKED,
        pending_expires_finished=event.lock_expires_at,
        last_lock_version=version,
        executor_id=event.executor_id,
        run_id=event.run_id,
        max_retries=event.retry_config.max_retries,
        retry_exp_backoff_millis=millis(event.retry_config.retry_exp_backoff),
        deployment_id=event.deployment_id,
        component_id_input_digest=event.component_id.component_digest,
        result_kind=None,
        lock_generation=row.lock_generation if extending else row.lock_generation + 1,
        **NO_WAIT,
    )
    return event.model_copy(update={"lock_generation": row.lock_generation}), fields


def bounded_failure(event: Event) -> Event:
    """Keep a failure's text storable and within bounds: a long reason or traceback is
    cut, NUL characters and lone surrogates are escaped, never refused, so an attempt's
    outcome is always recorded (decisions.md D14)."""
    limit = conf.get("MAX_ERROR_DETAIL_CHARS")

    def cut(reason: str | None, detail: str | None) -> tuple[str | None, str | None]:
        if reason is not None:
            reason = storable_text(reason)
            if len(reason) > limit:
                reason = reason[:limit] + "…"
        if detail is not None:
            detail = storable_text(detail)
            if len(detail) > limit:
                detail = "…" + detail[-limit:]
        return reason, detail

    if isinstance(event, TemporarilyFailed):
        reason, detail = cut(event.reason, event.detail)
        return event.model_copy(update={"reason": reason, "detail": detail})
    if isinstance(event, Finished) and isinstance(event.retval, ExecutionFailure):
        reason, detail = cut(event.retval.reason, event.retval.detail)
        return event.model_copy(update={"retval": ExecutionFailure(event.retval.kind, reason, detail)})
    return event


_UNCONSUMED_RESPONSES_SQL = """
SELECT created_at FROM t_join_set_response
WHERE execution_id = %s AND join_set_id = %s
ORDER BY seq
LIMIT {all} OFFSET (SELECT COUNT(*) FROM t_execution_log WHERE execution_id = %s AND join_set_id = %s AND consumes_response)
"""


class _Unconsumed:
    """The responses of one row's join sets that no join-next has taken yet, as a write
    under that row's lock sees them: read once per join set (one query), then counted
    down as the write's own consuming events take them. Responses are inserted only
    under the parent's row lock (decision 11), so none arrive while it is held: a batch
    of 100 join-nexts costs one query, not 100 (D55)."""

    def __init__(self, execution_id: str):
        self.execution_id = execution_id
        self._times: dict[str, list[datetime]] = {}
        self._taken: Counter[str] = Counter()

    def next_time(self, join_set_id: str) -> datetime | None:
        """When the response the next consuming join-next of ``join_set_id`` takes arrived
        (the n-th response for the n-th join-next, spec 000 §5.2); None if it has not."""
        times = self._times.get(join_set_id)
        if times is None:
            times = self._times[join_set_id] = self._read(join_set_id)
        taken = self._taken[join_set_id]
        return times[taken] if taken < len(times) else None

    def take(self, join_set_id: str) -> None:
        self._taken[join_set_id] += 1

    def created(self, join_set_id: str) -> None:
        """A join set this very write creates: it has no responses, since a response answers
        a child or a delay of a write already committed; its join-nexts read none (one query
        less per direct call, whose one write creates the join set and waits on it)."""
        self._times.setdefault(join_set_id, [])

    def _read(self, join_set_id: str) -> list[datetime]:
        params = [self.execution_id, join_set_id, self.execution_id, join_set_id]
        with connection.cursor() as cursor:
            every = "ALL" if connection.vendor == "postgresql" else "-1"  # SQLite: no OFFSET without LIMIT
            cursor.execute(_UNCONSUMED_RESPONSES_SQL.format(all=every), params)
            rows = cursor.fetchall()
        return [_as_datetime(value) for (value,) in rows]


def _as_datetime(value) -> datetime:
    """A timestamp read with a raw cursor: a datetime (psycopg) or ISO text (SQLite)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def _apply_join_next(
    row: ExecutionState, join_next: JoinNext, notes: notify.Notes, unconsumed: _Unconsumed
) -> set[str]:
    """The n-th consuming join-next of a join set waits for its n-th response (spec 000 §5.2)."""
    response_at = unconsumed.next_time(join_next.join_set_id)
    if response_at is not None:
        fields = to_pending(row, max(join_next.run_expires_at, response_at))
        notify_pending(row, notes, announce_later=False)  # later: the writing run's lock expiry
        return fields
    return set_fields(  # §6.5 D
        row,
        state=State.BLOCKED_BY_JOIN_SET,
        pending_expires_finished=join_next.run_expires_at,
        join_set_id=join_next.join_set_id,
        join_set_closing=join_next.closing,
        **NO_LOCK,
    )


def _delay_inserter(row: ExecutionState, request: JoinSetRequest):
    delay: DelayRequest = request.request

    def insert(**_batch):
        Delay.store_objects.create(
            delay_id=delay.delay_id,
            execution_id=row.execution_id,
            join_set_id=request.join_set_id,
            expires_at=delay.expires_at,
            is_paused=delay.paused,
        )

    return insert


def _validate_history_event(row: ExecutionState, event, unconsumed: _Unconsumed | None) -> None:
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
        check_payload("params", event.request.params)
    elif isinstance(event, JoinNextTry) and event.outcome == "found":
        if (unconsumed or _Unconsumed(row.execution_id)).next_time(event.join_set_id) is None:
            raise errors.ValidationFailed(
                f"join_next_try on `{event.join_set_id}` found a response, but none is left to take"
            )
    elif isinstance(event, Schedule):
        canonical_id(event.execution_id)
        if event.target_ffqn is not None:
            FunctionFqn.parse(event.target_ffqn)


def _apply_upgrade(row: ExecutionState, event: ComponentUpgradeFinished) -> set[str]:
    if event.succeeded:  # §6.5 H
        return set_fields(
            row,
            component_id_input_digest=event.component_digest,
            deployment_id=event.deployment_id,
            incompatible_digest=None,
        )
    return set_fields(row, incompatible_digest=event.component_digest)  # §6.5 I


def finish_fields(event: Finished, now: datetime) -> dict[str, Any]:
    """The columns a ``Finished`` event sets, besides the version and ``updated_at`` (§6.5
    E): one definition for ``_apply`` and for a group commit in one message (D70)."""
    return {
        "state": State.FINISHED,
        "pending_expires_finished": now,
        "executor_id": None,
        "run_id": None,
        "lifecycle": Lifecycle.ACTIVE,
        **NO_WAIT,
        **NO_LOCK,
        "result_kind": result_kind_of(event.retval),
    }


def _apply_finish(row, event: Finished, version: int, now: datetime, notes: notify.Notes, after: list) -> set[str]:
    fields = set_fields(row, **finish_fields(event, now))
    notes.finished.append(notify.finished_item(row.execution_id, retval_to_json(event.retval)))
    if not row.is_top_level:
        # A child's result always reaches its parent in the same transaction (decisions.md D10).
        parent, join_set = ExecutionId.parse(row.execution_id).split_to_parts()
        after.append(
            lambda **batch: deliver_response(
                str(parent), str(join_set), now, notes, child_id=row.execution_id, finished_version=version, **batch
            )
        )
    return fields


def write_applied(row: ExecutionState, applied: Applied) -> None:
    applied.event_row.save(force_insert=True)
    row.save(update_fields=sorted(applied.fields))
    for action in applied.after:
        action()


def append_in_tx(
    row: ExecutionState, version: int | None, event: Event, now: datetime, fence: Fence | None, notes: notify.Notes
) -> int:
    applied = apply_event(row, version, event, now, fence, notes)
    write_applied(row, applied)
    return applied.next_version


def append_events_in_tx(
    row: ExecutionState,
    version: int | None,
    events: list[Event],
    now: datetime,
    fence: Fence | None,
    notes: notify.Notes,
    statements: Statements,
) -> int:
    """Append ``events`` to one locked row, in order, with one ``INSERT`` for their log rows
    and one ``UPDATE`` of the projection (the row's state after the last event), added to
    ``statements``; writes to other tables follow. A join-next takes the response after
    those consumed before it: the ones in the log, plus the earlier consuming events of
    this batch, counted here. Returns the next version."""
    version, pending, fields, after = apply_events(row, version, events, now, fence, notes)
    statements.insert(ExecutionEvent, pending, EVENT_FIELDS)
    statements.update(ExecutionState, [row.pk], {name: getattr(row, name) for name in sorted(fields)})
    if after:
        statements.run()
        for action in after:
            action()
    return version


def apply_events(
    row: ExecutionState,
    version: int | None,
    events: list[Event],
    now: datetime,
    fence: Fence | None,
    notes: notify.Notes,
) -> tuple[int, list[ExecutionEvent], set[str], list]:
    """``append_events_in_tx``'s rules without its writes: apply ``events`` to ``row`` in
    order; the next version, the log rows, the fields changed, and the actions that follow
    (a child's response). A join-next of a join set created before this write reads its
    unconsumed responses (one query per join set, ``_Unconsumed``); of one this write
    creates, none."""
    pending: list[ExecutionEvent] = []
    fields: set[str] = set()
    after: list = []
    unconsumed = _Unconsumed(row.execution_id)
    for event in events:
        applied = apply_event(row, version, event, now, fence, notes, unconsumed)
        if applied.event_row.consumes_response:
            unconsumed.take(applied.event_row.join_set_id)
        pending.append(applied.event_row)
        fields |= applied.fields
        after.extend(applied.after)
        version = applied.next_version
    return version, pending, fields, after
