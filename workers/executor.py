"""The activity executor: claim pending executions, run them, record the results.

One executor lives in each worker process. ``claim_and_run`` is what a django-q2 claim task
calls: it locks a batch of due executions of the functions it serves (one statement,
``SKIP LOCKED`` on PostgreSQL), runs them one after another in this process
(``workers.activity_runner``), and writes their results in group commits (``store.append_many``).
It keeps claiming while work is due, within a time budget, and lingers briefly for new work
(``workers.lingering``, ``workers.doorbell``). The batch size adapts to the activities' run
time. A run that turns out long, or a stop (``workers.shutdown``), hands the rest of the
batch back at once (``Unlocked``, no retry used). The workflows it claims run in its
``workers.workflow_pool``; a run calls back only through ``replay_adapters.ChildRunner``,
which may also run a ``ctx.call``'s child at once in the workflow's own thread (a local
child: ``local_claim``, ``run_local``).

why: D28, D44, D57, D58, D61, D65, D69, D70, D77, D82, D86, D124
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from executions import conf, errors, notify, store
from executions.events import ExecutionFailure, Finished, Unlocked
from executions.ids import new_executor_id, new_run_id
from executions.outage import DATABASE_ERRORS, Outage
from workers import doorbell, heartbeat, lingering, shutdown, telemetry
from workers.activity_runner import (
    Watchdog,
    before_start,
    run_activity,
)
from workers.local_children import LocalChildren
from workers.registry import Function
from workers.workflow_pool import WorkflowPool

logger = logging.getLogger("obelisk.executor")

# How long a run's results are retried through a database outage before they are left to
# the sweep (which then finds their locks expired).
RESULT_WRITE_PATIENCE = 60.0


@dataclass(frozen=True)
class _Due:
    """Which kinds of claim are worth a transaction; ``woken_at``: when a notification
    told of them (a claim another worker starts after it may cover it, D57)."""

    activities: bool
    workflows: bool
    woken_at: float | None = None


@dataclass
class ExecutorStats:
    claimed: int = 0
    finished: int = 0
    lost: int = 0
    handed_back: int = 0
    coalesced: int = 0  # claims held for ``CLAIM_COALESCE`` (D86)


class Executor:
    """Claims and runs the activities in ``functions`` for ``deployment_id``."""

    def __init__(
        self,
        functions: dict[str, Function],
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
        terms = {
            ffqn: store.LockTerms(spec.component_id, spec.retry_config, spec.lock_duration)
            for ffqn, spec in functions.items()
        }
        self.terms = {ffqn: t for ffqn, t in terms.items() if functions[ffqn].kind != "workflow"}
        self.workflow_terms = {ffqn: t for ffqn, t in terms.items() if functions[ffqn].kind == "workflow"}
        self.workflows = WorkflowPool(children=self)
        self.max_batch = max_batch
        self.batch_size = max(1, min(8, max_batch))
        self.target_batch_seconds = target_batch_seconds
        self.flush_after = flush_after
        self.watchdog = watchdog or Watchdog()
        self.stats = ExecutorStats()
        self._unflushed: list[store.AppendItem] = []
        self._flush_lock = threading.Lock()  # the watchdog flushes during slow runs
        self._announcements: doorbell.Announcements | None = None  # subscribed on first use
        self._activity_seconds = 0.0
        self._batch_seconds = float("inf")  # the last batch's run and write: none yet (D58)
        self._unstarted: list[store.LockedExecution] = []
        self._unstarted_lock = threading.Lock()  # the watchdog hands them back during long runs
        self._outage = Outage(logger, "executor")
        self._workflows_waiting = False  # a workflow was due while the pool was full
        self._handed: list[store.LockedExecution] = []  # children created locked for us (D65)
        self._handed_lock = threading.Lock()
        self._accepting = False  # inside ``claim_and_run``: handed children will be run
        self._running = False  # a batch is under way: it is offered no children (D65)
        self._told_while_running = False  # activities were announced during the last batch
        self._in_task = threading.Lock()  # held while a claim task runs (a dead parent waits for it, D96)
        self.local = LocalChildren(self.workflows.size)  # a slot per workflow thread (D124)

    def claim_and_run(self, *, budget: float = 2.0, linger: float = 0.2) -> int:
        """Claim and run batches for up to ``budget`` seconds (``_claim_and_run``)."""
        with self._in_task:
            return self._claim_and_run(budget, linger)

    def _claim_and_run(self, budget: float, linger: float) -> int:
        """Claim and run batches for up to ``budget`` seconds.

        When nothing is due, wait up to ``linger`` seconds for new work (``LISTEN
        obelisk_pending``) before giving the process back to django-q2: a worker that just
        ran picks up the next execution directly, without a round trip through the broker.
        A stopping worker claims nothing; a database outage ends the claim task (the broker
        hands out a new one once the database is back).
        """
        self.watchdog.start()
        self.watchdog.on_hard_stop = self._flush_and_hand_back
        self.watchdog.on_slow_run = self._flush
        self.watchdog.on_long_run = self._hand_back
        self.watchdog.on_stop = self._hand_back
        self.watchdog.on_orphaned = self._leave_orphaned
        deadline = time.monotonic() + budget
        idle_until = time.monotonic() + linger
        done = 0
        due = _Due(activities=True, workflows=True)  # nothing known yet: look for both
        try:
            if self._announcements is None:
                # The cluster's doorbell, rung by its pusher's LISTEN (D88); outside a
                # cluster, one rung from a LISTEN of this process.
                self._announcements = doorbell.Announcements.subscribe(
                    frozenset(self.terms), frozenset(self.workflow_terms)
                )
            # This task's first claim looks without being woken, and takes the activities
            # announced since the last task: left unseen, they would read as work that came
            # during the first batch (D86).
            self._announcements.take(workflows=False)
            self._accept_children(True)
            while time.monotonic() < deadline and not shutdown.stopping():
                limit = self.batch_size
                started, room = self._start_workflows() if due.workflows else (0, 0)
                batch = self._claim_activities(limit, due.woken_at) if due.activities else []
                # A full claim may have left more behind; otherwise what comes due next is
                # announced to the listener, which was subscribed before the claim (D79).
                due = _Due(activities=len(batch) >= limit, workflows=0 < room <= started)
                if due.activities and not due.workflows:  # busy: a workflow may not wait for it
                    due = _Due(activities=True, workflows=self._workflow_announced())
                batch = self._begin_batch(batch)
                if batch:
                    self._activity_seconds = 0.0
                    lingering.batch_started(self._batch_seconds)  # new work may wait for it (D58)
                    batch_started = time.monotonic()
                    with heartbeat.running(len(batch)):  # the cluster's load (two updates per batch)
                        self.run_batch(batch)
                    self._batch_seconds = time.monotonic() - batch_started
                    self._adapt(len(batch), self._activity_seconds)
                    done += len(batch)
                    idle_until = time.monotonic() + linger
                if started:
                    done += started
                    idle_until = time.monotonic() + linger
                if due.activities or due.workflows or self._handed:
                    continue
                with lingering.lingering():
                    due = self._wait_for_work(idle_until)
                if due is None and time.monotonic() - self.local.last_ran < linger:
                    # Local children ran meanwhile (D124): they announce nothing, and the
                    # workflows calling them run theirs only while this task claims.
                    idle_until, due = time.monotonic() + linger, _Due(activities=False, workflows=False)
                if due is None:
                    break
        except DATABASE_ERRORS as error:
            time.sleep(self._outage.failed(error))
        finally:
            self._accept_children(False)
            lingering.idle()
        if shutdown.stopping():  # running workflows stop waiting at once and hand back
            grace = conf.get("SHUTDOWN_GRACE").total_seconds()
            self.workflows.dismiss_parked(wait=grace)
            self.workflows.join(grace)
        return done

    def _claim(
        self, terms: dict[str, store.LockTerms], limit: int, known: dict[str, int] | None = None
    ) -> list[store.LockedExecution]:
        """Lock up to ``limit`` due executions of the functions of ``terms`` (one transaction);
        ``known``: workflows whose history a parked run holds (D77)."""
        started = time.monotonic() if telemetry.ENABLED else 0.0
        claimed = store.lock_pending(
            terms,
            limit=limit,
            executor_id=self.executor_id,
            run_id=new_run_id(),
            deployment_id=self.deployment_id,
            known=known,
        )
        if telemetry.ENABLED:
            telemetry.claimed(time.monotonic() - started, len(claimed), workflows=terms is self.workflow_terms)
        return claimed

    def _claim_activities(self, limit: int, woken_at: float | None = None) -> list[store.LockedExecution]:
        """Claim activities, unless a claim another worker of the cluster started after
        this one was woken already took what the notification announced (D57)."""
        if woken_at is not None and lingering.covered(woken_at):
            return []
        with lingering.claiming(limit) as batch:
            batch.extend(self._claim(self.terms, limit))
        self._outage.recovered()
        return batch

    def _start_workflows(self) -> tuple[int, int]:
        """Claim due workflows, as many as the pool has room for, and start a run of each
        in a thread of its own (``workers.workflow_pool``): an awaiting workflow holds a
        thread, never this process's activities. A workflow whose run is parked in the pool
        goes on in that run (D77). Returns how many were claimed, and how many could have
        been (a claim that took fewer took all that was due)."""
        if not self.workflow_terms or (room := self.workflows.free()) <= 0:
            self._workflows_waiting = bool(self.workflow_terms)
            return 0, 0
        self._workflows_waiting = False
        claimed = self._claim(self.workflow_terms, room, self.workflows.parked_versions())
        for locked in claimed:
            self.workflows.start(locked, self.functions[locked.ffqn], self.deployment_id)
        return len(claimed), room

    def _workflow_announced(self) -> bool:
        """Whether a served workflow came due while this executor's activities kept it
        busy: the announcements made meanwhile, taken without waiting (without LISTEN, on
        SQLite, one may always have). Otherwise a workflow made pending by a response,
        whose next run an Interrupt workflow needs, waited for the whole activity backlog
        to drain. Announcements of activities it takes are not lost: a full batch claims
        again anyway."""
        if not self.workflow_terms:
            return False
        if not notify.is_postgres():
            return True
        return self._announcements.take()[1]

    # -- Children created locked for this executor (eager dispatch, D65): the two calls of
    # ``workers.replay_adapters.ChildRunner``, the only ones a workflow run makes back here.

    def child_claim(self, ffqns: list[str]) -> store.ChildClaim | None:
        """What a workflow run in this process may lock for this executor among the
        children its next write creates: the activities it serves, as many as its next
        batch has room for, while it claims and is not running activities. A busy executor
        is offered none: a child would wait behind the runs under way, where any other
        worker can take it when it is created pending. None: create them pending, as usual."""
        terms = {ffqn: self.terms[ffqn] for ffqn in ffqns if ffqn in self.terms}
        with self._handed_lock:
            room = self.batch_size - len(self._handed) if self._accepting and not self._running else 0
        if room <= 0 or not terms:
            return None
        return store.ChildClaim(terms, room, self.executor_id, new_run_id(), self.deployment_id)

    def hand_over(self, locked: list[store.LockedExecution]) -> None:
        """Children a workflow run created locked under ``child_claim``: run them next.
        If this executor stopped claiming or started a batch meanwhile, they are handed
        back at once (``Unlocked``), for any worker to claim."""
        with self._handed_lock:
            if self._accepting and not self._running:
                self._handed.extend(locked)
                locked = []
        if locked:  # it stopped claiming, or started running activities meanwhile
            self._give_back(locked, "handed back: the executor is busy or stopped claiming")
            return
        self._announcements.nudge()

    # -- Local children (D124): a ``ctx.call``'s child run in the workflow's own thread.

    def local_claim(self, ffqn: str) -> store.ChildClaim | None:
        """A claim of the one child of a ``ctx.call`` for the workflow run calling, which
        will run it itself (``run_local``) right after its write creates it locked: an
        activity this executor serves, while it claims (inside ``claim_and_run``, as for
        eager dispatch, D65; local runs keep that claim task lingering) and a local slot is
        free. None: the child takes the eager or the pending path (``child_claim``). The
        write still locks it only if it is due now and built from the component served. A
        claim holds its slot until ``run_local`` is given it back."""
        terms = self.terms.get(ffqn)
        if terms is None or not self._accepting or shutdown.stopping():
            return None
        return self.local.claim(terms, ffqn, self.executor_id, self.deployment_id)

    def run_local(self, claim: store.ChildClaim, locked: store.LockedExecution | None) -> datetime | None:
        """Run the child a write created ``locked`` under ``claim`` in this thread, and write
        its result (one statement with the response to the parent, D81, which this
        process's listeners get in memory, D67), then free the claim's slot; None: the
        write locked nothing, only the slot is freed. Returns when its ``Finished`` was
        written (the parent's next write expects the row so, D126), None otherwise. Never
        raises: a result not written leaves the child's lock to expire, and it is run again
        (at least once per attempt)."""
        watchdog = self.local.slot_of(claim)
        try:
            if locked is None:
                return None
            spec = self.functions[locked.ffqn]
            self.stats.claimed += 1

            def run(child: store.LockedExecution) -> store.AppendItem | None:
                return self.local.run(child, spec, watchdog, self._flush_and_hand_back)

            item = telemetry.run_attempt(run, locked) if telemetry.ENABLED else run(locked)  # the attempt's span
            if item is None:
                self.stats.lost += 1
                return None
            at = timezone.now()
            results = self._write([item], now=at)
            return at if isinstance(item.event, Finished) and results and isinstance(results[0], int) else None
        except Exception:
            logger.exception("local child %s: its result was not written; its lock expires", locked.execution_id)
            return None
        finally:
            self.local.give_back(watchdog)

    def _begin_batch(self, claimed: list[store.LockedExecution]) -> list[store.LockedExecution]:
        """The batch to run: the children handed over so far, first, then ``claimed``. From
        here until the batch has run, children handed over are given back instead of
        waiting behind it (``run_batch`` ends that)."""
        with self._handed_lock:
            batch, self._handed = self._handed + claimed, []
            self._running = bool(batch)
        return batch

    def _take_handed(self) -> list[store.LockedExecution]:
        with self._handed_lock:
            handed, self._handed = self._handed, []
        return handed

    def _accept_children(self, accepting: bool) -> None:
        """Open or close the window in which ``hand_over`` queues children; at its end
        the ones not taken yet are handed back."""
        with self._handed_lock:
            self._accepting = accepting and not shutdown.stopping()
        if not self._accepting and (left := self._take_handed()):
            self._give_back(left, "handed back unstarted: the executor stopped claiming")

    def _wait_for_work(self, until: float) -> _Due | None:
        """Wait until a served function has work due; None when ``until`` passed.

        A claim is made only for what a notification names (decision D43): a claim that
        finds nothing costs a transaction, and every commit of a workflow run in this
        process would otherwise cost one or two. Without LISTEN (SQLite) every poll
        interval is worth a claim of both kinds. A workflow that was due while the pool
        was full is looked for again once a thread is free.
        """
        streaming, self._told_while_running = self._told_while_running, False
        while (timeout := until - time.monotonic()) > 0 and not shutdown.stopping():
            if self._workflows_waiting and self.workflows.free() > 0:
                return _Due(activities=False, workflows=True)
            if self._handed:
                return _Due(activities=False, workflows=False)
            activities, workflows = self._announcements.wait(min(timeout, 0.05) if self._workflows_waiting else timeout)
            due = _Due(activities=activities, workflows=workflows, woken_at=time.monotonic())
            if not notify.is_postgres():
                return _Due(activities=True, workflows=True)
            if due.activities and not due.workflows and streaming and self.batch_size > 1:
                return self._coalesce(due)
            if due.activities or due.workflows:
                return due
        return None

    def _coalesce(self, due: _Due) -> _Due:
        """Work was announced while this worker ran its last batch: it streams in faster
        than one claim per execution keeps up with. Wait ``CLAIM_COALESCE`` so the next
        claim takes what arrives meanwhile too: a claim and a group commit cost the same
        for one execution as for a few. A caller that waits for each result before
        submitting the next is not held, since its next submission can only come after
        the results were written (D86). Only when a claim may take more than one (slow
        activities are claimed one at a time, ``_adapt``). What was announced meanwhile
        is marked seen (the claim covers it): left unseen, it would end the next wait."""
        window = conf.get("CLAIM_COALESCE").total_seconds()
        if window <= 0:
            return due
        self.stats.coalesced += 1
        lingering.claims_within(window)
        time.sleep(window)
        _, workflows = self._announcements.take()
        return _Due(activities=True, workflows=workflows, woken_at=due.woken_at)

    def run_batch(self, batch: list[store.LockedExecution]) -> None:
        """Run a claimed batch one after another; results go out in group commits. What
        has not started when a run turns out long, or when the worker is asked to stop, is
        handed back (``_hand_back``) instead of waiting for its lock to expire."""
        self.stats.claimed += len(batch)
        with self._unstarted_lock:
            self._unstarted = list(batch)
        oldest_unflushed = 0.0
        try:
            while (locked := self._next_unstarted()) is not None:
                if self._unflushed and time.monotonic() - oldest_unflushed >= self.flush_after:
                    self._flush()
                item = telemetry.run_attempt(self._run_one, locked) if telemetry.ENABLED else self._run_one(locked)
                if item is None:
                    self.stats.lost += 1
                    continue
                with self._flush_lock:
                    if not self._unflushed:
                        oldest_unflushed = time.monotonic()
                    self._unflushed.append(item)
        finally:
            with self._handed_lock:
                self._running = False  # children handed over during the last write run next
        # Before the results go out: nothing announced by now can be a caller's reaction
        # to them, so it streams in regardless of this worker's pace (D86).
        self._told_while_running = self._announcements is not None and self._announcements.peek()[0]
        self._flush()

    def _next_unstarted(self) -> store.LockedExecution | None:
        if shutdown.stopping():
            self._hand_back("handed back unstarted: worker is stopping")
        with self._unstarted_lock:
            return self._unstarted.pop(0) if self._unstarted else None

    def _run_one(self, locked: store.LockedExecution) -> store.AppendItem | None:
        spec = self.functions[locked.ffqn]
        start, instead = before_start(locked, spec)
        if not start:
            return instead
        started = time.monotonic()
        try:
            with self._unstarted_lock:
                waiting = bool(self._unstarted)
            return run_activity(
                locked, spec, self.watchdog, flush_if_slow=bool(self._unflushed), hand_back_if_long=waiting
            )
        finally:
            self._activity_seconds += time.monotonic() - started

    def _hand_back(self, reason: str) -> None:
        """Give back the claimed executions that have not started: ``Unlocked`` with each
        one's fence, in one transaction, no retry used. Called by the watchdog thread while
        a long run goes on, or when the worker is stopping."""
        with self._unstarted_lock:
            waiting, self._unstarted = self._unstarted, []
        if waiting:
            self._give_back(waiting, reason)

    def _give_back(self, waiting: list[store.LockedExecution], reason: str) -> None:
        """``Unlocked`` for each of ``waiting``, with its fence, in one transaction."""
        unlocked = Unlocked(unlocked_at=timezone.now(), reason=reason)
        items = [store.AppendItem(locked.execution_id, None, unlocked, locked.fence) for locked in waiting]
        try:
            results = self._ride_outage(store.append_many, items)
        except Exception as error:  # their locks will expire; the sweep returns them
            logger.warning("could not hand back %d execution(s): %s", len(items), error)
            return
        for item, result in zip(items, results, strict=True):
            if isinstance(result, errors.StoreError):
                logger.warning("could not hand back %s: %s", item.execution_id, result)
            else:
                self.stats.handed_back += 1
        logger.info("%s: %d execution(s)", reason, len(items))

    def _flush(self) -> None:
        """Write the finished runs' results in one transaction (a group commit)."""
        with self._flush_lock:
            items, self._unflushed = self._unflushed, []
            if items:
                self._write(items)

    def _write(self, items: list[store.AppendItem], now: datetime | None = None) -> list | None:
        """Write results, never losing one to another's problem: a group commit that fails
        as a whole (not an outage) is retried item by item, and a result the store refuses
        (``UnsupportedValue``, ``PayloadTooLarge``) finishes its own execution as failed.
        Returns each item's result as the group commit gave it (None: not written)."""
        parked = self._parked_runs()
        try:
            results = self._ride_outage(lambda: store.append_many(items, now=now, parked=parked))
        except DATABASE_ERRORS as error:
            logger.error("%d result(s) not recorded, the database stayed unavailable: %s", len(items), error)
            return None
        except Exception as error:
            logger.warning("group commit of %d result(s) failed (%s); writing them one by one", len(items), error)
            results = [self._write_alone(item) for item in items]
        finally:  # the statement may have committed before what came after it failed
            if parked is not None and parked.resumed:
                self._resume_parked(parked)
        if telemetry.ENABLED:
            telemetry.results_written(items, results)
        rejected = []
        for item, result in zip(items, results, strict=True):
            if isinstance(result, errors.ValidationFailed) and _is_result(item):
                failure = ExecutionFailure("uncategorized", f"result rejected: {result}")
                rejected.append(store.AppendItem(item.execution_id, item.version, Finished(retval=failure), item.fence))
            elif isinstance(result, errors.StoreError):
                self.stats.lost += 1
                logger.warning("result of %s not recorded: %s", item.execution_id, result)
            else:
                self.stats.finished += 1
        for item in rejected:
            result = self._write_alone(item)
            if isinstance(result, errors.StoreError):
                logger.error("result of %s not recorded: %s", item.execution_id, result)
            else:
                self.stats.finished += 1
        return results

    def _parked_runs(self) -> store.ParkedRuns | None:
        """The workflows whose runs are parked in this process's pool: a group commit whose
        results answer one locks it for this executor, as its claim would (D82)."""
        if not self.workflow_terms or not (versions := self.workflows.parked_runs()):
            return None
        return store.ParkedRuns(versions, self.executor_id, new_run_id(), self.deployment_id)

    def _resume_parked(self, parked: store.ParkedRuns) -> None:
        """Hand each workflow the group commit locked to its parked run, which goes on under
        that lock with the responses it was given (D82). A run that left its place meanwhile
        takes nothing: the lock goes back (``Unlocked``) for a claim to take."""
        for execution_id, (locked, version, responses) in parked.resumed.items():
            if self.workflows.resume_parked(execution_id, locked, version, responses):
                continue
            fence = store.Fence(locked.run_id, locked.lock_generation)
            unlocked = Unlocked(unlocked_at=timezone.now(), reason="handed back: its parked run had left")
            try:
                store.append(execution_id, None, unlocked, fence=fence)
            except (errors.StoreError, *DATABASE_ERRORS) as error:  # the lock expires, the sweep returns it
                logger.warning("could not hand %s back: %s", execution_id, error)

    def _write_alone(self, item: store.AppendItem) -> int | errors.StoreError:
        try:
            return self._ride_outage(store.append_many, [item])[0]
        except DATABASE_ERRORS:
            raise
        except Exception as error:  # the database refused this one value
            return errors.UnsupportedValue(f"the database refused it: {type(error).__name__}: {error}")

    def _ride_outage(self, operation, *args):
        """Call a store operation, retrying through a database outage for up to
        ``RESULT_WRITE_PATIENCE`` seconds (the results are worth more than a re-run)."""
        give_up = time.monotonic() + RESULT_WRITE_PATIENCE
        while True:
            try:
                result = operation(*args)
            except DATABASE_ERRORS as error:
                if time.monotonic() >= give_up:
                    raise
                time.sleep(self._outage.failed(error))
                continue
            self._outage.recovered()
            return result

    def _leave_orphaned(self) -> bool:
        """The cluster's main process died (D96); asked by the watchdog at each tick. False
        while a claim task runs: it claims nothing more, hands back and writes what it
        ran. Then the workflow runs, which stop waiting, hand back within the grace
        period, and True: nothing is held, the process may end. The claim task lock is
        kept, so no claim task starts meanwhile."""
        if not self._in_task.acquire(blocking=False):
            return False
        grace = conf.get("SHUTDOWN_GRACE").total_seconds()
        self.workflows.dismiss_parked(wait=grace)
        self.workflows.join(grace)
        return True

    def _flush_and_hand_back(self) -> None:
        """Before a hard stop: save finished results and give back claims not yet started."""
        self._flush()
        self._hand_back("handed back unstarted: worker process is ending")

    def _adapt(self, size: int, activity_seconds: float) -> None:
        """Size the next claim so that running it takes about ``target_batch_seconds``:
        fast activities are claimed by the hundred, slow ones one at a time."""
        per_item = activity_seconds / size
        wanted = self.max_batch if per_item <= 0 else int(self.target_batch_seconds / per_item)
        self.batch_size = max(1, min(self.max_batch, wanted, self.batch_size * 2))


def _is_result(item: store.AppendItem) -> bool:
    """A run's outcome (not a hand-back), which must be recorded one way or another."""
    return isinstance(item.event, (Finished, store.AttemptFailed))
