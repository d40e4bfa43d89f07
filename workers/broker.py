"""The django-q2 broker of an Obelisk worker cluster.

django-q2 supplies the process model (a sentinel supervising a pool of workers, a pusher
feeding it, a monitor, admin pages); this broker connects that pool to the execution tables
instead of a task queue:

- ``dequeue()`` blocks until an execution of a served function is due (``LISTEN
  obelisk_pending``, a poll on SQLite, or the next scheduled time), then hands out a
  *claim task* (``workers.tasks.claim_and_run``); the worker claims a batch itself;
- the pusher's LISTEN session rings the doorbell the lingering workers wait on
  (``workers.doorbell``); claim tasks are spaced by ``MIN_CLAIM_SPACING`` and held back
  while a worker lingers (``REEMIT_AFTER``);
- a database outage never escapes ``dequeue()``; ordinary django-q2 tasks still go through
  the inherited ORM queue; a pusher or sentinel whose parent died ends at once.

why: D24, D31, D44, D88, D96
"""

from __future__ import annotations

import logging
import time

from django.utils import timezone
from django_q.brokers.orm import ORM
from django_q.humanhash import uuid
from django_q.signing import SignedPackage

from executions import notify, store
from executions.outage import DATABASE_ERRORS, Outage
from workers import doorbell, lingering, parent_death
from workers.shutdown import ignore_sigterm

logger = logging.getLogger("obelisk.broker")

CLAIM_FUNC = "workers.tasks.claim_and_run"


class ExecutionBroker(ORM):
    MAX_WAIT = 0.5  # seconds: dequeue() returns at least this often (the pusher checks for stop)
    MIN_CLAIM_SPACING = 0.002  # one claim task drains everything due: don't flood the pool
    REEMIT_AFTER = 0.1  # work still due this long after a claim task: hand out another
    ORM_CHECK_INTERVAL = 1.0  # ordinary django-q2 tasks are looked for this often

    def __init__(self, list_key: str | None = None):
        super().__init__(list_key)
        self._reset()

    def __setstate__(self, state):
        super().__setstate__(state)
        self._reset()

    def _reset(self) -> None:
        self._listener: notify.Listener | None = None
        self._relay: notify.Listener | None = None  # rings the cluster's doorbell (D88)
        self._outage = Outage(logger, "broker")
        self._stat_outage = Outage(logger, "cluster statistics")
        self._served: frozenset[str] = frozenset()
        self._last_claim = 0.0
        self._new_work = False
        self._due_at: float | None = None  # monotonic time the next served execution is due
        self._recheck_at = 0.0  # when to ask the tables again
        self._next_orm_check = 0.0

    # -- django-q2 interface -------------------------------------------------------------

    def dequeue(self):
        """Block until there is something for the pool (at most ``MAX_WAIT``); never raise
        for a database outage: django-q2 would kill the pusher and respawn it 10 s later."""
        parent_death.exit_if_orphaned()
        try:
            tasks = self._dequeue()
        except DATABASE_ERRORS as error:
            self._outage.wait(error)
            self._recheck_at = 0.0
            return None
        self._outage.recovered()
        return tasks

    def _dequeue(self):
        self._start()
        now = time.monotonic()
        if now >= self._next_orm_check:
            self._next_orm_check = now + self.ORM_CHECK_INTERVAL
            tasks = self._orm_tasks()
            if tasks:
                return tasks
        if now >= self._recheck_at:
            self._refresh_due(now)
        if self._due_at is not None and now >= self._due_at and self._may_claim(now):
            return [self._claim_task(now)]
        for note in self._listener.wait(self._wait_seconds(now)):
            if note.channel == notify.PENDING and self._served.intersection(note.items):
                if lingering.someone_lingers():  # that worker claims it; look again later
                    self._recheck_at = min(self._recheck_at, time.monotonic() + self.REEMIT_AFTER)
                    continue
                self._due_at = time.monotonic()
                self._new_work = True
            elif note.channel in (notify.TIMER, notify.SCHEDULED):
                self._recheck_at = 0.0
        return None

    def set_stat(self, key: str, value: str, timeout: int):
        """Cluster statistics (saved by the sentinel every guard cycle): a database outage
        is logged once, not every half second (django-q2 would log each failure)."""
        parent_death.exit_if_orphaned()
        try:
            result = super().set_stat(key, value, timeout)
        except DATABASE_ERRORS as error:
            self._stat_outage.failed(error)
            return None
        self._stat_outage.recovered()
        return result

    def ping(self) -> bool:
        """Called by django-q2's sentinel before it forks the pool: from here on the
        cluster's processes ignore SIGTERM, and the ``obelisk_worker`` process, which does
        not, stops them in order (``workers.shutdown``). Worker processes install their own
        handler when they start, to stop gracefully."""
        ignore_sigterm()
        return True

    def info(self) -> str:
        return "Obelisk execution tables (claims) + ORM queue"

    # -- internals --------------------------------------------------------------------

    def _start(self) -> None:
        if self._listener is not None:
            return
        from workers.components import load_components

        functions = load_components()
        self._served = frozenset(functions)
        if (cluster := doorbell.of_cluster()) is not None:
            workflows = frozenset(f for f, spec in functions.items() if spec.kind == "workflow")
            self._relay = cluster.relay(self._served - workflows, workflows)
        self._listener = notify.Listener([notify.PENDING, notify.TIMER, notify.SCHEDULED])
        logger.info("broker serving %d function(s): %s", len(self._served), ", ".join(sorted(self._served)))

    def _may_claim(self, now: float) -> bool:
        since = now - self._last_claim
        return since >= self.MIN_CLAIM_SPACING and (self._new_work or since >= self.REEMIT_AFTER)

    def _wait_seconds(self, now: float) -> float:
        wake = min(self._recheck_at, self._next_orm_check, now + self.MAX_WAIT)
        if self._due_at is not None:
            ready = self._last_claim + (self.MIN_CLAIM_SPACING if self._new_work else self.REEMIT_AFTER)
            wake = min(wake, max(self._due_at, ready))
        return max(0.0, wake - now)

    def _orm_tasks(self):
        now = timezone.now()
        tasks = []
        for task in self.get_connection().filter(key=self.list_key, lock__lt=now)[:10]:
            if self.get_connection().filter(id=task.id, lock=task.lock).update(lock=self.timeout(task)):
                tasks.append((task.pk, task.payload))
        return tasks

    def _refresh_due(self, now: float) -> None:
        """Ask the tables when the next served execution is due."""
        self._recheck_at = now + self.MAX_WAIT
        first = store.next_pending_at(self._served)
        if first is None:
            self._due_at = None
            return
        self._due_at = now + max(0.0, (first - timezone.now()).total_seconds())

    def _claim_task(self, now: float):
        """A django-q2 task package for ``claim_and_run``; no ack id, nothing to acknowledge."""
        self._last_claim = now
        self._new_work = False
        self._recheck_at = min(self._recheck_at, now + self.REEMIT_AFTER)
        name, task_id = uuid()
        package = {
            "id": task_id,
            "name": f"claim-{name}",
            "func": CLAIM_FUNC,
            "args": (),
            "kwargs": {},
            "started": timezone.now(),
            "save": False,
        }
        return (None, SignedPackage.dumps(package))
