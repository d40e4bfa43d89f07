"""How a worker learns that work is due: one LISTEN per cluster, rung to its workers (D88).

PostgreSQL signals every session of the database that listens, whatever the channel, at
every ``NOTIFY``; each such session then wakes a thread in its process. With a LISTEN
session in every worker process, each execution submitted cost every worker a wake-up,
and the server a signal per worker, although only one worker claims it.

So a cluster listens once. Its pusher, which listens on ``obelisk_pending`` anyway
(``workers.broker``), rings a ``Doorbell`` in shared memory for every announcement of a
function the cluster serves: one counter for activities, one for workflows, and a
condition the waiting workers sleep on. Each executor keeps the counts it has seen
(``Announcements``); a higher count means "look again", as a notification does
(``executions.notify``). A worker busy with a batch is not woken at all: it reads the
counts when its batch ends.

Outside a cluster (an executor in a test or a script) the executor's process rings a
doorbell of its own from its own LISTEN (``Announcements.own``), so there is one way to
wait. A ring lost with a dying pusher costs latency, never an execution: the worker's
linger ends, and the broker hands out a claim task while work is still due.
"""

from __future__ import annotations

import multiprocessing

from executions import conf, notify

_cluster: Doorbell | None = None  # created in the ``obelisk_worker`` process, before the fork


class Doorbell:
    """Counts of announcements, activities and workflows, and a condition to wait on;
    in shared memory, so that the processes forked after it share it."""

    def __init__(self):
        context = multiprocessing.get_context("fork")
        self._condition = context.Condition()
        self._counts = context.Array("Q", 2, lock=False)  # written under the condition's lock

    def ring(self, activities: bool, workflows: bool) -> None:
        with self._condition:
            self._counts[0] += activities
            self._counts[1] += workflows
            self._condition.notify_all()

    def counts(self) -> tuple[int, int]:
        return self._counts[0], self._counts[1]

    def relay(self, activities: frozenset[str], workflows: frozenset[str]) -> notify.Listener:
        """Ring for every ``obelisk_pending`` announcement of these functions, from this
        process's LISTEN session; close the returned listener to stop."""

        def ring_if_served(notes: list[notify.Notification]) -> None:
            named = {ffqn for note in notes if note.channel == notify.PENDING for ffqn in note.items}
            if named & activities or named & workflows:
                self.ring(bool(named & activities), bool(named & workflows))

        return notify.Listener([notify.PENDING], on_arrival=ring_if_served)


def prepare_cluster() -> None:
    """Create the cluster's doorbell in the ``obelisk_worker`` process, before the fork;
    the broker rings it (``relay``), the executors of the worker processes wait on it."""
    global _cluster
    _cluster = Doorbell()


def of_cluster() -> Doorbell | None:
    return _cluster


class Announcements:
    """What one executor has not been told yet: the doorbell's counts above the ones it
    has seen. ``take`` marks them seen; ``nudge`` wakes its ``wait`` from within the
    process, for something no announcement says (children handed over, D65)."""

    def __init__(self, doorbell: Doorbell, relay: notify.Listener | None = None):
        self._doorbell = doorbell
        self._relay = relay  # the executor's own LISTEN, outside a cluster
        self._seen = doorbell.counts()
        self._nudged = False
        self._postgres = notify.is_postgres()

    @classmethod
    def own(cls, activities: frozenset[str], workflows: frozenset[str]) -> Announcements:
        """Announcements from a doorbell of this executor's own, rung from its process's
        LISTEN: an executor that runs outside a cluster."""
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
        ``take``. Without LISTEN (SQLite) at most the poll interval: the caller looks at
        the tables anyway."""
        if not self._postgres:
            timeout = min(timeout, conf.get("POLL_INTERVAL").total_seconds())
        condition = self._doorbell._condition
        with condition:
            if not self._nudged and self._doorbell.counts() == self._seen and timeout > 0:
                condition.wait(timeout)
            self._nudged = False
        return self.take()

    def nudge(self) -> None:
        """Wake this executor's ``wait`` (from another thread of its process). Under the
        condition's lock, so a nudge just before the wait begins is not lost; it wakes the
        cluster's other waiting workers too, who find nothing new and wait on."""
        with self._doorbell._condition:
            self._nudged = True
            self._doorbell._condition.notify_all()
