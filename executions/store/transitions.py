"""How each event changes the tables: the state machine's effects, applied to a locked row.

``_apply`` validates an event against its execution's row (the writer's fence, the
transition table of ``executions.state_machine``, the version) and computes the write;
``_append_in_tx`` performs it. Every writing operation of the store goes through here."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection
from django.utils import timezone

from executions import conf, errors, notify
from executions.events import (
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
    Schedule,
    TemporarilyFailed,
    compact_json,
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
    JoinSetResponse,
)
from executions.sql import Statements, assignments_from, recordset_values
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
    STATE_FIELDS,
    _eid,
    _json_payload,
    _millis,
    _now,
    _row_for_update,
    new_instance,
)
from executions.store.datatypes import (
    AttemptFailed,
    ChildClaim,
    CreateRequest,
    Fence,
    LockedExecution,
    LockTerms,
    Response,
)


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
    _json_payload("metadata", metadata)
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


def _create_in_tx(
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
        return _append_in_tx(row, 1, Paused(), now, None, notes)
    _notify_pending(row, notes)
    if statements is None:
        batch.run()
    return 1


def _create_unpaused_in_tx(
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
            _notify_pending(row, notes)
            continue
        locked = new_lock(terms, claim.executor_id, claim.run_id, claim.deployment_id, now)
        locked = locked.model_copy(update={"lock_generation": 1})
        _set(row, **lock_fields(terms, locked), corresponding_version=1, last_lock_version=1, lock_generation=1)
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


def new_lock(terms: LockTerms, executor_id: str, run_id: str, deployment_id: str, now: datetime) -> Locked:
    """The ``Locked`` event of a new lock under ``terms`` (its generation set by the caller)."""
    return Locked(
        component_id=terms.component_id,
        executor_id=executor_id,
        deployment_id=deployment_id,
        run_id=run_id,
        lock_expires_at=now + terms.lock_duration,
        retry_config=terms.retry_config,
    )


_GENERATION = '"lock_generation":-1'  # where each row's generation goes in its Locked event


def lock_document(terms: LockTerms, locked: Locked) -> tuple[tuple[str, ...], dict[str, Any]]:
    """A new lock as one statement writes it (D69, D82): the names of its columns
    (``lock_fields``), and a document of their values (adapted as ``json_to_recordset``
    reads them) with its ``Locked`` event's JSON, cut where the statement puts each row's
    generation (``event_head``, ``event_tail``)."""
    fields = lock_fields(terms, locked)
    names = tuple(sorted(fields))
    body = {Locked.VARIANT: {**event_to_json(locked)[Locked.VARIANT], "lock_generation": -1}}
    head, tail = compact_json(body).split(_GENERATION)
    return names, {**recordset_values(ExecutionState, names, fields), "event_head": head, "event_tail": tail}


def lock_ctes(names: tuple[str, ...], source: str, rows: str, terms: str, *, update: str, log: str) -> str:
    """The two data-modifying CTEs of locks taken by one statement (D69, D82): ``update``
    gives each of ``rows`` (its ``execution_id``, and its ``corresponding_version`` and
    ``lock_generation`` as found, the row locked) the columns ``names`` of ``terms`` (a
    ``lock_document``) and moves its versions and generation on; ``log`` inserts its
    ``Locked`` event, the generation put in. ``source``: the ``FROM`` joining the two."""
    return f"""{update} AS (
    UPDATE t_state s SET corresponding_version = {rows}.corresponding_version + 1,
        last_lock_version = {rows}.corresponding_version + 1, lock_generation = {rows}.lock_generation + 1,
        {assignments_from(ExecutionState, names, terms)}, updated_at = %s
    FROM {source}
    WHERE s.execution_id = {rows}.execution_id
),
{log} AS (
    INSERT INTO t_execution_log
        (execution_id, version, created_at, json_value, variant, join_set_id, history_event_type, consumes_response)
    SELECT {rows}.execution_id, {rows}.corresponding_version + 1, %s,
        ({terms}.event_head || '"lock_generation":' || ({rows}.lock_generation + 1) || {terms}.event_tail)::json,
        '{Locked.VARIANT}', NULL, NULL, false
    FROM {source}
)"""


def lock_fields(terms: LockTerms, locked: Locked) -> dict[str, Any]:
    """The columns a new lock sets, besides the versions, the generation and ``updated_at``:
    one definition for ``lock_pending`` and for executions created locked (D65)."""
    return {
        "state": State.LOCKED,
        "pending_expires_finished": locked.lock_expires_at,
        "executor_id": locked.executor_id,
        "run_id": locked.run_id,
        "max_retries": terms.retry_config.max_retries,
        "retry_exp_backoff_millis": _millis(terms.retry_config.retry_exp_backoff),
        "deployment_id": locked.deployment_id,
        "component_id_input_digest": terms.component_id.component_digest,
        "join_set_id": None,
        "join_set_closing": None,
        "result_kind": None,
    }


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


def _set(row: ExecutionState, **values) -> set[str]:
    """Assign ``values`` to ``row``; the names of the fields to save."""
    for name, value in values.items():
        setattr(row, name, value)
    return set(values)


# Columns that describe the current lock or wait: cleared whenever the row leaves it.
_NO_LOCK = {"max_retries": None, "retry_exp_backoff_millis": None, "last_lock_version": None, "result_kind": None}
_NO_WAIT = {"join_set_id": None, "join_set_closing": None}


PENDING_CLEARS = tuple({**_NO_LOCK, **_NO_WAIT})  # the columns ``_to_pending`` empties


def _to_pending(row: ExecutionState, at: datetime) -> set[str]:
    """§6.5 A/B; the holder (``executor_id``/``run_id``) is kept so it can extend its lock."""
    return _set(row, state=State.PENDING_AT, pending_expires_finished=at, **_NO_LOCK, **_NO_WAIT)


def _notify_pending(row: ExecutionState, notes: notify.Notes, *, announce_later: bool = True) -> None:
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


def _apply(
    row: ExecutionState,
    version: int | None,
    event: Event,
    now: datetime,
    fence: Fence | None,
    notes: notify.Notes,
    unconsumed: _Unconsumed | None = None,
) -> _Applied:
    """Validate ``event`` against ``row`` and compute the write, changing ``row`` in memory.

    Everything that can reject the event runs before ``row`` or ``notes`` change. Only
    reads the database (join-next counting; ``unconsumed``: the row's untaken responses,
    shared by the events of one write, which take them in turn). The caller inserts
    ``event_row``, saves ``fields`` of ``row`` and runs ``after`` (writes to other
    tables), in that order.
    """
    if fence is not None:
        _check_fence(row, fence)
    if version is None:
        # A run's own write may skip the version: its fence, checked under the row lock,
        # proves the lock is still its own; events others appended meanwhile without
        # revoking it (a cancellation request) must not make its result unwritable.
        if fence is None:
            raise errors.ValidationFailed("a write without a version must carry the writer's fence")
        version = row.corresponding_version + 1
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
    stored_json = _validate(row, effect, event, unconsumed)
    if unconsumed is not None and isinstance(event, HistoryEventRecord) and isinstance(event.event, JoinSetCreate):
        unconsumed.created(event.event.join_set_id)

    fields = {"corresponding_version", "updated_at"}
    after: list = []
    next_version = version + 1
    # An event written without the holder's fence that takes the row out of `locked` (the
    # timer sweep, the cancellation driver, pause) revokes the holder's lock: the holder
    # can no longer write, extend, or re-lock as the holder (decisions.md D8).
    if fence is None and row.state == State.LOCKED and effect in LEAVES_LOCKED:
        fields |= _set(row, lock_generation=row.lock_generation + 1, executor_id=None, run_id=None)

    if effect is Effect.LOCK:
        event, locked_fields = _apply_lock(row, event, version, extending)
        fields |= locked_fields
    elif effect is Effect.TO_PENDING:
        fields |= _to_pending(row, event.unlocked_at)
        _notify_pending(row, notes)
    elif effect is Effect.RETRY:
        fields |= _to_pending(row, event.backoff_expires_at)
        fields |= _set(row, intermittent_event_count=row.intermittent_event_count + 1)
        _notify_pending(row, notes)
    elif effect is Effect.JOIN_NEXT:
        fields |= _apply_join_next(row, event.event, notes, unconsumed or _Unconsumed(row.execution_id))
    elif effect is Effect.DELAY:
        after.append(_delay_inserter(row, event.event))
        notes.timers = True
    elif effect in (Effect.PAUSE, Effect.UNPAUSE, Effect.CANCEL):
        lifecycle = {
            Effect.PAUSE: Lifecycle.PAUSED,
            Effect.UNPAUSE: Lifecycle.ACTIVE,
            Effect.CANCEL: Lifecycle.CANCELLING,
        }
        fields |= _set(row, lifecycle=lifecycle[effect])  # §6.5 F, G
        if effect is Effect.UNPAUSE:
            _notify_pending(row, notes)
        if effect is Effect.CANCEL:
            notes.cancelled.append(row.execution_id)
    elif effect is Effect.RESCHEDULE:
        fields |= _set(row, pending_expires_finished=event.scheduled_at)
        _notify_pending(row, notes)
    elif effect is Effect.UPGRADE:
        fields |= _apply_upgrade(row, event)
    elif effect is Effect.FINISH:
        fields |= _apply_finish(row, event, version, now, notes, after)
        next_version = version

    row.corresponding_version = version
    row.updated_at = now
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


def _validate(row: ExecutionState, effect: Effect, event: Event, unconsumed: _Unconsumed | None) -> Any:
    """Event-specific checks: ids that must belong to this execution, payload sizes. Returns
    the event's JSON as stored when the check made it (a history event: its size is
    checked), else None."""
    if effect is Effect.LOCK:
        parse_executor_id(event.executor_id)
        parse_run_id(event.run_id)
        parse_deployment_id(event.deployment_id)
    elif effect is Effect.FINISH:
        _json_payload("return value", retval_to_json(event.retval))
    elif effect is Effect.JOIN_NEXT:
        JoinSetId.parse(event.event.join_set_id)
    elif effect in (Effect.DELAY, Effect.BUMP):
        _validate_history_event(row, event.event, unconsumed)
        stored = event_to_json(event)
        _json_payload("history event", stored)
        return stored
    return None


def _apply_lock(row: ExecutionState, event: Locked, version: int, extending: bool) -> tuple[Locked, set[str]]:
    """§6.5 C: a new lock gets the next generation; an extension keeps it."""
    fields = _set(
        row,
        state=State.LOCKED,
        pending_expires_finished=event.lock_expires_at,
        last_lock_version=version,
        executor_id=event.executor_id,
        run_id=event.run_id,
        max_retries=event.retry_config.max_retries,
        retry_exp_backoff_millis=_millis(event.retry_config.retry_exp_backoff),
        deployment_id=event.deployment_id,
        component_id_input_digest=event.component_id.component_digest,
        result_kind=None,
        lock_generation=row.lock_generation if extending else row.lock_generation + 1,
        **_NO_WAIT,
    )
    return event.model_copy(update={"lock_generation": row.lock_generation}), fields


def _bounded_failure(event: Event) -> Event:
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
        fields = _to_pending(row, max(join_next.run_expires_at, response_at))
        _notify_pending(row, notes, announce_later=False)  # later: the writing run's lock expiry
        return fields
    return _set(  # §6.5 D
        row,
        state=State.BLOCKED_BY_JOIN_SET,
        pending_expires_finished=join_next.run_expires_at,
        join_set_id=join_next.join_set_id,
        join_set_closing=join_next.closing,
        **_NO_LOCK,
    )


def _delay_inserter(row: ExecutionState, request: JoinSetRequest):
    delay: DelayRequest = request.request

    def insert(**_batch):
        Delay.objects.create(
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
        _json_payload("params", event.request.params)
    elif isinstance(event, JoinNextTry) and event.outcome == "found":
        if (unconsumed or _Unconsumed(row.execution_id)).next_time(event.join_set_id) is None:
            raise errors.ValidationFailed(
                f"join_next_try on `{event.join_set_id}` found a response, but none is left to take"
            )
    elif isinstance(event, Schedule):
        _eid(event.execution_id)
        if event.target_ffqn is not None:
            FunctionFqn.parse(event.target_ffqn)


def _apply_upgrade(row: ExecutionState, event: ComponentUpgradeFinished) -> set[str]:
    if event.succeeded:  # §6.5 H
        return _set(
            row,
            component_id_input_digest=event.component_digest,
            deployment_id=event.deployment_id,
            incompatible_digest=None,
        )
    return _set(row, incompatible_digest=event.component_digest)  # §6.5 I


def finish_fields(event: Finished, now: datetime) -> dict[str, Any]:
    """The columns a ``Finished`` event sets, besides the version and ``updated_at`` (§6.5
    E): one definition for ``_apply`` and for a group commit in one message (D70)."""
    return {
        "state": State.FINISHED,
        "pending_expires_finished": now,
        "executor_id": None,
        "run_id": None,
        "lifecycle": Lifecycle.ACTIVE,
        **_NO_WAIT,
        **_NO_LOCK,
        "result_kind": result_kind_of(event.retval),
    }


def _apply_finish(row, event: Finished, version: int, now: datetime, notes: notify.Notes, after: list) -> set[str]:
    fields = _set(row, **finish_fields(event, now))
    notes.finished.append(notify.finished_item(row.execution_id, retval_to_json(event.retval)))
    if not row.is_top_level:
        # A child's result always reaches its parent in the same transaction (decisions.md D10).
        parent, join_set = ExecutionId.parse(row.execution_id).split_to_parts()
        after.append(
            lambda **batch: _deliver_response(
                str(parent), str(join_set), now, notes, child_id=row.execution_id, finished_version=version, **batch
            )
        )
    return fields


def _write_applied(row: ExecutionState, applied: _Applied) -> None:
    applied.event_row.save(force_insert=True)
    row.save(update_fields=sorted(applied.fields))
    for action in applied.after:
        action()


def _append_in_tx(
    row: ExecutionState, version: int | None, event: Event, now: datetime, fence: Fence | None, notes: notify.Notes
) -> int:
    applied = _apply(row, version, event, now, fence, notes)
    _write_applied(row, applied)
    return applied.next_version


def _append_events_in_tx(
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
    pending: list[ExecutionEvent] = []
    fields: set[str] = set()
    after: list = []
    unconsumed = _Unconsumed(row.execution_id)
    for event in events:
        applied = _apply(row, version, event, now, fence, notes, unconsumed)
        if applied.event_row.consumes_response:
            unconsumed.take(applied.event_row.join_set_id)
        pending.append(applied.event_row)
        fields |= applied.fields
        after.extend(applied.after)
        version = applied.next_version
    statements.insert(ExecutionEvent, pending, EVENT_FIELDS)
    statements.update(ExecutionState, [row.pk], {name: getattr(row, name) for name in sorted(fields)})
    if after:
        statements.run()
        for action in after:
            action()
    return version


_INSERT_RESPONSE_SQL = """
INSERT INTO t_join_set_response
    (created_at, execution_id, join_set_id, delay_id, delay_success, child_execution_id, finished_version, seq)
