"""Run one locked workflow execution: the store I/O around the pure replay core.

``replay.EventHistory`` decides what every host call means (spec 002 §3); this module
supplies its ports, backed by ``executions.store``:

- ``StoreWriter``: new history events (and the children or scheduled executions they
  create) in one fenced transaction each (``append_batch_create_new_execution``);
- ``StoreWaiter``: Await (decision 10) — the run waits in place for the next responses,
  woken by ``obelisk_response`` (LISTEN/NOTIFY on PostgreSQL, polling on SQLite), until its
  lock's deadline minus a leeway; then the run interrupts and a later response starts a new
  run that replays (decision 5). A stopping worker stops waiting at once;
- ``StoreCanceller``: closing a join set cancels unawaited activities and delays (§5.1);
- ``StoreLease``: at the start of a host call close to the lock's expiry, the lock is
  renewed (a heartbeat while ``locked``; a ``Locked`` event by the same run when a resolved
  wait left the row pending, spec 000 §10 keep-warm).

``run_workflow`` then calls the function with its ``WorkflowContext``, finalizes (closes the
open join sets, checks that nothing recorded was left unreplayed) and appends ``Finished``
with the run's fence. The run executes in a thread of the worker process (``workers.
executor``), so one process keeps many awaiting workflows without starving activities.
"""

from __future__ import annotations

import dataclasses
import linecache
import logging
import queue
import sys
import sysconfig
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from django.db import connection
from django.utils import timezone

from executions import conf, errors, notify, store, tracing
from executions.events import Err, Event, ExecutionFailure, Finished, HistoryEventRecord, JoinNext, Locked, Ok, Unlocked
from executions.ids import ExecutionId
from executions.outage import DATABASE_ERRORS, close_if_unusable_or_obsolete
from workers import determinism, heartbeat, shutdown, telemetry
from workers.activity import ActivityError
from workers.capture import RunLog, capturing
from workers.registry import ArgumentError, Function, lookup
from workers.replay import (
    EventHistory,
    FatalWorkflowError,
    ImportedFunctionCallError,
    NewExecution,
    WorkflowInterrupt,
    WorkflowSignal,
    WriteFailed,
)
from workers.workflow import WorkflowContext

logger = logging.getLogger("obelisk.workflow")
# Frames from these are the engine's (and Python's), not the workflow's own code.
_ENGINE_PATHS = tuple(
    {
        str(Path(__file__).resolve().parent.parent / "workers"),
        str(Path(__file__).resolve().parent.parent / "executions"),
    }
    | {path for path in sysconfig.get_paths().values()}
)

LEEWAY_FRACTION = 0.2  # an Await wait ends this share of the lock duration before it expires
BATCH_SIZE = 100  # buffered non-blocking events per transaction, under both strategies (§3.6, D60)


class ChildRunner(Protocol):
    """This process's activity executor, seen from a workflow run: it may take the
    children a write creates, locked for it in that write (eager dispatch, D65)."""

    def child_claim(self, ffqns: list[str]) -> store.ChildClaim | None: ...

    def hand_over(self, locked: list[store.LockedExecution]) -> None: ...


