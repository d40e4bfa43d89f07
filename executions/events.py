"""The JSON stored in ``t_execution_log.json_value`` and how return values are encoded.

Shapes follow the newer Obelisk generation of spec 000 §3 (decision 1): ``ExecutionRequest``
is externally tagged with snake_case variants (unit variants are bare strings),
``HistoryEvent`` is internally tagged by ``"type"``. Timestamps are RFC 3339 with ``Z``;
durations are ``{"secs": .., "nanos": ..}``.

Return values (spec 000 §3.3) are plain JSON here, not WAST values:
``{"ok": v}``, ``{"err": v}`` or ``{"execution_failure": {"kind": .., "reason"?: .., "detail"?: ..}}``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
)

from executions.errors import UnsupportedValue, ValidationFailed

# ---------------------------------------------------------------------------------------
# Scalars
# ---------------------------------------------------------------------------------------


def duration_to_json(value: timedelta) -> dict:
    micros = value // timedelta(microseconds=1)
    secs, rest = divmod(micros, 1_000_000)
    return {"secs": secs, "nanos": rest * 1000}


def duration_from_json(value: Any) -> timedelta:
    if isinstance(value, timedelta):
        return value
    if isinstance(value, dict) and set(value) == {"secs", "nanos"}:
        return timedelta(seconds=value["secs"], microseconds=value["nanos"] // 1000)
    if isinstance(value, (int, float)):
        return timedelta(seconds=value)
    raise ValueError("duration must be {'secs': int, 'nanos': int}")


def _utc(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("timestamps must be timezone-aware")
        try:
            return value.astimezone(UTC)
        except OverflowError:  # year 1 at +14:00, year 9999 at -14:00: no UTC date exists
            raise ValueError("timestamp is out of range: in UTC it must fall in the years 1 to 9999") from None
    return value


Duration = Annotated[
    timedelta,
    BeforeValidator(duration_from_json),
    PlainSerializer(duration_to_json, return_type=dict, when_used="json"),
]
UtcDateTime = Annotated[datetime, BeforeValidator(_utc)]

ComponentType = Literal["activity", "activity_stub", "workflow", "webhook_endpoint", "cron"]
ACTIVITY_TYPES = frozenset({"activity", "activity_stub"})
FailureKind = Literal["timed_out", "nondeterminism_detected", "out_of_fuel", "cancelled", "uncategorized"]


# ---------------------------------------------------------------------------------------
# Return values
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ok:
    value: Any = None


@dataclass(frozen=True, slots=True)
class Err:
    value: Any = None


@dataclass(frozen=True, slots=True)
class ExecutionFailure:
    kind: str
    reason: str | None = None
    detail: str | None = None


RetVal = Ok | Err | ExecutionFailure

RESULT_KIND_OK = '"ok"'
RESULT_KIND_ERROR = '{"err":"error"}'


def result_kind_of(retval: RetVal) -> str:
    """``t_state.result_kind``: the exact JSON text of spec 000 §3.4."""
    if isinstance(retval, Ok):
        return RESULT_KIND_OK
    if isinstance(retval, Err):
        return RESULT_KIND_ERROR
    return json.dumps({"err": {"execution_failure": retval.kind}}, separators=(",", ":"))


def retval_to_json(retval: RetVal) -> dict:
    if isinstance(retval, Ok):
        return {"ok": retval.value}
    if isinstance(retval, Err):
        return {"err": retval.value}
    failure = {"kind": retval.kind}
    if retval.reason is not None:
        failure["reason"] = retval.reason
    if retval.detail is not None:
        failure["detail"] = retval.detail
    return {"execution_failure": failure}


def retval_from_json(data: Any) -> RetVal:
    if isinstance(data, (Ok, Err, ExecutionFailure)):
        return data
    if isinstance(data, dict) and len(data) == 1:
        ((key, value),) = data.items()
        if key == "ok":
            return Ok(value)
        if key == "err":
            return Err(value)
        if key == "execution_failure" and isinstance(value, dict) and "kind" in value:
            if value["kind"] not in FailureKind.__args__:
                raise ValueError(f"unknown execution failure kind `{value['kind']}`")
            return ExecutionFailure(value["kind"], value.get("reason"), value.get("detail"))
    raise ValueError('return value must be {"ok": ..}, {"err": ..} or {"execution_failure": {"kind": ..}}')


RetValField = Annotated[
    Any,
    BeforeValidator(retval_from_json),
    PlainSerializer(retval_to_json, return_type=dict),
]


# ---------------------------------------------------------------------------------------
# Shared records
# ---------------------------------------------------------------------------------------


class Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class ComponentId(Record):
    component_type: ComponentType
    name: str
    component_digest: str

    @field_validator("component_digest")
    @classmethod
    def _digest(cls, value: str) -> str:
        from executions.ids import parse_content_digest

        return parse_content_digest(value)


class RetryConfig(Record):
    max_retries: int | None = Field(default=None, ge=0)
    retry_exp_backoff: Duration = timedelta(0)


RETRY_ZERO = RetryConfig(max_retries=0, retry_exp_backoff=timedelta(0))
RETRY_WORKFLOW = RetryConfig(max_retries=None, retry_exp_backoff=timedelta(0))


# ---------------------------------------------------------------------------------------
# History events (written by workflows; spec 000 §3.2)
# ---------------------------------------------------------------------------------------


class Persist(Record):
    type: Literal["persist"] = "persist"
    value: list[int]
    kind: dict[str, Any]


class JoinSetCreate(Record):
    type: Literal["join_set_create"] = "join_set_create"
    join_set_id: str


class DelayRequest(Record):
    type: Literal["delay_request"] = "delay_request"
    delay_id: str
    expires_at: UtcDateTime
    schedule_at: Any = "now"
    paused: bool = False


class ChildExecutionRequest(Record):
    type: Literal["child_execution_request"] = "child_execution_request"
    child_execution_id: str
    target_ffqn: str
    params: list[Any]
    result: Any = {"Ok": None}


class JoinSetRequest(Record):
    type: Literal["join_set_request"] = "join_set_request"
    join_set_id: str
    request: Annotated[DelayRequest | ChildExecutionRequest, Field(discriminator="type")]


class JoinNext(Record):
    type: Literal["join_next"] = "join_next"
    join_set_id: str
    run_expires_at: UtcDateTime
    requested_ffqn: str | None = None
    closing: bool = False


class JoinNextTry(Record):
    type: Literal["join_next_try"] = "join_next_try"
    join_set_id: str
    outcome: Literal["found", "pending", "all_processed"]


class JoinNextTooMany(Record):
    type: Literal["join_next_too_many"] = "join_next_too_many"
    join_set_id: str
    requested_ffqn: str | None = None


class Schedule(Record):
    """A new top-level execution the workflow scheduled. ``target_ffqn`` and ``params``
    (decision 16, beyond spec 000 §3.2) make changing what is scheduled nondeterminism."""

    type: Literal["schedule"] = "schedule"
    execution_id: str
    schedule_at: Any = "now"
    target_ffqn: str | None = None
    params: list[Any] | None = None
    result: Any = {"Ok": None}


class Stub(Record):
    type: Literal["stub"] = "stub"
    target_execution_id: str
    retval_hash: str
    result: Any = {"Ok": None}


HistoryEvent = Annotated[
    Persist | JoinSetCreate | JoinSetRequest | JoinNext | JoinNextTry | JoinNextTooMany | Schedule | Stub,
    Field(discriminator="type"),
]


# ---------------------------------------------------------------------------------------
# Execution log events (spec 000 §3.1)
# ---------------------------------------------------------------------------------------


class Event(Record):
    """Base of the ``ExecutionRequest`` variants; ``VARIANT`` is the ``variant`` column."""

    VARIANT: ClassVar[str] = ""
    UNIT: ClassVar[bool] = False


class Created(Event):
    VARIANT: ClassVar[str] = "created"
    ffqn: str
    params: list[Any]
    parent: tuple[str, str] | None = None
    scheduled_at: UtcDateTime
    component_id: ComponentId
    deployment_id: str
    metadata: dict[str, str] = {}
    scheduled_by: str | None = None
    # Submitted paused (a ``Paused`` event follows at version 1). Recorded so that a
    # resubmission under the same id is compared with what was asked, not with the state
    # since (D104); written only when true, so every other ``Created`` reads as before.
    paused: bool = Field(default=False, exclude_if=lambda paused: not paused)


class Locked(Event):
    VARIANT: ClassVar[str] = "locked"
    component_id: ComponentId
    executor_id: str
    deployment_id: str
    run_id: str
    lock_expires_at: UtcDateTime
    retry_config: RetryConfig
    lock_generation: int = 0  # written by the store: the generation this lock holds


class Unlocked(Event):
    VARIANT: ClassVar[str] = "unlocked"
    unlocked_at: UtcDateTime = Field(alias="backoff_expires_at")
    reason: str


class ComponentUpgradeFinished(Event):
    VARIANT: ClassVar[str] = "component_upgrade_finished"
    component_digest: str
    deployment_id: str
    outcome: dict[str, Any]

    @property
    def succeeded(self) -> bool:
        return self.outcome.get("type") == "success"


class TemporarilyFailed(Event):
    VARIANT: ClassVar[str] = "temporarily_failed"
    backoff_expires_at: UtcDateTime
    reason: str
    detail: str | None = None
    http_client_traces: list[Any] | None = None


class TemporarilyTimedOut(Event):
    """An attempt that ran out of time. ``reason`` (an addition to spec 000 §3.1) tells a
    real timeout ("timed out after …", written by the attempt's own watchdog) from a lock
    that expired because its worker vanished ("lock expired: …", written by the sweep)."""

    VARIANT: ClassVar[str] = "temporarily_timed_out"
    backoff_expires_at: UtcDateTime
    reason: str | None = None
    http_client_traces: list[Any] | None = None


class Finished(Event):
    VARIANT: ClassVar[str] = "finished"
    retval: RetValField
    http_client_traces: list[Any] | None = None


class HistoryEventRecord(Event):
    VARIANT: ClassVar[str] = "history_event"
    event: HistoryEvent


class Paused(Event):
    VARIANT: ClassVar[str] = "paused"
    UNIT: ClassVar[bool] = True


class Unpaused(Event):
    VARIANT: ClassVar[str] = "unpaused"
    UNIT: ClassVar[bool] = True


class CancellationRequested(Event):
    VARIANT: ClassVar[str] = "cancellation_requested"
    UNIT: ClassVar[bool] = True


class Rescheduled(Event):
    """An operator moved a pending execution's due time ("run now"): an addition to spec
    000 §3.1 (decisions.md D54). Counts no failure and touches no lock."""

    VARIANT: ClassVar[str] = "rescheduled"
    scheduled_at: UtcDateTime


EVENT_CLASSES: dict[str, type[Event]] = {
    cls.VARIANT: cls
    for cls in (
        Created,
        Locked,
        Unlocked,
        ComponentUpgradeFinished,
        TemporarilyFailed,
        TemporarilyTimedOut,
        Finished,
        HistoryEventRecord,
        Paused,
        Unpaused,
        CancellationRequested,
        Rescheduled,
    )
}
VARIANTS = tuple(EVENT_CLASSES)


def event_to_json(event: Event) -> Any:
    if event.UNIT:
        return event.VARIANT
    return {event.VARIANT: event.model_dump(mode="json", by_alias=True)}


def event_from_json(data: Any) -> Event:
    """Parse a stored ``json_value``; a row that does not parse is a consistency error."""
    try:
        if isinstance(data, str):
            cls = EVENT_CLASSES[data]
            if not cls.UNIT:
                raise KeyError(data)
            return cls()
        ((variant, body),) = data.items()
        cls = EVENT_CLASSES[variant]
        return cls.model_validate(body)
    except (KeyError, ValueError, TypeError, ValidationError) as error:
        raise ValidationFailed(f"cannot deserialize event: {error}") from None


def history_event_type(event: Event) -> str | None:
    return event.event.type if isinstance(event, HistoryEventRecord) else None


def event_join_set_id(event: Event) -> str | None:
    """The ``join_set_id`` column: a child's parent join set on ``Created``, and the join set
    of ``JoinSetCreate``/``JoinSetRequest``/``JoinNext``/``JoinNextTry`` (decision 9)."""
    if isinstance(event, Created):
        return event.parent[1] if event.parent else None
    if isinstance(event, HistoryEventRecord) and isinstance(
        event.event, (JoinSetCreate, JoinSetRequest, JoinNext, JoinNextTry)
    ):
        return event.event.join_set_id
    return None


def consumes_response(event: Event) -> bool:
    """A ``JoinNext``, or a ``JoinNextTry`` that found a response (decision 9)."""
    if not isinstance(event, HistoryEventRecord):
        return False
    inner = event.event
    return isinstance(inner, JoinNext) or (isinstance(inner, JoinNextTry) and inner.outcome == "found")


@dataclass(frozen=True)
class Response:
    """A row of ``t_join_set_response``: a child's result or a delay's end, as the parent sees
    it (spec 002 §1.4). ``seq`` is the per-parent cursor. The store reads and hands these out;
    replay consumes them."""

    seq: int
    created_at: datetime
    join_set_id: str
    delay_id: str | None = None
    delay_success: bool | None = None
    child_execution_id: str | None = None
    finished_version: int | None = None
    child_retval: RetVal | None = None

    @classmethod
    def of(cls, seq, created_at, join_set_id, delay_id, delay_success, child_id, finished_version, child_finished):
        """A response as stored: ``child_finished`` is the child's ``Finished`` event as its
        JSON reads back from the log (None for a delay). The one way both the read and a
        group commit's hand-over (D67) make it, so a run sees the same value either way."""
        retval = retval_from_json(child_finished[Finished.VARIANT]["retval"]) if child_finished else None
        return cls(seq, created_at, join_set_id, delay_id, delay_success, child_id, finished_version, retval)


def check_storable(value: Any, what: str, *, max_depth: int) -> None:
    """Refuse what both databases cannot store exactly: non-JSON values (NaN, infinities,
    other types, non-string keys), NUL characters (PostgreSQL text cannot hold U+0000, and
    SQLite must behave the same), lone surrogates (not Unicode), and nesting deeper than
    ``max_depth`` (which would exhaust the stack of every recursive encoder and decoder).

    Iterative, so a value nested 50,000 deep is refused, not a ``RecursionError``.
    """
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            raise UnsupportedValue(f"{what} is nested more than {max_depth} levels deep")
        if item is None or isinstance(item, (bool, int)):
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise UnsupportedValue(f"{what} holds {item!r}, which is not JSON")
        elif isinstance(item, str):
            check_text(item, what)
        elif isinstance(item, (list, tuple)):
            stack.extend((element, depth + 1) for element in item)
        elif isinstance(item, dict):
            for key, element in item.items():
                if not isinstance(key, str):
                    raise UnsupportedValue(f"{what} has a {type(key).__name__} key; JSON keys are strings")
                check_text(key, what)
                stack.append((element, depth + 1))
        else:
            raise UnsupportedValue(f"{what} holds a {type(item).__name__}, which is not JSON")


def check_text(text: str, what: str) -> str:
    """Refuse a NUL character or a lone surrogate in ``text``."""
    if "\x00" in text:
        raise UnsupportedValue(f"{what} contains a NUL character (U+0000), which cannot be stored")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise UnsupportedValue(f"{what} contains a lone surrogate, which is not valid Unicode") from None
    return text


def storable_text(text: str) -> str:
    """``text`` with NUL characters and lone surrogates escaped: for failure reasons and
    tracebacks, which are recorded whatever they contain (decisions.md D14)."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


_COMPACT = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def compact_json(value: Any) -> str:
    """``value`` as compact JSON text, characters kept as they are; NaN and infinities are
    not JSON and raise. One encoder, made once: ``json.dumps`` with options builds a new one
    at every call (1-3 µs), and the hot path encodes several values per execution."""
    return _COMPACT.encode(value)


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON; NaN and infinities are not JSON and raise."""
    return len(compact_json(value).encode())


def canonical_json(value: Any) -> str:
    """Canonical JSON text, for comparing parameters and return values."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
