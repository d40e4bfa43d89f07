"""An execution as it was at one of its events (pure, no Django): the console's time travel.

Given an execution's event log and the join-set responses it received, ``as_of(events,
responses, version)`` tells what the execution looked like right after the event at
``version``: the history up to it, where it was (pending, running, blocked, paused,
cancelling, or how it finished), which children, delays and scheduled executions it had
requested by then (its own ``HistoryEvent`` records say so, at their versions) and which
responses had arrived by then (a response whose ``created_at`` is not later than that
event's time).

why: D5 (a join-next consumes a response as the store counts it), D91 (a workflow's page)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from executions.events import (
    CancellationRequested,
    ChildExecutionRequest,
    Created,
    DelayRequest,
    Finished,
    HistoryEventRecord,
    JoinNext,
    JoinNextTry,
    JoinSetRequest,
    Locked,
    Paused,
    Schedule,
    TemporarilyFailed,
    TemporarilyTimedOut,
    Unlocked,
    Unpaused,
)
from executions.outcome import outcome_of_retval


@dataclass(frozen=True)
class RequestAsOf:
    """A child execution or a delay the execution had requested by then."""

    id: str  # child execution id or delay id
    kind: str  # "child" or "delay"
    join_set_id: str
    requested_version: int
    requested_at: datetime
    ffqn: str | None = None  # children only
    response: object | None = None  # the ``store.Response`` if it had arrived by then


@dataclass(frozen=True)
class AsOf:
    version: int
    at: datetime
    status: str  # an ``executions.outcome`` word, as of then
    events: list  # ``EventRecord``s up to and including ``version``
    responses: list  # ``Response``s that had arrived by ``at``
    requests: list[RequestAsOf]
    scheduled: list[str]  # top-level executions it had scheduled by then
    is_last: bool  # ``version`` is the newest event: this is the present


def as_of(events: Sequence, responses: Sequence, version: int) -> AsOf:
    """The execution right after its event at ``version`` (``ValueError`` if it has none).

    ``events`` are ``EventRecord``s in version order (version 0 is ``Created``),
    ``responses`` the ``Response``s it received, in any order.
    """
    by_version = {record.version: record for record in events}
    if version not in by_version:
        raise ValueError(f"no event at version {version}")
    at = by_version[version].created_at
    shown = [record for record in events if record.version <= version]
    walk = _Walk(sorted((r for r in responses if r.created_at <= at), key=lambda r: r.seq))
    for record in shown:
        walk.step(record)
    return AsOf(
        version=version,
        at=at,
        status=walk.status(shown),
        events=shown,
        responses=walk.arrived,
        requests=walk.requests,
        scheduled=walk.scheduled,
        is_last=version == max(by_version),
    )


class _Walk:
    """Where the execution stood after each event seen so far, and what it had requested."""

    def __init__(self, arrived: list):
        self.arrived = arrived  # the responses that had arrived by then, by ``seq``
        self.by_child = {r.child_execution_id: r for r in arrived if r.child_execution_id}
        self.by_delay = {r.delay_id: r for r in arrived if r.delay_id}
        self.state, self.lifecycle = "pending", "active"
        self.joins_waited: dict[str, int] = {}
        self.requests: list[RequestAsOf] = []
        self.scheduled: list[str] = []

    def step(self, record) -> None:
        event = record.event
        if isinstance(event, Created):
            self.state = "scheduled" if event.scheduled_at and event.scheduled_at > record.created_at else "pending"
        elif isinstance(event, Locked):
            self.state = "running"
        elif isinstance(event, (Unlocked, TemporarilyFailed, TemporarilyTimedOut)):
            self.state = "pending"
        elif isinstance(event, Paused):
            self.lifecycle = "paused"
        elif isinstance(event, Unpaused):
            self.lifecycle = "active"
        elif isinstance(event, CancellationRequested):
            self.lifecycle = "cancelling"
        elif isinstance(event, Finished):
            self.state, self.lifecycle = outcome_of_retval(event.retval), "active"
        elif isinstance(event, HistoryEventRecord):
            self._history(record, event.event)

    def _history(self, record, history) -> None:
        if isinstance(history, JoinSetRequest):
            request = self._request(record, history)
            if request is not None:
                self.requests.append(request)
        elif isinstance(history, Schedule):
            self.scheduled.append(history.execution_id)
        elif isinstance(history, JoinNext):
            # Blocked until the join set has one more response than joins consumed.
            waited = self._consume(history.join_set_id)
            answered = sum(1 for r in self.arrived if r.join_set_id == history.join_set_id)
            # Answered by then: pending (due to run again), as the store decides.
            self.state = "pending" if answered >= waited else "blocked"
        elif isinstance(history, JoinNextTry) and history.outcome == "found":
            self._consume(history.join_set_id)

    def _consume(self, join_set_id: str) -> int:
        """One more join of ``join_set_id`` consumed: how many so far."""
        self.joins_waited[join_set_id] = self.joins_waited.get(join_set_id, 0) + 1
        return self.joins_waited[join_set_id]

    def _request(self, record, history: JoinSetRequest) -> RequestAsOf | None:
        request = history.request
        if isinstance(request, ChildExecutionRequest):
            return RequestAsOf(
                request.child_execution_id,
                "child",
                history.join_set_id,
                record.version,
                record.created_at,
                ffqn=request.target_ffqn,
                response=self.by_child.get(request.child_execution_id),
            )
        if isinstance(request, DelayRequest):
            return RequestAsOf(
                request.delay_id,
                "delay",
                history.join_set_id,
                record.version,
                record.created_at,
                response=self.by_delay.get(request.delay_id),
            )
        return None

    def status(self, shown: list) -> str:
        """An ``executions.outcome`` word: how it finished, else where it was, else its
        lifecycle when not active."""
        state = self.state
        finished = state not in ("pending", "scheduled", "running", "blocked")
        if state == "scheduled" and any(isinstance(r.event, Locked) for r in shown):
            state = "pending"
        return state if finished or self.lifecycle == "active" else self.lifecycle
