"""Local children (D124): a ``ctx.call``'s child activity run in the workflow's own thread.

A workflow run in an executor's pool may take one of a bounded number of slots, each with
a ``LocalWatchdog`` of its own, for the child its next write creates locked; it runs the
child at once in its thread, outside the workflow's determinism guard, and the executor
writes the result. ``workers.executor.Executor`` owns one ``LocalChildren`` and offers its
slots through ``local_claim`` / ``run_local`` (the ``ChildRunner`` port of
``workers.replay_adapters``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from executions import store
from executions.ids import new_run_id
from workers import determinism
from workers.activity_runner import (
    ActivityInterrupt,
    ActivityLockLost,
    LocalWatchdog,
    WatchedRun,
    before_start,
    interrupt_outcome,
    run_activity,
)
from workers.registry import Function


class LocalChildren:
    """The slots of the local children running in workflow threads: as many as the
    workflow pool has threads, each held by the run id of the claim that took it."""

    def __init__(self, size: int):
        self._slots = [LocalWatchdog() for _ in range(size)]
        self._held: dict[str, LocalWatchdog] = {}
        self._lock = threading.Lock()
        self.last_ran = float("-inf")  # monotonic: when a local child last ran

    def free_slots(self) -> int:
        with self._lock:
            return len(self._slots)

    def claim(self, terms: store.LockTerms, ffqn: str, executor_id: str, deployment_id: str) -> store.ChildClaim | None:
        """A claim of one child of ``ffqn`` holding a free slot; None when none is free."""
        with self._lock:
            if not self._slots:
                return None
            claim = store.ChildClaim({ffqn: terms}, 1, executor_id, new_run_id(), deployment_id)
            self._held[claim.run_id] = self._slots.pop()
        return claim

    def slot_of(self, claim: store.ChildClaim) -> LocalWatchdog:
        """The slot ``claim`` holds, taken from it: ``give_back`` returns it."""
        with self._lock:
            return self._held.pop(claim.run_id)

    def give_back(self, watchdog: LocalWatchdog) -> None:
        with self._lock:
            self._slots.append(watchdog)

    def run(
        self, locked: store.LockedExecution, spec: Function, watchdog: LocalWatchdog, on_hard_stop: Callable[[], None]
    ) -> store.AppendItem | None:
        """Run the child in this thread under ``watchdog``: its result to write, or None
        when its lock was lost. As a batch's run, but nothing to flush or hand back, and
        outside the workflow's determinism guard (the activity is not workflow code)."""
        self.last_ran = time.monotonic()
        start, instead = before_start(locked, spec)
        if not start:
            return instead
        watchdog.on_hard_stop = on_hard_stop
        watchdog.start()
        try:
            try:
                with determinism.unguarded():  # an activity, not workflow code (D124)
                    return run_activity(locked, spec, watchdog)
            finally:
                watchdog.release()
        except ActivityLockLost:  # landed as the run returned, after its own handling
            return None
        except ActivityInterrupt as late:
            event = interrupt_outcome(WatchedRun(locked, spec), type(late))
            return store.AppendItem(locked.execution_id, None, event, locked.fence)
