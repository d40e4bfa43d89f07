"""The requests and results of the store API."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from executions.events import (
    ComponentId,
    Event,
    Finished,
    Locked,
    Response,  # re-exported: one definition, in the pure core
    RetryConfig,
    RetVal,
)
from executions.models import (
    ExecutionState,
)
from executions.outcome import outcome_of
from executions.state_machine import StateWords


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
class ChildClaim:
    """The children of a write that the writer's own process will run at once: they are
    created locked to ``executor_id`` under ``run_id`` (eager dispatch, D65), at most
    ``limit`` of them, each under the terms of its function in ``functions`` and only if
    it is due now and built from the same component."""

    functions: Mapping[str, LockTerms]
    limit: int
    executor_id: str
    run_id: str
    deployment_id: str


@dataclass
class ParkedRuns:
    """Workflows whose runs are parked in the caller's process (D77): for each, the version
    its run wrote last and the terms to lock it under. A group commit in one statement whose
    child's result answers one of them, found still blocked on that join set at exactly that
    version and due, locks it for ``run_id`` of ``executor_id`` in the same statement,
    instead of making it pending for a claim to lock (D82); ``resumed`` then holds its
    ``Locked`` event (with its generation), that event's version, and the responses the
    group commit gave it."""

    versions: Mapping[str, tuple[int, LockTerms]]
    executor_id: str
    run_id: str
    deployment_id: str
    resumed: dict[str, tuple[Locked, int, list[Response]]] = field(default_factory=dict)


@dataclass(frozen=True)
class EventRecord:
    version: int
    created_at: datetime
    event: Event


@dataclass(frozen=True)
class BlockingStack:
    """A workflow's own frames at a write that may block it (``t_backtrace``)."""

    component_id: dict
    frames: list


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
class LogRecord:
    id: int
    run_id: str
    created_at: datetime
    level: str | None  # trace, debug, info, warn, error; None for a std-stream chunk
    message: str | None
    stream: str | None  # stdout or stderr
    payload: bytes | None


@dataclass(frozen=True)
class ExecutionSnapshot(StateWords):
    """One execution's ``t_state`` row as read: a frozen value, not a saveable model, so a
    reader cannot write around the store. Field names are the table's columns."""

    execution_id: str
    is_top_level: bool
    corresponding_version: int
    ffqn: str
    created_at: datetime
    component_id_input_digest: str
    component_type: str
    first_scheduled_at: datetime
    deployment_id: str
    pending_expires_finished: datetime
    state: str
    updated_at: datetime
    intermittent_event_count: int
    max_retries: int | None
    retry_exp_backoff_millis: int | None
    last_lock_version: int | None
    executor_id: str | None
    run_id: str | None
    lock_generation: int
    join_set_id: str | None
    join_set_closing: bool | None
    result_kind: str | None
    incompatible_digest: str | None
    lifecycle: str

    @classmethod
    def of(cls, row: ExecutionState) -> ExecutionSnapshot:
        return cls(**{name: getattr(row, name) for name in _SNAPSHOT_FIELDS})

    def outcome(self, now: datetime) -> str:
        """``executions.outcome``: ok, error, a failure kind, or where it is now."""
        return outcome_of(self.state, self.lifecycle, self.result_kind, self.pending_expires_finished, now)


_SNAPSHOT_FIELDS = tuple(ExecutionSnapshot.__dataclass_fields__)


@dataclass(frozen=True)
class ExecutionDetail:
    """Everything a person asks about one execution, read from one snapshot: the row, the
    call (arguments, schedule, metadata), the result, and its place in a tree."""

    state: ExecutionSnapshot
    params: list[Any]
    metadata: dict[str, str]
    scheduled_at: datetime
    parent_id: str | None
    children: list[str]
    retval: RetVal | None
    finished_at: datetime | None
    attempts: int  # runs started (``Locked`` events)


@dataclass(frozen=True)
class ExecutionLog:
    state: ExecutionSnapshot
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
    """What delivering a delay's response did (``fire_delay``, ``append_delay_response``);
    what a workflow sees when it consumes that response is ``workers.replay``'s
    ``ConsumedDelay``."""

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
    version: int | None  # None: the next version; only with ``fence`` (a run's own result)
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
    # ``executions.outcome`` names (``failed`` = every failure kind); ORed, like statuses.
    outcomes: tuple[str, ...] = ()
    created_after: datetime | None = None  # inclusive
    created_before: datetime | None = None  # exclusive
    parent_id: str | None = None  # direct children of this execution (implies show_derived)


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
