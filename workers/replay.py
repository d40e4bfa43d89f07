"""The pure replay core of workflows (spec 002 §1-§5, with the decisions of spec/README.md).

A workflow function runs again from the start on every run. Each host call it makes (create a
join set, submit a child, wait for the next response, sleep, draw a random number ...) becomes
one or more *deterministic keys* (§1.7). While recorded history events remain unprocessed, the
next key must match the next recorded event (§3.4): the call then returns the recorded outcome
and writes nothing; a mismatch is nondeterminism (§3.7). Once the history is exhausted the call
writes new events through a ``Writer`` (buffered per §3.6) and, if it blocks, resolves from the
responses known so far, waits through a ``Waiter`` for more, or interrupts the run (§3.5, §4).

This module imports no Django and no store: the executor supplies a ``Writer``, a ``Waiter``
(Await strategy; none means Interrupt), a ``Canceller`` and a ``Lease``. A blocking call waits
*inside* the call through the ``Waiter`` (§4.2's loop) rather than raising to its caller to be
retried: a retried call would have to skip the keys it already processed (the one-off call's
first two), and a half-done close would have to resume its drain. Read it top to bottom next to
spec 002 §3:

1. signals and errors (§8.1, §3.8), 2. ``ScheduleAt`` (§1.3), 3. keys (§1.7),
4. how recorded events read in messages (§1.3), 5. responses (§1.4), 6. the ports,
7. ``WriteBuffer`` (§3.6), 8. ``ProcessedIndex``: ids and counters (§1.2, §1.5, §1.6),
9. ``ResponseQueue`` (§1.6), 10. ``DeterministicRandom`` (decision 4),
11. ``EventHistory``: the cursor, ``process_event_by_key`` (§3.4), every host call (§2),
    closing and ``finalize`` (§5).
"""

from __future__ import annotations

import hashlib
import logging
import random
import string
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any, Protocol

from executions import errors
from executions.events import (
    ACTIVITY_TYPES,
    ChildExecutionRequest,
    DelayRequest,
    ExecutionFailure,
    HistoryEventRecord,
    JoinNext,
    JoinNextTooMany,
    JoinNextTry,
    JoinSetCreate,
    JoinSetRequest,
    Ok,
    Persist,
    RetVal,
    Schedule,
    Stub,
    canonical_json,
    duration_from_json,
    duration_to_json,
    retval_from_json,
    retval_to_json,
)
from executions.ids import DelayId, ExecutionId, FunctionFqn, JoinSetId

log = logging.getLogger(__name__)

# =============================================================================================
# 1. Signals and errors (§8.1, §3.8, §5.4)
# =============================================================================================


class WorkflowSignal(BaseException):
    """Ends the run. A ``BaseException``, so ``except Exception`` in workflow code cannot swallow
    it (§8.1). The first signal poisons the history: every later host call raises it again and
    writes nothing, and ``finalize`` reports it (decision 2: the first fatal error is kept)."""


class WorkflowInterrupt(WorkflowSignal):
    """No response yet and no (more) waiting: the database holds the ``JoinNext`` and a later
    response makes the execution pending again; the next run replays (§4.1). Retriable."""


class WriteFailed(WorkflowSignal):
    """A write (or lock extension) failed, e.g. the database is down or the lock was lost:
    retriable, the executor writes nothing (§3.8 ``DbError``)."""


class FatalWorkflowError(WorkflowSignal):
    """Finishes the execution permanently with ``failure()`` (§3.8, §5.4)."""

    kind = "uncategorized"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def reason(self) -> str | None:
        return self.message

    def failure(self) -> ExecutionFailure:
        return ExecutionFailure(self.kind, self.reason(), None)


class NondeterminismDetected(FatalWorkflowError):
    """The code asked for something other than what the history holds (§3.7)."""

    kind = "nondeterminism_detected"

    def reason(self) -> str | None:
        return None

    def failure(self) -> ExecutionFailure:
        return ExecutionFailure(self.kind, None, self.message)


class ConstraintViolation(FatalWorkflowError):
    """Misuse of a join set, e.g. submitting to a closed one (§2.3)."""

    def reason(self) -> str:
        return f"constraint violation: {self.message}"


class ImportedFunctionCallError(FatalWorkflowError):
    """A host call that cannot be carried out, e.g. stubbing an execution that does not exist
    (decision 2: fatal, not retried forever) or a schedule time out of range (§5.4)."""

    def __init__(self, ffqn: str, message: str):
        super().__init__(message)
        self.ffqn = ffqn

    def reason(self) -> str:
        return f"error calling imported function {self.ffqn} : {self.message}"


class WorkflowError(Exception):
    """An outcome that workflow code may catch. Each is either recorded (a replay raises it
    again from the history) or decided from the processed prefix alone (nothing recorded)."""


class AllProcessed(WorkflowError):
    """Every request of the join set has been awaited (§2.5)."""

    def __init__(self, join_set_id: str):
        super().__init__(f"all requests of join set `{join_set_id}` have been processed")
        self.join_set_id = join_set_id


class FunctionMismatch(WorkflowError):
    """``await_next``/``get`` met another function's child, or a delay (``actual_ffqn`` None)."""

    def __init__(self, specified: str, actual_ffqn: str | None, actual_id: ExecutionId | DelayId):
        super().__init__(f"expected a response of {specified}, got {actual_ffqn or 'a delay'} (`{actual_id}`)")
        self.specified, self.actual_ffqn, self.actual_id = specified, actual_ffqn, actual_id


class JoinSetConflict(WorkflowError):
    """A named join set of that name already exists in this execution (§2.2, decision 6)."""


class InvalidJoinSetName(WorkflowError):
    """A join set name or one-off label outside ``[A-Za-z0-9_/-]+`` (decision 6)."""


class DelayCancelled(WorkflowError):
    """``sleep`` ended because its delay was cancelled (§2.10)."""

    def __init__(self, delay_id: DelayId):
        super().__init__(f"delay `{delay_id}` was cancelled")
        self.delay_id = delay_id


class StubConflict(WorkflowError):
    """The stubbed execution already finished with another value (§2.12)."""

    def __init__(self, target: ExecutionId):
        super().__init__(f"`{target}` already finished with a different value")
        self.target = target


class ChildFailed(WorkflowError):
    """A direct call's child returned an error value or failed (§2.8, §5.5)."""

    def __init__(self, child_id: ExecutionId, retval: RetVal):
        super().__init__(f"child `{child_id}` failed: {retval}")
        self.child_id, self.retval = child_id, retval


class NotFoundInProcessedResponses(WorkflowError):
    """``get`` of a child whose response has not been consumed yet (§2.7)."""

    def __init__(self, child_id: ExecutionId):
        super().__init__(f"`{child_id}` is not found in processed responses")
        self.child_id = child_id


# =============================================================================================
# 2. When a delay expires or a scheduled execution starts (§1.3 HistoryEventScheduleAt)
# =============================================================================================


