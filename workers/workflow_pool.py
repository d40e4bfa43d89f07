"""The worker process's workflow runs, each in a thread of its own: the workflow pool.

``WorkflowPool`` runs ``workers.workflow_runner.run_workflow`` in at most ``size`` threads
at once; a thread that ended a run keeps its database connection for the next one a while,
then retires. It is also the parking lot of blocked Interrupt runs
(``workers.workflow_parking``): a claim or a group commit of the executor that finds a
parked run's row where it left it hands the run its new lock. The executor
(``workers.executor``) starts runs here; the pool reaches it back only through
``ChildRunner``, the children a run's write may hand it (``workers.replay_adapters``).

why: D37, D65, D73, D77, D82
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
import weakref
from collections.abc import Sequence

from django.db import connection

from executions import conf, store
from executions.events import Locked
from workers import heartbeat, shutdown
from workers.registry import Function
from workers.replay_adapters import ChildRunner
from workers.workflow_parking import ParkingPlace
from workers.workflow_runner import run_workflow


class WorkflowPool:
    """The worker process's workflow runs, each in a thread of its own, at most ``size`` at
    once; ``children``: the process's activity executor, which may run their children (D65).

    A thread that ended a run waits up to ``idle_seconds`` for the next one and keeps its
    database connection meanwhile: the next run of an Interrupt workflow (every call is a
    run), or of another workflow, starts on a warm connection whose statements are prepared,
    instead of opening a connection per run (D73). An idle thread retires, closing it.

    An Interrupt run that blocks may park here, at most ``size`` at once, each for up to
    ``PARKED_RUN_TIMEOUT`` (D77): not counted busy, it goes on when ``start`` is given its
    execution claimed where it left it (``parked_versions`` tells the claim which)."""

    def __init__(self, size: int = 8, children: ChildRunner | None = None, idle_seconds: float = 2.0):
        self.size = size
        self.children = children
        self.idle_seconds = idle_seconds
        self._runs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.RLock()
        self._state = threading.Condition(self._lock)
        self._busy = 0  # runs started and not ended, parked ones not counted
        self._idle = 0  # threads waiting for a run that none was promised to
        self._threads = 0  # threads alive
        self._parked: dict[str, ParkingPlace] = {}
        self._parking = 0  # threads inside ``park``
        _POOLS.add(self)

    def free(self) -> int:
        with self._state:
            return self.size - self._busy

    def parked_versions(self) -> dict[str, int]:
        """``parked_runs`` without the terms: what a claim need not read
        (``store.lock_pending``'s ``known``)."""
        return {execution_id: version for execution_id, (version, _) in self.parked_runs().items()}

    def parked_runs(self) -> dict[str, tuple[int, store.LockTerms]]:
        """The executions of runs parked (or about to park), each with the last version its
        run wrote and the terms its function is locked under: what a group commit of this
        process may lock for them (``store.ParkedRuns``, D82)."""
        with self._state:
            return {execution_id: (place.version, place.terms) for execution_id, place in self._parked.items()}

    def resume_parked(
        self, execution_id: str, locked: Locked, version: int, responses: Sequence[store.Response]
    ) -> bool:
        """A group commit of this process locked ``execution_id`` for its parked run (D82):
        ``locked`` is the ``Locked`` event it wrote, at ``version``, and ``responses`` the
        responses it gave it. The run goes on under that lock, as under a claim's. False if
        no run took it (it left its place meanwhile), or the pool has no room for a waiting
        run to go on (a claim takes only what fits, too): the caller hands the lock back."""
        with self._state:
            place = self._parked.get(execution_id)
            if place is None or (place.waiting and self._busy >= self.size):  # gone, or no room
                return False
            resumed = dataclasses.replace(
                place.locked,
                locked=locked,
                fence=store.Fence(locked.run_id, locked.lock_generation),
                deployment_id=locked.deployment_id,
                next_version=version + 1,
                history=None,
                responses=None,
            )
            place.responses = responses
            return self._resume(resumed)

    def expect(
        self, locked: store.LockedExecution, version: int, previous: ParkingPlace | None, terms: store.LockTerms
    ) -> ParkingPlace | None:
        """A place for the run of ``locked``'s execution to park at ``version`` (replacing
        ``previous``), reserved before the write that may block it; None when the pool has
        no room. ``locked`` and ``terms``: what a lock for it is built from (D82)."""
        execution_id = locked.execution_id
        with self._state:
            self._forget(execution_id, previous)
            if (
                len(self._parked) >= self.size
                or conf.get("PARKED_RUN_TIMEOUT").total_seconds() <= 0
                or shutdown.stopping()
            ):
                return None
            place = ParkingPlace(version, threading.Condition(self._lock), locked, terms)
            self._parked[execution_id] = place
            return place

    def park(self, execution_id: str, place: ParkingPlace) -> store.LockedExecution | None:
        """Wait in ``place``, not counted busy, until a claim of the row where the run left
        it is handed to it (the new lock is returned), or until the run should unwind
        instead (None): time is up, the worker stops, the row was claimed elsewhere."""
        deadline = time.monotonic() + conf.get("PARKED_RUN_TIMEOUT").total_seconds()
        with self._state:
            if place.resumed is None and not place.dismissed:
                place.waiting = True
                self._busy -= 1
                self._parking += 1
                self._state.notify_all()
                try:
                    with heartbeat.running(-1):  # the cluster's load: it runs nothing
                        while place.resumed is None and not place.dismissed and not shutdown.stopping():
                            if (remaining := deadline - time.monotonic()) <= 0:
                                break
                            place.wake.wait(min(remaining, 0.5))
                finally:
                    self._parking -= 1
                    if place.resumed is None:
                        self._busy += 1  # it unwinds: a run again until it ends
                    self._state.notify_all()
            self._forget(execution_id, place)
            return place.resumed

    def leave(self, execution_id: str, place: ParkingPlace | None) -> store.LockedExecution | None:
        """The run that reserved ``place`` ends: the place goes. Returns a lock a claim
        handed to it that it never took (it did not park after all), to be handed back."""
        if place is None:
            return None
        with self._state:
            self._forget(execution_id, place)
            place.dismissed = True
            return place.resumed

    def _forget(self, execution_id: str, place: ParkingPlace | None) -> None:
        """``place`` is no longer where ``execution_id``'s run may park (a claim may have
        taken it out already, or a newer place replaced it). Under the pool's lock."""
        if place is not None and self._parked.get(execution_id) is place:
            del self._parked[execution_id]

    def dismiss_parked(self, wait: float = 0.0) -> None:
        """Every parked run unwinds now (the worker stops; tests end); wait up to ``wait``
        seconds until they have left their places (they count busy again, so ``join``
        then waits for their ends)."""
        with self._state:
            for place in self._parked.values():
                place.dismissed = True
                place.wake.notify()
            self._parked.clear()
            self._state.wait_for(lambda: not self._parking, wait)

    def _resume(self, locked: store.LockedExecution) -> bool:
        """Hand ``locked`` to the run parked (or about to park) for its execution, if the
        claim found the row where that run left it; a run it did not so find unwinds."""
        place = self._parked.pop(locked.execution_id, None)
        if place is None or place.dismissed:
            return False
        if locked.next_version == place.version + 2:  # only this claim's Locked since
            place.resumed = locked
            self._busy += place.waiting  # a waiting run is counted again; one on its way still is
        else:
            place.dismissed = True
        place.wake.notify()
        return place.resumed is locked

    def start(self, locked: store.LockedExecution, spec: Function, deployment_id: str) -> None:
        with self._state:
            if self._resume(locked):
                return
            self._busy += 1
            reuse = self._idle > 0
            if reuse:
                self._idle -= 1  # promised this run: it takes it from the queue
            else:
                self._threads += 1
        self._runs.put((locked, spec, deployment_id))
        if not reuse:
            threading.Thread(target=self._serve, name=f"workflow {locked.execution_id}", daemon=True).start()

    def _serve(self) -> None:
        try:
            while (run := self._next_run()) is not None:
                locked, spec, deployment_id = run
                threading.current_thread().name = f"workflow {locked.execution_id}"
                try:
                    run_workflow(locked, spec, deployment_id, self.children, keep_connection=True, pool=self)
                finally:
                    with self._state:
                        self._busy -= 1
                        self._idle += 1
                        self._state.notify_all()
        finally:
            connection.close()
            with self._state:
                self._threads -= 1
                self._state.notify_all()

    def _next_run(self) -> tuple | None:
        """The next run for this thread; None when it retires: told to, or it waited
        ``idle_seconds`` and no run was promised to it (every run put in the queue has a
        thread to take it)."""
        while True:
            try:
                return self._runs.get(timeout=self.idle_seconds)
            except queue.Empty:
                with self._state:
                    if self._idle > 0:
                        self._idle -= 1
                        return None

    def retire_idle(self, timeout: float = 5.0) -> None:
        """Send every idle thread away now, parked ones too once they have unwound, and
        wait (up to ``timeout`` seconds) until they have closed their connections (tests:
        before the test database is dropped)."""
        with self._state:
            busy = self._busy
            self.dismiss_parked(timeout)
            self._state.wait_for(lambda: self._busy <= busy, timeout)
            idle, self._idle = self._idle, 0  # each is promised a None: it retires
        for _ in range(idle):
            self._runs.put(None)
        with self._state:
            self._state.wait_for(lambda: self._threads <= self._busy, timeout)

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the runs under way to end."""
        with self._state:
            self._state.wait_for(lambda: not self._busy, timeout)


_POOLS: weakref.WeakSet[WorkflowPool] = weakref.WeakSet()


def retire_idle_threads() -> None:
    """``WorkflowPool.retire_idle`` of every pool of this process."""
    for pool in list(_POOLS):
        pool.retire_idle()
