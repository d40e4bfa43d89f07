"""How a worker learns that work is due: one LISTEN per cluster, rung to its workers.

The cluster's pusher listens on ``obelisk_pending`` (``workers.broker``) and rings a
``Doorbell`` in shared memory, made before the fork, for every announcement of a function
the cluster serves: one counter for activities, one for workflows, and a slot (a
semaphore, at most one permit) for each waiting process. Each executor keeps the counts it
has seen (``Announcements``); a higher count means "look again", as a notification does
(``executions.notify``). A worker busy with a batch reads the counts when its batch ends.
A slot whose process died is taken over by the next process that needs one. Outside a
cluster (a test, a script) the executor rings a doorbell of its own from its own LISTEN
(``Announcements.subscribe``), so there is one way to wait.

why: D56, D65, D88
"""

from __future__ import annotations

import multiprocessing
import os
import threading

from executions import conf, notify

_cluster: Doorbell | None = None  # created in the ``obelisk_worker`` process, before the fork
_SLOT_LOCK_PATIENCE = 1.0  # seconds; a process killed holding the slot lock costs this once


class Doorbell:
    """Counts of announcements, activities and workflows, and a semaphore per waiting
    process (``slots`` of them); in shared memory, so that the processes forked after it
    share it. Rung from one process at a time (the cluster's pusher)."""

    def __init__(self, slots: int = 1):
        context = multiprocessing.get_context("fork")
        self._counts = context.Array("Q", 2, lock=False)  # written by the ringing process only
        self._owners = context.Array("i", slots, lock=False)  # process id of each slot, 0: free
        self._bells = [context.Semaphore(0) for _ in range(slots)]
        self._slot_lock = context.Lock()
        self._ring_lock = threading.Lock()  # the ringing process's threads, one at a time

    def ring(self, activities: bool, workflows: bool) -> None:
        """Count the announcement, then release the semaphore of every slot in use that
        holds no permit yet: a waiting process wakes, a busy one finds one permit later."""
        with self._ring_lock:
            self._counts[0] += activities
            self._counts[1] += workflows
        for slot, owner in enumerate(self._owners):
            if owner:
                self.nudge(slot)

    def counts(self) -> tuple[int, int]:
        return self._counts[0], self._counts[1]

    def take_slot(self) -> int | None:
        """A slot for this process: a free one, or one whose process has died; None when
        every slot is held by a live process."""
        locked = self._slot_lock.acquire(timeout=_SLOT_LOCK_PATIENCE)
        try:
            for slot, owner in enumerate(self._owners):
                if owner == 0 or not _alive(owner):
                    self._owners[slot] = os.getpid()
                    while self._bells[slot].acquire(False):  # permits rung for the dead owner
                        pass
                    return slot
            return None
        finally:
            if locked:
                self._slot_lock.release()

    def wait(self, slot: int, timeout: float) -> None:
        self._bells[slot].acquire(timeout=timeout)

    def nudge(self, slot: int) -> None:
        """Release the slot's semaphore, unless a permit already waits in it."""
        if self._bells[slot].get_value() == 0:
            self._bells[slot].release()

    def relay(self, activities: frozenset[str], workflows: frozenset[str]) -> notify.Listener:
        """Ring for every ``obelisk_pending`` announcement of these functions, from this
        process's LISTEN session; close the returned listener to stop."""

        def ring_if_served(notes: list[notify.Notification]) -> None:
            named = {ffqn for note in notes if note.channel == notify.PENDING for ffqn in note.items}
            served = bool(named & activities), bool(named & workflows)
            if any(served):
                self.ring(*served)

        return notify.Listener([notify.PENDING], on_arrival=ring_if_served)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def prepare_cluster(workers: int) -> None:
    """Create the cluster's doorbell in the ``obelisk_worker`` process, before the fork;
    the broker rings it (``relay``), the executors of the worker processes wait on it.
    Twice the slots of the workers: a recycled worker's successor may start before the
    slot of the one it replaces reads as free."""
    global _cluster
    _cluster = Doorbell(slots=2 * workers + 2)


def of_cluster() -> Doorbell | None:
    return _cluster


class Announcements:
    """What one executor has not been told yet: the doorbell's counts above the ones it
    has seen. ``take`` marks them seen; ``nudge`` wakes its ``wait`` from another thread
    of the process, for something no announcement says (children handed over, D65)."""

    def __init__(self, doorbell: Doorbell, relay: notify.Listener | None = None):
        self._doorbell = doorbell
        self._slot = doorbell.take_slot()
        self._relay = relay  # the executor's own LISTEN, outside a cluster
        self._seen = doorbell.counts()
        self._nudged = False
        self._postgres = notify.is_postgres()

    @classmethod
    def subscribe(cls, activities: frozenset[str], workflows: frozenset[str]) -> Announcements:
        """From the cluster's doorbell, if this process is a worker of a cluster with a
        slot free; otherwise from a doorbell of its own, rung from its process's LISTEN."""
        if (cluster := of_cluster()) is not None:
            announcements = cls(cluster)
            if announcements._slot is not None:
                return announcements
        doorbell = Doorbell()
        return cls(doorbell, doorbell.relay(activities, workflows))

    def peek(self) -> tuple[bool, bool]:
        """Whether activities, and workflows, were announced since they were last taken."""
        activities, workflows = self._doorbell.counts()
        return activities > self._seen[0], workflows > self._seen[1]

    def take(self, *, activities: bool = True, workflows: bool = True) -> tuple[bool, bool]:
        """``peek``, and mark what it reports (of the kinds asked for) as seen."""
        counts = self._doorbell.counts()
        new = counts[0] > self._seen[0], counts[1] > self._seen[1]
        self._seen = (counts[0] if activities else self._seen[0], counts[1] if workflows else self._seen[1])
        return new[0] and activities, new[1] and workflows

    def wait(self, timeout: float) -> tuple[bool, bool]:
        """Block until something is announced or nudged, or ``timeout`` seconds pass; then
        ``take``. A ring after the look at the counts has released the slot's semaphore,
        so it is never missed; a permit left by a ring seen already ends the wait early,
        which only costs the caller another look. Without LISTEN (SQLite) at most the poll
        interval: the caller looks at the tables anyway."""
        if not self._postgres:
            timeout = min(timeout, conf.get("POLL_INTERVAL").total_seconds())
        if not self._nudged and self._doorbell.counts() == self._seen and timeout > 0:
            self._doorbell.wait(self._slot, timeout)
        self._nudged = False
        return self.take()

    def nudge(self) -> None:
        """Wake this executor's ``wait`` (from another thread of its process); a nudge
        just before the wait begins ends it at once."""
        self._nudged = True
        self._doorbell.nudge(self._slot)