@dataclass(frozen=True)
class ScheduleAt:
    """``Now``, ``At(datetime)`` or ``In(duration)``; the *intention*, which replay compares,
    while the actual time computed from it (``expires_at``) is never compared (§7 inv. 7)."""

    at: datetime | None = None
    after: timedelta | None = None

    @classmethod
    def of(cls, value: Any) -> ScheduleAt:
        """Accept ``None``/``"now"``, a datetime, a timedelta or the stored JSON form."""
        if isinstance(value, ScheduleAt):
            return value
        if value is None or value == "now":
            return cls()
        if isinstance(value, datetime):
            if value.tzinfo is None:
                raise ValueError("schedule_at must be timezone-aware")
            return cls(at=value.astimezone(UTC))
        if isinstance(value, timedelta):
            return cls(after=value)
        if isinstance(value, dict) and set(value) == {"at"}:
            return cls(at=datetime.fromisoformat(value["at"]).astimezone(UTC))
        if isinstance(value, dict) and set(value) == {"in"}:
            return cls(after=duration_from_json(value["in"]))
        raise ValueError(f"schedule_at must be now, a datetime or a timedelta, got {errors.excerpt(value)}")

    def to_json(self) -> Any:
        if self.at is not None:
            return {"at": self.at.isoformat().replace("+00:00", "Z")}
        if self.after is not None:
            return {"in": duration_to_json(self.after)}
        return "now"

    def as_datetime(self, now: datetime) -> datetime:
        """``as_date_time(now)``; ``OverflowError`` when out of range."""
        if self.at is not None:
            return self.at
        return now + self.after if self.after is not None else now

    def __str__(self) -> str:
        if self.at is not None:
            return f"At(`{self.at.isoformat()}`)"
        return f"In({self.after})" if self.after is not None else "Now"


# =============================================================================================
# 3. Deterministic keys (§1.7; a Schedule key also holds function and params: decision 16)
# =============================================================================================


class JoinNextKind(Enum):
    AWAIT_NEXT = "AwaitNext"
    DIRECT_CALL = "DirectCall"


def _params_text(params: Sequence[Any]) -> str:
    return canonical_json(list(params))


def persist_kind_text(kind: dict) -> str:
    """``RandomU64(min, max_inclusive)``, ``RandomString(min, max_exclusive)``, ``Now``."""
    match kind.get("type"):
        case "random_u64":
            return f"RandomU64({kind['min']}, {kind['max_inclusive']})"
        case "random_string":
            return f"RandomString({kind['min_length']}, {kind['max_length_exclusive']})"
        case "now":
            return "Now"
    return canonical_json(kind)


def retval_hash(retval: RetVal) -> str:
    """``Stub.retval_hash`` (spec 000 §3.2): ``01`` + sha256 of the canonical JSON value."""
    return "01" + hashlib.sha256(canonical_json(retval_to_json(retval)).encode()).hexdigest()


@dataclass(frozen=True)
class CreateJoinSetKey:
    join_set_id: str

    def __str__(self) -> str:
        return f"CreateJoinSet({self.join_set_id})"

    def rows(self) -> dict[str, str]:
        return {"join set": self.join_set_id}


@dataclass(frozen=True)
class PersistKey:
    """``value`` None: not compared (a durable ``now()``, whose value is the first run's)."""

    kind: dict = field(hash=False)
    value: bytes | None

    def matches(self, event: Persist) -> bool:
        return event.kind == self.kind and (self.value is None or bytes(event.value) == self.value)

    def __str__(self) -> str:
        return f"Persist({persist_kind_text(self.kind)})"

    def rows(self) -> dict[str, str]:
        value = "(the first run's)" if self.value is None else self.value.hex()
        return {"persist kind": persist_kind_text(self.kind), "persist value": value}


@dataclass(frozen=True)
class ChildRequestKey:
    join_set_id: str
    child_id: str
    ffqn: str
    params: tuple = field(compare=False)
    params_json: str = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "params_json", _params_text(self.params))

    def matches(self, event: JoinSetRequest) -> bool:
        request = event.request
        recorded = (event.join_set_id, request.child_execution_id, request.target_ffqn, _params_text(request.params))
        return recorded == (self.join_set_id, self.child_id, self.ffqn, self.params_json)

    def __str__(self) -> str:
        return f"ChildExecutionRequest({self.child_id}, {self.ffqn}, params: {self.params_json})"

    def rows(self) -> dict[str, str]:
        return {"join set": self.join_set_id, "id": self.child_id, "function": self.ffqn, "arguments": self.params_json}


@dataclass(frozen=True)
class DelayRequestKey:
    join_set_id: str
    delay_id: str
    schedule_at: ScheduleAt

    def matches(self, event: JoinSetRequest) -> bool:
        request = event.request
        recorded = (event.join_set_id, request.delay_id, canonical_json(request.schedule_at))
        return recorded == (self.join_set_id, self.delay_id, canonical_json(self.schedule_at.to_json()))

    def __str__(self) -> str:
        return f"DelayRequest({self.delay_id}, {self.schedule_at})"

    def rows(self) -> dict[str, str]:
        return {"join set": self.join_set_id, "id": self.delay_id, "schedule at": str(self.schedule_at)}


@dataclass(frozen=True)
class JoinNextChildKey:
    join_set_id: str
    kind: JoinNextKind
    requested_ffqn: str

    def __str__(self) -> str:
        return f"JoinNextChild({self.join_set_id}, {self.kind.value}, {self.requested_ffqn})"

    def rows(self) -> dict[str, str]:
        return {"join set": self.join_set_id, "function": self.requested_ffqn, "closing": "no"}


@dataclass(frozen=True)
class JoinNextDelayKey:
    join_set_id: str

    def __str__(self) -> str:
        return f"JoinNextDelay({self.join_set_id})"

    def rows(self) -> dict[str, str]:
        return {"join set": self.join_set_id, "function": "-", "closing": "no"}


@dataclass(frozen=True)
class JoinNextKey:
    join_set_id: str
    closing: bool = False

    def __str__(self) -> str:
        return f"JoinNext({self.join_set_id}{' closing' if self.closing else ''})"

    def rows(self) -> dict[str, str]:
        return {"join set": self.join_set_id, "function": "-", "closing": "yes" if self.closing else "no"}


@dataclass(frozen=True)
class JoinNextTryKey:
    """Decision 9 (not in 0.30.0): a non-blocking join-next; its outcome is the recorded one."""

    join_set_id: str

    def __str__(self) -> str:
        return f"JoinNextTry({self.join_set_id})"

    def rows(self) -> dict[str, str]:
        return {"join set": self.join_set_id}


@dataclass(frozen=True)
class ScheduleKey:
    execution_id: str
    schedule_at: ScheduleAt
    ffqn: str
    params: tuple = field(compare=False)
    params_json: str = field(init=False)

    def __post_init__(self):
        object.__setattr__(self, "params_json", _params_text(self.params))

    def matches(self, event: Schedule) -> bool:
        recorded = (event.execution_id, canonical_json(event.schedule_at))
        if recorded != (self.execution_id, canonical_json(self.schedule_at.to_json())):
            return False
        target = _recorded_schedule_target(event)
        return target is None or target == (self.ffqn, self.params_json)

    def __str__(self) -> str:
        return f"Schedule({self.execution_id}, {self.schedule_at})"

    def rows(self) -> dict[str, str]:
        return {
            "id": self.execution_id,
            "schedule at": str(self.schedule_at),
            "function": self.ffqn,
            "arguments": self.params_json,
        }


@dataclass(frozen=True)
class StubKey:
    target_execution_id: str
    retval_hash: str

    def __str__(self) -> str:
        return f"Stub({self.target_execution_id})"

    def rows(self) -> dict[str, str]:
        return {"id": self.target_execution_id, "return value hash": self.retval_hash}


JS, FFQN = "join_set_id", "requested_ffqn"


def _same(key: Any, event: Any, *fields: str) -> bool:
    """The key and the recorded event agree on ``fields`` (the "Equal on" column of §3.4)."""
    return all(getattr(key, name) == getattr(event, name) for name in fields)


Key = (
    CreateJoinSetKey
    | PersistKey
    | ChildRequestKey
    | DelayRequestKey
    | JoinNextChildKey
    | JoinNextDelayKey
    | JoinNextKey
    | JoinNextTryKey
    | ScheduleKey
    | StubKey
)


def _recorded_schedule_target(event: Schedule) -> tuple[str, str] | None:
    """Decision 16: the scheduled function and params; None for an event recorded without
    them (nothing to compare)."""
    return None if event.target_ffqn is None else (event.target_ffqn, _params_text(event.params or []))