class StoreWriter:
    """``Writer``: fenced appends of history events with the executions they create."""

    def __init__(self, locked: store.LockedExecution, deployment_id: str, children: ChildRunner | None = None):
        self.locked = locked
        self.deployment_id = deployment_id
        self.children = children
        self._component = locked.locked.component_id.model_dump(mode="json")
        self.before_join_next: Callable[[int], None] | None = None  # told the last version (D77)

    def append(self, version: int, events: Sequence[Any], creates: Sequence[NewExecution]) -> None:
        if self.before_join_next is not None and any(_hands_on(event) for event in events):
            self.before_join_next(version + len(events) - 1)
        requests = [self._create_request(new) for new in creates]
        claim = self.children.child_claim([r.ffqn for r in requests]) if requests and self.children else None
        _, claimed = store.append_and_claim_children(
            self.locked.execution_id,
            version,
            [HistoryEventRecord(event=event) for event in events],
            requests,
            fence=self.locked.fence,
            stack=self._blocking_stack(events),
            claim=claim,
        )
        if claimed:
            self.children.hand_over(claimed)

    def _blocking_stack(self, events: Sequence[Any]) -> store.BlockingStack | None:
        """A write with a join-next may block the workflow: the store keeps where its own
        code was (``t_backtrace``) if the write leaves it blocked on a join set."""
        if not any(isinstance(event, JoinNext) for event in events):
            return None
        frames = _own_frames(sys._getframe(1))
        return store.BlockingStack(self._component, frames) if frames else None

    def _create_request(self, new: NewExecution) -> store.CreateRequest:
        spec = lookup(new.ffqn)
        if spec is None:  # a typo, or a module this worker does not load: fatal, not retried (D98)
            raise ImportedFunctionCallError(
                new.ffqn,
                f"`{new.ffqn}` is not registered in this worker: check the name, and that the module "
                "defining it is in OBELISK_COMPONENT_MODULES (OBELISK['COMPONENT_MODULES'])",
            )
        return store.CreateRequest(
            execution_id=new.execution_id,
            ffqn=new.ffqn,
            params=new.params,
            component_id=spec.component_id,
            deployment_id=self.deployment_id,
            scheduled_at=new.scheduled_at,
            parent=new.parent,
            scheduled_by=new.scheduled_by,
            metadata=tracing.telemetry_context(),  # the run's span: a workflow tree is one trace
        )

    def stub(self, ffqn: str, target: ExecutionId, retval) -> bool:
        created = store.get_created(str(target))
        if created.ffqn != ffqn:
            raise errors.ValidationFailed(f"`{target}` runs {created.ffqn}, not {ffqn}")
        try:
            store.upsert_stub_response(str(target), retval)
        except errors.StubConflict:
            return False
        return True


def _hands_on(event: Any) -> bool:
    """A join-next that ends the run's hold on the row (``run_expires_at`` now: Interrupt
    with no response in hand), where one whose response the run holds keeps it."""
    return isinstance(event, JoinNext) and event.run_expires_at <= timezone.now()


def _own_frames(frame) -> list[dict]:
    """The frames of the workflow's own code from ``frame`` outwards, outermost first, as
    ``traceback.extract_stack`` describes them, without the engine's and the libraries'.
    Only the kept frames' source lines are looked up: ``extract_stack`` checks and reads
    every frame's file, about 0.1 ms at each blocking call."""
    kept = []
    while frame is not None:
        code = frame.f_code
        if not code.co_filename.startswith(_ENGINE_PATHS):
            kept.append((code.co_filename, frame.f_lineno, code.co_name, frame.f_globals))
        frame = frame.f_back
    return [
        {"file": file, "line": line, "function": name, "code": linecache.getline(file, line, module).strip()}
        for file, line, name, module in reversed(kept)
    ]


