"""Responses (spec 002 §1.4) and what a consumed one resolves to; the responses known so far.

``Response`` is the pure core's (``executions.events``), re-exported here. A consumed
response resolves to a ``ConsumedChild`` or a ``ConsumedDelay``; the markers are the other
results of matching a key (§3.4). ``ResponseQueue`` holds the responses known so far and
hands them out FIFO per join set (§1.6, §7 inv. 3), the same rule the store uses to unblock.
Used by ``workers.replay.cursor`` and ``workers.replay.history``.

why: spec/README.md decision 9, D67.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from executions.events import Ok, Response, RetVal
from executions.ids import DelayId, ExecutionId

__all__ = [
    "ALL_PROCESSED",
    "DELAY",
    "NOT_FOUND",
    "PENDING",
    "TRY_PENDING",
    "ConsumedChild",
    "ConsumedDelay",
    "Response",
    "ResponseQueue",
]


@dataclass(frozen=True)
class ConsumedChild:
    """A child's response, consumed by a join-next: which child, its function, its value."""

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
class ConsumedDelay:
    """A delay's response, consumed by a join-next: fired, or cancelled (§2.10)."""

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
