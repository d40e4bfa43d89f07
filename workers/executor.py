"""The activity executor: claim pending executions, run them, record the results.

One executor lives in each worker process. ``claim_and_run`` is what a django-q2 task
calls: it locks a batch of due executions of the functions it serves (one transaction,
``SKIP LOCKED`` on PostgreSQL), runs them one after another in this process
(``workers.runner``), and writes their results in group commits (``store.append_many``).
It keeps claiming while work is due, within a time budget, and lingers briefly for new
work, so neither a backlog nor a stream of single executions needs a round trip through
the broker per batch.

The batch size adapts: it grows while batches finish quickly and shrinks to 1 for slow
activities, so a slow activity never holds a long tail of claimed executions hostage.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from executions import errors, notify, store
from executions.events import ExecutionFailure, Finished
from executions.ids import new_executor_id, new_run_id
from workers.registry import ActivityFunction
from workers.runner import Watchdog, extend_before_start, run_activity

logger = logging.getLogger("obelisk.executor")


@dataclass
class ExecutorStats:
    claimed: int = 0
    finished: int = 0
    lost: int = 0


class ActivityExecutor:
    """Claims and runs the activities in ``functions`` for ``deployment_id``."""

    def __init__(
        self,
        functions: dict[str, ActivityFunction],
        deployment_id: str,
        *,
        max_batch: int = 128,
        target_batch_seconds: float = 0.05,
        flush_after: float = 0.005,
        watchdog: Watchdog | None = None,
    ):
        self.functions = functions
        self.deployment_id = deployment_id
        self.executor_id = new_executor_id()  # new per process: a restarted worker is a new incarnation
        self.terms = {
            ffqn: store.LockTerms(spec.component_id, spec.retry_config, spec.lock_duration)
            for ffqn, spec in functions.items()
        }
        self.max_batch = max_batch
        self.batch_size = max(1, min(8, max_batch))
        self.target_batch_seconds = target_batch_seconds
        self.flush_after = flush_after
        self.watchdog = watchdog or Watchdog()
        self.stats = ExecutorStats()
        self._unflushed: list[store.AppendItem] = []
        self._flush_lock = threading.Lock()  # the watchdog flushes during slow runs
        self._listener: notify.Listener | None = None
        self._activity_seconds = 0.0
        self._unstarted: list[store.LockedExecution] = []

    def claim_and_run(self, *, budget: float = 2.0, linger: float = 0.2) -> int:
        """Claim and run batches for up to ``budget`` seconds.

        When nothing is due, wait up to ``linger`` seconds for new work (``LISTEN
        obelisk_pending``) before giving the process back to django-q2: a worker that just
        ran picks up the next execution directly, without a round trip through the broker.
        """
        self.watchdog.start()
        self.watchdog.on_hard_stop = self._flush_and_release
        self.watchdog.on_slow_run = self._flush
        if self._listener is None:
            self._listener = notify.Listener([notify.PENDING])
        deadline = time.monotonic() + budget
        idle_until = time.monotonic() + linger
        done = 0
        while time.monotonic() < deadline:
            limit = self.batch_size
            batch = store.lock_pending(
                self.terms,
                limit=limit,
                executor_id=self.executor_id,
                run_id=new_run_id(),
                deployment_id=self.deployment_id,
            )
            if batch:
                self._activity_seconds = 0.0
                self.run_batch(batch)
                self._adapt(len(batch), self._activity_seconds)
                done += len(batch)
                idle_until = time.monotonic() + linger
                continue
            if not self._wait_for_work(idle_until):
                break
        return done

    def _wait_for_work(self, until: float) -> bool:
        """Wait for a served function's work to become due; False when ``until`` passed."""
        while (timeout := until - time.monotonic()) > 0:
            for note in self._listener.wait(timeout):
                if note.channel == notify.PENDING and self.terms.keys() & set(note.items):
                    return True
            if not notify.is_postgres():
                return True  # no LISTEN: each poll interval is worth a claim attempt
        return False

    def run_batch(self, batch: list[store.LockedExecution]) -> None:
        self.stats.claimed += len(batch)
        self._unstarted = list(batch)
        oldest_unflushed = 0.0
        while self._unstarted:
            locked = self._unstarted.pop(0)
            if self._unflushed and time.monotonic() - oldest_unflushed >= self.flush_after:
                self._flush()
            item = self._run_one(locked)
            if item is None:
                self.stats.lost += 1
                continue
            with self._flush_lock:
                if not self._unflushed:
                    oldest_unflushed = time.monotonic()
                self._unflushed.append(item)
        self._flush()

    def _run_one(self, locked: store.LockedExecution) -> store.AppendItem | None:
        spec = self.functions[locked.ffqn]
        locked = extend_before_start(locked, spec)
        if locked is None:
            return None
        started = time.monotonic()
        try:
            return run_activity(locked, spec, self.watchdog, flush_if_slow=bool(self._unflushed))
        finally:
            self._activity_seconds += time.monotonic() - started

    def _flush(self) -> None:
        """Write the finished runs' results in one transaction (a group commit)."""
        with self._flush_lock:
            items, self._unflushed = self._unflushed, []
            if items:
                self._write(items)

    def _write(self, items: list[store.AppendItem]) -> None:
        results = store.append_many(items)
        retry = []
        for item, result in zip(items, results, strict=False):
            if isinstance(result, errors.PayloadTooLarge) or (
                isinstance(result, errors.ValidationFailed) and isinstance(item.event, Finished)
            ):
                failure = ExecutionFailure("uncategorized", f"result rejected: {result}")
                retry.append(store.AppendItem(item.execution_id, item.version, Finished(retval=failure), item.fence))
            elif isinstance(result, errors.StoreError):
                self.stats.lost += 1
                logger.warning("result of %s not recorded: %s", item.execution_id, result)
            else:
                self.stats.finished += 1
        if retry:
            for item, result in zip(retry, store.append_many(retry), strict=False):
                if isinstance(result, errors.StoreError):
                    logger.error("result of %s not recorded: %s", item.execution_id, result)

    def _flush_and_release(self) -> None:
        """Before a hard stop: save finished results and give back claims not yet started."""
        self._flush()
        for locked in self._unstarted:
            try:
                store.append(
                    locked.execution_id, None, _unlocked("worker stopped before running it"), fence=locked.fence
                )
            except errors.StoreError as error:
                logger.warning("could not release %s: %s", locked.execution_id, error)

    def _adapt(self, size: int, activity_seconds: float) -> None:
        """Size the next claim so that running it takes about ``target_batch_seconds``:
        fast activities are claimed by the hundred, slow ones one at a time."""
        per_item = activity_seconds / size
        wanted = self.max_batch if per_item <= 0 else int(self.target_batch_seconds / per_item)
        self.batch_size = max(1, min(self.max_batch, wanted, self.batch_size * 2))


def _unlocked(reason: str):
    from django.utils import timezone

    from executions.events import Unlocked

    return Unlocked(unlocked_at=timezone.now(), reason=reason)
