"""The timer sweep: every wake-up path that depends on time or on a dead worker.

- expired locks (a worker died or hung): back to pending with a retry, unlocked, or
  finished as timed out (``state_machine.on_lock_expired``);
- due delays: their ``DelayFinished`` response is appended, which wakes the workflow;
- cancellations: a cancelling execution that no live run holds is finished as cancelled;
- due schedules: their ticks become executions (``executions.schedules.fire_due``, D113).

Scheduled and retry-pending executions need no sweep: they are ``pending_at`` rows the
broker wakes the executors for. Everything here is idempotent and safe from several
clusters at once: each action locks its row and re-checks it, and the version fence turns
a lost race into a no-op. It runs as a thread of the ``obelisk_worker`` process
(``SweeperThread``).

why: D11, D24, D26, D30, D31, D113
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from django.db import close_old_connections, connection
from django.utils import timezone

from executions import conf, errors, notify, schedules, store
from executions.outage import DATABASE_ERRORS, Outage

logger = logging.getLogger("obelisk.sweeper")


@dataclass
class SweepReport:
    expired_locks: int = 0
    fired_delays: int = 0
    cancelled: int = 0
    ticks: int = 0

    def __bool__(self) -> bool:
        return bool(self.expired_locks or self.fired_delays or self.cancelled or self.ticks)


def sweep(now: datetime | None = None, *, limit: int = 500, expire_locks: bool = True) -> SweepReport:
    """One pass over everything due at ``now``. ``expire_locks`` False leaves expired locks
    alone (for a while after a database outage, see ``SweeperThread``)."""
    now = now or timezone.now()
    report = SweepReport()
    delays, locks = store.get_expired_timers(now=now, limit=limit)
    for delay in delays:
        try:
            if store.fire_delay(delay.delay_id, now=now) is store.DelayOutcome.DELIVERED:
                report.fired_delays += 1
        except errors.StoreError as error:
            logger.warning("delay %s: %s", delay.delay_id, error)
    for lock in locks if expire_locks else ():
        try:
            if store.expire_lock(lock.execution_id, now=now) is not None:
                report.expired_locks += 1
        except errors.StoreError as error:
            logger.warning("expired lock of %s: %s", lock.execution_id, error)
    for execution_id, component_type in store.get_cancelling(limit=limit):
        try:
            if component_type == "workflow":  # decision 14: its children are cancelled first
                store.cancel_children(execution_id, now=now)
            if store.finish_cancelled(execution_id, now=now):
                report.cancelled += 1
        except errors.StoreError as error:
            logger.warning("cancelling %s: %s", execution_id, error)
    fired = schedules.fire_due(now=now, limit=limit)
    report.ticks = fired.started + fired.dropped
    for schedule_id in fired.paused:
        logger.warning("schedule %s paused: its target cannot be submitted (see the console)", schedule_id)
    for error in fired.errors:
        logger.warning("schedule %s", error)
    return report


class SweeperThread(threading.Thread):
    """Runs ``sweep`` at the next timer's time, at least every ``max_interval`` seconds,
    and at once when a timer or a cancellation is written (LISTEN/NOTIFY on PostgreSQL).

    It lives in the ``obelisk_worker`` process, not in a django-q2 process, so it runs as
    long as the cluster does, whatever happens to the pusher. A database outage is ridden
    out with capped back-off and one log line (``executions.outage``); after one, expired
    locks are left alone for ``OBELISK['OUTAGE_LOCK_GRACE']``: their workers are alive and
    renewing, and must not lose a retry because the database was away.
    """

    def __init__(self, *, max_interval: float = 1.0):
        super().__init__(name="obelisk-sweeper", daemon=True)
        self.max_interval = max_interval
        self.stopping = threading.Event()
        self._outage = Outage(logger, "timer sweep")

    def run(self) -> None:
        listener = None
        while not self.stopping.is_set():
            try:
                if listener is None:
                    listener = notify.Listener([notify.TIMER, notify.CANCEL])
                report = sweep(expire_locks=self._may_expire_locks())
                self._outage.recovered()
                if report:
                    logger.info("sweep: %s", report)
                listener.wait(self._wait_seconds(progress=bool(report)))
            except DATABASE_ERRORS as error:
                self.stopping.wait(self._outage.failed(error))
            except Exception:
                logger.exception("sweep failed; retrying")
                connection.close()
                self.stopping.wait(self.max_interval)
            finally:
                close_old_connections()
        if listener is not None:
            listener.close()

    def _may_expire_locks(self) -> bool:
        if self._outage.ongoing:  # the first pass after an outage: the workers renew first
            return False
        if self._outage.ended is None:
            return True
        return time.monotonic() - self._outage.ended >= conf.get("OUTAGE_LOCK_GRACE").total_seconds()

    def _wait_seconds(self, *, progress: bool) -> float:
        """Until the next timer is due; an overdue timer the last pass could not handle
        (another cluster holds it) is retried at the regular interval, not in a loop."""
        times = [t for t in (store.next_timer_at(), store.next_schedule_due_at()) if t is not None]
        next_at = min(times, default=None)
        if next_at is None:
            return self.max_interval
        seconds = (next_at - timezone.now()).total_seconds()
        if seconds <= 0 and not progress:
            return self.max_interval
        return min(self.max_interval, max(0.005, seconds))

    def stop(self) -> None:
        self.stopping.set()
