"""What the processed prefix holds: indexes, counters and id derivation (spec 002 §1.2,
§1.5, §1.6).

``ProcessedIndex`` is fed only with processed events, so every id it derives (join sets,
children, delays) and every count it answers (submissions, consumed responses) is the same
in the first run and in any replay (§7 inv. 2). Used by ``workers.replay.cursor`` and
``workers.replay.history``.

why: spec/README.md decisions 2, 6 and 9.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any

from executions import errors
from executions.events import ChildExecutionRequest, DelayRequest, JoinNext, JoinNextTry, JoinSetCreate, JoinSetRequest
from executions.ids import DelayId, ExecutionId, JoinSetId
from workers.replay.signals import InvalidJoinSetName, JoinSetConflict


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