class StoreWaiter:
    """``Waiter`` (Await): block until new responses arrive or the lock's deadline.

    It listens for the whole run (``close`` ends that), so a cancellation requested
    between two waits is never missed and the lifecycle is read only once per run, and
    again only when a cancellation names this execution or nothing is known (a timed
    wake-up, a poll on SQLite). Likewise the responses: read at the run's first wait (one
    may have arrived between the claim that loaded them and the subscription), and after
    that only when a notification names this execution or nothing is known (D63)."""

    holds_lock = holding = True  # waits with the lock, and holds it all along

    def __init__(self, execution_id: str, lease: StoreLease):
        self.execution_id = execution_id
        self.lease = lease
        self._listener = notify.Listener([notify.RESPONSE, notify.CANCEL])
        self._check_cancel = True
        self._check_responses = True
        self._must_read = True  # nothing known yet: the first wait reads the table
        self._delivered: dict[int, store.Response] = {}  # by seq, from this process's commits (D67)

    def close(self) -> None:
        self._listener.close()

    def wait_for_responses(self, after_seq: int) -> Sequence[Any]:
        """Returns nothing (the run interrupts) at the deadline, when the worker stops, or
        when the execution is being cancelled: the driver takes over (decision 14). A
        database error ends the run (``WriteFailed``, D80), as a lost worker's: raised into the
        workflow's own code it would be a trap, and fail the workflow for good."""
        try:
            return self._wait(after_seq)
        except DATABASE_ERRORS as error:
            raise WriteFailed(f"waiting for responses failed: {error}") from error

    def _wait(self, after_seq: int) -> Sequence[Any]:
        while True:
            if self._check_responses or not notify.is_postgres():
                self._heed(self._listener.wait(0))  # announced before the read: it sees them
                self._check_responses = False
                responses = self._in_hand(after_seq) or self._read(after_seq)
                if responses:
                    return responses
            remaining = self.lease.deadline() - time.monotonic()
            if remaining <= 0 or shutdown.stopping() or self._cancelling():
                return []
            notes = self._listener.wait(min(remaining, 1.0))
            if not notes:  # a timed wake-up: nothing known
                self._check_cancel = self._check_responses = self._must_read = True
            self._heed(notes)

    def _heed(self, notes: Sequence[notify.Notification]) -> None:
        """Note what ``notes`` name of this execution: a cancellation, a response (with
        its value when a commit of this process delivered it, D67)."""
        for note in notes:
            if self.execution_id in note.items:
                self._check_cancel |= note.channel == notify.CANCEL
                if note.channel == notify.RESPONSE:
                    self._check_responses = True
                    values = [r for parent, r in note.responses if parent == self.execution_id]
                    self._must_read |= not values  # another process's commit: only the table knows
                    self._delivered.update((r.seq, r) for r in values)

    def _in_hand(self, after_seq: int) -> list[store.Response]:
        """The responses delivered in memory that follow ``after_seq`` without a gap, if
        nothing else must be read; otherwise none (the table is read)."""
        for seq in [seq for seq in self._delivered if seq <= after_seq]:
            del self._delivered[seq]  # read from the table meanwhile
        if self._must_read:
            return []
        taken = []
        while (response := self._delivered.pop(after_seq + len(taken) + 1, None)) is not None:
            taken.append(response)
        return taken

    def _read(self, after_seq: int) -> list[store.Response]:
        self._must_read = False
        self._delivered.clear()  # the table has them all
        return store.responses_after(self.execution_id, after_seq)

    def _cancelling(self) -> bool:
        if not self._check_cancel:
            return False
        self._check_cancel = False
        return store.get_state(self.execution_id).lifecycle == "cancelling"


class StoreCanceller:
    """``Canceller``: best effort; the store's outcomes make a repeat harmless."""

    def cancel_activity(self, child_id: ExecutionId) -> None:
        store.cancel(str(child_id))

    def cancel_delay(self, delay_id) -> None:
        try:
            store.append_delay_response(str(delay_id), False)
        except errors.NotFound:
            pass  # fired and delivered already


class StoreLease:
    """``Lease``: the run's lock, renewed at host calls that find it close to expiry."""

    def __init__(self, locked: store.LockedExecution, spec: Function):
        self.locked = locked
        self.spec = spec
        self.lock_expires_at: datetime = locked.locked.lock_expires_at
        self.history: EventHistory | None = None

    def terms(self) -> store.LockTerms:
        """The terms its function's runs are locked under."""
        return store.LockTerms(self.spec.component_id, self.spec.retry_config, self.spec.lock_duration)

    def deadline(self) -> float:
        """Monotonic time at which the run must stop waiting (expiry minus the leeway)."""
        leeway = self.spec.lock_duration.total_seconds() * LEEWAY_FRACTION
        return time.monotonic() + (self.lock_expires_at - timezone.now()).total_seconds() - leeway

    def extend_if_close(self) -> None:
        if (self.lock_expires_at - timezone.now()) > self.spec.lock_duration / 3:
            return
        expires = timezone.now() + self.spec.lock_duration
        try:
            store.extend_lock(self.locked.execution_id, self.locked.fence, expires)
        except errors.IllegalState:  # a resolved wait left the row pending: lock it again
            self.history.reserve_versions(0)  # flush the buffer first
            version = self.history.next_version
            store.lock_one(
                self.locked.execution_id,
                version,
                self.terms(),
                executor_id=self.locked.locked.executor_id,
                run_id=self.locked.fence.run_id,
                deployment_id=self.locked.deployment_id,
            )
            self.history.reserve_versions(1)
            expires = store.get_state(self.locked.execution_id).pending_expires_finished
        self.lock_expires_at = expires


