"""The replay core's ports, backed by the store: how a workflow run reads and writes.

``replay.EventHistory`` decides what every host call means (spec 002 §3); these carry its
decisions out in ``executions.store`` (the ports are ``workers.replay.ports``):

- ``StoreWriter``: new history events and the executions they create, one fenced
  transaction each; children the process's executor serves may be created locked for it
  (``ChildRunner``: the executor as a run sees it, eager dispatch), and an Await run's
  ``ctx.call`` of one runs its child itself, right after the write (a local child, D124);
- ``StoreWaiter``: Await, waiting in place for the next responses until the lock's deadline;
- ``StoreCanceller``: closing a join set cancels unawaited activities and delays (§5.1);
- ``StoreLease``: the run's lock, renewed at host calls close to its expiry;
- ``release_if_locked``: an interrupted run hands back the lock it still holds.

why: D37, D38, D39, D47, D63, D65, D67, D72, D80, D98, D124, D125, D126, D129, D131
"""

from __future__ import annotations

import linecache
import sys
import sysconfig
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from django.utils import timezone

from executions import errors, notify, store, tracing
from executions.events import ChildExecutionRequest, HistoryEventRecord, JoinNext, JoinSetRequest, Unlocked
from executions.ids import ExecutionId
from executions.models import ExecutionState
from executions.outage import DATABASE_ERRORS
from executions.state_machine import Lifecycle
from workers import shutdown
from workers.registry import Function, lookup
from workers.replay import EventHistory, ImportedFunctionCallError, NewExecution, WriteFailed

# Frames from these are the engine's (and Python's), not the workflow's own code.
_ENGINE_PATHS = tuple(
    {
        str(Path(__file__).resolve().parent.parent / "workers"),
        str(Path(__file__).resolve().parent.parent / "executions"),
    }
    | {path for path in sysconfig.get_paths().values()}
)

LEEWAY_FRACTION = 0.2  # an Await wait ends this share of the lock duration before it expires


class ChildRunner(Protocol):
    """This process's activity executor (``workers.executor.Executor``) as a workflow run
    sees it: it may take the children a write creates, locked for it in that write (eager
    dispatch, D65). The one way a run, or the pool it is in, calls back into the executor."""

    def child_claim(self, ffqns: list[str]) -> store.ChildClaim | None: ...

    def hand_over(self, locked: list[store.LockedExecution]) -> None: ...

    def local_claim(self, ffqn: str) -> store.ChildClaim | None: ...

    def run_local(self, claim: store.ChildClaim, locked: store.LockedExecution | None) -> datetime | None: ...


class StoreWriter:
    """``Writer``: fenced appends of history events with the executions they create."""

    def __init__(
        self,
        locked: store.LockedExecution,
        deployment_id: str,
        children: ChildRunner | None = None,
        *,
        local: bool = False,
    ):
        self.locked = locked
        self.deployment_id = deployment_id
        self.children = children
        self.local = local and children is not None  # an Await run: it may run a call's child itself (D124)
        self._component = locked.locked.component_id.model_dump(mode="json")
        self.before_join_next: Callable[[int], None] | None = None  # told the last version (D77)
        self.lifecycle_seen: Callable[[str], None] | None = None  # told the lifecycle a local write saw (D129)
        self._expected: ExecutionState | None = None  # the row after the last local call (D126)

    def append(self, version: int, events: Sequence[Any], creates: Sequence[NewExecution]) -> None:
        if self.before_join_next is not None and any(_hands_on(event) for event in events):
            self.before_join_next(version + len(events) - 1)
        requests = [self._create_request(new) for new in creates]
        local = self.children.local_claim(requests[0].ffqn) if self.local and _one_call(events, requests) else None
        claim = local or (self.children.child_claim([r.ffqn for r in requests]) if requests and self.children else None)
        records = [HistoryEventRecord(event=event) for event in events]
        expected, self._expected = self._expected, None
        try:
            if local is not None:
                _, claimed, row = store.append_call(
                    self.locked.execution_id, version, records, requests,
                    fence=self.locked.fence, claim=claim, expected=expected,
                )  # fmt: skip
            else:
                _, claimed = store.append_and_claim_children(
                    self.locked.execution_id, version, records, requests,
                    fence=self.locked.fence, stack=self._blocking_stack(events), claim=claim,
                )  # fmt: skip
        except BaseException:
            if local is not None:
                self.children.run_local(local, None)  # frees its slot
            raise
        if local is not None:
            if self.lifecycle_seen is not None:
                self.lifecycle_seen(row.lifecycle)
            at = self.children.run_local(local, claimed[0] if claimed else None)
            if at is not None:  # the next call's write expects the row as the response left it
                self._expected = store.answered(row, events[1].join_set_id, at)
        elif claimed:
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


