"""Deterministic keys and how recorded events read beside them (spec 002 §1.3, §1.7, §3.4).

``ScheduleAt`` is when a delay expires or a scheduled execution starts. Each host call turns
into one or more *keys*; replay matches a key against the next recorded event on the fields
of §3.4's "Equal on" column (a Schedule key also holds function and params: decision 16).
``describe_event`` is an event's Display form in messages, and ``side_by_side`` shows a
mismatched key and event field by field (§3.7). Used by ``workers.replay.cursor``
(matching) and ``workers.replay.history`` (the host calls).

why: spec/README.md decision 16.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any

from executions import errors
from executions.events import (
    ChildExecutionRequest,
    DelayRequest,
    JoinNext,
    JoinNextTooMany,
    JoinNextTry,
    JoinSetCreate,
    JoinSetRequest,
    Persist,
    RetVal,
    Schedule,
    Stub,
    canonical_json,
    duration_from_json,
    duration_to_json,
    retval_to_json,
)


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


def same_fields(key: Any, event: Any, *fields: str) -> bool:
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