class ParkedWait:
    """``Waiter`` of an Interrupt run in the workflow pool (D77, a sticky run).

    At a join-next with no response the run's write has handed the row on, as every
    Interrupt run's does. Instead of unwinding at once, the run parks in the pool for a
    while, holding nothing in the database. When this worker's next claim finds the row
    where the run left it (nothing written since), the claim reads neither history nor
    responses and the pool hands the run its new lock: the run goes on where it was, with
    the responses that arrived, instead of a new run reading and replaying the history.
    Otherwise (another worker claimed the row, the pool has no room, the worker stops, time
    is up) the run unwinds, and the next run replays, as always: same events, same result.

    The pool learns of the park before the write that blocks (``expect``): a claim that
    follows that write at once (a child this process ran, finishing) must find it."""

    holds_lock = False

    def __init__(self, pool: WorkflowPool, writer: StoreWriter, lease: StoreLease):
        self.pool = pool
        self.writer = writer
        self.lease = lease
        self.history: EventHistory | None = None
        self.log: RunLog | None = None
        self._place: _Parked | None = None  # where the pool expects this run to park
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
            _release_if_locked(previous.resumed, "handed back: the run it was claimed for went on")

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
            _release_if_locked(resumed, "handed back: the run it was claimed for could not read its responses")
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
            _release_if_locked(unclaimed, "handed back: the run it was claimed for has ended")


def run_workflow(
    locked: store.LockedExecution,
    spec: Function,
    deployment_id: str,
    children: ChildRunner | None = None,
    *,
    keep_connection: bool = False,
    pool: WorkflowPool | None = None,
) -> None:
    """One run of a workflow, from the start of the function to its end or interruption.
    The thread's database connection is closed afterwards, unless ``keep_connection`` (the
    pool's threads keep it for their next run; a broken one is closed all the same).
    ``pool``: the workflow pool the run is in, where an Interrupt run may park (D77)."""
    try:
        with heartbeat.running(), telemetry.workflow_run(locked):
            _run(locked, spec, deployment_id, children, pool)
    except Exception:
        logger.exception("workflow run of %s failed; its lock expires and it runs again", locked.execution_id)
    finally:
        if keep_connection:
            close_if_unusable_or_obsolete()  # never raises: the pool counts on this thread
        else:
            connection.close()


def _run(
    locked: store.LockedExecution,
    spec: Function,
    deployment_id: str,
    children: ChildRunner | None,
    pool: WorkflowPool | None,
) -> None:
    locked = store.with_history(locked)  # claimed for a parked run that gave up meanwhile
    lease = StoreLease(locked, spec)
    writer = StoreWriter(locked, deployment_id, children)
    waiter: StoreWaiter | ParkedWait | None = None
    if spec.blocking == "await":
        waiter = StoreWaiter(locked.execution_id, lease)
    elif pool is not None:
        waiter = ParkedWait(pool, writer, lease)
    history = EventHistory(
        locked.execution_id,
        locked.history or [],
        locked.responses or [],
        next_version=locked.next_version,
        writer=writer,
        waiter=waiter,
        canceller=StoreCanceller(),
        lease=lease,
        batch_size=BATCH_SIZE,
    )
    lease.history = history
    ctx = WorkflowContext(history, locked.execution_id)
    try:
        with capturing(locked.execution_id, lambda: writer.locked.fence.run_id, lambda: history.is_replaying) as log:
            if isinstance(waiter, ParkedWait):
                waiter.history, waiter.log = history, log
            outcome = _call(spec, ctx, locked)
            _finish(writer, history, outcome, holding=lambda: waiter is not None and waiter.holding)
    finally:
        if waiter is not None:
            waiter.close()


