"""A blocked Interrupt run parks in its worker and goes on there (D77, a sticky run).

At a join-next with no response an Interrupt run's write hands the row on. Instead of
unwinding at once, the run waits in its process's workflow pool (``workers.workflow_pool``)
for up to ``PARKED_RUN_TIMEOUT``, holding nothing in the database; when this worker's next
claim, or group commit (D82), locks the row where the run left it, the run goes on under
that lock with the responses that arrived instead of a new run replaying the history.

- ``ParkingPlace``: one run's place in the pool, reserved before the write that blocks;
- ``ParkingLot``: what a parked run needs of the pool (reserve, wait in, leave a place);
- ``ParkedWait``: the ``Waiter`` (``workers.replay.ports``) of such a run.

why: D72, D77, D80, D82
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from executions import store
from executions.outage import DATABASE_ERRORS
from workers.capture import RunLog
from workers.replay import EventHistory, WriteFailed
from workers.replay_adapters import StoreLease, StoreWriter, release_if_locked


@dataclass
class ParkingPlace:
    """Where an Interrupt run parks (D77): ``version``, the last one its run wrote;
    ``locked``, the lock it wrote that under, and ``terms``, those its function is locked
    under (a group commit may lock the row for it, D82); ``resumed``: the lock a claim of
    the row at that version handed to it, with the ``responses`` it came with, if any."""

    version: int
    wake: threading.Condition
    locked: store.LockedExecution
    terms: store.LockTerms
    waiting: bool = False  # the run is in ``park`` (not counted busy)
    resumed: store.LockedExecution | None = None
    responses: Sequence[store.Response] = ()
    dismissed: bool = False


class ParkingLot(Protocol):
    """The workflow pool (``workers.workflow_pool.WorkflowPool``) as a parked run sees it."""

    def expect(
        self, locked: store.LockedExecution, version: int, previous: ParkingPlace | None, terms: store.LockTerms
    ) -> ParkingPlace | None: ...

    def park(self, execution_id: str, place: ParkingPlace) -> store.LockedExecution | None: ...

    def leave(self, execution_id: str, place: ParkingPlace | None) -> store.LockedExecution | None: ...


class ParkedWait:
    """``Waiter`` of an Interrupt run in the workflow pool: at a join-next with no response
    the run parks, and goes on under the lock a claim of the row where it left it hands to
    it (that claim reads neither history nor responses). Otherwise (another worker claimed
    the row, the pool has no room, the worker stops, time is up) the run unwinds, and the
    next run replays, as always: same events, same result.

    The pool learns of the park before the write that blocks (``expect``): a claim that
    follows that write at once (a child this process ran, finishing) must find it."""

    holds_lock = False

    def __init__(self, pool: ParkingLot, writer: StoreWriter, lease: StoreLease):
        self.pool = pool
        self.writer = writer
        self.lease = lease
        self.history: EventHistory | None = None
        self.log: RunLog | None = None
        self._place: ParkingPlace | None = None  # where the pool expects this run to park
        self._resumed_at: int | None = None  # the history's next version when last resumed
        writer.before_join_next = self.expect

    @property
    def holding(self) -> bool:
        """Resumed, and nothing written since: the row is still this run's, locked."""
        return self._resumed_at == self.history.next_version

    def expect(self, version: int) -> None:
        """A write that hands the row on, up to ``version``, is about to commit: reserve
        the place. A lock a claim handed to the previous place, never taken, goes back."""
        previous = self._place
        self._place = self.pool.expect(self.writer.locked, version, previous, self.lease.terms())
        if previous is not None and previous.resumed is not None:  # out of the pool: fixed now
            release_if_locked(previous.resumed, "handed back: the run it was claimed for went on")

    def wait_for_responses(self, after_seq: int) -> Sequence[Any]:
        if self.holding:  # resumed, and the responses did not resolve the join-next
            return []  # a replay would interrupt here too; the run's end hands the row back
        if self._place is None:
            return []
        locked = self.writer.locked
        if self.log is not None:  # before the place is taken: if this fails, ``close`` gives it up
            self.log.save(locked.execution_id, locked.fence.run_id)  # the logs of this lock
        place, self._place = self._place, None
        resumed = self.pool.park(locked.execution_id, place)
        if resumed is None:
            return []
        try:
            responses = _following(place.responses, after_seq) or store.responses_after(resumed.execution_id, after_seq)
        except DATABASE_ERRORS as error:  # as a lost worker's run, never into the workflow's code (D80)
            release_if_locked(resumed, "handed back: the run it was claimed for could not read its responses")
            raise WriteFailed(f"reading the responses under the new lock failed: {error}") from error
        self._resume(resumed)
        return responses

    def _resume(self, locked: store.LockedExecution) -> None:
        """Go on under ``locked``: its fence for every write, its expiry for the lease, and
        the version after its ``Locked`` event for the next event (``_resume`` of the pool
        hands over only a lock claimed right after where the run parked)."""
        self.writer.locked = self.lease.locked = locked
        self.lease.lock_expires_at = locked.locked.lock_expires_at
        self.history.reserve_versions(1)
        self._resumed_at = self.history.next_version

    def close(self) -> None:
        """The run ends: a place it reserved and never parked in is given up; a lock a
        claim handed to it there meanwhile is handed back."""
        unclaimed = self.pool.leave(self.writer.locked.execution_id, self._place)
        if unclaimed is not None:
            release_if_locked(unclaimed, "handed back: the run it was claimed for has ended")


def _following(responses: Sequence[store.Response], after_seq: int) -> list[store.Response]:
    """``responses`` if they are the ones right after ``after_seq``, without a gap (a group
    commit that resumed the run gave them, D82); otherwise none: the table is read."""
    if responses and [r.seq for r in responses] == list(range(after_seq + 1, after_seq + 1 + len(responses))):
        return list(responses)
    return []