VALUES (%s, %s, %s, %s, %s, %s, %s, (SELECT COALESCE(MAX(seq), 0) + 1 FROM t_join_set_response WHERE execution_id = %s))
RETURNING seq
"""


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
    parents: dict[str, ExecutionState] | None = None,
    statements: Statements | None = None,
    responses: ResponseBatch | None = None,
) -> int | None:
    """Insert a response with the parent's next ``seq`` and unblock the parent if it waits
    for this join set (spec 000 §6.4). The parent's row is locked first (decision 11); the
    writes then go in one round trip, which returns the ``seq``. A group commit passes the
    parents it locked already, its own ``statements``, which carry the writes, and a
    ``ResponseBatch``, which inserts all its responses with one statement."""
    parent = (parents or {}).get(parent_id) or _row_for_update(parent_id)
    batch = statements if statements is not None else Statements()
    if (
        parent.state == State.BLOCKED_BY_JOIN_SET
        and parent.join_set_id == join_set_id
        and parent.lifecycle != Lifecycle.CANCELLING
    ):
        fields = _to_pending(parent, max(parent.pending_expires_finished, now)) | _set(parent, updated_at=now)
        batch.update(ExecutionState, [parent.pk], {name: getattr(parent, name) for name in sorted(fields)})
        _notify_pending(parent, notes, announce_later=False)  # later: its awaiting run's lock expiry
    if delay_id is not None:
        batch.add("DELETE FROM t_delay WHERE delay_id = %s", [delay_id])
    notes.responses.append(parent_id)
    row = (parent_id, join_set_id, delay_id, delay_success, child_id, finished_version)
    if responses is not None:
        responses.rows.append(row)
        return None
    created_at = _response_created_at(now)
    batch.add(_INSERT_RESPONSE_SQL, [created_at, *row, parent_id])
    return batch.run()[0][0] if statements is None else None


def _response_created_at(now: datetime):
    """``t_join_set_response.created_at`` as the raw insert statements take it."""
    return JoinSetResponse._meta.get_field("created_at").get_db_prep_save(now, connection)


_INSERT_RESPONSES_SQL = """
INSERT INTO t_join_set_response
    (created_at, execution_id, join_set_id, delay_id, delay_success, child_execution_id, finished_version, seq)