def schedule_event(key: ScheduleKey) -> Schedule:
    return Schedule(
        execution_id=key.execution_id,
        schedule_at=key.schedule_at.to_json(),
        target_ffqn=key.ffqn,
        params=list(key.params),
    )


# =============================================================================================
# 4. Recorded events as they read in messages (§1.3 Display) and side by side with keys
# =============================================================================================


def describe_event(event: Any) -> str:
    """The event's Display form (§1.3), e.g. ``JoinSetCreate(o:1-fn)``."""
    match event:
        case Persist():
            return "Persist"
        case JoinSetCreate():
            return f"JoinSetCreate({event.join_set_id})"
        case JoinSetRequest(request=ChildExecutionRequest() as r):
            return (
                f"JoinSetRequest(ChildExecutionRequest({r.child_execution_id}, {r.target_ffqn}, "
                f"params: {_params_text(r.params)}))"
            )
        case JoinSetRequest(request=DelayRequest() as r):
            expires = r.expires_at.isoformat()
            return f"JoinSetRequest(DelayRequest({r.delay_id}, expires_at: `{expires}`, schedule_at: `{_at(r)}`))"
        case JoinNext():
            return f"JoinNext({event.join_set_id}{' closing' if event.closing else ''})"
        case JoinNextTry():
            return f"JoinNextTry({event.join_set_id}, {event.outcome})"
        case JoinNextTooMany():
            return f"JoinNextTooMany({event.join_set_id})"
        case Schedule():
            return f"Schedule({event.execution_id}, {ScheduleAt.of(event.schedule_at)})"
        case Stub():
            return f"Stub({event.target_execution_id})"
    return repr(event)


def _at(request: DelayRequest) -> ScheduleAt:
    return ScheduleAt.of(request.schedule_at)


def event_rows(event: Any) -> dict[str, str]:
    """The recorded event's fields under the labels the keys use (``Key.rows``)."""
    match event:
        case Persist():
            return {"persist kind": persist_kind_text(event.kind), "persist value": bytes(event.value).hex()}
        case JoinSetCreate():
            return {"join set": event.join_set_id}
        case JoinSetRequest(request=ChildExecutionRequest() as r):
            return {
                "join set": event.join_set_id,
                "id": r.child_execution_id,
                "function": r.target_ffqn,
                "arguments": _params_text(r.params),
            }
        case JoinSetRequest(request=DelayRequest() as r):
            return {"join set": event.join_set_id, "id": r.delay_id, "schedule at": str(_at(r))}
        case JoinNext():
            closing = "yes" if event.closing else "no"
            return {"join set": event.join_set_id, "function": event.requested_ffqn or "-", "closing": closing}
        case JoinNextTooMany():
            return {"join set": event.join_set_id, "function": event.requested_ffqn or "-", "closing": "no"}
        case JoinNextTry():
            return {"join set": event.join_set_id}
        case Schedule():
            rows = {"id": event.execution_id, "schedule at": str(ScheduleAt.of(event.schedule_at))}
            target = _recorded_schedule_target(event)
            if target is not None:
                rows |= {"function": target[0], "arguments": target[1]}
            return rows
        case Stub():
            return {"id": event.target_execution_id, "return value hash": event.retval_hash}
    return {}


def side_by_side(key: Key, event: Any) -> str:
    """One line per field: what the history holds and what the code asked for."""
    recorded, asked = event_rows(event), key.rows()
    lines = []
    for label in [*asked, *(label for label in recorded if label not in asked)]:
        held, wanted = recorded.get(label, "—"), asked.get(label, "—")
        marker = "  (differs)" if held != wanted else ""
        lines.append(f"  {label}: history `{errors.excerpt(held)}`, code `{errors.excerpt(wanted)}`{marker}")
    return "\n".join(lines)


# =============================================================================================
# 5. Responses (§1.4) and what a consumed response resolves to
# =============================================================================================


@dataclass(frozen=True)
class Response:
    """A row of ``t_join_set_response`` as the workflow sees it. The store's
    ``datatypes.Response`` has the same fields and can be passed as is."""

    seq: int
    created_at: datetime
    join_set_id: str
    delay_id: str | None = None
    delay_success: bool | None = None
    child_execution_id: str | None = None
    finished_version: int | None = None
    child_retval: RetVal | None = None


@dataclass(frozen=True)
class ChildOutcome:
    child_id: ExecutionId
    ffqn: str
    retval: RetVal

    @property
    def response_id(self) -> ExecutionId:
        return self.child_id

    @property
    def ok(self) -> bool:
        return isinstance(self.retval, Ok)


@dataclass(frozen=True)
class DelayOutcome:
    delay_id: DelayId
    fired: bool
    expires_at: datetime

    @property
    def response_id(self) -> DelayId:
        return self.delay_id

    @property
    def ok(self) -> bool:
        return self.fired


class _Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return self.name


NOT_FOUND = _Marker("NOT_FOUND")  # no unprocessed event: the history is exhausted (§3.4)
PENDING = _Marker("PENDING")  # FoundRequestButNotResponse: a join-next without its response yet
ALL_PROCESSED = _Marker("ALL_PROCESSED")  # a JoinNextTooMany, or a JoinNextTry that found nothing to await
TRY_PENDING = _Marker("TRY_PENDING")  # a JoinNextTry that found no response

DELAY = "delay"  # the "component type" of a delay in the unawaited map (§2.4)


# =============================================================================================
# 6. The ports: what the executor supplies
# =============================================================================================


@dataclass(frozen=True)
class NewExecution:
    """An execution to create with the events that request it: a child (``parent`` set,
    §2.3) or a scheduled top-level one (``scheduled_by`` set, §2.11)."""

    execution_id: str
    ffqn: str
    params: list[Any]
    scheduled_at: datetime
    parent: tuple[str, str] | None = None
    scheduled_by: str | None = None
    component_type: str | None = None


class Writer(Protocol):
    def append(self, version: int, events: Sequence[Any], creates: Sequence[NewExecution]) -> None:
        """Write ``events`` at versions ``version, version+1, ...`` and create ``creates``, in
        one transaction (``append_batch_create_new_execution``)."""

    def stub(self, ffqn: str, target: ExecutionId, retval: RetVal) -> bool:
        """Finish ``target`` with ``retval`` and respond to its parent (§2.12 step 3). True when
        the target now holds this value (written, or already equal); False when it holds another
        (or raise ``errors.StubConflict``). ``errors.NotFound``: no such execution;
        ``errors.ValidationFailed``: its function is not ``ffqn``."""


class Waiter(Protocol):
    """Await (§4.2) waits holding the run's lock (``holds_lock``), so its join-nexts keep
    the row until the lock's expiry. A parked Interrupt run (D77) waits without it: its
    join-nexts hand the row on, as every Interrupt run's do, and it goes on only if this
    worker's next claim of the row hands it the new lock."""

    holds_lock: bool

    def wait_for_responses(self, after_seq: int) -> Sequence[Any]:
        """Block until responses with ``seq > after_seq`` exist and return them, or return
        nothing when the run must stop waiting (its lock deadline; a parked run not resumed)."""


class Canceller(Protocol):
    """Best-effort cancellation while closing a join set (§5.1); errors are ignored."""

    def cancel_activity(self, child_id: ExecutionId) -> None: ...

    def cancel_delay(self, delay_id: DelayId) -> None: ...


class Lease(Protocol):
    """The run's lock. ``extend_if_close`` runs at the start of every host call (decision 5);
    ``lock_expires_at`` is the ``run_expires_at`` of join-nexts under Await (§4.2)."""

    lock_expires_at: datetime

    def extend_if_close(self) -> None: ...


# =============================================================================================
# 7. Writes and their buffer (§3.6 CachingDbConnection)
# =============================================================================================


