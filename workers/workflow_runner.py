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

import linecache
import logging
import queue
import sys
import sysconfig
import threading
import time
import traceback
import weakref
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from django.db import connection
from django.utils import timezone

from executions import errors, notify, store, tracing
from executions.events import Err, Event, ExecutionFailure, Finished, HistoryEventRecord, JoinNext, Ok, Unlocked
from executions.ids import ExecutionId
from executions.outage import close_if_unusable_or_obsolete
from workers import determinism, heartbeat, shutdown, telemetry
from workers.activity import ActivityError
from workers.capture import capturing
from workers.registry import ActivityFunction, ArgumentError, lookup
from workers.replay import (
    EventHistory,
    FatalWorkflowError,
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

    def append(self, version: int, events: Sequence[Any], creates: Sequence[NewExecution]) -> None:
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
        if spec is None:
            raise errors.NotFound(f"function `{new.ffqn}` is not registered in this worker")
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
        when the execution is being cancelled: the driver takes over (decision 14)."""
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

    def __init__(self, locked: store.LockedExecution, spec: ActivityFunction):
        self.locked = locked
        self.spec = spec
        self.lock_expires_at: datetime = locked.locked.lock_expires_at
        self.history: EventHistory | None = None

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
                store.LockTerms(self.spec.component_id, self.spec.retry_config, self.spec.lock_duration),
                executor_id=self.locked.locked.executor_id,
                run_id=self.locked.fence.run_id,
                deployment_id=self.locked.deployment_id,
            )
            self.history.reserve_versions(1)
            expires = store.get_state(self.locked.execution_id).pending_expires_finished
        self.lock_expires_at = expires


def run_workflow(
    locked: store.LockedExecution,
    spec: ActivityFunction,
    deployment_id: str,
    children: ChildRunner | None = None,
    *,
    keep_connection: bool = False,
) -> None:
    """One run of a workflow, from the start of the function to its end or interruption.
    The thread's database connection is closed afterwards, unless ``keep_connection`` (the
    pool's threads keep it for their next run; a broken one is closed all the same)."""
    try:
        with heartbeat.running(), telemetry.workflow_run(locked):
            _run(locked, spec, deployment_id, children)
    except Exception:
        logger.exception("workflow run of %s failed; its lock expires and it runs again", locked.execution_id)
    finally:
        if keep_connection:
            close_if_unusable_or_obsolete()  # never raises: the pool counts on this thread
        else:
            connection.close()


def _run(
    locked: store.LockedExecution, spec: ActivityFunction, deployment_id: str, children: ChildRunner | None
) -> None:
    lease = StoreLease(locked, spec)
    writer = StoreWriter(locked, deployment_id, children)
    waiter = StoreWaiter(locked.execution_id, lease) if spec.blocking == "await" else None
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
        with capturing(locked.execution_id, locked.fence.run_id, lambda: history.is_replaying):
            outcome = _call(spec, ctx, locked)
            _finish(locked, history, outcome, awaits=waiter is not None)
    finally:
        if waiter is not None:
            waiter.close()


def _finish(locked: store.LockedExecution, history: EventHistory, outcome: Event | None, *, awaits: bool) -> None:
    """Finalize (close the open join sets, check the replay was complete), then append the
    outcome with the run's fence.

    An interrupt ends the run at a join-next that was written. Under Interrupt that write
    handed the row on (blocked, or pending now), so the run leaves it alone: a transaction
    on the row here would make a claimer woken by that write skip it (``SKIP LOCKED``) and
    the workflow wait for the next poll (D72). An Await run cut short (the worker stops)
    hands back what its lock still holds."""
    try:
        history.finalize()
    except WorkflowInterrupt:
        if awaits:
            _release_if_locked(locked, "interrupted while locked: worker is stopping")
        return
    except WriteFailed as failed:
        if isinstance(failed.__cause__, errors.LockLost):
            logger.info("%s: this run was superseded (%s)", locked.execution_id, failed.__cause__)
        else:
            logger.warning("%s: %s; its lock expires and it runs again", locked.execution_id, failed)
        return
    except FatalWorkflowError as fatal:
        outcome = Finished(retval=fatal.failure())
    if outcome is None:  # the function was interrupted, and finalize had nothing to add
        return
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


def _call(spec: ActivityFunction, ctx: WorkflowContext, locked: store.LockedExecution) -> Event | None:
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
    hands it back, so the next run starts at once instead of after the lock expires."""
    try:
        store.append(locked.execution_id, None, Unlocked(unlocked_at=timezone.now(), reason=reason), fence=locked.fence)
    except errors.StoreError:
        pass  # blocked on a join set (the usual interrupt), finished, or the lock is gone


class WorkflowPool:
    """The worker process's workflow runs, each in a thread of its own, at most ``size`` at
    once; ``children``: the process's activity executor, which may run their children (D65).

    A thread that ended a run waits up to ``idle_seconds`` for the next one and keeps its
    database connection meanwhile: the next run of an Interrupt workflow (every call is a
    run), or of another workflow, starts on a warm connection whose statements are prepared,
    instead of opening a connection per run (D73). An idle thread retires, closing it."""

    def __init__(self, size: int = 8, children: ChildRunner | None = None, idle_seconds: float = 2.0):
        self.size = size
        self.children = children
        self.idle_seconds = idle_seconds
        self._runs: queue.SimpleQueue = queue.SimpleQueue()
        self._state = threading.Condition()
        self._busy = 0  # runs started and not ended
        self._idle = 0  # threads waiting for a run that none was promised to
        self._threads = 0  # threads alive
        _POOLS.add(self)

    def free(self) -> int:
        with self._state:
            return self.size - self._busy

    def start(self, locked: store.LockedExecution, spec: ActivityFunction, deployment_id: str) -> None:
        with self._state:
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
                    run_workflow(locked, spec, deployment_id, self.children, keep_connection=True)
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
        """Send every idle thread away now and wait (up to ``timeout`` seconds) until they
        have closed their connections (tests: before the test database is dropped)."""
        with self._state:
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