SELECT %s::timestamptz, r.execution_id, r.join_set_id, r.delay_id, r.delay_success, r.child_execution_id,
    r.finished_version,
    (SELECT COALESCE(MAX(seq), 0) FROM t_join_set_response t WHERE t.execution_id = r.execution_id) + r.n
FROM json_to_recordset(%s) AS r(
    execution_id text, join_set_id text, delay_id text, delay_success boolean, child_execution_id text,
    finished_version bigint, n integer
)
RETURNING execution_id, child_execution_id, seq, created_at
"""


@dataclass
class ResponseBatch:
    """The responses of one group commit, inserted together once all are known.

    On PostgreSQL one statement: each parent's responses take the seqs after its highest,
    in the order they were added (the subquery sees the table as it was before the
    statement, and ``n`` numbers a parent's rows). SQLite runs in-process, so there each
    is its own statement, as for a single response. The parents' rows are locked, so no
    other response can take a seq in between (decision 11, D55)."""

    rows: list[tuple] = field(default_factory=list)

    def add_to(self, statements: Statements, now: datetime) -> None:
        if not self.rows:
            return
        created_at = _response_created_at(now)
        if connection.vendor != "postgresql":
            for row in self.rows:
                statements.add(_INSERT_RESPONSE_SQL, [created_at, *row, row[0]])
            return
        counts: Counter[str] = Counter()
        records = []
        for parent_id, join_set_id, delay_id, delay_success, child_id, finished_version in self.rows:
            counts[parent_id] += 1
            records.append(
                {
                    "execution_id": parent_id,
                    "join_set_id": join_set_id,
                    "delay_id": delay_id,
                    "delay_success": delay_success,
                    "child_execution_id": child_id,
                    "finished_version": finished_version,
                    "n": counts[parent_id],
                }
            )
        statements.add(_INSERT_RESPONSES_SQL, [created_at, compact_json(records)])

    def inserted(self, returned: list[tuple], finished: dict[str, Any]) -> list[tuple[str, Response]]:
        """The children's responses as their parents' waiting runs would read them
        (``reads.responses_after``): from the ``RETURNING`` rows of the PostgreSQL insert,
        when it ran last in its batch, and the children's ``Finished`` events (``finished``:
        their JSON by child id). Given to this process's listeners at commit (D67)."""
        rows = {row[4]: row for row in self.rows if row[4] is not None}
        out = []
        for parent_id, child_id, seq, created_at in returned:
            if child_id not in rows or child_id not in finished:
                continue
            _, join_set_id, delay_id, delay_success, _, finished_version = rows[child_id]
            as_stored = json.loads(compact_json(finished[child_id]))
            response = Response.of(
                seq, created_at, join_set_id, delay_id, delay_success, child_id, finished_version, as_stored
            )
            out.append((parent_id, response))
        return out