def _one_call(events: Sequence[Any], requests: Sequence[store.CreateRequest]) -> bool:
    """A ``ctx.call`` (or ``invoke``) awaiting in place: the write creates one child and
    waits on its join set, holding the lock. Only then is running the child at once what
    the workflow would wait for anyway (D124); a child submitted to a join set awaited
    later is left to run beside the workflow."""
    if len(requests) != 1 or len(events) != 3:
        return False
    request, join_next = events[1], events[2]
    return (
        isinstance(request, JoinSetRequest)
        and isinstance(request.request, ChildExecutionRequest)
        and isinstance(join_next, JoinNext)
        and join_next.join_set_id == request.join_set_id
        and not _hands_on(join_next)
    )


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
    between two waits is never missed and the lifecycle is read once per run (not at all
    when a local call's write saw it, D129), and again only when a cancellation names
    this execution or nothing is known (a timed wake-up); on SQLite, which announces
    nothing, at every wait. Likewise the responses: read at the run's first wait (one
    may have arrived between the claim that loaded them and the subscription), and after
    that only when a notification names this execution or nothing is known (D63)."""

    holds_lock = holding = True  # waits with the lock, and holds it all along

    def __init__(self, execution_id: str, lease: StoreLease, *, first_run: bool = False):
        self.execution_id = execution_id
        self.lease = lease
        self._listener = notify.Listener([notify.RESPONSE, notify.CANCEL])
        self._check_cancel = True
        self._check_responses = True
        # Nothing known yet: the first wait reads the table. Not in a run that starts the
        # workflow (claimed after ``Created`` alone): only this run's own writes create what
        # answers it, after this listener was subscribed (D125).
        self._must_read = not first_run
        self._delivered: dict[int, store.Response] = {}  # by seq, from this process's commits (D67)

    def close(self) -> None:
        self._listener.close()

    def lifecycle_seen(self, lifecycle: str) -> None:
        """The run's own write found the row in ``lifecycle`` under its lock, after this
        waiter subscribed: on PostgreSQL a cancellation requested since is announced to the
        listener, so the next wait reads the lifecycle only if that write saw a
        cancellation, or a notification names one (D129: a one-step workflow's run reads its
        row once, not twice). SQLite announces nothing: each of its waits reads it (``_wait``)."""
        self._check_cancel = lifecycle == Lifecycle.CANCELLING

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
        if not notify.is_postgres():  # no cancellation is announced: each wait reads it (D129)
            self._check_cancel = True
        while True:
            if self._check_responses or not notify.is_postgres():
                self._heed(self._listener.wait(0))  # announced before the read: it sees them
                self._check_responses = False
                if self._cancelling():  # a cancellation comes first: its local child's response may be in (D124)
                    return []
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
        """Whether the execution is being cancelled: read only when something may have
        changed it (the first wait, a notification naming a cancellation, a timed wake-up,
        and every wait on SQLite, which announces nothing, D129)."""
        if not self._check_cancel:
            return False
        self._check_cancel = False
        return store.get_state(self.execution_id).lifecycle == Lifecycle.CANCELLING


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
            # reads none of the history the run holds (D131)
            expires = store.lock_again(self.locked, self.history.next_version, self.terms())
            self.history.reserve_versions(1)
        self.lock_expires_at = expires


def release_if_locked(locked: store.LockedExecution, reason: str) -> None:
    """An interrupted run whose row is still locked (it was not waiting on a join set)
    hands it back, so the next run starts at once instead of after the lock expires.
    Best effort: without a database the lock expires, and the sweep hands it back."""
    try:
        store.append(locked.execution_id, None, Unlocked(unlocked_at=timezone.now(), reason=reason), fence=locked.fence)
    except (errors.StoreError, *DATABASE_ERRORS):
        pass  # blocked on a join set (the usual interrupt), finished, the lock is gone, or no database