class WriteBuffer:
    """Numbers every event optimistically (``next_version``) and writes it through the Writer.

    ``batch_size`` 0 writes each non-blocking event at once; N > 0 buffers them and writes the
    buffer as one transaction when it holds N events, before every blocking write, and when the
    run ends (``flush``). Buffered events are not durable; a crash loses them harmlessly, as the
    next run writes them again (§3.6, Q6)."""

    def __init__(self, writer: Writer, next_version: int, batch_size: int = 0):
        self.writer = writer
        self.next_version = next_version
        self.batch_size = batch_size
        self._first_version = next_version
        self._events: list[Any] = []
        self._creates: list[NewExecution] = []

    def non_blocking(self, event: Any, creates: Sequence[NewExecution] = ()) -> int:
        version = self.next_version
        self.next_version += 1
        if not self.batch_size:
            self._write(version, [event], creates)
            return version
        if not self._events:
            self._first_version = version
        self._events.append(event)
        self._creates.extend(creates)
        if len(self._events) >= self.batch_size:
            self.flush()
        return version

    def blocking(self, events: Sequence[Any], creates: Sequence[NewExecution] = ()) -> int:
        """Flush, then write ``events`` (a composite call) in one transaction."""
        self.flush()
        version = self.next_version
        self._write(version, events, creates)
        self.next_version += len(events)
        return version

    def flush(self) -> None:
        if not self._events:
            return
        events, creates = self._events, self._creates
        self._events, self._creates = [], []
        self._write(self._first_version, events, creates)

    def _write(self, version: int, events: Sequence[Any], creates: Sequence[NewExecution]) -> None:
        try:
            self.writer.append(version, list(events), list(creates))
        except Exception as error:
            raise WriteFailed(f"writing at version {version} failed: {error}") from error


# =============================================================================================
# 8. What the processed prefix holds: indexes, counters, id derivation (§1.2, §1.5, §1.6)
# =============================================================================================


class ProcessedIndex:
    """Fed only with processed events ("do not look into the future"), so every id and every
    decision derived here is the same in the first run and in any replay (§7 inv. 2)."""

    def __init__(self, execution_id: ExecutionId):
        self.execution_id = execution_id
        self.join_sets: set[str] = set()
        self.child_ffqn: dict[str, str] = {}
        self.delay_expires_at: dict[str, datetime] = {}
        self._kinds: Counter[str] = Counter()
        self._children: Counter[str] = Counter()
        self._delays: Counter[str] = Counter()
        self._consumed: Counter[str] = Counter()

    def record(self, event: Any) -> None:
        match event:
            case JoinSetCreate():
                self.join_sets.add(event.join_set_id)
                self._kinds[event.join_set_id.partition(":")[0]] += 1
            case JoinSetRequest(request=ChildExecutionRequest() as r):
                self.child_ffqn[r.child_execution_id] = r.target_ffqn
                self._children[event.join_set_id] += 1
            case JoinSetRequest(request=DelayRequest() as r):
                self.delay_expires_at[r.delay_id] = r.expires_at
                self._delays[event.join_set_id] += 1
            case JoinNext() | JoinNextTry(outcome="found"):
                self._consumed[event.join_set_id] += 1

    def submissions(self, join_set_id: str) -> int:
        """Children and delays requested in the join set (``count_submissions``)."""
        return self._children[join_set_id] + self._delays[join_set_id]

    def consumed(self, join_set_id: str) -> int:
        """Consuming join-nexts of the join set, closing ones included (decision 9)."""
        return self._consumed[join_set_id]

    def generated_join_set(self) -> JoinSetId:
        """``g:<N>`` (§2.1)."""
        return JoinSetId("g", str(self._kinds["g"] + 1))

    def named_join_set(self, name: str) -> JoinSetId:
        """``n:<name>`` (§2.2): valid (decision 6) and unused, else nothing is recorded."""
        join_set = _join_set_id("n", name)
        if str(join_set) in self.join_sets:
            raise JoinSetConflict(f"join set `{join_set}` already exists")
        return join_set

    def one_off_join_set(self, suffix: str) -> JoinSetId:
        """``o:<N>-<suffix>``; direct calls, invokes and sleeps share the counter (§1.2)."""
        _join_set_id("o", suffix)
        return JoinSetId("o", f"{self._kinds['o'] + 1}-{suffix}")

    def child_id(self, join_set: JoinSetId) -> ExecutionId:
        """``<parent>.<js>_<idx>``, idx from 1 (§1.2)."""
        return self.execution_id.child(join_set, self._children[str(join_set)] + 1)

    def delay_id(self, join_set: JoinSetId) -> DelayId:
        """``Delay_<parent>.<js>_<idx>``, idx from 1 (decision 2; upstream's submit-delay is 0-based, Q9)."""
        return DelayId(self.execution_id, join_set, self._delays[str(join_set)] + 1)


def _join_set_id(kind: str, name: str) -> JoinSetId:
    try:
        return JoinSetId(kind, name)
    except errors.InvalidId as error:
        raise InvalidJoinSetName(str(error)) from None


# =============================================================================================
# 9. Responses known so far, consumed FIFO per join set (§1.6, §7 inv. 3)
# =============================================================================================


class ResponseQueue:
    """The n-th consuming join-next of a join set gets the n-th response of that join set, by
    ``seq``, children and delays alike: the same rule the store uses to unblock (decision 9)."""

    def __init__(self):
        self.last_seq = 0
        self._unconsumed: dict[str, deque[Any]] = {}
        self._consumed_children: dict[str, Any] = {}

    def add(self, responses: Iterable[Any]) -> None:
        for response in sorted(responses, key=lambda r: r.seq):
            if response.seq <= self.last_seq:
                continue  # already known: waiters may return overlapping batches
            self.last_seq = response.seq
            self._unconsumed.setdefault(response.join_set_id, deque()).append(response)

    def peek(self, join_set_id: str) -> Any | None:
        queue = self._unconsumed.get(join_set_id)
        return queue[0] if queue else None

    def pop(self, join_set_id: str) -> Any:
        response = self._unconsumed[join_set_id].popleft()
        if response.child_execution_id is not None:
            self._consumed_children[response.child_execution_id] = response
        return response

    def consumed_child(self, child_id: str) -> Any | None:
        return self._consumed_children.get(child_id)


# =============================================================================================
# 10. Randomness (decision 4; §1.2, §2.13 with the Q10 off-by-one fixed)
# =============================================================================================


class DeterministicRandom:
    """``random.Random`` seeded with ``ExecutionId.random_seed()``, re-seeded every run. Draws
    use only ``getrandbits`` (stable across Python versions) with rejection sampling. Every draw
    is recorded: random values as ``Persist``, schedule ids inside ``Schedule``."""

    ALPHABET = string.ascii_letters + string.digits
    CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"

    def __init__(self, seed: int):
        self._rng = random.Random(seed)

    def between(self, low: int, high: int) -> int:
        """Uniform in ``[low, high]``, both inclusive."""
        span = high - low + 1
        bits = span.bit_length()
        while True:
            draw = self._rng.getrandbits(bits)
            if draw < span:
                return low + draw

    def text(self, length: int) -> str:
        return "".join(self.ALPHABET[self.between(0, len(self.ALPHABET) - 1)] for _ in range(length))

    def ulid_randomness(self) -> str:
        """The 80 random bits of a ULID, as 16 Crockford base-32 characters."""
        bits = self._rng.getrandbits(80)
        return "".join(self.CROCKFORD[(bits >> shift) & 31] for shift in range(75, -1, -5))


U64_MAX = 2**64 - 1
NOW_KIND = {"type": "now"}


def _decode_persisted(event: Persist) -> int | str | datetime:
    raw = bytes(event.value)
    match event.kind.get("type"):
        case "random_u64":
            return int.from_bytes(raw, "big")
        case "now":
            return datetime.fromisoformat(raw.decode())
    return raw.decode()