def _finish(writer: StoreWriter, history: EventHistory, outcome: Event | None, *, holding: Callable[[], bool]) -> None:
    """Finalize (close the open join sets, check the replay was complete), then append the
    outcome with the run's fence (the current one: a parked run may have gone on under a
    new lock, D77).

    An interrupt ends the run at a join-next that was written. Under Interrupt that write
    handed the row on (blocked, or pending now), so the run leaves it alone: a transaction
    on the row here would make a claimer woken by that write skip it (``SKIP LOCKED``) and
    the workflow wait for the next poll (D72). A run cut short while ``holding`` its lock
    (an Await run when the worker stops), as it tells when the interrupt comes (closing the
    join sets may block and hand the row on), hands back what its lock still holds."""
    try:
        history.finalize()
    except WorkflowInterrupt:
        if holding():
            _release_if_locked(writer.locked, "interrupted while locked")
        return
    except WriteFailed as failed:
        locked = writer.locked
        if isinstance(failed.__cause__, errors.LockLost):
            logger.info("%s: this run was superseded (%s)", locked.execution_id, failed.__cause__)
        else:
            logger.warning("%s: %s; its lock expires and it runs again", locked.execution_id, failed)
        return
    except FatalWorkflowError as fatal:
        outcome = Finished(retval=fatal.failure())
    if outcome is None:  # the function was interrupted, and finalize had nothing to add
        return
    locked = writer.locked
    try:
        store.append(locked.execution_id, None, outcome, fence=locked.fence)
    except errors.LockLost as lost:  # another run holds it now (a stop, an expired lock)
        logger.info("%s: this run was superseded (%s)", locked.execution_id, lost)
        return
    except errors.ValidationFailed as refused:  # an unstorable result fails this execution only
        failure = ExecutionFailure("uncategorized", f"result rejected: {refused}")
        outcome = Finished(retval=failure)
        store.append(locked.execution_id, None, outcome, fence=locked.fence)
    if telemetry.ENABLED and isinstance(outcome, Finished):
        telemetry.workflow_finished(locked, outcome)


def _call(spec: Function, ctx: WorkflowContext, locked: store.LockedExecution) -> Event | None:
    """The function's own outcome; None when a workflow signal ended it (``finalize`` then
    re-raises that signal)."""
    try:
        args = spec.decode_arguments(locked.params)
    except ArgumentError as error:
        return Finished(retval=ExecutionFailure("uncategorized", f"parameters do not match: {error}"))
    try:
        with determinism.guarding():
            value = spec.fn(ctx, *args)
        return Finished(retval=Ok(spec.encode_result(value)))
    except WorkflowSignal:
        return None
    except ActivityError as error:  # a returned error value
        return Finished(retval=Err(error.value))
    except ArgumentError as error:
        return Finished(retval=ExecutionFailure("uncategorized", str(error)))
    except Exception as error:  # a trap: the join sets are closed all the same (decision 3)
        reason = f"workflow trap: {type(error).__name__}: {error}"
        return Finished(retval=ExecutionFailure("uncategorized", reason, "".join(traceback.format_exception(error))))


def _release_if_locked(locked: store.LockedExecution, reason: str) -> None:
    """An interrupted run whose row is still locked (it was not waiting on a join set)
    hands it back, so the next run starts at once instead of after the lock expires.
    Best effort: without a database the lock expires, and the sweep hands it back."""
    try:
        store.append(locked.execution_id, None, Unlocked(unlocked_at=timezone.now(), reason=reason), fence=locked.fence)
    except (errors.StoreError, *DATABASE_ERRORS):
        pass  # blocked on a join set (the usual interrupt), finished, the lock is gone, or no database


def _following(responses: Sequence[store.Response], after_seq: int) -> list[store.Response]:
    """``responses`` if they are the ones right after ``after_seq``, without a gap (a group
    commit that resumed the run gave them, D82); otherwise none: the table is read."""
    if responses and [r.seq for r in responses] == list(range(after_seq + 1, after_seq + 1 + len(responses))):
        return list(responses)
    return []


@dataclass
class _Parked:
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
        self._parked: dict[str, _Parked] = {}
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
        self, locked: store.LockedExecution, version: int, previous: _Parked | None, terms: store.LockTerms
    ) -> _Parked | None:
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
            place = _Parked(version, threading.Condition(self._lock), locked, terms)
            self._parked[execution_id] = place
            return place

    def park(self, execution_id: str, place: _Parked) -> store.LockedExecution | None:
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

    def leave(self, execution_id: str, place: _Parked | None) -> store.LockedExecution | None:
        """The run that reserved ``place`` ends: the place goes. Returns a lock a claim
        handed to it that it never took (it did not park after all), to be handed back."""
        if place is None:
            return None
        with self._state:
            self._forget(execution_id, place)
            place.dismissed = True
            return place.resumed

    def _forget(self, execution_id: str, place: _Parked | None) -> None:
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
