"""The execution state machine, in one place (spec 000 §4, §5, §10).

An execution's state is a pair: ``state`` (``pending_at`` / ``locked`` /
``blocked_by_join_set`` / ``finished``) and the ``lifecycle`` overlay (``active`` /
``paused`` / ``cancelling``). ``RULES`` says, for each kind of appended event and each
state pair, which ``Effect`` the append has or which error rejects it; the first matching
rule wins. ``store.append`` consults it before writing anything, so a rejected event leaves
no trace. ``docs/architecture.md`` shows the same table as a matrix
(``python manage.py obelisk_state_table`` prints it).

The retry rule (back-off ``backoff * 2^(n-1)``) and the decision taken when a lock expires
live here too, so executors and the timer sweep cannot disagree.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime, timedelta

from executions import errors
from executions.events import (
    DelayRequest,
    Event,
    ExecutionFailure,
    Finished,
    HistoryEventRecord,
    JoinNext,
    JoinSetRequest,
    Locked,
    TemporarilyFailed,
    TemporarilyTimedOut,
    Unlocked,
)


class State(enum.StrEnum):
    PENDING_AT = "pending_at"
    LOCKED = "locked"
    BLOCKED_BY_JOIN_SET = "blocked_by_join_set"
    FINISHED = "finished"


class Lifecycle(enum.StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    CANCELLING = "cancelling"


class StateWords:
    """What a ``t_state`` row says in words, for the model and its frozen snapshot alike
    (they need ``state``, ``lifecycle`` and ``corresponding_version``)."""

    @property
    def is_finished(self) -> bool:
        return self.state == State.FINISHED

    @property
    def next_version(self) -> int:
        """The version the next appended event must carry (the finished event's own, once finished)."""
        return self.corresponding_version if self.is_finished else self.corresponding_version + 1

    @property
    def status(self) -> str:
        """One word for lists: the lifecycle overlay wins over the state."""
        return self.lifecycle if self.lifecycle != Lifecycle.ACTIVE else self.state


# The state pairs a row may be in (spec 000 §4); anything else is a consistency error and is
# also refused by the table's check constraints.
VALID_STATES: tuple[tuple[State, Lifecycle], ...] = (
    (State.PENDING_AT, Lifecycle.ACTIVE),
    (State.LOCKED, Lifecycle.ACTIVE),
    (State.BLOCKED_BY_JOIN_SET, Lifecycle.ACTIVE),
    (State.PENDING_AT, Lifecycle.PAUSED),
    (State.BLOCKED_BY_JOIN_SET, Lifecycle.PAUSED),
    (State.PENDING_AT, Lifecycle.CANCELLING),
    (State.LOCKED, Lifecycle.CANCELLING),
    (State.BLOCKED_BY_JOIN_SET, Lifecycle.CANCELLING),
    (State.FINISHED, Lifecycle.ACTIVE),
)


class Effect(enum.StrEnum):
    """What an accepted event does to ``t_state`` (the UPDATE shapes of spec 000 §6.5)."""

    LOCK = "→ locked"  # C; guarded by check_lock()
    TO_PENDING = "→ pending_at"  # A, intermittent +0
    RETRY = "→ pending_at, +1 failure"  # A, intermittent +1
    JOIN_NEXT = "→ blocked, or pending_at if answered"  # D, or A when the n-th response is there
    DELAY = "bump + timer"  # J + t_delay row
    BUMP = "bump"  # J
    PAUSE = "→ paused"  # F
    UNPAUSE = "→ active"  # F
    CANCEL = "→ cancelling"  # G
    RESCHEDULE = "→ pending_at, new due time"  # an operator's "run now" (D54)
    UPGRADE = "bump + component"  # H (success) or I (failure)
    FINISH = "→ finished"  # E


@dataclass(frozen=True)
class Reject:
    error: type[errors.StoreError]
    message: str | None = None

    def raise_(self):
        if self.error is errors.UnlockedCannotBeAppended:
            raise errors.UnlockedCannotBeAppended(self.message)
        raise self.error(self.message or "")

    def __str__(self) -> str:
        return f"{self.error.__name__}" + (f"({self.message})" if self.message else "")


ANY = "*"
PENDING, LOCKED, BLOCKED, FINISHED = State
ACTIVE, PAUSED, CANCELLING = Lifecycle

# (event kind, state, lifecycle, outcome) -- first match wins.
RULES: tuple[tuple[str, str, str, Effect | Reject], ...] = (
    ("created", ANY, ANY, Reject(errors.ValidationFailed, "cannot append `Created` event - use `create` instead")),
    ("locked", FINISHED, ANY, Reject(errors.IllegalState, "already finished")),
    ("locked", ANY, PAUSED, Reject(errors.IllegalState, "cannot lock, execution is paused")),
    ("locked", ANY, CANCELLING, Reject(errors.IllegalState, "cannot lock, execution is cancelling")),
    ("locked", BLOCKED, ANY, Reject(errors.IllegalState, "cannot append Locked event when in BlockedByJoinSet state")),
    ("locked", PENDING, ACTIVE, Effect.LOCK),  # when due, or the same run extends its lock
    ("locked", LOCKED, ACTIVE, Effect.LOCK),  # only the same run (extension)
    (ANY, FINISHED, ANY, Reject(errors.AlreadyFinished, "execution is already finished")),
    ("unlocked", LOCKED, ACTIVE, Effect.TO_PENDING),
    # An expired lock of a cancelling workflow whose children still run (decisions.md D26).
    ("unlocked", LOCKED, CANCELLING, Effect.TO_PENDING),
    ("unlocked", ANY, PAUSED, Reject(errors.UnlockedCannotBeAppended, "paused")),
    ("unlocked", ANY, CANCELLING, Reject(errors.UnlockedCannotBeAppended, "cancelling")),
    ("unlocked", PENDING, ANY, Reject(errors.UnlockedCannotBeAppended, "pending")),
    ("unlocked", BLOCKED, ANY, Reject(errors.UnlockedCannotBeAppended, "blocked")),
    ("temporarily_failed", ANY, ANY, Effect.RETRY),
    ("temporarily_timed_out", ANY, ANY, Effect.RETRY),
    ("finished", ANY, ANY, Effect.FINISH),
    ("component_upgrade_finished", ANY, ANY, Effect.UPGRADE),
    ("paused", ANY, CANCELLING, Reject(errors.IllegalState, "cannot pause, execution is cancelling")),
    ("paused", ANY, PAUSED, Reject(errors.IllegalState, "cannot pause, execution is already paused")),
    (
        "paused",
        LOCKED,
        ANY,
        Reject(errors.IllegalState, "cannot append Paused event when execution is locked; use pause_execution"),
    ),
    ("paused", ANY, ACTIVE, Effect.PAUSE),
    ("unpaused", ANY, PAUSED, Effect.UNPAUSE),
    ("unpaused", ANY, ANY, Reject(errors.IllegalState, "cannot unpause, execution is not paused")),
    (
        "cancellation_requested",
        ANY,
        CANCELLING,
        Reject(errors.IllegalState, "cannot append CancellationRequested event, execution is already cancelling"),
    ),
    ("cancellation_requested", ANY, ANY, Effect.CANCEL),
    ("rescheduled", PENDING, ACTIVE, Effect.RESCHEDULE),
    ("rescheduled", ANY, ANY, Reject(errors.IllegalState, "only a pending, active execution can be rescheduled")),
    ("history_event:join_next", ANY, ANY, Effect.JOIN_NEXT),
    ("history_event:delay_request", ANY, ANY, Effect.DELAY),
    ("history_event", ANY, ANY, Effect.BUMP),
)

EVENT_KINDS: tuple[str, ...] = tuple(dict.fromkeys(rule[0] for rule in RULES if rule[0] != ANY))

# Effects that take the row out of ``locked`` (used for lock revocation, see store.append).
LEAVES_LOCKED = frozenset({Effect.TO_PENDING, Effect.RETRY, Effect.JOIN_NEXT, Effect.FINISH})


def event_kind(event: Event) -> str:
    """The row of ``RULES`` an event belongs to."""
    if isinstance(event, HistoryEventRecord):
        inner = event.event
        if isinstance(inner, JoinNext):
            return "history_event:join_next"
        if isinstance(inner, JoinSetRequest) and isinstance(inner.request, DelayRequest):
            return "history_event:delay_request"
        return "history_event"
    return event.VARIANT


def decide(kind: str, state: str, lifecycle: str) -> Effect:
    """The effect of appending an event of ``kind`` to a row in ``(state, lifecycle)``.

    Raises the rule's error when the table rejects it.
    """
    for rule_kind, rule_state, rule_lifecycle, outcome in RULES:
        if rule_kind in (ANY, kind) and rule_state in (ANY, state) and rule_lifecycle in (ANY, lifecycle):
            if isinstance(outcome, Reject):
                outcome.raise_()
            return outcome
    raise errors.IllegalState(f"no transition for `{kind}` from {state}/{lifecycle}")


def check_lock(
    *,
    state: str,
    scheduled_at: datetime,
    holder: tuple[str | None, str | None],
    locked: Locked,
    created_at: datetime,
) -> bool:
    """The guard of the two ``LOCK`` rules (spec 000 §6.3 ``can_append_lock``); the
    expiry itself (after ``created_at``) is checked before the table.

    Returns True when the lock extends the current holder's lock (same executor and run,
    before the row is due), False when it is a new lock. Raises when neither is allowed.
    """
    same_run = holder == (locked.executor_id, locked.run_id)
    if state == State.LOCKED:
        if not same_run:
            raise errors.IllegalState("cannot lock, already locked")
        return True
    if scheduled_at > created_at:
        if same_run:  # the holder keeps a run warm (spec 000 §10): its lock never lapsed
            return True
        raise errors.ValidationFailed("cannot lock, not yet pending")
    # Due: whoever locks it, the previous lock has lapsed, so this is a new lock with a new
    # generation (spec 000 §6.3; spec 004 §5.1.1), even for the run that held it last.
    return False


def transition_matrix() -> list[tuple[str, list[str]]]:
    """``RULES`` evaluated for every event kind and every valid state (for the docs)."""
    rows = []
    for kind in EVENT_KINDS:
        cells = []
        for state, lifecycle in VALID_STATES:
            try:
                cells.append(decide(kind, state, lifecycle).value)
            except errors.StoreError as error:
                cells.append(type(error).__name__)
        rows.append((kind, cells))
    return rows


def transition_matrix_markdown() -> str:
    header = ["event \\ state"] + [
        state.value if lifecycle == ACTIVE else f"{state.value} ({lifecycle.value})"
        for state, lifecycle in VALID_STATES
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for kind, cells in transition_matrix():
        lines.append("| " + " | ".join([f"`{kind}`"] + cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------
# Retries and lock expiry (spec 000 §10)
# ---------------------------------------------------------------------------------------

UNLIMITED_RETRIES = 2**32 - 1
MAX_BACKOFF = timedelta(days=365)


def retry_backoff(failures: int, max_retries: int | None, backoff: timedelta) -> timedelta | None:
    """How long to wait before the next attempt, or None when the retries are spent.

    ``failures`` counts the intermittent failures including the one being recorded
    (``intermittent_event_count + 1``), so the first retry waits ``backoff``, the second
    ``2 * backoff``, the n-th ``backoff * 2^(n-1)``. ``max_retries`` None retries forever.
    The wait saturates at ``MAX_BACKOFF``.
    """
    limit = UNLIMITED_RETRIES if max_retries is None else max_retries
    if failures < 1 or failures > limit:
        return None
    if backoff <= timedelta(0):
        return timedelta(0)
    if failures - 1 >= 64:  # 2^63 of even one microsecond is past MAX_BACKOFF
        return MAX_BACKOFF
    try:
        return min(backoff * (2 ** (failures - 1)), MAX_BACKOFF)
    except OverflowError:
        return MAX_BACKOFF


@dataclass(frozen=True)
class ExpiredLock:
    """A ``locked`` row whose lock ran out (spec 000 §7.3 ``get_expired_timers``)."""

    execution_id: str
    locked_at_version: int
    next_version: int
    intermittent_event_count: int
    max_retries: int | None
    retry_exp_backoff: timedelta
    executor_id: str
    run_id: str
    lifecycle: str
    children_running: bool = False  # a cancelling workflow's children are not all finished


def on_lock_expired(lock: ExpiredLock, now: datetime) -> Event:
    """The event the timer sweep appends for an expired lock.

    The executors renew the locks they hold and hand back what they will not run, so a lock
    expires only when its worker vanished (killed, hung, cut off from the database); the
    events say so, telling it apart from an attempt's own timeout (spec 000 §10).

    - cancelling: ``Finished(cancelled)``, the holder is gone, so the cancellation driver's
      job is done here (decision 14; spec 000 §14 Q3); but a workflow whose children still
      run is ``Unlocked`` instead, and the driver finishes it once they have (D26);
    - a workflow (retries unlimited) that made progress: ``Unlocked`` (no failure counted);
    - retries left: ``TemporarilyTimedOut`` at ``now + backoff``;
    - otherwise ``Finished(timed_out)``.
    """
    vanished = f"lock expired: its worker stopped renewing it (executor {lock.executor_id}, run {lock.run_id})"
    if lock.lifecycle == Lifecycle.CANCELLING:
        if lock.children_running:
            return Unlocked(unlocked_at=now, reason=f"{vanished}; cancelling, waiting for its children")
        return Finished(retval=ExecutionFailure("cancelled", "cancelled while its lock expired"))
    if lock.max_retries is None and lock.locked_at_version + 1 < lock.next_version:
        return Unlocked(unlocked_at=now, reason="made progress")
    delay = retry_backoff(lock.intermittent_event_count + 1, lock.max_retries, lock.retry_exp_backoff)
    if delay is not None:
        return TemporarilyTimedOut(backoff_expires_at=now + delay, reason=vanished)
    return Finished(retval=ExecutionFailure("timed_out", f"{vanished}; retries are exhausted"))


def failure_event(
    *,
    intermittent_event_count: int,
    max_retries: int | None,
    backoff: timedelta,
    now: datetime,
    timed_out: bool,
    reason: str,
    detail: str | None,
    final: Finished,
) -> Event:
    """What an executor appends after a failed attempt: a retry while retries remain,
    ``final`` once they are spent (spec 000 §10)."""
    delay = retry_backoff(intermittent_event_count + 1, max_retries, backoff)
    if delay is None:
        return final
    if timed_out:
        return TemporarilyTimedOut(backoff_expires_at=now + delay, reason=reason)
    return TemporarilyFailed(backoff_expires_at=now + delay, reason=reason, detail=detail)