# =============================================================================================
# 11. The event history of one run
# =============================================================================================


@dataclass(frozen=True)
class Recorded:
    version: int
    event: Any


class EventHistory:
    """One run's view of a workflow execution: the recorded history and its processed-prefix
    cursor (§1.6), the responses known so far, and every host call (§2) as replay-or-write.

    ``history``: the recorded history events, as ``(version, event)`` pairs or the store's
    records (``.version``, ``.event``; a ``HistoryEventRecord`` is unwrapped). ``next_version``:
    the version the next written event gets. ``waiter`` None is the Interrupt strategy (§4.1);
    with a waiter, blocking calls wait (Await, §4.2). ``batch_size`` buffers writes under
    either strategy (§3.6; upstream buffers only under Await, decisions.md D60).
    """

    def __init__(
        self,
        execution_id: ExecutionId | str,
        history: Iterable[Any],
        responses: Iterable[Any],
        *,
        next_version: int,
        writer: Writer,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        waiter: Waiter | None = None,
        canceller: Canceller | None = None,
        lease: Lease | None = None,
        batch_size: int = 0,
    ):
        self.execution_id = ExecutionId.parse(execution_id)
        self._events = [_recorded(item) for item in history]
        self._recorded_count = len(self._events)
        self._cursor = 0
        self._index = ProcessedIndex(self.execution_id)
        self._queue = ResponseQueue()
        self._queue.add(responses)
        self._open: dict[str, dict[str, str]] = {}  # open join set -> unawaited id -> component type
        self._buffer = WriteBuffer(writer, next_version, batch_size)
        self._writer = writer
        self._clock = clock
        self._waiter = waiter
        self._canceller = canceller
        self._lease = lease
        self._rng = DeterministicRandom(self.execution_id.random_seed())
        self._poison: WorkflowSignal | None = None

    # -- state ------------------------------------------------------------------------------

    @property
    def is_replaying(self) -> bool:
        """Recorded events remain unprocessed: logs are demoted (§2.15)."""
        return self._cursor < len(self._events)

    @property
    def position(self) -> int:
        """How many events (recorded or new) have been processed: the cursor (§1.6)."""
        return self._cursor

    @property
    def poisoned(self) -> WorkflowSignal | None:
        return self._poison

    @property
    def next_version(self) -> int:
        return self._buffer.next_version

    def open_join_sets(self) -> dict[str, list[str]]:
        """Open join sets in creation order, with their unawaited ids in submission order."""
        return {js: list(unawaited) for js, unawaited in self._open.items()}

    def reserve_versions(self, count: int) -> None:
        """The executor wrote ``count`` events of its own at ``next_version`` (a ``Locked``
        by the same run that keeps a resolved wait's run going, spec 000 §10, after a
        ``flush``): later writes come after them."""
        self._buffer.flush()
        self._buffer.next_version += count

    def add_responses(self, responses: Iterable[Any]) -> None:
        """Responses that arrived after the history was loaded (the Await loop, §4.2)."""
        self._queue.add(responses)

    def refused(self, error: FatalWorkflowError) -> WorkflowSignal:
        """A host call the context refused before it reached the history (a function that is
        not registered, arguments that do not fit, D98): what to raise. It poisons the
        history as a fatal error of the history's own does (§8.1), so the run fails at once;
        after an earlier signal, that one (the first is kept)."""
        if self._poison is None:
            self._poison = error
        return self._poison

    def flush(self) -> None:
        """Write buffered events (§3.6); the end of every run flushes (``finalize``)."""
        with self._host_call(extend=False):
            self._buffer.flush()

    # -- §3.4: the matching table -------------------------------------------------------------

    def process_event_by_key(self, key: Key) -> Any:
        """Match ``key`` against the first unprocessed event (§3.4). Returns ``NOT_FOUND`` when
        there is none, ``PENDING`` for a join-next whose response is not known yet, otherwise
        the outcome; any other pair is ``NondeterminismDetected`` (§3.7)."""
        if self._cursor == len(self._events):
            return NOT_FOUND
        event = self._events[self._cursor].event
        match key, event:
            case CreateJoinSetKey(), JoinSetCreate() if _same(key, event, JS):
                return self._advance(JoinSetId.parse(event.join_set_id))
            case PersistKey(), Persist() if key.matches(event):
                return self._advance(_decode_persisted(event))
            case ChildRequestKey(), JoinSetRequest(request=ChildExecutionRequest()) if key.matches(event):
                return self._advance(ExecutionId.parse(event.request.child_execution_id))
            case DelayRequestKey(), JoinSetRequest(request=DelayRequest()) if key.matches(event):
                return self._advance(DelayId.parse(event.request.delay_id))
            case JoinNextChildKey(kind=JoinNextKind.AWAIT_NEXT), JoinNextTooMany() if _same(key, event, JS, FFQN):
                return self._advance(ALL_PROCESSED)
            case JoinNextChildKey(), JoinNext(closing=False) if _same(key, event, JS, FFQN):
                return self._consume(event.join_set_id)
            case JoinNextDelayKey(), JoinNext(requested_ffqn=None, closing=False) if _same(key, event, JS):
                return self._consume(event.join_set_id)
            case JoinNextKey(), JoinNext(requested_ffqn=None) if _same(key, event, JS, "closing"):
                return self._consume(event.join_set_id)
            case JoinNextKey(closing=False), JoinNextTooMany(requested_ffqn=None) if _same(key, event, JS):
                return self._advance(ALL_PROCESSED)
            case JoinNextTryKey(), JoinNextTry() if _same(key, event, JS):
                return self._replay_try(event)
            case ScheduleKey(), Schedule() if key.matches(event):
                return self._advance(ExecutionId.parse(event.execution_id))
            case StubKey(), Stub() if _same(key, event, "target_execution_id", "retval_hash"):
                return self._advance(event.result == {"Ok": None})
        raise self._mismatch(key)

    def _advance(self, outcome: Any) -> Any:
        """Mark the event at the cursor processed: it now counts for ids and decisions."""
        self._index.record(self._events[self._cursor].event)
        self._cursor += 1
        return outcome

    def _consume(self, join_set_id: str) -> Any:
        """Peek (§3.4): the first unconsumed response of the join set resolves the join-next at
        the cursor; without one nothing is marked and the result is ``PENDING``."""
        response = self._queue.peek(join_set_id)
        if response is None:
            if self._cursor < self._recorded_count:  # decision 2: upstream panics here
                log.warning(
                    "%s: recorded %s at version %d has no loaded response; waiting or interrupting",
                    self.execution_id,
                    describe_event(self._events[self._cursor].event),
                    self._events[self._cursor].version,
                )
            return PENDING
        self._queue.pop(join_set_id)
        return self._advance(self._outcome_of(response))

    def _outcome_of(self, response: Any) -> ChildOutcome | DelayOutcome:
        if response.child_execution_id is not None:
            child = response.child_execution_id
            return ChildOutcome(ExecutionId.parse(child), self._index.child_ffqn[child], response.child_retval)
        expires_at = self._index.delay_expires_at[response.delay_id]
        return DelayOutcome(DelayId.parse(response.delay_id), bool(response.delay_success), expires_at)

    def _replay_try(self, event: JoinNextTry) -> Any:
        if event.outcome == "found":
            return self._consume(event.join_set_id)
        return self._advance(ALL_PROCESSED if event.outcome == "all_processed" else TRY_PENDING)

    def _mismatch(self, key: Key) -> NondeterminismDetected:
        entry = self._events[self._cursor]
        return NondeterminismDetected(
            f"key does not match event stored at version {entry.version}: key: {key}, "
            f"event: {describe_event(entry.event)}\n"
            f"  position: event {self._cursor + 1} of {len(self._events)} in the history, version {entry.version}\n"
            + side_by_side(key, entry.event)
        )

    # -- §3.2, §3.3, §3.5: one call --------------------------------------------------------------

    @contextmanager
    def _host_call(self, extend: bool = True) -> Iterator[None]:
        """Every host call: refuse after a signal (poison), extend the lock if it is close to
        expiry (decision 5), and poison on the first signal raised (§8.1)."""
        if self._poison is not None:
            raise self._poison
        try:
            if extend and self._lease is not None:
                self._extend_lease()
            yield
        except WorkflowSignal as signal:
            self._poison = signal
            raise

    def _extend_lease(self) -> None:
        try:
            self._lease.extend_if_close()
        except Exception as error:
            raise WriteFailed(f"extending the lock failed: {error}") from error

    def _apply(self, keys: list[Key], write: Callable[[], None]) -> Any:
        """Replay the call's keys; when the history is exhausted, ``write`` its events and
        match them the same way (§3.2); a join-next without its response waits (§3.5)."""
        outcome = self._replay_keys(keys)
        if outcome is NOT_FOUND:
            write()
            outcome = self._replay_keys(keys)
            assert outcome is not NOT_FOUND, "a written event must match its own key"
        if outcome is PENDING:
            outcome = self._wait_for(keys[-1])
        return outcome

    def _replay_keys(self, keys: list[Key]) -> Any:
        """``find_matching_atomic`` (§3.3): all keys of a call match, or none (history exhausted)."""
        outcome = NOT_FOUND
        for position, key in enumerate(keys):
            outcome = self.process_event_by_key(key)
            if outcome is NOT_FOUND and position > 0:
                raise NondeterminismDetected(f"the history ends inside a one-off call: key: {key} has no event")
            if outcome is NOT_FOUND:
                return NOT_FOUND
        return outcome

    def _wait_for(self, key: Key) -> Any:
        """No response yet for the join-next at the cursor: under Await, wait for more
        responses and try again; under Interrupt, or when the wait ends, interrupt (§4)."""
        self._buffer.flush()
        while self._waiter is not None:
            arrived = self._waiter.wait_for_responses(self._queue.last_seq)
            if not arrived:
                break
            self._queue.add(arrived)
            outcome = self.process_event_by_key(key)
            if outcome is not PENDING:
                return outcome
        raise WorkflowInterrupt(f"waiting for a response in join set `{key.join_set_id}`")

    def _record(self, version: int, events: Sequence[Any]) -> None:
        """Newly written events join the history unprocessed, to be matched by their keys."""
        self._events.extend(Recorded(version + offset, event) for offset, event in enumerate(events))

    def _write_non_blocking(self, event: Any, creates: Sequence[NewExecution] = ()) -> None:
        self._record(self._buffer.non_blocking(event, creates), [event])

    def _write_blocking(self, events: Sequence[Any], creates: Sequence[NewExecution] = ()) -> None:
        self._record(self._buffer.blocking(events, creates), events)

    def _run_expires_at(self, join_set_id: str | None = None) -> datetime:
        """``JoinNext.run_expires_at``: now under Interrupt, the lock's expiry under Await (§4).

        Also the lock's expiry under Interrupt when this run already holds the response it
        is about to consume (``join_set_id``'s next one is loaded): the run goes on, so the
        row must stay this run's until its lock expires. With ``now``, the store would make
        it pending at once and another worker, woken by the notification, would take it
        over mid-run (fenced out, but at the price of a full replay per response)."""
        holds_lock = self._waiter is not None and self._waiter.holds_lock
        if self._lease is not None and (
            holds_lock or (join_set_id is not None and self._queue.peek(join_set_id) is not None)
        ):
            return self._lease.lock_expires_at
        return self._clock()

    def _require_open(self, join_set: JoinSetId | str) -> str:
        """Decision 2 (Q1): checked before anything is written."""
        join_set_id = str(join_set)
        if join_set_id not in self._open:
            raise ConstraintViolation(f"not found in open join sets: `{join_set_id}`")
        return join_set_id

    def _mark_awaited(self, join_set_id: str, outcome: ChildOutcome | DelayOutcome) -> None:
        self._open.get(join_set_id, {}).pop(str(outcome.response_id), None)

    def _expiry(self, schedule_at: ScheduleAt, ffqn: str) -> datetime:
        try:
            return schedule_at.as_datetime(self._clock())
        except OverflowError:
            raise ImportedFunctionCallError(ffqn, "schedule-at conversion error") from None

    # -- §2.1, §2.2: join sets --------------------------------------------------------------------

    def create_join_set(self, name: str | None = None) -> JoinSetId:
        """``g:<N>``, or ``n:<name>`` (``InvalidJoinSetName``/``JoinSetConflict``, nothing recorded)."""
        with self._host_call():
            join_set = self._index.generated_join_set() if name is None else self._index.named_join_set(name)
            key = CreateJoinSetKey(str(join_set))
            created = self._apply([key], lambda: self._write_non_blocking(JoinSetCreate(join_set_id=str(join_set))))
            self._open[str(created)] = {}
            return created

    # -- §2.3, §2.4: submissions ------------------------------------------------------------------

    def submit(
        self, join_set: JoinSetId | str, ffqn: str, params: Sequence[Any], component_type: str = "activity"
    ) -> ExecutionId:
        """Start a child in the join set; ``component_type`` decides what closing does (§5.1)."""
        with self._host_call():
            join_set_id = self._require_open(join_set)
            ffqn = str(FunctionFqn.parse(ffqn))
            child_id = self._index.child_id(JoinSetId.parse(join_set_id))
            key = ChildRequestKey(join_set_id, str(child_id), ffqn, tuple(params))
            child_id = self._apply([key], lambda: self._write_child_request(key, component_type))
            self._open[join_set_id][str(child_id)] = component_type
            return child_id

    def _write_child_request(self, key: ChildRequestKey, component_type: str) -> None:
        request = ChildExecutionRequest(child_execution_id=key.child_id, target_ffqn=key.ffqn, params=list(key.params))
        event = JoinSetRequest(join_set_id=key.join_set_id, request=request)
        self._write_non_blocking(event, [self._child_create(key, component_type)])

    def _child_create(self, key: ChildRequestKey, component_type: str) -> NewExecution:
        parent = (str(self.execution_id), key.join_set_id)
        return NewExecution(key.child_id, key.ffqn, list(key.params), self._clock(), parent, None, component_type)

    def submit_delay(self, join_set: JoinSetId | str, schedule_at: Any) -> DelayId:
        """A durable timer in the join set; its response is ok when it fires (§2.4)."""
        with self._host_call():
            join_set_id = self._require_open(join_set)
            at = ScheduleAt.of(schedule_at)
            delay_id = self._index.delay_id(JoinSetId.parse(join_set_id))
            key = DelayRequestKey(join_set_id, str(delay_id), at)
            expires_at = self._expiry(at, "submit-delay")
            delay_id = self._apply([key], lambda: self._write_non_blocking(_delay_request(key, expires_at)))
            self._open[join_set_id][str(delay_id)] = DELAY
            return delay_id

    # -- §2.5, §2.6, decision 9: join-next ----------------------------------------------------------

    def join_next(self, join_set: JoinSetId | str) -> tuple[ExecutionId | DelayId, bool]:
        """The next response of the join set: ``(id, ok)``; ``AllProcessed`` when nothing is
        left to await (a ``JoinNextTooMany``, which never blocks)."""
        with self._host_call():
            join_set_id = self._require_open(join_set)
            key = JoinNextKey(join_set_id)
            outcome = self._apply([key], lambda: self._write_join_next(join_set_id, None))
            if outcome is ALL_PROCESSED:
                raise AllProcessed(join_set_id)
            self._mark_awaited(join_set_id, outcome)
            return outcome.response_id, outcome.ok

    def await_next(self, join_set: JoinSetId | str, ffqn: str) -> tuple[ExecutionId, RetVal]:
        """The next response, which must be a child of ``ffqn`` (§2.6). Otherwise the response
        is consumed all the same and ``FunctionMismatch`` says what it was."""
        with self._host_call():
            join_set_id = self._require_open(join_set)
            ffqn = str(FunctionFqn.parse(ffqn))
            key = JoinNextChildKey(join_set_id, JoinNextKind.AWAIT_NEXT, ffqn)
            outcome = self._apply([key], lambda: self._write_join_next(join_set_id, ffqn))
            if outcome is ALL_PROCESSED:
                raise AllProcessed(join_set_id)
            self._mark_awaited(join_set_id, outcome)
            if isinstance(outcome, DelayOutcome):
                raise FunctionMismatch(ffqn, None, outcome.delay_id)
            if outcome.ffqn != ffqn:
                raise FunctionMismatch(ffqn, outcome.ffqn, outcome.child_id)
            return outcome.child_id, outcome.retval

    def _write_join_next(self, join_set_id: str, ffqn: str | None) -> None:
        """§2.5 step 2: a ``JoinNext`` while submissions exceed consumed responses, else
        ``JoinNextTooMany``; decided from processed counts only (§7 inv. 6)."""
        if self._index.submissions(join_set_id) > self._index.consumed(join_set_id):
            event = JoinNext(
                join_set_id=join_set_id, run_expires_at=self._run_expires_at(join_set_id), requested_ffqn=ffqn
            )
        else:
            event = JoinNextTooMany(join_set_id=join_set_id, requested_ffqn=ffqn)
        if isinstance(event, JoinNext) and self._queue.peek(join_set_id) is not None:
            # The response it takes is in hand: it cannot block, so under a buffer it is
            # buffered like a cacheable event (decisions.md D46; upstream writes it at once).
            # Lost in a crash, it is written again by the replay, which finds the same
            # response, since responses are only ever appended.
            self._write_non_blocking(event)
        else:
            self._write_blocking([event])

    def try_join_next(self, join_set: JoinSetId | str) -> tuple[ExecutionId | DelayId, bool] | None:
        """Decision 9: like ``join_next`` without blocking; None when no response is there yet.
        A found response is consumed; the recorded outcome is replayed whatever arrived since."""
        with self._host_call():
            join_set_id = self._require_open(join_set)
            key = JoinNextTryKey(join_set_id)
            outcome = self._apply([key], lambda: self._write_join_next_try(join_set_id))
            if outcome is ALL_PROCESSED:
                raise AllProcessed(join_set_id)
            if outcome is TRY_PENDING:
                return None
            self._mark_awaited(join_set_id, outcome)
            return outcome.response_id, outcome.ok

    def _write_join_next_try(self, join_set_id: str) -> None:
        if self._index.submissions(join_set_id) <= self._index.consumed(join_set_id):
            outcome = "all_processed"
        else:
            outcome = "found" if self._queue.peek(join_set_id) is not None else "pending"
        self._write_non_blocking(JoinNextTry(join_set_id=join_set_id, outcome=outcome))

    # -- §2.7: get ---------------------------------------------------------------------------

    def get(self, ffqn: str, child_id: ExecutionId | str) -> RetVal:
        """The value of a child whose response was consumed; never writes, never blocks, no key.
        Checks in order: known and consumed (else not found), then the function (§2.7)."""
        with self._host_call():
            child = ExecutionId.parse(child_id)
            if child.is_top_level:
                raise ImportedFunctionCallError(ffqn, f"`{child}` is not a child execution id")
            known_ffqn = self._index.child_ffqn.get(str(child))
            response = self._queue.consumed_child(str(child))
            if known_ffqn is None or response is None:
                raise NotFoundInProcessedResponses(child)
            if known_ffqn != str(FunctionFqn.parse(ffqn)):
                raise FunctionMismatch(str(ffqn), known_ffqn, child)
            return response.child_retval

    # -- §2.8, §2.9, §2.10: one-off blocking calls ----------------------------------------------

    def call(self, ffqn: str, params: Sequence[Any], component_type: str = "activity") -> Any:
        """Direct call: the child's ok value, or ``ChildFailed`` with its error or failure."""
        child_id, retval = self._one_off_child(FunctionFqn.parse(ffqn).function, ffqn, params, component_type)
        if isinstance(retval, Ok):
            return retval.value
        raise ChildFailed(child_id, retval)

    def invoke(
        self, label: str, ffqn: str, params: Sequence[Any], component_type: str = "activity"
    ) -> tuple[ExecutionId, RetVal]:
        """``-invoke``: a direct call in ``o:<N>-<label>``; an invalid label records nothing."""
        return self._one_off_child(label, ffqn, params, component_type)

    def _one_off_child(
        self, suffix: str, ffqn: str, params: Sequence[Any], component_type: str
    ) -> tuple[ExecutionId, RetVal]:
        """Three events and the child's creation in one transaction, after a flush (§2.8)."""
        with self._host_call():
            ffqn = str(FunctionFqn.parse(ffqn))
            join_set = self._index.one_off_join_set(suffix)
            request = ChildRequestKey(str(join_set), str(self.execution_id.child(join_set, 1)), ffqn, tuple(params))
            keys = [
                CreateJoinSetKey(str(join_set)),
                request,
                JoinNextChildKey(str(join_set), JoinNextKind.DIRECT_CALL, ffqn),
            ]

            def write() -> None:
                child = ChildExecutionRequest(
                    child_execution_id=request.child_id, target_ffqn=ffqn, params=list(request.params)
                )
                events = [
                    JoinSetCreate(join_set_id=str(join_set)),
                    JoinSetRequest(join_set_id=str(join_set), request=child),
                    JoinNext(join_set_id=str(join_set), run_expires_at=self._run_expires_at(), requested_ffqn=ffqn),
                ]
                self._write_blocking(events, [self._child_create(request, component_type)])

            outcome = self._apply(keys, write)
            return outcome.child_id, outcome.retval

    def sleep(self, schedule_at: Any) -> datetime:
        """A one-off delay ``o:<N>-sleep`` (id ``…_1``). Returns the *recorded* expiry, also on
        replay; ``DelayCancelled`` when the delay was cancelled (§2.10)."""
        with self._host_call():
            at = ScheduleAt.of(schedule_at)
            join_set = self._index.one_off_join_set("sleep")
            key = DelayRequestKey(str(join_set), str(DelayId(self.execution_id, join_set, 1)), at)
            expires_at = self._expiry(at, "sleep")
            keys = [CreateJoinSetKey(str(join_set)), key, JoinNextDelayKey(str(join_set))]

            def write() -> None:
                events = [
                    JoinSetCreate(join_set_id=str(join_set)),
                    _delay_request(key, expires_at),
                    JoinNext(join_set_id=str(join_set), run_expires_at=self._run_expires_at()),
                ]
                self._write_blocking(events)

            outcome = self._apply(keys, write)
            if not isinstance(outcome, DelayOutcome):
                raise ConstraintViolation(f"a child responded in the sleep join set `{join_set}`")
            if not outcome.fired:
                raise DelayCancelled(outcome.delay_id)
            return outcome.expires_at

    # -- §2.11, §2.12: schedule and stub ----------------------------------------------------------

    def schedule(self, ffqn: str, params: Sequence[Any], schedule_at: Any = None) -> ExecutionId:
        """Start a new top-level execution (no parent, no response). Its id takes this
        execution's ULID timestamp and 80 bits drawn from the run's RNG (§1.2)."""
        with self._host_call():
            ffqn = str(FunctionFqn.parse(ffqn))
            at = ScheduleAt.of(schedule_at)
            new_id = ExecutionId(self.execution_id.ulid[:10] + self._rng.ulid_randomness())
            key = ScheduleKey(str(new_id), at, ffqn, tuple(params))
            scheduled_at = self._expiry(at, ffqn)
            create = NewExecution(str(new_id), ffqn, list(params), scheduled_at, None, str(self.execution_id))
            return self._apply([key], lambda: self._write_non_blocking(schedule_event(key), [create]))

    def stub(self, ffqn: str, target: ExecutionId | str, retval: Any) -> None:
        """Set the result of a derived execution (normally an activity stub). ``StubConflict``
        when it already holds another value. Not cacheable: the buffer is flushed first, since
        the target may be this run's own buffered child (§2.12)."""
        with self._host_call():
            target_id = ExecutionId.parse(target)
            if target_id.is_top_level:
                raise ImportedFunctionCallError(ffqn, f"`{target_id}` is a top-level execution; it cannot be stubbed")
            value = retval_from_json(retval)
            key = StubKey(str(target_id), retval_hash(value))

            def write() -> None:
                self._buffer.flush()
                held = self._stub_target(ffqn, target_id, value)
                result = {"Ok": None} if held else {"Err": "conflict"}
                event = Stub(target_execution_id=key.target_execution_id, retval_hash=key.retval_hash, result=result)
                self._write_blocking([event])

            if not self._apply([key], write):
                raise StubConflict(target_id)

    def _stub_target(self, ffqn: str, target: ExecutionId, retval: RetVal) -> bool:
        """Decision 2: an unknown target or another function is fatal, not retried forever."""
        try:
            return self._writer.stub(ffqn, target, retval)
        except errors.StubConflict:
            return False
        except errors.NotFound:
            raise ImportedFunctionCallError(ffqn, f"execution `{target}` not found") from None
        except errors.ValidationFailed as error:
            raise ImportedFunctionCallError(ffqn, str(error)) from None
        except Exception as error:
            raise WriteFailed(f"stubbing `{target}` failed: {error}") from error

    # -- §2.13, decision 4: random values and a durable now ----------------------------------------

    def random_u64(self, low: int, high_exclusive: int) -> int:
        """Uniform in ``[low, high_exclusive)`` (Q10 fixed: upstream also draws ``high_exclusive``)."""
        _check_u64_range(low, high_exclusive - 1, high_exclusive)
        return self._random_u64(low, high_exclusive - 1)

    def random_u64_inclusive(self, low: int, high_inclusive: int) -> int:
        _check_u64_range(low, high_inclusive, high_inclusive)
        return self._random_u64(low, high_inclusive)

    def _random_u64(self, low: int, high: int) -> int:
        with self._host_call():
            value = self._rng.between(low, high)
            key = PersistKey({"type": "random_u64", "min": low, "max_inclusive": high}, value.to_bytes(8, "big"))
            return self._apply([key], lambda: self._write_persist(key))

    def random_string(self, min_length: int, max_length_exclusive: int) -> str:
        """Alphanumeric, ``min_length <= len < max_length_exclusive`` (Q10 fixed: upstream
        emits one character more than the length it drew)."""
        if not 0 <= min_length < max_length_exclusive:
            raise ValueError(f"empty length range [{min_length}, {max_length_exclusive})")
        with self._host_call():
            value = self._rng.text(self._rng.between(min_length, max_length_exclusive - 1))
            kind = {"type": "random_string", "min_length": min_length, "max_length_exclusive": max_length_exclusive}
            key = PersistKey(kind, value.encode())
            return self._apply([key], lambda: self._write_persist(key))

    def now(self) -> datetime:
        """Durable time (decision 4): the clock on the first run, the recorded value after."""
        with self._host_call():
            key = PersistKey(NOW_KIND, None)
            return self._apply([key], lambda: self._write_persist(key, self._clock().isoformat().encode()))

    def _write_persist(self, key: PersistKey, value: bytes | None = None) -> None:
        raw = key.value if value is None else value
        self._write_non_blocking(Persist(value=list(raw), kind=key.kind))

    # -- §5.1: closing a join set -------------------------------------------------------------

    def close_join_set(self, join_set: JoinSetId | str) -> None:
        """Cancel the unawaited activities and delays, newest first; then consume one response
        per unawaited request with closing join-nexts, so child workflows are awaited (§5.1)."""
        with self._host_call():
            self._close(self._require_open(join_set))

    def _close(self, join_set_id: str) -> None:
        unawaited = self._open.pop(join_set_id)
        self._buffer.flush()  # the cancellations must reach buffered children and delays
        self._cancel(unawaited)
        for _ in unawaited:
            key = JoinNextKey(join_set_id, closing=True)
            self._apply([key], lambda: self._write_closing_join_next(join_set_id))

    def _write_closing_join_next(self, join_set_id: str) -> None:
        expires = self._run_expires_at(join_set_id)
        self._write_blocking([JoinNext(join_set_id=join_set_id, run_expires_at=expires, closing=True)])

    def _cancel(self, unawaited: dict[str, str]) -> None:
        """Best effort and idempotent, redone on every replay, never recorded (§5.1 step 3)."""
        if self._canceller is None:
            return
        for response_id, component_type in reversed(list(unawaited.items())):
            try:
                if component_type == DELAY:
                    self._canceller.cancel_delay(DelayId.parse(response_id))
                elif component_type in ACTIVITY_TYPES:
                    self._canceller.cancel_activity(ExecutionId.parse(response_id))
            except Exception:
                log.warning("%s: cancelling %s failed; ignored", self.execution_id, response_id, exc_info=True)

    # -- §5.2, §5.3: the end of the function ----------------------------------------------------

    def finalize(self) -> None:
        """Call when the workflow function has returned or raised (a trap). Flushes, then:

        - after an interrupt or a failed write: raises it again, closing nothing (§5.3);
        - after a fatal error: cancels the unawaited activities and delays of every open join
          set (no closing join-nexts: the history is inconsistent) and raises the *first* fatal
          error (decision 2, Q4);
        - otherwise (returned, or trapped: decision 3) closes the open join sets that have
          unawaited requests, newest first, then raises ``NondeterminismDetected`` if a recorded
          event was left unprocessed (§5.2). Closing may wait, or interrupt.
        """
        if not isinstance(self._poison, WriteFailed):
            try:
                self._buffer.flush()
            except WriteFailed as error:
                self._poison = self._poison or error
        if isinstance(self._poison, FatalWorkflowError):
            for unawaited in reversed(list(self._open.values())):
                self._cancel(unawaited)
        if self._poison is not None:
            raise self._poison
        with self._host_call():
            while (join_set_id := self._last_open_with_unawaited()) is not None:
                self._close(join_set_id)
            self._check_all_processed()

    def _last_open_with_unawaited(self) -> str | None:
        return next((js for js, unawaited in reversed(self._open.items()) if unawaited), None)

    def _check_all_processed(self) -> None:
        if self._cursor < len(self._events):
            entry = self._events[self._cursor]
            raise NondeterminismDetected(
                f"found unprocessed request stored at version {entry.version}: event: {describe_event(entry.event)}"
            )


def _recorded(item: Any) -> Recorded:
    version, event = item if isinstance(item, tuple) else (item.version, item.event)
    if isinstance(event, HistoryEventRecord):
        event = event.event
    return Recorded(version, event)


def _delay_request(key: DelayRequestKey, expires_at: datetime) -> JoinSetRequest:
    request = DelayRequest(delay_id=key.delay_id, expires_at=expires_at, schedule_at=key.schedule_at.to_json())
    return JoinSetRequest(join_set_id=key.join_set_id, request=request)


def _check_u64_range(low: int, high: int, bound: int) -> None:
    if not (0 <= low <= high <= U64_MAX):
        raise ValueError(f"empty or out-of-range u64 range: min {low}, bound {bound}")
